/* ocl_conv_winograd.c — Winograd's F(2x2, 3x3) forward convolution (kernels/opencl/
 * conv_winograd.cl says the algebra): the filter transform, then per chunk of images the input
 * transform, 16 GEMMs [O, C] x [C, tiles] in one batched call (the backend's gemm_batched:
 * CLBlast, or gemm_tile.cl on CPU devices) and the output transform. 2.25 times fewer
 * multiply-adds than the direct sum, paid for with the transforms' memory traffic: one of the
 * algorithms a 3x3, stride-1, undilated, ungrouped layer is timed with (ocl_conv_algo.c). */
#include "ocl_conv_algo.h"

int clpar_ocl_conv_winograd_fits(const clpar_conv2d_shape *s) {
  const int64_t lim = INT32_MAX;
  int64_t tiles = s->n * ((s->oh + 1) / 2) * ((s->ow + 1) / 2);
  return s->kh == 3 && s->kw == 3 && s->sh == 1 && s->sw == 1 && s->dh == 1 && s->dw == 1 &&
         s->groups == 1 && 16 * s->c * tiles <= lim && 16 * s->o * tiles <= lim &&
         16 * s->o * s->c <= lim && s->c * s->h * s->w <= lim && s->oh * s->ow <= lim &&
         s->h + 2 * s->ph <= lim && s->w + 2 * s->pw <= lim;
}

static clpar_bref plus(clpar_bref r, size_t off) {
  r.off += off;
  return r;
}

static clpar_status filter_transform(clpar_ocl_device *d, clpar_bref wt, void *u, cl_uint oc) {
  cl_mem wm = AS_MEM(wt.buf), um = AS_MEM(u);
  cl_ulong wo = wt.off;
  karg args[] = {KARG(wm), KARG(wo), KARG(um), KARG(oc)};
  return clpar_ocl_launch_1d(d, "conv_winograd.cl", "wino_filter_f32", args, 4, oc);
}

static clpar_status input_transform(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                    void *v, cl_uint nb, cl_uint th, cl_uint tw) {
  cl_mem xm = AS_MEM(x.buf), vm = AS_MEM(v);
  cl_ulong xo = x.off;
  cl_uint c = (cl_uint)s->c, h = (cl_uint)s->h, w = (cl_uint)s->w, ph = (cl_uint)s->ph,
          pw = (cl_uint)s->pw;
  karg args[] = {KARG(xm), KARG(xo), KARG(vm), KARG(nb), KARG(c), KARG(h),
                 KARG(w),  KARG(ph), KARG(pw), KARG(th), KARG(tw)};
  return clpar_ocl_launch_1d(d, "conv_winograd.cl", "wino_input_f32", args, 11,
                             (size_t)c * nb * th * tw);
}

static clpar_status output_transform(clpar_ocl_device *d, const clpar_conv2d_shape *s, void *m,
                                     clpar_bref bias, clpar_bref y, cl_uint nb, cl_uint th,
                                     cl_uint tw) {
  cl_mem mm = AS_MEM(m), ym = AS_MEM(y.buf), bm = AS_MEM(bias.buf ? bias.buf : m);
  cl_ulong bo = bias.off, yo = y.off;
  cl_int has_bias = bias.buf != NULL;
  cl_uint o = (cl_uint)s->o, oh = (cl_uint)s->oh, ow = (cl_uint)s->ow;
  karg args[] = {KARG(mm), KARG(bm), KARG(bo), KARG(has_bias), KARG(ym), KARG(yo),
                 KARG(nb), KARG(o),  KARG(oh), KARG(ow),       KARG(th), KARG(tw)};
  return clpar_ocl_launch_1d(d, "conv_winograd.cl", "wino_output_f32", args, 12,
                             (size_t)o * nb * th * tw);
}

clpar_status clpar_ocl_conv_winograd(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                     clpar_bref wt, clpar_bref bias, clpar_bref y) {
  size_t th = (size_t)(s->oh + 1) / 2, tw = (size_t)(s->ow + 1) / 2, T = th * tw;
  size_t c = (size_t)s->c, o = (size_t)s->o, n = (size_t)s->n;
  /* V and M together: twice the im2col path's column buffer (128 MiB) */
  size_t chunk = clpar_ocl_conv_chunk_images(16 * (c + o) * T, 2, n);
  void *u = NULL, *v = NULL, *m = NULL;
  clpar_status st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_FILTER, 16 * o * c * sizeof(float), &u);
  if (st == CLPAR_OK)
    st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_COLS, 16 * c * chunk * T * sizeof(float), &v);
  if (st == CLPAR_OK)
    st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_OUT, 16 * o * chunk * T * sizeof(float), &m);
  if (st == CLPAR_OK) st = filter_transform(d, wt, u, (cl_uint)(o * c));
  clpar_bref ub = {u, 0}, vb = {v, 0}, mb = {m, 0};
  for (size_t n0 = 0; st == CLPAR_OK && n0 < n; n0 += chunk) {
    size_t nb = n - n0 < chunk ? n - n0 : chunk, nt = nb * T;
    st = input_transform(d, s, plus(x, n0 * c * (size_t)(s->h * s->w)), v, (cl_uint)nb, (cl_uint)th,
                         (cl_uint)tw);
    if (st == CLPAR_OK) /* M[xi] [O, nt] = U[xi] [O, C] V[xi] [C, nt], xi < 16 */
      st = ocl_gemm_batched(d, 0, 0, o, nt, c, 1.0f, ub, c, o * c, vb, nt, c * nt, 0.0f, mb, nt,
                            o * nt, 16);
    if (st == CLPAR_OK)
      st = output_transform(d, s, m, bias, plus(y, n0 * o * (size_t)(s->oh * s->ow)), (cl_uint)nb,
                            (cl_uint)th, (cl_uint)tw);
  }
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_OUT, m);
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_COLS, v);
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_FILTER, u);
  return st;
}
