/* ocl_tune.c — CLBlast's GEMM tuned for the device at hand, and kept.
 *
 * CLBlast picks kernel parameters from a database of devices it has seen; a CPU under PoCL
 * gets generic ones (about 28 GFLOP/s at n = 1024 here, where tuned ones give 2-3x). The tuner
 * times whole CLBlastSgemm calls on the shapes a model runs, with candidate parameters for
 * the indirect kernel (Xgemm), the kernels its path pads and transposes the matrices with
 * (Pad, Transpose, Padtranspose: each candidate against the one kept, in alternating turns),
 * the direct one (XgemmDirect) and the size where CLBlast switches between them
 * (GemmRoutine), each set through CLBlastOverrideParameters. Every candidate's
 * result is checked against double-precision dot products at sampled positions (C is filled
 * with NaN first, so a kernel that skips elements fails too); a candidate that fails to build,
 * errors or computes wrong values is dropped. The fastest combination is kept only if it beats
 * CLBlast's own parameters.
 *
 * The result is a small text file in the cache directory (CLPAR_CACHE_DIR), named after a hash
 * of the device, driver, platform and CLBlast version, which it also repeats. It is read and
 * written with the trusted-file helpers (src/runtime/trusted_file.c: the user's own private
 * directory, regular files of the user's only, atomic replacement), since CLBlast compiles and runs
 * what its parameters say. A stale entry (another driver), a corrupt one or one the helpers refuse
 * is ignored with a warning, as is one whose values CLBlast could not run (params_check).
 * clpar_ocl_tune_apply reads it when a device is opened. This file times and searches; the
 * entry's format and file I/O are in ocl_tune_entry.c, the candidates in
 * ocl_tune_candidates.c. */
#include <clblast_c.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ocl_gemm.h"
#include "ocl_conv_algo.h"
#include "ocl_tune_internal.h"
/* ---- timing candidates ---- */

typedef struct {
  clpar_gemm_shape s;
  size_t lda, ldb, a_count, b_count;
  float *ha, *hb, *hc;
  cl_mem a, b, c;
  size_t pos[SAMPLES]; /* sampled positions of C, row-major */
  double ref[SAMPLES], mag[SAMPLES];
} tune_shape;

static void shape_free(tune_shape *t) {
  if (t->a) clReleaseMemObject(t->a);
  if (t->b) clReleaseMemObject(t->b);
  if (t->c) clReleaseMemObject(t->c);
  free(t->ha);
  free(t->hb);
  free(t->hc);
}

static clpar_status shape_init(clpar_ocl_device *d, tune_shape *t, const clpar_gemm_shape *s,
                               uint64_t seed) {
  memset(t, 0, sizeof *t);
  t->s = *s;
  size_t m = (size_t)s->m, n = (size_t)s->n, k = (size_t)s->k;
  t->lda = s->trans_a ? m : k;
  t->ldb = s->trans_b ? k : n;
  t->a_count = m * k;
  t->b_count = k * n;
  t->ha = malloc(t->a_count * sizeof(float));
  t->hb = malloc(t->b_count * sizeof(float));
  t->hc = malloc(m * n * sizeof(float));
  if (!t->ha || !t->hb || !t->hc)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: tuning buffers");
  for (size_t i = 0; i < t->a_count; i++) t->ha[i] = (float)(lcg(&seed) % 2001) / 1000.0f - 1.0f;
  for (size_t i = 0; i < t->b_count; i++) t->hb[i] = (float)(lcg(&seed) % 2001) / 1000.0f - 1.0f;
  for (int i = 0; i < SAMPLES; i++) {
    size_t r = i == 0 ? 0 : i == 1 ? m - 1 : lcg(&seed) % m;
    size_t c = i == 0 ? 0 : i == 1 ? n - 1 : lcg(&seed) % n;
    double acc = 0, mag = 0;
    for (size_t p = 0; p < k; p++) {
      double x = s->trans_a ? t->ha[p * t->lda + r] : t->ha[r * t->lda + p];
      double y = s->trans_b ? t->hb[c * t->ldb + p] : t->hb[p * t->ldb + c];
      acc += x * y;
      mag += fabs(x * y);
    }
    t->pos[i] = r * n + c;
    t->ref[i] = acc;
    t->mag[i] = mag;
  }
  cl_int err;
  t->a = clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                        t->a_count * sizeof(float), t->ha, &err);
  if (err == CL_SUCCESS)
    t->b = clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                          t->b_count * sizeof(float), t->hb, &err);
  if (err == CL_SUCCESS)
    t->c = clCreateBuffer(d->context, CL_MEM_READ_WRITE, m * n * sizeof(float), NULL, &err);
  if (err != CL_SUCCESS)
    return clpar_set_error(clpar_ocl_status(err), "opencl: tuning buffers: %s",
                           clpar_ocl_error_name(err));
  return CLPAR_OK;
}

static int gemm_once(clpar_ocl_device *d, tune_shape *t) {
  const clpar_gemm_shape *s = &t->s;
  CLBlastStatusCode st =
      CLBlastSgemm(CLBlastLayoutRowMajor, s->trans_a ? CLBlastTransposeYes : CLBlastTransposeNo,
                   s->trans_b ? CLBlastTransposeYes : CLBlastTransposeNo, (size_t)s->m,
                   (size_t)s->n, (size_t)s->k, 1.0f, t->a, 0, t->lda, t->b, 0, t->ldb, 0.0f, t->c,
                   0, (size_t)s->n, &d->queue, NULL);
  return st == CLBlastSuccess && clFinish(d->queue) == CL_SUCCESS ? 0 : -1;
}

/* One GEMM of the shape with the parameters in force: checked (C filled with NaN first), then
 * timed, best of reps. Seconds, or -1 when it failed or computed wrong values. */
static double time_shape(clpar_ocl_device *d, tune_shape *t, int reps) {
  size_t count = (size_t)t->s.m * (size_t)t->s.n;
  float nan_pattern = NAN;
  if (clEnqueueFillBuffer(d->queue, t->c, &nan_pattern, sizeof nan_pattern, 0,
                          count * sizeof(float), 0, NULL, NULL) != CL_SUCCESS ||
      gemm_once(d, t) != 0 ||
      clEnqueueReadBuffer(d->queue, t->c, CL_TRUE, 0, count * sizeof(float), t->hc, 0, NULL,
                          NULL) != CL_SUCCESS)
    return -1;
  double tol = 1.2e-7 * (double)t->s.k + 1e-5;
  for (int i = 0; i < SAMPLES; i++) {
    double got = t->hc[t->pos[i]];
    if (!(fabs(got - t->ref[i]) <= tol * (t->mag[i] + 1.0))) return -1;
  }
  double best = -1;
  for (int r = 0; r < reps; r++) {
    double t0 = clpar_clock_seconds();
    if (gemm_once(d, t) != 0) return -1;
    double dt = clpar_clock_seconds() - t0;
    if (best < 0 || dt < best) best = dt;
  }
  return best;
}

/* ---- the search ---- */

typedef struct {
  clpar_ocl_device *d;
  tune_shape *shapes;
  int n_shapes, reps, done, total;
  const clpar_tune_options *opt;
  clpar_tune_result *result;
} tuner;

static void progress(tuner *t, const char *kernel, int i, int of) {
  t->done++;
  if (!t->opt->progress) return;
  char what[64];
  snprintf(what, sizeof what, "%s %d/%d", kernel, i, of);
  t->opt->progress(t->opt->user, t->done, t->total, what);
}

/* Times every shape with the parameters in force into times[]; total seconds or -1. */
static double time_all(tuner *t, double *times) {
  double total = 0;
  for (int s = 0; s < t->n_shapes; s++) {
    times[s] = time_shape(t->d, &t->shapes[s], t->reps);
    if (times[s] < 0) return -1;
    total += times[s];
  }
  return total;
}

static int routine_force(tuner *t, const clpar_ocl_params *routine, size_t min_indirect) {
  clpar_ocl_params r = *routine;
  return clpar_ocl_param_set(&r, "XGEMM_MIN_INDIRECT_SIZE", min_indirect) == 0 &&
                 clpar_ocl_params_apply(t->d->device, K_ROUTINE, &r) == 0
             ? 0
             : -1;
}

/* Tries each candidate of kernel (the routine forced to it): the fastest (sum over shapes)
 * into *best with its per-shape times in best_times. */
static void search(tuner *t, int kernel, const clpar_ocl_params *cands, int n,
                   clpar_ocl_params *best, double *best_times, double *scratch) {
  double best_total = -1;
  for (int i = 0; i < n; i++) {
    double total = -1;
    if (clpar_ocl_params_apply(t->d->device, kernel, &cands[i]) == 0) total = time_all(t, scratch);
    t->result->candidates_tried++;
    if (total < 0) t->result->candidates_failed++;
    if (total >= 0 && (best_total < 0 || total < best_total)) {
      best_total = total;
      *best = cands[i];
      memcpy(best_times, scratch, (size_t)t->n_shapes * sizeof *scratch);
    }
    progress(t, kernels[kernel], i + 1, n);
  }
}

/* Tries each candidate of kernel against the parameters kept so far (*kept), the routine
 * forced as it is, in alternating turns (kept, candidate, kept, candidate) so that a change
 * in the machine's load falls on both; the best of each's turns counts. A candidate replaces
 * *kept only if it computes right and is faster by more than MARGIN. kept_times gets the
 * per-shape times (best of the turns) of what is kept in the end. */
#define MARGIN 0.02
static void refine(tuner *t, int kernel, const clpar_ocl_params *cands, int n,
                   clpar_ocl_params *kept, double *kept_times, double *scratch) {
  int ns = t->n_shapes;
  double *tk = scratch + ns, *tc = scratch + 2 * ns;
  for (int i = 0; i < n; i++) {
    double sum_k = -1, sum_c = -1;
    for (int s = 0; s < ns; s++) tk[s] = tc[s] = -1;
    for (int turn = 0; turn < 2; turn++) {
      double x =
          clpar_ocl_params_apply(t->d->device, kernel, kept) == 0 ? time_all(t, scratch) : -1;
      if (x >= 0 && (sum_k < 0 || x < sum_k)) sum_k = x;
      for (int s = 0; s < ns && x >= 0; s++)
        if (tk[s] < 0 || scratch[s] < tk[s]) tk[s] = scratch[s];
      double y =
          clpar_ocl_params_apply(t->d->device, kernel, &cands[i]) == 0 ? time_all(t, scratch) : -1;
      if (y < 0) {
        sum_c = -1;
        break;
      }
      if (sum_c < 0 || y < sum_c) sum_c = y;
      for (int s = 0; s < ns; s++)
        if (tc[s] < 0 || scratch[s] < tc[s]) tc[s] = scratch[s];
    }
    t->result->candidates_tried++;
    if (sum_c < 0) t->result->candidates_failed++;
    int better = sum_c >= 0 && sum_k >= 0 && sum_c < sum_k * (1.0 - MARGIN);
    if (better) *kept = cands[i];
    if (sum_k >= 0 || better) memcpy(kept_times, better ? tc : tk, (size_t)ns * sizeof *tk);
    progress(t, kernels[kernel], i + 1, n);
  }
  clpar_ocl_params_apply(t->d->device, kernel, kept);
}

static clpar_status run_search(tuner *t, clpar_ocl_params def[K_COUNT]) {
  clpar_ocl_device *d = t->d;
  const clpar_tune_options *o = t->opt;
  int per_x = o->candidates ? o->candidates : o->quick ? 2 : DEFAULT_XGEMM_CANDIDATES;
  int per_d = o->candidates ? o->candidates : o->quick ? 2 : DEFAULT_DIRECT_CANDIDATES;
  int per_helper = o->candidates ? o->candidates : o->quick ? 1 : DEFAULT_HELPER_CANDIDATES;
  int most = per_helper;
  clpar_ocl_params *cx = calloc((size_t)per_x + 1, sizeof *cx),
                   *cd = calloc((size_t)per_d + 1, sizeof *cd),
                   *ch = calloc((size_t)most * 3, sizeof *ch);
  double *times = calloc((size_t)t->n_shapes * 5, sizeof *times);
  size_t local_mem = clpar_ocl_local_mem(d->device); /* 0: no transpose candidates */
  clpar_status s = CLPAR_OK;
  if (!cx || !cd || !ch || !times) {
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: tuning");
    goto out;
  }
  double *t_ind = times, *t_dir = times + t->n_shapes, *scratch = times + 2 * t->n_shapes;
  /* candidate 0 of each GEMM kernel is CLBlast's own; the helpers start from CLBlast's own */
  cx[0] = def[K_XGEMM];
  cd[0] = def[K_DIRECT];
  int nx = 1 + clpar_ocl_xgemm_candidates(&def[K_XGEMM], d->max_wg_size, cx + 1, per_x);
  int nd = 1 + clpar_ocl_direct_candidates(&def[K_DIRECT], d->max_wg_size, cd + 1, per_d);
  clpar_ocl_params *c_tra = ch, *c_padtra = ch + most, *c_pad = ch + 2 * most;
  int ntra =
      clpar_ocl_transpose_candidates(&def[K_TRA], d->max_wg_size, local_mem, c_tra, per_helper);
  int npadtra = clpar_ocl_padtranspose_candidates(&def[K_PADTRA], d->max_wg_size, local_mem,
                                                  c_padtra, per_helper);
  int npad = clpar_ocl_pad_candidates(&def[K_PAD], d->max_wg_size, c_pad, per_helper);
  t->total = 2 + nx + nd + ntra + npadtra + npad;
  /* CLBlast's parameters throughout: the baseline */
  for (int k = 0; k < K_COUNT; k++) clpar_ocl_params_apply(d->device, k, &def[k]);
  double base = time_all(t, scratch);
  progress(t, "default", 1, 1);
  if (base < 0) {
    s = clpar_set_error(CLPAR_ERROR_BACKEND,
                        "opencl: %s: CLBlast's own GEMM parameters fail on a tuning shape",
                        d->dev_name);
    goto out;
  }
  clpar_ocl_params best[K_COUNT];
  memcpy(best, def, sizeof best);
  for (int i = 0; i < t->n_shapes; i++) t_ind[i] = t_dir[i] = -1;
  if (routine_force(t, &def[K_ROUTINE], 1) == 0) /* m n k < 1: always indirect */
    search(t, K_XGEMM, cx, nx, &best[K_XGEMM], t_ind, scratch);
  clpar_ocl_params_apply(d->device, K_XGEMM, &best[K_XGEMM]);
  /* The indirect path's pad and transpose kernels, with the Xgemm just chosen, each candidate
   * against what is kept so far; t_ind follows what is kept. */
  if (t_ind[0] >= 0 && routine_force(t, &def[K_ROUTINE], 1) == 0) {
    refine(t, K_TRA, c_tra, ntra, &best[K_TRA], t_ind, scratch);
    refine(t, K_PADTRA, c_padtra, npadtra, &best[K_PADTRA], t_ind, scratch);
    refine(t, K_PAD, c_pad, npad, &best[K_PAD], t_ind, scratch);
  } else {
    t->done += ntra + npadtra + npad;
  }
  if (routine_force(t, &def[K_ROUTINE], 1 << 20) == 0) /* always direct */
    search(t, K_DIRECT, cd, nd, &best[K_DIRECT], t_dir, scratch);
  clpar_ocl_params_apply(d->device, K_DIRECT, &best[K_DIRECT]);
  /* The switch-over size: CLBlast runs the direct kernel when m n k < size^3; try the size
   * just above each shape's (and the two extremes) against the times just measured. */
  size_t best_size = *clpar_ocl_param(&best[K_ROUTINE], "XGEMM_MIN_INDIRECT_SIZE");
  double best_pred = -1;
  for (int c = -2; c < t->n_shapes; c++) {
    size_t size = c == -2 ? 1
                  : c == -1
                      ? (size_t)1 << 20
                      : (size_t)ceil(cbrt((double)t->shapes[c].s.m * (double)t->shapes[c].s.n *
                                          (double)t->shapes[c].s.k)) +
                            1;
    double pred = 0;
    for (int i = 0; i < t->n_shapes && pred >= 0; i++) {
      double mnk = (double)t->shapes[i].s.m * (double)t->shapes[i].s.n * (double)t->shapes[i].s.k;
      double ti = mnk < (double)size * size * size ? t_dir[i] : t_ind[i];
      pred = ti < 0 ? -1 : pred + ti;
    }
    if (pred >= 0 && (best_pred < 0 || pred < best_pred)) {
      best_pred = pred;
      best_size = size;
    }
  }
  clpar_ocl_param_set(&best[K_ROUTINE], "XGEMM_MIN_INDIRECT_SIZE", best_size);
  /* The choice against CLBlast's own, timed in turns (ABAB) so that a change in the machine's
   * load falls on both; the best of each counts. */
  double tuned = -1;
  for (int round = 0; round < 3; round++) {
    for (int k = 0; k < K_COUNT; k++) clpar_ocl_params_apply(d->device, k, &best[k]);
    double tt = time_all(t, scratch);
    if (tt < 0) {
      tuned = -1;
      break;
    }
    tuned = tuned < 0 || tt < tuned ? tt : tuned;
    for (int k = 0; k < K_COUNT; k++) clpar_ocl_params_apply(d->device, k, &def[k]);
    double tb = time_all(t, scratch);
    base = tb >= 0 && tb < base ? tb : base;
  }
  progress(t, "final", 1, 1);
  if (tuned < 0 || tuned >= base) { /* keep CLBlast's own */
    for (int k = 0; k < K_COUNT; k++) best[k] = def[k];
    tuned = base;
  }
  for (int k = 0; k < K_COUNT; k++) clpar_ocl_params_apply(d->device, k, &best[k]);
  t->result->default_seconds = base;
  t->result->tuned_seconds = tuned;
  s = clpar_ocl_tune_save(d, best, t->result->path, sizeof t->result->path);
out:
  free(cx);
  free(cd);
  free(ch);
  free(times);
  return s;
}

static int runs_clblast(const clpar_ocl_device *d, const clpar_gemm_shape *s) {
  size_t m = (size_t)s->m, n = (size_t)s->n, k = (size_t)s->k; /* leading dimensions: any fit */
  return !clpar_ocl_gemm_takes_small(d, s->trans_a, s->trans_b, m, n, k) &&
         !clpar_ocl_gemm_takes_tile(d, s->trans_a, s->trans_b, m, n, k, 0, 0, 0);
}

/* The convolution's tiled kernels, after the GEMM (ocl_conv_tune.c): the forward's implicit
 * GEMM, then backward data's and backward weights'; a failure there is a warning, the GEMM's
 * result stands. */
static void tune_conv(clpar_ocl_device *d, int quick) {
  static const char *const what[CLPAR_OCL_TILED_KINDS] = {
      "implicit-GEMM convolution", "backward-data implicit-GEMM", "backward-weights implicit-GEMM"};
  for (int kind = 0; kind < CLPAR_OCL_TILED_KINDS; kind++) {
    clpar_ocl_conv_tune_result r;
    if (clpar_ocl_conv_tune(d, kind, quick ? 2 : 12, &r) != CLPAR_OK)
      clpar_log(CLPAR_LOG_WARN, "opencl: %s: %s tiles not tuned: %s", d->dev_name, what[kind],
                clpar_last_error());
    else
      clpar_log(CLPAR_LOG_INFO,
                "opencl: %s: %s tiles %u %u %u %u %u (%d tried, %d failed, %d too large for the "
                "device): %.3f ms before, %.3f ms after",
                d->dev_name, what[kind], r.tiles.tm, r.tiles.tn, r.tiles.tk, r.tiles.wm, r.tiles.wn,
                r.tried, r.failed, r.unrunnable, r.before * 1e3, r.after * 1e3);
  }
}

clpar_status ocl_tune_gemm(void *dev, const clpar_gemm_shape *shapes, int n_shapes,
                           const clpar_tune_options *options, clpar_tune_result *result) {
  clpar_ocl_device *d = dev;
  clpar_ocl_params def[K_COUNT];
  memset(result, 0, sizeof *result);
  if (clpar_ocl_tune_defaults(d->device, def) != 0)
    return clpar_set_error(CLPAR_ERROR_BACKEND,
                           "opencl: %s: CLBlast does not report its GEMM parameters", d->dev_name);
  for (int k = 0; k < K_COUNT; k++)
    if (!clpar_ocl_param(&def[k], kernel_key[k]))
      return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                             "opencl: CLBlast %s names its GEMM parameters differently",
                             CLPAR_CLBLAST_VERSION);
  /* only the shapes CLBlast runs: on a CPU device most take gemm_small.cl or gemm_tile.cl */
  int n_blast = 0;
  for (int i = 0; i < n_shapes; i++) n_blast += runs_clblast(d, &shapes[i]);
  if (!n_blast)
    return clpar_set_error(
        CLPAR_ERROR_INVALID_ARGUMENT,
        "opencl: %s: none of the %d shapes runs CLBlast on this CPU device (each "
        "takes clpar's own GEMM kernels, gemm_small or gemm_tile: on CPU devices CLBlast "
        "runs only A and B both transposed and a few odd small shapes), so there is "
        "nothing to tune",
        d->dev_name, n_shapes);
  if (n_blast < n_shapes)
    clpar_log(CLPAR_LOG_INFO,
              "opencl: %s: tuning on %d of the %d shapes; the others take clpar's own GEMM "
              "kernels on this CPU device",
              d->dev_name, n_blast, n_shapes);
  tune_shape *ts = calloc((size_t)n_blast, sizeof *ts);
  if (!ts) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: tuning");
  pthread_mutex_lock(&d->lock);
  pthread_mutex_lock(&clpar_ocl_gemm_warmup_lock); /* one device compiles at a time */
  clpar_status s = CLPAR_OK;
  for (int i = 0, j = 0; i < n_shapes && s == CLPAR_OK; i++)
    if (runs_clblast(d, &shapes[i])) s = shape_init(d, &ts[j++], &shapes[i], 7 + i);
  if (s == CLPAR_OK) {
    tuner t = {d, ts, n_blast, options->quick ? 1 : 3, 0, 0, options, result};
    s = run_search(&t, def);
  }
  if (s == CLPAR_OK) atomic_store(&d->gemm_warm, 1); /* CLBlast has compiled for it */
  pthread_mutex_unlock(&clpar_ocl_gemm_warmup_lock);
  pthread_mutex_unlock(&d->lock);
  for (int i = 0; i < n_blast; i++) shape_free(&ts[i]);
  free(ts);
  if (s == CLPAR_OK) tune_conv(d, options->quick);
  return s;
}
