/* ocl_conv.c — the OpenCL backend's convolution, pooling and batch-norm entries (backend.h):
 * argument marshalling for the kernels of kernels/opencl/conv.cl, pool.cl and batchnorm.cl.
 * The GEMMs of a convolution are the backend's ordinary gemm entry (CLBlast); the core
 * (src/nn/conv.c) strings them together. 2-D launches leave the work-group size to the
 * driver (the kernels check their bounds), and the per-channel reductions run one work-group
 * per channel. */
#include "ocl_internal.h"

#define WG_REDUCE 64 /* most work-items per channel in the batch-norm reductions */
#define PER_ITEM 8   /* fewest elements each of them sums (a work-group's tree is not free) */

static clpar_status launch_2d(clpar_ocl_device *d, const char *file, const char *name,
                              const karg *args, int nargs, size_t n0, size_t n1) {
  size_t global[2] = {n0, n1};
  return clpar_ocl_launch(d, file, name, args, nargs, 2, global, NULL);
}

/* A CPU device's batch-norm reductions run one work-item per channel (below); tests clear
 * this to run the work-group path on such a device too. */
int clpar_ocl_bn_serial = 1;

/* One work-group per channel, each reducing per_channel elements; args[nargs - 1] is the
 * kernel's __local scratch. On a CPU device the work-group is one work-item, which reads its
 * channel's planes in order with 8-wide sums (batchnorm.cl): measured on PoCL's pthread
 * device in the ResNet-50 step, the strided 64-item groups took several times longer. Else
 * the work-group is a power of two no larger than a channel needs:
 * a 64-wide tree over the 16 elements of a small micro-batch's channel cost more than the sums
 * (on PoCL, bn_stats over 2048 channels of 16 took 1 ms; DESIGN.md, pipeline). */
static clpar_status launch_channels(clpar_ocl_device *d, const char *name, karg *args, int nargs,
                                    size_t channels, size_t per_channel) {
  size_t local = 1;
  while (!(d->cpu && clpar_ocl_bn_serial) && local * 2 <= WG_REDUCE &&
         local * 2 <= d->max_wg_size && local * 2 * PER_ITEM <= per_channel)
    local *= 2;
  size_t global = channels * local;
  args[nargs - 1].size = local * sizeof(float);
  return clpar_ocl_launch(d, "batchnorm.cl", name, args, nargs, 1, &global, &local);
}

/* The geometry as the kernels take it: 32-bit sizes (a chunk's indices fit; see conv.cl). */
typedef struct {
  cl_uint n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
  cl_ulong img_stride;
} geom32;

static geom32 narrow(clpar_conv_geom g) {
  geom32 r = {(cl_uint)g.n,  (cl_uint)g.c,  (cl_uint)g.h,  (cl_uint)g.w,  (cl_uint)g.kh,
              (cl_uint)g.kw, (cl_uint)g.sh, (cl_uint)g.sw, (cl_uint)g.ph, (cl_uint)g.pw,
              (cl_uint)g.dh, (cl_uint)g.dw, (cl_uint)g.oh, (cl_uint)g.ow, (cl_ulong)g.img_stride};
  return r;
}

clpar_status clpar_ocl_im2col(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref col) {
  geom32 k = narrow(g);
  cl_mem xm = AS_MEM(x.buf), cm = AS_MEM(col.buf);
  cl_ulong xo = x.off, co = col.off;
  karg args[] = {KARG(xm),   KARG(xo),           KARG(cm),   KARG(co),   KARG(k.n),  KARG(k.h),
                 KARG(k.w),  KARG(k.img_stride), KARG(k.kh), KARG(k.kw), KARG(k.sh), KARG(k.sw),
                 KARG(k.ph), KARG(k.pw),         KARG(k.dh), KARG(k.dw), KARG(k.oh), KARG(k.ow)};
  return launch_2d(dev, "conv.cl", "im2col_f32", args, 18, (size_t)(g.n * g.oh),
                   (size_t)(g.c * g.kh * g.kw));
}

clpar_status clpar_ocl_col2im(void *dev, clpar_conv_geom g, clpar_bref col, clpar_bref x) {
  geom32 k = narrow(g);
  cl_mem xm = AS_MEM(x.buf), cm = AS_MEM(col.buf);
  cl_ulong xo = x.off, co = col.off;
  karg args[] = {KARG(cm),   KARG(co),   KARG(xm),   KARG(xo),           KARG(k.n),
                 KARG(k.c),  KARG(k.h),  KARG(k.w),  KARG(k.img_stride), KARG(k.kh),
                 KARG(k.kw), KARG(k.sh), KARG(k.sw), KARG(k.ph),         KARG(k.pw),
                 KARG(k.dh), KARG(k.dw), KARG(k.oh), KARG(k.ow)};
  return launch_2d(dev, "conv.cl", "col2im_f32", args, 19, (size_t)g.h, (size_t)(g.n * g.c));
}

/* A NULL buffer cannot be a kernel argument of every driver: an absent input passes another
 * buffer of the call (never read: the flag says so). */
#define OPT_MEM(ref, other) AS_MEM((ref).buf ? (ref).buf : (other).buf)

clpar_status clpar_ocl_swap01(void *dev, size_t a, size_t b, size_t p, clpar_bref in,
                              clpar_bref bias, clpar_bref out) {
  cl_mem im = AS_MEM(in.buf), bm = OPT_MEM(bias, in), om = AS_MEM(out.buf);
  cl_ulong io = in.off, bo = bias.off, oo = out.off, ca = a, cb = b, cp = p;
  cl_int has_bias = bias.buf != NULL;
  karg args[] = {KARG(im), KARG(io), KARG(bm), KARG(bo), KARG(has_bias),
                 KARG(om), KARG(oo), KARG(ca), KARG(cb), KARG(cp)};
  return launch_2d(dev, "conv.cl", "swap01_f32", args, 10, p, a * b);
}

/* The pooling kernels take their sizes as ints (a plane's positions fit). */
typedef struct {
  cl_int h, w, kh, kw, sh, sw, ph, pw, oh, ow;
} pool32;

static pool32 pool_geom(clpar_conv_geom g) {
  pool32 r = {(cl_int)g.h,  (cl_int)g.w,  (cl_int)g.kh, (cl_int)g.kw, (cl_int)g.sh,
              (cl_int)g.sw, (cl_int)g.ph, (cl_int)g.pw, (cl_int)g.oh, (cl_int)g.ow};
  return r;
}

clpar_status clpar_ocl_maxpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y,
                               clpar_bref idx) {
  pool32 k = pool_geom(g);
  cl_mem xm = AS_MEM(x.buf), ym = AS_MEM(y.buf), im = AS_MEM(idx.buf);
  cl_ulong xo = x.off, yo = y.off, io = idx.off, total = (cl_ulong)(g.n * g.oh * g.ow);
  karg args[] = {KARG(xm),    KARG(xo),   KARG(ym),   KARG(yo),   KARG(im),   KARG(io),
                 KARG(total), KARG(k.h),  KARG(k.w),  KARG(k.kh), KARG(k.kw), KARG(k.sh),
                 KARG(k.sw),  KARG(k.ph), KARG(k.pw), KARG(k.oh), KARG(k.ow)};
  return clpar_ocl_launch_1d(dev, "pool.cl", "max_pool2d_f32", args, 17, total);
}

clpar_status clpar_ocl_maxpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy, clpar_bref idx,
                                        clpar_bref dx) {
  pool32 k = pool_geom(g);
  cl_mem gm = AS_MEM(dy.buf), im = AS_MEM(idx.buf), dm = AS_MEM(dx.buf);
  cl_ulong go = dy.off, io = idx.off, dof = dx.off, total = (cl_ulong)(g.n * g.h * g.w);
  karg args[] = {KARG(gm),    KARG(go),   KARG(im),   KARG(io),   KARG(dm),   KARG(dof),
                 KARG(total), KARG(k.h),  KARG(k.w),  KARG(k.kh), KARG(k.kw), KARG(k.sh),
                 KARG(k.sw),  KARG(k.ph), KARG(k.pw), KARG(k.oh), KARG(k.ow)};
  return clpar_ocl_launch_1d(dev, "pool.cl", "max_pool2d_backward_f32", args, 17, total);
}

clpar_status clpar_ocl_avgpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y) {
  pool32 k = pool_geom(g);
  cl_mem xm = AS_MEM(x.buf), ym = AS_MEM(y.buf);
  cl_ulong xo = x.off, yo = y.off, total = (cl_ulong)(g.n * g.oh * g.ow);
  karg args[] = {KARG(xm),  KARG(xo),  KARG(ym),   KARG(yo),  KARG(total),
                 KARG(k.h), KARG(k.w), KARG(k.oh), KARG(k.ow)};
  return clpar_ocl_launch_1d(dev, "pool.cl", "avg_pool2d_adaptive_f32", args, 9, total);
}

clpar_status clpar_ocl_avgpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy,
                                        clpar_bref dx) {
  pool32 k = pool_geom(g);
  cl_mem gm = AS_MEM(dy.buf), dm = AS_MEM(dx.buf);
  cl_ulong go = dy.off, dof = dx.off, total = (cl_ulong)(g.n * g.h * g.w);
  karg args[] = {KARG(gm),  KARG(go),  KARG(dm),   KARG(dof), KARG(total),
                 KARG(k.h), KARG(k.w), KARG(k.oh), KARG(k.ow)};
  return clpar_ocl_launch_1d(dev, "pool.cl", "avg_pool2d_adaptive_backward_f32", args, 9, total);
}

clpar_status clpar_ocl_bn_stats(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                clpar_bref mean, clpar_bref var, clpar_bref running_mean,
                                clpar_bref running_var, float momentum) {
  cl_mem xm = AS_MEM(x.buf), mm = AS_MEM(mean.buf), vm = AS_MEM(var.buf);
  cl_mem rmm = OPT_MEM(running_mean, mean), rvm = OPT_MEM(running_var, var);
  cl_ulong xo = x.off, mo = mean.off, vo = var.off, rmo = running_mean.off, rvo = running_var.off,
           cn = n, cc = c, cp = p;
  cl_int running = running_mean.buf != NULL;
  karg args[] = {KARG(xm),  KARG(xo),  KARG(mm),  KARG(mo),  KARG(vm),      KARG(vo),
                 KARG(rmm), KARG(rmo), KARG(rvm), KARG(rvo), KARG(running), KARG(momentum),
                 KARG(cn),  KARG(cc),  KARG(cp),  {0, NULL}};
  return launch_channels(dev, "bn_stats_f32", args, 16, c, n * p);
}

clpar_status clpar_ocl_bn_apply(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                clpar_bref mean, clpar_bref var, clpar_bref weight, clpar_bref bias,
                                float eps, clpar_bref y) {
  cl_mem xm = AS_MEM(x.buf), mm = AS_MEM(mean.buf), vm = AS_MEM(var.buf), ym = AS_MEM(y.buf);
  cl_mem wm = OPT_MEM(weight, var), bm = OPT_MEM(bias, var);
  cl_ulong xo = x.off, mo = mean.off, vo = var.off, wo = weight.off, bo = bias.off, yo = y.off,
           cn = n, cc = c, cp = p;
  cl_int has_w = weight.buf != NULL, has_b = bias.buf != NULL;
  karg args[] = {KARG(xm),  KARG(xo), KARG(mm),    KARG(mo), KARG(vm), KARG(vo),
                 KARG(wm),  KARG(wo), KARG(has_w), KARG(bm), KARG(bo), KARG(has_b),
                 KARG(eps), KARG(ym), KARG(yo),    KARG(cn), KARG(cc), KARG(cp)};
  return clpar_ocl_launch_1d(dev, "batchnorm.cl", "bn_apply_f32", args, 18, n * c);
}

clpar_status clpar_ocl_bn_backward_sums(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                        clpar_bref g, clpar_bref mean, clpar_bref var, float eps,
                                        clpar_bref sum_g, clpar_bref sum_gxhat) {
  cl_mem xm = AS_MEM(x.buf), gm = AS_MEM(g.buf), mm = AS_MEM(mean.buf), vm = AS_MEM(var.buf);
  cl_mem sgm = AS_MEM(sum_g.buf), sxm = AS_MEM(sum_gxhat.buf);
  cl_ulong xo = x.off, go = g.off, mo = mean.off, vo = var.off, sgo = sum_g.off,
           sxo = sum_gxhat.off, cn = n, cc = c, cp = p;
  karg args[] = {KARG(xm),  KARG(xo), KARG(gm),  KARG(go),  KARG(mm),  KARG(mo),
                 KARG(vm),  KARG(vo), KARG(eps), KARG(sgm), KARG(sgo), KARG(sxm),
                 KARG(sxo), KARG(cn), KARG(cc),  KARG(cp),  {0, NULL}};
  return launch_channels(dev, "bn_backward_reduce_f32", args, 17, c, n * p);
}

clpar_status clpar_ocl_bn_backward(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                   clpar_bref g, clpar_bref mean, clpar_bref var, clpar_bref weight,
                                   float eps, clpar_bref sum_g, clpar_bref sum_gxhat, int training,
                                   clpar_bref dx) {
  cl_mem xm = AS_MEM(x.buf), gm = AS_MEM(g.buf), mm = AS_MEM(mean.buf), vm = AS_MEM(var.buf);
  cl_mem wm = OPT_MEM(weight, var), sgm = OPT_MEM(sum_g, var), sxm = OPT_MEM(sum_gxhat, var);
  cl_mem dm = AS_MEM(dx.buf);
  cl_ulong xo = x.off, go = g.off, mo = mean.off, vo = var.off, wo = weight.off, sgo = sum_g.off,
           sxo = sum_gxhat.off, dof = dx.off, cn = n, cc = c, cp = p;
  cl_int has_w = weight.buf != NULL, tr = training != 0;
  karg args[] = {KARG(xm),  KARG(xo),  KARG(gm),  KARG(go),  KARG(mm),    KARG(mo),
                 KARG(vm),  KARG(vo),  KARG(wm),  KARG(wo),  KARG(has_w), KARG(eps),
                 KARG(sgm), KARG(sgo), KARG(sxm), KARG(sxo), KARG(tr),    KARG(dm),
                 KARG(dof), KARG(cn),  KARG(cc),  KARG(cp)};
  return clpar_ocl_launch_1d(dev, "batchnorm.cl", "bn_backward_apply_f32", args, 22, n * c);
}
