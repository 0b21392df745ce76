/* host_conv.h — the host backend's convolution, pooling and batch-norm entries
 * (backends/host/host_conv.c), named here for host_backend.c's table. */
#ifndef CLPAR_HOST_CONV_H
#define CLPAR_HOST_CONV_H

#include "backend.h"

#define CLPAR_HOST_CONV_DECL_(name, kind, required) \
  clpar_status clpar_host_##name(void *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
CLPAR_HOST_CONV_DECL_(im2col, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(col2im, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(swap01, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(max_pool2d, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(max_pool2d_backward, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(avg_pool2d_adaptive, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(avg_pool2d_adaptive_backward, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(bn_stats, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(bn_apply, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(bn_backward_reduce, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(bn_backward_apply, QUEUE, 1)
#undef CLPAR_HOST_CONV_DECL_

#define host_im2col clpar_host_im2col
#define host_col2im clpar_host_col2im
#define host_swap01 clpar_host_swap01
#define host_max_pool2d clpar_host_max_pool2d
#define host_max_pool2d_backward clpar_host_max_pool2d_backward
#define host_avg_pool2d_adaptive clpar_host_avg_pool2d_adaptive
#define host_avg_pool2d_adaptive_backward clpar_host_avg_pool2d_adaptive_backward
#define host_bn_stats clpar_host_bn_stats
#define host_bn_apply clpar_host_bn_apply
#define host_bn_backward_reduce clpar_host_bn_backward_reduce
#define host_bn_backward_apply clpar_host_bn_backward_apply

#endif
