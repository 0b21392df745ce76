/* test_linear_backward.c — a Linear's backward as one entry (backend.h's linear_act_backward:
 * one kernel on OpenCL CPU devices' small shapes, one posted entry on the host, composed from
 * bias_act_backward and two GEMMs elsewhere; src/nn/functional.c's linear_backward).
 *
 * - The entry on every selected device, the backend's and composed (clpar_compose_force),
 *   for each activation, with every output and accumulating, without dx and db, on shapes that
 *   take the one-kernel path (n and k multiples of 8, odd batch, batch 1) and shapes that do
 *   not (n 3, k 13, 300 rows, a product past the small-GEMM bound): the backend's equals the
 * composition bit for bit (the same sums in the same order), and both are within 1e-4 of a float64
 *   reference computed here; the backend's entry is taken (no composed call) unless forced;
 *   a bad activation or a missing scratch is refused, naming the entry.
 * - clpar_linear_act's gradients, 3 x 8 x 8 (the one-kernel path on OpenCL CPU devices), against
 *   central finite differences of the float64 forward.
 * - Training: an MLP (Linear + ReLU twice, then Linear) with SGD and momentum, five steps,
 *   gives the same parameters bit for bit with the entry and with its composition. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_act_ref.h"
#include "test_util.h"

#define BIT(entry) ((uint64_t)1 << CLPAR_ENTRY_##entry)

/* ---- the entry ---- */

typedef struct {
  int64_t m, n, k;
  float *g, *y, *x, *w, *dx0, *dw0, *db0; /* inputs, and the outputs' first contents */
} problem;

static void problem_make(problem *p, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  p->m = m, p->n = n, p->k = k;
  p->g = tu_rand((size_t)(m * n), seed), p->y = tu_rand((size_t)(m * n), seed + 1);
  p->x = tu_rand((size_t)(m * k), seed + 2), p->w = tu_rand((size_t)(n * k), seed + 3);
  p->dx0 = tu_rand((size_t)(m * k), seed + 4), p->dw0 = tu_rand((size_t)(n * k), seed + 5);
  p->db0 = tu_rand((size_t)n, seed + 6);
}

static void problem_free(problem *p) {
  free(p->g), free(p->y), free(p->x), free(p->w), free(p->dx0), free(p->dw0), free(p->db0);
}

/* The float64 reference of the three outputs (each adding to its first contents if acc's bit
 * is set), from the float inputs. */
static void reference(const problem *p, clpar_act_kind act, int acc, float *dx, float *dw,
                      float *db) {
  int64_t m = p->m, n = p->n, k = p->k;
  double *d = malloc((size_t)(m * n) * sizeof *d);
  assert_non_null(d);
  for (int64_t i = 0; i < m * n; i++) d[i] = p->g[i] * tu_act_grad(act, p->y[i]);
  for (int64_t r = 0; r < m; r++)
    for (int64_t j = 0; j < k; j++) {
      double s = acc & CLPAR_ACC_DX ? p->dx0[r * k + j] : 0;
      for (int64_t c = 0; c < n; c++) s += d[r * n + c] * p->w[c * k + j];
      dx[r * k + j] = (float)s;
    }
  for (int64_t c = 0; c < n; c++) {
    double sb = acc & CLPAR_ACC_DB ? p->db0[c] : 0;
    for (int64_t r = 0; r < m; r++) sb += d[r * n + c];
    db[c] = (float)sb;
    for (int64_t j = 0; j < k; j++) {
      double s = acc & CLPAR_ACC_DW ? p->dw0[c * k + j] : 0;
      for (int64_t r = 0; r < m; r++) s += d[r * n + c] * p->x[r * k + j];
      dw[c * k + j] = (float)s;
    }
  }
  free(d);
}

static clpar_tensor *upload(clpar_device *dev, int64_t rows, int64_t cols, const float *v) {
  int64_t shape[2] = {rows, cols};
  clpar_tensor *t;
  tu_ok(clpar_tensor_from_host(dev, 2, shape, v, &t));
  return t;
}

/* The entry on dev; the outputs wanted (want: CLPAR_ACC_ bits) read into out[0..2]. */
static void run_entry(clpar_device *dev, const problem *p, clpar_act_kind act, int want, int acc,
                      float *out[3]) {
  int64_t m = p->m, n = p->n, k = p->k;
  clpar_tensor *g = upload(dev, m, n, p->g), *y = upload(dev, m, n, p->y);
  clpar_tensor *x = upload(dev, m, k, p->x), *w = upload(dev, n, k, p->w);
  clpar_tensor *t[3] = {upload(dev, m, k, p->dx0), upload(dev, n, k, p->dw0),
                        upload(dev, 1, n, p->db0)};
  clpar_tensor *scratch = upload(dev, m, n, p->g); /* contents never read */
  clpar_bref none = {NULL, 0}, o[3];
  for (int i = 0; i < 3; i++) o[i] = want & (1 << i) ? clpar_tensor_bref(t[i]) : none;
  int on = act != CLPAR_ACT_NONE;
  tu_ok(clpar_dev_linear_act_backward(
      dev, act, (size_t)m, (size_t)n, (size_t)k, clpar_tensor_bref(g),
      on ? clpar_tensor_bref(y) : none, clpar_tensor_bref(x), clpar_tensor_bref(w),
      on ? clpar_tensor_bref(scratch) : none, o[0], o[1], o[2], acc));
  for (int i = 0; i < 3; i++) out[i] = want & (1 << i) ? tu_read(t[i]) : NULL;
  clpar_tensor *all[] = {g, y, x, w, t[0], t[1], t[2], scratch};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) clpar_tensor_free(all[i]);
}

static void check_shape(clpar_device *dev, int64_t m, int64_t n, int64_t k) {
  static const int cases[][2] = {{7, 0}, {7, 7}, {CLPAR_ACC_DW, CLPAR_ACC_DW}}; /* want, acc */
  static const char *names[] = {"dx", "dw", "db"};
  problem p;
  problem_make(&p, m, n, k, (uint64_t)(m * 1000 + n * 10 + k));
  size_t sizes[3] = {(size_t)(m * k), (size_t)(n * k), (size_t)n};
  float *want[3];
  for (int i = 0; i < 3; i++) want[i] = malloc(sizes[i] * sizeof(float));
  for (int act = CLPAR_ACT_NONE; act <= CLPAR_ACT_TANH; act++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      int outs = cases[c][0], acc = cases[c][1];
      float *fused[3], *composed[3];
      uint64_t before = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
      run_entry(dev, &p, (clpar_act_kind)act, outs, acc, fused);
      assert_int_equal(__atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED), before);
      tu_ok(clpar_compose_force(dev, BIT(linear_act_backward)));
      run_entry(dev, &p, (clpar_act_kind)act, outs, acc, composed);
      tu_ok(clpar_compose_force(dev, 0));
      assert_true(__atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED) > before);
      reference(&p, (clpar_act_kind)act, acc, want[0], want[1], want[2]);
      for (int i = 0; i < 3; i++) {
        if (!(outs & (1 << i))) continue;
        char what[160];
        snprintf(what, sizeof what, "linear_act_backward %s %s [%lld x %lld x %lld] acc %d on %s",
                 tu_act_name((clpar_act_kind)act), names[i], (long long)m, (long long)n,
                 (long long)k, acc, clpar_device_id(dev));
        tu_assert_close(fused[i], want[i], sizes[i], 1e-4f, 1e-4f, what);
        if (memcmp(fused[i], composed[i], sizes[i] * sizeof(float)) != 0) {
          tu_assert_close(fused[i], composed[i], sizes[i], 0.0f, 0.0f, what);
          fail_msg("%s: the entry and its composition differ in bits", what);
        }
        free(fused[i]), free(composed[i]);
      }
    }
  for (int i = 0; i < 3; i++) free(want[i]);
  problem_free(&p);
}

static void test_entry_matches_composition(void **state) {
  (void)state;
  /* one kernel on OpenCL CPU devices (n and k multiples of 8): 32x64x64 (the latency-bound
   * MLP's), odd batch, batch 1, several 8 x 8 blocks; the unfused path: n or k not a multiple
   * of 8, 300 rows (two-pass bias sum), 2^21 products */
  static const int64_t shapes[][3] = {{32, 64, 64}, {3, 8, 16},   {1, 8, 8},
                                      {5, 24, 40},  {5, 3, 16},   {7, 9, 13},
                                      {1, 1, 8},    {300, 16, 8}, {64, 128, 256}};
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    if (d >= 0 && dev == tu_host()) continue;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      check_shape(dev, shapes[s][0], shapes[s][1], shapes[s][2]);
  }
}

/* An activation out of range, or no scratch for one that needs it, is refused by the
 * backend's entry and by the composition alike, naming the entry. */
static void test_entry_refuses_bad_arguments(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    int64_t shape[2] = {2, 8};
    clpar_tensor *t = tu_make(dev, 2, shape, 1), *o;
    tu_ok(clpar_tensor_empty(dev, 2, shape, &o));
    clpar_bref b = clpar_tensor_bref(t), out = clpar_tensor_bref(o), none = {NULL, 0};
    for (int composed = 0; composed < 2; composed++) {
      tu_ok(clpar_compose_force(dev, composed ? BIT(linear_act_backward) : 0));
      clpar_status s = clpar_dev_linear_act_backward_sync(dev, (clpar_act_kind)7, 2, 2, 8, b, b, b,
                                                          b, b, none, out, none, 0);
      assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
      assert_non_null(strstr(clpar_last_error(), "linear_act_backward"));
      s = clpar_dev_linear_act_backward_sync(dev, CLPAR_ACT_RELU, 2, 2, 8, b, b, b, b, none, none,
                                             out, none, 0);
      assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
      assert_non_null(strstr(clpar_last_error(), "scratch"));
    }
    tu_ok(clpar_compose_force(dev, 0));
    clpar_tensor_free(t), clpar_tensor_free(o);
  }
}

/* ---- gradients against finite differences ---- */

static void test_gradients_finite_differences(void **state) {
  (void)state;
  tu_act_check_gradients((tu_linear_dims){3, 8, 8}, 61, 0);
}

/* ---- training ---- */

enum { BATCH = 8, FEAT = 16, HID = 32, CLASSES = 8, STEPS = 5 };

/* STEPS SGD steps of Sequential(Linear, ReLU, Linear, ReLU, Linear) on dev, made from seed;
 * every parameter after them, concatenated, into out (malloc'ed), and their count. */
static float *train(clpar_device *dev, size_t *count) {
  clpar_module *l[5], *seq;
  clpar_manual_seed(7);
  tu_ok(clpar_linear_create(FEAT, HID, 1, dev, &l[0]));
  tu_ok(clpar_relu_create(&l[1]));
  tu_ok(clpar_linear_create(HID, HID, 1, dev, &l[2]));
  tu_ok(clpar_relu_create(&l[3]));
  tu_ok(clpar_linear_create(HID, CLASSES, 1, dev, &l[4]));
  tu_ok(clpar_sequential_create(l, 5, &seq));
  clpar_optimizer *opt;
  clpar_sgd_options sgd = {.lr = 0.1f, .momentum = 0.9f};
  tu_ok(clpar_sgd_create_for(seq, &sgd, &opt));
  int64_t xs[2] = {BATCH, FEAT};
  int32_t labels[BATCH];
  for (int i = 0; i < BATCH; i++) labels[i] = (i * 3) % CLASSES;
  for (int s = 0; s < STEPS; s++) {
    clpar_tensor *x = tu_make(dev, 2, xs, (uint64_t)(100 + s)), *y, *loss;
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(seq, x, &y));
    tu_ok(clpar_cross_entropy(y, labels, BATCH, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_tensor_free(loss), clpar_tensor_free(y), clpar_tensor_free(x);
  }
  int np = clpar_module_parameter_count(seq);
  size_t total = 0;
  float *all = NULL;
  for (int i = 0; i < np; i++) {
    const char *name;
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(seq, i, &name, &p));
    size_t n = (size_t)clpar_tensor_numel(p);
    all = realloc(all, (total + n) * sizeof *all);
    assert_non_null(all);
    float *v = tu_read(p);
    memcpy(all + total, v, n * sizeof *v);
    free(v);
    total += n;
  }
  clpar_optimizer_free(opt);
  clpar_module_free(seq);
  *count = total;
  return all;
}

static void test_training_equals_composition(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    size_t n_fused, n_composed;
    uint64_t c0 = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
    float *fused = train(dev, &n_fused);
    uint64_t c1 = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
    tu_ok(clpar_compose_force(dev, BIT(linear_act_backward)));
    float *composed = train(dev, &n_composed);
    tu_ok(clpar_compose_force(dev, 0));
    uint64_t c2 = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
    /* The backward took the entry: forced, each Linear's backward in each step was composed
     * instead, one composed call each. Entries a backend lacks are composed in
     * both runs alike. */
    assert_int_equal((c2 - c1) - (c1 - c0), 3 * STEPS);
    assert_int_equal(n_fused, n_composed);
    char what[96];
    snprintf(what, sizeof what, "parameters after %d steps on %s", STEPS, clpar_device_id(dev));
    tu_assert_close(fused, composed, n_fused, 0.0f, 0.0f, what);
    assert_memory_equal(fused, composed, n_fused * sizeof(float));
    free(fused), free(composed);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entry_matches_composition),
      cmocka_unit_test(test_entry_refuses_bad_arguments),
      cmocka_unit_test(test_gradients_finite_differences),
      cmocka_unit_test(test_training_equals_composition),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
