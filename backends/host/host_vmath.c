/* host_vmath.c — GELU's erf form over arrays, eight elements at a time through glibc's vector
 * math library (libmvec: erff and expf within 4 ulp, where the scalar libm's are within 1) on
 * CPUs with AVX2 and FMA. The expressions, and their order of rounding, are
 * host_tensor_ops.c's scalar ones; only erf and exp come from the vector library. Without
 * libmvec, or on other CPUs, the functions decline and the scalar loops run. */
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
#else
size_t clpar_host_gelu_erf_vec(const float *x, const float *g, float *out, size_t n) {
  (void)x, (void)g, (void)out, (void)n;
  return 0;
}
#endif
