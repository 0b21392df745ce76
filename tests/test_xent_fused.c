/* test_xent_fused.c — softmax cross-entropy as one fused entry per direction (backend.h's
 * xent and xent_backward), behind clpar_cross_entropy and clpar_cross_entropy_targets.
 *
 * - clpar_cross_entropy_targets on [N, V] and [N, T, V] logits, int32 and int64 targets with
 *   some equal to ignore_index, mean and sum: the loss and the logits' gradient on every
 *   selected device, fused and composed (clpar_compose_force: log_softmax, nll_ignore and
 *   their backwards, the unfused path), against a float64 reference computed here and
 *   against the host backend's entries; ignored rows get a gradient of exactly 0. Rows of up
 *   to 256 classes (one work-item a row on CPU OpenCL devices, 8 columns at a time, with and
 *   without a tail) and wider (one work-group a row).
 * - clpar_cross_entropy (labels in host memory) the same way.
 * - On devices with a profile, the commands a loss enqueues: the fused forward runs one
 *   command fewer than the composition and its backward three fewer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define BIT(entry) ((uint64_t)1 << CLPAR_ENTRY_##entry)
#define XENT_BITS (BIT(xent) | BIT(xent_backward))

static uint64_t composed_calls(const clpar_device *dev) {
  return __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
}

/* Targets for rows rows of cols classes: every third one ignored (when ignore is used), the
 * first row at the last class. */
static int64_t target_of(int64_t r, int64_t cols, int use_ignore) {
  if (use_ignore && r % 3 == 1) return CLPAR_IGNORE_INDEX;
  return r == 0 ? cols - 1 : (r * 7 + 2) % cols;
}

/* The float64 loss and gradient (scaled by 1 for the loss's seed) of logits x [rows, cols]. */
static void reference(const float *x, int64_t rows, int64_t cols, int use_ignore, int mean,
                      double *loss, float *grad) {
  double total = 0, count = 0;
  for (int64_t r = 0; r < rows; r++) {
    int64_t t = target_of(r, cols, use_ignore);
    if (t == CLPAR_IGNORE_INDEX) continue;
    const float *row = x + r * cols;
    double m = row[0], sum = 0;
    for (int64_t c = 1; c < cols; c++) m = row[c] > m ? row[c] : m;
    for (int64_t c = 0; c < cols; c++) sum += exp(row[c] - m);
    total += m + log(sum) - row[t];
    count += 1;
  }
  double scale = mean ? 1.0 / count : 1.0;
  *loss = total * scale;
  for (int64_t r = 0; r < rows; r++) {
    int64_t t = target_of(r, cols, use_ignore);
    const float *row = x + r * cols;
    double m = row[0], sum = 0;
    for (int64_t c = 1; c < cols; c++) m = row[c] > m ? row[c] : m;
    for (int64_t c = 0; c < cols; c++) sum += exp(row[c] - m);
    for (int64_t c = 0; c < cols; c++)
      grad[r * cols + c] = t == CLPAR_IGNORE_INDEX
                               ? 0.0f
                               : (float)(scale * (exp(row[c] - m) / sum - (c == t ? 1.0 : 0.0)));
  }
}

typedef struct {
  int ndim;
  int64_t shape[3]; /* logits; the last is the classes */
  int idx64, use_ignore, mean, host_labels;
} ce_case;

/* Runs the case on dev: loss first, then the logits' gradient (malloc'ed). */
static float *run(clpar_device *dev, const ce_case *k, int64_t rows, int64_t cols) {
  clpar_tensor *x = tu_make(dev, k->ndim, k->shape, 71), *loss, *tt = NULL;
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  clpar_reduction red = k->mean ? CLPAR_REDUCTION_MEAN : CLPAR_REDUCTION_SUM;
  int64_t *t64 = malloc((size_t)rows * sizeof *t64);
  int32_t *t32 = malloc((size_t)rows * sizeof *t32);
  assert_non_null(t64);
  assert_non_null(t32);
  for (int64_t r = 0; r < rows; r++) t32[r] = (int32_t)(t64[r] = target_of(r, cols, k->use_ignore));
  if (k->host_labels) {
    tu_ok(clpar_cross_entropy(x, t32, rows, red, &loss));
  } else {
    tu_ok(clpar_tensor_from_host_dtype(dev, k->idx64 ? CLPAR_INT64 : CLPAR_INT32, k->ndim - 1,
                                       k->shape, k->idx64 ? (void *)t64 : (void *)t32, &tt));
    tu_ok(clpar_cross_entropy_targets(x, tt, CLPAR_IGNORE_INDEX, red, &loss));
  }
  tu_ok(clpar_backward(loss));
  float *out = malloc((size_t)(1 + rows * cols) * sizeof *out);
  assert_non_null(out);
  tu_ok(clpar_tensor_read(loss, out, 1));
  tu_ok(clpar_tensor_read(clpar_tensor_grad(x), out + 1, (size_t)(rows * cols)));
  free(t64);
  free(t32);
  clpar_tensor_free(tt);
  clpar_tensor_free(loss);
  clpar_tensor_free(x);
  return out;
}

/* One case on every device, fused and composed, against the reference and the host. */
static void check_case(const ce_case *k) {
  int64_t cols = k->shape[k->ndim - 1], rows = 1;
  for (int d = 0; d < k->ndim - 1; d++) rows *= k->shape[d];
  size_t n = (size_t)(rows * cols);
  clpar_tensor *xh = tu_make(tu_host(), k->ndim, k->shape, 71);
  float *x = tu_read(xh), *want = malloc((n + 1) * sizeof *want);
  assert_non_null(want);
  double loss;
  reference(x, rows, cols, k->use_ignore, k->mean, &loss, want + 1);
  want[0] = (float)loss;
  float *host = run(tu_host(), k, rows, cols);
  char what[200];
  snprintf(what, sizeof what, "%s [%lld, %lld] idx64 %d ignore %d %s: host vs float64",
           k->host_labels ? "cross_entropy" : "cross_entropy_targets", (long long)rows,
           (long long)cols, k->idx64, k->use_ignore, k->mean ? "mean" : "sum");
  tu_assert_close(host, want, n + 1, 1e-5f, 1e-6f, what);
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    uint64_t natural = dev->natural[0] & XENT_BITS, before = composed_calls(dev);
    float *fused = run(dev, k, rows, cols);
    assert_int_equal(composed_calls(dev) - before, natural ? 2 : 0);
    tu_ok(clpar_compose_force(dev, XENT_BITS));
    before = composed_calls(dev);
    float *composed = run(dev, k, rows, cols);
    tu_ok(clpar_compose_force(dev, 0));
    assert_true(composed_calls(dev) - before >= 2); /* xent and xent_backward */
    snprintf(what, sizeof what, "%s [%lld, %lld] idx64 %d ignore %d %s on %s",
             k->host_labels ? "cross_entropy" : "cross_entropy_targets", (long long)rows,
             (long long)cols, k->idx64, k->use_ignore, k->mean ? "mean" : "sum",
             clpar_device_id(dev));
    tu_assert_close(fused, composed, n + 1, 1e-5f, 1e-7f, what);
    tu_assert_close(fused, host, n + 1, 1e-4f, 1e-6f, what);
    tu_assert_close(fused, want, n + 1, 1e-4f, 1e-6f, what);
    for (int64_t r = 0; r < rows; r++) /* ignored rows: exactly zero */
      if (target_of(r, cols, k->use_ignore) == CLPAR_IGNORE_INDEX)
        for (int64_t c = 0; c < cols; c++) assert_true(fused[1 + r * cols + c] == 0.0f);
    free(fused);
    free(composed);
  }
  free(host);
  free(x);
  free(want);
  clpar_tensor_free(xh);
}

static void test_targets(void **state) {
  (void)state;
  static const ce_case cases[] = {
      {2, {6, 11}, 0, 1, 1, 0},      {2, {6, 11}, 1, 1, 0, 0},     {3, {3, 5, 17}, 1, 1, 1, 0},
      {3, {3, 5, 17}, 0, 0, 0, 0},   {3, {2, 4, 300}, 1, 1, 1, 0}, {2, {1, 1}, 0, 0, 1, 0},
      {3, {2, 3, 1000}, 0, 1, 0, 0}, {2, {33, 64}, 0, 1, 1, 0},    {3, {2, 9, 256}, 1, 0, 0, 0},
      {2, {5, 1500}, 1, 1, 1, 0}, /* past 1024 columns: CUDA's block-per-row kernels */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

static void test_host_labels(void **state) {
  (void)state;
  static const ce_case cases[] = {
      {2, {6, 11}, 0, 0, 1, 1},
      {2, {6, 11}, 0, 0, 0, 1},
      {2, {40, 257}, 0, 0, 1, 1},
      {2, {9, 1}, 0, 0, 1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

/* The commands one loss and its backward enqueue, fused (way 0) or composed (way 1). */
static void count_ops(clpar_device *dev, int way, uint64_t *fwd, uint64_t *bwd) {
  int64_t xs[3] = {4, 3, 9}, ts[2] = {4, 3};
  int32_t t[12];
  for (int i = 0; i < 12; i++) t[i] = i % 4 == 1 ? CLPAR_IGNORE_INDEX : i % 9;
  clpar_tensor *x = tu_make(dev, 3, xs, 5), *tt, *loss;
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, ts, t, &tt));
  tu_ok(clpar_compose_force(dev, way ? XENT_BITS : 0));
  tu_ok(clpar_device_synchronize(dev));
  clpar_profile prof;
  tu_ok(clpar_device_profile_start(dev));
  tu_ok(clpar_cross_entropy_targets(x, tt, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, &loss));
  tu_ok(clpar_device_profile_read(dev, &prof));
  *fwd = prof.ops;
  tu_ok(clpar_device_profile_start(dev));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_device_profile_read(dev, &prof));
  tu_ok(clpar_device_profile_stop(dev));
  tu_ok(clpar_compose_force(dev, 0));
  *bwd = prof.ops;
  clpar_tensor_free(loss);
  clpar_tensor_free(tt);
  clpar_tensor_free(x);
}

/* Fused: xent, then the sums of weights and losses (one reduction) and their quotient
 * forward; backward's seed and xent_backward. Composed: log_softmax and nll_ignore forward;
 * backward the scale, log_softmax again, nll_ignore_backward and softmax_backward. */
static void test_commands_counted(void **state) {
  (void)state;
  int checked = 0;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    if (dev->natural[0] & XENT_BITS) continue; /* composed anyway */
    clpar_device_info info;
    tu_ok(clpar_device_get_info(dev, &info));
    if (strcmp(info.backend, "opencl") != 0 && strcmp(info.backend, "cuda") != 0) continue;
    uint64_t ff, fb, cf, cb;
    count_ops(dev, 0, &ff, &fb);
    count_ops(dev, 1, &cf, &cb);
    assert_int_equal(ff, 3);
    assert_int_equal(cf - ff, 1);
    assert_int_equal(fb, 2);
    assert_int_equal(cb - fb, 3);
    checked++;
  }
  if (!checked) skip(); /* the host backend keeps no profile */
}

#ifdef CLPAR_TEST_CUDA_BUILT
/* 1 when some CUDA device runs the fused entries (not composed); *n the CUDA devices. */
static int cuda_fused(int *n) {
  int any = 0;
  *n = 0;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    if (strcmp(dev->bd.info.backend, "cuda") != 0) continue;
    (*n)++;
    any |= !(dev->natural[0] & XENT_BITS);
  }
  return any;
}
#endif

/* CLPAR_CUDA_XENT: CUDA's fused entries are opt-in until a GPU has run them; a value other
 * than 0 or 1 makes clpar_init fail naming the variable. */
static void test_cuda_switch(void **state) {
  (void)state;
#ifndef CLPAR_TEST_CUDA_BUILT
  skip();
#else
  const char *bad[] = {"banana", "2", "", "yes", "1 ", "01", "true"};
  int n;
  clpar_shutdown();
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("CLPAR_CUDA_XENT", bad[i], 1);
    assert_int_equal(clpar_init(), CLPAR_ERROR_INVALID_ARGUMENT);
    if (!strstr(clpar_last_error(), "CLPAR_CUDA_XENT"))
      fail_msg("CLPAR_CUDA_XENT=\"%s\": %s", bad[i], clpar_last_error());
  }
  unsetenv("CLPAR_CUDA_XENT"); /* the default: composed */
  tu_ok(clpar_init());
  assert_false(cuda_fused(&n));
  clpar_shutdown();
  setenv("CLPAR_CUDA_XENT", "1", 1);
  tu_ok(clpar_init());
  assert_int_equal(cuda_fused(&n), n > 0);
  clpar_shutdown();
  unsetenv("CLPAR_CUDA_XENT");
  tu_ok(clpar_init());
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_targets),
      cmocka_unit_test(test_host_labels),
      cmocka_unit_test(test_commands_counted),
      cmocka_unit_test(test_cuda_switch),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
