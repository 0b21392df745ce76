/* host_half.c — the host backend's 16-bit entries (backend_half.h): half_convert, the core's
 * scalar conversions (clpar/half.h) over the elements, so that the host is the reference the
 * other backends match; gemm_half, both operands widened that way, then the host's SGEMM. */
#include <stdint.h>
#include <stdlib.h>

#include "clpar/half.h"
#include "host/host_tensor_ops.h"

#define HOST_PAR 65536 /* elements above which a loop runs on OpenMP's team */

clpar_status clpar_host_half_convert(void *dev, int to_half, int bf16, size_t n, clpar_bref x,
                                     clpar_bref out) {
  (void)dev;
  if (to_half) {
    const float *px = (const float *)x.buf + x.off;
    uint16_t *po = (uint16_t *)((uint32_t *)out.buf + out.off);
#pragma omp parallel for if (n > HOST_PAR) schedule(static)
    for (size_t i = 0; i < n; i++)
      po[i] = bf16 ? clpar_float_to_bf16(px[i]) : clpar_float_to_fp16(px[i]);
    return CLPAR_OK;
  }
  const uint16_t *px = (const uint16_t *)((const uint32_t *)x.buf + x.off);
  float *po = (float *)out.buf + out.off;
#pragma omp parallel for if (n > HOST_PAR) schedule(static)
  for (size_t i = 0; i < n; i++)
    po[i] = bf16 ? clpar_bf16_to_float(px[i]) : clpar_fp16_to_float(px[i]);
  return CLPAR_OK;
}

/* ---- gemm_half: the reference, the widened path's bits ---- */

static uint64_t gemm_half_runs; /* atomic */

uint64_t clpar_host_gemm_half_runs(void) {
  return __atomic_load_n(&gemm_half_runs, __ATOMIC_RELAXED);
}

/* The rows x cols matrix of 16-bit elements at x (leading dimension ld) widened into *out, a
 * new float32 block of the same layout, (rows - 1) ld + cols floats aligned as the host's
 * buffers (64 bytes), so that the SGEMM sees what it sees on a widened tensor. */
static clpar_status widen_matrix(int bf16, size_t rows, size_t cols, size_t ld, clpar_bref x,
                                 float **out) {
  size_t n = (rows - 1) * ld + cols, bytes = (n * sizeof(float) + 63) / 64 * 64;
  void *p = NULL;
  if (n > SIZE_MAX / sizeof(float) - 64 || posix_memalign(&p, 64, bytes) != 0)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                           "host gemm_half: %zu floats for a widened operand", n);
  clpar_bref f = {p, 0};
  clpar_host_half_convert(NULL, 0, bf16, n, x, f);
  *out = p;
  return CLPAR_OK;
}

clpar_status clpar_host_gemm_half(clpar_be_gemm_fn gemm, void *dev, int bf16, int trans_a,
                                  int trans_b, size_t m, size_t n, size_t k, float alpha,
                                  clpar_bref a, size_t lda, clpar_bref b, size_t ldb, float beta,
                                  clpar_bref c, size_t ldc) {
  float *a32 = NULL, *b32 = NULL;
  clpar_status s = widen_matrix(bf16, trans_a ? k : m, trans_a ? m : k, lda, a, &a32);
  if (s == CLPAR_OK) s = widen_matrix(bf16, trans_b ? n : k, trans_b ? k : n, ldb, b, &b32);
  if (s == CLPAR_OK) {
    clpar_bref fa = {a32, 0}, fb = {b32, 0};
    s = gemm(dev, trans_a, trans_b, m, n, k, alpha, fa, lda, fb, ldb, beta, c, ldc);
  }
  if (s == CLPAR_OK) __atomic_add_fetch(&gemm_half_runs, 1, __ATOMIC_RELAXED);
  free(a32), free(b32);
  return s;
}
