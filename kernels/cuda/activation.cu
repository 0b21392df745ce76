/* activation.cu — the element-wise unary ops of the CUDA backend (relu, sigmoid, tanh, and the
 * forward-only exp, sqrt and negation) and the activations' gradients, with the formulas of
 * backend.h's clpar_unary_kind, as the host reference (backends/host/host_backend.c) computes
 * them.
 *
 * The kind is a template parameter, so each kernel's loop has no branch on it. out may be a
 * (forward) or g (backward): each element is read before it is written, by the same thread,
 * so no pointer is __restrict__. expf and tanhf are the accurate functions (the build does
 * not use --use_fast_math), so results stay within a few ulps of the host's; sqrtf is
 * correctly rounded (-prec-sqrt=true, nvcc's default) and negation is exact, as on an IEEE
 * host. */
#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned block_size = 256;
constexpr size_t max_blocks = 65535; /* grid-stride loop: any cap is correct */

/* relu is x > 0 ? x : 0 as on the host, which maps NaN to 0 (fmaxf would too). */
template <int Kind>
__device__ __forceinline__ float forward(float x) {
  if (Kind == CLPAR_UNARY_RELU) return x > 0.0f ? x : 0.0f;
  if (Kind == CLPAR_UNARY_SIGMOID) return 1.0f / (1.0f + expf(-x));
  if (Kind == CLPAR_UNARY_EXP) return expf(x);
  if (Kind == CLPAR_UNARY_SQRT) return sqrtf(x); /* NaN below 0 (IEEE sqrt) */
  if (Kind == CLPAR_UNARY_NEG) return -x;
  return tanhf(x);
}

/* f' from what backward keeps: the input x for relu (its gradient at 0 is 0, as in
 * PyTorch), the output y for sigmoid and tanh. exp, sqrt and negation have no backward
 * kernel: backend.h makes them forward only, and clpar_cuda_unary_backward refuses them. */
template <int Kind>
__device__ __forceinline__ float derivative(float saved) {
  if (Kind == CLPAR_UNARY_RELU) return saved > 0.0f ? 1.0f : 0.0f;
  if (Kind == CLPAR_UNARY_SIGMOID) return saved * (1.0f - saved);
  return 1.0f - saved * saved;
}

template <int Kind>
__global__ void unary_kernel(size_t n, const float *a, float *out) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = forward<Kind>(a[i]);
}

template <int Kind>
__global__ void unary_backward_kernel(size_t n, const float *g, const float *saved, float *out) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = g[i] * derivative<Kind>(saved[i]);
}

unsigned grid_for(size_t n) {
  size_t blocks = (n + block_size - 1) / block_size;
  return (unsigned)(blocks > max_blocks ? max_blocks : blocks);
}

}  // namespace

extern "C" cudaError_t clpar_cuda_unary(cudaStream_t stream, clpar_unary_kind kind, size_t n,
                                        const float *a, float *out) {
  if (n == 0) return cudaSuccess;
  unsigned blocks = grid_for(n);
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  switch (kind) {
    case CLPAR_UNARY_RELU:
      unary_kernel<CLPAR_UNARY_RELU><<<blocks, block_size, 0, stream>>>(n, a, out);
      break;
    case CLPAR_UNARY_SIGMOID:
      unary_kernel<CLPAR_UNARY_SIGMOID><<<blocks, block_size, 0, stream>>>(n, a, out);
      break;
    case CLPAR_UNARY_TANH:
      unary_kernel<CLPAR_UNARY_TANH><<<blocks, block_size, 0, stream>>>(n, a, out);
      break;
    case CLPAR_UNARY_EXP:
      unary_kernel<CLPAR_UNARY_EXP><<<blocks, block_size, 0, stream>>>(n, a, out);
      break;
    case CLPAR_UNARY_SQRT:
      unary_kernel<CLPAR_UNARY_SQRT><<<blocks, block_size, 0, stream>>>(n, a, out);
      break;
    case CLPAR_UNARY_NEG:
      unary_kernel<CLPAR_UNARY_NEG><<<blocks, block_size, 0, stream>>>(n, a, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_unary_backward(cudaStream_t stream, clpar_unary_kind kind,
                                                 size_t n, const float *g, const float *saved,
                                                 float *out) {
  if (n == 0) return cudaSuccess;
  unsigned blocks = grid_for(n);
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  switch (kind) {
    case CLPAR_UNARY_RELU:
      unary_backward_kernel<CLPAR_UNARY_RELU><<<blocks, block_size, 0, stream>>>(n, g, saved, out);
      break;
    case CLPAR_UNARY_SIGMOID:
      unary_backward_kernel<CLPAR_UNARY_SIGMOID>
          <<<blocks, block_size, 0, stream>>>(n, g, saved, out);
      break;
    case CLPAR_UNARY_TANH:
      unary_backward_kernel<CLPAR_UNARY_TANH><<<blocks, block_size, 0, stream>>>(n, g, saved, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
