/* test_host_dnnl_norm.c — the host backend's batch norm and adaptive average pooling through
 * oneDNN (backends/host/host_dnnl_norm.c, host_dnnl_pool.c) against its plain loops
 * (host_conv.c) on the same inputs, the plain entries put in the device's table in place of
 * oneDNN's: training and eval batch norm (y, the running statistics over several steps, and
 * the gradients of x, weight and bias) with and without weight and bias, on ResNet-50's
 * batch-norm shapes, odd channel counts, batch 1, 1-D and 3-D inputs; bn_backward with sums
 * that are not x's and g's (the contract's dx uses the sums given); the same bits on a second
 * run (every case through oneDNN, whatever its size, then with the default split, which gives
 * oneDNN only short rows); adaptive average pooling on sizes oneDNN takes (ResNet's global pool)
 * and sizes left to the plain loops; and CLPAR_HOST_DNNL=0, which puts the plain loops back. The
 * gradients against finite differences are test_conv's (its batch-norm cases run on the host's
 * default, oneDNN). Built only with oneDNN (CLPAR_HAVE_DNNL). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/host_conv.h"
#include "internal.h"
#include "test_util.h"

/* The device's table with the plain loops for the entries oneDNN took over. */
static void use_plain(clpar_device *dev, clpar_backend_iface *plain,
                      const clpar_backend_iface **keep) {
  tu_ok(clpar_device_synchronize(dev));
  *keep = dev->bd.iface;
  *plain = **keep;
  plain->bn_stats = clpar_host_bn_stats;
  plain->bn_apply = clpar_host_bn_apply;
  plain->bn_backward_sums = clpar_host_bn_backward_sums;
  plain->bn_backward = clpar_host_bn_backward;
  plain->avgpool = clpar_host_avgpool;
  plain->avgpool_backward = clpar_host_avgpool_backward;
  dev->bd.iface = plain;
}

static void restore(clpar_device *dev, const clpar_backend_iface *keep) {
  tu_ok(clpar_device_synchronize(dev));
  dev->bd.iface = keep;
}

typedef struct {
  const char *name;
  int ndim;
  int64_t shape[4];
  int affine, training, steps;
} bn_case;

enum { Y, DX, DW, DB, RM, RV, N_PARTS };
static const char *part[N_PARTS] = {"y", "dx", "dweight", "dbias", "running_mean", "running_var"};

typedef struct {
  float *v[N_PARTS];
  size_t n[N_PARTS];
} bn_result;

static void keep_part(bn_result *r, int k, const clpar_tensor *t) {
  free(r->v[k]);
  r->v[k] = tu_read(t);
  r->n[k] = (size_t)clpar_tensor_numel(t);
}

/* c->steps calls of batch norm on fresh inputs (the running statistics carried over), each
 * followed by backward of sum(y r); keeps the last call's y and gradients. */
static void bn_run(clpar_device *dev, const bn_case *c, bn_result *out) {
  memset(out, 0, sizeof *out);
  clpar_scope *sc = clpar_scope_begin();
  int64_t C = c->shape[1];
  float *m0 = tu_rand((size_t)C, 5), *v0 = tu_rand((size_t)C, 6);
  for (int64_t i = 0; i < C; i++) v0[i] += 1.5f; /* variances > 0 */
  clpar_tensor *rm, *rv, *w = NULL, *b = NULL;
  tu_ok(clpar_tensor_from_host(dev, 1, &C, m0, &rm));
  tu_ok(clpar_tensor_from_host(dev, 1, &C, v0, &rv));
  if (c->affine) {
    w = tu_make(dev, 1, &C, 7), b = tu_make(dev, 1, &C, 8);
    tu_ok(clpar_tensor_set_requires_grad(w, 1));
    tu_ok(clpar_tensor_set_requires_grad(b, 1));
  }
  for (int s = 0; s < c->steps; s++) {
    clpar_tensor *x = tu_make(dev, c->ndim, c->shape, 100 + (uint64_t)s), *y, *r, *prod, *loss;
    tu_ok(clpar_tensor_set_requires_grad(x, 1));
    tu_ok(clpar_batch_norm(x, rm, rv, w, b, c->training, 0.1f, 1e-5f, &y));
    r = tu_make(dev, c->ndim, c->shape, 200 + (uint64_t)s);
    tu_ok(clpar_mul(y, r, &prod));
    tu_ok(clpar_sum(prod, &loss));
    if (w) {
      tu_ok(clpar_tensor_zero_grad(w));
      tu_ok(clpar_tensor_zero_grad(b));
    }
    tu_ok(clpar_backward(loss));
    keep_part(out, Y, y);
    keep_part(out, DX, clpar_tensor_grad(x));
  }
  if (w) keep_part(out, DW, clpar_tensor_grad(w)), keep_part(out, DB, clpar_tensor_grad(b));
  keep_part(out, RM, rm);
  keep_part(out, RV, rv);
  free(m0), free(v0);
  clpar_scope_end(sc);
}

static void result_free(bn_result *r) {
  for (int k = 0; k < N_PARTS; k++) free(r->v[k]);
}

static const bn_case bn_cases[] = {
    {"resnet50 bn1 [16, 64, 32, 32]", 4, {16, 64, 32, 32}, 1, 1, 1},
    {"resnet50 layer1 [2, 256, 16, 16]", 4, {2, 256, 16, 16}, 1, 1, 2},
    {"resnet50 layer2 [2, 128, 8, 8]", 4, {2, 128, 8, 8}, 1, 1, 1},
    {"resnet50 layer3 [2, 1024, 4, 4]", 4, {2, 1024, 4, 4}, 1, 1, 1},
    {"resnet50 layer4 [16, 2048, 2, 2]", 4, {16, 2048, 2, 2}, 1, 1, 1},
    {"resnet50 layer4 eval [2, 512, 2, 2]", 4, {2, 512, 2, 2}, 1, 0, 1},
    {"batch 1 [1, 64, 16, 16]", 4, {1, 64, 16, 16}, 1, 1, 3},
    {"odd [3, 5, 7, 9]", 4, {3, 5, 7, 9}, 1, 1, 3},
    {"odd, no weight or bias [3, 21, 5, 3]", 4, {3, 21, 5, 3}, 0, 1, 2},
    {"eval odd [3, 5, 7, 9]", 4, {3, 5, 7, 9}, 1, 0, 2},
    {"eval, no weight or bias [2, 17, 3, 3]", 4, {2, 17, 3, 3}, 0, 0, 1},
    {"one value per image [2, 3, 1, 1]", 4, {2, 3, 1, 1}, 1, 1, 2},
    {"1-D [8, 20]", 2, {8, 20}, 1, 1, 2},
    {"3-D [4, 6, 10]", 3, {4, 6, 10}, 1, 1, 1},
};
#define N_BN (sizeof bn_cases / sizeof bn_cases[0])

static void bn_compare(clpar_device *dev, const bn_case *c) {
  bn_result got, again, want;
  const clpar_backend_iface *keep;
  clpar_backend_iface plain;
  /* The sums over a channel's values are float sums in oneDNN's order, which depends on the
   * machine's threads and vector width: their rounding grows with the count (8.3e-5 seen for
   * dbias over 16384 values on 16 cores), so the absolute tolerance does too. */
  int64_t per_channel = 1;
  for (int i = 0; i < c->ndim; i++)
    if (i != 1) per_channel *= c->shape[i];
  bn_run(dev, c, &got);
  bn_run(dev, c, &again);
  use_plain(dev, &plain, &keep);
  bn_run(dev, c, &want);
  restore(dev, keep);
  for (int k = 0; k < N_PARTS; k++) {
    assert_true(!got.v[k] == !want.v[k]);
    if (!want.v[k]) continue;
    char what[200];
    snprintf(what, sizeof what, "%s (%s, %d steps): %s", c->name, c->training ? "training" : "eval",
             c->steps, part[k]);
    assert_int_equal(got.n[k], want.n[k]);
    tu_assert_close(got.v[k], want.v[k], want.n[k], 1e-4f, 1e-5f + 2e-8f * (float)per_channel,
                    what);
    if (memcmp(got.v[k], again.v[k], got.n[k] * sizeof(float)) != 0)
      fail_msg("%s differs between two runs on the same inputs", what);
  }
  result_free(&got), result_free(&again), result_free(&want);
}

/* The largest spatial size the host's batch norm hands to oneDNN (host_dnnl_norm.c). */
extern size_t clpar_host_dnnl_bn_max_p;

/* Every case through oneDNN, then with the default split between oneDNN and the loops. */
static void test_batch_norm(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  assert_ptr_not_equal(dev->bd.iface->bn_stats, clpar_host_bn_stats); /* oneDNN's by default */
  size_t keep = clpar_host_dnnl_bn_max_p;
  clpar_host_dnnl_bn_max_p = SIZE_MAX;
  for (size_t i = 0; i < N_BN; i++) bn_compare(dev, &bn_cases[i]);
  clpar_host_dnnl_bn_max_p = keep;
  for (size_t i = 0; i < N_BN; i++) bn_compare(dev, &bn_cases[i]);
}

/* bn_backward's dx with sums the caller gives, here not x's and g's: the contract's formula
 * with those sums, as the plain loop computes it. */
static void bn_backward_given_sums(clpar_device *dev, int training, float *dx) {
  size_t n = 3, c = 20, p = 12;
  int64_t xs = (int64_t)(n * c * p), cs = (int64_t)c;
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 1, &xs, 1), *g = tu_make(dev, 1, &xs, 2),
               *m = tu_make(dev, 1, &cs, 3);
  clpar_tensor *w = tu_make(dev, 1, &cs, 5), *sg = tu_make(dev, 1, &cs, 6), *v;
  clpar_tensor *sgx = tu_make(dev, 1, &cs, 7), *d = tu_make(dev, 1, &xs, 8);
  float *vv = tu_rand(c, 4);
  for (size_t i = 0; i < c; i++) vv[i] += 1.5f; /* variances > 0 */
  tu_ok(clpar_tensor_from_host(dev, 1, &cs, vv, &v));
  free(vv);
  tu_ok(clpar_dev_bn_backward(dev, n, c, p, clpar_tensor_bref(x), clpar_tensor_bref(g),
                              clpar_tensor_bref(m), clpar_tensor_bref(v), clpar_tensor_bref(w),
                              1e-5f, clpar_tensor_bref(sg), clpar_tensor_bref(sgx), training,
                              clpar_tensor_bref(d)));
  float *r = tu_read(d);
  memcpy(dx, r, (size_t)xs * sizeof *dx);
  free(r);
  clpar_scope_end(sc);
}

static void test_bn_backward_given_sums(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  assert_true(clpar_host_dnnl_bn_max_p >= 12); /* p = 12 below: through oneDNN */
  const clpar_backend_iface *keep;
  clpar_backend_iface plain;
  for (int training = 0; training < 2; training++) {
    float got[720], want[720];
    bn_backward_given_sums(dev, training, got);
    use_plain(dev, &plain, &keep);
    bn_backward_given_sums(dev, training, want);
    restore(dev, keep);
    tu_assert_close(got, want, 720, 1e-4f, 1e-5f,
                    training ? "bn_backward (training) with other sums" : "bn_backward (eval)");
  }
}

typedef struct {
  const char *name;
  int64_t shape[4], oh, ow;
} pool_case;

static const pool_case pool_cases[] = {
    {"resnet50 global pool [16, 2048, 2, 2] -> 1x1", {16, 2048, 2, 2}, 1, 1},
    {"global pool at 224 px [2, 2048, 7, 7] -> 1x1", {2, 2048, 7, 7}, 1, 1},
    {"batch 1 [1, 3, 8, 6] -> 4x3", {1, 3, 8, 6}, 4, 3},
    {"odd [3, 5, 9, 15] -> 3x5", {3, 5, 9, 15}, 3, 5},
    {"same size [2, 4, 5, 7] -> 5x7", {2, 4, 5, 7}, 5, 7},
    {"uneven bins (plain loops) [2, 3, 7, 5] -> 3x2", {2, 3, 7, 5}, 3, 2},
    {"more bins than rows (plain loops) [1, 2, 3, 3] -> 5x4", {1, 2, 3, 3}, 5, 4},
};
#define N_POOL (sizeof pool_cases / sizeof pool_cases[0])

/* y and dx of sum(adaptive_avg_pool2d(x) r). */
static void pool_run(clpar_device *dev, const pool_case *c, float **y, float **dx) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 4, c->shape, 11), *out, *r, *prod, *loss;
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_adaptive_avg_pool2d(x, c->oh, c->ow, &out));
  int64_t rs[4] = {c->shape[0], c->shape[1], c->oh, c->ow};
  r = tu_make(dev, 4, rs, 12);
  tu_ok(clpar_mul(out, r, &prod));
  tu_ok(clpar_sum(prod, &loss));
  tu_ok(clpar_backward(loss));
  *y = tu_read(out);
  *dx = tu_read(clpar_tensor_grad(x));
  clpar_scope_end(sc);
}

static void test_avg_pool(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  assert_ptr_not_equal(dev->bd.iface->avgpool, clpar_host_avgpool);
  for (size_t i = 0; i < N_POOL; i++) {
    const pool_case *c = &pool_cases[i];
    float *y, *dx, *y2, *dx2, *wy, *wdx;
    const clpar_backend_iface *keep;
    clpar_backend_iface plain;
    pool_run(dev, c, &y, &dx);
    pool_run(dev, c, &y2, &dx2);
    use_plain(dev, &plain, &keep);
    pool_run(dev, c, &wy, &wdx);
    restore(dev, keep);
    size_t ny = (size_t)(c->shape[0] * c->shape[1] * c->oh * c->ow);
    size_t nx = (size_t)(c->shape[0] * c->shape[1] * c->shape[2] * c->shape[3]);
    char what[160];
    snprintf(what, sizeof what, "%s: y", c->name);
    tu_assert_close(y, wy, ny, 1e-5f, 1e-6f, what);
    assert_memory_equal(y, y2, ny * sizeof *y);
    snprintf(what, sizeof what, "%s: dx", c->name);
    tu_assert_close(dx, wdx, nx, 1e-5f, 1e-6f, what);
    assert_memory_equal(dx, dx2, nx * sizeof *dx);
    free(y), free(dx), free(y2), free(dx2), free(wy), free(wdx);
  }
}

/* CLPAR_HOST_DNNL=0 puts the plain batch norm and pooling back with the plain convolutions. */
static void test_env(void **state) {
  (void)state;
  clpar_shutdown();
  setenv("CLPAR_HOST_DNNL", "0", 1);
  tu_ok(clpar_init());
  const clpar_backend_iface *in = tu_host()->bd.iface;
  assert_ptr_equal(in->bn_stats, clpar_host_bn_stats);
  assert_ptr_equal(in->bn_apply, clpar_host_bn_apply);
  assert_ptr_equal(in->bn_backward_sums, clpar_host_bn_backward_sums);
  assert_ptr_equal(in->bn_backward, clpar_host_bn_backward);
  assert_ptr_equal(in->avgpool, clpar_host_avgpool);
  assert_ptr_equal(in->avgpool_backward, clpar_host_avgpool_backward);
  clpar_shutdown();
  unsetenv("CLPAR_HOST_DNNL");
  tu_ok(clpar_init());
  in = tu_host()->bd.iface;
  assert_ptr_not_equal(in->bn_stats, clpar_host_bn_stats);
  assert_ptr_not_equal(in->bn_backward, clpar_host_bn_backward);
  assert_ptr_not_equal(in->avgpool_backward, clpar_host_avgpool_backward);
}

int main(void) {
  unsetenv("CLPAR_HOST_DNNL"); /* the default is oneDNN, whatever the caller's environment */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_norm),
      cmocka_unit_test(test_bn_backward_given_sums),
      cmocka_unit_test(test_avg_pool),
      cmocka_unit_test(test_env),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
