/* host_dnnl.h — the host backend's entries through oneDNN, built with CLPAR_HAVE_DNNL:
 * whole convolutions (host_dnnl.c), batch norm (host_dnnl_norm.c) and adaptive average
 * pooling (host_dnnl_pool.c). Each takes the argument combinations oneDNN computes as
 * backend.h defines them and hands the others to its plain loop (host_conv.c). */
#ifndef CLPAR_HOST_DNNL_H
#define CLPAR_HOST_DNNL_H

#include "backend.h"

#ifdef CLPAR_HAVE_DNNL
#define CLPAR_HOST_DNNL_DECL_(name) \
  clpar_status clpar_host_dnnl_##name(void *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
CLPAR_HOST_DNNL_DECL_(conv2d)
CLPAR_HOST_DNNL_DECL_(conv2d_backward)
CLPAR_HOST_DNNL_DECL_(bn_stats)
CLPAR_HOST_DNNL_DECL_(bn_apply)
CLPAR_HOST_DNNL_DECL_(bn_backward_sums)
CLPAR_HOST_DNNL_DECL_(bn_backward)
CLPAR_HOST_DNNL_DECL_(avgpool)
CLPAR_HOST_DNNL_DECL_(avgpool_backward)
/* The work buffers' bytes; their release (host_dnnl_core.c). */
CLPAR_HOST_DNNL_DECL_(workspace_bytes)
CLPAR_HOST_DNNL_DECL_(workspace_trim)
#undef CLPAR_HOST_DNNL_DECL_
/* The largest spatial size (values per image and channel) whose batch norm goes to oneDNN
 * (host_dnnl_norm.c); larger ones run the plain loops, faster there. */
extern size_t clpar_host_dnnl_bn_max_p;
/* Frees the engine, the stream, the cached primitives and the work buffers (the host
 * device's destroy); the next call makes them again. */
void clpar_host_dnnl_release(void);
#endif

#endif
