/* sum_rows.cu — the column-sum kernel of the CUDA backend: out[c] = sum over r of a[r, c]
 * (the gradient of a broadcast bias).
 *
 * A block owns 32 adjacent columns: its 32 x 32 threads read 32 consecutive floats of a row
 * per warp (coalesced), each thread row y summing rows y, y + 32, ..., and the 32 partial
 * sums of a column are then added in shared memory. One block writes each column, in a
 * fixed order, so the result is the same from run to run (no atomics). A tall matrix with
 * few columns gets few blocks; that is the price of determinism, and bias gradients are
 * rarely that shape. */
#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned tile = 32;

__global__ void sum_rows_kernel(size_t rows, size_t cols, const float *a, float *out) {
  __shared__ float partial[tile][tile + 1]; /* +1: no bank conflicts on the column reads */
  size_t c = (size_t)blockIdx.x * tile + threadIdx.x;
  float acc = 0.0f;
  if (c < cols)
    for (size_t r = threadIdx.y; r < rows; r += tile) acc += a[r * cols + c];
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  /* Tree over the 32 partial sums of each column: pairs stay close in magnitude. */
  for (unsigned half = tile / 2; half > 0; half /= 2) {
    if (threadIdx.y < half)
      partial[threadIdx.y][threadIdx.x] += partial[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < cols) out[c] = partial[0][threadIdx.x];
}

}  // namespace

extern "C" cudaError_t clpar_cuda_sum_rows(cudaStream_t stream, size_t rows, size_t cols,
                                           const float *a, float *out) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  size_t blocks = (cols + tile - 1) / tile;
  /* The grid's x dimension allows 2^31 - 1 blocks: 6.8e10 columns, more than memory holds. */
  dim3 block(tile, tile);
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  sum_rows_kernel<<<(unsigned)blocks, block, 0, stream>>>(rows, cols, a, out);
  return cudaGetLastError();
}
