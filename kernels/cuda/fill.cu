/* fill.cu — the fill kernel of the CUDA backend: out[i] = value. The backend uses
 * cudaMemsetAsync instead when value is +0.0f (all bits zero), so this runs for the rest.
 * Being the simplest kernel, it is also the one the probe asks about to learn whether the
 * build has code (SASS or PTX) for a device. */
#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned block_size = 256;
/* Grid-stride loops make any cap correct; this one keeps every SM of a large GPU busy. */
constexpr size_t max_blocks = 65535;

__global__ void fill_kernel(float *out, size_t n, float value) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = value;
}

}  // namespace

extern "C" cudaError_t clpar_cuda_fill(cudaStream_t stream, float *out, size_t n, float value) {
  if (n == 0) return cudaSuccess;
  size_t blocks = (n + block_size - 1) / block_size;
  if (blocks > max_blocks) blocks = max_blocks;
  /* Drop an error left by an earlier runtime call on this thread, so that the check below
   * reports this launch only. */
  (void)cudaGetLastError();
  fill_kernel<<<(unsigned)blocks, block_size, 0, stream>>>(out, n, value);
  return cudaGetLastError();
}

/* All kernels are compiled for the same architectures, so one kernel stands for all.
 * cudaFuncGetAttributes loads the kernel's module for the current device (lazy loading
 * included), which fails when no image fits the device. */
extern "C" cudaError_t clpar_cuda_kernel_image_check(void) {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, fill_kernel);
}
