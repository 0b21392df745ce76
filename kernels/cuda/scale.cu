/* scale.cu — the scale kernel of the CUDA backend: out[i] = alpha * a[i]. out may be a
 * itself: each element is read before it is written, by the same thread. */
#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned block_size = 256;
constexpr size_t max_blocks = 65535; /* grid-stride loop: any cap is correct */

__global__ void scale_kernel(size_t n, float alpha, const float *a, float *out) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = alpha * a[i];
}

}  // namespace

extern "C" cudaError_t clpar_cuda_scale(cudaStream_t stream, size_t n, float alpha, const float *a,
                                        float *out) {
  if (n == 0) return cudaSuccess;
  size_t blocks = (n + block_size - 1) / block_size;
  if (blocks > max_blocks) blocks = max_blocks;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  scale_kernel<<<(unsigned)blocks, block_size, 0, stream>>>(n, alpha, a, out);
  return cudaGetLastError();
}
