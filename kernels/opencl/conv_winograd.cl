/* conv_winograd.cl — Winograd's F(2x2, 3x3) for 3x3 convolutions with stride 1, dilation 1 and
 * one group (ocl_conv_winograd.c): Y = A^T [ sum over c of (G g G^T) . (B^T d B) ] A for each
 * 2x2 output tile, with d the 4x4 input patch under it (0 outside the image). The filter and
 * input transforms below lay out 16 matrices, one per position xi of the 4x4 transform:
 *   U[xi] [O, C]  = (G g_{o,c} G^T)[xi]
 *   V[xi] [C, NT] = (B^T d_{c,t} B)[xi]     t = (b * th + ty) * tw + tx over the chunk's images
 * which one batched GEMM multiplies (M[xi] [O, NT] = U[xi] V[xi]) before the output transform.
 *   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
 *   A^T = [1 1 1 0; 0 1 -1 -1].
 * Sizes fit 32 bits (the host checks); offsets into the tensors are 64-bit. */

/* One work-item per (o, c): U[xi * O * C + o * C + c]. */
__kernel void wino_filter_f32(__global const float *w, ulong w_off, __global float *u, uint oc) {
  uint e = get_global_id(0);
  if (e >= oc) return;
  __global const float *g = w + w_off + (ulong)e * 9;
  float t[4][3]; /* G g */
  for (int j = 0; j < 3; j++) {
    float g0 = g[j], g1 = g[3 + j], g2 = g[6 + j];
    t[0][j] = g0;
    t[1][j] = 0.5f * (g0 + g1 + g2);
    t[2][j] = 0.5f * (g0 - g1 + g2);
    t[3][j] = g2;
  }
  for (int i = 0; i < 4; i++) { /* (G g) G^T */
    float r[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]),
                  0.5f * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
    for (int j = 0; j < 4; j++) u[(ulong)(i * 4 + j) * oc + e] = r[j];
  }
}

/* One work-item per (c, t): V[xi * C * NT + c * NT + t], from the chunk's images x
 * [nb, C, h, w] (image stride c * h * w). */
__kernel void wino_input_f32(__global const float *x, ulong x_off, __global float *v, uint nb,
                             uint c, uint h, uint w, uint ph, uint pw, uint th, uint tw) {
  uint e = get_global_id(0), T = th * tw, nt = nb * T;
  if (e >= c * nt) return;
  uint ci = e / nt, t = e - ci * nt, b = t / T, r = t - b * T, ty = r / tw, tx = r - ty * tw;
  __global const float *src = x + x_off + ((ulong)b * c + ci) * h * w;
  int y0 = (int)(2 * ty) - (int)ph, x0 = (int)(2 * tx) - (int)pw;
  float d[4][4];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      int yy = y0 + i, xx = x0 + j;
      d[i][j] = yy >= 0 && yy < (int)h && xx >= 0 && xx < (int)w ? src[(uint)yy * w + (uint)xx]
                                                                 : 0.0f;
    }
  float s[4][4]; /* B^T d */
  for (int j = 0; j < 4; j++) {
    s[0][j] = d[0][j] - d[2][j];
    s[1][j] = d[1][j] + d[2][j];
    s[2][j] = d[2][j] - d[1][j];
    s[3][j] = d[1][j] - d[3][j];
  }
  ulong plane = (ulong)c * nt, at = (ulong)ci * nt + t;
  for (int i = 0; i < 4; i++) { /* (B^T d) B */
    v[(i * 4 + 0) * plane + at] = s[i][0] - s[i][2];
    v[(i * 4 + 1) * plane + at] = s[i][1] + s[i][2];
    v[(i * 4 + 2) * plane + at] = s[i][2] - s[i][1];
    v[(i * 4 + 3) * plane + at] = s[i][1] - s[i][3];
  }
}

/* One work-item per (o, t): y[b, o, 2 ty + i, 2 tx + j] = (A^T M A)[i, j] (+ bias[o]) where
 * inside the output, y the chunk's first image [nb, O, oh, ow]. */
__kernel void wino_output_f32(__global const float *m, __global const float *bias, ulong b_off,
                              int has_bias, __global float *y, ulong y_off, uint nb, uint o,
                              uint oh, uint ow, uint th, uint tw) {
  uint e = get_global_id(0), T = th * tw, nt = nb * T;
  if (e >= o * nt) return;
  uint oi = e / nt, t = e - oi * nt, b = t / T, r = t - b * T, ty = r / tw, tx = r - ty * tw;
  ulong plane = (ulong)o * nt, at = (ulong)oi * nt + t;
  float mv[4][4];
  for (int i = 0; i < 16; i++) mv[i / 4][i % 4] = m[i * plane + at];
  float s[2][4]; /* A^T M */
  for (int j = 0; j < 4; j++) {
    s[0][j] = mv[0][j] + mv[1][j] + mv[2][j];
    s[1][j] = mv[1][j] - mv[2][j] - mv[3][j];
  }
  float add = has_bias ? bias[b_off + oi] : 0.0f;
  __global float *dst = y + y_off + ((ulong)b * o + oi) * oh * ow;
  for (int i = 0; i < 2; i++) {
    float r0 = s[i][0] + s[i][1] + s[i][2], r1 = s[i][1] - s[i][2] - s[i][3];
    uint yy = 2 * ty + i, xx = 2 * tx;
    if (yy >= oh) continue;
    dst[yy * ow + xx] = r0 + add;
    if (xx + 1 < ow) dst[yy * ow + xx + 1] = r1 + add;
  }
}
