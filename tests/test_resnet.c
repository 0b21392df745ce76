/* test_resnet.c — BatchNorm2d and the ResNets against torchvision.
 *
 * - clpar_resnet50 / clpar_resnet18: state_dict names, dtypes and shapes, in order, equal the
 *   lists torchvision wrote (tests/reference/resnet*_state_dict.txt); children by name;
 *   torchvision's initialization (statistics of the values).
 * - One Bottleneck block (training mode) and a ResNet-18 (eval, then training, forward and
 *   backward) from weights set by the formula of tests/reference/make_resnet_ref.py, against
 *   its float64 PyTorch references, on the host and on every selected device. Tolerance:
 *   |got - want| <= 1e-4 * (|want| + max|want|) per tensor (rtol 1e-4 with an atol of 1e-4 of
 *   the tensor's largest value: elements near zero carry the rounding of the large ones).
 * - BatchNorm2d: running statistics over three training steps and eval mode against a double
 *   reference computed here, num_batches_tracked, no tracking, bad input and arguments.
 * - A few SGD steps of a ResNet-18 at 32x32 lower the loss on a fixed batch (on the host it
 *   fell from 1.5 to 0.004 in 6 steps). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#ifndef CLPAR_TEST_REFERENCE_DIR
#define CLPAR_TEST_REFERENCE_DIR "tests/reference"
#endif

/* ---- helpers ---- */

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* make_resnet_ref.py's value(j, k, name, shape), in the same double operations. */
static double ref_value(int j, int64_t k, const char *name, const clpar_tensor *t) {
  int64_t h = (k * 7919 + (int64_t)j * 104729 + 12345) % 10007;
  double base = ((double)h - 5003.0) / 5003.0;
  if (ends_with(name, "num_batches_tracked")) return 0;
  if (clpar_tensor_ndim(t) >= 2)
    return base * sqrt(6.0 / (double)(clpar_tensor_numel(t) / clpar_tensor_dim(t, 0)));
  if (ends_with(name, "running_var")) return 1.0 + (double)h / (2.0 * 10007);
  if (ends_with(name, ".weight")) return 1.0 + base / 10.0;
  return base / 10.0;
}

/* Every float entry of m's state_dict set by ref_value. */
static void set_ref_weights(clpar_module *m) {
  int n = clpar_module_state_count(m);
  for (int j = 0; j < n; j++) {
    const char *name;
    clpar_tensor *t;
    int is_buffer;
    tu_ok(clpar_module_state_at(m, j, &name, &t, &is_buffer));
    if (clpar_tensor_dtype(t) != CLPAR_FLOAT32) continue; /* num_batches_tracked: 0 already */
    int64_t numel = clpar_tensor_numel(t);
    float *v = malloc((size_t)numel * sizeof *v);
    for (int64_t k = 0; k < numel; k++) v[k] = (float)ref_value(j, k, name, t);
    tu_ok(clpar_tensor_write(t, v, (size_t)numel));
    free(v);
  }
}

/* The state_dict entry called name (borrowed). */
static clpar_tensor *entry(const clpar_module *m, const char *name) {
  for (int j = 0; j < clpar_module_state_count(m); j++) {
    const char *n;
    clpar_tensor *t;
    int is_buffer;
    tu_ok(clpar_module_state_at(m, j, &n, &t, &is_buffer));
    if (strcmp(n, name) == 0) return t;
  }
  fail_msg("no state_dict entry %s", name);
  return NULL;
}

static clpar_npy_array load(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.npy", CLPAR_TEST_REFERENCE_DIR, name);
  clpar_npy_array a;
  tu_ok(clpar_npy_read(path, &a));
  assert_int_equal(a.dtype, CLPAR_NPY_F32);
  return a;
}

/* t (float32) against fixture name at the file's tolerance. */
static void expect_fixture(const clpar_tensor *t, const char *name, const char *dev_id) {
  assert_non_null(t);
  clpar_npy_array want = load(name);
  assert_int_equal(clpar_tensor_numel(t), want.numel);
  float *got = tu_read(t), max = 0;
  const float *w = want.data;
  for (int64_t i = 0; i < want.numel; i++) max = fmaxf(max, fabsf(w[i]));
  char what[256];
  snprintf(what, sizeof what, "%s on %s", name, dev_id);
  tu_assert_close(got, w, (size_t)want.numel, 1e-4f, 1e-4f * max, what);
  free(got);
  clpar_npy_array_free(&want);
}

static clpar_tensor *upload_fixture(clpar_device *dev, const char *name) {
  clpar_npy_array a = load(name);
  clpar_tensor *t;
  tu_ok(clpar_tensor_from_host(dev, a.ndim, a.shape, a.data, &t));
  clpar_npy_array_free(&a);
  return t;
}

static int64_t read_count(const clpar_tensor *counter) {
  int64_t n = -1;
  assert_int_equal(clpar_tensor_dtype(counter), CLPAR_INT64);
  tu_ok(clpar_tensor_read_raw(counter, &n, sizeof n));
  return n;
}

/* Runs fn on the host and on every selected device that is not the host. */
static void each_device(void (*fn)(clpar_device *)) {
  fn(tu_host());
  for (int d = 0; d < clpar_device_count(); d++)
    if (clpar_device_get(d) != tu_host()) fn(clpar_device_get(d));
}

/* ---- state_dict names, shapes and dtypes ---- */

static void expect_state_list(clpar_module *m, const char *file) {
  char path[512], line[512], mine[512];
  snprintf(path, sizeof path, "%s/%s", CLPAR_TEST_REFERENCE_DIR, file);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  int j = 0, n = clpar_module_state_count(m);
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (j >= n) fail_msg("%s: clpar has %d entries, torchvision more (%s)", file, n, line);
    const char *name;
    clpar_tensor *t;
    int is_buffer;
    char shape[128];
    tu_ok(clpar_module_state_at(m, j, &name, &t, &is_buffer));
    snprintf(mine, sizeof mine, "%s %s %s", name, clpar_dtype_name(clpar_tensor_dtype(t)),
             clpar_tensor_shape_str(t, shape, sizeof shape));
    if (strcmp(mine, line) != 0)
      fail_msg("%s entry %d: torchvision \"%s\", clpar \"%s\"", file, j, line, mine);
    int buffer_name = ends_with(name, "running_mean") || ends_with(name, "running_var") ||
                      ends_with(name, "num_batches_tracked");
    assert_int_equal(is_buffer != 0, buffer_name);
    j++;
  }
  fclose(f);
  assert_int_equal(j, n);
}

static void test_resnet50_state_dict(void **state) {
  (void)state;
  clpar_module *m;
  tu_ok(clpar_resnet50(1000, tu_host(), &m));
  expect_state_list(m, "resnet50_state_dict.txt");
  assert_int_equal(clpar_module_parameter_count(m), 161);
  assert_int_equal(clpar_module_buffer_count(m), 159);
  /* the children the model-parallel tutorial regroups, by name and type */
  static const char *const names[] = {"conv1",  "bn1",    "relu",   "maxpool", "layer1",
                                      "layer2", "layer3", "layer4", "avgpool", "fc"};
  static const char *const types[] = {
      "Conv2d",     "BatchNorm2d", "ReLU",       "MaxPool2d",         "Sequential",
      "Sequential", "Sequential",  "Sequential", "AdaptiveAvgPool2d", "Linear"};
  for (int i = 0; i < 10; i++) {
    clpar_module *c = clpar_module_child(m, names[i]);
    assert_non_null(c);
    assert_string_equal(clpar_module_type(c), types[i]);
  }
  clpar_module *layer3 = clpar_module_child(m, "layer3");
  clpar_module *b0 = clpar_module_child(layer3, "0"), *b5 = clpar_module_child(layer3, "5");
  assert_string_equal(clpar_module_type(b0), "Bottleneck");
  assert_non_null(clpar_module_child(b0, "downsample"));
  assert_null(clpar_module_child(b5, "downsample"));
  assert_null(clpar_module_child(layer3, "6"));
  assert_string_equal(
      clpar_module_type(clpar_module_child(clpar_module_child(b0, "downsample"), "1")),
      "BatchNorm2d");
  clpar_module_free(m);
}

static void test_resnet18_state_dict(void **state) {
  (void)state;
  clpar_module *m;
  tu_ok(clpar_resnet18(1000, tu_host(), &m));
  expect_state_list(m, "resnet18_state_dict.txt");
  clpar_module *l1 = clpar_module_child(m, "layer1"), *l2 = clpar_module_child(m, "layer2");
  assert_string_equal(clpar_module_type(clpar_module_child(l1, "0")), "BasicBlock");
  assert_null(clpar_module_child(clpar_module_child(l1, "0"), "downsample"));
  assert_non_null(clpar_module_child(clpar_module_child(l2, "0"), "downsample"));
  clpar_module_free(m);
}

/* Sample mean and standard deviation of t's values. */
static void moments(const clpar_tensor *t, double *mean, double *sd) {
  float *v = tu_read(t);
  int64_t n = clpar_tensor_numel(t);
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; i++) s += v[i];
  *mean = s / (double)n;
  for (int64_t i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
  *sd = sqrt(s2 / (double)(n - 1));
  free(v);
}

static void test_init(void **state) {
  (void)state;
  clpar_module *m;
  clpar_manual_seed(7);
  tu_ok(clpar_resnet18(10, tu_host(), &m));
  /* Kaiming normal, fan_out: std sqrt(2 / (out * kh * kw)) */
  const char *convs[] = {"conv1.weight", "layer1.0.conv1.weight", "layer4.0.conv2.weight",
                         "layer4.0.downsample.0.weight"};
  const double fan_out[] = {64 * 49, 64 * 9, 512 * 9, 512};
  for (int i = 0; i < 4; i++) {
    double mean, sd, want = sqrt(2.0 / fan_out[i]);
    moments(entry(m, convs[i]), &mean, &sd);
    if (fabs(sd - want) > 0.05 * want || fabs(mean) > 0.05 * want)
      fail_msg("%s: mean %g, sd %g; want 0 and %g", convs[i], mean, sd, want);
  }
  float *w = tu_read(entry(m, "layer2.1.bn2.weight")), *b = tu_read(entry(m, "layer2.1.bn2.bias"));
  float *rv = tu_read(entry(m, "bn1.running_var"));
  for (int i = 0; i < 128; i++) {
    assert_true(w[i] == 1.0f && b[i] == 0.0f);
    if (i < 64) assert_true(rv[i] == 1.0f);
  }
  free(w);
  free(b);
  free(rv);
  float *fc = tu_read(entry(m, "fc.weight")), bound = 1.0f / sqrtf(512.0f), lo = 1, hi = -1;
  for (int i = 0; i < 5120; i++) {
    lo = fminf(lo, fc[i]);
    hi = fmaxf(hi, fc[i]);
  }
  assert_true(lo >= -bound && hi <= bound && lo < -0.9f * bound && hi > 0.9f * bound);
  free(fc);
  clpar_module_free(m);
}

/* ---- one Bottleneck block against PyTorch ---- */

static void bottleneck_on(clpar_device *dev) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_module *blk;
  tu_ok(clpar_resnet_block_create(CLPAR_RESNET_BOTTLENECK, 16, 8, 2, dev, &blk));
  set_ref_weights(blk);
  clpar_tensor *x = upload_fixture(dev, "resnet_bottleneck_input");
  clpar_tensor *g = upload_fixture(dev, "resnet_bottleneck_grad_out"), *y, *yg, *loss;
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_module_forward(blk, x, &y));
  tu_ok(clpar_mul(y, g, &yg));
  tu_ok(clpar_sum(yg, &loss));
  tu_ok(clpar_backward(loss));
  const char *id = clpar_device_id(dev);
  expect_fixture(y, "resnet_bottleneck_output", id);
  expect_fixture(clpar_tensor_grad(x), "resnet_bottleneck_input_grad", id);
  const char *grads[] = {"conv1.weight", "conv2.weight",        "bn2.weight",
                         "bn3.bias",     "downsample.0.weight", "downsample.1.weight"};
  for (int i = 0; i < 6; i++) {
    char fixture[128];
    snprintf(fixture, sizeof fixture, "resnet_bottleneck_grad_%s", grads[i]);
    for (char *p = fixture; *p; p++) *p = *p == '.' ? '_' : *p;
    expect_fixture(clpar_tensor_grad(entry(blk, grads[i])), fixture, id);
  }
  const char *bufs[] = {"bn1.running_mean", "bn1.running_var", "downsample.1.running_mean",
                        "downsample.1.running_var"};
  for (int i = 0; i < 4; i++) {
    char fixture[128];
    snprintf(fixture, sizeof fixture, "resnet_bottleneck_%s", bufs[i]);
    for (char *p = fixture; *p; p++) *p = *p == '.' ? '_' : *p;
    expect_fixture(entry(blk, bufs[i]), fixture, id);
  }
  assert_int_equal(read_count(entry(blk, "bn3.num_batches_tracked")), 1);
  clpar_scope_end(scope);
  clpar_module_free(blk);
}

static void test_bottleneck_reference(void **state) {
  (void)state;
  each_device(bottleneck_on);
}

/* ---- ResNet-18 against PyTorch ---- */

static void resnet18_on(clpar_device *dev) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_module *m;
  tu_ok(clpar_resnet18(10, dev, &m));
  set_ref_weights(m);
  const char *id = clpar_device_id(dev);
  clpar_tensor *x = upload_fixture(dev, "resnet18_input"), *eval_logits, *logits, *loss;
  tu_ok(clpar_module_train(m, 0));
  assert_int_equal(clpar_module_is_training(clpar_module_child(m, "bn1")), 0);
  int was = clpar_set_grad_enabled(0);
  tu_ok(clpar_module_forward(m, x, &eval_logits));
  clpar_set_grad_enabled(was);
  expect_fixture(eval_logits, "resnet18_logits_eval", id);
  assert_int_equal(read_count(entry(m, "bn1.num_batches_tracked")), 0);
  tu_ok(clpar_module_train(m, 1));
  tu_ok(clpar_module_forward(m, x, &logits));
  static const int32_t labels[4] = {3, 7, 1, 5};
  tu_ok(clpar_cross_entropy(logits, labels, 4, CLPAR_REDUCTION_MEAN, &loss));
  tu_ok(clpar_backward(loss));
  expect_fixture(logits, "resnet18_logits", id);
  expect_fixture(loss, "resnet18_loss", id);
  expect_fixture(clpar_tensor_grad(entry(m, "conv1.weight")), "resnet18_grad_conv1_weight", id);
  expect_fixture(clpar_tensor_grad(entry(m, "layer4.1.bn2.weight")),
                 "resnet18_grad_layer4_1_bn2_weight", id);
  expect_fixture(clpar_tensor_grad(entry(m, "fc.weight")), "resnet18_grad_fc_weight", id);
  expect_fixture(clpar_tensor_grad(entry(m, "fc.bias")), "resnet18_grad_fc_bias", id);
  expect_fixture(entry(m, "bn1.running_mean"), "resnet18_bn1_running_mean", id);
  expect_fixture(entry(m, "bn1.running_var"), "resnet18_bn1_running_var", id);
  assert_int_equal(read_count(entry(m, "bn1.num_batches_tracked")), 1);
  assert_int_equal(read_count(entry(m, "layer4.1.bn2.num_batches_tracked")), 1);
  clpar_scope_end(scope);
  clpar_module_free(m);
}

static void test_resnet18_reference(void **state) {
  (void)state;
  each_device(resnet18_on);
}

/* ---- BatchNorm2d ---- */

enum { BN_N = 4, BN_C = 3, BN_HW = 10 }; /* input [4, 3, 2, 5] */

/* Per channel mean and unbiased variance of x [N, C, HW] in double. */
static void channel_stats(const float *x, double *mean, double *var) {
  int count = BN_N * BN_HW;
  for (int c = 0; c < BN_C; c++) {
    double s = 0, s2 = 0;
    for (int n = 0; n < BN_N; n++)
      for (int i = 0; i < BN_HW; i++) s += x[(n * BN_C + c) * BN_HW + i];
    mean[c] = s / count;
    for (int n = 0; n < BN_N; n++)
      for (int i = 0; i < BN_HW; i++) {
        double d = x[(n * BN_C + c) * BN_HW + i] - mean[c];
        s2 += d * d;
      }
    var[c] = s2 / (count - 1);
  }
}

static void batchnorm_on(clpar_device *dev) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_module *bn;
  const float momentum = 0.25f, eps = 1e-3f;
  tu_ok(clpar_batchnorm2d_create(
      BN_C, &(clpar_batchnorm2d_options){.eps = eps, .momentum = momentum}, dev, &bn));
  assert_string_equal(clpar_module_type(bn), "BatchNorm2d");
  assert_int_equal(clpar_module_is_training(bn), 1);
  float w[BN_C] = {0.5f, 1.5f, -1.0f}, b[BN_C] = {0.1f, -0.2f, 0.3f};
  tu_ok(clpar_tensor_write(clpar_module_parameter(bn, "weight"), w, BN_C));
  tu_ok(clpar_tensor_write(clpar_module_parameter(bn, "bias"), b, BN_C));
  double rm[BN_C] = {0, 0, 0}, rv[BN_C] = {1, 1, 1}, mean[BN_C], var[BN_C];
  int64_t shape[4] = {BN_N, BN_C, 2, 5};
  for (int step = 0; step < 3; step++) {
    clpar_tensor *x = tu_make(dev, 4, shape, 100 + step), *y;
    float *xv = tu_read(x);
    for (int i = 0; i < BN_N * BN_C * BN_HW; i++) xv[i] = 2.0f * xv[i] + (float)(i % 3);
    tu_ok(clpar_tensor_write(x, xv, BN_N * BN_C * BN_HW));
    tu_ok(clpar_module_forward(bn, x, &y));
    channel_stats(xv, mean, var);
    float *yv = tu_read(y), want[BN_N * BN_C * BN_HW];
    for (int i = 0; i < BN_N * BN_C * BN_HW; i++) {
      int c = (i / BN_HW) % BN_C;
      double biased = var[c] * (BN_N * BN_HW - 1) / (BN_N * BN_HW);
      want[i] = (float)((xv[i] - mean[c]) / sqrt(biased + eps) * w[c] + b[c]);
    }
    tu_assert_close(yv, want, BN_N * BN_C * BN_HW, 1e-4f, 1e-5f, "BatchNorm2d training output");
    for (int c = 0; c < BN_C; c++) {
      rm[c] = (1 - momentum) * rm[c] + momentum * mean[c];
      rv[c] = (1 - momentum) * rv[c] + momentum * var[c];
    }
    free(xv);
    free(yv);
  }
  float got[BN_C], want_m[BN_C], want_v[BN_C];
  for (int c = 0; c < BN_C; c++) {
    want_m[c] = (float)rm[c];
    want_v[c] = (float)rv[c];
  }
  tu_ok(clpar_tensor_read(clpar_module_buffer(bn, "running_mean"), got, BN_C));
  tu_assert_close(got, want_m, BN_C, 1e-5f, 1e-6f, "running_mean after 3 steps");
  tu_ok(clpar_tensor_read(clpar_module_buffer(bn, "running_var"), got, BN_C));
  tu_assert_close(got, want_v, BN_C, 1e-5f, 1e-6f, "running_var after 3 steps");
  assert_int_equal(read_count(clpar_module_buffer(bn, "num_batches_tracked")), 3);
  /* someone else sets the counter (a checkpoint load): the next step counts from there */
  int64_t forty = 40;
  tu_ok(clpar_tensor_write_raw(clpar_module_buffer(bn, "num_batches_tracked"), &forty, 8));
  clpar_tensor *x = tu_make(dev, 4, shape, 200), *y;
  tu_ok(clpar_module_forward(bn, x, &y));
  assert_int_equal(read_count(clpar_module_buffer(bn, "num_batches_tracked")), 41);
  /* eval: the running statistics, nothing updated */
  float rm_now[BN_C], rv_now[BN_C];
  tu_ok(clpar_tensor_read(clpar_module_buffer(bn, "running_mean"), rm_now, BN_C));
  tu_ok(clpar_tensor_read(clpar_module_buffer(bn, "running_var"), rv_now, BN_C));
  tu_ok(clpar_module_train(bn, 0));
  tu_ok(clpar_module_forward(bn, x, &y));
  float *xv = tu_read(x), *yv = tu_read(y), want[BN_N * BN_C * BN_HW];
  for (int i = 0; i < BN_N * BN_C * BN_HW; i++) {
    int c = (i / BN_HW) % BN_C;
    want[i] = (float)((xv[i] - rm_now[c]) / sqrt((double)rv_now[c] + eps) * w[c] + b[c]);
  }
  tu_assert_close(yv, want, BN_N * BN_C * BN_HW, 1e-4f, 1e-5f, "BatchNorm2d eval output");
  tu_ok(clpar_tensor_read(clpar_module_buffer(bn, "running_mean"), got, BN_C));
  tu_assert_close(got, rm_now, BN_C, 0, 0, "running_mean unchanged in eval");
  assert_int_equal(read_count(clpar_module_buffer(bn, "num_batches_tracked")), 41);
  free(xv);
  free(yv);
  /* bad input: an error naming the module, nothing counted */
  clpar_tensor *flat = tu_make(dev, 2, (int64_t[]){4, 3}, 5), *z = NULL;
  tu_ok(clpar_module_train(bn, 1));
  assert_int_equal(clpar_module_forward(bn, flat, &z), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_null(z);
  assert_non_null(strstr(clpar_last_error(), "BatchNorm2d"));
  assert_int_equal(read_count(clpar_module_buffer(bn, "num_batches_tracked")), 41);
  clpar_scope_end(scope);
  clpar_module_free(bn);
}

static void test_batchnorm2d(void **state) {
  (void)state;
  each_device(batchnorm_on);
}

static void test_batchnorm2d_options(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  clpar_module *bn = NULL;
  /* no tracking, no affine: no parameters, no buffers, batch statistics in eval too */
  tu_ok(clpar_batchnorm2d_create(
      2, &(clpar_batchnorm2d_options){.no_affine = 1, .no_running_stats = 1}, dev, &bn));
  assert_int_equal(clpar_module_parameter_count(bn), 0);
  assert_int_equal(clpar_module_buffer_count(bn), 0);
  tu_ok(clpar_module_train(bn, 0));
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 4, (int64_t[]){3, 2, 2, 2}, 9), *y;
  tu_ok(clpar_module_forward(bn, x, &y));
  float *yv = tu_read(y);
  for (int c = 0; c < 2; c++) {
    double s = 0;
    for (int n = 0; n < 3; n++)
      for (int i = 0; i < 4; i++) s += yv[(n * 2 + c) * 4 + i];
    assert_true(fabs(s / 12) < 1e-5);
  }
  free(yv);
  clpar_scope_end(scope);
  clpar_module_free(bn);
  /* bad arguments: nothing made */
  bn = NULL;
  assert_int_equal(clpar_batchnorm2d_create(0, NULL, dev, &bn), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(
      clpar_batchnorm2d_create(4, &(clpar_batchnorm2d_options){.eps = -1e-5f}, dev, &bn),
      CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(
      clpar_batchnorm2d_create(4, &(clpar_batchnorm2d_options){.momentum = 1.5f}, dev, &bn),
      CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_batchnorm2d_create(4, NULL, NULL, &bn), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(bn);
  clpar_module *m = NULL;
  assert_int_equal(clpar_resnet_create(CLPAR_RESNET_BASIC, (const int[4]){2, 0, 2, 2}, 10, dev, &m),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_resnet18(0, dev, &m), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_resnet_block_create(CLPAR_RESNET_BOTTLENECK, 16, 8, 0, dev, &m),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(m);
  /* an image with the wrong channel count is refused by conv1, with an error */
  tu_ok(clpar_resnet18(10, dev, &m));
  scope = clpar_scope_begin();
  clpar_tensor *gray = tu_make(dev, 4, (int64_t[]){1, 1, 32, 32}, 3), *out = NULL;
  assert_int_not_equal(clpar_module_forward(m, gray, &out), CLPAR_OK);
  assert_null(out);
  clpar_scope_end(scope);
  clpar_module_free(m);
}

/* ---- checkpoints and DataParallel ---- */

/* A state_dict saved as safetensors (int64 0-d counters included) loads into a fresh model
 * with every entry equal. */
static void test_checkpoint_roundtrip(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  clpar_module *a, *b;
  tu_ok(clpar_resnet18(10, dev, &a));
  set_ref_weights(a);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 4, (int64_t[]){2, 3, 32, 32}, 4), *y;
  tu_ok(clpar_module_forward(a, x, &y)); /* running statistics move, counters become 1 */
  clpar_scope_end(scope);
  char path[] = "/tmp/clpar_test_resnet_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  tu_ok(clpar_safetensors_save(a, path, NULL, NULL, 0));
  clpar_manual_seed(99);
  tu_ok(clpar_resnet18(10, dev, &b));
  tu_ok(clpar_safetensors_load(b, path, 1, NULL));
  unlink(path);
  assert_int_equal(clpar_module_state_count(a), clpar_module_state_count(b));
  for (int j = 0; j < clpar_module_state_count(a); j++) {
    const char *na, *nb;
    clpar_tensor *ta, *tb;
    tu_ok(clpar_module_state_at(a, j, &na, &ta, NULL));
    tu_ok(clpar_module_state_at(b, j, &nb, &tb, NULL));
    assert_string_equal(na, nb);
    size_t bytes = (size_t)clpar_tensor_numel(ta) * clpar_dtype_size(clpar_tensor_dtype(ta));
    char *va = malloc(bytes), *vb = malloc(bytes);
    tu_ok(clpar_tensor_read_raw(ta, va, bytes));
    tu_ok(clpar_tensor_read_raw(tb, vb, bytes));
    if (memcmp(va, vb, bytes) != 0) fail_msg("%s differs after the round trip", na);
    free(va);
    free(vb);
  }
  assert_int_equal(read_count(entry(b, "layer3.1.bn2.num_batches_tracked")), 1);
  /* the counter goes on from the loaded value */
  scope = clpar_scope_begin();
  x = tu_make(dev, 4, (int64_t[]){2, 3, 32, 32}, 5);
  tu_ok(clpar_module_forward(b, x, &y));
  clpar_scope_end(scope);
  assert_int_equal(read_count(entry(b, "bn1.num_batches_tracked")), 2);
  clpar_module_free(a);
  clpar_module_free(b);
}

/* DataParallel over two devices: in training mode each replica normalizes its own chunk (as
 * PyTorch's replicas do): the output equals each chunk's through a plain model on that chunk's
 * device (the same device, since a ReLU input near 0 may fall on either side on another
 * backend); the wrapped module's counters count the forward once; in eval mode the output
 * equals one device's on the whole batch. */
static void test_data_parallel(void **state) {
  (void)state;
  clpar_device *d0 = clpar_device_get(0), *d1 = tu_second_device(d0);
  if (!d1) skip();
  clpar_module *single, *single1, *m, *dp;
  tu_ok(clpar_resnet18(10, d0, &single));
  tu_ok(clpar_resnet18(10, d1, &single1));
  tu_ok(clpar_resnet18(10, d0, &m));
  set_ref_weights(single);
  set_ref_weights(single1);
  set_ref_weights(m);
  clpar_device *devs[2] = {d0, d1};
  clpar_data_parallel_options o = {.devices = devs, .n_devices = 2};
  tu_ok(clpar_data_parallel_create(m, &o, &dp));
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x = tu_make(d0, 4, (int64_t[]){4, 3, 32, 32}, 6), *half, *y, *want, *parts[2];
  tu_ok(clpar_tensor_rows(x, 0, 2, &half));
  tu_ok(clpar_module_forward(single, half, &parts[0]));
  tu_ok(clpar_tensor_rows(x, 2, 2, &half));
  tu_ok(clpar_tensor_to(half, d1, &half));
  tu_ok(clpar_module_forward(single1, half, &y));
  tu_ok(clpar_tensor_to(y, d0, &parts[1]));
  tu_ok(clpar_concat(parts, 2, &want));
  tu_ok(clpar_module_forward(dp, x, &y));
  tu_expect_equal(y, want, 1e-4f, 1e-5f, "DataParallel training output");
  assert_int_equal(
      read_count(clpar_module_buffer(clpar_module_child(m, "bn1"), "num_batches_tracked")), 1);
  /* A second training forward: the counters count without the host waiting for any device
   * (a replica that counted would read its freshly copied counter back, once per BatchNorm). */
  uint64_t waits = clpar_device_host_waits(d0) + clpar_device_host_waits(d1);
  tu_ok(clpar_module_forward(dp, x, &y));
  assert_int_equal(clpar_device_host_waits(d0) + clpar_device_host_waits(d1), waits);
  assert_int_equal(
      read_count(clpar_module_buffer(clpar_module_child(m, "bn1"), "num_batches_tracked")), 2);
  tu_ok(clpar_module_train(dp, 0));
  tu_ok(clpar_module_train(single, 0));
  set_ref_weights(single); /* both from the same state again (running statistics too) */
  set_ref_weights(m);
  tu_ok(clpar_module_forward(single, x, &want));
  tu_ok(clpar_module_forward(dp, x, &y));
  tu_expect_equal(y, want, 1e-4f, 1e-5f, "DataParallel eval output");
  clpar_scope_end(scope);
  clpar_module_free(single);
  clpar_module_free(single1);
  clpar_module_free(dp);
}

/* ---- training lowers the loss ---- */

static void training_on(clpar_device *dev) {
  clpar_module *m;
  clpar_optimizer *opt;
  clpar_manual_seed(11);
  tu_ok(clpar_resnet18(4, dev, &m));
  tu_ok(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.01f, .momentum = 0.9f}, &opt));
  static const int32_t labels[4] = {0, 1, 2, 3};
  float first = 0, last = 0;
  for (int step = 0; step < 6; step++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x = tu_make(dev, 4, (int64_t[]){4, 3, 32, 32}, 77), *logits, *loss;
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(m, x, &logits));
    tu_ok(clpar_cross_entropy(logits, labels, 4, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    tu_ok(clpar_tensor_read(loss, step == 0 ? &first : &last, 1));
    clpar_scope_end(scope);
  }
  if (!(last < 0.5f * first))
    fail_msg("%s: the loss went from %g to %g in 6 steps", clpar_device_id(dev), first, last);
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

static void test_training(void **state) {
  (void)state;
  each_device(training_on);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resnet50_state_dict),
      cmocka_unit_test(test_resnet18_state_dict),
      cmocka_unit_test(test_init),
      cmocka_unit_test(test_batchnorm2d),
      cmocka_unit_test(test_batchnorm2d_options),
      cmocka_unit_test(test_bottleneck_reference),
      cmocka_unit_test(test_resnet18_reference),
      cmocka_unit_test(test_training),
      cmocka_unit_test(test_checkpoint_roundtrip),
      cmocka_unit_test(test_data_parallel),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
