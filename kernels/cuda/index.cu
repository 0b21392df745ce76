/* index.cu — one element per row at an int32 index (backend.h's pick): the primitive the core
 * composes nll and its backward from. One thread per row; indices are checked by the caller
 * to lie in 0 .. cols-1. */
#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned block_size = 256;
constexpr size_t max_blocks = 65535;

__global__ void pick_kernel(int scatter, size_t rows, size_t cols, const int32_t *idx,
                            const float *a, float *out) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride) {
    size_t k = r * cols + (size_t)idx[r];
    if (scatter)
      out[k] = a[r];
    else
      out[r] = a[k];
  }
}

}  // namespace

extern "C" cudaError_t clpar_cuda_pick(cudaStream_t stream, int scatter, size_t rows, size_t cols,
                                       const int32_t *idx, const float *a, float *out) {
  if (rows == 0) return cudaSuccess;
  size_t blocks = (rows + block_size - 1) / block_size;
  if (blocks > max_blocks) blocks = max_blocks;
  (void)cudaGetLastError(); /* report this launch only (see fill.cu) */
  pick_kernel<<<(unsigned)blocks, block_size, 0, stream>>>(scatter, rows, cols, idx, a, out);
  return cudaGetLastError();
}
