/* ocl_conv_tune.c — tunes the tiles of the convolution's tiled kernels for a device, each kind
 * on its own (clpar-tune runs them after the GEMM tuning: ocl_tune.c): the forward's implicit
 * GEMM (conv_implicit.cl), and backward data's and backward weights' (conv_bwd.cl: two kernels
 * of different shapes, M x N x K = cg x positions x og kh kw for data and og x cg kh kw x
 * positions for weights, so each takes tiles of its own). Each candidate tile set is timed on
 * four ResNet-50 layer shapes (a 3x3 layer at 16x16, a 3x3 layer at 4x4 with many channels, a
 * 1x1 layer, and the first layer's 7x7 stride-2 convolution of 3 channels: a GEMM with K = 147
 * and N = 8192 positions, at 64x64 input instead of 224x224) and its outputs checked against
 * im2col's for the same pass; the fastest is kept as the device's tiles for that kind
 * (ocl_conv_cache.c: saved in its entry) when it beats the tiles in force. Shapes measured later
 * run with them (ocl_conv_algo.c, ocl_conv_bwd.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_conv_algo.h"

#define N_SHAPES 4
#define MAX_TRIES 24

static const clpar_conv2d_shape tune_shapes[N_SHAPES] = {
    {8, 64, 16, 16, 64, 1, 3, 3, 1, 1, 1, 1, 1, 1, 16, 16},
    {8, 256, 4, 4, 256, 1, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4},
    {8, 256, 8, 8, 64, 1, 1, 1, 1, 1, 0, 0, 1, 1, 8, 8},
    {8, 3, 64, 64, 64, 1, 7, 7, 2, 2, 3, 3, 1, 1, 32, 32},
};

const clpar_conv2d_shape *clpar_ocl_conv_tune_shapes(int *n) {
  *n = N_SHAPES;
  return tune_shapes;
}

/* The floats the largest of the tune shapes' tensors takes. */
static size_t most_floats(void) {
  size_t most = 0;
  for (int i = 0; i < N_SHAPES; i++) {
    const clpar_conv2d_shape *s = &tune_shapes[i];
    size_t f[3] = {(size_t)(s->n * s->c * s->h * s->w), (size_t)(s->o * s->c * s->kh * s->kw),
                   (size_t)(s->n * s->o * s->oh * s->ow)};
    for (int j = 0; j < 3; j++) most = f[j] > most ? f[j] : most;
  }
  return most;
}

/* Candidate i of the grid (TM, TN in 32..128, TK 8 or 16, WM, WN 2..8), in a fixed shuffled
 * order so that a short run samples the whole grid. */
static clpar_ocl_conv_tiles grid(int i) {
  static const unsigned t[] = {32, 64, 128}, k[] = {8, 16}, w[] = {2, 4, 8};
  int j = (i * 37 + 11) % 162; /* 3 * 3 * 2 * 3 * 3 = 162 */
  clpar_ocl_conv_tiles r = {t[j % 3], t[j / 3 % 3], k[j / 9 % 2], w[j / 18 % 3], w[j / 54 % 3]};
  return r;
}

typedef struct {
  int kind;         /* CLPAR_OCL_TILES_* */
  void *x, *w, *gy; /* inputs (gy: the backward's) */
  void *y, *ref;    /* the pass's output, and im2col's per shape */
  float *host, *got;
  size_t floats;
} tune_bufs;

static const char *const kind_name[CLPAR_OCL_TILED_KINDS] = {"forward", "backward data",
                                                             "backward weights"};

/* The floats of kind's output on shape i, and the length of the sums each is. */
static size_t out_floats(int kind, int i, size_t *sum) {
  const clpar_conv2d_shape *s = &tune_shapes[i];
  size_t khw = (size_t)(s->kh * s->kw), cg = (size_t)(s->c / s->groups);
  size_t og = (size_t)(s->o / s->groups), p = (size_t)(s->n * s->oh * s->ow);
  if (kind == CLPAR_OCL_TILES_DATA) return *sum = og * khw, (size_t)(s->n * s->c * s->h * s->w);
  if (kind == CLPAR_OCL_TILES_WEIGHT) return *sum = p, (size_t)s->o * cg * khw;
  return *sum = cg * khw, p * (size_t)s->o;
}

/* Seconds one run of kind's pass by algo (tiles t for the implicit GEMM) takes on shape i into
 * out; negative when it failed. */
static double run_pass(clpar_ocl_device *d, const tune_bufs *b, int algo,
                       const clpar_ocl_conv_tiles *t, int i, clpar_bref out) {
  clpar_bref x = {b->x, 0}, w = {b->w, 0}, gy = {b->gy, 0}, none = {NULL, 0};
  if (b->kind == CLPAR_OCL_TILES_FWD)
    return clpar_ocl_conv_time(d, algo, t, tune_shapes[i], x, w, none, out, 0);
  return clpar_ocl_conv_bwd_time(d, b->kind, algo, t, &tune_shapes[i], x, w, gy, out);
}

static void bufs_free(clpar_ocl_device *d, tune_bufs *b) {
  ocl_release(d, b->x);
  ocl_release(d, b->w);
  ocl_release(d, b->gy);
  ocl_release(d, b->y);
  ocl_release(d, b->ref);
  free(b->host);
  free(b->got);
}

static clpar_status bufs_init(clpar_ocl_device *d, tune_bufs *b) {
  b->floats = most_floats();
  size_t bytes = b->floats * sizeof(float);
  b->host = malloc(bytes);
  b->got = malloc(bytes);
  if (!b->host || !b->got)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl conv tuning: out of host memory");
  uint64_t state = 12345;
  for (size_t i = 0; i < b->floats; i++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    b->host[i] = (float)((state >> 40) & 0xffff) / 32768.0f - 1.0f;
  }
  clpar_status s = ocl_alloc(d, bytes, &b->x);
  if (s == CLPAR_OK) s = ocl_alloc(d, bytes, &b->w);
  if (s == CLPAR_OK) s = ocl_alloc(d, bytes, &b->gy);
  if (s == CLPAR_OK) s = ocl_alloc(d, bytes, &b->y);
  if (s == CLPAR_OK) s = ocl_alloc(d, bytes * N_SHAPES, &b->ref);
  if (s == CLPAR_OK) s = ocl_write(d, b->x, 0, b->host, bytes);
  if (s == CLPAR_OK) s = ocl_write(d, b->w, 0, b->host, bytes);
  if (s == CLPAR_OK) s = ocl_write(d, b->gy, 0, b->host, bytes);
  return s == CLPAR_OK ? ocl_finish(d) : s;
}

/* Whether y of shape i agrees with im2col's (ref) within float rounding of its sums. */
static clpar_status agrees(clpar_ocl_device *d, tune_bufs *b, int i, int *ok) {
  size_t k, n = out_floats(b->kind, i, &k);
  clpar_status st = ocl_read(d, b->y, 0, b->got, n * sizeof(float));
  if (st == CLPAR_OK) st = ocl_read(d, b->ref, i * b->floats * sizeof(float), b->host, n * 4);
  if (st == CLPAR_OK) st = ocl_finish(d);
  *ok = st == CLPAR_OK;
  for (size_t j = 0; j < n && *ok; j++) *ok = fabsf(b->got[j] - b->host[j]) <= 1e-5f * (float)k;
  return st;
}

/* Seconds the implicit GEMM with tiles t takes over the tune shapes (negative: failed or
 * wrong). */
static double time_tiles(clpar_ocl_device *d, tune_bufs *b, const clpar_ocl_conv_tiles *t) {
  double sum = 0;
  clpar_bref y = {b->y, 0};
  for (int i = 0; i < N_SHAPES; i++) {
    double dt = run_pass(d, b, CLPAR_OCL_CONV_IMPLICIT, t, i, y);
    int ok = 0;
    if (dt >= 0 && agrees(d, b, i, &ok) == CLPAR_OK && !ok)
      clpar_log(CLPAR_LOG_INFO, "opencl conv tuning: %s tiles %u %u %u %u %u: wrong results",
                kind_name[b->kind], t->tm, t->tn, t->tk, t->wm, t->wn);
    else if (dt < 0)
      clpar_log(CLPAR_LOG_INFO, "opencl conv tuning: %s tiles %u %u %u %u %u: %s",
                kind_name[b->kind], t->tm, t->tn, t->tk, t->wm, t->wn, clpar_last_error());
    if (dt < 0 || !ok) return -1;
    sum += dt;
  }
  return sum;
}

/* Whether the device runs kind's kernel with tiles t in work-groups of their size: the kernel
 * builds, and its compiled register use leaves room for them (CLPAR_ERROR_UNSUPPORTED
 * otherwise, a GPU's limit, which is not a failure of the tiles). */
static int runnable(clpar_ocl_device *d, int kind, const clpar_ocl_conv_tiles *t) {
  cl_kernel k;
  clpar_status s = clpar_ocl_conv_kind_kernel(d, kind, t, &k);
  if (s != CLPAR_ERROR_UNSUPPORTED) return 1; /* built, or failed: time_tiles counts that */
  clpar_log(CLPAR_LOG_INFO, "opencl conv tuning: %s", clpar_last_error());
  clpar_clear_error();
  return 0;
}

clpar_status clpar_ocl_conv_tune(clpar_ocl_device *d, int kind, int tries,
                                 clpar_ocl_conv_tune_result *r) {
  memset(r, 0, sizeof *r);
  if (kind < 0 || kind >= CLPAR_OCL_TILED_KINDS)
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl conv tuning: no tiled kernel kind %d",
                           kind);
  tune_bufs b = {0};
  b.kind = kind;
  clpar_status s = bufs_init(d, &b);
  for (int i = 0; i < N_SHAPES && s == CLPAR_OK; i++) {
    clpar_bref ref = {b.ref, (size_t)i * b.floats};
    s = run_pass(d, &b, CLPAR_OCL_CONV_IM2COL, NULL, i, ref) < 0 ? CLPAR_ERROR_BACKEND : CLPAR_OK;
  }
  clpar_ocl_conv_tiles held = clpar_ocl_conv_kind_tiles_of(d, kind), best = held;
  r->before = s == CLPAR_OK ? time_tiles(d, &b, &held) : -1;
  r->after = r->before;
  if (tries > MAX_TRIES) tries = MAX_TRIES;
  for (int i = 0, tried = 0; s == CLPAR_OK && tried < tries && i < 162; i++) {
    clpar_ocl_conv_tiles t = grid(i);
    const char *bad;
    if (clpar_ocl_conv_tiles_check(d, &t, &bad) != 0 || memcmp(&t, &held, sizeof t) == 0) continue;
    if (!runnable(d, kind, &t)) {
      r->unrunnable++;
      continue;
    }
    tried++;
    r->tried++;
    double dt = time_tiles(d, &b, &t);
    if (dt < 0) r->failed++;
    if (dt >= 0 && (r->after < 0 || dt < r->after)) r->after = dt, best = t;
  }
  if (s == CLPAR_OK && r->before >= 0 && memcmp(&best, &held, sizeof best) != 0) {
    /* both once more, in turns: the first timing of the tiles in force may have run cold */
    double again = time_tiles(d, &b, &held);
    if (again >= 0 && again < r->before) r->before = again;
    again = time_tiles(d, &b, &best);
    if (again >= 0 && again < r->after) r->after = again;
  }
  if (s == CLPAR_OK && r->after >= 0 && (r->before < 0 || r->after < r->before))
    s = clpar_ocl_conv_set_kind_tiles(d, kind, &best, 1);
  else
    best = held, r->after = r->before;
  r->tiles = best;
  bufs_free(d, &b);
  return s;
}
