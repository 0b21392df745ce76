/* broadcast_rows.cu — the row-broadcast kernel of the CUDA backend: out[r, c] = a[c], one row
 * repeated rows times. It is the backward of sum_rows (sum_rows.cu), so every loss goes
 * through it: clpar_sum reduces a [numel, 1] column, whose gradient is a scalar broadcast to
 * numel rows of one column.
 *
 * A flat grid-stride loop over the output serves every shape, that tall single column
 * included (a 2-D grid with a thread per column would leave all but one thread of a block
 * idle there). The column of a flat index is i % cols; as in binary.cu, the index is 32-bit
 * whenever the output is small enough, because 64-bit division is emulated on the GPU, and a
 * single column needs no division at all. */
#include <stdint.h>

#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned block_size = 256;
constexpr size_t max_blocks = 65535; /* grid-stride loop: any cap is correct */

template <typename Index>
__global__ void broadcast_rows_kernel(Index n, Index cols, const float *a, float *out) {
  Index stride = (Index)gridDim.x * blockDim.x;
  for (Index i = (Index)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = a[i % cols];
}

/* cols == 1: every element is a[0]. */
template <typename Index>
__global__ void broadcast_scalar_kernel(Index n, const float *a, float *out) {
  Index stride = (Index)gridDim.x * blockDim.x;
  float value = a[0];
  for (Index i = (Index)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = value;
}

template <typename Index>
void launch(cudaStream_t stream, unsigned blocks, size_t n, size_t cols, const float *a,
            float *out) {
  if (cols == 1)
    broadcast_scalar_kernel<Index><<<blocks, block_size, 0, stream>>>((Index)n, a, out);
  else
    broadcast_rows_kernel<Index><<<blocks, block_size, 0, stream>>>((Index)n, (Index)cols, a, out);
}

}  // namespace

extern "C" cudaError_t clpar_cuda_broadcast_rows(cudaStream_t stream, size_t rows, size_t cols,
                                                 const float *a, float *out) {
  size_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  size_t blocks = (n + block_size - 1) / block_size;
  if (blocks > max_blocks) blocks = max_blocks;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  /* The 32-bit index must also hold i + stride without wrapping. */
  if (n + blocks * block_size <= UINT32_MAX)
    launch<uint32_t>(stream, (unsigned)blocks, n, cols, a, out);
  else
    launch<size_t>(stream, (unsigned)blocks, n, cols, a, out);
  return cudaGetLastError();
}
