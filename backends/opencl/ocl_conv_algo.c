/* ocl_conv_algo.c — the OpenCL backend's whole forward convolution (backend.h's conv2d entry):
 * im2col + GEMM or the implicit GEMM of conv_implicit.cl, chosen per layer shape by measured
 * time (ocl_conv_algo.h says how), as CLBlast chooses between its direct and indirect GEMM;
 * Winograd's F(2x2, 3x3) is a third for the layers it fits (ocl_conv_winograd.c), CLBlast's
 * own convolution (Xconvgemm) a fourth for ungrouped layers.
 * The backward passes choose their own algorithms the same way (ocl_conv_bwd.c).
 *
 * The im2col path is the core's: a 1x1 convolution with stride 1, no padding and at least
 * DIRECT_MIN_P pixels multiplies the images directly (one batched GEMM per group); otherwise
 * chunks of images (columns bounded at clpar_ocl_conv_chunk_floats) are laid out by im2col and
 * multiplied per group, straight into y when an image has DIRECT_MIN_P pixels or more, else into a
 * [O, nb P] buffer that swap01 takes to NCHW. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ocl_conv_algo.h"
#include "ocl_gemm.h"

#define CHUNK_FLOATS ((size_t)16 * 1024 * 1024) /* 64 MiB of columns */
size_t clpar_ocl_conv_chunk_floats = CHUNK_FLOATS;

size_t clpar_ocl_conv_chunk_images(size_t per_image, size_t scale, size_t n) {
  size_t k = scale * __atomic_load_n(&clpar_ocl_conv_chunk_floats, __ATOMIC_RELAXED) / per_image;
  return k < 1 ? 1 : k > n ? n : k;
}
#define DIRECT_MIN_P 256
#define TIMED_RUNS 2 /* per algorithm, after one untimed run (kernel builds, CLBlast's warm-up) */
/* An algorithm this many times slower than im2col is timed once, and the implicit GEMM's other
 * tiles are not tried (on PoCL's CPU devices it is 30 to 100 times slower). */
#define FAR_OFF 4.0

const char *clpar_ocl_conv_algo_name(int algo) {
  return algo == CLPAR_OCL_CONV_IM2COL     ? "im2col"
         : algo == CLPAR_OCL_CONV_IMPLICIT ? "implicit"
         : algo == CLPAR_OCL_CONV_WINOGRAD ? "winograd"
         : algo == CLPAR_OCL_CONV_CONVGEMM ? "convgemm"
                                           : "auto";
}

clpar_status clpar_ocl_conv_forced(const char *var, int algos, int *algo) {
  const char *v = getenv(var);
  *algo = CLPAR_OCL_CONV_AUTO;
  if (!v || !*v || strcmp(v, "auto") == 0) return CLPAR_OK;
  char names[64] = "";
  for (int a = CLPAR_OCL_CONV_IM2COL; a < algos && a < CLPAR_OCL_CONV_ALGOS; a++) {
    if (strcmp(v, clpar_ocl_conv_algo_name(a)) == 0) return *algo = a, CLPAR_OK;
    strcat(strcat(names, clpar_ocl_conv_algo_name(a)), ", ");
  }
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "clpar_conv2d (opencl): %s is \"%.32s\"; need %sor auto", var, v, names);
}

int clpar_ocl_conv_tiles_check(const clpar_ocl_device *d, const clpar_ocl_conv_tiles *t,
                               const char **bad) {
  if (t->wm < 1 || t->wm > 16) return *bad = "WM", -1;
  if (t->wn < 1 || t->wn > 16) return *bad = "WN", -1;
  if (t->tm < t->wm || t->tm > 256 || t->tm % t->wm) return *bad = "TM", -1;
  if (t->tn < t->wn || t->tn > 256 || t->tn % t->wn) return *bad = "TN", -1;
  if (t->tk < 1 || t->tk > 64) return *bad = "TK", -1;
  if ((size_t)(t->tm / t->wm) * (t->tn / t->wn) > d->max_wg_size) return *bad = "TM", -1;
  size_t local = sizeof(float) * t->tk * (t->tm + t->tn);
  cl_ulong have = 0;
  if (clGetDeviceInfo(d->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof have, &have, NULL) !=
          CL_SUCCESS ||
      local > have)
    return *bad = "TK", -1;
  return 0;
}

int clpar_ocl_conv_implicit_fits(const clpar_conv2d_shape *s) {
  const int64_t lim = INT32_MAX;
  return s->n * s->oh * s->ow <= lim && s->c * s->h * s->w <= lim && s->h + 2 * s->ph <= lim &&
         s->w + 2 * s->pw <= lim && (s->c / s->groups) * s->kh * s->kw <= lim && s->o <= lim &&
         s->oh * s->sh <= lim && s->ow * s->sw <= lim && s->kh * s->dh <= lim &&
         s->kw * s->dw <= lim;
}

int clpar_ocl_conv_convgemm_fits(const clpar_conv2d_shape *s) {
  const int64_t lim = INT32_MAX, P = s->oh * s->ow, K = s->c * s->kh * s->kw;
  return s->groups == 1 && s->c * s->h * s->w <= lim / s->n && s->o * P <= lim / s->n &&
         K <= lim / s->o && K <= lim / P && K * P <= lim / s->n && s->h + 2 * s->ph <= lim &&
         s->w + 2 * s->pw <= lim;
}

/* ---- the implicit GEMM ---- */

void clpar_ocl_conv_tile_options(const clpar_ocl_conv_tiles *t, char *buf, size_t size) {
  static const clpar_ocl_conv_tiles def = CLPAR_OCL_CONV_DEFAULT_TILES;
  if (!t) t = &def;
  snprintf(buf, size, "%s -DCI_TM=%u -DCI_TN=%u -DCI_TK=%u -DCI_WM=%u -DCI_WN=%u",
           CLPAR_OCL_BUILD_OPTIONS, t->tm, t->tn, t->tk, t->wm, t->wn);
}

int clpar_ocl_conv_tiled_file(const char *file) {
  return strcmp(file, "conv_implicit.cl") == 0 || strcmp(file, "conv_bwd.cl") == 0;
}

/* d's kernel name of the embedded file for tiles t, kept under kind (0: the forward's), built
 * now if new ("-D" tile options); refused when the driver allows fewer work-items for it than
 * the tiles need (registers). */
clpar_status clpar_ocl_conv_tiled_kernel(clpar_ocl_device *d, int kind, const char *file,
                                         const char *name, const clpar_ocl_conv_tiles *t,
                                         cl_kernel *out) {
  if ((*out = clpar_ocl_conv_kernel_find_kind(d, kind, t))) return CLPAR_OK;
  const clpar_embedded_source *e = clpar_opencl_sources;
  while (e->name && strcmp(e->name, file) != 0) e++;
  if (!e->name) return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl: no %s", file);
  char options[256];
  clpar_ocl_conv_tile_options(t, options, sizeof options);
  cl_program prog;
  clpar_status s = clpar_ocl_program_get(d, file, e->source, e->size, options, &prog);
  if (s != CLPAR_OK) return s;
  cl_int err;
  cl_kernel k = clCreateKernel(prog, name, &err);
  if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clCreateKernel", name);
  size_t most = 0, want = (size_t)(t->tm / t->wm) * (t->tn / t->wn);
  err = clGetKernelWorkGroupInfo(k, d->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof most, &most, NULL);
  if (err != CL_SUCCESS || most < want) {
    clReleaseKernel(k);
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "opencl: %s runs %s with tiles %u %u %u %u %u in groups of at most %zu "
                           "work-items; they need %zu",
                           d->dev_name, name, t->tm, t->tn, t->tk, t->wm, t->wn, most, want);
  }
  clpar_ocl_conv_kernel_keep_kind(d, kind, t, k);
  *out = k;
  return CLPAR_OK;
}

clpar_status clpar_ocl_conv_kind_kernel(clpar_ocl_device *d, int kind,
                                        const clpar_ocl_conv_tiles *t, cl_kernel *out) {
  static const char *const file[CLPAR_OCL_TILED_KINDS] = {"conv_implicit.cl", "conv_bwd.cl",
                                                          "conv_bwd.cl"};
  static const char *const name[CLPAR_OCL_TILED_KINDS] = {"conv_implicit_f32", "conv_bwd_data_f32",
                                                          "conv_bwd_weight_f32"};
  if (kind < 0 || kind >= CLPAR_OCL_TILED_KINDS)
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl: no tiled kernel kind %d", kind);
  return clpar_ocl_conv_tiled_kernel(d, kind, file[kind], name[kind], t, out);
}

static clpar_status implicit_kernel(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t,
                                    cl_kernel *out) {
  return clpar_ocl_conv_kind_kernel(d, CLPAR_OCL_TILES_FWD, t, out);
}

/* The geometry as conv_implicit.cl takes it. */
typedef struct {
  cl_uint n, c, h, w, o, cg, og, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
} igeom;

static clpar_status implicit_launch(clpar_ocl_device *d, cl_kernel k, const karg *args, int nargs,
                                    const size_t *global, const size_t *local) {
  for (int i = 0; i < nargs; i++) {
    cl_int err = clSetKernelArg(k, (cl_uint)i, args[i].size, args[i].value);
    if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clSetKernelArg", "conv_implicit_f32");
  }
  cl_event ev;
  cl_int err = clEnqueueNDRangeKernel(d->queue, k, 3, NULL, global, local, 0, NULL,
                                      clpar_ocl_profile_slot(d, &ev));
  if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clEnqueueNDRangeKernel", "conv_implicit_f32");
  clpar_ocl_profile_keep(d, ev);
  return CLPAR_OK;
}

static clpar_status fwd_implicit(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t,
                                 clpar_conv2d_shape s, clpar_bref x, clpar_bref wt, clpar_bref bias,
                                 clpar_bref y) {
  cl_kernel k;
  clpar_status st = implicit_kernel(d, t, &k);
  if (st != CLPAR_OK) return st;
  igeom g = {(cl_uint)s.n,
             (cl_uint)s.c,
             (cl_uint)s.h,
             (cl_uint)s.w,
             (cl_uint)s.o,
             (cl_uint)(s.c / s.groups),
             (cl_uint)(s.o / s.groups),
             (cl_uint)s.kh,
             (cl_uint)s.kw,
             (cl_uint)s.sh,
             (cl_uint)s.sw,
             (cl_uint)s.ph,
             (cl_uint)s.pw,
             (cl_uint)s.dh,
             (cl_uint)s.dw,
             (cl_uint)s.oh,
             (cl_uint)s.ow};
  cl_mem xm = AS_MEM(x.buf), wm = AS_MEM(wt.buf), ym = AS_MEM(y.buf);
  cl_mem bm = AS_MEM(bias.buf ? bias.buf : wt.buf);
  cl_ulong xo = x.off, wo = wt.off, bo = bias.off, yo = y.off;
  cl_int has_bias = bias.buf != NULL;
  karg args[] = {KARG(xm),       KARG(xo),   KARG(wm),   KARG(wo),   KARG(bm),   KARG(bo),
                 KARG(has_bias), KARG(ym),   KARG(yo),   KARG(g.n),  KARG(g.c),  KARG(g.h),
                 KARG(g.w),      KARG(g.o),  KARG(g.cg), KARG(g.og), KARG(g.kh), KARG(g.kw),
                 KARG(g.sh),     KARG(g.sw), KARG(g.ph), KARG(g.pw), KARG(g.dh), KARG(g.dw),
                 KARG(g.oh),     KARG(g.ow)};
  size_t L = (size_t)(s.n * s.oh * s.ow);
  size_t local[3] = {t->tn / t->wn, t->tm / t->wm, 1};
  size_t global[3] = {(L + t->tn - 1) / t->tn * local[0],
                      ((size_t)g.og + t->tm - 1) / t->tm * local[1], (size_t)s.groups};
  pthread_mutex_lock(&d->lock);
  st = implicit_launch(d, k, args, 26, global, local);
  pthread_mutex_unlock(&d->lock);
  return st;
}

/* ---- im2col + GEMM ---- */

static clpar_bref plus(clpar_bref r, size_t off) {
  r.off += off;
  return r;
}

/* y [n, o, P] += bias[o]. */
static clpar_status bias_add(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref bias,
                             clpar_bref y) {
  cl_mem ym = AS_MEM(y.buf), bm = AS_MEM(bias.buf);
  cl_ulong yo = y.off, bo = bias.off, o = (cl_ulong)s->o, p = (cl_ulong)(s->oh * s->ow),
           total = (cl_ulong)s->n * o * p;
  karg args[] = {KARG(ym), KARG(yo), KARG(bm), KARG(bo), KARG(o), KARG(p), KARG(total)};
  return clpar_ocl_launch_1d(d, "conv_implicit.cl", "conv_bias_add_f32", args, 7, (size_t)total);
}

/* A 1x1 convolution, stride 1, no padding: per group, y[b, g] = W_g @ x[b, g] for every b. */
static clpar_status fwd_direct(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                               clpar_bref wt, clpar_bref bias, clpar_bref y) {
  size_t P = (size_t)(s->oh * s->ow), cg = (size_t)(s->c / s->groups),
         og = (size_t)(s->o / s->groups);
  clpar_status st = CLPAR_OK;
  for (size_t g = 0; st == CLPAR_OK && g < (size_t)s->groups; g++)
    st = ocl_gemm_batched(d, 0, 0, og, P, cg, 1.0f, plus(wt, g * og * cg), cg, 0,
                          plus(x, g * cg * P), P, (size_t)s->c * P, 0.0f, plus(y, g * og * P), P,
                          (size_t)s->o * P, (size_t)s->n);
  return st == CLPAR_OK && bias.buf ? bias_add(d, s, bias, y) : st;
}

static clpar_status fwd_chunks(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                               clpar_bref wt, clpar_bref bias, clpar_bref y) {
  size_t P = (size_t)(s->oh * s->ow), cg = (size_t)(s->c / s->groups), n = (size_t)s->n,
         og = (size_t)(s->o / s->groups), K = cg * (size_t)(s->kh * s->kw), o = (size_t)s->o;
  size_t chunk = clpar_ocl_conv_chunk_images((K > o ? K : o) * P, 1, n),
         img = (size_t)(s->c * s->h * s->w);
  int nchw = P >= DIRECT_MIN_P; /* per-image GEMMs straight into y */
  void *col = NULL, *tmp = NULL;
  clpar_status st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_COLS, K * chunk * P * sizeof(float), &col);
  if (st == CLPAR_OK && !nchw)
    st = clpar_ocl_ws_take(d, CLPAR_OCL_WS_OUT, o * chunk * P * sizeof(float), &tmp);
  clpar_bref cb = {col, 0}, tb = {tmp, 0};
  for (size_t n0 = 0; st == CLPAR_OK && n0 < n; n0 += chunk) {
    size_t nb = n - n0 < chunk ? n - n0 : chunk, L = nb * P;
    clpar_conv_geom geom = {(int64_t)nb, (int64_t)cg, s->h,  s->w,  (int64_t)img,
                            s->kh,       s->kw,       s->sh, s->sw, s->ph,
                            s->pw,       s->dh,       s->dw, s->oh, s->ow};
    for (size_t g = 0; st == CLPAR_OK && g < (size_t)s->groups; g++) {
      st = ocl_im2col(d, geom, plus(x, n0 * img + g * cg * (size_t)(s->h * s->w)), cb);
      if (st == CLPAR_OK && nchw)
        st = ocl_gemm_batched(d, 0, 0, og, P, K, 1.0f, plus(wt, g * og * K), K, 0, cb, L, P, 0.0f,
                              plus(y, (n0 * o + g * og) * P), P, o * P, nb);
      else if (st == CLPAR_OK)
        st = ocl_gemm(d, 0, 0, og, L, K, 1.0f, plus(wt, g * og * K), K, cb, L, 0.0f,
                      plus(tb, g * og * L), L);
    }
    if (st == CLPAR_OK && !nchw) st = ocl_swap01(d, o, nb, P, tb, bias, plus(y, n0 * o * P));
  }
  if (st == CLPAR_OK && nchw && bias.buf) st = bias_add(d, s, bias, y);
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_OUT, tmp);
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_COLS, col);
  return st;
}

/* ---- CLBlast's convgemm ---- */

/* y = Xconvgemm(x, wt), then the bias as im2col adds it; UNSUPPORTED (nothing enqueued) when
 * an offset would overflow CLBlast's 32-bit indices. */
static clpar_status fwd_convgemm(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                 clpar_bref wt, clpar_bref bias, clpar_bref y) {
  const size_t lim = INT32_MAX, xs = (size_t)(s->n * s->c * s->h * s->w),
               ws = (size_t)(s->o * s->c * s->kh * s->kw),
               ys = (size_t)(s->n * s->o * s->oh * s->ow);
  if (xs > lim || ws > lim || ys > lim || x.off > lim - xs || wt.off > lim - ws || y.off > lim - ys)
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "opencl: CLBlastSconvgemm takes offsets below 2^31 elements "
                           "(x %zu, weight %zu, y %zu)",
                           x.off, wt.off, y.off);
  clpar_status st = clpar_ocl_convgemm(d, s, x, wt, y);
  return st == CLPAR_OK && bias.buf ? bias_add(d, s, bias, y) : st;
}

static clpar_status run_algo(clpar_ocl_device *d, int algo, const clpar_ocl_conv_tiles *t,
                             clpar_conv2d_shape s, clpar_bref x, clpar_bref wt, clpar_bref bias,
                             clpar_bref y) {
  if (algo == CLPAR_OCL_CONV_IMPLICIT) return fwd_implicit(d, t, s, x, wt, bias, y);
  if (algo == CLPAR_OCL_CONV_WINOGRAD) return clpar_ocl_conv_winograd(d, &s, x, wt, bias, y);
  if (algo == CLPAR_OCL_CONV_CONVGEMM) return fwd_convgemm(d, &s, x, wt, bias, y);
  int direct = s.kh == 1 && s.kw == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0 &&
               s.oh * s.ow >= DIRECT_MIN_P;
  return direct ? fwd_direct(d, &s, x, wt, bias, y) : fwd_chunks(d, &s, x, wt, bias, y);
}

/* ---- choosing ---- */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds one run of algo takes on the call's own data (best of TIMED_RUNS after one untimed
 * run; after the first timed run when that took over cut seconds, cut > 0); negative when it
 * failed (its error left set). */
double clpar_ocl_conv_time(clpar_ocl_device *d, int algo, const clpar_ocl_conv_tiles *t,
                           clpar_conv2d_shape s, clpar_bref x, clpar_bref wt, clpar_bref bias,
                           clpar_bref y, double cut) {
  cl_kernel k;
  clpar_status st = algo == CLPAR_OCL_CONV_IMPLICIT ? implicit_kernel(d, t, &k) : CLPAR_OK;
  /* the implicit GEMM's untimed run builds nothing (just above), nor does convgemm's once
   * CLBlast has compiled it for d, so it may count */
  int counts = cut > 0 && (algo == CLPAR_OCL_CONV_IMPLICIT ||
                           (algo == CLPAR_OCL_CONV_CONVGEMM && atomic_load(&d->convgemm_warm)));
  double best = -1, t0 = now();
  if (st == CLPAR_OK) st = run_algo(d, algo, t, s, x, wt, bias, y);
  if (st == CLPAR_OK) st = ocl_finish(d);
  if (st == CLPAR_OK && counts && now() - t0 > cut) return now() - t0;
  for (int r = 0; r < TIMED_RUNS && st == CLPAR_OK && !(cut > 0 && best > cut); r++) {
    t0 = now();
    st = run_algo(d, algo, t, s, x, wt, bias, y);
    if (st == CLPAR_OK) st = ocl_finish(d);
    double dt = now() - t0;
    if (st == CLPAR_OK && (best < 0 || dt < best)) best = dt;
  }
  return st == CLPAR_OK ? best : -1;
}

/* Tiles tried besides the device's own when a shape is measured: narrower work-groups with
 * less local memory, and more work per work-item (each new set is one more build of
 * conv_implicit.cl, kept in the kernel caches). */
static const clpar_ocl_conv_tiles tile_candidates[] = {{32, 32, 8, 4, 4}, {128, 64, 8, 8, 4}};
#define N_CANDIDATES (1 + sizeof tile_candidates / sizeof tile_candidates[0])

/* Times Winograd and CLBlast's convgemm where they can run s (seconds into ms[algo]) and
 * returns the fastest of them and best (whose time ms holds). */
static int measure_others(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t, clpar_conv2d_shape s,
                          clpar_bref x, clpar_bref wt, clpar_bref bias, clpar_bref y, double cut,
                          int best, double *ms) {
  for (int a = CLPAR_OCL_CONV_WINOGRAD; a <= CLPAR_OCL_CONV_CONVGEMM; a++) {
    int fits = a == CLPAR_OCL_CONV_WINOGRAD ? clpar_ocl_conv_winograd_fits(&s)
                                            : clpar_ocl_conv_convgemm_fits(&s);
    if (!fits) continue;
    ms[a] = clpar_ocl_conv_time(d, a, t, s, x, wt, bias, y, cut);
    clpar_ocl_conv_count_timed(d, a);
    if (ms[a] < 0)
      clpar_log(CLPAR_LOG_WARN, "opencl: %s: the %s convolution failed: %s", d->dev_name,
                clpar_ocl_conv_algo_name(a), clpar_last_error());
    else if (ms[best] < 0 || ms[a] < ms[best])
      best = a;
  }
  return best;
}

/* Times every algorithm that can run s (the implicit GEMM with each tile candidate d can run),
 * caches the fastest and returns it, its tiles in *t. */
static int measure(clpar_ocl_device *d, clpar_ocl_conv_tiles *t, clpar_conv2d_shape s, clpar_bref x,
                   clpar_bref wt, clpar_bref bias, clpar_bref y) {
  int best = CLPAR_OCL_CONV_IM2COL;
  double im2col = clpar_ocl_conv_time(d, CLPAR_OCL_CONV_IM2COL, t, s, x, wt, bias, y, 0),
         implicit = -1;
  double cut = FAR_OFF * im2col;
  clpar_ocl_conv_count_timed(d, CLPAR_OCL_CONV_IM2COL);
  if (clpar_ocl_conv_implicit_fits(&s)) clpar_ocl_conv_count_timed(d, CLPAR_OCL_CONV_IMPLICIT);
  clpar_ocl_conv_tiles cand[N_CANDIDATES], won = *t;
  size_t nc = 1;
  cand[0] = *t;
  for (size_t i = 0; i < N_CANDIDATES - 1; i++) {
    const char *bad;
    const clpar_ocl_conv_tiles *c = &tile_candidates[i];
    int dup = memcmp(c, t, sizeof *c) == 0;
    if (!dup && clpar_ocl_conv_tiles_check(d, c, &bad) == 0) cand[nc++] = *c;
  }
  for (size_t i = 0; i < nc && clpar_ocl_conv_implicit_fits(&s) && !(cut > 0 && implicit > cut);
       i++) {
    double dt = clpar_ocl_conv_time(d, CLPAR_OCL_CONV_IMPLICIT, &cand[i], s, x, wt, bias, y, cut);
    if (dt < 0)
      clpar_log(CLPAR_LOG_WARN,
                "opencl: %s: the implicit-GEMM convolution (tiles %u %u %u %u %u) "
                "failed: %s",
                d->dev_name, cand[i].tm, cand[i].tn, cand[i].tk, cand[i].wm, cand[i].wn,
                clpar_last_error());
    else if (implicit < 0 || dt < implicit)
      implicit = dt, won = cand[i];
  }
  if (implicit >= 0 && (im2col < 0 || implicit < im2col)) best = CLPAR_OCL_CONV_IMPLICIT;
  double ms[CLPAR_OCL_CONV_ALGOS] = {-1, im2col, implicit, -1, -1};
  best = measure_others(d, t, s, x, wt, bias, y, cut, best, ms);
  clpar_log(CLPAR_LOG_DEBUG,
            "opencl: conv %lldx%lldx%lldx%lld -> %lld k%lldx%lld: im2col %.3f ms, implicit %.3f "
            "ms (tiles %u %u %u %u %u), winograd %.3f ms, convgemm %.3f ms: %s",
            (long long)s.n, (long long)s.c, (long long)s.h, (long long)s.w, (long long)s.o,
            (long long)s.kh, (long long)s.kw, im2col * 1e3, implicit * 1e3, won.tm, won.tn, won.tk,
            won.wm, won.wn, ms[CLPAR_OCL_CONV_WINOGRAD] * 1e3, ms[CLPAR_OCL_CONV_CONVGEMM] * 1e3,
            clpar_ocl_conv_algo_name(best));
  clpar_ocl_conv_count(d, best, 1);
  if (best == CLPAR_OCL_CONV_IMPLICIT) *t = won;
  if (ms[best] >= 0) clpar_ocl_conv_remember(d, &s, best, t, 1);
  return best;
}

clpar_status clpar_ocl_conv2d(void *dev, clpar_conv2d_shape s, clpar_bref x, clpar_bref weight,
                              clpar_bref bias, clpar_bref y) {
  clpar_ocl_device *d = dev;
  int algo, done;
  clpar_status forced = clpar_ocl_dnnl_conv2d(d, &s, x, weight, bias, y, &done);
  if (forced != CLPAR_OK || done) return forced;
  forced = clpar_ocl_conv_forced("CLPAR_OCL_CONV", CLPAR_OCL_CONV_ALGOS, &algo);
  if (forced != CLPAR_OK) return forced;
  clpar_ocl_conv_tiles t = clpar_ocl_conv_tiles_of(d);
  if (algo == CLPAR_OCL_CONV_AUTO) algo = clpar_ocl_conv_cached(d, &s, &t);
  if (algo == CLPAR_OCL_CONV_AUTO) algo = measure(d, &t, s, x, weight, bias, y);
  if ((algo == CLPAR_OCL_CONV_IMPLICIT && !clpar_ocl_conv_implicit_fits(&s)) ||
      (algo == CLPAR_OCL_CONV_WINOGRAD && !clpar_ocl_conv_winograd_fits(&s)) ||
      (algo == CLPAR_OCL_CONV_CONVGEMM && !clpar_ocl_conv_convgemm_fits(&s)))
    algo = CLPAR_OCL_CONV_IM2COL;
  clpar_status st = run_algo(d, algo, &t, s, x, weight, bias, y);
  /* nothing was written to y: a kernel the device refused, or CLBlast's convgemm failing (it
   * writes y with its last kernel only, and the bias comes after) */
  if (st != CLPAR_OK && (algo == CLPAR_OCL_CONV_CONVGEMM ||
                         (algo == CLPAR_OCL_CONV_IMPLICIT &&
                          (st == CLPAR_ERROR_BUILD || st == CLPAR_ERROR_UNSUPPORTED)))) {
    clpar_log(CLPAR_LOG_WARN, "opencl: %s: %s; this convolution takes im2col", d->dev_name,
              clpar_last_error());
    algo = CLPAR_OCL_CONV_IM2COL;
    st = run_algo(d, algo, &t, s, x, weight, bias, y);
  }
  clpar_ocl_conv_count(d, algo, 0);
  return st;
}
