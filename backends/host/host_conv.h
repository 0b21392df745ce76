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
CLPAR_HOST_CONV_DECL_(maxpool, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(maxpool_backward, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(avgpool, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(avgpool_backward, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(bn_stats, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(bn_apply, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(bn_backward_sums, QUEUE, 1)
CLPAR_HOST_CONV_DECL_(bn_backward, QUEUE, 1)
#undef CLPAR_HOST_CONV_DECL_

#define host_im2col clpar_host_im2col
#define host_col2im clpar_host_col2im
#define host_swap01 clpar_host_swap01
#define host_maxpool clpar_host_maxpool
#define host_maxpool_backward clpar_host_maxpool_backward
#define host_avgpool clpar_host_avgpool
#define host_avgpool_backward clpar_host_avgpool_backward
#define host_bn_stats clpar_host_bn_stats
#define host_bn_apply clpar_host_bn_apply
#define host_bn_backward_sums clpar_host_bn_backward_sums
#define host_bn_backward clpar_host_bn_backward

#endif
