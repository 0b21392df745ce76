/* test_ocl_conv.c — the OpenCL backend's forward convolution (backends/opencl/ocl_conv_algo.c):
 * each algorithm (im2col + GEMM, the implicit GEMM, Winograd's F(2x2, 3x3) and CLBlast's
 * convgemm where they fit and im2col where they do not), forced through CLPAR_OCL_CONV (which
 * CLPAR_OCL_CONV_BWD refuses for convgemm), against a float64 loop computed here
 * over stride, padding, dilation, groups (depthwise included), odd sizes, batch 1, bias or none,
 * tiles that do not divide the sizes, other tile sizes, and exact ResNet-50 layer shapes at
 * small spatial sizes; the tile tuner; then the choice: a saved entry picks the algorithm it names
 * without measuring (with the implicit GEMM's tiles it names), an unknown shape is measured once
 * (each algorithm that fits, the implicit GEMM with several tile sets) and saved, and a hostile
 * entry (other format, device, an unknown algorithm, sizes out of range or that no convolution
 * has, tiles the device cannot run, convgemm for a grouped shape or a backward pass, truncated, a
 * NUL byte, group-writable, a symbolic link) is refused with a
 * warning and the shape measured instead. Skips without an OpenCL device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_ocl_conv_util.h"
#include "test_util.h"

static int setup(void **state) {
  return tcu_setup(state, "ocl-conv");
}

/* ---- one convolution against the float64 loop ---- */

static void conv_ref(const cshape *s, const float *x, const float *w, const float *b, float *y) {
  int64_t oh = cs_out_size(s->h, s->kh, s->sh, s->ph, s->dh);
  int64_t ow = cs_out_size(s->w, s->kw, s->sw, s->pw, s->dw);
  int64_t cg = s->c / s->groups, og = s->o / s->groups;
  for (int64_t n = 0; n < s->n; n++)
    for (int64_t oc = 0; oc < s->o; oc++)
      for (int64_t oy = 0; oy < oh; oy++)
        for (int64_t ox = 0; ox < ow; ox++) {
          double acc = s->bias ? b[oc] : 0.0;
          int64_t g = oc / og;
          for (int64_t ci = 0; ci < cg; ci++)
            for (int64_t i = 0; i < s->kh; i++)
              for (int64_t j = 0; j < s->kw; j++) {
                int64_t iy = oy * s->sh - s->ph + i * s->dh, ix = ox * s->sw - s->pw + j * s->dw;
                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                acc += (double)x[((n * s->c + g * cg + ci) * s->h + iy) * s->w + ix] *
                       w[((oc * cg + ci) * s->kh + i) * s->kw + j];
              }
          y[((n * s->o + oc) * oh + oy) * ow + ox] = (float)acc;
        }
}

static void check_shape(clpar_device *dev, const cshape *s, const char *what) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *w, *b = NULL, *y;
  tcu_inputs(dev, s, 11, &x, &w);
  if (s->bias) b = tu_make(dev, 1, &s->o, 13);
  clpar_conv2d_options opt = tcu_opt_of(s);
  tu_ok(clpar_conv2d(x, w, b, &opt, &y));
  float *xv = tu_read(x), *wv = tu_read(w), *bv = b ? tu_read(b) : NULL, *yv = tu_read(y);
  int64_t numel = clpar_tensor_numel(y);
  float *ref = malloc((size_t)numel * sizeof *ref);
  conv_ref(s, xv, wv, bv, ref);
  char msg[200];
  snprintf(msg, sizeof msg, "%s (%s)", what, getenv("CLPAR_OCL_CONV"));
  double k = (double)(s->c / s->groups * s->kh * s->kw);
  tu_assert_close(yv, ref, (size_t)numel, 1e-4f, (float)(2e-6 * sqrt(k) + 1e-6), msg);
  free(xv), free(wv), free(bv), free(yv), free(ref);
  clpar_scope_end(sc);
}

/* Whether Winograd's F(2x2, 3x3) takes s (else the forced run falls back to im2col). */
static int winograd_fits(const cshape *s) {
  return s->kh == 3 && s->kw == 3 && s->sh == 1 && s->sw == 1 && s->dh == 1 && s->dw == 1 &&
         s->groups == 1;
}

/* Whether forced algo runs s itself (CLBlast's convgemm takes one group; the test's sizes fit
 * its 32-bit indices), else im2col. */
static int algo_fits(int algo, const cshape *s) {
  return algo == CLPAR_OCL_CONV_WINOGRAD   ? winograd_fits(s)
         : algo == CLPAR_OCL_CONV_CONVGEMM ? s->groups == 1
                                           : 1;
}

static void check_forced(clpar_device *dev, int algo) {
  clpar_ocl_device *d = tcu_ocl_of(dev);
  clpar_ocl_conv_stats before, after;
  setenv("CLPAR_OCL_CONV", clpar_ocl_conv_algo_name(algo), 1);
  clpar_ocl_conv_stats_get(d, &before);
  uint64_t fit = 0;
  for (size_t i = 0; i < N_SHAPES; i++) {
    check_shape(dev, &shapes[i].s, shapes[i].name);
    fit += algo_fits(algo, &shapes[i].s);
  }
  clpar_ocl_conv_stats_get(d, &after);
  unsetenv("CLPAR_OCL_CONV");
  assert_int_equal(after.runs[algo] - before.runs[algo], fit);
  if (algo == CLPAR_OCL_CONV_WINOGRAD || algo == CLPAR_OCL_CONV_CONVGEMM) {
    assert_true(fit >= 6 && fit < N_SHAPES);
    assert_int_equal(after.runs[CLPAR_OCL_CONV_IM2COL] - before.runs[CLPAR_OCL_CONV_IM2COL],
                     N_SHAPES - fit);
  }
  assert_int_equal(after.measured, before.measured);
}

static void test_im2col_path(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  check_forced(dev, CLPAR_OCL_CONV_IM2COL);
}

static void test_winograd_path(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  check_forced(dev, CLPAR_OCL_CONV_WINOGRAD);
}

/* CLBlast's Xconvgemm (bias added after it), grouped shapes by im2col. */
static void test_convgemm_path(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  check_forced(dev, CLPAR_OCL_CONV_CONVGEMM);
}

static void test_implicit_path(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  check_forced(dev, CLPAR_OCL_CONV_IMPLICIT);
}

/* im2col's and Winograd's chunks of images: one image per chunk, and two (with a shorter
 * last chunk). */
static void test_chunks(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  const size_t floats[] = {1, 7000};
  for (size_t f = 0; f < 2; f++) {
    clpar_ocl_conv_chunk_floats = floats[f];
    check_forced(dev, CLPAR_OCL_CONV_IM2COL);
    check_forced(dev, CLPAR_OCL_CONV_WINOGRAD);
  }
  const cshape three = {3, 4, 9, 9, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1}; /* 4 * 9 * 81 floats */
  clpar_ocl_conv_chunk_floats = 2 * 4 * 9 * 81;
  setenv("CLPAR_OCL_CONV", "im2col", 1);
  check_shape(dev, &three, "3 images in chunks of 2");
  clpar_ocl_conv_chunk_floats = 16 * 9 * 25; /* Winograd: 16 (C + O) T floats an image */
  setenv("CLPAR_OCL_CONV", "winograd", 1);
  check_shape(dev, &three, "3 images in chunks of 2");
  unsetenv("CLPAR_OCL_CONV");
  clpar_ocl_conv_chunk_floats = (size_t)16 * 1024 * 1024;
}

/* Tiles other than the defaults: narrow, one work-item per column, deep K steps. */
static void test_implicit_tiles(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  const clpar_ocl_conv_tiles tiles[] = {{16, 32, 4, 2, 4}, {8, 8, 1, 1, 1}, {32, 16, 32, 8, 2}};
  for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
    tu_ok(clpar_ocl_conv_set_tiles(d, &tiles[t], 0));
    clpar_ocl_conv_tiles now = clpar_ocl_conv_tiles_of(d);
    assert_int_equal(now.tm, tiles[t].tm);
    assert_int_equal(now.wn, tiles[t].wn);
    setenv("CLPAR_OCL_CONV", "implicit", 1);
    for (size_t i = 0; i < 12; i++) check_shape(dev, &shapes[i].s, shapes[i].name);
    unsetenv("CLPAR_OCL_CONV");
  }
  const clpar_ocl_conv_tiles bad[] = {{0, 8, 8, 1, 1},    {30, 32, 8, 4, 4},  {64, 64, 0, 4, 4},
                                      {512, 64, 8, 4, 4}, {64, 64, 8, 17, 4}, {256, 256, 8, 1, 1},
                                      {64, 64, 65, 4, 4}};
  for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++)
    assert_int_equal(clpar_ocl_conv_set_tiles(d, &bad[t], 0), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_ocl_conv_forget(d);
}

/* The tile tuner (clpar-tune's second part): two candidates, checked and timed; the kept tiles
 * are in force, saved when they changed, and convolve correctly. */
static void test_tile_tuning(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char path[4096];
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_forget(d);
  clpar_ocl_conv_tiles was = clpar_ocl_conv_tiles_of(d);
  clpar_ocl_conv_tune_result r;
  tu_ok(clpar_ocl_conv_tune(d, CLPAR_OCL_TILES_FWD, 2, &r));
  assert_int_equal(r.tried, 2);
  assert_int_equal(r.failed, 0);
  assert_true(r.before > 0 && r.after > 0 && r.after <= r.before);
  clpar_ocl_conv_tiles now = clpar_ocl_conv_tiles_of(d);
  assert_memory_equal(&now, &r.tiles, sizeof now);
  if (memcmp(&now, &was, sizeof now) != 0) { /* saved, and read back by a new "process" */
    clpar_ocl_conv_forget(d);
    clpar_ocl_conv_tiles back = clpar_ocl_conv_tiles_of(d);
    assert_memory_equal(&back, &now, sizeof now);
  }
  setenv("CLPAR_OCL_CONV", "implicit", 1);
  for (size_t i = 0; i < 6; i++) check_shape(dev, &shapes[i].s, shapes[i].name);
  unsetenv("CLPAR_OCL_CONV");
  clpar_ocl_conv_forget(d);
  unlink(path);
}

/* The tuner's shapes include one like ResNet-50's conv1 (7x7, stride 2, 3 channels): a GEMM
 * with K = 147 and many positions (N), unlike the 3x3 and 1x1 layers. */
static void test_tune_shapes_include_conv1(void **state) {
  (void)state;
  int n = 0, found = 0;
  const clpar_conv2d_shape *s = clpar_ocl_conv_tune_shapes(&n);
  for (int i = 0; i < n; i++)
    found |= s[i].c / s[i].groups * s[i].kh * s[i].kw == 147 && s[i].sh == 2 && s[i].sw == 2 &&
             s[i].n * s[i].oh * s[i].ow >= 4096 &&
             s[i].oh == (s[i].h + 2 * s[i].ph - s[i].kh) / s[i].sh + 1;
  assert_true(found);
}

/* The tiled files define no tiles of their own: built without the CI_* options they fail
 * naming them; their helper kernels, launched by name, come with the default tiles'
 * options (CLPAR_OCL_CONV_DEFAULT_TILES, the one definition). */
static void test_tiled_files_take_tiles_from_options(void **state) {
  (void)state;
  clpar_ocl_device *d;
  tcu_need_ocl(&d);
  const char *files[2] = {"conv_implicit.cl", "conv_bwd.cl"};
  const char *helpers[2] = {"conv_bias_add_f32", "conv_bwd_sum_f32"};
  char options[256];
  clpar_ocl_conv_tile_options(NULL, options, sizeof options);
  assert_non_null(strstr(options, "-DCI_TM=64 -DCI_TN=64 -DCI_TK=16 -DCI_WM=4 -DCI_WN=4"));
  for (int f = 0; f < 2; f++) {
    const clpar_embedded_source *e = clpar_opencl_sources;
    while (e->name && strcmp(e->name, files[f]) != 0) e++;
    assert_non_null(e->name);
    assert_true(clpar_ocl_conv_tiled_file(files[f]));
    cl_program prog;
    assert_int_equal(
        clpar_ocl_program_get(d, files[f], e->source, e->size, CLPAR_OCL_BUILD_OPTIONS, &prog),
        CLPAR_ERROR_BUILD);
    assert_non_null(strstr(clpar_last_error(), "CI_TM"));
    tu_ok(clpar_ocl_program_get(d, files[f], e->source, e->size, options, &prog));
    cl_kernel k;
    tu_ok(clpar_ocl_kernel_get(d, files[f], helpers[f], &k));
  }
  assert_false(clpar_ocl_conv_tiled_file("conv.cl"));
}

/* ---- the choice ---- */

static const cshape probe = {1, 4, 6, 6, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};

static const char probe_line[] = "shape 1 4 6 6 5 1 3 3 1 1 1 1 1 1";

/* Runs the probe with d's state forgotten; returns the stats' change. */
static clpar_ocl_conv_stats run_probe(clpar_device *dev) {
  clpar_ocl_device *d = tcu_ocl_of(dev);
  clpar_ocl_conv_stats a, b;
  clpar_ocl_conv_forget(d);
  clpar_ocl_conv_stats_get(d, &a);
  check_shape(dev, &probe, "probe");
  tcu_stats_since(d, &a, &b);
  return b;
}

static void test_saved_choice_is_taken(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char text[4096], h[2048];
  tcu_header(d, h, sizeof h);
  /* the shape's own tiles (for the implicit GEMM) differ from the device's */
  const clpar_ocl_conv_tiles mine = {16, 32, 4, 2, 4};
  for (int algo = CLPAR_OCL_CONV_IM2COL; algo < CLPAR_OCL_CONV_ALGOS; algo++) {
    int n = snprintf(text, sizeof text, "%stiles 32 32 8 4 4\n%s %s%s\nend\n", h, probe_line,
                     clpar_ocl_conv_algo_name(algo),
                     algo == CLPAR_OCL_CONV_IMPLICIT ? " 16 32 4 2 4" : "");
    tcu_write_entry(d, text, (size_t)n);
    clpar_ocl_conv_stats c = run_probe(dev);
    assert_int_equal(c.disk_loads, 1);
    assert_int_equal(c.disk_rejects, 0);
    assert_int_equal(c.measured, 0);
    assert_int_equal(c.runs[algo], 1);
    clpar_ocl_conv_tiles t = clpar_ocl_conv_tiles_of(d);
    assert_true(t.tm == 32 && t.tn == 32 && t.tk == 8 && t.wm == 4 && t.wn == 4);
    if (algo == CLPAR_OCL_CONV_IMPLICIT) assert_non_null(clpar_ocl_conv_kernel_find(d, &mine));
  }
  /* CLPAR_TUNE=off: the entry is not read; the shape is measured */
  setenv("CLPAR_TUNE", "off", 1);
  clpar_ocl_conv_stats c = run_probe(dev);
  unsetenv("CLPAR_TUNE");
  assert_int_equal(c.disk_loads, 0);
  assert_int_equal(c.measured, 1);
  clpar_ocl_conv_forget(d);
}

static void test_unknown_shape_is_measured_and_saved(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char path[4096];
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_stats c = run_probe(dev);
  assert_int_equal(c.measured, 1);
  assert_int_equal(c.runs[CLPAR_OCL_CONV_IM2COL] + c.runs[CLPAR_OCL_CONV_IMPLICIT] +
                       c.runs[CLPAR_OCL_CONV_WINOGRAD] + c.runs[CLPAR_OCL_CONV_CONVGEMM],
                   1);
  for (int a = CLPAR_OCL_CONV_IM2COL; a < CLPAR_OCL_CONV_ALGOS; a++)
    assert_int_equal(c.timed[a], 1); /* the probe fits every algorithm */
  size_t len;
  char *saved = tu_slurp(path, &len);
  assert_non_null(saved);
  assert_non_null(strstr(saved, probe_line));
  free(saved);
  /* the same shape again, in this "process" and after a restart: not measured again */
  clpar_ocl_conv_stats_get(d, &c);
  check_shape(dev, &probe, "probe again");
  clpar_ocl_conv_stats after;
  clpar_ocl_conv_stats_get(d, &after);
  assert_int_equal(after.measured, c.measured);
  c = run_probe(dev);
  assert_int_equal(c.measured, 0);
  assert_int_equal(c.disk_loads, 1);
  clpar_ocl_conv_forget(d);
  /* an unknown CLPAR_OCL_CONV value is an error naming it (the entry runs on the device's
   * worker: it comes back by the next command that waits); the device works on after */
  tu_ok(clpar_device_synchronize(dev));
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *w, *y;
  tcu_inputs(dev, &probe, 11, &x, &w);
  clpar_conv2d_options opt = tcu_opt_of(&probe);
  setenv("CLPAR_OCL_CONV", "winograd-please", 1);
  clpar_status s = clpar_conv2d(x, w, NULL, &opt, &y);
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  unsetenv("CLPAR_OCL_CONV");
  assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "CLPAR_OCL_CONV"));
  clpar_scope_end(sc);
  check_shape(dev, &probe, "after the error");
  clpar_ocl_conv_forget(d);
}

/* The device ops one forward of s records in a profile (forced as CLPAR_OCL_CONV says). */
static uint64_t profiled_ops(clpar_device *dev, const cshape *s) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *w, *y;
  tcu_inputs(dev, s, 11, &x, &w);
  clpar_tensor *b = s->bias ? tu_make(dev, 1, &s->o, 13) : NULL;
  clpar_conv2d_options opt = tcu_opt_of(s);
  clpar_profile p0, p1;
  tu_ok(clpar_device_synchronize(dev));
  tu_ok(clpar_device_profile_start(dev));
  tu_ok(clpar_device_profile_read(dev, &p0));
  tu_ok(clpar_conv2d(x, w, b, &opt, &y));
  tu_ok(clpar_device_profile_read(dev, &p1));
  tu_ok(clpar_device_profile_stop(dev));
  clpar_scope_end(sc);
  return p1.ops - p0.ops;
}

/* CLBlast's convgemm is recorded in a device profile as one op, its bias as a second. */
static void test_convgemm_profiled(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  cshape s = shapes[1].s; /* stride 2, no bias */
  setenv("CLPAR_OCL_CONV", "convgemm", 1);
  assert_int_equal(profiled_ops(dev, &s), 1);
  s.bias = 1;
  assert_int_equal(profiled_ops(dev, &s), 2);
  unsetenv("CLPAR_OCL_CONV");
}

/* A grouped shape is measured without convgemm (CLBlast's takes one group); the variables name
 * convgemm for the forward only. */
static void test_convgemm_measured_where_it_fits(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char path[4096];
  tcu_entry_removed(d, path, sizeof path);
  clpar_ocl_conv_forget(d);
  clpar_ocl_conv_stats a, b;
  clpar_ocl_conv_stats_get(d, &a);
  check_shape(dev, &shapes[4].s, shapes[4].name); /* groups 2 */
  clpar_ocl_conv_stats_get(d, &b);
  assert_int_equal(b.measured - a.measured, 1);
  assert_int_equal(b.timed[CLPAR_OCL_CONV_IM2COL] - a.timed[CLPAR_OCL_CONV_IM2COL], 1);
  assert_int_equal(b.timed[CLPAR_OCL_CONV_CONVGEMM] - a.timed[CLPAR_OCL_CONV_CONVGEMM], 0);
  assert_int_equal(b.runs[CLPAR_OCL_CONV_CONVGEMM] - a.runs[CLPAR_OCL_CONV_CONVGEMM], 0);
  int algo;
  setenv("CLPAR_OCL_CONV", "convgemm", 1);
  tu_ok(clpar_ocl_conv_forced("CLPAR_OCL_CONV", CLPAR_OCL_CONV_ALGOS, &algo));
  assert_int_equal(algo, CLPAR_OCL_CONV_CONVGEMM);
  unsetenv("CLPAR_OCL_CONV");
  setenv("CLPAR_OCL_CONV_BWD", "convgemm", 1);
  assert_int_equal(clpar_ocl_conv_forced("CLPAR_OCL_CONV_BWD", CLPAR_OCL_CONV_BWD_ALGOS, &algo),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "CLPAR_OCL_CONV_BWD"));
  assert_null(strstr(clpar_last_error(), "need im2col, implicit, winograd, convgemm"));
  unsetenv("CLPAR_OCL_CONV_BWD");
  clpar_ocl_conv_forget(d);
  unlink(path);
}

static void expect_refused(clpar_device *dev, const char *body, size_t len, const char *what) {
  tcu_write_entry(tcu_ocl_of(dev), body, len);
  clpar_ocl_conv_stats c = run_probe(dev);
  if (c.disk_rejects != 1 || c.measured != 1)
    fail_msg("%s: rejects %llu, measured %llu", what, (unsigned long long)c.disk_rejects,
             (unsigned long long)c.measured);
}

static void test_hostile_entries_are_refused(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  char h[2048], text[8192];
  tcu_header(d, h, sizeof h);
  const char *bodies[][2] = {
      {"other format", "clpar-conv 9\n"},
      {"an unknown algorithm", "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 1 fft\nend\n"},
      {"a negative size", "%sshape 1 -4 6 6 5 1 3 3 1 1 1 1 1 1 implicit 8 8 8 1 1\nend\n"},
      {"a huge size", "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 99999999999 implicit 8 8 8 1 1\nend\n"},
      {"zero stride", "%sshape 1 4 6 6 5 1 3 3 0 1 1 1 1 1 implicit 8 8 8 1 1\nend\n"},
      {"groups not dividing", "%sshape 1 4 6 6 5 3 3 3 1 1 1 1 1 1 implicit 8 8 8 1 1\nend\n"},
      {"kernel past the image", "%sshape 1 4 6 6 5 1 9 3 1 1 0 0 1 1 implicit 8 8 8 1 1\nend\n"},
      {"a short line", "%sshape 1 4 6 implicit 8 8 8 1 1\nend\n"},
      {"trailing garbage", "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 1 implicit x\nend\n"},
      {"unrunnable tiles", "%stiles 4096 4096 64 1 1\nend\n"},
      {"tiles not dividing", "%stiles 30 32 8 4 4\nend\n"},
      {"a zero tile", "%stiles 32 32 0 4 4\nend\n"},
      {"an unknown line", "%sgemm 1 2 3\nend\n"},
      {"implicit without tiles", "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 1 implicit\nend\n"},
      {"implicit, unrunnable tiles",
       "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 1 implicit 8 8 8 16 1\nend\n"},
      {"im2col with tiles", "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 1 im2col 8 8 8 1 1\nend\n"},
      {"convgemm with tiles", "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 1 convgemm 8 8 8 1 1\nend\n"},
      {"convgemm, 2 groups", "%sshape 1 4 6 6 4 2 3 3 1 1 1 1 1 1 convgemm\nend\n"},
      {"convgemm backward", "%sbwd 1 4 6 6 5 1 3 3 1 1 1 1 1 1 convgemm im2col\nend\n"},
      {"truncated", "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 1 implicit 8 8 8 1 1\n"},
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    int n = snprintf(text, sizeof text, bodies[i][1], h);
    expect_refused(dev, text, (size_t)n, bodies[i][0]);
  }
  int n = snprintf(text, sizeof text, "%s", h);
  n += snprintf(text + n, sizeof text - (size_t)n, "clpar-conv 1\ndevice other\n");
  expect_refused(dev, text + strlen(h), strlen(text + strlen(h)), "another device");
  n = snprintf(text, sizeof text, "%sshape 1 4 6 6 5 1 3 3 1 1 1 1 1 1 implicit\nend\n", h);
  text[strlen(h) + 3] = '\0'; /* a NUL byte inside */
  expect_refused(dev, text, (size_t)n, "a NUL byte");
  /* a sound entry made group-writable, then reached through a symbolic link */
  n = snprintf(text, sizeof text, "%s%s implicit 8 8 8 1 1\nend\n", h, probe_line);
  tcu_write_entry(d, text, (size_t)n);
  char path[4096], real[4200];
  assert_int_equal(clpar_ocl_conv_path(d, path, sizeof path), 0);
  chmod(path, 0660);
  clpar_ocl_conv_stats c = run_probe(dev);
  assert_int_equal(c.disk_rejects, 1);
  snprintf(real, sizeof real, "%s.real", path);
  tcu_write_entry(d, text, (size_t)n);
  assert_int_equal(rename(path, real), 0);
  assert_int_equal(symlink(real, path), 0);
  c = run_probe(dev);
  assert_int_equal(c.disk_rejects, 1);
  unlink(path);
  unlink(real);
  clpar_ocl_conv_forget(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_im2col_path),
      cmocka_unit_test(test_implicit_path),
      cmocka_unit_test(test_winograd_path),
      cmocka_unit_test(test_convgemm_path),
      cmocka_unit_test(test_convgemm_measured_where_it_fits),
      cmocka_unit_test(test_convgemm_profiled),
      cmocka_unit_test(test_chunks),
      cmocka_unit_test(test_implicit_tiles),
      cmocka_unit_test(test_tile_tuning),
      cmocka_unit_test(test_tune_shapes_include_conv1),
      cmocka_unit_test(test_tiled_files_take_tiles_from_options),
      cmocka_unit_test(test_saved_choice_is_taken),
      cmocka_unit_test(test_unknown_shape_is_measured_and_saved),
      cmocka_unit_test(test_hostile_entries_are_refused),
  };
  return cmocka_run_group_tests(tests, setup, tcu_teardown);
}
