/* conv_implicit.cl — a forward 2-D convolution as an implicit GEMM (ocl_conv_algo.c): per
 * group g, y[o, q] = sum_k W_g[o, k] col[k, q] + bias[o], with o < og, q = b * P + oy * ow + ox
 * over every image of the batch and k = (ci * kh + i) * kw + j < K = cg * kh * kw, where
 * col[k, q] = x[b, g * cg + ci, oy * sh - ph + i * dh, ox * sw - pw + j * dw] (0 outside the
 * image) is gathered from x as the tile is loaded: no column buffer in global memory.
 *
 * A work-group computes a CI_TM x CI_TN tile of y from CI_TK-deep slices of W and of the
 * gathered columns in local memory; it has (CI_TN / CI_WN) x (CI_TM / CI_WM) work-items, each
 * holding CI_WM x CI_WN sums in registers, its rows and columns strided by the work-group's
 * width (neighbouring work-items write neighbouring pixels). The tile sizes are build options
 * so that they can be tuned per device. Global ids: (column tile, row tile, group). Sizes fit
 * 32 bits (the host checks), offsets into the tensors are 64-bit. NCHW x and y, OIHW W. */
/* The tiles come from the build options only (ocl_conv_algo.c: the device's tuned tiles, else
 * CLPAR_OCL_CONV_DEFAULT_TILES). */
#if !defined(CI_TM) || !defined(CI_TN) || !defined(CI_TK) || !defined(CI_WM) || !defined(CI_WN)
#error "the CI_TM, CI_TN, CI_TK, CI_WM and CI_WN build options are needed"
#endif
#define CI_LM (CI_TM / CI_WM) /* work-items along the rows (o) */
#define CI_LN (CI_TN / CI_WN) /* work-items along the columns (q) */
#define CI_THREADS (CI_LM * CI_LN)

/* The geometry, in one struct-like argument list. */
#define CI_GEOM                                                                                \
  uint n, uint c, uint h, uint w, uint o, uint cg, uint og, uint kh, uint kw, uint sh, uint sw, \
      uint ph, uint pw, uint dh, uint dw, uint oh, uint ow

__kernel __attribute__((reqd_work_group_size(CI_LN, CI_LM, 1))) void conv_implicit_f32(
    __global const float *x, ulong x_off, __global const float *wt, ulong w_off,
    __global const float *bias, ulong b_off, int has_bias, __global float *y, ulong y_off,
    CI_GEOM) {
  __local float ws[CI_TK][CI_TM];
  __local float xs[CI_TK][CI_TN];
  const uint tx = get_local_id(0), ty = get_local_id(1), lid = ty * CI_LN + tx;
  const uint q0 = get_group_id(0) * CI_TN, o0 = get_group_id(1) * CI_TM, g = get_group_id(2);
  const uint P = oh * ow, L = n * P, khw = kh * kw, K = cg * khw;
  __global const float *wg = wt + w_off + (ulong)g * og * K;
  __global const float *xg = x + x_off + (ulong)g * cg * h * w;
  float acc[CI_WM][CI_WN];
  for (int r = 0; r < CI_WM; r++)
    for (int s = 0; s < CI_WN; s++) acc[r][s] = 0.0f;
  for (uint k0 = 0; k0 < K; k0 += CI_TK) {
    /* W_g[o0 .. o0 + TM, k0 .. k0 + TK], transposed into ws[k][o] */
    for (uint e = lid; e < CI_TK * CI_TM; e += CI_THREADS) {
      uint kk = e % CI_TK, oo = e / CI_TK, k = k0 + kk, oi = o0 + oo;
      ws[kk][oo] = k < K && oi < og ? wg[(ulong)oi * K + k] : 0.0f;
    }
    /* col[k0 .. k0 + TK, q0 .. q0 + TN], gathered from x */
    for (uint e = lid; e < CI_TK * CI_TN; e += CI_THREADS) {
      uint kk = e / CI_TN, qq = e % CI_TN, k = k0 + kk, q = q0 + qq;
      float v = 0.0f;
      if (k < K && q < L) {
        uint b = q / P, p = q - b * P, oy = p / ow, ox = p - oy * ow;
        uint ci = k / khw, r = k - ci * khw, i = r / kw, j = r - i * kw;
        int iy = (int)(oy * sh + i * dh) - (int)ph, ix = (int)(ox * sw + j * dw) - (int)pw;
        if (iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w)
          v = xg[(ulong)b * c * h * w + ((ulong)ci * h + (uint)iy) * w + (uint)ix];
      }
      xs[kk][qq] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < CI_TK; kk++) {
      float a[CI_WM], bv[CI_WN];
      for (int r = 0; r < CI_WM; r++) a[r] = ws[kk][ty + r * CI_LM];
      for (int s = 0; s < CI_WN; s++) bv[s] = xs[kk][tx + s * CI_LN];
      for (int r = 0; r < CI_WM; r++)
        for (int s = 0; s < CI_WN; s++) acc[r][s] = fma(a[r], bv[s], acc[r][s]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int s = 0; s < CI_WN; s++) {
    uint q = q0 + tx + s * CI_LN;
    if (q >= L) continue;
    uint b = q / P, p = q - b * P;
    for (int r = 0; r < CI_WM; r++) {
      uint oi = o0 + ty + r * CI_LM;
      if (oi >= og) continue;
      uint oc = g * og + oi;
      float v = acc[r][s] + (has_bias ? bias[b_off + oc] : 0.0f);
      y[y_off + ((ulong)b * o + oc) * P + p] = v;
    }
  }
}

/* y[b, oc, p] += bias[oc] for every image b and pixel p; one work-item per element. */
__kernel void conv_bias_add_f32(__global float *y, ulong y_off, __global const float *bias,
                                ulong b_off, ulong o, ulong p, ulong total) {
  ulong e = get_global_id(0);
  if (e >= total) return;
  y[y_off + e] += bias[b_off + (e / p) % o];
}
