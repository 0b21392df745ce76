/* test_defaults.c — options structs written the way a user writes them (zero-initialized
 * except the fields they care about, or NULL) give PyTorch's defaults: Adam and AdamW with only
 * lr train exactly as with PyTorch's betas, eps (and AdamW's weight decay) spelled out; SGD's
 * lr; a Conv2d with only padding; BatchNorm2d; a loader with no batch_size. CLPAR_ZERO asks for
 * a literal 0 (Adam's beta1, AdamW's weight decay, BatchNorm2d's momentum), checked against
 * Adam's update rule computed here in double precision. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define IN 4
#define OUT 3
#define ROWS 8
#define STEPS 10

/* Trains Linear(IN, OUT) (seeded) for STEPS steps of MSE on fixed data with the optimizer
 * make() creates from the options; the parameters after, flattened, into out (IN*OUT + OUT). */
typedef clpar_status (*make_fn)(clpar_module *m, const void *options, clpar_optimizer **out);

static clpar_status make_adam(clpar_module *m, const void *o, clpar_optimizer **out) {
  return clpar_adam_create_for(m, o, out);
}
static clpar_status make_adamw(clpar_module *m, const void *o, clpar_optimizer **out) {
  return clpar_adamw_create_for(m, o, out);
}
static clpar_status make_sgd(clpar_module *m, const void *o, clpar_optimizer **out) {
  return clpar_sgd_create_for(m, o, out);
}

static void train(make_fn make, const void *options, float *out) {
  clpar_device *dev = clpar_device_get(0);
  clpar_module *m;
  clpar_manual_seed(3);
  tu_ok(clpar_linear_create(IN, OUT, 1, dev, &m));
  clpar_optimizer *opt;
  tu_ok(make(m, options, &opt));
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){ROWS, IN}, 21);
  clpar_tensor *t = tu_make(dev, 2, (int64_t[]){ROWS, OUT}, 22);
  for (int step = 0; step < STEPS; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *y, *loss;
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(m, x, &y));
    tu_ok(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_scope_end(sc);
  }
  int at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    int64_t n = clpar_tensor_numel(p);
    tu_ok(clpar_tensor_read(p, out + at, (size_t)n));
    at += (int)n;
  }
  assert_int_equal(at, IN * OUT + OUT);
  clpar_tensor_free(x);
  clpar_tensor_free(t);
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

static void expect_same_training(make_fn make, const void *given, const void *spelled,
                                 const char *what) {
  float a[IN * OUT + OUT], b[IN * OUT + OUT], start[IN * OUT + OUT];
  train(make, given, a);
  train(make, spelled, b);
  for (int i = 0; i < IN * OUT + OUT; i++)
    if (!isfinite(a[i])) fail_msg("%s: parameter %d is %g after %d steps", what, i, a[i], STEPS);
  tu_assert_close(a, b, IN * OUT + OUT, 0.0f, 0.0f, what);
  /* and it trained: the parameters moved */
  clpar_manual_seed(3);
  clpar_module *m;
  tu_ok(clpar_linear_create(IN, OUT, 1, clpar_device_get(0), &m));
  for (int i = 0, at = 0; i < 2; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, start + at, (size_t)clpar_tensor_numel(p)));
    at += (int)clpar_tensor_numel(p);
  }
  clpar_module_free(m);
  assert_memory_not_equal(a, start, sizeof a);
}

static void test_adam_with_only_lr(void **state) {
  (void)state;
  expect_same_training(
      make_adam, &(clpar_adam_options){.lr = 1e-2f},
      &(clpar_adam_options){.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
      "Adam {.lr} against PyTorch's defaults spelled out");
  expect_same_training(
      make_adam, NULL,
      &(clpar_adam_options){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
      "Adam with NULL options against PyTorch's defaults");
}

static void test_adamw_with_only_lr(void **state) {
  (void)state;
  expect_same_training(
      make_adamw, &(clpar_adam_options){.lr = 1e-2f},
      &(clpar_adam_options){
          .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f},
      "AdamW {.lr} against PyTorch's defaults (weight_decay 0.01)");
}

static void test_sgd_defaults(void **state) {
  (void)state;
  clpar_sgd_options lr_only = {.lr = 1e-3f};
  expect_same_training(make_sgd, &(clpar_sgd_options){0}, &lr_only, "SGD {0}: lr 1e-3");
  expect_same_training(make_sgd, NULL, &lr_only, "SGD NULL options: lr 1e-3");
}

/* nn.Conv2d(2, 3, 3, padding=1): stride, dilation and groups left 0 are PyTorch's 1. */
static void test_conv2d_with_only_padding(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_conv2d_options padding_only = {.padding = {1, 1}};
  clpar_conv2d_options spelled = {{1, 1}, {1, 1}, {1, 1}, 1};
  clpar_module *a, *b;
  clpar_manual_seed(5);
  tu_ok(clpar_conv2d_create(2, 3, 3, 3, &padding_only, 1, dev, &a));
  clpar_manual_seed(5);
  tu_ok(clpar_conv2d_create(2, 3, 3, 3, &spelled, 1, dev, &b));
  clpar_tensor *x = tu_make(dev, 4, (int64_t[]){2, 2, 5, 5}, 7), *ya, *yb, *yf;
  tu_ok(clpar_module_forward(a, x, &ya));
  tu_ok(clpar_module_forward(b, x, &yb));
  assert_int_equal(clpar_tensor_dim(ya, 2), 5);
  assert_int_equal(clpar_tensor_dim(ya, 3), 5);
  tu_expect_equal(ya, yb, 0.0f, 0.0f, "Conv2d {.padding} against stride, dilation, groups 1");
  /* the functional form too */
  tu_ok(clpar_conv2d(x, clpar_module_parameter(b, "weight"), clpar_module_parameter(b, "bias"),
                     &padding_only, &yf));
  tu_expect_equal(yf, yb, 0.0f, 0.0f, "clpar_conv2d {.padding}");
  clpar_tensor_free(x);
  clpar_tensor_free(ya);
  clpar_tensor_free(yb);
  clpar_tensor_free(yf);
  clpar_module_free(a);
  clpar_module_free(b);
}

/* DataLoader's batch_size defaults to 1; NULL options are the defaults. */
static void test_loader_defaults(void **state) {
  (void)state;
  float f[6] = {1, 2, 3, 4, 5, 6};
  clpar_dataset *ds;
  tu_ok(clpar_dataset_from_arrays(3, 1, (int64_t[]){2}, f, NULL, &ds));
  clpar_loader *l;
  tu_ok(clpar_loader_create(ds, clpar_device_get(0), &(clpar_loader_options){0}, &l));
  assert_int_equal(clpar_loader_batches(l), 3);
  clpar_loader_free(l);
  tu_ok(clpar_loader_create(ds, clpar_device_get(0), NULL, &l));
  assert_int_equal(clpar_loader_batches(l), 3);
  clpar_loader_free(l);
  clpar_dataset_free(ds);
}

/* torch.optim.Adam / AdamW on one tensor p (n values) with loss sum(p^2), in double. */
static void adam_reference(double *p, int n, int steps, double lr, double b1, double b2, double eps,
                           double wd, int decoupled) {
  double m[8] = {0}, v[8] = {0};
  for (int t = 1; t <= steps; t++)
    for (int i = 0; i < n; i++) {
      double g = 2.0 * p[i];
      if (decoupled)
        p[i] *= 1.0 - lr * wd;
      else
        g += wd * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      double denom = sqrt(v[i]) / sqrt(1.0 - pow(b2, t)) + eps;
      p[i] -= lr / (1.0 - pow(b1, t)) * m[i] / denom;
    }
}

static clpar_status no_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *u) {
  (void)self, (void)x, (void)y, (void)u;
  return CLPAR_ERROR_UNSUPPORTED;
}

/* steps steps of loss sum(p^2) from p0 with the optimizer make() creates; p after out. */
static void train_square(make_fn make, const void *options, const float *p0, int n, int steps,
                         float *out) {
  clpar_device *dev = clpar_device_get(0);
  clpar_module *m;
  clpar_tensor *p, *zero;
  tu_ok(clpar_tensor_from_host(dev, 1, (int64_t[]){n}, p0, &p));
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){n}, &zero));
  tu_ok(clpar_module_create("P", no_forward, NULL, NULL, &m));
  tu_ok(clpar_module_add_parameter(m, "p", p));
  clpar_optimizer *opt;
  tu_ok(make(m, options, &opt));
  for (int step = 0; step < steps; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *loss;
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_mse_loss(p, zero, CLPAR_REDUCTION_SUM, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_scope_end(sc);
  }
  tu_ok(clpar_tensor_read(p, out, (size_t)n));
  clpar_optimizer_free(opt);
  clpar_module_free(m);
  clpar_tensor_free(p);
  clpar_tensor_free(zero);
}

static void expect_adam(make_fn make, const clpar_adam_options *o, double lr, double b1, double b2,
                        double eps, double wd, int decoupled, const char *what) {
  const float p0[6] = {0.5f, -1.25f, 2.0f, -0.75f, 0.125f, 1.5f};
  double ref[6];
  float got[6], want[6];
  for (int i = 0; i < 6; i++) ref[i] = p0[i];
  adam_reference(ref, 6, 5, lr, b1, b2, eps, wd, decoupled);
  for (int i = 0; i < 6; i++) want[i] = (float)ref[i];
  train_square(make, o, p0, 6, 5, got);
  tu_assert_close(got, want, 6, 1e-5f, 1e-6f, what);
}

static void test_adam_literal_zero(void **state) {
  (void)state;
  expect_adam(make_adam, &(clpar_adam_options){.lr = 0.1f}, 0.1, 0.9, 0.999, 1e-8, 0, 0,
              "Adam {.lr = 0.1}: betas (0.9, 0.999), eps 1e-8");
  expect_adam(make_adam, &(clpar_adam_options){.lr = 0.1f, .beta1 = CLPAR_ZERO}, 0.1, 0.0, 0.999,
              1e-8, 0, 0, "Adam beta1 CLPAR_ZERO: beta1 0");
  expect_adam(make_adam, &(clpar_adam_options){.lr = 0.1f, .beta1 = 0.5f, .weight_decay = 0.25f},
              0.1, 0.5, 0.999, 1e-8, 0.25, 0, "Adam beta1 0.5, L2 0.25");
  expect_adam(make_adamw, &(clpar_adam_options){.lr = 0.1f}, 0.1, 0.9, 0.999, 1e-8, 0.01, 1,
              "AdamW {.lr = 0.1}: weight_decay 0.01");
  expect_adam(make_adamw, &(clpar_adam_options){.lr = 0.1f, .weight_decay = CLPAR_ZERO}, 0.1, 0.9,
              0.999, 1e-8, 0.0, 1, "AdamW weight_decay CLPAR_ZERO: no decay");
  /* lr CLPAR_ZERO: a literal 0, nothing moves */
  const float p0[2] = {0.5f, -2.0f};
  float got[2];
  train_square(make_sgd, &(clpar_sgd_options){.lr = CLPAR_ZERO}, p0, 2, 3, got);
  assert_memory_equal(got, p0, sizeof got);
}

static void test_bad_options_name_the_field(void **state) {
  (void)state;
  clpar_module *m;
  clpar_optimizer *opt = NULL;
  tu_ok(clpar_linear_create(2, 2, 1, clpar_device_get(0), &m));
  assert_int_equal(clpar_adam_create_for(m, &(clpar_adam_options){.beta1 = -0.5f}, &opt),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_failure(), "clpar_adam_create_for: options.beta1 is -0.5"));
  assert_int_equal(clpar_adamw_create_for(m, &(clpar_adam_options){.beta2 = 1.0f}, &opt),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_failure(), "clpar_adamw_create_for: options.beta2 is 1"));
  assert_int_equal(clpar_sgd_create_for(m, &(clpar_sgd_options){.momentum = -1.0f}, &opt),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_failure(), "clpar_sgd_create_for: options.momentum is -1"));
  assert_null(opt);
  clpar_module_free(m);
}

/* One training forward of BatchNorm2d(2) on an input whose channel means are 1 and 3; the
 * running means after, into mean. */
static void bn_running_mean(const clpar_batchnorm2d_options *o, float mean[2], int *training) {
  clpar_device *dev = clpar_device_get(0);
  clpar_module *bn;
  tu_ok(clpar_batchnorm2d_create(2, o, dev, &bn));
  float x[8] = {0, 2, 0, 2, 2, 4, 2, 4}; /* [1, 2, 2, 2] */
  clpar_tensor *t, *y;
  tu_ok(clpar_tensor_from_host(dev, 4, (int64_t[]){1, 2, 2, 2}, x, &t));
  tu_ok(clpar_module_forward(bn, t, &y));
  tu_ok(clpar_tensor_read(clpar_module_buffer(bn, "running_mean"), mean, 2));
  *training = clpar_module_is_training(bn);
  tu_ok(clpar_module_eval(bn));
  assert_int_equal(clpar_module_is_training(bn), 0);
  assert_int_equal(clpar_module_parameter_count(bn), 2); /* affine by default */
  clpar_tensor_free(t);
  clpar_tensor_free(y);
  clpar_module_free(bn);
}

static void test_batchnorm2d_defaults(void **state) {
  (void)state;
  float mean[2];
  int training;
  bn_running_mean(NULL, mean, &training); /* momentum 0.1 */
  assert_int_equal(training, 1);
  tu_assert_close(mean, ((float[]){0.1f, 0.3f}), 2, 1e-6f, 1e-7f, "NULL options: momentum 0.1");
  bn_running_mean(&(clpar_batchnorm2d_options){0}, mean, &training);
  tu_assert_close(mean, ((float[]){0.1f, 0.3f}), 2, 1e-6f, 1e-7f, "{0}: momentum 0.1");
  bn_running_mean(&(clpar_batchnorm2d_options){.momentum = CLPAR_ZERO}, mean, &training);
  tu_assert_close(mean, ((float[]){0.0f, 0.0f}), 2, 0.0f, 0.0f, "momentum CLPAR_ZERO");
  bn_running_mean(&(clpar_batchnorm2d_options){.momentum = 0.5f}, mean, &training);
  tu_assert_close(mean, ((float[]){0.5f, 1.5f}), 2, 1e-6f, 1e-7f, "momentum 0.5");
}

/* Options whose every default is 0 already: zero-initialized is NULL. Pipeline: one
 * micro-batch (Pipe's chunks=1), GPipe, mean losses; DataParallel: every selected device. */
static void test_pipeline_and_data_parallel_defaults(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  for (int pass = 0; pass < 2; pass++) {
    clpar_module *st[2], *pipe;
    tu_ok(clpar_linear_create(3, 4, 1, dev, &st[0]));
    tu_ok(clpar_linear_create(4, 2, 1, dev, &st[1]));
    clpar_device *devs[2] = {dev, dev};
    tu_ok(clpar_pipeline_create(st, devs, 2, pass ? &(clpar_pipeline_options){0} : NULL, &pipe));
    int64_t sizes[8];
    assert_int_equal(clpar_pipeline_split(pipe, 10, sizes, 8), 1);
    assert_int_equal(sizes[0], 10);
    clpar_module_free(pipe);
    clpar_module *m, *dp;
    tu_ok(clpar_linear_create(3, 2, 1, dev, &m));
    tu_ok(clpar_data_parallel_create(m, pass ? &(clpar_data_parallel_options){0} : NULL, &dp));
    assert_int_equal(clpar_data_parallel_split(dp, 10, sizes), clpar_device_count());
    clpar_module_free(dp);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adam_with_only_lr),
      cmocka_unit_test(test_adamw_with_only_lr),
      cmocka_unit_test(test_sgd_defaults),
      cmocka_unit_test(test_conv2d_with_only_padding),
      cmocka_unit_test(test_loader_defaults),
      cmocka_unit_test(test_adam_literal_zero),
      cmocka_unit_test(test_bad_options_name_the_field),
      cmocka_unit_test(test_batchnorm2d_defaults),
      cmocka_unit_test(test_pipeline_and_data_parallel_defaults),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
