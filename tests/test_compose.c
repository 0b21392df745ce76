/* test_compose.c — the fused entries composed from primitives (src/runtime/compose.c) and the
 * waits inside backends counted by the dispatch.
 *
 * On every selected device, each composable entry (softmax_backward, sgd_step, adam_step)
 * runs three ways: the backend's own fused entry, the composition (forced with the test-only
 * clpar_compose_force), and the host backend's fused entry as the reference. The optimizers
 * take several steps through clpar_optimizer_step, SGD in every option combination; softmax
 * backward runs inside whole backward passes. Each composed run also checks, by the device's
 * count of composed calls, that the composition really ran. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define BIT(entry) ((uint64_t)1 << CLPAR_ENTRY_##entry)

enum { NPARAM = 2, STEPS = 4 };
static const int64_t shape0[] = {5, 7}, shape1[] = {33};

/* Which way an entry runs. */
typedef enum { FUSED, COMPOSED } way;

static void set_way(clpar_device *dev, way w, uint64_t bits) {
  tu_ok(clpar_compose_force(dev, w == COMPOSED ? bits : 0));
}

static uint64_t composed_calls(const clpar_device *dev) {
  return __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
}

/* Parameters of two shapes from fixed seeds, trained STEPS steps on the loss
 * sum(p * p * x_k) (gradient 2 p x_k, a new x_k each step) by the optimizer make() makes;
 * returns the parameters' final values, concatenated (malloc'ed). */
typedef clpar_status (*make_fn)(clpar_tensor *const *params, const void *options,
                                clpar_optimizer **out);

static float *train(clpar_device *dev, make_fn make, const void *options) {
  const int64_t *shapes[NPARAM] = {shape0, shape1};
  const int ndims[NPARAM] = {2, 1};
  clpar_tensor *p[NPARAM];
  size_t total = 0;
  for (int i = 0; i < NPARAM; i++) {
    p[i] = tu_make(dev, ndims[i], shapes[i], 11 + (uint64_t)i);
    tu_ok(clpar_tensor_set_requires_grad(p[i], 1));
    total += (size_t)clpar_tensor_numel(p[i]);
  }
  clpar_optimizer *opt;
  tu_ok(make(p, options, &opt));
  for (int k = 0; k < STEPS; k++) {
    clpar_tensor *loss = NULL;
    for (int i = 0; i < NPARAM; i++) {
      clpar_tensor *x = tu_make(dev, ndims[i], shapes[i], 100 + (uint64_t)(10 * k + i));
      clpar_tensor *pp, *ppx, *s, *sum;
      tu_ok(clpar_mul(p[i], p[i], &pp));
      tu_ok(clpar_mul(pp, x, &ppx));
      tu_ok(clpar_sum(ppx, &s));
      if (loss) {
        tu_ok(clpar_add(loss, s, &sum));
        clpar_tensor_free(loss);
        clpar_tensor_free(s);
        loss = sum;
      } else {
        loss = s;
      }
      clpar_tensor_free(x);
      clpar_tensor_free(pp);
      clpar_tensor_free(ppx);
    }
    tu_ok(clpar_backward(loss));
    clpar_tensor_free(loss);
    tu_ok(clpar_optimizer_step(opt));
    tu_ok(clpar_optimizer_zero_grad(opt));
  }
  float *out = malloc(total * sizeof *out);
  assert_non_null(out);
  size_t at = 0;
  for (int i = 0; i < NPARAM; i++) {
    size_t n = (size_t)clpar_tensor_numel(p[i]);
    tu_ok(clpar_tensor_read(p[i], out + at, n));
    at += n;
    clpar_tensor_free(p[i]);
  }
  clpar_optimizer_free(opt);
  return out;
}

static size_t total_numel(void) {
  return (size_t)(shape0[0] * shape0[1] + shape1[0]);
}

/* The reference on the host (fused), then dev fused and dev composed, compared. */
static void compare_three(make_fn make, const void *options, uint64_t bit, const char *what) {
  clpar_device *host = tu_host();
  set_way(host, FUSED, 0);
  float *ref = train(host, make, options);
  size_t n = total_numel();
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    char label[160];
    set_way(dev, FUSED, bit);
    uint64_t before = composed_calls(dev);
    float *fused = train(dev, make, options);
    assert_true(composed_calls(dev) == before); /* the backend's own entry ran */
    set_way(dev, COMPOSED, bit);
    before = composed_calls(dev);
    float *composed = train(dev, make, options);
    set_way(dev, FUSED, bit);
    /* one composed call per parameter and step */
    assert_int_equal(composed_calls(dev) - before, (uint64_t)(NPARAM * STEPS));
    snprintf(label, sizeof label, "%s on %s: composed vs the backend's fused entry", what,
             clpar_device_id(dev));
    tu_assert_close(composed, fused, n, 1e-5f, 1e-6f, label);
    snprintf(label, sizeof label, "%s on %s: composed vs the host reference", what,
             clpar_device_id(dev));
    tu_assert_close(composed, ref, n, 1e-4f, 1e-5f, label);
    snprintf(label, sizeof label, "%s on %s: fused vs the host reference", what,
             clpar_device_id(dev));
    tu_assert_close(fused, ref, n, 1e-4f, 1e-5f, label);
    free(fused);
    free(composed);
  }
  free(ref);
}

static clpar_status make_sgd(clpar_tensor *const *params, const void *o, clpar_optimizer **out) {
  return clpar_sgd_create(params, NPARAM, o, out);
}

static clpar_status make_adam(clpar_tensor *const *params, const void *o, clpar_optimizer **out) {
  return clpar_adam_create(params, NPARAM, o, out);
}

static clpar_status make_adamw(clpar_tensor *const *params, const void *o, clpar_optimizer **out) {
  return clpar_adamw_create(params, NPARAM, o, out);
}

/* Every combination PyTorch allows: momentum 0 or not, dampening 0 or not, nesterov (with
 * momentum and no dampening), weight decay 0 or not. */
static void test_sgd_composed(void **state) {
  (void)state;
  const float moms[] = {0.0f, 0.9f}, damps[] = {0.0f, 0.3f}, wds[] = {0.0f, 0.05f};
  int cases = 0;
  for (int m = 0; m < 2; m++)
    for (int dp = 0; dp < 2; dp++)
      for (int ne = 0; ne < 2; ne++)
        for (int w = 0; w < 2; w++) {
          if (ne && (moms[m] == 0.0f || damps[dp] != 0.0f)) continue;
          if (moms[m] == 0.0f && dp) continue; /* dampening means nothing without momentum */
          clpar_sgd_options o = {0.05f, moms[m], damps[dp], wds[w], ne};
          char what[128];
          snprintf(what, sizeof what, "SGD momentum %g dampening %g nesterov %d weight decay %g",
                   (double)o.momentum, (double)o.dampening, o.nesterov, (double)o.weight_decay);
          compare_three(make_sgd, &o, BIT(sgd_step), what);
          cases++;
        }
  assert_int_equal(cases, 8);
}

static void test_adam_composed(void **state) {
  (void)state;
  /* PyTorch's defaults, with and without weight decay; then other betas and an eps large
   * enough to matter */
  const clpar_adam_options opts[] = {{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f},
                                     {0.01f, 0.9f, 0.999f, 1e-8f, 0.1f},
                                     {0.02f, 0.8f, 0.99f, 0.1f, 0.05f}};
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    const clpar_adam_options *o = &opts[i];
    char what[128];
    snprintf(what, sizeof what, "Adam betas %g %g eps %g weight decay %g", (double)o->beta1,
             (double)o->beta2, (double)o->eps, (double)o->weight_decay);
    compare_three(make_adam, o, BIT(adam_step), what);
    snprintf(what, sizeof what, "AdamW betas %g %g eps %g weight decay %g", (double)o->beta1,
             (double)o->beta2, (double)o->eps, (double)o->weight_decay);
    compare_three(make_adamw, o, BIT(adam_step), what);
  }
}

/* ---- softmax backward inside whole backward passes ---- */

/* x [rows, cols] -> Linear (weight [cols, cols]) -> softmax or log-softmax -> sum(y * w), or
 * -> cross-entropy (which runs log-softmax); returns x's and the weight's gradients,
 * concatenated. */
static float *softmax_grads(clpar_device *dev, int kind, int64_t rows, int64_t cols) {
  int64_t xs[] = {rows, cols}, ws[] = {cols, cols};
  clpar_tensor *x = tu_make(dev, 2, xs, 21), *wt = tu_make(dev, 2, ws, 22);
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_tensor_set_requires_grad(wt, 1));
  clpar_tensor *h, *y = NULL, *loss;
  tu_ok(clpar_linear(x, wt, NULL, &h));
  if (kind == 2) {
    int32_t *labels = malloc((size_t)rows * sizeof *labels);
    assert_non_null(labels);
    for (int64_t r = 0; r < rows; r++) labels[r] = (int32_t)((r * 7 + 3) % cols);
    tu_ok(clpar_cross_entropy(h, labels, rows, CLPAR_REDUCTION_MEAN, &loss));
    free(labels);
  } else {
    clpar_tensor *w = tu_make(dev, 2, xs, 23), *yw;
    tu_ok(kind ? clpar_log_softmax(h, &y) : clpar_softmax(h, &y));
    tu_ok(clpar_mul(y, w, &yw));
    tu_ok(clpar_sum(yw, &loss));
    clpar_tensor_free(w);
    clpar_tensor_free(yw);
  }
  tu_ok(clpar_backward(loss));
  size_t nx = (size_t)(rows * cols), nw = (size_t)(cols * cols);
  float *out = malloc((nx + nw) * sizeof *out);
  assert_non_null(out);
  tu_ok(clpar_tensor_read(clpar_tensor_grad(x), out, nx));
  tu_ok(clpar_tensor_read(clpar_tensor_grad(wt), out + nx, nw));
  clpar_tensor_free(loss);
  clpar_tensor_free(y);
  clpar_tensor_free(h);
  clpar_tensor_free(x);
  clpar_tensor_free(wt);
  return out;
}

static void test_softmax_backward_composed(void **state) {
  (void)state;
  static const char *kinds[] = {"softmax", "log-softmax", "cross-entropy"};
  static const int64_t shapes[][2] = {{7, 13}, {1, 5}, {9, 1}, {40, 257}};
  clpar_device *host = tu_host();
  for (int kind = 0; kind < 3; kind++)
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
      int64_t rows = shapes[sh][0], cols = shapes[sh][1];
      size_t n = (size_t)(rows * cols + cols * cols);
      set_way(host, FUSED, 0);
      float *ref = softmax_grads(host, kind, rows, cols);
      for (int d = 0; d < clpar_device_count(); d++) {
        clpar_device *dev = clpar_device_get(d);
        char label[160];
        float *fused = softmax_grads(dev, kind, rows, cols);
        /* cross-entropy reaches softmax_backward through its composed xent entries */
        uint64_t bits = BIT(softmax_backward) | (kind == 2 ? BIT(xent) | BIT(xent_backward) : 0);
        set_way(dev, COMPOSED, bits);
        uint64_t before = composed_calls(dev);
        float *composed = softmax_grads(dev, kind, rows, cols);
        set_way(dev, FUSED, 0);
        /* one softmax backward (and xent, xent_backward) */
        assert_int_equal(composed_calls(dev) - before, kind == 2 ? 3 : 1);
        snprintf(label, sizeof label, "%s [%lld, %lld] on %s: composed vs fused", kinds[kind],
                 (long long)rows, (long long)cols, clpar_device_id(dev));
        /* float sums over a row (the host's softmax backward sums in double) */
        float atol = 1e-5f + 1e-7f * (float)cols;
        tu_assert_close(composed, fused, n, 1e-4f, atol, label);
        snprintf(label, sizeof label, "%s [%lld, %lld] on %s: composed vs the host reference",
                 kinds[kind], (long long)rows, (long long)cols, clpar_device_id(dev));
        tu_assert_close(composed, ref, n, 1e-4f, atol, label);
        free(fused);
        free(composed);
      }
      free(ref);
    }
}

/* The nll and nll_backward entries on dev for log-probabilities [rows, cols] (random), int32
 * labels (the first row at the last class) and a per-row gradient; returns nll's [rows],
 * then nll_backward's [rows, cols] (malloc'ed). */
static float *nll_run(clpar_device *dev, int64_t rows, int64_t cols) {
  int64_t as[] = {rows, cols};
  clpar_tensor *a = tu_make(dev, 2, as, 61), *g = tu_make(dev, 1, &rows, 62), *lab, *out, *gin;
  int32_t *labels = malloc((size_t)rows * sizeof *labels);
  assert_non_null(labels);
  for (int64_t r = 0; r < rows; r++) labels[r] = (int32_t)(r == 0 ? cols - 1 : (r * 5 + 1) % cols);
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 1, &rows, labels, &lab));
  tu_ok(clpar_tensor_empty(dev, 1, &rows, &out));
  tu_ok(clpar_tensor_empty(dev, 2, as, &gin));
  tu_ok(clpar_dev_nll(dev, (size_t)rows, (size_t)cols, clpar_tensor_bref(a), clpar_tensor_bref(lab),
                      clpar_tensor_bref(out)));
  tu_ok(clpar_dev_nll_backward(dev, (size_t)rows, (size_t)cols, clpar_tensor_bref(lab),
                               clpar_tensor_bref(g), clpar_tensor_bref(gin)));
  size_t n = (size_t)(rows * cols);
  float *res = malloc(((size_t)rows + n) * sizeof *res);
  assert_non_null(res);
  tu_ok(clpar_tensor_read(out, res, (size_t)rows));
  tu_ok(clpar_tensor_read(gin, res + rows, n));
  free(labels);
  clpar_tensor_free(a), clpar_tensor_free(g), clpar_tensor_free(lab);
  clpar_tensor_free(out), clpar_tensor_free(gin);
  return res;
}

/* nll and nll_backward composed (pick, neg, fill) against the fused entries and the host. */
static void test_nll_composed(void **state) {
  (void)state;
  static const int64_t shapes[][2] = {{16, 10}, {1, 3}, {50, 1}, {300, 77}};
  clpar_device *host = tu_host();
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
    int64_t rows = shapes[sh][0], cols = shapes[sh][1];
    size_t n = (size_t)(rows + rows * cols);
    set_way(host, FUSED, 0);
    float *ref = nll_run(host, rows, cols);
    for (int d = 0; d < clpar_device_count(); d++) {
      clpar_device *dev = clpar_device_get(d);
      char label[160];
      float *fused = nll_run(dev, rows, cols);
      set_way(dev, COMPOSED, BIT(nll) | BIT(nll_backward));
      uint64_t before = composed_calls(dev);
      float *composed = nll_run(dev, rows, cols);
      set_way(dev, FUSED, 0);
      assert_int_equal(composed_calls(dev) - before, 2); /* nll and its backward */
      snprintf(label, sizeof label, "nll [%lld, %lld] on %s: composed vs fused", (long long)rows,
               (long long)cols, clpar_device_id(dev));
      tu_assert_close(composed, fused, n, 0.0f, 0.0f, label);
      snprintf(label, sizeof label, "nll [%lld, %lld] on %s: composed vs the host reference",
               (long long)rows, (long long)cols, clpar_device_id(dev));
      tu_assert_close(composed, ref, n, 0.0f, 0.0f, label);
      free(fused);
      free(composed);
    }
    free(ref);
  }
}

/* pick, the primitive nll is composed from: gather and scatter at int32 indices (the first
 * and the last column included), on every selected device and the host, against values
 * computed here. */
static void test_pick_primitive(void **state) {
  (void)state;
  enum { ROWS = 1000, COLS = 37 };
  int32_t idx[ROWS];
  for (int r = 0; r < ROWS; r++) idx[r] = r == 0 ? 0 : r == 1 ? COLS - 1 : (r * 17 + 5) % COLS;
  float *a = tu_rand((size_t)ROWS * COLS, 51), *v = tu_rand(ROWS, 52);
  float want_g[ROWS], *want_s = malloc((size_t)ROWS * COLS * sizeof *want_s);
  float *got = malloc((size_t)ROWS * COLS * sizeof *got);
  assert_non_null(want_s);
  assert_non_null(got);
  for (int r = 0; r < ROWS; r++) want_g[r] = a[r * COLS + idx[r]];
  for (int i = 0; i < ROWS * COLS; i++) want_s[i] = 7.0f;
  for (int r = 0; r < ROWS; r++) want_s[r * COLS + idx[r]] = v[r];
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    int64_t rows = ROWS, shape[] = {ROWS, COLS};
    clpar_tensor *ti, *ta, *tv, *tg, *ts;
    tu_ok(clpar_tensor_zeros(dev, 1, &rows, &ti)); /* int32 indices in 4-byte elements */
    tu_ok(clpar_upload(dev, ti->storage->buf, 0, idx, sizeof idx));
    tu_ok(clpar_tensor_from_host(dev, 2, shape, a, &ta));
    tu_ok(clpar_tensor_from_host(dev, 1, &rows, v, &tv));
    tu_ok(clpar_tensor_zeros(dev, 1, &rows, &tg));
    tu_ok(clpar_tensor_zeros(dev, 2, shape, &ts));
    tu_ok(clpar_fill(ts, 7.0f));
    tu_ok(clpar_dev_pick(dev, 0, ROWS, COLS, clpar_tensor_bref(ti), clpar_tensor_bref(ta),
                         clpar_tensor_bref(tg)));
    tu_ok(clpar_dev_pick(dev, 1, ROWS, COLS, clpar_tensor_bref(ti), clpar_tensor_bref(tv),
                         clpar_tensor_bref(ts)));
    tu_ok(clpar_tensor_read(tg, got, ROWS));
    assert_memory_equal(got, want_g, sizeof want_g);
    tu_ok(clpar_tensor_read(ts, got, (size_t)ROWS * COLS));
    assert_memory_equal(got, want_s, (size_t)ROWS * COLS * sizeof *got);
    clpar_tensor_free(ti);
    clpar_tensor_free(ta);
    clpar_tensor_free(tv);
    clpar_tensor_free(tg);
    clpar_tensor_free(ts);
  }
  free(got);
  free(want_s);
  free(v);
  free(a);
}

/* Only the composable entries can be forced; a refused mask changes nothing. */
static void test_force_checks_its_mask(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  uint64_t before = dev->composed[0];
  assert_int_equal(clpar_compose_force(dev, BIT(gemm)), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "cannot be composed"));
  assert_int_equal(clpar_compose_force(dev, BIT(profile) | BIT(sgd_step)),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_true(dev->composed[0] == before);
  assert_int_equal(clpar_compose_force(NULL, 0), CLPAR_ERROR_INVALID_ARGUMENT);
}

/* ---- waits inside backends ---- */

/* OpenCL's profile_read finishes the queue (clFinish) on the worker: the dispatch counts
 * that wait as the backend's, besides the caller's own wait for the worker. */
static void test_backend_wait_is_counted(void **state) {
  (void)state;
  int checked = 0;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_device_info info;
    tu_ok(clpar_device_get_info(dev, &info));
    if (strcmp(info.backend, "opencl") != 0) continue;
    int64_t shape[] = {64, 64};
    clpar_tensor *a = tu_make(dev, 2, shape, 31), *c;
    tu_ok(clpar_device_synchronize(dev));
    clpar_device_counters before, after;
    tu_ok(clpar_device_counters_get(dev, &before));
    tu_ok(clpar_device_profile_start(dev));
    tu_ok(clpar_matmul(a, a, 0, 0, &c));
    clpar_profile prof;
    tu_ok(clpar_device_profile_read(dev, &prof));
    tu_ok(clpar_device_profile_stop(dev));
    tu_ok(clpar_device_counters_get(dev, &after));
    /* profile_read: the caller's wait and the backend's clFinish; profile_stop: the
     * caller's wait (the spans were harvested by profile_read, so no wait of the backend) */
    assert_int_equal(after.backend_waits - before.backend_waits, 1);
    assert_int_equal(after.host_waits - before.host_waits, 3);
    clpar_tensor_free(c);
    clpar_tensor_free(a);
    checked++;
  }
  if (!checked) skip(); /* the host backend never blocks inside an entry */
}

/* A training step (forward, loss, backward, SGD with momentum) makes no backend wait, on any
 * selected device, before its loss is read. */
static void test_training_step_has_no_backend_wait(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    int64_t xs[] = {16, 32}, ws[] = {10, 32};
    clpar_tensor *x = tu_make(dev, 2, xs, 41), *w = tu_make(dev, 2, ws, 42);
    tu_ok(clpar_tensor_set_requires_grad(w, 1));
    clpar_sgd_options o = {0.1f, 0.9f, 0.0f, 0.0f, 0};
    clpar_optimizer *opt;
    tu_ok(clpar_sgd_create(&w, 1, &o, &opt));
    int32_t labels[16];
    for (int i = 0; i < 16; i++) labels[i] = i % 10;
    clpar_device_counters before = {0}, after;
    for (int step = 0; step < 3; step++) {
      if (step == 1) tu_ok(clpar_device_counters_get(dev, &before)); /* after a warm-up */
      clpar_tensor *h, *loss;
      tu_ok(clpar_linear(x, w, NULL, &h));
      tu_ok(clpar_cross_entropy(h, labels, 16, CLPAR_REDUCTION_MEAN, &loss));
      tu_ok(clpar_backward(loss));
      tu_ok(clpar_optimizer_step(opt));
      tu_ok(clpar_optimizer_zero_grad(opt));
      clpar_tensor_free(loss);
      clpar_tensor_free(h);
    }
    tu_ok(clpar_device_counters_get(dev, &after));
    assert_int_equal(after.backend_waits - before.backend_waits, 0);
    assert_int_equal(after.host_waits - before.host_waits, 0);
    clpar_optimizer_free(opt);
    clpar_tensor_free(w);
    clpar_tensor_free(x);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_composed),
      cmocka_unit_test(test_adam_composed),
      cmocka_unit_test(test_softmax_backward_composed),
      cmocka_unit_test(test_pick_primitive),
      cmocka_unit_test(test_nll_composed),
      cmocka_unit_test(test_force_checks_its_mask),
      cmocka_unit_test(test_backend_wait_is_counted),
      cmocka_unit_test(test_training_step_has_no_backend_wait),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
