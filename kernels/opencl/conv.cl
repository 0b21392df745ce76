/* conv.cl — the data movement of a convolution through GEMM (src/nn/conv.c): im2col lays a
 * chunk of images out as the columns of one GEMM operand, col2im adds such columns back into
 * images (the input's gradient), and swap01 takes the GEMM's [O, n * P] result to NCHW (and
 * NCHW gradients to [O, n * P]). The formulas are backend.h's. Indices inside a chunk fit 32
 * bits (the core bounds a chunk's columns at 64 MiB); offsets into tensors are 64-bit. */

/* col[r, q], r = (ci * kh + i) * kw + j, q = b * P + oy * ow + ox; work-item (q, r). */
__kernel void im2col_f32(__global const float *x, ulong x_off, __global float *col, ulong c_off,
                         uint n, uint h, uint w, ulong img_stride, uint kh, uint kw, uint sh,
                         uint sw, uint ph, uint pw, uint dh, uint dw, uint oh, uint ow) {
  uint q = get_global_id(0), r = get_global_id(1);
  uint P = oh * ow, L = n * P;
  if (q >= L) return;
  uint b = q / P, p = q - b * P, oy = p / ow, ox = p - oy * ow;
  uint ci = r / (kh * kw), t = r - ci * kh * kw, i = t / kw, j = t - i * kw;
  int iy = (int)(oy * sh + i * dh) - (int)ph, ix = (int)(ox * sw + j * dw) - (int)pw;
  float v = 0.0f;
  if (iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w)
    v = x[x_off + b * img_stride + ((ulong)ci * h + (uint)iy) * w + (uint)ix];
  col[c_off + (ulong)r * L + q] = v;
}

/* x[b, ci, y, xx] += the columns that im2col read from it; work-item (y * w + xx, b * c + ci). */
__kernel void col2im_f32(__global const float *col, ulong c_off, __global float *x, ulong x_off,
                         uint n, uint c, uint h, uint w, ulong img_stride, uint kh, uint kw,
                         uint sh, uint sw, uint ph, uint pw, uint dh, uint dw, uint oh, uint ow) {
  uint pos = get_global_id(0), bc = get_global_id(1);
  if (pos >= h * w) return;
  uint b = bc / c, ci = bc - b * c, y = pos / w, xx = pos - y * w;
  uint P = oh * ow, L = n * P;
  float sum = 0.0f;
  for (uint i = 0; i < kh; i++) {
    int num = (int)(y + ph) - (int)(i * dh);
    if (num < 0 || num % (int)sh) continue;
    uint oy = (uint)num / sh;
    if (oy >= oh) continue;
    for (uint j = 0; j < kw; j++) {
      int numx = (int)(xx + pw) - (int)(j * dw);
      if (numx < 0 || numx % (int)sw) continue;
      uint ox = (uint)numx / sw;
      if (ox >= ow) continue;
      sum += col[c_off + (ulong)((ci * kh + i) * kw + j) * L + b * P + oy * ow + ox];
    }
  }
  x[x_off + b * img_stride + (ulong)ci * h * w + pos] += sum;
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
