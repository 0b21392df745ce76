/* test_autocast.c — autocast regions: their rules; ops refusing 16-bit inputs outside them;
 * an MLP trained under bfloat16 and float16 autocast tracking its float32 run over SGD
 * steps on every selected device and the host; the bytes kept for backward halved. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

static void test_regions(void **state) {
  (void)state;
  assert_int_equal(clpar_autocast_dtype(), CLPAR_FLOAT32);
  assert_int_equal(clpar_autocast_begin(CLPAR_FLOAT32), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "clpar_autocast_begin"));
  assert_int_equal(clpar_autocast_begin(CLPAR_INT32), CLPAR_ERROR_INVALID_ARGUMENT);
  tu_ok(clpar_autocast_begin(CLPAR_BFLOAT16));
  tu_ok(clpar_autocast_begin(CLPAR_FLOAT16));
  assert_int_equal(clpar_autocast_dtype(), CLPAR_FLOAT16);
  clpar_autocast_end();
  assert_int_equal(clpar_autocast_dtype(), CLPAR_BFLOAT16);
  clpar_autocast_end();
  assert_int_equal(clpar_autocast_dtype(), CLPAR_FLOAT32);
}

/* Outside a region a 16-bit input is an error naming the op and the dtype; elementwise ops
 * with one float32 and one bfloat16 input refuse it inside one too. */
static void test_half_inputs_refused(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  int64_t shape[] = {2, 3}, wshape[] = {4, 3};
  clpar_tensor *a = tu_make(dev, 2, shape, 1), *w = tu_make(dev, 2, wshape, 2), *h, *y = NULL;
  tu_ok(clpar_to_dtype(a, CLPAR_BFLOAT16, &h));
  assert_int_equal(clpar_add(a, h, &y), CLPAR_ERROR_DTYPE);
  assert_non_null(strstr(clpar_last_error(), "bfloat16"));
  assert_int_equal(clpar_linear(h, w, NULL, &y), CLPAR_ERROR_DTYPE);
  assert_non_null(strstr(clpar_last_error(), "clpar_linear"));
  assert_non_null(strstr(clpar_last_error(), "autocast"));
  assert_null(y);
  tu_ok(clpar_autocast_begin(CLPAR_BFLOAT16));
  assert_int_equal(clpar_sum(h, &y), CLPAR_ERROR_DTYPE);
  tu_ok(clpar_mul(h, a, &y)); /* elementwise: in float32, the promoted type */
  assert_int_equal(clpar_tensor_dtype(y), CLPAR_FLOAT32);
  tu_ok(clpar_add(h, h, &y)); /* two bfloat16 inputs: a bfloat16 result */
  assert_int_equal(clpar_tensor_dtype(y), CLPAR_BFLOAT16);
  tu_ok(clpar_linear(h, w, NULL, &y)); /* inside: taken, output bfloat16 */
  assert_int_equal(clpar_tensor_dtype(y), CLPAR_BFLOAT16);
  clpar_autocast_end();
  clpar_scope_end(sc);
}

/* sum(w * float(a @ b)) under autocast against the same casts written out in float32 code:
 * the output, and the gradients of a and b, bit for bit (one device, the same GEMMs; a
 * device's own gemm_half other than the host's sums in its order: the output within one
 * rounding of the dtype, bfloat16's 2^-8). */
static void matmul_case(clpar_device *dev, clpar_dtype dt, int ta, int tb, int autocast,
                        float **out, float **ga, float **gb) {
  clpar_scope *sc = clpar_scope_begin();
  int64_t as[] = {ta ? 5 : 3, ta ? 3 : 5}, bs[] = {tb ? 4 : 5, tb ? 5 : 4}, rs[] = {3, 4};
  clpar_tensor *a = tu_make(dev, 2, as, 21), *b = tu_make(dev, 2, bs, 22);
  clpar_tensor *w = tu_make(dev, 2, rs, 23), *r, *r32, *p, *loss;
  tu_ok(clpar_tensor_set_requires_grad(a, 1));
  tu_ok(clpar_tensor_set_requires_grad(b, 1));
  if (autocast) {
    tu_ok(clpar_autocast_begin(dt));
    tu_ok(clpar_matmul(a, b, ta, tb, &r));
    clpar_autocast_end();
    assert_int_equal(clpar_tensor_dtype(r), dt);
  } else {
    clpar_tensor *ah, *bh, *a1, *b1, *m;
    tu_ok(clpar_to_dtype(a, dt, &ah));
    tu_ok(clpar_to_dtype(b, dt, &bh));
    tu_ok(clpar_to_dtype(ah, CLPAR_FLOAT32, &a1));
    tu_ok(clpar_to_dtype(bh, CLPAR_FLOAT32, &b1));
    tu_ok(clpar_matmul(a1, b1, ta, tb, &m));
    tu_ok(clpar_to_dtype(m, dt, &r));
  }
  tu_ok(clpar_to_dtype(r, CLPAR_FLOAT32, &r32));
  tu_ok(clpar_mul(r32, w, &p));
  tu_ok(clpar_sum(p, &loss));
  tu_ok(clpar_backward(loss));
  *out = tu_read(r32);
  *ga = tu_read(clpar_tensor_grad(a));
  *gb = tu_read(clpar_tensor_grad(b));
  clpar_scope_end(sc);
}

/* Whether dev runs autocast's forward GEMMs through a gemm_half of its own, not the host's. */
static int own_gemm_half(const clpar_device *dev) {
  return !clpar_entry_set(dev->natural, CLPAR_ENTRY_gemm_half) &&
         strcmp(dev->bd.iface->name, "host") != 0;
}

static void test_matmul(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    for (int c = 0; c < 8; c++) {
      clpar_dtype dt = (c & 4) ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      int ta = c & 1, tb = (c >> 1) & 1;
      float *o[2], *ga[2], *gb[2];
      for (int k = 0; k < 2; k++) matmul_case(dev, dt, ta, tb, k, &o[k], &ga[k], &gb[k]);
      if (own_gemm_half(dev))
        tu_assert_close(o[1], o[0], 12, 8e-3f, 1e-5f, clpar_device_id(dev));
      else
        assert_memory_equal(o[0], o[1], 12 * sizeof(float));
      assert_memory_equal(ga[0], ga[1], 15 * sizeof(float));
      assert_memory_equal(gb[0], gb[1], 20 * sizeof(float));
      for (int k = 0; k < 2; k++) free(o[k]), free(ga[k]), free(gb[k]);
    }
  }
}

enum { IN = 16, HID = 32, OUT = 5, BATCH = 24, STEPS = 5 };

static clpar_module *make_mlp(clpar_device *dev, int hid, int in, int layers) {
  clpar_module *c[9], *m;
  int n = 0;
  clpar_manual_seed(7);
  for (int l = 0; l < layers; l++) {
    tu_ok(clpar_linear_create(l ? hid : in, hid, 1, dev, &c[n++]));
    tu_ok(clpar_relu_create(&c[n++]));
  }
  tu_ok(clpar_linear_create(hid, OUT, 1, dev, &c[n++]));
  tu_ok(clpar_sequential_create(c, n, &m));
  return m;
}

/* STEPS of SGD (lr 0.5) on one batch; losses[i] the loss of step i, params the weights after
 * (float32, concatenated). dtype CLPAR_FLOAT32 runs without autocast. */
static void train(clpar_device *dev, clpar_dtype dtype, float *losses, float *params, size_t cap) {
  clpar_module *m = make_mlp(dev, HID, IN, 2);
  clpar_optimizer *opt;
  clpar_sgd_options o = {.lr = 0.5f};
  tu_ok(clpar_sgd_create_for(m, &o, &opt));
  int64_t xs[] = {BATCH, IN};
  int32_t labels[BATCH];
  for (int i = 0; i < BATCH; i++) labels[i] = (i * 7 + 3) % OUT;
  for (int step = 0; step < STEPS; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x = tu_make(dev, 2, xs, 11), *y, *loss;
    if (dtype != CLPAR_FLOAT32) tu_ok(clpar_autocast_begin(dtype));
    tu_ok(clpar_module_forward(m, x, &y));
    assert_int_equal(clpar_tensor_dtype(y), dtype);
    tu_ok(clpar_cross_entropy(y, labels, BATCH, CLPAR_REDUCTION_MEAN, &loss));
    if (dtype != CLPAR_FLOAT32) clpar_autocast_end();
    assert_int_equal(clpar_tensor_dtype(loss), CLPAR_FLOAT32);
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    tu_ok(clpar_tensor_read(loss, &losses[step], 1));
    clpar_scope_end(sc);
  }
  size_t at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    const char *name;
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, &name, &p));
    assert_int_equal(clpar_tensor_dtype(clpar_tensor_grad(p)), CLPAR_FLOAT32);
    assert_true(at + (size_t)clpar_tensor_numel(p) <= cap);
    tu_ok(clpar_tensor_read(p, params + at, cap - at));
    at += (size_t)clpar_tensor_numel(p);
  }
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

/* The tolerance: bfloat16 keeps 8 significant bits (relative rounding 2^-9), float16 11
 * (2^-12). Over 5 steps the losses stay within 1e-3 (bf16) and 1e-4 (fp16) relative of
 * float32's, the weights within 3e-2 and 2e-3 of the largest weight (seen on PoCL and the
 * host: 5e-5 and 4e-6 for the losses, 1.2e-2 and 2.6e-4 for the weights), and the loss falls. */
static void test_mlp_tracks_fp32(void **state) {
  (void)state;
  enum { CAP = 4096 };
  float *p32 = malloc(CAP * sizeof *p32), *ph = malloc(CAP * sizeof *ph);
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    if (d >= 0 && dev == tu_host()) continue; /* done first */
    float l32[STEPS], lh[STEPS];
    train(dev, CLPAR_FLOAT32, l32, p32, CAP);
    for (int k = 0; k < 2; k++) {
      clpar_dtype dt = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      float tol = k ? 1e-4f : 1e-3f, wtol = k ? 2e-3f : 3e-2f;
      train(dev, dt, lh, ph, CAP);
      for (int i = 0; i < STEPS; i++) {
        printf("# %s %s step %d: loss %.6f (float32 %.6f)\n", clpar_device_id(dev),
               clpar_dtype_name(dt), i, (double)lh[i], (double)l32[i]);
        if (fabsf(lh[i] - l32[i]) > tol * fabsf(l32[i]))
          fail_msg("%s %s: step %d loss %g, float32 %g", clpar_device_id(dev), clpar_dtype_name(dt),
                   i, (double)lh[i], (double)l32[i]);
      }
      assert_true(lh[STEPS - 1] < lh[0]);
      size_t n = (size_t)(IN * HID + HID + HID * HID + HID + HID * OUT + OUT);
      float worst = 0.0f, scale = 0.0f;
      for (size_t i = 0; i < n; i++) {
        worst = fmaxf(worst, fabsf(ph[i] - p32[i]));
        scale = fmaxf(scale, fabsf(p32[i]));
      }
      printf("# %s %s: weights within %g of float32's (largest weight %g)\n", clpar_device_id(dev),
             clpar_dtype_name(dt), (double)worst, (double)scale);
      if (worst > wtol * scale)
        fail_msg("%s %s: weights differ by %g (largest weight %g)", clpar_device_id(dev),
                 clpar_dtype_name(dt), (double)worst, (double)scale);
    }
  }
  free(p32), free(ph);
}

/* train's loop with the parameters in dtype and float32 masters stepped by SGD. */
static void train_master(clpar_device *dev, clpar_dtype dtype, float *losses, float *params,
                         size_t cap) {
  clpar_module *m = make_mlp(dev, HID, IN, 2);
  clpar_master_weights *mw;
  tu_ok(clpar_master_weights_create(m, dtype, &mw));
  int n = clpar_master_weights_count(mw);
  assert_int_equal(n, clpar_module_parameter_count(m));
  clpar_tensor *masters[8];
  for (int i = 0; i < n; i++) masters[i] = clpar_master_weights_at(mw, i);
  clpar_optimizer *opt;
  clpar_sgd_options o = {.lr = 0.5f};
  tu_ok(clpar_sgd_create(masters, n, &o, &opt));
  int64_t xs[] = {BATCH, IN};
  int32_t labels[BATCH];
  for (int i = 0; i < BATCH; i++) labels[i] = (i * 7 + 3) % OUT;
  for (int step = 0; step < STEPS; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x = tu_make(dev, 2, xs, 11), *y, *loss;
    tu_ok(clpar_autocast_begin(dtype));
    tu_ok(clpar_module_forward(m, x, &y));
    tu_ok(clpar_cross_entropy(y, labels, BATCH, CLPAR_REDUCTION_MEAN, &loss));
    clpar_autocast_end();
    tu_ok(clpar_master_weights_zero_grad(mw));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_master_weights_grads(mw));
    tu_ok(clpar_optimizer_step(opt));
    tu_ok(clpar_master_weights_update(mw));
    tu_ok(clpar_tensor_read(loss, &losses[step], 1));
    clpar_scope_end(sc);
  }
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    const char *name;
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, &name, &p));
    assert_int_equal(clpar_tensor_dtype(p), dtype); /* stored 16-bit */
    assert_int_equal(clpar_tensor_dtype(clpar_tensor_grad(p)), dtype);
    size_t k = (size_t)clpar_tensor_numel(p);
    float *pv = malloc(k * sizeof *pv);
    tu_ok(clpar_tensor_read_floats(p, pv, k));
    tu_ok(clpar_tensor_read(masters[i], params + at, cap - at));
    for (size_t j = 0; j < k; j++) { /* the parameter is its master rounded */
      float want = dtype == CLPAR_BFLOAT16
                       ? clpar_bf16_to_float(clpar_float_to_bf16(params[at + j]))
                       : clpar_fp16_to_float(clpar_float_to_fp16(params[at + j]));
      assert_true(pv[j] == want);
    }
    free(pv);
    at += k;
  }
  clpar_optimizer_free(opt);
  clpar_master_weights_free(mw);
  clpar_module_free(m);
}

/* 16-bit parameters (biases too) with float32 masters track float32 training within
 * test_mlp_tracks_fp32's tolerances, each parameter being its master rounded. */
static void test_master_weights(void **state) {
  (void)state;
  enum { CAP = 4096 };
  float *p32 = malloc(CAP * sizeof *p32), *pm = malloc(CAP * sizeof *pm);
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    if (d >= 0 && dev == tu_host()) continue;
    float l32[STEPS], lm[STEPS];
    train(dev, CLPAR_FLOAT32, l32, p32, CAP);
    for (int k = 0; k < 2; k++) {
      clpar_dtype dt = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      float tol = k ? 1e-4f : 1e-3f, wtol = k ? 2e-3f : 3e-2f;
      train_master(dev, dt, lm, pm, CAP);
      for (int i = 0; i < STEPS; i++)
        if (fabsf(lm[i] - l32[i]) > tol * fabsf(l32[i]))
          fail_msg("%s %s masters: step %d loss %g, float32 %g", clpar_device_id(dev),
                   clpar_dtype_name(dt), i, (double)lm[i], (double)l32[i]);
      size_t n = (size_t)(IN * HID + HID + HID * HID + HID + HID * OUT + OUT);
      float worst = 0.0f, scale = 0.0f;
      for (size_t i = 0; i < n; i++) {
        worst = fmaxf(worst, fabsf(pm[i] - p32[i]));
        scale = fmaxf(scale, fabsf(p32[i]));
      }
      printf("# %s %s masters: last loss %.6f (float32 %.6f), weights within %g\n",
             clpar_device_id(dev), clpar_dtype_name(dt), (double)lm[STEPS - 1],
             (double)l32[STEPS - 1], (double)worst);
      assert_true(worst <= wtol * scale);
    }
  }
  free(p32), free(pm);
}

/* Bytes in use on dev after the forward and the loss (what backward will read), minus those
 * before it. */
static uint64_t forward_bytes(clpar_device *dev, clpar_module *m, clpar_dtype dtype) {
  enum { B = 4096, W = 256 };
  int64_t xs[] = {B, 32};
  int32_t *labels = malloc(B * sizeof *labels);
  for (int i = 0; i < B; i++) labels[i] = i % OUT;
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 2, xs, 3), *y, *loss;
  clpar_memory_stats before, after;
  tu_ok(clpar_device_synchronize(dev));
  tu_ok(clpar_device_memory_stats(dev, &before));
  if (dtype != CLPAR_FLOAT32) tu_ok(clpar_autocast_begin(dtype));
  tu_ok(clpar_module_forward(m, x, &y));
  tu_ok(clpar_cross_entropy(y, labels, B, CLPAR_REDUCTION_MEAN, &loss));
  if (dtype != CLPAR_FLOAT32) clpar_autocast_end();
  tu_ok(clpar_device_synchronize(dev));
  tu_ok(clpar_device_memory_stats(dev, &after));
  tu_ok(clpar_backward(loss)); /* and the graph runs */
  clpar_scope_end(sc);
  free(labels);
  (void)W;
  return after.bytes_in_use - before.bytes_in_use;
}

/* A 3-hidden-layer MLP over a batch of 4096: what the forward leaves for backward is the
 * activations (3 x [4096, 256]) plus small change (the logits, the loss's own, 16-bit weight
 * copies under autocast); under bfloat16 autocast it is at most 0.6 of float32's. */
static void test_activation_memory_halved(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *m = make_mlp(dev, 256, 32, 3);
  uint64_t f32 = forward_bytes(dev, m, CLPAR_FLOAT32);
  uint64_t bf16 = forward_bytes(dev, m, CLPAR_BFLOAT16);
  printf("# %s: bytes kept by the forward: float32 %llu, bfloat16 autocast %llu (%.3f)\n",
         clpar_device_id(dev), (unsigned long long)f32, (unsigned long long)bf16,
         (double)bf16 / (double)f32);
  assert_true(f32 >= 3ull * 4096 * 256 * 4);
  assert_true((double)bf16 <= 0.6 * (double)f32);
  clpar_module_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_regions),        cmocka_unit_test(test_half_inputs_refused),
      cmocka_unit_test(test_matmul),         cmocka_unit_test(test_mlp_tracks_fp32),
      cmocka_unit_test(test_master_weights), cmocka_unit_test(test_activation_memory_halved),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
