/* cuda_gemm.c — the CUDA backend's GEMM and batched GEMM: cuBLAS on the device's stream,
 * under the device's cuBLAS lock. */
#include <limits.h>

#include "cuda/cuda_internal.h"

/* cuBLAS is column-major, and a row-major matrix read as column-major is its transpose. So
 * the row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: the
 * operands and m, n swap places, the transpose flags and leading dimensions stay with their
 * matrices. beta == 0 makes cuBLAS ignore C, NaNs included. cuBLAS's default math mode is
 * full FP32 (no TF32), which keeps results comparable with the host reference. */
clpar_status cuda_gemm(void *dev, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                       float alpha, clpar_bref a, size_t lda, clpar_bref b, size_t ldb, float beta,
                       clpar_bref c, size_t ldc) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  int fits = clpar_cuda_gemm_fits(m, n, k, lda, ldb, ldc);
  cublasStatus_t st;
  pthread_mutex_lock(&d->blas_lock);
  if (fits) {
    st = cublasSgemm(d->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, at(b), (int)ldb, at(a),
                     (int)lda, &beta, at(c), (int)ldc);
  } else {
#if CUBLAS_VER_MAJOR >= 12
    st = cublasSgemm_64(d->blas, op_b, op_a, (int64_t)n, (int64_t)m, (int64_t)k, &alpha, at(b),
                        (int64_t)ldb, at(a), (int64_t)lda, &beta, at(c), (int64_t)ldc);
#else
    st = CUBLAS_STATUS_NOT_SUPPORTED; /* 32-bit sizes only before cuBLAS 12 */
#endif
  }
  pthread_mutex_unlock(&d->blas_lock);
  return clpar_cuda_op_end(d, &prof, clpar_cuda_blas_check(st, "cublasSgemm"));
}

/* As cuda_gemm, one cuBLAS call for the whole batch. */
clpar_status cuda_gemm_batched(void *dev, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                               float alpha, clpar_bref a, size_t lda, size_t stride_a, clpar_bref b,
                               size_t ldb, size_t stride_b, float beta, clpar_bref c, size_t ldc,
                               size_t stride_c, size_t batch) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  int fits = clpar_cuda_gemm_fits(m, n, k, lda, ldb, ldc) && batch <= INT_MAX;
  cublasStatus_t st;
  pthread_mutex_lock(&d->blas_lock);
  if (fits) {
    st = cublasSgemmStridedBatched(d->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, at(b),
                                   (int)ldb, (long long)stride_b, at(a), (int)lda,
                                   (long long)stride_a, &beta, at(c), (int)ldc, (long long)stride_c,
                                   (int)batch);
  } else {
#if CUBLAS_VER_MAJOR >= 12
    st = cublasSgemmStridedBatched_64(d->blas, op_b, op_a, (int64_t)n, (int64_t)m, (int64_t)k,
                                      &alpha, at(b), (int64_t)ldb, (long long)stride_b, at(a),
                                      (int64_t)lda, (long long)stride_a, &beta, at(c), (int64_t)ldc,
                                      (long long)stride_c, (int64_t)batch);
#else
    st = CUBLAS_STATUS_NOT_SUPPORTED; /* 32-bit sizes only before cuBLAS 12 */
#endif
  }
  pthread_mutex_unlock(&d->blas_lock);
  return clpar_cuda_op_end(d, &prof, clpar_cuda_blas_check(st, "cublasSgemmStridedBatched"));
}
