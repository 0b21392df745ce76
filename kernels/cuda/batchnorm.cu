/* batchnorm.cu — batch norm over x [n, c, p] per channel (backend.h): statistics in two passes
 * with the running update, the normalization, and the backward's per-channel sums and input
 * gradient. Reductions: one block per channel, each thread summing a strided part in double
 * (a channel may hold hundreds of thousands of elements), then a tree in shared memory. */
#include "cuda/cuda_kernels.h"
#include "launch.cuh"

namespace {

using namespace clpar_launch;

/* The block's sum of v, in every thread. */
__device__ double block_sum(double v, double *scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
  }
  double r = scratch[0];
  __syncthreads();
  return r;
}

__device__ size_t ch_elem(size_t ch, size_t e, size_t c, size_t p) {
  return (e / p) * c * p + ch * p + e % p;
}

__global__ void stats_kernel(size_t n, size_t c, size_t p, const float *x, float *mean, float *var,
                             float *rmean, float *rvar, float momentum) {
  __shared__ double scratch[block_size];
  size_t ch = blockIdx.x, M = n * p;
  double s = 0.0;
  for (size_t e = threadIdx.x; e < M; e += blockDim.x) s += x[ch_elem(ch, e, c, p)];
  double mu = block_sum(s, scratch) / (double)M;
  double d = 0.0;
  for (size_t e = threadIdx.x; e < M; e += blockDim.x) {
    double t = x[ch_elem(ch, e, c, p)] - mu;
    d += t * t;
  }
  double sq = block_sum(d, scratch);
  if (threadIdx.x == 0) {
    mean[ch] = (float)mu;
    var[ch] = (float)(sq / (double)M);
    if (rmean) {
      rmean[ch] = (float)((1.0 - momentum) * rmean[ch] + momentum * mu);
      rvar[ch] = (float)((1.0 - momentum) * rvar[ch] + momentum * sq / (double)(M - 1));
    }
  }
}

__global__ void apply_kernel(size_t n, size_t c, size_t p, const float *x, const float *mean,
                             const float *var, const float *weight, const float *bias, float eps,
                             float *y) {
  size_t total = n * c * p;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t ch = e / p % c;
    float mul = rsqrtf(var[ch] + eps) * (weight ? weight[ch] : 1.0f);
    y[e] = (x[e] - mean[ch]) * mul + (bias ? bias[ch] : 0.0f);
  }
}

__global__ void backward_reduce_kernel(size_t n, size_t c, size_t p, const float *x, const float *g,
                                       const float *mean, const float *var, float eps, float *sum_g,
                                       float *sum_gxhat) {
  __shared__ double scratch[block_size];
  size_t ch = blockIdx.x, M = n * p;
  double a = 0.0, b = 0.0, mu = mean[ch];
  for (size_t e = threadIdx.x; e < M; e += blockDim.x) {
    size_t k = ch_elem(ch, e, c, p);
    a += g[k];
    b += (double)g[k] * (x[k] - mu);
  }
  double sg = block_sum(a, scratch), sgx = block_sum(b, scratch);
  if (threadIdx.x == 0) {
    sum_g[ch] = (float)sg;
    sum_gxhat[ch] = (float)(sgx * rsqrt((double)var[ch] + eps));
  }
}

__global__ void backward_apply_kernel(size_t n, size_t c, size_t p, const float *x, const float *g,
                                      const float *mean, const float *var, const float *weight,
                                      float eps, const float *sum_g, const float *sum_gxhat,
                                      int training, float *dx) {
  size_t total = n * c * p;
  float M = (float)(n * p);
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t ch = e / p % c;
    float istd = rsqrtf(var[ch] + eps), mul = istd * (weight ? weight[ch] : 1.0f);
    float mg = training ? sum_g[ch] / M : 0.0f, mgx = training ? sum_gxhat[ch] / M : 0.0f;
    dx[e] = mul * (g[e] - mg - (x[e] - mean[ch]) * istd * mgx);
  }
}

}  // namespace

extern "C" cudaError_t clpar_cuda_bn_stats(cudaStream_t stream, size_t n, size_t c, size_t p,
                                           const float *x, float *mean, float *var,
                                           float *running_mean, float *running_var,
                                           float momentum) {
  if (c > 0x7fffffff) return cudaErrorInvalidValue;
  (void)cudaGetLastError();
  stats_kernel<<<(unsigned)c, block_size, 0, stream>>>(n, c, p, x, mean, var, running_mean,
                                                       running_var, momentum);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_bn_apply(cudaStream_t stream, size_t n, size_t c, size_t p,
                                           const float *x, const float *mean, const float *var,
                                           const float *weight, const float *bias, float eps,
                                           float *y) {
  (void)cudaGetLastError();
  apply_kernel<<<blocks_for(n * c * p), block_size, 0, stream>>>(n, c, p, x, mean, var, weight,
                                                                 bias, eps, y);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_bn_backward_sums(cudaStream_t stream, size_t n, size_t c,
                                                     size_t p, const float *x, const float *g,
                                                     const float *mean, const float *var, float eps,
                                                     float *sum_g, float *sum_gxhat) {
  if (c > 0x7fffffff) return cudaErrorInvalidValue;
  (void)cudaGetLastError();
  backward_reduce_kernel<<<(unsigned)c, block_size, 0, stream>>>(n, c, p, x, g, mean, var, eps,
                                                                 sum_g, sum_gxhat);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_bn_backward(cudaStream_t stream, size_t n, size_t c,
                                                    size_t p, const float *x, const float *g,
                                                    const float *mean, const float *var,
                                                    const float *weight, float eps,
                                                    const float *sum_g, const float *sum_gxhat,
                                                    int training, float *dx) {
  (void)cudaGetLastError();
  backward_apply_kernel<<<blocks_for(n * c * p), block_size, 0, stream>>>(
      n, c, p, x, g, mean, var, weight, eps, sum_g, sum_gxhat, training, dx);
  return cudaGetLastError();
}
