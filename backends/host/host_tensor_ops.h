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
#undef CLPAR_HOST_TOPS_DECL_

#define host_strided_copy clpar_host_strided_copy
#define host_pointwise clpar_host_pointwise
#define host_mask_upper clpar_host_mask_upper
#define host_argmax clpar_host_argmax
#define host_nll_ignore clpar_host_nll_ignore
#define host_nll_ignore_backward clpar_host_nll_ignore_backward

#endif
