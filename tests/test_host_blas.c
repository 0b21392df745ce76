/* test_host_blas.c — the host backend's GEMM (OpenBLAS's cblas_sgemm when built with
 * CLPAR_BLAS, a plain loop otherwise) against a naive GEMM written here in double: the host
 * backend is the reference every other device is checked against, so its own GEMM is checked
 * against something simpler still. The backend entry is called through the device's worker
 * with element offsets and leading dimensions wider than the matrices, every transpose
 * combination, odd sizes, alpha and beta, and checks that nothing outside C's window is
 * written and that NaN in C does not leak through beta = 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

/* Row-major C = alpha op(A) op(B) + beta C in double, the obvious way. */
static void naive_gemm(int ta, int tb, size_t m, size_t n, size_t k, float alpha, const float *a,
                       size_t lda, const float *b, size_t ldb, float beta, float *c, size_t ldc) {
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < n; j++) {
      double acc = 0.0;
      for (size_t p = 0; p < k; p++) {
        double x = ta ? a[p * lda + i] : a[i * lda + p];
        double y = tb ? b[j * ldb + p] : b[p * ldb + j];
        acc += x * y;
      }
      double old = beta == 0.0f ? 0.0 : (double)beta * c[i * ldc + j];
      c[i * ldc + j] = (float)(alpha * acc + old);
    }
}

typedef struct {
  size_t m, n, k;
  float alpha, beta;
} shape_case;

/* One GEMM through the host device's gemm entry. A, B and C live in one buffer at odd element
 * offsets, each with a leading dimension 3 wider than its rows; C's padding holds a sentinel
 * that must survive. */
static void check_case(int ta, int tb, shape_case sc, uint64_t seed) {
  clpar_device *host = tu_host();
  size_t a_rows = ta ? sc.k : sc.m, a_cols = ta ? sc.m : sc.k;
  size_t b_rows = tb ? sc.n : sc.k, b_cols = tb ? sc.k : sc.n;
  size_t lda = a_cols + 3, ldb = b_cols + 3, ldc = sc.n + 3;
  size_t off_a = 5, off_b = off_a + a_rows * lda + 7, off_c = off_b + b_rows * ldb + 1;
  size_t total = off_c + sc.m * ldc + 2;
  float *init = tu_rand(total, seed);
  const float sentinel = 12345.0f;
  for (size_t i = 0; i < sc.m; i++)
    for (size_t j = sc.n; j < ldc; j++) init[off_c + i * ldc + j] = sentinel;
  if (sc.beta == 0.0f) /* C's old contents must be ignored */
    for (size_t i = 0; i < sc.m; i++)
      for (size_t j = 0; j < sc.n; j++) init[off_c + i * ldc + j] = NAN;
  float *want = malloc(total * sizeof *want);
  assert_non_null(want);
  memcpy(want, init, total * sizeof *want);
  naive_gemm(ta, tb, sc.m, sc.n, sc.k, sc.alpha, want + off_a, lda, want + off_b, ldb, sc.beta,
             want + off_c, ldc);

  int64_t shape[1] = {(int64_t)total};
  clpar_tensor *buf = NULL;
  tu_ok(clpar_tensor_from_host(host, 1, shape, init, &buf));
  clpar_bref base = clpar_tensor_bref(buf);
  clpar_bref a = {base.buf, base.off + off_a}, b = {base.buf, base.off + off_b},
             c = {base.buf, base.off + off_c};
  tu_ok(clpar_dev_gemm_sync(host, ta, tb, sc.m, sc.n, sc.k, sc.alpha, a, lda, b, ldb, sc.beta, c,
                            ldc));
  float *got = tu_read(buf);
  char what[128];
  snprintf(what, sizeof what, "gemm ta=%d tb=%d m=%zu n=%zu k=%zu alpha=%g beta=%g", ta, tb, sc.m,
           sc.n, sc.k, (double)sc.alpha, (double)sc.beta);
  /* float sums of k terms in [-1, 1): the error grows like sqrt(k) eps. */
  float atol = 2e-6f * (float)sc.k + 1e-6f;
  tu_assert_close(got, want, total, 1e-5f, atol, what);
  for (size_t i = 0; i < sc.m; i++)
    for (size_t j = 0; j < sc.n; j++)
      if (!isfinite(got[off_c + i * ldc + j])) fail_msg("%s: C[%zu,%zu] is not finite", what, i, j);
  free(got);
  free(want);
  free(init);
  clpar_tensor_free(buf);
}

static void test_blas_gemm_matches_naive(void **state) {
  (void)state;
  const shape_case cases[] = {
      {1, 1, 1, 1.0f, 0.0f},        {7, 13, 5, 1.0f, 0.0f},      {13, 7, 29, 0.5f, 1.0f},
      {33, 1, 17, 1.0f, 0.75f},     {1, 31, 64, -1.25f, 0.0f},   {67, 33, 129, 1.0f, 1.0f},
      {130, 257, 65, -0.5f, 0.25f}, {260, 300, 280, 1.0f, 0.0f}, /* big enough for threads */
  };
  uint64_t seed = 1;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) check_case(ta, tb, cases[i], seed++);
}

/* alpha = 0 with beta = 1 leaves C as it was; beta = 0 with alpha = 0 zeroes it (NaN
 * included). */
static void test_blas_gemm_alpha_zero(void **state) {
  (void)state;
  check_case(0, 0, (shape_case){9, 11, 6, 0.0f, 1.0f}, 101);
  check_case(1, 1, (shape_case){9, 11, 6, 0.0f, 0.0f}, 102);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blas_gemm_matches_naive),
      cmocka_unit_test(test_blas_gemm_alpha_zero),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
