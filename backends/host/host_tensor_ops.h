/* host_tensor_ops.h — the host backend's tensor-op entries for transformers
 * (backends/host/host_tensor_ops.c), named here for host_backend.c's table. */
#ifndef CLPAR_HOST_TENSOR_OPS_H
#define CLPAR_HOST_TENSOR_OPS_H

#include "backend.h"

#define CLPAR_HOST_TOPS_DECL_(name) \
  clpar_status clpar_host_##name(void *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
CLPAR_HOST_TOPS_DECL_(strided_copy)
CLPAR_HOST_TOPS_DECL_(pointwise)
CLPAR_HOST_TOPS_DECL_(mask_upper)
CLPAR_HOST_TOPS_DECL_(argmax)
CLPAR_HOST_TOPS_DECL_(nll_ignore)
CLPAR_HOST_TOPS_DECL_(nll_ignore_backward)
CLPAR_HOST_TOPS_DECL_(xent)
CLPAR_HOST_TOPS_DECL_(xent_backward)
/* host_layers.c */
CLPAR_HOST_TOPS_DECL_(embedding)
CLPAR_HOST_TOPS_DECL_(embedding_backward)
CLPAR_HOST_TOPS_DECL_(layernorm)
CLPAR_HOST_TOPS_DECL_(layernorm_backward)
CLPAR_HOST_TOPS_DECL_(dropout_mask)
/* host_half.c */
CLPAR_HOST_TOPS_DECL_(half_convert)
/* gemm_half through the host's gemm entry; the calls that ran (for tests). */
clpar_status clpar_host_gemm_half(clpar_be_gemm_fn gemm,
                                  void *dev CLPAR_BE_ARGS_gemm_half(CLPAR_BE_PARAM_));
uint64_t clpar_host_gemm_half_runs(void);
/* host_optim.c */
CLPAR_HOST_TOPS_DECL_(sgd_step)
CLPAR_HOST_TOPS_DECL_(adam_step)
#undef CLPAR_HOST_TOPS_DECL_

/* host_vmath.c: GELU (erf form) of x, or g times its derivative when g is not NULL, over the
 * first elements of [0, n) in whole vector groups; returns how many it did (0 where the CPU
 * or the build has no vector math). */
size_t clpar_host_gelu_erf_vec(const float *x, const float *g, float *out, size_t n);

#define host_strided_copy clpar_host_strided_copy
#define host_pointwise clpar_host_pointwise
#define host_mask_upper clpar_host_mask_upper
#define host_argmax clpar_host_argmax
#define host_nll_ignore clpar_host_nll_ignore
#define host_nll_ignore_backward clpar_host_nll_ignore_backward
#define host_xent clpar_host_xent
#define host_xent_backward clpar_host_xent_backward
#define host_sgd_step clpar_host_sgd_step
#define host_adam_step clpar_host_adam_step
#define host_embedding clpar_host_embedding
#define host_embedding_backward clpar_host_embedding_backward
#define host_layernorm clpar_host_layernorm
#define host_layernorm_backward clpar_host_layernorm_backward
#define host_dropout_mask clpar_host_dropout_mask
#define host_half_convert clpar_host_half_convert

#endif
