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
    out[i] = Kind == CLPAR_UNARY_RELU ? (saved[i] > 0.0f ? g[i] : 0.0f) /* a select, as PyTorch */
                                      : g[i] * derivative<Kind>(saved[i]);
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

/* ---- the fused Linear epilogues (backend.h: bias_act, bias_act_backward) ---- */

namespace {

constexpr unsigned tile = 32;

/* f of clpar_act_kind, with forward<>'s formulas; none is the identity. */
__device__ __forceinline__ float act_forward(int act, float x) {
  if (act == CLPAR_ACT_RELU) return forward<CLPAR_UNARY_RELU>(x);
  if (act == CLPAR_ACT_SIGMOID) return forward<CLPAR_UNARY_SIGMOID>(x);
  if (act == CLPAR_ACT_TANH) return forward<CLPAR_UNARY_TANH>(x);
  return x;
}

/* f' from the output y (relu: y > 0 iff x > 0). */
__device__ __forceinline__ float act_derivative(int act, float y) {
  if (act == CLPAR_ACT_RELU) return derivative<CLPAR_UNARY_RELU>(y);
  if (act == CLPAR_ACT_SIGMOID) return derivative<CLPAR_UNARY_SIGMOID>(y);
  if (act == CLPAR_ACT_TANH) return derivative<CLPAR_UNARY_TANH>(y);
  return 1.0f;
}

__global__ void bias_act_kernel(int act, size_t rows, size_t cols, const float *a,
                                const float *bias, float *out) {
  size_t n = rows * cols, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float x = a[i] + bias[i % cols]; /* rounded to float, then f */
    out[i] = act_forward(act, x);
  }
}

/* A block owns 32 adjacent columns, as sum_rows_kernel (sum_rows.cu): thread row y handles
 * rows y, y + 32, ..., writes d = g f'(y) and sums it; the 32 partial sums of a column are
 * added by the same tree, so db gets sum_rows' bits for the wide matrices. */
__global__ void bias_act_backward_kernel(int act, size_t rows, size_t cols, const float *g,
                                         const float *y, float *out, float *db, int accumulate) {
  __shared__ float partial[tile][tile + 1];
  size_t c = (size_t)blockIdx.x * tile + threadIdx.x;
  float acc = 0.0f;
  if (c < cols)
    for (size_t r = threadIdx.y; r < rows; r += tile) {
      size_t i = r * cols + c;
      float d = act == CLPAR_ACT_NONE   ? g[i]
                : act == CLPAR_ACT_RELU ? (y[i] > 0.0f ? g[i] : 0.0f)
                                        : g[i] * act_derivative(act, y[i]);
      if (out) out[i] = d;
      acc += d;
    }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = tile / 2; half > 0; half /= 2) {
    if (threadIdx.y < half)
      partial[threadIdx.y][threadIdx.x] += partial[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (db && threadIdx.y == 0 && c < cols)
    db[c] = accumulate ? db[c] + partial[0][threadIdx.x] : partial[0][threadIdx.x];
}

}  // namespace

extern "C" cudaError_t clpar_cuda_bias_act(cudaStream_t stream, clpar_act_kind act, size_t rows,
                                           size_t cols, const float *a, const float *bias,
                                           float *out) {
  if (act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  bias_act_kernel<<<grid_for(rows * cols), block_size, 0, stream>>>((int)act, rows, cols, a, bias,
                                                                    out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_bias_act_backward(cudaStream_t stream, clpar_act_kind act,
                                                    size_t rows, size_t cols, const float *g,
                                                    const float *y, float *out, float *db,
                                                    int accumulate) {
  if (act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0 || (!out && !db)) return cudaSuccess;
  (void)cudaGetLastError();
  size_t blocks = (cols + tile - 1) / tile;
  dim3 block(tile, tile);
  bias_act_backward_kernel<<<(unsigned)blocks, block, 0, stream>>>((int)act, rows, cols, g, y, out,
                                                                   db, accumulate);
  return cudaGetLastError();
}
