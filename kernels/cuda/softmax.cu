/* softmax.cu — row-wise softmax and log-softmax of the CUDA backend and their gradients, and
 * the negative log-likelihood loss that follows them (cross-entropy is log_softmax + nll), and
 * softmax cross-entropy fused (xent and its backward, one pass over each row each way).
 *
 * The threads of a row stride over its columns and combine their partial maxima and sums
 * with warp shuffles: a row of up to narrow_cols columns gets one warp (a block holds several
 * rows: a classifier's ten classes do not leave a whole block idle), a wider row (a large
 * vocabulary) a whole block. The row's maximum is subtracted before exp, so that large
 * inputs do not overflow.
 *
 * Sums are accumulated in float, not in double as the host reference does: double is 1/32
 * to 1/64 of the float rate on most GPUs, and each thread adds only cols / threads terms,
 * all of the same sign, before a pairwise tree, so the float error stays within a few ulps
 * of the host's results. Thread t of a row reads and writes only columns c = t (mod threads),
 * so out may alias the input. */
#include <math.h>

#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned warp = 32;
constexpr unsigned full_mask = 0xffffffffu;
constexpr size_t max_blocks = 65535; /* grid-stride loops over rows: any cap is correct */
/* A warp per row up to this width: at most 32 columns per lane. */
constexpr size_t narrow_cols = 1024;
constexpr unsigned narrow_block = 256; /* 8 rows of a warp each */
constexpr unsigned wide_block = 512;   /* one row */
constexpr unsigned nll_block = 256;

template <bool Max>
__device__ __forceinline__ float combine(float x, float y) {
  return Max ? fmaxf(x, y) : x + y;
}

/* Xor butterfly: every lane ends with the same value, bit for bit, since IEEE max and + are
 * commutative and lanes i and i ^ o combine the same pair. */
template <bool Max>
__device__ __forceinline__ float warp_reduce(float v) {
  for (unsigned o = warp / 2; o > 0; o /= 2) v = combine<Max>(v, __shfl_xor_sync(full_mask, v, o));
  return v;
}

/* The max or sum over the Threads threads of a row, left in each of them. For a whole block,
 * lane 0 of each warp posts its warp's result and every thread folds the posts in the same
 * order; the trailing barrier lets the next call overwrite part. */
template <unsigned Threads, bool Max>
__device__ __forceinline__ float row_reduce(float v) {
  v = warp_reduce<Max>(v);
  if constexpr (Threads == warp) {
    return v;
  } else {
    __shared__ float part[Threads / warp];
    if (threadIdx.x % warp == 0) part[threadIdx.x / warp] = v;
    __syncthreads();
    v = part[0];
    for (unsigned w = 1; w < Threads / warp; w++) v = combine<Max>(v, part[w]);
    __syncthreads();
    return v;
  }
}

/* The rows of a block: Threads == warp puts narrow_block / warp rows in a block. The row loop
 * is uniform over the threads of a row, as the reductions need. */
template <unsigned Threads>
struct row_group {
  static constexpr unsigned rows_per_block = Threads == warp ? narrow_block / warp : 1;
  static __device__ __forceinline__ size_t first() {
    return (size_t)blockIdx.x * rows_per_block + threadIdx.x / Threads;
  }
  static __device__ __forceinline__ size_t stride() {
    return (size_t)gridDim.x * rows_per_block;
  }
  static __device__ __forceinline__ unsigned lane() {
    return threadIdx.x % Threads;
  }
};

template <unsigned Threads>
__global__ void softmax_kernel(size_t rows, size_t cols, int take_log, const float *a, float *out) {
  using G = row_group<Threads>;
  for (size_t row = G::first(); row < rows; row += G::stride()) {
    const float *x = a + row * cols;
    float *y = out + row * cols;
    float m = -INFINITY;
    for (size_t c = G::lane(); c < cols; c += Threads) m = fmaxf(m, x[c]);
    m = row_reduce<Threads, true>(m);
    float sum = 0.0f;
    for (size_t c = G::lane(); c < cols; c += Threads) sum += expf(x[c] - m);
    sum = row_reduce<Threads, false>(sum);
    if (take_log) {
      float lse = logf(sum);
      for (size_t c = G::lane(); c < cols; c += Threads) y[c] = (x[c] - m) - lse;
    } else {
      for (size_t c = G::lane(); c < cols; c += Threads) y[c] = expf(x[c] - m) / sum;
    }
  }
}

/* softmax: out = y * (g - sum(g * y)); log-softmax: out = g - exp(y) * sum(g). */
template <unsigned Threads>
__global__ void softmax_backward_kernel(size_t rows, size_t cols, int take_log, const float *y,
                                        const float *g, float *out) {
  using G = row_group<Threads>;
  for (size_t row = G::first(); row < rows; row += G::stride()) {
    const float *yr = y + row * cols, *gr = g + row * cols;
    float *o = out + row * cols;
    float dot = 0.0f;
    if (take_log)
      for (size_t c = G::lane(); c < cols; c += Threads) dot += gr[c];
    else
      for (size_t c = G::lane(); c < cols; c += Threads) dot += gr[c] * yr[c];
    dot = row_reduce<Threads, false>(dot);
    if (take_log)
      for (size_t c = G::lane(); c < cols; c += Threads) o[c] = gr[c] - expf(yr[c]) * dot;
    else
      for (size_t c = G::lane(); c < cols; c += Threads) o[c] = yr[c] * (gr[c] - dot);
  }
}

/* Row r's target, int64 or int32. */
__device__ __forceinline__ int64_t target_of(const void *idx, int idx64, size_t r) {
  return idx64 ? ((const int64_t *)idx)[r] : (int64_t)((const int32_t *)idx)[r];
}

/* The row's maximum and the log of its sum of exp(x - max), as softmax_kernel's log-softmax
 * reduces them, so the fused entries give the composition's bits. */
template <unsigned Threads>
__device__ __forceinline__ void row_lse(const float *x, size_t cols, float *m, float *lse) {
  using G = row_group<Threads>;
  float mx = -INFINITY;
  for (size_t c = G::lane(); c < cols; c += Threads) mx = fmaxf(mx, x[c]);
  mx = row_reduce<Threads, true>(mx);
  float sum = 0.0f;
  for (size_t c = G::lane(); c < cols; c += Threads) sum += expf(x[c] - mx);
  sum = row_reduce<Threads, false>(sum);
  *m = mx;
  *lse = logf(sum);
}

/* Softmax cross-entropy (backend.h's xent): loss = -logp[t], weight 1; an ignored row 0 and
 * 0; a target out of range NaN and 1. The branch is uniform over a row's threads. */
template <unsigned Threads>
__global__ void xent_kernel(size_t rows, size_t cols, int idx64, int64_t ignore, const float *a,
                            const void *idx, float *loss, float *weight) {
  using G = row_group<Threads>;
  for (size_t row = G::first(); row < rows; row += G::stride()) {
    int64_t t = target_of(idx, idx64, row);
    float value = t == ignore ? 0.0f : nanf("");
    if (t != ignore && t >= 0 && (uint64_t)t < cols) {
      const float *x = a + row * cols;
      float m, lse;
      row_lse<Threads>(x, cols, &m, &lse);
      value = -((x[t] - m) - lse);
    }
    if (G::lane() == 0) {
      loss[row] = value;
      weight[row] = t == ignore ? 0.0f : 1.0f;
    }
  }
}

/* Its gradient: s = count ? g[0] / count[0] : alpha * g[0]; out[r, c] = d - exp(logp) * -s
 * with d = c == t ? -s : 0, as softmax_backward of nll_ignore_backward's rows computes it;
 * 0 for an ignored row or a target out of range. */
template <unsigned Threads>
__global__ void xent_backward_kernel(size_t rows, size_t cols, int idx64, int64_t ignore,
                                     const float *a, const void *idx, const float *g,
                                     const float *count, float alpha, float *out) {
  using G = row_group<Threads>;
  const float s = count ? g[0] / count[0] : alpha * g[0], dot = -s;
  for (size_t row = G::first(); row < rows; row += G::stride()) {
    int64_t t = target_of(idx, idx64, row);
    float *o = out + row * cols;
    if (t == ignore || t < 0 || (uint64_t)t >= cols) {
      for (size_t c = G::lane(); c < cols; c += Threads) o[c] = 0.0f;
      continue;
    }
    const float *x = a + row * cols;
    float m, lse;
    row_lse<Threads>(x, cols, &m, &lse);
    for (size_t c = G::lane(); c < cols; c += Threads) {
      float logp = (x[c] - m) - lse, d = (int64_t)c == t ? -s : 0.0f;
      o[c] = d - expf(logp) * dot;
    }
  }
}

/* out[r] = -a[r, labels[r]]: one thread per row. Labels are int32 class indices, checked by
 * the core to lie in 0 .. cols-1. */
__global__ void nll_kernel(size_t rows, size_t cols, const float *a, const int32_t *labels,
                           float *out) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride)
    out[r] = -a[r * cols + (size_t)labels[r]];
}

/* out[r, labels[r]] = -g[r]; the rest of out was zeroed before. */
__global__ void nll_scatter_kernel(size_t rows, size_t cols, const int32_t *labels, const float *g,
                                   float *out) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride)
    out[r * cols + (size_t)labels[r]] = -g[r];
}

unsigned grid_for(size_t items, size_t per_block) {
  size_t blocks = (items + per_block - 1) / per_block;
  return (unsigned)(blocks > max_blocks ? max_blocks : blocks);
}

}  // namespace

extern "C" cudaError_t clpar_cuda_softmax(cudaStream_t stream, int log, size_t rows, size_t cols,
                                          const float *a, float *out) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  int take_log = log != 0;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  if (cols <= narrow_cols)
    softmax_kernel<warp>
        <<<grid_for(rows, row_group<warp>::rows_per_block), narrow_block, 0, stream>>>(
            rows, cols, take_log, a, out);
  else
    softmax_kernel<wide_block>
        <<<grid_for(rows, 1), wide_block, 0, stream>>>(rows, cols, take_log, a, out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_softmax_backward(cudaStream_t stream, int log, size_t rows,
                                                   size_t cols, const float *y, const float *g,
                                                   float *out) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  int take_log = log != 0;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  if (cols <= narrow_cols)
    softmax_backward_kernel<warp>
        <<<grid_for(rows, row_group<warp>::rows_per_block), narrow_block, 0, stream>>>(
            rows, cols, take_log, y, g, out);
  else
    softmax_backward_kernel<wide_block>
        <<<grid_for(rows, 1), wide_block, 0, stream>>>(rows, cols, take_log, y, g, out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_nll(cudaStream_t stream, size_t rows, size_t cols, const float *a,
                                      const int32_t *labels, float *out) {
  if (rows == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  nll_kernel<<<grid_for(rows, nll_block), nll_block, 0, stream>>>(rows, cols, a, labels, out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_nll_backward(cudaStream_t stream, size_t rows, size_t cols,
                                               const int32_t *labels, const float *g, float *out) {
  if (rows == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  nll_scatter_kernel<<<grid_for(rows, nll_block), nll_block, 0, stream>>>(rows, cols, labels, g,
                                                                          out);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_xent(cudaStream_t stream, size_t rows, size_t cols, int idx64,
                                       int64_t ignore, const float *a, const void *idx, float *loss,
                                       float *weight) {
  if (rows == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  if (cols <= narrow_cols)
    xent_kernel<warp><<<grid_for(rows, row_group<warp>::rows_per_block), narrow_block, 0, stream>>>(
        rows, cols, idx64, ignore, a, idx, loss, weight);
  else
    xent_kernel<wide_block><<<grid_for(rows, 1), wide_block, 0, stream>>>(rows, cols, idx64, ignore,
                                                                          a, idx, loss, weight);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_xent_backward(cudaStream_t stream, size_t rows, size_t cols,
                                                int idx64, int64_t ignore, const float *a,
                                                const void *idx, const float *g, const float *count,
                                                float alpha, float *out) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  if (cols <= narrow_cols)
    xent_backward_kernel<warp>
        <<<grid_for(rows, row_group<warp>::rows_per_block), narrow_block, 0, stream>>>(
            rows, cols, idx64, ignore, a, idx, g, count, alpha, out);
  else
    xent_backward_kernel<wide_block><<<grid_for(rows, 1), wide_block, 0, stream>>>(
        rows, cols, idx64, ignore, a, idx, g, count, alpha, out);
  return cudaGetLastError();
}
