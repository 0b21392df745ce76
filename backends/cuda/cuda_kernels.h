/* cuda_kernels.h — the launchers of clpar's own CUDA kernels (kernels/cuda/, one family per
 * .cu file), declared with C linkage so that the backend (backends/cuda/cuda_backend.c) stays
 * plain C11 and only the .cu files need nvcc.
 *
 * Every launcher enqueues on stream and returns without waiting; the cudaError_t it returns
 * reports a bad launch (configuration, no kernel image for this GPU), not the kernel's
 * outcome, which surfaces at the next synchronizing call. Pointers already include the
 * element offsets. */
#ifndef CLPAR_CUDA_KERNELS_H
#define CLPAR_CUDA_KERNELS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = value, i < n (kernels/cuda/fill.cu) */
cudaError_t clpar_cuda_fill(cudaStream_t stream, float *out, size_t n, float value);

/* cudaSuccess when the current device can run clpar's kernels; cudaErrorNoKernelImageForDevice
 * (or similar) when the build's architectures do not cover it (kernels/cuda/fill.cu). */
cudaError_t clpar_cuda_kernel_image_check(void);

/* out[r,c] = a[r,c] (op) b[b_rows == 1 ? 0 : r, c]; kind is a clpar_binary_kind
 * (kernels/cuda/binary.cu). out may alias a or b. */
cudaError_t clpar_cuda_binary(cudaStream_t stream, int kind, size_t rows, size_t cols,
                              const float *a, const float *b, size_t b_rows, float *out);

/* out[i] = alpha * a[i] (kernels/cuda/scale.cu); out may alias a. */
cudaError_t clpar_cuda_scale(cudaStream_t stream, size_t n, float alpha, const float *a,
                             float *out);

/* out[c] = sum over r < rows of a[r, c] (kernels/cuda/sum_rows.cu) */
cudaError_t clpar_cuda_sum_rows(cudaStream_t stream, size_t rows, size_t cols, const float *a,
                                float *out);

#ifdef __cplusplus
}
#endif
#endif
