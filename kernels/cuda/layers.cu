/* layers.cu — the transformer layers' entries (backend.h: embedding, embedding_backward,
 * layernorm, layernorm_backward, dropout_mask), mirroring kernels/opencl/layers.cl: the same
 * loops and order of additions. Grid-stride loops over 64-bit indices. */
#include <math.h>

#include "cuda/cuda_kernels.h"
#include "launch.cuh"

namespace {

using namespace clpar_launch;

#define GRID_LOOP(e, total) \
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < (total); \
       e += (size_t)gridDim.x * blockDim.x)

__device__ int64_t index_at(const void *idx, int idx64, size_t i) {
  return idx64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

__global__ void embedding_kernel(size_t n, size_t num, size_t dim, int idx64, const void *idx,
                                 const float *w, float *out) {
  GRID_LOOP(e, n * dim) {
    size_t i = e / dim, c = e % dim;
    int64_t t = index_at(idx, idx64, i);
    out[e] = t >= 0 && (uint64_t)t < num ? w[(size_t)t * dim + c] : NAN;
  }
}

/* One thread per element of dw, its positions summed in increasing order (no atomics). */
__global__ void embedding_backward_kernel(size_t n, size_t num, size_t dim, int idx64,
                                          const void *idx, const float *g, float *dw) {
  GRID_LOOP(e, num * dim) {
    size_t v = e / dim, c = e % dim;
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
      if (index_at(idx, idx64, i) == (int64_t)v) s += g[i * dim + c];
    dw[e] = s;
  }
}

__global__ void layernorm_kernel(size_t rows, size_t cols, float eps, const float *x,
                                 const float *w, const float *b, float *y, float *mean,
                                 float *rstd) {
  GRID_LOOP(r, rows) {
    const float *row = x + r * cols;
    float s = 0.0f, v = 0.0f;
    for (size_t c = 0; c < cols; c++) s += row[c];
    float m = s / (float)cols;
    for (size_t c = 0; c < cols; c++) v += (row[c] - m) * (row[c] - m);
    float rs = 1.0f / sqrtf(v / (float)cols + eps);
    mean[r] = m;
    rstd[r] = rs;
    for (size_t c = 0; c < cols; c++) {
      float h = (row[c] - m) * rs;
      if (w) h *= w[c];
      y[r * cols + c] = b ? h + b[c] : h;
    }
  }
}

__global__ void layernorm_backward_dx_kernel(size_t rows, size_t cols, const float *x,
                                             const float *g, const float *mean,
                                             const float *rstd, const float *w, float *dx) {
  GRID_LOOP(r, rows) {
    const float *row = x + r * cols, *grow = g + r * cols;
    float m = mean[r], rs = rstd[r], sh = 0.0f, shx = 0.0f;
    for (size_t c = 0; c < cols; c++) {
      float h = w ? grow[c] * w[c] : grow[c];
      sh += h;
      shx += h * (row[c] - m) * rs;
    }
    float mh = sh / (float)cols, mhx = shx / (float)cols;
    for (size_t c = 0; c < cols; c++) {
      float h = w ? grow[c] * w[c] : grow[c];
      dx[r * cols + c] = rs * (h - mh - (row[c] - m) * rs * mhx);
    }
  }
}

__global__ void layernorm_backward_dwdb_kernel(size_t rows, size_t cols, const float *x,
                                               const float *g, const float *mean,
                                               const float *rstd, float *dw, float *db) {
  GRID_LOOP(c, cols) {
    float sw = 0.0f, sb = 0.0f;
    for (size_t r = 0; r < rows; r++) {
      float gv = g[r * cols + c];
      sw += gv * ((x[r * cols + c] - mean[r]) * rstd[r]);
      sb += gv;
    }
    if (dw) dw[c] = sw;
    if (db) db[c] = sb;
  }
}

__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void dropout_mask_kernel(size_t n, uint64_t seed, uint64_t offset, float p,
                                    float scale, float *out) {
  uint64_t s = splitmix64(seed);
  GRID_LOOP(i, n) {
    uint64_t h = splitmix64(s ^ ((offset + i) * 0xD1B54A32D192ED03ull));
    float u = (float)(h >> 40) * (1.0f / 16777216.0f);
    out[i] = u < p ? 0.0f : scale;
  }
}

}  // namespace

extern "C" cudaError_t clpar_cuda_embedding(cudaStream_t stream, size_t n, size_t num, size_t dim,
                                            int idx64, const void *idx, const float *w,
                                            float *out) {
  (void)cudaGetLastError();
  embedding_kernel<<<blocks_for(n * dim), block_size, 0, stream>>>(n, num, dim, idx64, idx, w,
                                                                  out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_embedding_backward(cudaStream_t stream, size_t n, size_t num,
                                                     size_t dim, int idx64, const void *idx,
                                                     const float *g, float *dw) {
  (void)cudaGetLastError();
  embedding_backward_kernel<<<blocks_for(num * dim), block_size, 0, stream>>>(n, num, dim, idx64,
                                                                             idx, g, dw);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_layernorm(cudaStream_t stream, size_t rows, size_t cols,
                                            float eps, const float *x, const float *w,
                                            const float *b, float *y, float *mean, float *rstd) {
  (void)cudaGetLastError();
  layernorm_kernel<<<blocks_for(rows), block_size, 0, stream>>>(rows, cols, eps, x, w, b, y, mean,
                                                               rstd);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_layernorm_backward(cudaStream_t stream, size_t rows,
                                                     size_t cols, const float *x, const float *g,
                                                     const float *mean, const float *rstd,
                                                     const float *w, float *dx, float *dw,
                                                     float *db) {
  (void)cudaGetLastError();
  if (dx)
    layernorm_backward_dx_kernel<<<blocks_for(rows), block_size, 0, stream>>>(rows, cols, x, g,
                                                                             mean, rstd, w, dx);
  if (dw || db)
    layernorm_backward_dwdb_kernel<<<blocks_for(cols), block_size, 0, stream>>>(
        rows, cols, x, g, mean, rstd, dw, db);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_dropout_mask(cudaStream_t stream, size_t n, uint64_t seed,
                                               uint64_t offset, float p, float scale,
                                               float *out) {
  (void)cudaGetLastError();
  dropout_mask_kernel<<<blocks_for(n), block_size, 0, stream>>>(n, seed, offset, p, scale, out);
  return cudaGetLastError();
}
