/* binary.cu — the elementwise add/sub/mul/div kernels of the CUDA backend, with b either of a's
 * shape or one row broadcast over every row of a (a bias). out may alias a or b exactly,
 * so no pointer is declared __restrict__.
 *
 * The op and the broadcast are template parameters, so the inner loop has no branch. The
 * broadcast needs the column of a flat index (i % cols); 64-bit division is emulated on the
 * GPU and costs several times a 32-bit one, so the index type is 32-bit whenever the tensor
 * is small enough, which is nearly always. */
#include <stdint.h>

#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned block_size = 256;
constexpr size_t max_blocks = 65535; /* grid-stride loop: any cap is correct */

/* The values of clpar_binary_kind (backends/backend.h), as plain ints for the templates. */
enum {
  op_add = (int)CLPAR_BINARY_ADD,
  op_sub = (int)CLPAR_BINARY_SUB,
  op_mul = (int)CLPAR_BINARY_MUL,
  op_div = (int)CLPAR_BINARY_DIV
};

/* x / y is IEEE-rounded (-prec-div=true, nvcc's default without --use_fast_math), as on
 * the host: a division by zero gives an infinity or NaN, not an error. */
template <int Op>
__device__ __forceinline__ float apply(float x, float y) {
  if (Op == op_add) return x + y;
  if (Op == op_sub) return x - y;
  if (Op == op_div) return x / y;
  return x * y;
}

template <int Op, bool Broadcast, typename Index>
__global__ void binary_kernel(Index n, Index cols, const float *a, const float *b, float *out) {
  Index stride = (Index)gridDim.x * blockDim.x;
  for (Index i = (Index)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = apply<Op>(a[i], b[Broadcast ? i % cols : i]);
}

template <int Op, bool Broadcast>
void launch(cudaStream_t stream, unsigned blocks, size_t n, size_t cols, const float *a,
            const float *b, float *out) {
  /* The 32-bit index must also hold i + stride without wrapping. */
  if (n + (size_t)blocks * block_size <= UINT32_MAX)
    binary_kernel<Op, Broadcast, uint32_t>
        <<<blocks, block_size, 0, stream>>>((uint32_t)n, (uint32_t)cols, a, b, out);
  else
    binary_kernel<Op, Broadcast, size_t><<<blocks, block_size, 0, stream>>>(n, cols, a, b, out);
}

template <int Op>
void launch_op(cudaStream_t stream, unsigned blocks, size_t n, size_t cols, bool broadcast,
               const float *a, const float *b, float *out) {
  if (broadcast)
    launch<Op, true>(stream, blocks, n, cols, a, b, out);
  else
    launch<Op, false>(stream, blocks, n, cols, a, b, out);
}

}  // namespace

extern "C" cudaError_t clpar_cuda_binary(cudaStream_t stream, int kind, size_t rows, size_t cols,
                                         const float *a, const float *b, size_t b_rows,
                                         float *out) {
  size_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  size_t blocks = (n + block_size - 1) / block_size;
  if (blocks > max_blocks) blocks = max_blocks;
  /* One row of b against one row of a is the plain elementwise case. */
  bool broadcast = b_rows == 1 && rows > 1;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  switch (kind) {
    case op_add:
      launch_op<op_add>(stream, (unsigned)blocks, n, cols, broadcast, a, b, out);
      break;
    case op_sub:
      launch_op<op_sub>(stream, (unsigned)blocks, n, cols, broadcast, a, b, out);
      break;
    case op_mul:
      launch_op<op_mul>(stream, (unsigned)blocks, n, cols, broadcast, a, b, out);
      break;
    case op_div:
      launch_op<op_div>(stream, (unsigned)blocks, n, cols, broadcast, a, b, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
