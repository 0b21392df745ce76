/* cuda_internal.h — private to the CUDA backend's files: the per-device context, errors, the
 * bracket every op runs in (cuda_op.c) and the table's entries kept in files of their own
 * (cuda_backend.c builds the table). */
#ifndef CLPAR_CUDA_INTERNAL_H
#define CLPAR_CUDA_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend.h"
#include "cuda/cuda_kernels.h"

/* The events around one profiled op, recorded on the device's stream before and after it. */
typedef struct prof_pair {
  cudaEvent_t start, stop;
} prof_pair;

typedef struct cuda_dev {
  int ordinal; /* the CUDA runtime's device number */
  cudaStream_t stream;
  /* event_then's waits and callbacks; then_lock keeps each wait next to its callback when
   * two threads ask at once (DIRECT entries come from any thread). */
  cudaStream_t then_stream;
  pthread_mutex_t then_lock;
  cublasHandle_t blas;
  pthread_mutex_t blas_lock;
  /* sum_rows's partial sums (see kernels/cuda/sum_rows.cu), grown on demand; the lock is
   * held from sizing it to enqueueing both passes, so that no thread frees it under another. */
  pthread_mutex_t scratch_lock;
  float *scratch;
  size_t scratch_floats;
  /* the bytes of scratch, cuDNN's and cuBLASLt's workspaces now (__atomic: workspace_bytes
   * reads it from any thread); cuda_workspace_trim frees them */
  uint64_t own_bytes;
  /* Profiling: while profiling is set, ops keep their event pairs in pairs[0 .. n_pairs);
   * their times are folded into prof_seconds and prof_ops as they are read. prof_lock guards
   * everything here but the flag. */
  atomic_int profiling;
  pthread_mutex_t prof_lock;
  prof_pair *pairs;
  size_t n_pairs, cap_pairs;
  double prof_seconds;
  uint64_t prof_ops;
  /* peer_access's answers by the peer's ordinal: 0 not asked yet, 1 yes (access enabled),
   * -1 no; guarded by peer_lock. */
  pthread_mutex_t peer_lock;
  signed char peer_ok[64];
  /* cuDNN's handle, cached algorithms and workspace (cuda_cudnn.c), made at the first
   * convolution; cudnn_tf32: CLPAR_CUDA_TF32 as the probe read it. */
  void *cudnn;
  int cudnn_tf32;
  /* A Linear's bias and ReLU in cuBLASLt's GEMM epilogue (cuda_lt.c): lt_use is CLPAR_CUDA_LT as
   * the probe read it; lt, the handle, workspace and cached algorithms, made at first use. */
  int lt_use;
  void *lt;
  /* gemm_half through cublasGemmEx (cuda_half_gemm.c): CLPAR_CUDA_HALF_GEMM at the probe */
  int half_gemm;
  /* the fused softmax cross-entropy entries (kernels/cuda/softmax.cu): CLPAR_CUDA_XENT */
  int xent;
} cuda_dev;

/* ---- cuda_op.c ---- */

/* Sets the error for a failed runtime call. The runtime also keeps the error as this
 * thread's "last error"; it is cleared, so that a later launch check does not report it
 * again. */
clpar_status clpar_cuda_fail(const char *what, cudaError_t e);
/* CLPAR_OK, or clpar_cuda_fail(what, e). */
clpar_status clpar_cuda_check(cudaError_t e, const char *what);
/* CLPAR_OK, or the error for a failed cuBLAS call. */
clpar_status clpar_cuda_blas_check(cublasStatus_t st, const char *what);
/* Makes d the calling thread's current device. */
clpar_status clpar_cuda_use_device(const cuda_dev *d);
/* Folds the kept event pairs into the profile's totals (with wait, all of them; without,
 * those finished); prof_lock held. */
void clpar_cuda_prof_fold(cuda_dev *d, int wait);
/* Destroys the kept pairs without timing them; prof_lock held. */
void clpar_cuda_prof_discard(cuda_dev *d);
/* Begins an op on the calling thread: makes the device current and, while profiling is on,
 * records the op's start event. */
clpar_status clpar_cuda_op_begin(cuda_dev *d, prof_pair *prof);
/* Ends an op begun with clpar_cuda_op_begin, whose status is s; returns s. */
clpar_status clpar_cuda_op_end(cuda_dev *d, prof_pair *prof, clpar_status s);

/* 1 when a GEMM's sizes and leading dimensions fit cuBLAS's 32-bit arguments (else its _64
 * calls, cuBLAS 12 and later). */
static inline int clpar_cuda_gemm_fits(size_t m, size_t n, size_t k, size_t lda, size_t ldb,
                                       size_t ldc) {
  return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
         ldc <= INT_MAX;
}

/* ---- cuda_lt.c ---- */

/* linear_act through one cuBLASLt matmul with the bias (and ReLU) in its epilogue, when d->lt_use
 * is set, the call has a bias, act is none or ReLU and cuBLASLt has an algorithm for the shape:
 * then *done is 1 and the status the matmul's. Otherwise *done is 0 (status CLPAR_OK unless the
 * device could not be made current or host memory ran out) and the caller runs the plain path. */
clpar_status clpar_cuda_lt_linear(cuda_dev *d, clpar_act_kind act, size_t m, size_t n, size_t k,
                                  clpar_bref x, clpar_bref w, clpar_bref bias, clpar_bref out,
                                  int *done);
/* Frees the device's cuBLASLt handle, workspace and cache (the device's destroy, stream drained).
 */
void clpar_cuda_lt_release(cuda_dev *d);
/* Frees the cuBLASLt workspace (workspace_trim, the stream drained); the next matmul makes it
 * again. */
clpar_status clpar_cuda_lt_trim(cuda_dev *d);
/* The matmuls the device ran through cuBLASLt (for tests). */
uint64_t clpar_cuda_lt_runs(const void *dev);

/* A buffer reference as a pointer to its first float. */
static inline float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

/* nll's labels: int32 elements. */
static inline const int32_t *at_i32(clpar_bref r) {
  return (const int32_t *)r.buf + r.off;
}

/* ---- the table's entries defined outside cuda_backend.c ---- */
#define CLPAR_CUDA_ENTRY_DECL_(name) \
  clpar_status clpar_cuda_entry_##name(void *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
/* cuda_op.c */
CLPAR_CUDA_ENTRY_DECL_(profile)
CLPAR_CUDA_ENTRY_DECL_(profile_read)
/* cuda_memory.c */
CLPAR_CUDA_ENTRY_DECL_(alloc)
CLPAR_CUDA_ENTRY_DECL_(release)
CLPAR_CUDA_ENTRY_DECL_(event_record)
CLPAR_CUDA_ENTRY_DECL_(event_query)
CLPAR_CUDA_ENTRY_DECL_(event_then)
CLPAR_CUDA_ENTRY_DECL_(event_free)
CLPAR_CUDA_ENTRY_DECL_(host_alloc)
CLPAR_CUDA_ENTRY_DECL_(host_free)
CLPAR_CUDA_ENTRY_DECL_(write)
CLPAR_CUDA_ENTRY_DECL_(read)
CLPAR_CUDA_ENTRY_DECL_(copy)
CLPAR_CUDA_ENTRY_DECL_(finish)
CLPAR_CUDA_ENTRY_DECL_(peer_access)
CLPAR_CUDA_ENTRY_DECL_(copy_peer)
/* cuda_elementwise.c */
CLPAR_CUDA_ENTRY_DECL_(fill)
CLPAR_CUDA_ENTRY_DECL_(binary)
CLPAR_CUDA_ENTRY_DECL_(scale)
CLPAR_CUDA_ENTRY_DECL_(sum_rows)
CLPAR_CUDA_ENTRY_DECL_(broadcast_rows)
CLPAR_CUDA_ENTRY_DECL_(reduce_sum)
CLPAR_CUDA_ENTRY_DECL_(expand)
CLPAR_CUDA_ENTRY_DECL_(unary)
CLPAR_CUDA_ENTRY_DECL_(unary_backward)
CLPAR_CUDA_ENTRY_DECL_(bias_act)
CLPAR_CUDA_ENTRY_DECL_(bias_act_backward)
CLPAR_CUDA_ENTRY_DECL_(softmax)
CLPAR_CUDA_ENTRY_DECL_(softmax_backward)
CLPAR_CUDA_ENTRY_DECL_(pick)
CLPAR_CUDA_ENTRY_DECL_(nll)
CLPAR_CUDA_ENTRY_DECL_(nll_backward)
CLPAR_CUDA_ENTRY_DECL_(sgd_step)
CLPAR_CUDA_ENTRY_DECL_(adam_step)
CLPAR_CUDA_ENTRY_DECL_(workspace_bytes)
CLPAR_CUDA_ENTRY_DECL_(workspace_trim)
/* cuda_gemm.c */
CLPAR_CUDA_ENTRY_DECL_(gemm)
CLPAR_CUDA_ENTRY_DECL_(gemm_batched)
/* cuda_conv.c */
CLPAR_CUDA_ENTRY_DECL_(im2col)
CLPAR_CUDA_ENTRY_DECL_(col2im)
CLPAR_CUDA_ENTRY_DECL_(swap01)
CLPAR_CUDA_ENTRY_DECL_(maxpool)
CLPAR_CUDA_ENTRY_DECL_(maxpool_backward)
CLPAR_CUDA_ENTRY_DECL_(avgpool)
CLPAR_CUDA_ENTRY_DECL_(avgpool_backward)
CLPAR_CUDA_ENTRY_DECL_(bn_stats)
CLPAR_CUDA_ENTRY_DECL_(bn_apply)
CLPAR_CUDA_ENTRY_DECL_(bn_backward_sums)
CLPAR_CUDA_ENTRY_DECL_(bn_backward)
/* cuda_tensor_ops.c */
CLPAR_CUDA_ENTRY_DECL_(strided_copy)
CLPAR_CUDA_ENTRY_DECL_(pointwise)
CLPAR_CUDA_ENTRY_DECL_(mask_upper)
CLPAR_CUDA_ENTRY_DECL_(argmax)
CLPAR_CUDA_ENTRY_DECL_(nll_ignore)
CLPAR_CUDA_ENTRY_DECL_(nll_ignore_backward)
CLPAR_CUDA_ENTRY_DECL_(xent)
CLPAR_CUDA_ENTRY_DECL_(xent_backward)
/* cuda_layers.c */
CLPAR_CUDA_ENTRY_DECL_(embedding)
CLPAR_CUDA_ENTRY_DECL_(embedding_backward)
CLPAR_CUDA_ENTRY_DECL_(layernorm)
CLPAR_CUDA_ENTRY_DECL_(layernorm_backward)
CLPAR_CUDA_ENTRY_DECL_(dropout_mask)
/* cuda_half.c */
CLPAR_CUDA_ENTRY_DECL_(half_convert)
/* cuda_half_gemm.c */
CLPAR_CUDA_ENTRY_DECL_(gemm_half)
CLPAR_CUDA_ENTRY_DECL_(supports_op)
#define cuda_profile clpar_cuda_entry_profile
#define cuda_workspace_bytes clpar_cuda_entry_workspace_bytes
#define cuda_workspace_trim clpar_cuda_entry_workspace_trim
#define cuda_profile_read clpar_cuda_entry_profile_read
#define cuda_alloc clpar_cuda_entry_alloc
#define cuda_release clpar_cuda_entry_release
#define cuda_event_record clpar_cuda_entry_event_record
#define cuda_event_query clpar_cuda_entry_event_query
#define cuda_event_then clpar_cuda_entry_event_then
#define cuda_event_free clpar_cuda_entry_event_free
#define cuda_host_alloc clpar_cuda_entry_host_alloc
#define cuda_host_free clpar_cuda_entry_host_free
#define cuda_write clpar_cuda_entry_write
#define cuda_read clpar_cuda_entry_read
#define cuda_copy clpar_cuda_entry_copy
#define cuda_finish clpar_cuda_entry_finish
#define cuda_peer_access clpar_cuda_entry_peer_access
#define cuda_copy_peer clpar_cuda_entry_copy_peer
#define cuda_fill clpar_cuda_entry_fill
#define cuda_binary clpar_cuda_entry_binary
#define cuda_scale clpar_cuda_entry_scale
#define cuda_sum_rows clpar_cuda_entry_sum_rows
#define cuda_broadcast_rows clpar_cuda_entry_broadcast_rows
#define cuda_reduce_sum clpar_cuda_entry_reduce_sum
#define cuda_expand clpar_cuda_entry_expand
#define cuda_unary clpar_cuda_entry_unary
#define cuda_unary_backward clpar_cuda_entry_unary_backward
#define cuda_bias_act clpar_cuda_entry_bias_act
#define cuda_bias_act_backward clpar_cuda_entry_bias_act_backward
#define cuda_softmax clpar_cuda_entry_softmax
#define cuda_softmax_backward clpar_cuda_entry_softmax_backward
#define cuda_pick clpar_cuda_entry_pick
#define cuda_nll clpar_cuda_entry_nll
#define cuda_nll_backward clpar_cuda_entry_nll_backward
#define cuda_sgd_step clpar_cuda_entry_sgd_step
#define cuda_adam_step clpar_cuda_entry_adam_step
#define cuda_gemm clpar_cuda_entry_gemm
#define cuda_gemm_batched clpar_cuda_entry_gemm_batched
#define cuda_im2col clpar_cuda_entry_im2col
#define cuda_col2im clpar_cuda_entry_col2im
#define cuda_swap01 clpar_cuda_entry_swap01
#define cuda_maxpool clpar_cuda_entry_maxpool
#define cuda_maxpool_backward clpar_cuda_entry_maxpool_backward
#define cuda_avgpool clpar_cuda_entry_avgpool
#define cuda_avgpool_backward clpar_cuda_entry_avgpool_backward
#define cuda_bn_stats clpar_cuda_entry_bn_stats
#define cuda_bn_apply clpar_cuda_entry_bn_apply
#define cuda_bn_backward_sums clpar_cuda_entry_bn_backward_sums
#define cuda_bn_backward clpar_cuda_entry_bn_backward
#define cuda_strided_copy clpar_cuda_entry_strided_copy
#define cuda_pointwise clpar_cuda_entry_pointwise
#define cuda_mask_upper clpar_cuda_entry_mask_upper
#define cuda_argmax clpar_cuda_entry_argmax
#define cuda_nll_ignore clpar_cuda_entry_nll_ignore
#define cuda_xent clpar_cuda_entry_xent
#define cuda_xent_backward clpar_cuda_entry_xent_backward
#define cuda_nll_ignore_backward clpar_cuda_entry_nll_ignore_backward
#define cuda_embedding clpar_cuda_entry_embedding
#define cuda_embedding_backward clpar_cuda_entry_embedding_backward
#define cuda_layernorm clpar_cuda_entry_layernorm
#define cuda_layernorm_backward clpar_cuda_entry_layernorm_backward
#define cuda_dropout_mask clpar_cuda_entry_dropout_mask
#define cuda_half_convert clpar_cuda_entry_half_convert
#define cuda_gemm_half clpar_cuda_entry_gemm_half
#define cuda_supports_op clpar_cuda_entry_supports_op

#endif
