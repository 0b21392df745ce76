/* tensor_ops.cu — the tensor ops of transformers (backend.h: strided_copy, pointwise,
 * mask_upper, argmax, nll_ignore, nll_ignore_backward), mirroring
 * kernels/opencl/tensor_ops.cl. Grid-stride loops over 64-bit indices. */
#include <math.h>

#include "cuda/cuda_kernels.h"
#include "launch.cuh"

namespace {

using namespace clpar_launch;

#define GRID_LOOP(e, total) \
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < (total); \
       e += (size_t)gridDim.x * blockDim.x)

__global__ void strided_copy_kernel(clpar_strided_geom g, const uint32_t *in, uint32_t *out,
                                    size_t total) {
  GRID_LOOP(e, total) {
    int64_t rest = (int64_t)e, io = 0, oo = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
      int64_t i = rest % g.shape[d];
      rest /= g.shape[d];
      io += i * g.in_stride[d];
      oo += i * g.out_stride[d];
    }
    out[oo] = in[io];
  }
}

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_C 0.044715f

__device__ float pw_forward(int kind, float v, float p) {
  if (kind == CLPAR_PW_LOG) return logf(v);
  if (kind == CLPAR_PW_POW) return powf(v, p);
  if (kind == CLPAR_PW_GELU_TANH)
    return 0.5f * v * (1.0f + tanhf(SQRT_2_OVER_PI * (v + GELU_C * v * v * v)));
  return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
}

__device__ float pw_derivative(int kind, float v, float p) {
  if (kind == CLPAR_PW_LOG) return 1.0f / v;
  if (kind == CLPAR_PW_POW) return p == 0.0f ? 0.0f : p * powf(v, p - 1.0f);
  if (kind == CLPAR_PW_GELU_TANH) {
    float t = tanhf(SQRT_2_OVER_PI * (v + GELU_C * v * v * v));
    return 0.5f * (1.0f + t) +
           0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * v * v);
  }
  return 0.5f * (1.0f + erff(v * 0.7071067811865476f)) +
         v * expf(-0.5f * v * v) * 0.3989422804014327f;
}

__global__ void pointwise_kernel(int kind, size_t n, float p, const float *x, const float *g,
                                 float *out) {
  GRID_LOOP(i, n) {
    out[i] = g ? g[i] * pw_derivative(kind, x[i], p) : pw_forward(kind, x[i], p);
  }
}

__global__ void mask_upper_kernel(size_t rows, size_t cols, size_t total, int64_t diagonal,
                                  float value, const float *a, float *out) {
  GRID_LOOP(e, total) {
    size_t br = e / cols, j = e - br * cols;
    int64_t i = (int64_t)(br % rows);
    out[e] = (int64_t)j - i >= diagonal ? value : a[e];
  }
}

__global__ void argmax_kernel(size_t rows, size_t cols, const float *a, int64_t *out) {
  GRID_LOOP(r, rows) {
    const float *row = a + r * cols;
    size_t best = 0;
    for (size_t c = 1; c < cols && !isnan(row[best]); c++)
      if (row[c] > row[best] || isnan(row[c])) best = c;
    out[r] = (int64_t)best;
  }
}

__device__ int64_t target_at(const void *idx, int idx64, size_t r) {
  return idx64 ? ((const int64_t *)idx)[r] : (int64_t)((const int32_t *)idx)[r];
}

__global__ void nll_ignore_kernel(size_t rows, size_t cols, int idx64, int64_t ignore,
                                  const float *a, const void *idx, float *loss, float *weight) {
  GRID_LOOP(r, rows) {
    int64_t t = target_at(idx, idx64, r);
    weight[r] = t == ignore ? 0.0f : 1.0f;
    loss[r] = t == ignore                     ? 0.0f
              : t >= 0 && (size_t)t < cols ? -a[r * cols + (size_t)t]
                                            : nanf("");
  }
}

__global__ void nll_ignore_backward_kernel(size_t rows, size_t cols, int idx64, int64_t ignore,
                                           const void *idx, const float *scale, float *out) {
  GRID_LOOP(e, rows * cols) {
    size_t r = e / cols, c = e - r * cols;
    int64_t t = target_at(idx, idx64, r);
    out[e] = t != ignore && (int64_t)c == t ? -scale[0] : 0.0f;
  }
}

}  // namespace

extern "C" cudaError_t clpar_cuda_strided_copy(cudaStream_t stream, clpar_strided_geom g,
                                               const uint32_t *in, uint32_t *out) {
  size_t total = 1;
  for (int d = 0; d < g.ndim; d++) total *= (size_t)g.shape[d];
  (void)cudaGetLastError();
  strided_copy_kernel<<<blocks_for(total), block_size, 0, stream>>>(g, in, out, total);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_pointwise(cudaStream_t stream, int kind, size_t n, float p,
                                            const float *x, const float *g, float *out) {
  (void)cudaGetLastError();
  pointwise_kernel<<<blocks_for(n), block_size, 0, stream>>>(kind, n, p, x, g, out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_mask_upper(cudaStream_t stream, size_t batch, size_t rows,
                                             size_t cols, int64_t diagonal, float value,
                                             const float *a, float *out) {
  size_t total = batch * rows * cols;
  (void)cudaGetLastError();
  mask_upper_kernel<<<blocks_for(total), block_size, 0, stream>>>(rows, cols, total, diagonal,
                                                                   value, a, out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_argmax(cudaStream_t stream, size_t rows, size_t cols,
                                         const float *a, int64_t *out) {
  (void)cudaGetLastError();
  argmax_kernel<<<blocks_for(rows), block_size, 0, stream>>>(rows, cols, a, out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_nll_ignore(cudaStream_t stream, size_t rows, size_t cols,
                                             int idx64, int64_t ignore, const float *a,
                                             const void *idx, float *loss, float *weight) {
  (void)cudaGetLastError();
  nll_ignore_kernel<<<blocks_for(rows), block_size, 0, stream>>>(rows, cols, idx64, ignore, a, idx,
                                                                 loss, weight);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_nll_ignore_backward(cudaStream_t stream, size_t rows,
                                                      size_t cols, int idx64, int64_t ignore,
                                                      const void *idx, const float *scale,
                                                      float *out) {
  (void)cudaGetLastError();
  nll_ignore_backward_kernel<<<blocks_for(rows * cols), block_size, 0, stream>>>(
      rows, cols, idx64, ignore, idx, scale, out);
  return cudaGetLastError();
}
