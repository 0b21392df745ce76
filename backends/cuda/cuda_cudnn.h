/* cuda_cudnn.h — the CUDA backend's whole convolutions through cuDNN (cuda_cudnn.c), built with
 * CLPAR_HAVE_CUDNN. cuDNN is opened at run time (dlopen), so that the library loads, and its
 * CUDA devices run the plain path, on a machine without cuDNN. */
#ifndef CLPAR_CUDA_CUDNN_H
#define CLPAR_CUDA_CUDNN_H

#ifdef CLPAR_HAVE_CUDNN
#include "cuda/cuda_internal.h"

/* CLPAR_CUDA_CUDNN (unset or "1": cuDNN where it loads, "0": the plain path; *asked set when
 * the variable says "1") and CLPAR_CUDA_TF32 (unset or "0": full fp32, "1": TF32 tensor cores
 * allowed). Anything else is CLPAR_ERROR_INVALID_ARGUMENT naming the variable. */
clpar_status clpar_cudnn_settings(int *use, int *asked, int *tf32);
/* Opens cuDNN once per process: 1 when it can be used; 0 with *why saying why not. */
int clpar_cudnn_load(const char **why);
/* Frees the device's handle, cached descriptors and workspace (the device's destroy, with its
 * stream drained); the next convolution makes them again. */
void clpar_cudnn_release(cuda_dev *d);
/* Frees the workspace (workspace_trim, the stream drained); the next convolution makes it
 * again. */
clpar_status clpar_cudnn_trim(cuda_dev *d);

CLPAR_CUDA_ENTRY_DECL_(conv2d)
CLPAR_CUDA_ENTRY_DECL_(conv2d_backward)
#endif

#endif
