/* test_autocast_conv.c — a small convolutional network (Conv2d, BatchNorm2d, ReLU,
 * MaxPool2d, Conv2d, ReLU, AdaptiveAvgPool2d, Flatten, Linear) trained under bfloat16 and
 * float16 autocast: the losses and weights track the float32 run on the host and every
 * selected device; the convolution's casts against the same casts written out, and the
 * other layers' outputs in the dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/amp.h"
#include "clpar/conv.h"
#include "clpar/memory.h"
#include "test_util.h"

enum { BATCH = 6, CLASSES = 3, STEPS = 4, CAP = 1024 };

static clpar_module *make_cnn(clpar_device *dev) {
  clpar_module *l[9], *m;
  int n = 0;
  clpar_conv2d_options pad = {.padding = {1, 1}};
  clpar_manual_seed(9);
  tu_ok(clpar_conv2d_create(3, 4, 3, 3, &pad, 1, dev, &l[n++]));
  tu_ok(clpar_batchnorm2d_create(4, NULL, dev, &l[n++]));
  tu_ok(clpar_relu_create(&l[n++]));
  tu_ok(clpar_max_pool2d_create((int64_t[]){2, 2}, NULL, NULL, &l[n++]));
  tu_ok(clpar_conv2d_create(4, 6, 3, 3, &pad, 1, dev, &l[n++]));
  tu_ok(clpar_relu_create(&l[n++]));
  tu_ok(clpar_adaptive_avg_pool2d_create(1, 1, &l[n++]));
  tu_ok(clpar_flatten_create(1, -1, &l[n++]));
  tu_ok(clpar_linear_create(6, CLASSES, 1, dev, &l[n++]));
  tu_ok(clpar_sequential_create(l, n, &m));
  return m;
}

/* STEPS of SGD (lr 0.2) on one batch under dtype's autocast (none for float32) with a
 * GradScaler (float16's small gradients would underflow without it); the losses and the
 * weights after out, their count back. */
static int train(clpar_device *dev, clpar_dtype dtype, float *losses, float *weights) {
  clpar_module *m = make_cnn(dev);
  clpar_optimizer *o;
  tu_ok(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.2f}, &o));
  clpar_grad_scaler *gs;
  tu_ok(clpar_grad_scaler_create(NULL, &gs));
  int32_t labels[BATCH];
  for (int i = 0; i < BATCH; i++) labels[i] = (i * 5 + 1) % CLASSES;
  for (int t = 0; t < STEPS; t++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x = tu_make(dev, 4, (int64_t[]){BATCH, 3, 8, 8}, 4), *y, *loss;
    if (dtype != CLPAR_FLOAT32) tu_ok(clpar_autocast_begin(dtype));
    tu_ok(clpar_module_forward(m, x, &y));
    assert_int_equal(clpar_tensor_dtype(y), dtype);
    tu_ok(clpar_cross_entropy(y, labels, BATCH, CLPAR_REDUCTION_MEAN, &loss));
    if (dtype != CLPAR_FLOAT32) clpar_autocast_end();
    tu_ok(clpar_tensor_read(loss, &losses[t], 1));
    tu_ok(clpar_optimizer_zero_grad(o));
    tu_ok(clpar_grad_scaler_scale(gs, loss, &loss));
    tu_ok(clpar_backward(loss));
    int skipped = -1;
    tu_ok(clpar_grad_scaler_step(gs, o, &skipped));
    assert_int_equal(skipped, 0);
    tu_ok(clpar_grad_scaler_update(gs));
    clpar_scope_end(sc);
  }
  int at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    assert_int_equal(clpar_tensor_dtype(p), CLPAR_FLOAT32);
    tu_ok(clpar_tensor_read(p, weights + at, (size_t)(CAP - at)));
    at += (int)clpar_tensor_numel(p);
  }
  clpar_grad_scaler_free(gs);
  clpar_optimizer_free(o);
  clpar_module_free(m);
  return at;
}

/* Relative to each loss and to the largest weight: bfloat16 (8 significant bits) 1e-2 and
 * 3e-2, test_autocast's MLP bounds; float16 (11 bits) 1e-3 and 5e-3. The float16 weight bound
 * is above the MLP's 2e-3: one second-layer weight moves by 0.002 of the largest under both
 * dtypes alike (seen on PoCL and the host), a ReLU or max-pool choice at a near-tie that the
 * rounding flips, not the dtype's precision. */
static void test_cnn_tracks_fp32(void **state) {
  (void)state;
  float w32[CAP], w[CAP], l32[STEPS], l[STEPS];
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    int n = train(dev, CLPAR_FLOAT32, l32, w32);
    for (int k = 0; k < 2; k++) {
      clpar_dtype dt = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      float ltol = k ? 1e-3f : 1e-2f, wtol = k ? 5e-3f : 3e-2f, worst = 0, scale = 0, lw = 0;
      assert_int_equal(train(dev, dt, l, w), n);
      for (int i = 0; i < n; i++)
        worst = fmaxf(worst, fabsf(w[i] - w32[i])), scale = fmaxf(scale, fabsf(w32[i]));
      for (int i = 0; i < STEPS; i++) lw = fmaxf(lw, fabsf(l[i] - l32[i]) / fabsf(l32[i]));
      printf("# %s %s: losses within %.3g (relative), weights within %.3g of the largest\n",
             clpar_device_id(dev), clpar_dtype_name(dt), (double)lw, (double)(worst / scale));
      if (lw > ltol || worst > wtol * scale)
        fail_msg("%s %s: losses differ by %g, weights by %g of the largest", clpar_device_id(dev),
                 clpar_dtype_name(dt), (double)lw, (double)(worst / scale));
      assert_true(l[STEPS - 1] < l[0]);
    }
  }
}

/* sum(m * float(conv2d(x, w, b))) with conv2d under autocast, or (autocast 0) with the casts
 * written out: x, w and b rounded to dt and widened, convolved in float32, rounded to dt. The
 * output and the weight's gradient out. */
static void conv_case(clpar_device *dev, clpar_dtype dt, int autocast, float **out, float **gw) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_conv2d_options o = {.padding = {1, 1}};
  clpar_tensor *x = tu_make(dev, 4, (int64_t[]){2, 3, 5, 5}, 31);
  clpar_tensor *w = tu_make(dev, 4, (int64_t[]){4, 3, 3, 3}, 32);
  clpar_tensor *b = tu_make(dev, 1, (int64_t[]){4}, 33),
               *m = tu_make(dev, 4, (int64_t[]){2, 4, 5, 5}, 34);
  clpar_tensor *y, *y32, *p, *loss;
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  if (autocast) {
    tu_ok(clpar_autocast_begin(dt));
    tu_ok(clpar_conv2d(x, w, b, &o, &y));
    clpar_autocast_end();
    assert_int_equal(clpar_tensor_dtype(y), dt);
  } else {
    clpar_tensor *in[3] = {x, w, b}, *f[3], *h, *c;
    for (int i = 0; i < 3; i++) {
      tu_ok(clpar_to_dtype(in[i], dt, &h));
      tu_ok(clpar_to_dtype(h, CLPAR_FLOAT32, &f[i]));
    }
    tu_ok(clpar_conv2d(f[0], f[1], f[2], &o, &c));
    tu_ok(clpar_to_dtype(c, dt, &y));
  }
  tu_ok(clpar_to_dtype(y, CLPAR_FLOAT32, &y32));
  tu_ok(clpar_mul(y32, m, &p));
  tu_ok(clpar_sum(p, &loss));
  tu_ok(clpar_backward(loss));
  *out = tu_read(y32);
  *gw = tu_read(clpar_tensor_grad(w));
  clpar_scope_end(sc);
}

/* clpar_conv2d under autocast gives the numbers of its casts written out, bit for bit; ReLU,
 * BatchNorm, max and average pooling take its 16-bit output and give their results in its
 * dtype. */
static void test_conv_casts(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    for (int k = 0; k < 2; k++) {
      clpar_dtype dt = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      float *o[2], *g[2];
      for (int a = 0; a < 2; a++) conv_case(dev, dt, a, &o[a], &g[a]);
      assert_memory_equal(o[0], o[1], 200 * sizeof(float));
      assert_memory_equal(g[0], g[1], 108 * sizeof(float));
      for (int a = 0; a < 2; a++) free(o[a]), free(g[a]);
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *x = tu_make(dev, 4, (int64_t[]){2, 4, 4, 4}, 35), *h, *r;
      tu_ok(clpar_to_dtype(x, dt, &h));
      tu_ok(clpar_autocast_begin(dt));
      tu_ok(clpar_relu(h, &r));
      assert_int_equal(clpar_tensor_dtype(r), dt);
      tu_ok(clpar_max_pool2d(h, (int64_t[]){2, 2}, NULL, NULL, &r));
      assert_int_equal(clpar_tensor_dtype(r), dt);
      tu_ok(clpar_adaptive_avg_pool2d(h, 1, 1, &r));
      assert_int_equal(clpar_tensor_dtype(r), dt);
      tu_ok(clpar_batch_norm(h, NULL, NULL, NULL, NULL, 1, 0.1f, 1e-5f, &r));
      assert_int_equal(clpar_tensor_dtype(r), dt);
      clpar_autocast_end();
      clpar_scope_end(sc);
    }
  }
}

/* Activation bytes dev holds after the forward of LAYERS 3x3 convolutions (16 -> 16
 * channels, padding 1) over a [8, 16, 32, 32] input under dtype's autocast (none for
 * float32), minus those before it: what the forward keeps for backward. The backward runs,
 * and its peak is printed. */
static uint64_t conv_stack_bytes(clpar_device *dev, clpar_module *m, clpar_dtype dtype) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 4, (int64_t[]){8, 16, 32, 32}, 36), *y, *y32, *loss;
  tu_ok(clpar_device_synchronize(dev));
  uint64_t before = clpar_memory_in_use(dev, CLPAR_MEM_ACTIVATIONS);
  tu_ok(clpar_memory_mark(dev));
  if (dtype != CLPAR_FLOAT32) tu_ok(clpar_autocast_begin(dtype));
  tu_ok(clpar_module_forward(m, x, &y));
  if (dtype != CLPAR_FLOAT32) clpar_autocast_end();
  tu_ok(clpar_device_synchronize(dev));
  uint64_t kept = clpar_memory_in_use(dev, CLPAR_MEM_ACTIVATIONS) - before;
  tu_ok(clpar_to_dtype(y, CLPAR_FLOAT32, &y32));
  tu_ok(clpar_sum(y32, &loss));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_device_synchronize(dev));
  printf("# %s %s: forward keeps %llu activation bytes, step's peak %llu\n", clpar_device_id(dev),
         clpar_dtype_name(dtype), (unsigned long long)kept,
         (unsigned long long)(clpar_memory_peak(dev, CLPAR_MEM_ACTIVATIONS) - before));
  clpar_scope_end(sc);
  return kept;
}

/* The convolutions' nodes keep 16-bit tensors under autocast: the stack's activations (eight
 * [8, 16, 32, 32] outputs, plus the first layer's 16-bit input) take at most 0.6 of float32's
 * bytes (9/16 and 16-bit weight copies). */
static void test_conv_activation_memory(void **state) {
  (void)state;
  enum { LAYERS = 8 };
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    clpar_module *l[LAYERS], *m;
    clpar_conv2d_options pad = {.padding = {1, 1}};
    clpar_manual_seed(10);
    for (int i = 0; i < LAYERS; i++) tu_ok(clpar_conv2d_create(16, 16, 3, 3, &pad, 1, dev, &l[i]));
    tu_ok(clpar_sequential_create(l, LAYERS, &m));
    uint64_t f32 = conv_stack_bytes(dev, m, CLPAR_FLOAT32);
    uint64_t bf16 = conv_stack_bytes(dev, m, CLPAR_BFLOAT16);
    printf("# %s: kept by the forward: float32 %llu, bfloat16 autocast %llu (%.3f)\n",
           clpar_device_id(dev), (unsigned long long)f32, (unsigned long long)bf16,
           (double)bf16 / (double)f32);
    assert_true(f32 >= (uint64_t)LAYERS * 8 * 16 * 32 * 32 * 4);
    assert_true((double)bf16 <= 0.6 * (double)f32);
    clpar_module_free(m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_casts),
      cmocka_unit_test(test_cnn_tracks_fp32),
      cmocka_unit_test(test_conv_activation_memory),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
