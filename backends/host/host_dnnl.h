/* host_dnnl.h — the host backend's whole-convolution entries through oneDNN
 * (backends/host/host_dnnl.c), built with CLPAR_HAVE_DNNL. */
#ifndef CLPAR_HOST_DNNL_H
#define CLPAR_HOST_DNNL_H

#include "backend.h"

#ifdef CLPAR_HAVE_DNNL
clpar_status clpar_host_dnnl_conv2d(void *dev CLPAR_BE_ARGS_conv2d(CLPAR_BE_PARAM_));
clpar_status clpar_host_dnnl_conv2d_backward(
    void *dev CLPAR_BE_ARGS_conv2d_backward(CLPAR_BE_PARAM_));
/* Frees the engine, the stream, the cached primitives and the work buffers (the host
 * device's destroy); the next call makes them again. */
void clpar_host_dnnl_release(void);
#endif

#endif
