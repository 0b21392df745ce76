/* sum_rows.cu — the column-sum kernels of the CUDA backend: out[c] = sum over r of a[r, c]
 * (the gradient of a broadcast bias, and every loss's clpar_sum, which sums a [numel, 1]
 * column).
 *
 * Wide matrices (32 columns or more): a block owns 32 adjacent columns; its 32 x 32 threads
 * read 32 consecutive floats of a row per warp (coalesced), each thread row y summing rows y,
 * y + 32, ..., and the 32 partial sums of a column are then added in shared memory.
 *
 * Narrow matrices (fewer than 32 columns) would give that kernel one block, most of whose
 * threads idle, for any number of rows. They take two passes instead: the rows are cut into
 * up to narrow_max_chunks chunks, one block each; a block of cols * k threads reads its chunk
 * as one contiguous run of floats (coalesced, and thread t always meets column t % cols), and
 * adds its k partial sums per column in shared memory into one partial row of a scratch
 * matrix. The second pass is the same kernel with one block over that [chunks, cols] matrix.
 *
 * Either way every sum is added in an order fixed by the shape alone (no atomics), so the
 * result is the same from run to run. */
#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned tile = 32;
constexpr size_t narrow_cols = 32;        /* fewer columns than this take the narrow kernel */
constexpr unsigned narrow_threads = 256;  /* at most, per block of the narrow kernel */
constexpr size_t narrow_chunk_min = 8192; /* floats a chunk reads at least: 32 per thread */
/* Enough blocks to fill the largest GPUs (132 SMs x 8 blocks of 256), and few enough that the
 * second pass is one block reading at most 1024 x 31 floats. */
constexpr size_t narrow_max_chunks = 1024;

__global__ void sum_rows_kernel(size_t rows, size_t cols, const float *a, float *out) {
  __shared__ float partial[tile][tile + 1]; /* +1: no bank conflicts on the column reads */
  size_t c = (size_t)blockIdx.x * tile + threadIdx.x;
  float acc = 0.0f;
  if (c < cols)
    for (size_t r = threadIdx.y; r < rows; r += tile) acc += a[r * cols + c];
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  /* Tree over the 32 partial sums of each column: pairs stay close in magnitude. */
  for (unsigned half = tile / 2; half > 0; half /= 2) {
    if (threadIdx.y < half)
      partial[threadIdx.y][threadIdx.x] += partial[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < cols) out[c] = partial[0][threadIdx.x];
}

/* Block b sums rows [b * chunk_rows, (b + 1) * chunk_rows) of a (rows x cols, cols < 32)
 * into out[b * cols + c]. blockDim.x is a multiple of cols, and a chunk starts at a row, so
 * thread t reads only column t % cols. */
__global__ void sum_rows_narrow_kernel(size_t rows, size_t cols, size_t chunk_rows, const float *a,
                                       float *out) {
  __shared__ float partial[narrow_threads];
  unsigned t = threadIdx.x, per_col = blockDim.x / (unsigned)cols;
  size_t first = (size_t)blockIdx.x * chunk_rows;
  size_t last = first + chunk_rows < rows ? first + chunk_rows : rows;
  float acc = 0.0f;
  for (size_t i = first * cols + t; i < last * cols; i += blockDim.x) acc += a[i];
  partial[t] = acc;
  __syncthreads();
  /* Tree over the per_col partial sums of column t % cols (threads t, t + cols, ...): the
   * upper half of the n left is added onto the lower, whatever the parity of n. */
  unsigned j = t / (unsigned)cols;
  for (unsigned n = per_col; n > 1;) {
    unsigned half = (n + 1) / 2;
    if (j + half < n) partial[t] += partial[t + half * (unsigned)cols];
    __syncthreads();
    n = half;
  }
  if (t < cols) out[(size_t)blockIdx.x * cols + t] = partial[t];
}

/* How many chunks the narrow kernel cuts rows x cols into (1: one pass, no scratch). */
size_t narrow_chunks(size_t rows, size_t cols) {
  size_t min_rows = (narrow_chunk_min + cols - 1) / cols;
  size_t chunks = (rows + min_rows - 1) / min_rows;
  return chunks < narrow_max_chunks ? chunks : narrow_max_chunks;
}

cudaError_t launch_narrow(cudaStream_t stream, size_t rows, size_t cols, size_t chunks,
                          const float *a, float *out) {
  size_t chunk_rows = (rows + chunks - 1) / chunks;
  unsigned threads = narrow_threads / (unsigned)cols * (unsigned)cols;
  sum_rows_narrow_kernel<<<(unsigned)chunks, threads, 0, stream>>>(rows, cols, chunk_rows, a, out);
  return cudaGetLastError();
}

}  // namespace

extern "C" size_t clpar_cuda_sum_rows_scratch(size_t rows, size_t cols) {
  if (rows == 0 || cols == 0 || cols >= narrow_cols) return 0;
  size_t chunks = narrow_chunks(rows, cols);
  return chunks > 1 ? chunks * cols : 0;
}

extern "C" cudaError_t clpar_cuda_sum_rows(cudaStream_t stream, size_t rows, size_t cols,
                                           const float *a, float *out, float *scratch) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  if (cols < narrow_cols) {
    size_t chunks = narrow_chunks(rows, cols);
    if (chunks == 1) return launch_narrow(stream, rows, cols, 1, a, out);
    if (!scratch) return cudaErrorInvalidValue;
    cudaError_t e = launch_narrow(stream, rows, cols, chunks, a, scratch);
    /* In stream order: the second pass starts when every partial row is written. */
    return e == cudaSuccess ? launch_narrow(stream, chunks, cols, 1, scratch, out) : e;
  }
  size_t blocks = (cols + tile - 1) / tile;
  /* The grid's x dimension allows 2^31 - 1 blocks: 6.8e10 columns, more than memory holds. */
  dim3 block(tile, tile);
  sum_rows_kernel<<<(unsigned)blocks, block, 0, stream>>>(rows, cols, a, out);
  return cudaGetLastError();
}
