/* test_ocl_conv_bwd.c — the OpenCL backend's backward convolution (backends/opencl/
 * ocl_conv_bwd.c): each algorithm, forced through CLPAR_OCL_CONV_BWD (im2col; the implicit
 * GEMMs; Winograd for backward data where it fits and im2col elsewhere), on the shapes the forward
 * test runs (ocl_conv_shapes.h), dx, dw and db against float64 loops computed here; each output
 * alone; the entry's outputs written whole over what was there, and the gradients' accumulation
 * over two backward passes through autograd; im2col's and Winograd's chunks; an unknown
 * CLPAR_OCL_CONV_BWD is an error. Then the choice: measured once per shape and saved as a bwd
 * line of the device's entry, read back without measuring, an entry without bwd lines still
 * loaded, and hostile bwd lines refusing the whole entry. Skips without an OpenCL device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_ocl_conv_util.h"
#include "test_util.h"

static int setup(void **state) {
  return tcu_setup(state, "ocl-conv-bwd");
}

/* ---- the float64 reference ---- */

/* dx, dw, db of s for x, w and gy (double sums, rounded once). */
static void grads_ref(const cshape *s, const float *x, const float *w, const float *gy, float *dx,
                      float *dw, float *db) {
  int64_t oh = cs_out_size(s->h, s->kh, s->sh, s->ph, s->dh);
  int64_t ow = cs_out_size(s->w, s->kw, s->sw, s->pw, s->dw);
  int64_t cg = s->c / s->groups, og = s->o / s->groups;
  size_t nx = (size_t)(s->n * s->c * s->h * s->w), nw = (size_t)(s->o * cg * s->kh * s->kw);
  double *ax = calloc(nx, sizeof *ax), *aw = calloc(nw, sizeof *aw), *ab = calloc(16384, 8);
  for (int64_t n = 0; n < s->n; n++)
    for (int64_t oc = 0; oc < s->o; oc++)
      for (int64_t oy = 0; oy < oh; oy++)
        for (int64_t ox = 0; ox < ow; ox++) {
          double g = gy[((n * s->o + oc) * oh + oy) * ow + ox];
          ab[oc] += g;
          for (int64_t ci = 0; ci < cg; ci++)
            for (int64_t i = 0; i < s->kh; i++)
              for (int64_t j = 0; j < s->kw; j++) {
                int64_t iy = oy * s->sh - s->ph + i * s->dh, ix = ox * s->sw - s->pw + j * s->dw;
                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                int64_t xi = ((n * s->c + oc / og * cg + ci) * s->h + iy) * s->w + ix;
                int64_t wi = ((oc * cg + ci) * s->kh + i) * s->kw + j;
                ax[xi] += g * w[wi];
                aw[wi] += g * x[xi];
              }
        }
  for (size_t i = 0; i < nx; i++) dx[i] = (float)ax[i];
  for (size_t i = 0; i < nw; i++) dw[i] = (float)aw[i];
  for (int64_t i = 0; i < s->o; i++) db[i] = (float)ab[i];
  free(ax), free(aw), free(ab);
}

/* The inputs of a case and its reference gradients. */
typedef struct {
  clpar_tensor *x, *w, *gy;
  float *ref[3];
  size_t n[3];
  double k[3]; /* the sums' lengths, for the tolerance */
} bcase;

static void case_make(clpar_device *dev, const cshape *s, bcase *c) {
  int64_t ys[4] = {s->n, s->o, cs_out_size(s->h, s->kh, s->sh, s->ph, s->dh),
                   cs_out_size(s->w, s->kw, s->sw, s->pw, s->dw)};
  tcu_inputs(dev, s, 21, &c->x, &c->w);
  c->gy = tu_make(dev, 4, ys, 23);
  c->n[0] = (size_t)clpar_tensor_numel(c->x), c->n[1] = (size_t)clpar_tensor_numel(c->w);
  c->n[2] = (size_t)s->o;
  for (int i = 0; i < 3; i++) c->ref[i] = malloc(c->n[i] * sizeof(float));
  float *xv = tu_read(c->x), *wv = tu_read(c->w), *gv = tu_read(c->gy);
  grads_ref(s, xv, wv, gv, c->ref[0], c->ref[1], c->ref[2]);
  free(xv), free(wv), free(gv);
  c->k[0] = (double)(s->o / s->groups * s->kh * s->kw);
  c->k[1] = c->k[2] = (double)(s->n * ys[2] * ys[3]);
}

static void case_free(bcase *c) {
  for (int i = 0; i < 3; i++) free(c->ref[i]);
}

static const char *const part[3] = {"dx", "dw", "db"};

/* got (n floats) against c's reference i times scale. */
static void expect_grad(const bcase *c, int i, const float *got, float scale, const char *what) {
  float *want = malloc(c->n[i] * sizeof *want);
  for (size_t e = 0; e < c->n[i]; e++) want[e] = scale * c->ref[i][e];
  char msg[256];
  snprintf(msg, sizeof msg, "%s %s (%s)", what, part[i], getenv("CLPAR_OCL_CONV_BWD"));
  tu_assert_close(got, want, c->n[i], 1e-4f, (float)(scale * (2e-6 * sqrt(c->k[i]) + 1e-6)), msg);
  free(want);
}

/* The gradients want[] asks for through the core (one backward entry call), checked. */
static void check_grads(clpar_device *dev, const cshape *s, const int want[3], const char *what) {
  clpar_scope *sc = clpar_scope_begin();
  bcase c;
  case_make(dev, s, &c);
  clpar_conv2d_options opt = tcu_opt_of(s);
  clpar_tensor *g[3] = {NULL, NULL, NULL};
  tu_ok(clpar_conv2d_grads(c.x, c.w, &opt, c.gy, want, g));
  for (int i = 0; i < 3; i++) {
    if (!want[i]) continue;
    float *v = tu_read(g[i]);
    expect_grad(&c, i, v, 1.0f, what);
    free(v);
  }
  case_free(&c);
  clpar_scope_end(sc);
}

static int winograd_fits(const cshape *s) {
  return s->kh == 3 && s->kw == 3 && s->sh == 1 && s->sw == 1 && s->dh == 1 && s->dw == 1 &&
         s->groups == 1 && s->ph <= 2 && s->pw <= 2;
}

/* Every shape with algo forced: dx, dw and db checked, each pass run by algo where it can. */
static void check_forced(clpar_device *dev, int algo) {
  clpar_ocl_device *d = tcu_ocl_of(dev);
  clpar_ocl_conv_stats before, c;
  setenv("CLPAR_OCL_CONV_BWD", clpar_ocl_conv_algo_name(algo), 1);
  clpar_ocl_conv_stats_get(d, &before);
  const int all[3] = {1, 1, 1};
  uint64_t fit = 0;
  for (size_t i = 0; i < N_SHAPES; i++) {
    check_grads(dev, &shapes[i].s, all, shapes[i].name);
    fit += algo != CLPAR_OCL_CONV_WINOGRAD || winograd_fits(&shapes[i].s);
  }
  tcu_stats_since(d, &before, &c);
  unsetenv("CLPAR_OCL_CONV_BWD");
  assert_int_equal(c.bwd_runs[0][algo], fit);
  assert_int_equal(c.bwd_runs[0][CLPAR_OCL_CONV_IM2COL] + c.bwd_runs[0][CLPAR_OCL_CONV_IMPLICIT] +
                       c.bwd_runs[0][CLPAR_OCL_CONV_WINOGRAD],
                   N_SHAPES);
  int wa = algo == CLPAR_OCL_CONV_WINOGRAD ? CLPAR_OCL_CONV_IM2COL : algo;
  assert_int_equal(c.bwd_runs[1][wa], N_SHAPES);
  if (algo == CLPAR_OCL_CONV_WINOGRAD) assert_true(fit >= 7);
  assert_int_equal(c.bwd_measured, 0);
}

static void test_im2col_path(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  check_forced(dev, CLPAR_OCL_CONV_IM2COL);
}

static void test_implicit_path(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  check_forced(dev, CLPAR_OCL_CONV_IMPLICIT);
}

static void test_winograd_path(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  check_forced(dev, CLPAR_OCL_CONV_WINOGRAD);
}

/* One output at a time (db alone: the core asks for dw into scratch), each algorithm. */
static void test_each_output_alone(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  const int wants[4][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {0, 1, 1}};
  const size_t pick[] = {0, 1, 5, 8, 16};
  for (int algo = CLPAR_OCL_CONV_IM2COL; algo < CLPAR_OCL_CONV_BWD_ALGOS; algo++) {
    setenv("CLPAR_OCL_CONV_BWD", clpar_ocl_conv_algo_name(algo), 1);
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++)
      for (int k = 0; k < 4; k++)
        check_grads(dev, &shapes[pick[i]].s, wants[k], shapes[pick[i]].name);
  }
  unsetenv("CLPAR_OCL_CONV_BWD");
}

/* The entry writes dx, dw and db whole: what the buffers held before does not show. */
static void test_outputs_written_whole(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  const size_t pick[] = {0, 1, 4, 8, 16};
  for (int algo = CLPAR_OCL_CONV_IM2COL; algo < CLPAR_OCL_CONV_BWD_ALGOS; algo++) {
    setenv("CLPAR_OCL_CONV_BWD", clpar_ocl_conv_algo_name(algo), 1);
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) {
      const cshape *s = &shapes[pick[i]].s;
      clpar_scope *sc = clpar_scope_begin();
      bcase c;
      case_make(dev, s, &c);
      int64_t os = s->o;
      clpar_tensor *g[3] = {tu_make(dev, 4, c.x->shape, 31), tu_make(dev, 4, c.w->shape, 32),
                            tu_make(dev, 1, &os, 33)};
      clpar_conv2d_shape sh = {s->n,  s->c,  s->h,           s->w,          s->o,  s->groups,
                               s->kh, s->kw, s->sh,          s->sw,         s->ph, s->pw,
                               s->dh, s->dw, c.gy->shape[2], c.gy->shape[3]};
      tu_ok(clpar_device_synchronize(dev));
      tu_ok(clpar_ocl_conv2d_backward(d, sh, clpar_tensor_bref(c.x), clpar_tensor_bref(c.w),
                                      clpar_tensor_bref(c.gy), clpar_tensor_bref(g[0]),
                                      clpar_tensor_bref(g[1]), clpar_tensor_bref(g[2])));
      tu_ok(clpar_ocl_finish(d));
      for (int k = 0; k < 3; k++) {
        float *v = tu_read(g[k]);
        expect_grad(&c, k, v, 1.0f, shapes[pick[i]].name);
        free(v);
      }
      case_free(&c);
      clpar_scope_end(sc);
    }
  }
  unsetenv("CLPAR_OCL_CONV_BWD");
}

/* Through autograd, two backward passes add: each gradient is twice the reference. */
static void test_gradients_accumulate(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  const size_t pick[] = {0, 2, 5, 16, 18};
  for (int algo = CLPAR_OCL_CONV_IM2COL; algo < CLPAR_OCL_CONV_BWD_ALGOS; algo++) {
    setenv("CLPAR_OCL_CONV_BWD", clpar_ocl_conv_algo_name(algo), 1);
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) {
      const cshape *s = &shapes[pick[i]].s;
      clpar_scope *sc = clpar_scope_begin();
      bcase c;
      case_make(dev, s, &c);
      clpar_tensor *b = tu_make(dev, 1, &s->o, 34), *y, *prod, *loss;
      tu_ok(clpar_tensor_set_requires_grad(c.x, 1));
      tu_ok(clpar_tensor_set_requires_grad(c.w, 1));
      tu_ok(clpar_tensor_set_requires_grad(b, 1));
      clpar_conv2d_options opt = tcu_opt_of(s);
      for (int pass = 0; pass < 2; pass++) {
        tu_ok(clpar_conv2d(c.x, c.w, b, &opt, &y));
        tu_ok(clpar_mul(y, c.gy, &prod));
        tu_ok(clpar_sum(prod, &loss));
        tu_ok(clpar_backward(loss));
      }
      clpar_tensor *g[3] = {clpar_tensor_grad(c.x), clpar_tensor_grad(c.w), clpar_tensor_grad(b)};
      for (int k = 0; k < 3; k++) {
        float *v = tu_read(g[k]);
        expect_grad(&c, k, v, 2.0f, shapes[pick[i]].name);
        free(v);
      }
      case_free(&c);
      clpar_scope_end(sc);
    }
  }
  unsetenv("CLPAR_OCL_CONV_BWD");
}

/* im2col's and Winograd's chunks of images: one image per chunk, and a few. */
static void test_chunks(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  const size_t floats[] = {1, 7000};
  const int all[3] = {1, 1, 1};
  for (size_t f = 0; f < 2; f++) {
    clpar_ocl_conv_chunk_floats = floats[f];
    for (int algo = CLPAR_OCL_CONV_IM2COL; algo < CLPAR_OCL_CONV_BWD_ALGOS; algo += 2) {
      setenv("CLPAR_OCL_CONV_BWD", clpar_ocl_conv_algo_name(algo), 1);
      for (size_t i = 0; i < N_SHAPES; i += 2) check_grads(dev, &shapes[i].s, all, shapes[i].name);
    }
  }
  unsetenv("CLPAR_OCL_CONV_BWD");
  clpar_ocl_conv_chunk_floats = (size_t)16 * 1024 * 1024;
}

/* Backward weights' implicit GEMM over enough positions to split them into spans (their partial
 * sums added in order), several spans and two (partial sums bounded by the chunk size). */
static void test_weight_spans(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  const cshape wide[] = {{4, 3, 24, 24, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},
                         {3, 4, 20, 21, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1},
                         {5, 2, 17, 19, 70, 2, 3, 2, 1, 0, 1, 1, 2, 1, 1}};
  const int all[3] = {1, 1, 1};
  setenv("CLPAR_OCL_CONV_BWD", "implicit", 1);
  for (int bound = 0; bound < 2; bound++) {
    clpar_ocl_conv_chunk_floats = bound ? 2 * 70 * 2 * 2 * 3 : (size_t)16 * 1024 * 1024;
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++)
      check_grads(dev, &wide[i], all, "wide");
  }
  clpar_ocl_conv_chunk_floats = (size_t)16 * 1024 * 1024;
  unsetenv("CLPAR_OCL_CONV_BWD");
}

/* An unknown CLPAR_OCL_CONV_BWD: an error naming it (the entry runs on the device's worker: it
 * comes back by the next command that waits), nothing run; the device works on after. */
static void test_unknown_forced_value(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  clpar_scope *sc = clpar_scope_begin();
  bcase c;
  case_make(dev, &shapes[0].s, &c);
  clpar_conv2d_options opt = tcu_opt_of(&shapes[0].s);
  const int all[3] = {1, 1, 1};
  clpar_tensor *g[3] = {NULL, NULL, NULL};
  tu_ok(clpar_device_synchronize(dev));
  setenv("CLPAR_OCL_CONV_BWD", "fft", 1);
  clpar_status s = clpar_conv2d_grads(c.x, c.w, &opt, c.gy, all, g);
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  unsetenv("CLPAR_OCL_CONV_BWD");
  assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "CLPAR_OCL_CONV_BWD"));
  case_free(&c);
  clpar_scope_end(sc);
  check_grads(dev, &shapes[0].s, all, "after the error");
}

/* ---- the choice ---- */

static const cshape probe = {1, 4, 6, 6, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};
static const char probe_geom[] = "1 4 6 6 5 1 3 3 1 1 1 1 1 1";

/* The probe's gradients with d's state forgotten (as a new process); the stats' change. */
static clpar_ocl_conv_stats run_probe(clpar_device *dev) {
  clpar_ocl_device *d = tcu_ocl_of(dev);
  clpar_ocl_conv_stats a, b;
  const int all[3] = {1, 1, 1};
  tu_ok(clpar_device_synchronize(dev));
  clpar_ocl_conv_forget(d);
  clpar_ocl_conv_stats_get(d, &a);
  check_grads(dev, &probe, all, "probe");
  tcu_stats_since(d, &a, &b);
  return b;
}

static void test_unknown_shape_is_measured_and_saved(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char path[4096], line[128];
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_stats c = run_probe(dev);
  assert_int_equal(c.bwd_measured, 1);
  size_t len;
  char *saved = tu_slurp(path, &len);
  assert_non_null(saved);
  snprintf(line, sizeof line, "bwd %s ", probe_geom);
  assert_non_null(strstr(saved, line));
  free(saved);
  c = run_probe(dev); /* read back: not measured again */
  assert_int_equal(c.bwd_measured, 0);
  assert_int_equal(c.disk_loads, 1);
  clpar_ocl_conv_forget(d);
  unlink(path);
}

/* Every shape chosen for (each pass timed, slow ones cut short on one image): right whichever
 * algorithm won, each shape timed once. */
static void test_auto_choice_is_right(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char path[4096];
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_forget(d);
  clpar_ocl_conv_stats a, c;
  clpar_ocl_conv_stats_get(d, &a);
  const int all[3] = {1, 1, 1};
  /* wide enough that backward data's implicit GEMM is first run on a share of its tiles */
  const cshape wide = {4, 3, 24, 24, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};
  for (int round = 0; round < 2; round++) {
    for (size_t i = 0; i < N_SHAPES; i++) check_grads(dev, &shapes[i].s, all, shapes[i].name);
    check_grads(dev, &wide, all, "wide");
  }
  tcu_stats_since(d, &a, &c);
  assert_int_equal(c.bwd_measured, N_SHAPES + 1);
  clpar_ocl_conv_forget(d);
  unlink(path);
}

static void test_saved_choice_is_taken(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char h[2048], text[4096];
  tcu_header(d, h, sizeof h);
  const int pairs[][2] = {{CLPAR_OCL_CONV_IMPLICIT, CLPAR_OCL_CONV_IMPLICIT},
                          {CLPAR_OCL_CONV_WINOGRAD, CLPAR_OCL_CONV_IM2COL},
                          {CLPAR_OCL_CONV_IM2COL, CLPAR_OCL_CONV_IMPLICIT}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    snprintf(text, sizeof text, "%sbwd %s %s %s\nend\n", h, probe_geom,
             clpar_ocl_conv_algo_name(pairs[i][0]), clpar_ocl_conv_algo_name(pairs[i][1]));
    tcu_write_entry(d, text, strlen(text));
    clpar_ocl_conv_stats c = run_probe(dev);
    assert_int_equal(c.disk_loads, 1);
    assert_int_equal(c.disk_rejects, 0);
    assert_int_equal(c.bwd_measured, 0);
    assert_int_equal(c.bwd_runs[0][pairs[i][0]], 1);
    assert_int_equal(c.bwd_runs[1][pairs[i][1]], 1);
  }
  /* one pass saved, the other not yet measured: only that one is timed */
  snprintf(text, sizeof text, "%sbwd %s auto implicit\nend\n", h, probe_geom);
  tcu_write_entry(d, text, strlen(text));
  clpar_ocl_conv_stats c = run_probe(dev);
  assert_int_equal(c.disk_rejects, 0);
  assert_int_equal(c.bwd_measured, 1);
  assert_int_equal(c.bwd_runs[1][CLPAR_OCL_CONV_IMPLICIT], 1);
  clpar_ocl_conv_forget(d);
}

/* An entry written before bwd lines existed: its forward choices load, the backward is timed
 * and its line added. */
static void test_entry_without_bwd_lines_loads(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char h[2048], text[4096], path[4096];
  tcu_header(d, h, sizeof h);
  snprintf(text, sizeof text, "%stiles 32 32 8 4 4\nshape %s winograd\nend\n", h, probe_geom);
  tcu_write_entry(d, text, strlen(text));
  clpar_ocl_conv_stats c = run_probe(dev);
  assert_int_equal(c.disk_loads, 1);
  assert_int_equal(c.disk_rejects, 0);
  assert_int_equal(c.bwd_measured, 1);
  clpar_ocl_conv_tiles t = clpar_ocl_conv_tiles_of(d);
  assert_int_equal(t.tm, 32);
  for (int k = CLPAR_OCL_TILES_DATA; k <= CLPAR_OCL_TILES_WEIGHT; k++) { /* the forward's */
    clpar_ocl_conv_tiles b = clpar_ocl_conv_kind_tiles_of(d, k);
    assert_memory_equal(&b, &t, sizeof b);
  }
  assert_int_equal(clpar_ocl_conv_path(d, path, sizeof path), 0);
  size_t len;
  char *saved = tu_slurp(path, &len);
  assert_non_null(saved);
  snprintf(text, sizeof text, "shape %s winograd\n", probe_geom);
  assert_non_null(strstr(saved, text));
  snprintf(text, sizeof text, "bwd %s ", probe_geom);
  assert_non_null(strstr(saved, text));
  free(saved);
  clpar_ocl_conv_forget(d);
  unlink(path);
}

static void test_hostile_bwd_lines_are_refused(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char h[2048], text[4096];
  tcu_header(d, h, sizeof h);
  const char *bodies[][2] = {
      {"an unknown algorithm", "bwd 1 4 6 6 5 1 3 3 1 1 1 1 1 1 fft im2col"},
      {"winograd for weights", "bwd 1 4 6 6 5 1 3 3 1 1 1 1 1 1 im2col winograd"},
      {"winograd, stride 2", "bwd 1 4 6 6 5 1 3 3 2 2 1 1 1 1 winograd im2col"},
      {"winograd, 5x5", "bwd 1 4 6 6 5 1 5 5 1 1 1 1 1 1 winograd im2col"},
      {"winograd, padding 3", "bwd 1 4 6 6 5 1 3 3 1 1 3 3 1 1 winograd im2col"},
      {"both auto", "bwd 1 4 6 6 5 1 3 3 1 1 1 1 1 1 auto auto"},
      {"one algorithm", "bwd 1 4 6 6 5 1 3 3 1 1 1 1 1 1 implicit"},
      {"a third field", "bwd 1 4 6 6 5 1 3 3 1 1 1 1 1 1 implicit implicit 8"},
      {"tiles", "bwd 1 4 6 6 5 1 3 3 1 1 1 1 1 1 implicit 8 8 8 1 1"},
      {"a negative size", "bwd 1 -4 6 6 5 1 3 3 1 1 1 1 1 1 im2col im2col"},
      {"groups not dividing", "bwd 1 4 6 6 5 3 3 3 1 1 1 1 1 1 im2col im2col"},
      {"a huge size", "bwd 1 4 6 6 5 1 3 3 1 1 1 1 1 99999999999 im2col im2col"},
      {"a short line", "bwd 1 4 6 implicit implicit"},
      {"no fields", "bwd"},
      {"bwd-tiles of no pass", "bwd-tiles forward 32 32 8 4 4"},
      {"bwd-tiles, no pass", "bwd-tiles 32 32 8 4 4"},
      {"bwd-tiles, no space", "bwd-tiles data32 32 8 4 4"},
      {"bwd-tiles, four sizes", "bwd-tiles data 32 32 8 4"},
      {"bwd-tiles, six sizes", "bwd-tiles weights 32 32 8 4 4 4"},
      {"bwd-tiles, a word", "bwd-tiles weights 32 32 8 4 four"},
      {"bwd-tiles, TM not a multiple", "bwd-tiles data 30 32 8 4 4"},
      {"bwd-tiles, too many work-items", "bwd-tiles weights 256 256 8 1 1"},
      {"bwd-tiles, TK 0", "bwd-tiles data 32 32 0 4 4"},
      {"bwd-tiles, negative", "bwd-tiles data -32 32 8 4 4"},
      {"bwd-tiles, huge", "bwd-tiles weights 99999999999 32 8 4 4"},
      {"bwd-tiles alone", "bwd-tiles"},
      {"bwd-tiles, a pass alone", "bwd-tiles data"},
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    snprintf(text, sizeof text, "%s%s\nend\n", h, bodies[i][1]);
    tcu_write_entry(d, text, strlen(text));
    clpar_ocl_conv_stats c = run_probe(dev);
    if (c.disk_rejects != 1 || c.bwd_measured != 1)
      fail_msg("%s: rejects %llu, measured %llu", bodies[i][0], (unsigned long long)c.disk_rejects,
               (unsigned long long)c.bwd_measured);
  }
  char path[4096];
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_forget(d);
}

/* Tiles of each backward pass's own, apart from the forward's and from each other's (not on the
 * tuner's grid, so built here first). */
static const clpar_ocl_conv_tiles data_tiles = {32, 16, 8, 4, 2}, weight_tiles = {16, 32, 4, 2, 4};

/* An entry with bwd-tiles lines loads: each pass takes its own tiles, the forward its own. */
static void test_entry_with_bwd_tiles_loads(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char h[2048], text[4096], path[4096];
  tcu_header(d, h, sizeof h);
  snprintf(text, sizeof text,
           "%stiles 32 32 8 4 4\nbwd-tiles data 32 16 8 4 2\nbwd-tiles weights 16 32 4 2 4\n"
           "bwd %s implicit implicit\nend\n",
           h, probe_geom);
  tcu_write_entry(d, text, strlen(text));
  clpar_ocl_conv_stats c = run_probe(dev);
  assert_int_equal(c.disk_rejects, 0);
  assert_int_equal(c.disk_loads, 1);
  assert_int_equal(c.bwd_measured, 0);
  assert_int_equal(c.bwd_runs[0][CLPAR_OCL_CONV_IMPLICIT], 1);
  assert_int_equal(c.bwd_runs[1][CLPAR_OCL_CONV_IMPLICIT], 1);
  clpar_ocl_conv_tiles f = clpar_ocl_conv_tiles_of(d),
                       td = clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_DATA),
                       tw = clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_WEIGHT);
  assert_int_equal(f.tn, 32);
  assert_memory_equal(&td, &data_tiles, sizeof td);
  assert_memory_equal(&tw, &weight_tiles, sizeof tw);
  /* the probe ran each pass with its own tiles */
  assert_non_null(clpar_ocl_conv_kernel_find_kind(d, CLPAR_OCL_TILES_DATA, &data_tiles));
  assert_non_null(clpar_ocl_conv_kernel_find_kind(d, CLPAR_OCL_TILES_WEIGHT, &weight_tiles));
  assert_null(clpar_ocl_conv_kernel_find_kind(d, CLPAR_OCL_TILES_WEIGHT, &data_tiles));
  assert_null(clpar_ocl_conv_kernel_find_kind(d, CLPAR_OCL_TILES_DATA, &weight_tiles));
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_forget(d);
}

/* Tiles set for each pass are saved as bwd-tiles lines, read back by a new "process", and the
 * implicit GEMMs with them are right on ResNet-50's shapes. */
static void test_pass_tiles_saved_and_run(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char path[4096];
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_forget(d);
  clpar_ocl_conv_tiles fwd = clpar_ocl_conv_tiles_of(d);
  tu_ok(clpar_ocl_conv_set_kind_tiles(d, CLPAR_OCL_TILES_DATA, &data_tiles, 1));
  tu_ok(clpar_ocl_conv_set_kind_tiles(d, CLPAR_OCL_TILES_WEIGHT, &weight_tiles, 1));
  const clpar_ocl_conv_tiles bad = {30, 32, 8, 4, 4};
  assert_int_equal(clpar_ocl_conv_set_kind_tiles(d, CLPAR_OCL_TILES_DATA, &bad, 1),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_ocl_conv_forget(d);
  clpar_ocl_conv_tiles f = clpar_ocl_conv_tiles_of(d),
                       td = clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_DATA),
                       tw = clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_WEIGHT);
  assert_memory_equal(&f, &fwd, sizeof f);
  assert_memory_equal(&td, &data_tiles, sizeof td);
  assert_memory_equal(&tw, &weight_tiles, sizeof tw);
  size_t len;
  char *saved = tu_slurp(path, &len);
  assert_non_null(saved);
  assert_non_null(strstr(saved, "\nbwd-tiles data 32 16 8 4 2\n"));
  assert_non_null(strstr(saved, "\nbwd-tiles weights 16 32 4 2 4\n"));
  assert_null(strstr(saved, "\ntiles ")); /* the forward's were not set */
  free(saved);
  const int all[3] = {1, 1, 1};
  setenv("CLPAR_OCL_CONV_BWD", "implicit", 1);
  for (size_t i = 0; i < N_SHAPES; i++)
    if (strncmp(shapes[i].name, "resnet50", 8) == 0)
      check_grads(dev, &shapes[i].s, all, shapes[i].name);
  unsetenv("CLPAR_OCL_CONV_BWD");
  clpar_ocl_conv_forget(d);
  unlink(path);
}

/* The tile tuner of each backward pass (clpar-tune's, after the forward's): two candidates,
 * checked against im2col and timed; the kept tiles are in force for that pass alone, read back
 * by a new "process", and the backward with them is right on ResNet-50's shapes. */
static void test_bwd_tile_tuning(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char path[4096];
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_forget(d);
  clpar_ocl_conv_tiles fwd = clpar_ocl_conv_tiles_of(d), kept[2];
  for (int p = 0; p < 2; p++) {
    clpar_ocl_conv_tune_result r;
    tu_ok(clpar_ocl_conv_tune(d, CLPAR_OCL_TILES_DATA + p, 2, &r));
    assert_int_equal(r.tried, 2);
    assert_int_equal(r.failed, 0);
    assert_true(r.before > 0 && r.after > 0 && r.after <= r.before);
    kept[p] = clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_DATA + p);
    assert_memory_equal(&kept[p], &r.tiles, sizeof kept[p]);
  }
  clpar_ocl_conv_forget(d); /* a new "process": the kept tiles come from the entry */
  clpar_ocl_conv_tiles f = clpar_ocl_conv_tiles_of(d);
  assert_memory_equal(&f, &fwd, sizeof f);
  for (int p = 0; p < 2; p++) {
    clpar_ocl_conv_tiles back = clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_DATA + p);
    assert_memory_equal(&back, &kept[p], sizeof back);
  }
  const int all[3] = {1, 1, 1};
  setenv("CLPAR_OCL_CONV_BWD", "implicit", 1);
  for (size_t i = 0; i < N_SHAPES; i++)
    if (strncmp(shapes[i].name, "resnet50", 8) == 0)
      check_grads(dev, &shapes[i].s, all, shapes[i].name);
  unsetenv("CLPAR_OCL_CONV_BWD");
  assert_non_null(clpar_ocl_conv_kernel_find_kind(d, CLPAR_OCL_TILES_DATA, &kept[0]));
  assert_non_null(clpar_ocl_conv_kernel_find_kind(d, CLPAR_OCL_TILES_WEIGHT, &kept[1]));
  clpar_ocl_conv_forget(d);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_im2col_path),
      cmocka_unit_test(test_implicit_path),
      cmocka_unit_test(test_winograd_path),
      cmocka_unit_test(test_each_output_alone),
      cmocka_unit_test(test_outputs_written_whole),
      cmocka_unit_test(test_gradients_accumulate),
      cmocka_unit_test(test_chunks),
      cmocka_unit_test(test_weight_spans),
      cmocka_unit_test(test_unknown_forced_value),
      cmocka_unit_test(test_unknown_shape_is_measured_and_saved),
      cmocka_unit_test(test_auto_choice_is_right),
      cmocka_unit_test(test_saved_choice_is_taken),
      cmocka_unit_test(test_entry_without_bwd_lines_loads),
      cmocka_unit_test(test_hostile_bwd_lines_are_refused),
      cmocka_unit_test(test_entry_with_bwd_tiles_loads),
      cmocka_unit_test(test_pass_tiles_saved_and_run),
      cmocka_unit_test(test_bwd_tile_tuning),
  };
  return cmocka_run_group_tests(tests, setup, tcu_teardown);
}
