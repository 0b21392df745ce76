/* pool.cu — max pooling with its int32 argmax and PyTorch's adaptive average pooling, forward
 * and backward (backend.h). Backward passes gather: one thread per input element sums what
 * reaches it, so no atomics are needed and the sums are the same every run. */
#include <math.h>

#include "cuda/cuda_kernels.h"
#include "launch.cuh"

namespace {

using namespace clpar_launch;

#define GRID_LOOP(e, total)                                                     \
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < (total); \
       e += (int64_t)gridDim.x * blockDim.x)

__global__ void max_pool_kernel(clpar_conv_geom g, const float *x, float *y, int32_t *idx) {
  int64_t P = g.oh * g.ow;
  GRID_LOOP(o, g.n * P) {
    int64_t b = o / P, p = o - b * P, oy = p / g.ow, ox = p - oy * g.ow;
    int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw, best = -1;
    const float *plane = x + b * g.h * g.w;
    float m = -INFINITY;
    for (int64_t yy = y0 < 0 ? 0 : y0; yy < y0 + g.kh && yy < g.h; yy++)
      for (int64_t xx = x0 < 0 ? 0 : x0; xx < x0 + g.kw && xx < g.w; xx++) {
        float v = plane[yy * g.w + xx];
        if (best < 0 || (!isnan(m) && (v > m || isnan(v)))) {
          m = v;
          best = yy * g.w + xx;
        }
      }
    y[o] = m;
    idx[o] = (int32_t)best;
  }
}

__device__ void windows_of(int64_t i, int64_t k, int64_t s, int64_t pad, int64_t out, int64_t *lo,
                           int64_t *hi) {
  int64_t num = i + pad - k + 1;
  *lo = num <= 0 ? 0 : (num + s - 1) / s;
  int64_t h = (i + pad) / s + 1;
  *hi = h < out ? h : out;
}

__global__ void max_pool_backward_kernel(clpar_conv_geom g, const float *dy, const int32_t *idx,
                                         float *dx) {
  int64_t HW = g.h * g.w, P = g.oh * g.ow;
  GRID_LOOP(e, g.n * HW) {
    int64_t b = e / HW, q = e - b * HW, y = q / g.w, xx = q - y * g.w, oy0, oy1, ox0, ox1;
    windows_of(y, g.kh, g.sh, g.ph, g.oh, &oy0, &oy1);
    windows_of(xx, g.kw, g.sw, g.pw, g.ow, &ox0, &ox1);
    float sum = 0.0f;
    for (int64_t oy = oy0; oy < oy1; oy++)
      for (int64_t ox = ox0; ox < ox1; ox++)
        if (idx[b * P + oy * g.ow + ox] == q) sum += dy[b * P + oy * g.ow + ox];
    dx[e] = sum;
  }
}

__device__ int64_t bin_start(int64_t i, int64_t in, int64_t out) {
  return i * in / out;
}
__device__ int64_t bin_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

__global__ void adaptive_kernel(clpar_conv_geom g, const float *x, float *y) {
  int64_t P = g.oh * g.ow;
  GRID_LOOP(o, g.n * P) {
    int64_t b = o / P, p = o - b * P, oy = p / g.ow, ox = p - oy * g.ow;
    int64_t y0 = bin_start(oy, g.h, g.oh), y1 = bin_end(oy, g.h, g.oh);
    int64_t x0 = bin_start(ox, g.w, g.ow), x1 = bin_end(ox, g.w, g.ow);
    const float *plane = x + b * g.h * g.w;
    float sum = 0.0f;
    for (int64_t yy = y0; yy < y1; yy++)
      for (int64_t xx = x0; xx < x1; xx++) sum += plane[yy * g.w + xx];
    y[o] = sum / (float)((y1 - y0) * (x1 - x0));
  }
}

__global__ void adaptive_backward_kernel(clpar_conv_geom g, const float *dy, float *dx) {
  int64_t HW = g.h * g.w;
  GRID_LOOP(e, g.n * HW) {
    int64_t b = e / HW, q = e - b * HW, y = q / g.w, xx = q - y * g.w;
    int64_t oy0 = y * g.oh / g.h, ox0 = xx * g.ow / g.w;
    while (oy0 > 0 && bin_end(oy0 - 1, g.h, g.oh) > y) oy0--;
    while (ox0 > 0 && bin_end(ox0 - 1, g.w, g.ow) > xx) ox0--;
    float sum = 0.0f;
    for (int64_t oy = oy0; oy < g.oh && bin_start(oy, g.h, g.oh) <= y; oy++)
      for (int64_t ox = ox0; ox < g.ow && bin_start(ox, g.w, g.ow) <= xx; ox++) {
        int64_t cnt = (bin_end(oy, g.h, g.oh) - bin_start(oy, g.h, g.oh)) *
                      (bin_end(ox, g.w, g.ow) - bin_start(ox, g.w, g.ow));
        sum += dy[(b * g.oh + oy) * g.ow + ox] / (float)cnt;
      }
    dx[e] = sum;
  }
}

}  // namespace

extern "C" cudaError_t clpar_cuda_maxpool(cudaStream_t stream, clpar_conv_geom g, const float *x,
                                             float *y, int32_t *idx) {
  (void)cudaGetLastError();
  max_pool_kernel<<<blocks_for((size_t)(g.n * g.oh * g.ow)), block_size, 0, stream>>>(g, x, y, idx);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_maxpool_backward(cudaStream_t stream, clpar_conv_geom g,
                                                      const float *dy, const int32_t *idx,
                                                      float *dx) {
  (void)cudaGetLastError();
  max_pool_backward_kernel<<<blocks_for((size_t)(g.n * g.h * g.w)), block_size, 0, stream>>>(
      g, dy, idx, dx);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_avgpool(cudaStream_t stream, clpar_conv_geom g,
                                                      const float *x, float *y) {
  (void)cudaGetLastError();
  adaptive_kernel<<<blocks_for((size_t)(g.n * g.oh * g.ow)), block_size, 0, stream>>>(g, x, y);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_avgpool_backward(cudaStream_t stream,
                                                               clpar_conv_geom g, const float *dy,
                                                               float *dx) {
  (void)cudaGetLastError();
  adaptive_backward_kernel<<<blocks_for((size_t)(g.n * g.h * g.w)), block_size, 0, stream>>>(g, dy,
                                                                                             dx);
  return cudaGetLastError();
}
