/* cuda_half_gemm.c — the CUDA backend's gemm_half entry (backend_half.h): one cublasGemmEx with
 * A and B in 16 bits (CUDA_R_16BF or CUDA_R_16F), C in float32 (CUDA_R_32F), computed with
 * CUBLAS_COMPUTE_32F (float32 products and sums; not the _FAST_ types, no TF32, no 16-bit
 * accumulation) and float32 alpha and beta on the host (the handle's pointer mode), algorithm
 * CUBLAS_GEMM_DEFAULT. C is float32, the compute type's, so cuBLAS's reduced-precision
 * reductions (output type narrower than the compute type) do not arise.
 *
 * Opt-in until it has run on a GPU: CLPAR_CUDA_HALF_GEMM=1, read at the probe. Without it
 * supports_op refuses gemm_half and the core keeps widening autocast's operands to float32
 * for cuBLAS's SGEMM. The bits differ from that path's (another kernel, another order of
 * summation), not from run to run for a shape. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"

/* As cuda_gemm (cuda_gemm.c): the row-major C = op(A) op(B) is the column-major
 * C^T = op(B)^T op(A)^T, so the operands and m, n swap places and the transpose flags and
 * leading dimensions stay with their matrices. A 16-bit operand's bref counts words: it
 * starts at byte 4 off. */
clpar_status cuda_gemm_half(void *dev, int bf16, int trans_a, int trans_b, size_t m, size_t n,
                            size_t k, float alpha, clpar_bref a, size_t lda, clpar_bref b,
                            size_t ldb, float beta, clpar_bref c, size_t ldc) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cudaDataType_t half = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const void *pa = (const uint32_t *)a.buf + a.off, *pb = (const uint32_t *)b.buf + b.off;
  int fits = clpar_cuda_gemm_fits(m, n, k, lda, ldb, ldc);
  cublasStatus_t st;
  pthread_mutex_lock(&d->blas_lock);
  if (fits) {
    st = cublasGemmEx(d->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, pb, half, (int)ldb, pa,
                      half, (int)lda, &beta, at(c), CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  } else {
#if CUBLAS_VER_MAJOR >= 12
    st = cublasGemmEx_64(d->blas, op_b, op_a, (int64_t)n, (int64_t)m, (int64_t)k, &alpha, pb, half,
                         (int64_t)ldb, pa, half, (int64_t)lda, &beta, at(c), CUDA_R_32F,
                         (int64_t)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
#else
    st = CUBLAS_STATUS_NOT_SUPPORTED; /* 32-bit sizes only before cuBLAS 12 */
#endif
  }
  pthread_mutex_unlock(&d->blas_lock);
  s = clpar_cuda_blas_check(st, bf16 ? "cublasGemmEx(bfloat16)" : "cublasGemmEx(float16)");
  return clpar_cuda_op_end(d, &prof, s);
}
