/* conv.cu — the data movement of a convolution through GEMM (src/nn/conv.c, backend.h):
 * im2col, col2im (adds into x; gathers, so no atomics) and the [a, b, p] -> [b, a, p] swap
 * between a GEMM's [O, n * P] result and NCHW. Grid-stride loops over 32-bit indices where
 * they fit, 64-bit otherwise. */
#include "cuda/cuda_kernels.h"
#include "launch.cuh"

namespace {

using namespace clpar_launch;

/* The kernels are templates over the index type: 32-bit indices (a chunk's columns fit, as the
 * core bounds them at 64 MiB, unless one image alone is larger) avoid the GPU's slow 64-bit
 * division; the launchers pick 64-bit when an index could overflow. */
template <typename I>
__global__ void im2col_kernel(clpar_conv_geom g64, const float *x, float *col) {
  I oh = (I)g64.oh, ow = (I)g64.ow, kh = (I)g64.kh, kw = (I)g64.kw, h = (I)g64.h, w = (I)g64.w;
  I P = oh * ow, L = (I)g64.n * P, total = L * (I)g64.c * kh * kw;
  for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
    I r = e / L, q = e - r * L, b = q / P, p = q - b * P, oy = p / ow, ox = p - oy * ow;
    I ci = r / (kh * kw), t = r - ci * kh * kw, i = t / kw, j = t - i * kw;
    int64_t iy = (int64_t)(oy * (I)g64.sh + i * (I)g64.dh) - g64.ph;
    int64_t ix = (int64_t)(ox * (I)g64.sw + j * (I)g64.dw) - g64.pw;
    float v = 0.0f;
    if (iy >= 0 && iy < h && ix >= 0 && ix < w)
      v = x[(int64_t)b * g64.img_stride + ((int64_t)ci * h + iy) * w + ix];
    col[e] = v;
  }
}

template <typename I>
__global__ void col2im_kernel(clpar_conv_geom g64, const float *col, float *x) {
  I oh = (I)g64.oh, ow = (I)g64.ow, kh = (I)g64.kh, kw = (I)g64.kw, h = (I)g64.h, w = (I)g64.w;
  I sh = (I)g64.sh, sw = (I)g64.sw, dh = (I)g64.dh, dw = (I)g64.dw, ph = (I)g64.ph, pw = (I)g64.pw;
  I P = oh * ow, L = (I)g64.n * P, HW = h * w, c = (I)g64.c, total = (I)g64.n * c * HW;
  for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
    I bc = e / HW, pos = e - bc * HW, b = bc / c, ci = bc - b * c;
    I y = pos / w, xx = pos - y * w;
    float sum = 0.0f;
    for (I i = 0; i < kh; i++) {
      if (y + ph < i * dh) continue;
      I num = y + ph - i * dh, oy = num / sh;
      if (num - oy * sh || oy >= oh) continue;
      for (I j = 0; j < kw; j++) {
        if (xx + pw < j * dw) continue;
        I numx = xx + pw - j * dw, ox = numx / sw;
        if (numx - ox * sw || ox >= ow) continue;
        sum += col[((ci * kh + i) * kw + j) * L + b * P + oy * ow + ox];
      }
    }
    x[(int64_t)b * g64.img_stride + (int64_t)ci * HW + pos] += sum;
  }
}

template <typename I>
__global__ void swap01_kernel(I a, I b, I p, const float *in, const float *bias, float *out) {
  I total = a * b * p;
  for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
    I row = e / p, q = e - row * p, i = row / b, j = row - i * b;
    out[(j * a + i) * p + q] = in[e] + (bias ? bias[i] : 0.0f);
  }
}

/* Whether every index below n, plus a grid's stride, fits 32 bits. */
bool fits32(size_t n) {
  return n + (size_t)max_blocks * block_size < ((size_t)1 << 32);
}

}  // namespace

extern "C" cudaError_t clpar_cuda_im2col(cudaStream_t stream, clpar_conv_geom g, const float *x,
                                         float *col) {
  size_t total = (size_t)(g.n * g.oh * g.ow * g.c * g.kh * g.kw);
  (void)cudaGetLastError();
  if (fits32(total))
    im2col_kernel<uint32_t><<<blocks_for(total), block_size, 0, stream>>>(g, x, col);
  else
    im2col_kernel<uint64_t><<<blocks_for(total), block_size, 0, stream>>>(g, x, col);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_col2im(cudaStream_t stream, clpar_conv_geom g, const float *col,
                                         float *x) {
  size_t total = (size_t)(g.n * g.c * g.h * g.w);
  (void)cudaGetLastError();
  size_t cols = (size_t)(g.n * g.oh * g.ow * g.c * g.kh * g.kw);
  if (fits32(total) && fits32(cols))
    col2im_kernel<uint32_t><<<blocks_for(total), block_size, 0, stream>>>(g, col, x);
  else
    col2im_kernel<uint64_t><<<blocks_for(total), block_size, 0, stream>>>(g, col, x);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_swap01(cudaStream_t stream, size_t a, size_t b, size_t p,
                                         const float *in, const float *bias, float *out) {
  (void)cudaGetLastError();
  if (fits32(a * b * p))
    swap01_kernel<uint32_t><<<blocks_for(a * b * p), block_size, 0, stream>>>(
        (uint32_t)a, (uint32_t)b, (uint32_t)p, in, bias, out);
  else
    swap01_kernel<uint64_t>
        <<<blocks_for(a * b * p), block_size, 0, stream>>>(a, b, p, in, bias, out);
  return cudaGetLastError();
}
