/* ocl_layers.c — the OpenCL backend's entries of the transformer layers (backend.h):
 * argument marshalling for the kernels of kernels/opencl/layers.cl. */
#include "ocl_internal.h"

/* A NULL buffer cannot be a kernel argument of every driver: an absent input passes another
 * buffer of the call (never read: the flag says so). */
#define OPT_MEM(ref, other) AS_MEM((ref).buf ? (ref).buf : (other).buf)

static clpar_status launch_2d(clpar_ocl_device *d, const char *name, const karg *args, int nargs,
                              size_t cols, size_t rows) {
  size_t global[2], local[2];
  clpar_ocl_shape_2d(d, cols, rows, global, local);
  return clpar_ocl_launch(d, "layers.cl", name, args, nargs, 2, global, local);
}

clpar_status clpar_ocl_embedding(void *dev, size_t n, size_t num, size_t dim, int idx64,
                                 clpar_bref idx, clpar_bref w, clpar_bref out) {
  cl_mem im = AS_MEM(idx.buf), wm = AS_MEM(w.buf), om = AS_MEM(out.buf);
  cl_ulong io = idx.off, wo = w.off, oo = out.off, cn = n, cnum = num, cdim = dim;
  cl_int i64 = idx64;
  karg args[] = {KARG(im), KARG(io), KARG(i64), KARG(wm),   KARG(wo),
                 KARG(om), KARG(oo), KARG(cn),  KARG(cnum), KARG(cdim)};
  return launch_2d(dev, "embedding_f32", args, 10, dim, n);
}

clpar_status clpar_ocl_embedding_backward(void *dev, size_t n, size_t num, size_t dim, int idx64,
                                          clpar_bref idx, clpar_bref g, clpar_bref dw) {
  cl_mem im = AS_MEM(idx.buf), gm = AS_MEM(g.buf), dm = AS_MEM(dw.buf);
  cl_ulong io = idx.off, go = g.off, dwo = dw.off, cn = n, cnum = num, cdim = dim;
  cl_int i64 = idx64;
  karg args[] = {KARG(im), KARG(io),  KARG(i64), KARG(gm),   KARG(go),
                 KARG(dm), KARG(dwo), KARG(cn),  KARG(cnum), KARG(cdim)};
  return launch_2d(dev, "embedding_backward_f32", args, 10, dim, num);
}

clpar_status clpar_ocl_layernorm(void *dev, size_t rows, size_t cols, float eps, clpar_bref x,
                                 clpar_bref w, clpar_bref b, clpar_bref y, clpar_bref mean,
                                 clpar_bref rstd) {
  cl_mem xm = AS_MEM(x.buf), wm = OPT_MEM(w, x), bm = OPT_MEM(b, x), ym = AS_MEM(y.buf);
  cl_mem mm = AS_MEM(mean.buf), rm = AS_MEM(rstd.buf);
  cl_ulong xo = x.off, wo = w.off, bo = b.off, yo = y.off, mo = mean.off, ro = rstd.off;
  cl_ulong cr = rows, cc = cols;
  cl_int hw = w.buf != NULL, hb = b.buf != NULL;
  cl_float e = eps;
  karg args[] = {KARG(xm), KARG(xo), KARG(wm), KARG(wo), KARG(hw), KARG(bm),
                 KARG(bo), KARG(hb), KARG(ym), KARG(yo), KARG(mm), KARG(mo),
                 KARG(rm), KARG(ro), KARG(cr), KARG(cc), KARG(e)};
  return clpar_ocl_launch_1d(dev, "layers.cl", "layernorm_f32", args, 17, rows);
}

clpar_status clpar_ocl_layernorm_backward(void *dev, size_t rows, size_t cols, clpar_bref x,
                                          clpar_bref g, clpar_bref mean, clpar_bref rstd,
                                          clpar_bref w, clpar_bref dx, clpar_bref dw,
                                          clpar_bref db) {
  cl_mem xm = AS_MEM(x.buf), gm = AS_MEM(g.buf), mm = AS_MEM(mean.buf), rm = AS_MEM(rstd.buf);
  cl_ulong xo = x.off, go = g.off, mo = mean.off, ro = rstd.off, cr = rows, cc = cols;
  clpar_status s = CLPAR_OK;
  if (dx.buf) {
    cl_mem wm = OPT_MEM(w, x), dxm = AS_MEM(dx.buf);
    cl_ulong wo = w.off, dxo = dx.off;
    cl_int hw = w.buf != NULL;
    karg args[] = {KARG(xm), KARG(xo), KARG(gm), KARG(go),  KARG(mm),  KARG(mo), KARG(rm), KARG(ro),
                   KARG(wm), KARG(wo), KARG(hw), KARG(dxm), KARG(dxo), KARG(cr), KARG(cc)};
    s = clpar_ocl_launch_1d(dev, "layers.cl", "layernorm_backward_dx_f32", args, 15, rows);
  }
  if (s != CLPAR_OK || (!dw.buf && !db.buf)) return s;
  cl_mem dwm = OPT_MEM(dw, x), dbm = OPT_MEM(db, x);
  cl_ulong dwo = dw.off, dbo = db.off;
  cl_int hdw = dw.buf != NULL, hdb = db.buf != NULL;
  karg args[] = {KARG(xm),  KARG(xo),  KARG(gm),  KARG(go),  KARG(mm),  KARG(mo),
                 KARG(rm),  KARG(ro),  KARG(dwm), KARG(dwo), KARG(hdw), KARG(dbm),
                 KARG(dbo), KARG(hdb), KARG(cr),  KARG(cc)};
  return clpar_ocl_launch_1d(dev, "layers.cl", "layernorm_backward_dwdb_f32", args, 16, cols);
}

clpar_status clpar_ocl_dropout_mask(void *dev, size_t n, uint64_t seed, uint64_t offset, float p,
                                    float scale, clpar_bref out) {
  cl_mem om = AS_MEM(out.buf);
  cl_ulong oo = out.off, cn = n, cs = seed, co = offset;
  cl_float cp = p, sc = scale;
  karg args[] = {KARG(om), KARG(oo), KARG(cn), KARG(cs), KARG(co), KARG(cp), KARG(sc)};
  return clpar_ocl_launch_1d(dev, "layers.cl", "dropout_mask_f32", args, 7, n);
}
