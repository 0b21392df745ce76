/* conv.cl — the data movement of a convolution through GEMM (src/nn/conv.c): im2col lays a
 * chunk of images out as the columns of one GEMM operand, col2im adds such columns back into
 * images (the input's gradient), and swap01 takes the GEMM's [O, n * P] result to NCHW (and
 * NCHW gradients to [O, n * P]). The formulas are backend.h's. Indices inside a chunk fit 32
 * bits (the core bounds a chunk's columns at 64 MiB); offsets into tensors are 64-bit. */

/* col[r, q], r = (ci * kh + i) * kw + j, q = b * P + oy * ow + ox. A work-item writes one
 * output row of one column row: (b * oh + oy, r), ow elements; the index arithmetic is per
 * row, the loop over ox a strided read and a contiguous write. */
__kernel void im2col_f32(__global const float *x, ulong x_off, __global float *col, ulong c_off,
                         uint n, uint h, uint w, ulong img_stride, uint kh, uint kw, uint sh,
                         uint sw, uint ph, uint pw, uint dh, uint dw, uint oh, uint ow) {
  uint t = get_global_id(0), r = get_global_id(1);
  if (t >= n * oh) return;
  uint b = t / oh, oy = t - b * oh;
  uint ci = r / (kh * kw), rem = r - ci * kh * kw, i = rem / kw, j = rem - i * kw;
  uint P = oh * ow, L = n * P;
  __global float *dst = col + c_off + (ulong)r * L + b * P + oy * ow;
  int iy = (int)(oy * sh + i * dh) - (int)ph;
  if (iy < 0 || iy >= (int)h) {
    for (uint ox = 0; ox < ow; ox++) dst[ox] = 0.0f;
    return;
  }
  __global const float *src = x + x_off + b * img_stride + ((ulong)ci * h + (uint)iy) * w;
  int ix = (int)(j * dw) - (int)pw;
  for (uint ox = 0; ox < ow; ox++, ix += (int)sw)
    dst[ox] = ix >= 0 && ix < (int)w ? src[ix] : 0.0f;
}

/* x[b, ci, y, :] += the columns that im2col read from it. A work-item owns one input row
 * (y, b * c + ci) and adds, for each kernel offset (i, j) that reaches the row, the column
 * row's ow entries into it: no atomics, no division in the inner loop. */
__kernel void col2im_f32(__global const float *col, ulong c_off, __global float *x, ulong x_off,
                         uint n, uint c, uint h, uint w, ulong img_stride, uint kh, uint kw,
                         uint sh, uint sw, uint ph, uint pw, uint dh, uint dw, uint oh, uint ow) {
  uint y = get_global_id(0), bc = get_global_id(1);
  if (y >= h) return;
  uint b = bc / c, ci = bc - b * c;
  uint P = oh * ow, L = n * P;
  __global float *dst = x + x_off + b * img_stride + ((ulong)ci * h + y) * w;
  for (uint i = 0; i < kh; i++) {
    int num = (int)(y + ph) - (int)(i * dh);
    if (num < 0 || num % (int)sh) continue;
    uint oy = (uint)num / sh;
    if (oy >= oh) continue;
    for (uint j = 0; j < kw; j++) {
      __global const float *src = col + c_off + (ulong)((ci * kh + i) * kw + j) * L + b * P +
                                  oy * ow;
      int xx = (int)(j * dw) - (int)pw;
      for (uint ox = 0; ox < ow; ox++, xx += (int)sw)
        if (xx >= 0 && xx < (int)w) dst[xx] += src[ox];
    }
  }
}

/* out[j, i, q] = in[i, j, q] + bias[i] (has_bias); work-item (q, i * b + j). */
__kernel void swap01_f32(__global const float *in, ulong i_off, __global const float *bias,
                         ulong b_off, int has_bias, __global float *out, ulong o_off, ulong a,
                         ulong b, ulong p) {
  ulong q = get_global_id(0), row = get_global_id(1);
  if (q >= p) return;
  ulong i = row / b, j = row - i * b;
  float add = has_bias ? bias[b_off + i] : 0.0f;
  out[o_off + (j * a + i) * p + q] = in[i_off + row * p + q] + add;
}
