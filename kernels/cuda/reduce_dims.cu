/* reduce_dims.cu — sums along dimensions and their broadcast back (clpar_sum_dims and its
 * gradient) for the CUDA backend. a is seen as [outer, red, inner], row-major.
 *
 * - A narrow inner (fewer than 16) with a long red (the H, W of an NCHW tensor): one block
 *   per output, its threads striding over r, then a tree in shared memory.
 * - Otherwise one thread per output, looping over r (a grid-stride loop over the outputs,
 *   so neighbouring threads read neighbouring addresses when inner is wide).
 * outer == 1 with a wide inner is sum_rows' shape: the backend sends it there (sum_rows.cu).
 * Every sum is added in an order fixed by the shape (no atomics). */
#include <stdint.h>

#include "cuda/cuda_kernels.h"
#include "launch.cuh"

namespace {

using namespace clpar_launch;
constexpr size_t narrow = 16, long_red = 64;

__global__ void reduce_sum_items_kernel(size_t outer, size_t red, size_t inner, const float *a,
                                        float *out) {
  size_t n = outer * inner, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
    size_t o = j / inner, i = j % inner;
    const float *p = a + o * red * inner + i;
    float acc = 0.0f;
    for (size_t r = 0; r < red; r++) acc += p[r * inner];
    out[j] = acc;
  }
}

/* Block g (grid-stride over the outputs) sums output g = o * inner + i. */
__global__ void reduce_sum_block_kernel(size_t outer, size_t red, size_t inner, const float *a,
                                        float *out) {
  __shared__ float part[block_size];
  for (size_t g = blockIdx.x; g < outer * inner; g += gridDim.x) {
    size_t o = g / inner, i = g % inner;
    const float *p = a + o * red * inner + i;
    float acc = 0.0f;
    for (size_t r = threadIdx.x; r < red; r += blockDim.x) acc += p[r * inner];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[g] = part[0];
    __syncthreads(); /* part is reused by the next output */
  }
}

__global__ void expand_kernel(size_t n, size_t red, size_t inner, const float *a, float *out) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
    out[j] = a[j / (red * inner) * inner + j % inner];
}


}  // namespace

extern "C" cudaError_t clpar_cuda_reduce_sum(cudaStream_t stream, size_t outer, size_t red,
                                             size_t inner, const float *a, float *out) {
  size_t n = outer * inner;
  if (n == 0 || red == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  if (inner < narrow && red >= long_red)
    reduce_sum_block_kernel<<<(unsigned)(n > max_blocks ? max_blocks : n), block_size, 0, stream>>>(
        outer, red, inner, a, out);
  else
    reduce_sum_items_kernel<<<blocks_for(n), block_size, 0, stream>>>(outer, red, inner, a, out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_expand(cudaStream_t stream, size_t outer, size_t red,
                                         size_t inner, const float *a, float *out) {
  size_t n = outer * red * inner;
  if (n == 0) return cudaSuccess;
  (void)cudaGetLastError();
  expand_kernel<<<blocks_for(n), block_size, 0, stream>>>(n, red, inner, a, out);
  return cudaGetLastError();
}
