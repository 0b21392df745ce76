/* host_vmath.c — GELU's erf form over arrays, eight elements at a time, and softmax rows, four
 * doubles at a time, through glibc's vector math library (libmvec: erff, expf and exp within
 * 4 ulp, where the scalar libm's are within 1) on CPUs with AVX2 and FMA. The expressions, and
 * their order of rounding, are the scalar loops' (host_tensor_ops.c, host_backend.c); only erf
 * and exp come from the vector library, and a softmax row's sum adds four lanes. Without
 * libmvec, or on other CPUs, the functions decline and the scalar loops run. */
#include <math.h>
#include <stddef.h>

#include "host/host_tensor_ops.h"

#if defined(CLPAR_HAVE_MVEC) && defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__m256 _ZGVdN8v_erff(__m256 x); /* libmvec's AVX2 variants, as GCC names them */
__m256 _ZGVdN8v_expf(__m256 x);

#define INV_SQRT_2 0.70710678118654752f
#define INV_SQRT_2PI 0.3989422804014327f

/* 0.5 x (1 + erf(x / sqrt 2)) */
__attribute__((target("avx2,fma"))) static __m256 gelu8(__m256 x) {
  __m256 e = _ZGVdN8v_erff(_mm256_mul_ps(x, _mm256_set1_ps(INV_SQRT_2)));
  __m256 h = _mm256_mul_ps(_mm256_set1_ps(0.5f), x);
  return _mm256_mul_ps(h, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* g (0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)) */
__attribute__((target("avx2,fma"))) static __m256 gelu_grad8(__m256 x, __m256 g) {
  __m256 e = _ZGVdN8v_erff(_mm256_mul_ps(x, _mm256_set1_ps(INV_SQRT_2)));
  __m256 cdf = _mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  __m256 q = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-0.5f), x), x);
  __m256 pdf = _mm256_mul_ps(_mm256_mul_ps(x, _ZGVdN8v_expf(q)), _mm256_set1_ps(INV_SQRT_2PI));
  return _mm256_mul_ps(g, _mm256_add_ps(cdf, pdf));
}

/* Whole groups of eight of [0, n): the count done, the rest left to the caller. */
__attribute__((target("avx2,fma"))) static size_t gelu_run(const float *x, const float *g,
                                                           float *out, size_t n) {
  size_t m = n / 8 * 8;
  for (size_t i = 0; i < m; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(out + i, g ? gelu_grad8(v, _mm256_loadu_ps(g + i)) : gelu8(v));
  }
  return m;
}

size_t clpar_host_gelu_erf_vec(const float *x, const float *g, float *out, size_t n) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  return gelu_run(x, g, out, n);
}

__m256d _ZGVdN4v_exp(__m256d x);

/* y = exp(x - max) / sum over one row of cols, in double as host_softmax's scalar loop (four
 * lanes of the sum, added pairwise at the end); e holds the row's exps. */
__attribute__((target("avx2,fma"))) static void softmax_row(const float *x, float *y, size_t cols,
                                                            double *e) {
  float max = x[0];
  for (size_t c = 1; c < cols; c++) max = x[c] > max ? x[c] : max;
  size_t m = cols / 4 * 4;
  __m256d mx = _mm256_set1_pd((double)max), acc = _mm256_setzero_pd();
  for (size_t c = 0; c < m; c += 4) {
    __m256d v = _ZGVdN4v_exp(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + c)), mx));
    _mm256_storeu_pd(e + c, v);
    acc = _mm256_add_pd(acc, v);
  }
  double lane[4];
  _mm256_storeu_pd(lane, acc);
  double sum = (lane[0] + lane[1]) + (lane[2] + lane[3]);
  for (size_t c = m; c < cols; c++) sum += e[c] = exp((double)x[c] - max);
  __m256d sv = _mm256_set1_pd(sum);
  for (size_t c = 0; c < m; c += 4)
    _mm_storeu_ps(y + c, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_loadu_pd(e + c), sv)));
  for (size_t c = m; c < cols; c++) y[c] = (float)(e[c] / sum);
}

int clpar_host_softmax_vec_ok(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

void clpar_host_softmax_row_vec(const float *x, float *y, size_t cols, double *e) {
  softmax_row(x, y, cols, e);
}
#else
size_t clpar_host_gelu_erf_vec(const float *x, const float *g, float *out, size_t n) {
  (void)x, (void)g, (void)out, (void)n;
  return 0;
}

int clpar_host_softmax_vec_ok(void) {
  return 0;
}

void clpar_host_softmax_row_vec(const float *x, float *y, size_t cols, double *e) {
  (void)x, (void)y, (void)cols, (void)e;
}
#endif
