/* conv_bwd.cl — the backward passes of a 2-D convolution as implicit GEMMs (ocl_conv_bwd.c),
 * with the tiling of conv_implicit.cl (the same CI_* build options; each pass's kernel is built
 * with tiles of its own, tuned per device, the forward's until then): a work-group computes a CI_TM x CI_TN tile from CI_TK-deep slices of both
 * operands in local memory, each of its (CI_TN / CI_WN) x (CI_TM / CI_WM) work-items holding
 * CI_WM x CI_WN sums. Neither pass writes a column buffer: the operand that im2col would lay out
 * is gathered from the tensor as its slice is loaded.
 *
 * Backward data, per group g: dx[ci, q] = sum_k W'[ci, k] G[k, q], ci < cg, q = (b h + iy) w + ix
 * over the batch, k = (oc kh + i) kw + j < og kh kw, W'[ci, k] = W[g og + oc, ci, i, j] and
 * G[k, q] = gy[b, g og + oc, oy, ox] where oy sh = iy + ph - i dh and ox sw = ix + pw - j dw
 * (0 where that is no whole output position): every dx element is one sum, written once.
 *
 * Backward weights, per group g and split s of the positions: dW[g og + oc, kc] = sum over
 * positions q = b P + oy ow + ox of a span of gy[b, g og + oc, oy, ox] col[kc, q] (col as the
 * forward gathers it, kc = (ci kh + i) kw + j); with several splits each writes its partial sums
 * [split, O, cg kh kw] and conv_bwd_sum_f32 adds them in split order (no atomics: repeatable).
 * Sizes fit 32 bits (the host checks), offsets into the tensors are 64-bit. NCHW, OIHW. */
/* The tiles come from the build options only (ocl_conv_algo.c: the device's tuned tiles, else
 * CLPAR_OCL_CONV_DEFAULT_TILES). */
#if !defined(CI_TM) || !defined(CI_TN) || !defined(CI_TK) || !defined(CI_WM) || !defined(CI_WN)
#error "the CI_TM, CI_TN, CI_TK, CI_WM and CI_WN build options are needed"
#endif
#define CI_LM (CI_TM / CI_WM)
#define CI_LN (CI_TN / CI_WN)
#define CI_THREADS (CI_LM * CI_LN)

#define CI_GEOM                                                                                \
  uint n, uint c, uint h, uint w, uint o, uint cg, uint og, uint kh, uint kw, uint sh, uint sw, \
      uint ph, uint pw, uint dh, uint dw, uint oh, uint ow

/* acc += as[kk][rows] x bs[kk][columns] over one slice (each work-item its WM x WN sums). */
#define CI_SLICE(as, bs, acc)                                                   \
  for (int kk = 0; kk < CI_TK; kk++) {                                          \
    float a[CI_WM], bv[CI_WN];                                                  \
    for (int r = 0; r < CI_WM; r++) a[r] = as[kk][ty + r * CI_LM];              \
    for (int s = 0; s < CI_WN; s++) bv[s] = bs[kk][tx + s * CI_LN];             \
    for (int r = 0; r < CI_WM; r++)                                             \
      for (int s = 0; s < CI_WN; s++) acc[r][s] = fma(a[r], bv[s], acc[r][s]);  \
  }

__kernel __attribute__((reqd_work_group_size(CI_LN, CI_LM, 1))) void conv_bwd_data_f32(
    __global const float *gy, ulong gy_off, __global const float *wt, ulong w_off,
    __global float *dx, ulong dx_off, CI_GEOM) {
  __local float ws[CI_TK][CI_TM];
  __local float gs[CI_TK][CI_TN];
  const uint tx = get_local_id(0), ty = get_local_id(1), lid = ty * CI_LN + tx;
  const uint q0 = get_group_id(0) * CI_TN, c0 = get_group_id(1) * CI_TM, g = get_group_id(2);
  const uint HW = h * w, L = n * HW, khw = kh * kw, K = og * khw, P = oh * ow;
  __global const float *wg = wt + w_off + (ulong)g * og * cg * khw;
  __global const float *gg = gy + gy_off + (ulong)g * og * P;
  float acc[CI_WM][CI_WN];
  for (int r = 0; r < CI_WM; r++)
    for (int s = 0; s < CI_WN; s++) acc[r][s] = 0.0f;
  for (uint k0 = 0; k0 < K; k0 += CI_TK) {
    for (uint e = lid; e < CI_TK * CI_TM; e += CI_THREADS) {
      uint kk = e % CI_TK, mm = e / CI_TK, k = k0 + kk, ci = c0 + mm;
      uint oc = k / khw, r = k - oc * khw;
      ws[kk][mm] = k < K && ci < cg ? wg[((ulong)oc * cg + ci) * khw + r] : 0.0f;
    }
    for (uint e = lid; e < CI_TK * CI_TN; e += CI_THREADS) {
      uint kk = e / CI_TN, qq = e % CI_TN, k = k0 + kk, q = q0 + qq;
      float v = 0.0f;
      if (k < K && q < L) {
        uint b = q / HW, pix = q - b * HW, iy = pix / w, ix = pix - iy * w;
        uint oc = k / khw, r = k - oc * khw, i = r / kw, j = r - i * kw;
        int ty_ = (int)(iy + ph) - (int)(i * dh), tx_ = (int)(ix + pw) - (int)(j * dw);
        if (ty_ >= 0 && tx_ >= 0 && (uint)ty_ % sh == 0 && (uint)tx_ % sw == 0) {
          uint oy = (uint)ty_ / sh, ox = (uint)tx_ / sw;
          if (oy < oh && ox < ow) v = gg[((ulong)b * o + oc) * P + oy * ow + ox];
        }
      }
      gs[kk][qq] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    CI_SLICE(ws, gs, acc)
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int s = 0; s < CI_WN; s++) {
    uint q = q0 + tx + s * CI_LN;
    if (q >= L) continue;
    uint b = q / HW, pix = q - b * HW;
    for (int r = 0; r < CI_WM; r++) {
      uint ci = c0 + ty + r * CI_LM;
      if (ci < cg) dx[dx_off + ((ulong)b * c + g * cg + ci) * HW + pix] = acc[r][s];
    }
  }
}

__kernel __attribute__((reqd_work_group_size(CI_LN, CI_LM, 1))) void conv_bwd_weight_f32(
    __global const float *gy, ulong gy_off, __global const float *x, ulong x_off,
    __global float *dw_out, ulong dw_off, uint splits, uint span, CI_GEOM) {
  __local float gs[CI_TK][CI_TM];
  __local float xs[CI_TK][CI_TN];
  const uint tx = get_local_id(0), ty = get_local_id(1), lid = ty * CI_LN + tx;
  const uint k0c = get_group_id(0) * CI_TN, o0 = get_group_id(1) * CI_TM;
  const uint g = get_group_id(2) / splits, part = get_group_id(2) % splits;
  const uint P = oh * ow, L = n * P, khw = kh * kw, Kc = cg * khw;
  const uint qb = part * span, qe = min(L, qb + span);
  __global const float *gg = gy + gy_off + (ulong)g * og * P;
  __global const float *xg = x + x_off + (ulong)g * cg * h * w;
  float acc[CI_WM][CI_WN];
  for (int r = 0; r < CI_WM; r++)
    for (int s = 0; s < CI_WN; s++) acc[r][s] = 0.0f;
  for (uint t0 = qb; t0 < qe; t0 += CI_TK) {
    for (uint e = lid; e < CI_TK * CI_TM; e += CI_THREADS) {
      uint kk = e % CI_TK, mm = e / CI_TK, q = t0 + kk, oc = o0 + mm;
      float v = 0.0f;
      if (q < qe && oc < og) {
        uint b = q / P, p = q - b * P;
        v = gg[((ulong)b * o + oc) * P + p];
      }
      gs[kk][mm] = v;
    }
    for (uint e = lid; e < CI_TK * CI_TN; e += CI_THREADS) {
      uint kk = e % CI_TK, nn = e / CI_TK, q = t0 + kk, kc = k0c + nn;
      float v = 0.0f;
      if (q < qe && kc < Kc) {
        uint b = q / P, p = q - b * P, oy = p / ow, ox = p - oy * ow;
        uint ci = kc / khw, r = kc - ci * khw, i = r / kw, j = r - i * kw;
        int iy = (int)(oy * sh + i * dh) - (int)ph, ix = (int)(ox * sw + j * dw) - (int)pw;
        if (iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w)
          v = xg[(ulong)b * c * h * w + ((ulong)ci * h + (uint)iy) * w + (uint)ix];
      }
      xs[kk][nn] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    CI_SLICE(gs, xs, acc)
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int s = 0; s < CI_WN; s++) {
    uint kc = k0c + tx + s * CI_LN;
    if (kc >= Kc) continue;
    for (int r = 0; r < CI_WM; r++) {
      uint oc = o0 + ty + r * CI_LM;
      if (oc < og) dw_out[dw_off + ((ulong)part * o + g * og + oc) * Kc + kc] = acc[r][s];
    }
  }
}

/* dw[e] = sum over s < splits of part[s * total + e], in order; e < total. */
__kernel void conv_bwd_sum_f32(__global const float *part, __global float *dw, ulong dw_off,
                               uint splits, ulong total) {
  ulong e = get_global_id(0);
  if (e >= total) return;
  float v = 0.0f;
  for (uint s = 0; s < splits; s++) v += part[s * total + e];
  dw[dw_off + e] = v;
}

/* db[oc] = sum over images b and pixels p of gy[b, oc, p]: one work-group per channel, each
 * work-item summing a stride of the positions, then a tree over the group (its size a power of
 * two; scratch holds one float per work-item). */
__kernel void conv_bwd_bias_f32(__global const float *gy, ulong gy_off, __global float *db,
                                ulong db_off, uint n, uint o, uint P, __local float *scratch) {
  const uint oc = get_group_id(0), lid = get_local_id(0), ls = get_local_size(0);
  const uint L = n * P;
  float v = 0.0f;
  for (uint q = lid; q < L; q += ls) {
    uint b = q / P, p = q - b * P;
    v += gy[gy_off + ((ulong)b * o + oc) * P + p];
  }
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint step = ls / 2; step > 0; step /= 2) {
    if (lid < step) scratch[lid] += scratch[lid + step];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) db[db_off + oc] = scratch[0];
}

/* The rotated, transposed filter of an ungrouped convolution: wf[ci, oc, kh-1-i, kw-1-j] =
 * w[oc, ci, i, j], so that backward data of a stride-1 layer is the forward convolution of gy
 * with wf (ocl_conv_bwd.c's Winograd path). One work-item per weight. */
__kernel void conv_flip_f32(__global const float *w, ulong w_off, __global float *wf, uint o,
                            uint c, uint kh, uint kw) {
  uint e = get_global_id(0), khw = kh * kw;
  if (e >= o * c * khw) return;
  uint oc = e / (c * khw), r = e - oc * c * khw, ci = r / khw, t = r - ci * khw;
  uint i = t / kw, j = t - i * kw;
  wf[((ulong)ci * o + oc) * khw + (kh - 1 - i) * kw + (kw - 1 - j)] = w[w_off + e];
}
