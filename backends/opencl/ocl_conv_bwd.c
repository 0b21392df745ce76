/* ocl_conv_bwd.c — the OpenCL backend's whole backward convolution (backend.h's conv2d_backward
 * entry): from gy, each of dx, dw and db whose buffer is set, written whole (db with dw). Each
 * pass has its algorithms, chosen per layer shape by measured time as the forward's are
 * (ocl_conv_algo.c), and cached beside them in the device's entry (ocl_conv_cache.c):
 *
 *   backward data:    im2col (dcol = W^T gy per chunk, col2im), the implicit GEMM of
 *                     conv_bwd.cl (each dx element gathered from gy and W: no column buffer),
 *                     or, for 3x3 stride-1 undilated ungrouped layers with padding at most 2,
 *                     Winograd's F(2x2, 3x3) forward on gy with the rotated, transposed filter
 *                     and padding 2 - p (exactly the backward: conv_flip_f32, then
 *                     ocl_conv_winograd.c);
 *   backward weights: im2col (dW += gy x col^T per chunk) or the implicit GEMM of conv_bwd.cl
 *                     (sums over the batch's positions, split into spans summed in order);
 *   db:               one work-group per channel (conv_bwd_bias_f32), with either.
 *
 * The im2col path is the core's (src/nn/conv.c): 1x1 stride-1 unpadded layers of DIRECT_MIN_P
 * pixels or more multiply the images directly. CLPAR_OCL_CONV_BWD forces one algorithm
 * (im2col, implicit, winograd; a pass it cannot run takes im2col); "auto" or unset chooses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ocl_conv_algo.h"

#define DIRECT_MIN_P 256
#define TIMED_RUNS 2  /* per algorithm, after one untimed run */
#define FAR_OFF 4.0   /* an algorithm this many times slower than im2col is timed once */
#define SPAN_MIN 512  /* fewest positions one split of backward weights sums */
#define MAX_SPLITS 64 /* most splits (partial sums: splits x O x K floats) */
enum { PASS_DATA = 0, PASS_WEIGHT = 1 }; /* tiled kernel kinds CLPAR_OCL_TILES_DATA, _WEIGHT */

static clpar_bref plus(clpar_bref r, size_t off) {
  r.off += off;
  return r;
}

static const clpar_bref no_ref = {NULL, 0};

/* The forward convolution whose output is dx: gy convolved with the rotated, transposed
 * filter, padding k - 1 - p (stride 1, dilation 1, one group). */
static clpar_conv2d_shape flipped(const clpar_conv2d_shape *s) {
  clpar_conv2d_shape t = *s;
  t.c = s->o, t.h = s->oh, t.w = s->ow, t.o = s->c;
  t.ph = s->kh - 1 - s->ph, t.pw = s->kw - 1 - s->pw;
  t.oh = s->h, t.ow = s->w;
  return t;
}

int clpar_ocl_conv_bwd_winograd_fits(const clpar_conv2d_shape *s) {
  if (s->kh != 3 || s->kw != 3 || s->sh != 1 || s->sw != 1 || s->dh != 1 || s->dw != 1 ||
      s->groups != 1 || s->ph > 2 || s->pw > 2)
    return 0;
  clpar_conv2d_shape t = flipped(s);
  return clpar_ocl_conv_winograd_fits(&t);
}

/* ---- the implicit GEMMs ---- */

/* d's kernel of conv_bwd.cl for pass and tiles t, built now if new. */
static clpar_status bwd_kernel(clpar_ocl_device *d, int pass, const clpar_ocl_conv_tiles *t,
                               cl_kernel *out) {
  return clpar_ocl_conv_kind_kernel(d, pass + CLPAR_OCL_TILES_DATA, t, out);
}

/* The geometry as conv_bwd.cl takes it (CI_GEOM). */
typedef struct {
  cl_uint n, c, h, w, o, cg, og, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
} igeom;

static igeom geom_of(const clpar_conv2d_shape *s) {
  igeom g = {(cl_uint)s->n,
             (cl_uint)s->c,
             (cl_uint)s->h,
             (cl_uint)s->w,
             (cl_uint)s->o,
             (cl_uint)(s->c / s->groups),
             (cl_uint)(s->o / s->groups),
             (cl_uint)s->kh,
             (cl_uint)s->kw,
             (cl_uint)s->sh,
             (cl_uint)s->sw,
             (cl_uint)s->ph,
             (cl_uint)s->pw,
             (cl_uint)s->dh,
             (cl_uint)s->dw,
             (cl_uint)s->oh,
             (cl_uint)s->ow};
  return g;
}

/* Sets k's first nargs arguments, then the 17 of g, and enqueues it under d->lock. */
static clpar_status tiled_launch(clpar_ocl_device *d, cl_kernel k, const karg *args, int nargs,
                                 const igeom *g, const size_t *global, const size_t *local) {
  const cl_uint *gv = &g->n;
  pthread_mutex_lock(&d->lock);
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < nargs && err == CL_SUCCESS; i++)
    err = clSetKernelArg(k, (cl_uint)i, args[i].size, args[i].value);
  for (int i = 0; i < 17 && err == CL_SUCCESS; i++)
    err = clSetKernelArg(k, (cl_uint)(nargs + i), sizeof(cl_uint), &gv[i]);
  clpar_status st = CLPAR_OK;
  if (err != CL_SUCCESS) st = clpar_ocl_fail(err, "clSetKernelArg", "conv_bwd.cl");
  cl_event ev;
  if (st == CLPAR_OK &&
      (err = clEnqueueNDRangeKernel(d->queue, k, 3, NULL, global, local, 0, NULL,
                                    clpar_ocl_profile_slot(d, &ev))) != CL_SUCCESS)
    st = clpar_ocl_fail(err, "clEnqueueNDRangeKernel", "conv_bwd.cl");
  if (st == CLPAR_OK) clpar_ocl_profile_keep(d, ev);
  pthread_mutex_unlock(&d->lock);
  return st;
}

/* dx by the implicit GEMM; most > 0: at most that many of its work-groups (a probe: the first
 * column tiles, row tiles and groups), the share of the whole they are into *share. */
static clpar_status data_implicit(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t,
                                  const clpar_conv2d_shape *s, clpar_bref wt, clpar_bref gy,
                                  clpar_bref dx, size_t most, double *share) {
  cl_kernel k;
  clpar_status st = bwd_kernel(d, PASS_DATA, t, &k);
  if (st != CLPAR_OK) return st;
  igeom g = geom_of(s);
  cl_mem gm = AS_MEM(gy.buf), wm = AS_MEM(wt.buf), xm = AS_MEM(dx.buf);
  cl_ulong go = gy.off, wo = wt.off, xo = dx.off;
  karg args[] = {KARG(gm), KARG(go), KARG(wm), KARG(wo), KARG(xm), KARG(xo)};
  size_t L = (size_t)(s->n * s->h * s->w);
  size_t local[3] = {t->tn / t->wn, t->tm / t->wm, 1};
  size_t grid[3] = {(L + t->tn - 1) / t->tn, ((size_t)g.cg + t->tm - 1) / t->tm, (size_t)s->groups};
  double all = (double)grid[0] * (double)grid[1] * (double)grid[2];
  for (int i = 0; i < 3 && most > 0; i++) { /* most >= 1 work-group left per dimension */
    if (grid[i] > most) grid[i] = most;
    most = most / grid[i] > 0 ? most / grid[i] : 1;
  }
  if (share) *share = (double)grid[0] * (double)grid[1] * (double)grid[2] / all;
  size_t global[3] = {grid[0] * local[0], grid[1] * local[1], grid[2]};
  return tiled_launch(d, k, args, 6, &g, global, local);
}

static size_t compute_units(clpar_ocl_device *d) {
  cl_uint cu = 1;
  if (clGetDeviceInfo(d->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL) != CL_SUCCESS ||
      cu < 1)
    cu = 1;
  return cu;
}

/* How many spans backward weights splits the batch's positions into: enough work-groups for
 * the device's compute units (four each), each span at least SPAN_MIN positions, the partial
 * sums (splits x total floats) within the im2col path's column buffer. */
static cl_uint weight_splits(clpar_ocl_device *d, size_t groups_wanted_per, size_t L,
                             size_t total) {
  size_t want = 4 * compute_units(d), splits = (want + groups_wanted_per - 1) / groups_wanted_per;
  size_t most = L / SPAN_MIN,
         room = __atomic_load_n(&clpar_ocl_conv_chunk_floats, __ATOMIC_RELAXED) / total;
  if (splits > most) splits = most;
  if (splits > MAX_SPLITS) splits = MAX_SPLITS;
  if (splits > room) splits = room;
  return splits < 1 ? 1 : (cl_uint)splits;
}

static clpar_status weight_implicit(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t,
                                    const clpar_conv2d_shape *s, clpar_bref x, clpar_bref gy,
                                    clpar_bref dw) {
  cl_kernel k;
  clpar_status st = bwd_kernel(d, PASS_WEIGHT, t, &k);
  if (st != CLPAR_OK) return st;
  igeom g = geom_of(s);
  size_t L = (size_t)(s->n * s->oh * s->ow), Kc = (size_t)g.cg * g.kh * g.kw;
  size_t tiles = (Kc + t->tn - 1) / t->tn * (((size_t)g.og + t->tm - 1) / t->tm);
  size_t total = (size_t)s->o * Kc;
  cl_uint splits = weight_splits(d, tiles * (size_t)s->groups, L, total);
  cl_uint span = (cl_uint)((L + splits - 1) / splits);
  span = (span + t->tk - 1) / t->tk * t->tk;
  void *part = NULL;
  if (splits > 1 && (st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_COLS, splits * total * sizeof(float),
                                            &part)) != CLPAR_OK)
    return st;
  clpar_bref out = splits > 1 ? (clpar_bref){part, 0} : dw;
  cl_mem gm = AS_MEM(gy.buf), xm = AS_MEM(x.buf), om = AS_MEM(out.buf);
  cl_ulong go = gy.off, xo = x.off, oo = out.off;
  karg args[] = {KARG(gm), KARG(go), KARG(xm),     KARG(xo),
                 KARG(om), KARG(oo), KARG(splits), KARG(span)};
  size_t local[3] = {t->tn / t->wn, t->tm / t->wm, 1};
  size_t global[3] = {(Kc + t->tn - 1) / t->tn * local[0],
                      ((size_t)g.og + t->tm - 1) / t->tm * local[1], (size_t)s->groups * splits};
  st = tiled_launch(d, k, args, 8, &g, global, local);
  if (st == CLPAR_OK && splits > 1) {
    cl_mem pm = AS_MEM(part), dm = AS_MEM(dw.buf);
    cl_ulong dof = dw.off, tot = total;
    karg sargs[] = {KARG(pm), KARG(dm), KARG(dof), KARG(splits), KARG(tot)};
    st = clpar_ocl_launch_1d(d, "conv_bwd.cl", "conv_bwd_sum_f32", sargs, 5, total);
  }
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_COLS, part);
  return st;
}

/* db[o] = the sum of gy's channel o over the batch. */
static clpar_status bias_grad(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref gy,
                              clpar_bref db) {
  size_t local = 1;
  while (!d->cpu && local * 2 <= 64 && local * 2 <= d->max_wg_size) local *= 2;
  size_t global = (size_t)s->o * local;
  cl_mem gm = AS_MEM(gy.buf), dm = AS_MEM(db.buf);
  cl_ulong go = gy.off, dof = db.off;
  cl_uint n = (cl_uint)s->n, o = (cl_uint)s->o, p = (cl_uint)(s->oh * s->ow);
  karg args[] = {KARG(gm), KARG(go), KARG(dm), KARG(dof),
                 KARG(n),  KARG(o),  KARG(p),  {local * sizeof(float), NULL}};
  return clpar_ocl_launch(d, "conv_bwd.cl", "conv_bwd_bias_f32", args, 8, 1, &global, &local);
}

/* ---- Winograd on the rotated filter ---- */

static clpar_status data_winograd(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref wt,
                                  clpar_bref gy, clpar_bref dx) {
  size_t count = (size_t)(s->o * s->c * s->kh * s->kw);
  void *wf = NULL;
  clpar_status st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_FLIPPED, count * sizeof(float), &wf);
  if (st != CLPAR_OK) return st;
  cl_mem wm = AS_MEM(wt.buf), fm = AS_MEM(wf);
  cl_ulong wo = wt.off;
  cl_uint o = (cl_uint)s->o, c = (cl_uint)s->c, kh = (cl_uint)s->kh, kw = (cl_uint)s->kw;
  karg args[] = {KARG(wm), KARG(wo), KARG(fm), KARG(o), KARG(c), KARG(kh), KARG(kw)};
  st = clpar_ocl_launch_1d(d, "conv_bwd.cl", "conv_flip_f32", args, 7, count);
  clpar_conv2d_shape t = flipped(s);
  if (st == CLPAR_OK) st = clpar_ocl_conv_winograd(d, &t, gy, (clpar_bref){wf, 0}, no_ref, dx);
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_FLIPPED, wf);
  return st;
}

/* ---- im2col + GEMM ---- */

/* 1x1, stride 1, no padding: dx[b, g] = W_g^T gy[b, g] in one batched GEMM per group; dW_g =
 * the sum over images of gy[b, g] x[b, g]^T, as per-image products [nb, og, cg] (chunks of nb
 * images bound them) summed by a GEMM with ones. */
static clpar_status im2col_direct(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                  clpar_bref wt, clpar_bref gy, clpar_bref dx, clpar_bref dw) {
  size_t P = (size_t)(s->oh * s->ow), cg = (size_t)(s->c / s->groups), n = (size_t)s->n,
         og = (size_t)(s->o / s->groups), o = (size_t)s->o, c = (size_t)s->c, wg = og * cg;
  size_t nb = clpar_ocl_conv_chunk_images(wg, 1, n);
  void *one = NULL, *prod = NULL;
  clpar_status st = CLPAR_OK;
  if (dw.buf) st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_FILTER, nb * sizeof(float), &one);
  if (st == CLPAR_OK && dw.buf)
    st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_COLS, nb * wg * sizeof(float), &prod);
  clpar_bref ob = {one, 0}, pb = {prod, 0};
  if (st == CLPAR_OK && dw.buf) st = ocl_fill(d, ob, nb, 1.0f);
  for (size_t g = 0; st == CLPAR_OK && g < (size_t)s->groups; g++) {
    if (dx.buf)
      st = ocl_gemm_batched(d, 1, 0, cg, P, og, 1.0f, plus(wt, g * wg), cg, 0, plus(gy, g * og * P),
                            P, o * P, 0.0f, plus(dx, g * cg * P), P, c * P, n);
    for (size_t n0 = 0; st == CLPAR_OK && dw.buf && n0 < n; n0 += nb) {
      size_t m = n - n0 < nb ? n - n0 : nb;
      st = ocl_gemm_batched(d, 0, 1, og, cg, P, 1.0f, plus(gy, (n0 * o + g * og) * P), P, o * P,
                            plus(x, (n0 * c + g * cg) * P), P, c * P, 0.0f, pb, cg, wg, m);
      if (st == CLPAR_OK) /* dW_g [1, og cg] (+)= 1 [1, m] @ prod [m, og cg] */
        st = ocl_gemm(d, 0, 0, 1, wg, m, 1.0f, ob, m, pb, wg, n0 ? 1.0f : 0.0f, plus(dw, g * wg),
                      wg);
    }
  }
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_COLS, prod);
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_FILTER, one);
  return st;
}

/* Per chunk of images: gp [O, nb P] = gy swapped, then per group dW_g (+)= gp_g col^T and
 * dcol = W_g^T gp_g, col2im'd (adding) into dx, zeroed first. */
static clpar_status im2col_chunks(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                  clpar_bref wt, clpar_bref gy, clpar_bref dx, clpar_bref dw) {
  size_t P = (size_t)(s->oh * s->ow), cg = (size_t)(s->c / s->groups), n = (size_t)s->n,
         og = (size_t)(s->o / s->groups), K = cg * (size_t)(s->kh * s->kw), o = (size_t)s->o;
  size_t img = (size_t)(s->c * s->h * s->w),
         chunk = clpar_ocl_conv_chunk_images((K > o ? K : o) * P, 1, n);
  void *col = NULL, *gp = NULL;
  clpar_status st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_COLS, K * chunk * P * sizeof(float), &col);
  if (st == CLPAR_OK)
    st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_OUT, o * chunk * P * sizeof(float), &gp);
  if (st == CLPAR_OK && dx.buf) st = ocl_fill(d, dx, n * img, 0.0f);
  clpar_bref cb = {col, 0}, gb = {gp, 0};
  for (size_t n0 = 0; st == CLPAR_OK && n0 < n; n0 += chunk) {
    size_t nb = n - n0 < chunk ? n - n0 : chunk, L = nb * P;
    clpar_conv_geom geom = {(int64_t)nb, (int64_t)cg, s->h,  s->w,  (int64_t)img,
                            s->kh,       s->kw,       s->sh, s->sw, s->ph,
                            s->pw,       s->dh,       s->dw, s->oh, s->ow};
    st = ocl_swap01(d, nb, o, P, plus(gy, n0 * o * P), no_ref, gb);
    for (size_t g = 0; st == CLPAR_OK && g < (size_t)s->groups; g++) {
      clpar_bref xg = plus(x, n0 * img + g * cg * (size_t)(s->h * s->w));
      if (dw.buf) {
        st = ocl_im2col(d, geom, xg, cb);
        if (st == CLPAR_OK)
          st = ocl_gemm(d, 0, 1, og, K, L, 1.0f, plus(gb, g * og * L), L, cb, L, n0 ? 1.0f : 0.0f,
                        plus(dw, g * og * K), K);
      }
      if (st == CLPAR_OK && dx.buf) {
        st = ocl_gemm(d, 1, 0, K, L, og, 1.0f, plus(wt, g * og * K), K, plus(gb, g * og * L), L,
                      0.0f, cb, L);
        if (st == CLPAR_OK)
          st = ocl_col2im(d, geom, cb, plus(dx, n0 * img + g * cg * (size_t)(s->h * s->w)));
      }
    }
  }
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_OUT, gp);
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_COLS, col);
  return st;
}

static int is_direct(const clpar_conv2d_shape *s) {
  return s->kh == 1 && s->kw == 1 && s->sh == 1 && s->sw == 1 && s->ph == 0 && s->pw == 0 &&
         s->oh * s->ow >= DIRECT_MIN_P;
}

/* ---- running and choosing ---- */

/* The algorithm a pass runs: what was asked, or im2col where that cannot run s. */
static int runnable(int pass, int algo, const clpar_conv2d_shape *s) {
  if (algo == CLPAR_OCL_CONV_IMPLICIT && clpar_ocl_conv_implicit_fits(s)) return algo;
  if (algo == CLPAR_OCL_CONV_WINOGRAD && pass == PASS_DATA && clpar_ocl_conv_bwd_winograd_fits(s))
    return algo;
  return CLPAR_OCL_CONV_IM2COL;
}

/* Runs pass data (into dx) with algorithm da and pass weight (into dw) with wa, the implicit
 * GEMMs with tiles t[pass]; either buffer may be absent. Two im2col passes share one walk over
 * the chunks. */
static clpar_status run_passes(clpar_ocl_device *d, const clpar_ocl_conv_tiles t[2],
                               const clpar_conv2d_shape *s, clpar_bref x, clpar_bref wt,
                               clpar_bref gy, clpar_bref dx, int da, clpar_bref dw, int wa) {
  clpar_bref ix = da == CLPAR_OCL_CONV_IM2COL ? dx : no_ref,
             iw = wa == CLPAR_OCL_CONV_IM2COL ? dw : no_ref;
  clpar_status st = CLPAR_OK;
  if (ix.buf || iw.buf)
    st = is_direct(s) ? im2col_direct(d, s, x, wt, gy, ix, iw)
                      : im2col_chunks(d, s, x, wt, gy, ix, iw);
  if (st == CLPAR_OK && dx.buf && da == CLPAR_OCL_CONV_IMPLICIT)
    st = data_implicit(d, &t[PASS_DATA], s, wt, gy, dx, 0, NULL);
  if (st == CLPAR_OK && dx.buf && da == CLPAR_OCL_CONV_WINOGRAD)
    st = data_winograd(d, s, wt, gy, dx);
  if (st == CLPAR_OK && dw.buf && wa == CLPAR_OCL_CONV_IMPLICIT)
    st = weight_implicit(d, &t[PASS_WEIGHT], s, x, gy, dw);
  return st;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds one run of algo for pass takes on the call's own data (best of TIMED_RUNS after one
 * untimed run; just the untimed one when that took over cut seconds, cut > 0); negative when
 * it failed (its error left set). */
static double time_pass(clpar_ocl_device *d, const clpar_ocl_conv_tiles t[2],
                        const clpar_conv2d_shape *s, clpar_bref x, clpar_bref wt, clpar_bref gy,
                        clpar_bref out, int pass, int algo, double cut) {
  clpar_bref dx = pass == PASS_DATA ? out : no_ref, dw = pass == PASS_WEIGHT ? out : no_ref;
  double best = -1, t0 = now();
  clpar_status st = run_passes(d, t, s, x, wt, gy, dx, algo, dw, algo);
  if (st == CLPAR_OK) st = ocl_finish(d);
  if (st == CLPAR_OK && cut > 0 && now() - t0 > cut) return now() - t0;
  for (int r = 0; r < TIMED_RUNS && st == CLPAR_OK; r++) {
    t0 = now();
    st = run_passes(d, t, s, x, wt, gy, dx, algo, dw, algo);
    if (st == CLPAR_OK) st = ocl_finish(d);
    double dt = now() - t0;
    if (st == CLPAR_OK && (best < 0 || dt < best)) best = dt;
  }
  return st == CLPAR_OK ? best : -1;
}

double clpar_ocl_conv_bwd_time(clpar_ocl_device *d, int kind, int algo,
                               const clpar_ocl_conv_tiles *t, const clpar_conv2d_shape *s,
                               clpar_bref x, clpar_bref wt, clpar_bref gy, clpar_bref out) {
  clpar_ocl_conv_tiles both[2] = {{0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}}; /* none for im2col */
  if (t) both[0] = both[1] = *t;
  int pass = kind - CLPAR_OCL_TILES_DATA;
  if (pass != PASS_DATA && pass != PASS_WEIGHT) {
    clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl conv: no backward pass of kind %d", kind);
    return -1;
  }
  return time_pass(d, both, s, x, wt, gy, out, pass, runnable(pass, algo, s), 0);
}

/* Whether algo for pass is hopeless beside a cut of seconds, from a share of one run, its
 * kernels built first (not counted): for backward data by the implicit GEMM, 4 of its
 * work-groups per compute unit (each does the same work), else the batch's first image; when
 * that share, scaled to the whole, takes over cut. Bounds what a slow algorithm costs the
 * first step (PoCL's CPU devices run the implicit GEMMs 10 to 100 times slower than im2col).
 * 0 when it is worth timing whole or failed (timed whole, the failure then warned). */
static int hopeless(clpar_ocl_device *d, const clpar_ocl_conv_tiles t[2],
                    const clpar_conv2d_shape *s, clpar_bref x, clpar_bref wt, clpar_bref gy,
                    clpar_bref out, int pass, int algo, double cut, double *estimate) {
  cl_kernel k;
  int implicit = algo == CLPAR_OCL_CONV_IMPLICIT;
  if (implicit && bwd_kernel(d, pass, &t[pass], &k) != CLPAR_OK) return 0;
  int tiles = implicit && pass == PASS_DATA;
  if (cut <= 0 || (!tiles && s->n < 2)) return 0;
  double share = 1.0 / (double)s->n;
  clpar_conv2d_shape one = *s;
  one.n = 1;
  clpar_bref dx = pass == PASS_DATA ? out : no_ref, dw = pass == PASS_WEIGHT ? out : no_ref;
  double t0 = now();
  clpar_status st =
      tiles ? data_implicit(d, &t[PASS_DATA], s, wt, gy, dx, 4 * compute_units(d), &share)
            : run_passes(d, t, &one, x, wt, gy, dx, algo, dw, algo);
  if (st == CLPAR_OK) st = ocl_finish(d);
  *estimate = (now() - t0) / share;
  return st == CLPAR_OK && share < 1 && *estimate > cut;
}

/* Times each algorithm pass can run on s into out and returns the fastest (im2col when every
 * other failed, each failure warned). */
static int measure_pass(clpar_ocl_device *d, const clpar_ocl_conv_tiles t[2],
                        const clpar_conv2d_shape *s, clpar_bref x, clpar_bref wt, clpar_bref gy,
                        clpar_bref out, int pass) {
  double ms[CLPAR_OCL_CONV_BWD_ALGOS] = {-1, -1, -1, -1}, t0 = now();
  int best = CLPAR_OCL_CONV_IM2COL;
  ms[best] = time_pass(d, t, s, x, wt, gy, out, pass, best, 0);
  double cut = ms[best] > 0 ? FAR_OFF * ms[best] : 0;
  for (int a = CLPAR_OCL_CONV_IMPLICIT; a < CLPAR_OCL_CONV_BWD_ALGOS; a++) {
    if (runnable(pass, a, s) != a) continue;
    if (hopeless(d, t, s, x, wt, gy, out, pass, a, cut, &ms[a])) continue;
    ms[a] = time_pass(d, t, s, x, wt, gy, out, pass, a, cut);
    if (ms[a] < 0)
      clpar_log(CLPAR_LOG_WARN, "opencl: %s: backward %s by %s failed: %s", d->dev_name,
                pass == PASS_DATA ? "data" : "weights", clpar_ocl_conv_algo_name(a),
                clpar_last_error());
    else if (ms[best] < 0 || ms[a] < ms[best])
      best = a;
  }
  clpar_log(CLPAR_LOG_DEBUG,
            "opencl: conv %lldx%lldx%lldx%lld -> %lld k%lldx%lld s%lld backward %s: im2col %.3f "
            "ms, implicit %.3f ms, winograd %.3f ms: %s (timing took %.0f ms)",
            (long long)s->n, (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->o,
            (long long)s->kh, (long long)s->kw, (long long)s->sh,
            pass == PASS_DATA ? "data" : "weights", ms[1] * 1e3, ms[2] * 1e3, ms[3] * 1e3,
            clpar_ocl_conv_algo_name(best), (now() - t0) * 1e3);
  return best;
}

/* The algorithms for the wanted passes: forced, cached, or measured now (and cached). */
static void choose(clpar_ocl_device *d, const clpar_ocl_conv_tiles t[2],
                   const clpar_conv2d_shape *s, clpar_bref x, clpar_bref wt, clpar_bref gy,
                   clpar_bref dx, clpar_bref dw, int *da, int *wa) {
  clpar_ocl_conv_bwd_cached(d, s, da, wa);
  int md = dx.buf && *da == CLPAR_OCL_CONV_AUTO, mw = dw.buf && *wa == CLPAR_OCL_CONV_AUTO;
  if (md) *da = measure_pass(d, t, s, x, wt, gy, dx, PASS_DATA);
  if (mw) *wa = measure_pass(d, t, s, x, wt, gy, dw, PASS_WEIGHT);
  if (md || mw) {
    clpar_ocl_conv_bwd_count(d, 0, 0, 1);
    clpar_ocl_conv_bwd_remember(d, s, md ? *da : CLPAR_OCL_CONV_AUTO,
                                mw ? *wa : CLPAR_OCL_CONV_AUTO, 1);
  }
}

clpar_status clpar_ocl_conv2d_backward(void *dev, clpar_conv2d_shape s, clpar_bref x,
                                       clpar_bref weight, clpar_bref gy, clpar_bref dx,
                                       clpar_bref dw, clpar_bref db) {
  clpar_ocl_device *d = dev;
  if (db.buf && !dw.buf)
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl conv2d_backward: db without dw");
  int forced, done;
  clpar_status st = clpar_ocl_dnnl_conv2d_backward(d, &s, x, weight, gy, dx, dw, db, &done);
  if (st != CLPAR_OK || done) return st;
  st = clpar_ocl_conv_forced("CLPAR_OCL_CONV_BWD", CLPAR_OCL_CONV_BWD_ALGOS, &forced);
  if (st != CLPAR_OK) return st;
  clpar_ocl_conv_tiles t[2] = {clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_DATA),
                               clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_WEIGHT)};
  int da = forced, wa = forced;
  if (forced == CLPAR_OCL_CONV_AUTO) choose(d, t, &s, x, weight, gy, dx, dw, &da, &wa);
  da = runnable(PASS_DATA, da, &s);
  wa = runnable(PASS_WEIGHT, wa, &s);
  st = run_passes(d, t, &s, x, weight, gy, dx, da, dw, wa);
  if (st == CLPAR_ERROR_BUILD || st == CLPAR_ERROR_UNSUPPORTED) { /* a kernel the device refused */
    clpar_log(CLPAR_LOG_WARN, "opencl: %s: %s; this convolution's backward takes im2col",
              d->dev_name, clpar_last_error());
    da = wa = CLPAR_OCL_CONV_IM2COL;
    st = run_passes(d, t, &s, x, weight, gy, dx, da, dw, wa);
  }
  if (st == CLPAR_OK && db.buf) st = bias_grad(d, &s, gy, db);
  if (dx.buf) clpar_ocl_conv_bwd_count(d, PASS_DATA, da, 0);
  if (dw.buf) clpar_ocl_conv_bwd_count(d, PASS_WEIGHT, wa, 0);
  return st;
}
