/* half.cu — the half_convert entry (backend.h): float32 to and from bfloat16 and float16,
 * bit for bit as the host's scalar conversions (src/half.c) and kernels/opencl/half.cl.
 * bfloat16 is integer work; float16 rounds with __float2half_rn (to nearest even, subnormals
 * and overflow to Inf as IEEE says), a NaN made a quiet NaN of its sign by bits as the host
 * does. Offsets count 32-bit words: 16-bit element i is at 2 off + i. */
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/cuda_kernels.h"
#include "launch.cuh"

namespace {

using namespace clpar_launch;

#define GRID_LOOP(e, total) \
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < (total); \
       e += (size_t)gridDim.x * blockDim.x)

__device__ uint16_t to_bf16(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ uint16_t to_fp16(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x1ffu));
  return __half_as_ushort(__float2half_rn(__uint_as_float(u)));
}

__device__ uint32_t from_fp16(uint32_t h) {
  uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return sign | 0x7f800000u | (m << 13);
  if (e == 0) {
    if (m == 0) return sign;
    e = 113;
    while (!(m & 0x400u)) m <<= 1, e--;
    return sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  return sign | ((e + 112) << 23) | (m << 13);
}

__global__ void to_half_kernel(int bf16, size_t n, const uint32_t *x, uint16_t *out) {
  GRID_LOOP(i, n) out[i] = bf16 ? to_bf16(x[i]) : to_fp16(x[i]);
}

__global__ void from_half_kernel(int bf16, size_t n, const uint16_t *x, uint32_t *out) {
  GRID_LOOP(i, n) out[i] = bf16 ? (uint32_t)x[i] << 16 : from_fp16(x[i]);
}

}  // namespace

extern "C" cudaError_t clpar_cuda_half_convert(cudaStream_t stream, int to_half, int bf16,
                                               size_t n, void *x, void *out) {
  (void)cudaGetLastError();
  if (to_half)
    to_half_kernel<<<blocks_for(n), block_size, 0, stream>>>(bf16, n, (const uint32_t *)x,
                                                             (uint16_t *)out);
  else
    from_half_kernel<<<blocks_for(n), block_size, 0, stream>>>(bf16, n, (const uint16_t *)x,
                                                               (uint32_t *)out);
  return cudaGetLastError();
}
