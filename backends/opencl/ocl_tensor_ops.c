/* ocl_tensor_ops.c — the OpenCL backend's tensor-op entries for transformers (backend.h):
 * argument marshalling for the kernels of kernels/opencl/tensor_ops.cl. */
#include "ocl_internal.h"

/* A NULL buffer cannot be a kernel argument of every driver: an absent input passes another
 * buffer of the call (never read: the flag says so). */
#define OPT_MEM(ref, other) AS_MEM((ref).buf ? (ref).buf : (other).buf)

static clpar_status launch_2d(clpar_ocl_device *d, const char *name, const karg *args, int nargs,
                              size_t cols, size_t rows) {
  size_t global[2], local[2];
  clpar_ocl_shape_2d(d, cols, rows, global, local);
  return clpar_ocl_launch(d, "tensor_ops.cl", name, args, nargs, 2, global, local);
}

clpar_status clpar_ocl_strided_copy(void *dev, clpar_strided_geom g, clpar_bref in,
                                    clpar_bref out) {
  cl_mem im = AS_MEM(in.buf), om = AS_MEM(out.buf);
  cl_ulong io = in.off, oo = out.off, total = 1;
  cl_int nd = g.ndim;
  cl_long8 shape, is, os;
  for (int d = 0; d < 8; d++) {
    shape.s[d] = d < g.ndim ? g.shape[d] : 1;
    is.s[d] = d < g.ndim ? g.in_stride[d] : 0;
    os.s[d] = d < g.ndim ? g.out_stride[d] : 0;
    if (d < g.ndim) total *= (cl_ulong)g.shape[d];
  }
  karg args[] = {KARG(im),    KARG(io), KARG(om), KARG(oo),   KARG(nd),
                 KARG(shape), KARG(is), KARG(os), KARG(total)};
  return clpar_ocl_launch_1d(dev, "tensor_ops.cl", "strided_copy_u32", args, 9, (size_t)total);
}

clpar_status clpar_ocl_pointwise(void *dev, clpar_pointwise_kind kind, size_t n, float p,
                                 clpar_bref x, clpar_bref g, clpar_bref out) {
  cl_mem xm = AS_MEM(x.buf), gm = OPT_MEM(g, x), om = AS_MEM(out.buf);
  cl_ulong xo = x.off, go = g.off, oo = out.off, count = n;
  cl_int has_g = g.buf != NULL, k = (cl_int)kind;
  cl_float fp = p;
  karg args[] = {KARG(xm), KARG(xo), KARG(gm),    KARG(go), KARG(has_g),
                 KARG(om), KARG(oo), KARG(count), KARG(k),  KARG(fp)};
  return clpar_ocl_launch_1d(dev, "tensor_ops.cl", "pointwise_f32", args, 10, n);
}

clpar_status clpar_ocl_mask_upper(void *dev, size_t batch, size_t rows, size_t cols,
                                  int64_t diagonal, float value, clpar_bref a, clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong ao = a.off, oo = out.off, r = rows, c = cols, nrows = batch * rows;
  cl_long diag = diagonal;
  cl_float v = value;
  karg args[] = {KARG(am), KARG(ao),    KARG(om),   KARG(oo), KARG(r),
                 KARG(c),  KARG(nrows), KARG(diag), KARG(v)};
  return launch_2d(dev, "mask_upper_f32", args, 9, cols, batch * rows);
}

clpar_status clpar_ocl_argmax(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong ao = a.off, oo = out.off, r = rows, c = cols;
  karg args[] = {KARG(am), KARG(ao), KARG(om), KARG(oo), KARG(r), KARG(c)};
  return clpar_ocl_launch_1d(dev, "tensor_ops.cl", "argmax_f32", args, 6, rows);
}

clpar_status clpar_ocl_nll_ignore(void *dev, size_t rows, size_t cols, int idx64, int64_t ignore,
                                  clpar_bref a, clpar_bref idx, clpar_bref loss,
                                  clpar_bref weight) {
  cl_mem am = AS_MEM(a.buf), im = AS_MEM(idx.buf), lm = AS_MEM(loss.buf), wm = AS_MEM(weight.buf);
  cl_ulong ao = a.off, io = idx.off, lo = loss.off, wo = weight.off, r = rows, c = cols;
  cl_int i64 = idx64;
  cl_long ig = ignore;
  karg args[] = {KARG(am), KARG(ao), KARG(im), KARG(io), KARG(i64), KARG(ig),
                 KARG(lm), KARG(lo), KARG(wm), KARG(wo), KARG(r),   KARG(c)};
  return clpar_ocl_launch_1d(dev, "tensor_ops.cl", "nll_ignore_f32", args, 12, rows);
}

clpar_status clpar_ocl_nll_ignore_backward(void *dev, size_t rows, size_t cols, int idx64,
                                           int64_t ignore, clpar_bref idx, clpar_bref scale,
                                           clpar_bref out) {
  cl_mem im = AS_MEM(idx.buf), sm = AS_MEM(scale.buf), om = AS_MEM(out.buf);
  cl_ulong io = idx.off, so = scale.off, oo = out.off, r = rows, c = cols;
  cl_int i64 = idx64;
  cl_long ig = ignore;
  karg args[] = {KARG(im), KARG(io), KARG(i64), KARG(ig), KARG(sm),
                 KARG(so), KARG(om), KARG(oo),  KARG(r),  KARG(c)};
  return launch_2d(dev, "nll_ignore_backward_f32", args, 10, cols, rows);
}
