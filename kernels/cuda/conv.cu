/* conv.cu — the data movement of a convolution through GEMM (src/nn/conv.c, backend.h):
 * im2col, col2im (adds into x; gathers, so no atomics) and the [a, b, p] -> [b, a, p] swap
 * between a GEMM's [O, n * P] result and NCHW. Grid-stride loops over 64-bit indices. */
#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned block_size = 256;
constexpr size_t max_blocks = 65535;

unsigned blocks_for(size_t n) {
  size_t b = (n + block_size - 1) / block_size;
  return (unsigned)(b < max_blocks ? b : max_blocks);
}

__global__ void im2col_kernel(clpar_conv_geom g, const float *x, float *col) {
  int64_t P = g.oh * g.ow, L = g.n * P, total = L * g.c * g.kh * g.kw;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = e / L, q = e - r * L, b = q / P, p = q - b * P, oy = p / g.ow, ox = p - oy * g.ow;
    int64_t ci = r / (g.kh * g.kw), i = r / g.kw % g.kh, j = r % g.kw;
    int64_t iy = oy * g.sh - g.ph + i * g.dh, ix = ox * g.sw - g.pw + j * g.dw;
    float v = 0.0f;
    if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
      v = x[b * g.img_stride + (ci * g.h + iy) * g.w + ix];
    col[e] = v;
  }
}

__global__ void col2im_kernel(clpar_conv_geom g, const float *col, float *x) {
  int64_t P = g.oh * g.ow, L = g.n * P, HW = g.h * g.w, total = g.n * g.c * HW;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t bc = e / HW, pos = e - bc * HW, b = bc / g.c, ci = bc - b * g.c;
    int64_t y = pos / g.w, xx = pos - y * g.w;
    float sum = 0.0f;
    for (int64_t i = 0; i < g.kh; i++) {
      int64_t num = y + g.ph - i * g.dh;
      if (num < 0 || num % g.sh || num / g.sh >= g.oh) continue;
      for (int64_t j = 0; j < g.kw; j++) {
        int64_t numx = xx + g.pw - j * g.dw;
        if (numx < 0 || numx % g.sw || numx / g.sw >= g.ow) continue;
        sum += col[((ci * g.kh + i) * g.kw + j) * L + b * P + num / g.sh * g.ow + numx / g.sw];
      }
    }
    x[b * g.img_stride + ci * HW + pos] += sum;
  }
}

__global__ void swap01_kernel(size_t a, size_t b, size_t p, const float *in, const float *bias,
                              float *out) {
  size_t total = a * b * p;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t row = e / p, q = e - row * p, i = row / b, j = row - i * b;
    out[(j * a + i) * p + q] = in[e] + (bias ? bias[i] : 0.0f);
  }
}

}  // namespace

extern "C" cudaError_t clpar_cuda_im2col(cudaStream_t stream, clpar_conv_geom g, const float *x,
                                         float *col) {
  size_t total = (size_t)(g.n * g.oh * g.ow * g.c * g.kh * g.kw);
  (void)cudaGetLastError();
  im2col_kernel<<<blocks_for(total), block_size, 0, stream>>>(g, x, col);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_col2im(cudaStream_t stream, clpar_conv_geom g, const float *col,
                                         float *x) {
  size_t total = (size_t)(g.n * g.c * g.h * g.w);
  (void)cudaGetLastError();
  col2im_kernel<<<blocks_for(total), block_size, 0, stream>>>(g, col, x);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_swap01(cudaStream_t stream, size_t a, size_t b, size_t p,
                                         const float *in, const float *bias, float *out) {
  (void)cudaGetLastError();
  swap01_kernel<<<blocks_for(a * b * p), block_size, 0, stream>>>(a, b, p, in, bias, out);
  return cudaGetLastError();
}
