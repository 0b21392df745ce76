/* test_ocl_workspace.c — the OpenCL convolutions' temporaries come from the device's grow-only
 * workspace (backends/opencl/ocl_workspace.c): with each algorithm forced (CLPAR_OCL_CONV,
 * CLPAR_OCL_CONV_BWD), forward and both backward passes of convolutions of growing then
 * shrinking sizes, in one chunk and in several, give bit for bit what they gave with a workspace
 * made for each call alone, after the workspace was filled with NaN (nothing reads a temporary it
 * did not write), and agree with the core's plain path; once the sizes have been seen, calls
 * create no buffers. On every OpenCL device (two with POCL_DEVICES="pthread pthread"). A growth
 * refused for lack of memory releases the other slots and succeeds. Skips without an OpenCL
 * device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "internal.h"
#include "ocl_test_util.h"
#include "opencl/ocl_conv_algo.h"
#include "test_util.h"

static char cache_dir[256];

static int setup(void **state) {
  if (tu_ocl_cache_dir_make(cache_dir, sizeof cache_dir, "ocl-ws") != 0) return -1;
  return tu_setup(state);
}

static int teardown(void **state) {
  int r = tu_teardown(state);
  tu_remove_dir(cache_dir);
  return r;
}

/* Growing, then shrinking: 3x3 under 256 pixels (im2col's [O, nb P] buffer), 3x3 of 256 pixels
 * over 4 images (per-image GEMMs; backward weights' implicit GEMM splits its 1024 positions),
 * 1x1 direct (backward weights' per-image products), grouped with stride 2 (Winograd and
 * convgemm take im2col), and the first again. */
static const tu_conv_case cases[] = {
    {"3x3 36 pixels", 2, 3, 6, 6, 4, 3, 3, TU_CONV_OPT(1, 1, 1, 1, 1, 1, 1), 1},
    {"3x3 256 pixels", 4, 8, 16, 16, 8, 3, 3, TU_CONV_OPT(1, 1, 1, 1, 1, 1, 1), 1},
    {"1x1 direct", 4, 8, 16, 16, 6, 1, 1, TU_CONV_OPT(1, 1, 0, 0, 1, 1, 1), 1},
    {"groups 2 stride 2", 2, 6, 10, 10, 4, 3, 3, TU_CONV_OPT(2, 2, 1, 1, 1, 1, 2), 0},
    {"3x3 36 pixels again", 2, 3, 6, 6, 4, 3, 3, TU_CONV_OPT(1, 1, 1, 1, 1, 1, 1), 1},
};
#define N_CASES (sizeof cases / sizeof cases[0])
#define LARGEST 1
#define ALL_GRADS 7

static uint64_t created(clpar_device *dev) {
  clpar_ocl_buffer_stats st;
  tu_ok(clpar_device_synchronize(dev));
  clpar_ocl_buffer_stats_get(dev->bd.ctx, &st);
  return st.created;
}

static void assert_same_bits(const tu_conv_result *a, const tu_conv_result *b, const char *what) {
  for (int p = 0; p < 4; p++) {
    assert_int_equal(a->n[p], b->n[p]);
    if (a->n[p] && memcmp(a->v[p], b->v[p], a->n[p] * sizeof(float)) != 0)
      fail_msg("%s: %s differs from its run with a fresh workspace", what, tu_conv_part[p]);
  }
}

/* The cases, then the largest three more times, on dev's grown workspace filled with NaN before
 * each: bit for bit as first; with buffers created counted into *made. */
static void run_again(clpar_device *dev, const tu_conv_result *first, const char *fwd,
                      const char *bwd, uint64_t *made) {
  clpar_ocl_device *d = dev->bd.ctx;
  char what[512];
  uint64_t before = created(dev);
  for (size_t i = 0; i < N_CASES + 3; i++) {
    size_t c = i < N_CASES ? i : LARGEST;
    tu_conv_result again;
    tu_ok(clpar_ocl_workspace_poison(d));
    tu_conv_run(dev, &cases[c], ALL_GRADS, &again);
    snprintf(what, sizeof what, "%s on %s (forward %s, backward %s)", cases[c].name, d->dev_name,
             fwd, bwd);
    assert_same_bits(&first[c], &again, what);
    tu_conv_result_free(&again);
  }
  *made = created(dev) - before;
}

/* The cases with fwd and bwd forced on dev: first each with a workspace of its own, then all
 * again twice (run_again): the second time, every size has been seen and no buffer is made. */
static void check_device(clpar_device *dev, int fa, int ba) {
  clpar_ocl_device *d = dev->bd.ctx;
  const char *fwd = clpar_ocl_conv_algo_name(fa), *bwd = clpar_ocl_conv_algo_name(ba);
  tu_conv_result first[N_CASES], plain;
  clpar_ocl_conv_stats c0, c1;
  clpar_ocl_conv_stats_get(d, &c0);
  setenv("CLPAR_OCL_CONV", fwd, 1);
  setenv("CLPAR_OCL_CONV_BWD", bwd, 1);
  for (size_t i = 0; i < N_CASES; i++) {
    tu_ok(clpar_device_synchronize(dev));
    clpar_ocl_workspace_release(d);
    tu_conv_run(dev, &cases[i], ALL_GRADS, &first[i]);
  }
  uint64_t made;
  run_again(dev, first, fwd, bwd, &made);
  clpar_memory_stats m0, m1;
  tu_ok(clpar_device_memory_stats(dev, &m0));
  run_again(dev, first, fwd, bwd, &made);
  tu_ok(clpar_device_memory_stats(dev, &m1));
  clpar_ocl_conv_stats_get(d, &c1);
  assert_true(c1.runs[fa] > c0.runs[fa]); /* the algorithms asked for ran */
  int wa = ba == CLPAR_OCL_CONV_WINOGRAD ? CLPAR_OCL_CONV_IM2COL : ba; /* weights: no Winograd */
  assert_true(c1.bwd_runs[0][ba] > c0.bwd_runs[0][ba] && c1.bwd_runs[1][wa] > c0.bwd_runs[1][wa]);
  unsetenv("CLPAR_OCL_CONV");
  unsetenv("CLPAR_OCL_CONV_BWD");
  assert_int_equal(m1.driver_allocs, m0.driver_allocs); /* the tensors came from the cache */
  if (made)
    fail_msg("forward %s, backward %s on %s: %llu buffers created by calls of sizes seen before",
             fwd, bwd, d->dev_name, (unsigned long long)made);
  for (size_t i = 0; i < N_CASES; i++) {
    tu_conv_run_plain(dev, &cases[i], ALL_GRADS, &plain);
    for (int p = 0; p < 4; p++)
      if (plain.n[p])
        tu_assert_close(first[i].v[p], plain.v[p], plain.n[p], 1e-4f, 1e-5f, cases[i].name);
    tu_conv_result_free(&plain);
    tu_conv_result_free(&first[i]);
  }
}

/* Every OpenCL device (the first, and a second where there is one). */
static void check_algos(int fwd, int bwd) {
  clpar_device *dev = tu_ocl_device();
  if (!dev) skip();
  check_device(dev, fwd, bwd);
  clpar_device *second = tu_second_device(dev);
  if (second && second->bd.iface == dev->bd.iface) check_device(second, fwd, bwd);
}

static void test_im2col(void **state) {
  (void)state;
  check_algos(CLPAR_OCL_CONV_IM2COL, CLPAR_OCL_CONV_IM2COL);
}

static void test_implicit(void **state) {
  (void)state;
  check_algos(CLPAR_OCL_CONV_IMPLICIT, CLPAR_OCL_CONV_IMPLICIT);
}

static void test_winograd(void **state) {
  (void)state;
  check_algos(CLPAR_OCL_CONV_WINOGRAD, CLPAR_OCL_CONV_WINOGRAD);
}

static void test_convgemm(void **state) {
  (void)state;
  check_algos(CLPAR_OCL_CONV_CONVGEMM, CLPAR_OCL_CONV_IM2COL);
}

/* Several chunks of images per call: the slots are reused within a call too. */
static void test_chunks(void **state) {
  (void)state;
  clpar_ocl_conv_chunk_floats = 7000;
  check_algos(CLPAR_OCL_CONV_IM2COL, CLPAR_OCL_CONV_IM2COL);
  check_algos(CLPAR_OCL_CONV_WINOGRAD, CLPAR_OCL_CONV_WINOGRAD);
  clpar_ocl_conv_chunk_floats = (size_t)16 * 1024 * 1024;
}

/* A slot that the driver cannot grow for lack of memory while another slot holds a large
 * buffer: the workspace releases that one and grows. A CPU device's buffers are host memory,
 * which an address-space limit bounds; not under ASan, whose shadow memory takes the space. */
static void test_out_of_memory(void **state) {
  (void)state;
  const size_t big = (size_t)512 << 20;
  clpar_device *dev = tu_ocl_device();
  if (!dev || TU_UNDER_ASAN || !((clpar_ocl_device *)dev->bd.ctx)->cpu) skip();
  clpar_ocl_device *d = dev->bd.ctx;
  tu_ok(clpar_device_synchronize(dev));
  clpar_ocl_workspace_release(d);
  void *cols = NULL, *out = NULL;
  tu_ok(clpar_ocl_ws_take(d, CLPAR_OCL_WS_COLS, big, &cols));
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_COLS, cols);
  struct rlimit old; /* room for one of the two buffers, not both */
  if (!tu_limit_address_space(big / 2, &old)) skip();
  clpar_status s = clpar_ocl_ws_take(d, CLPAR_OCL_WS_OUT, big, &out);
  clpar_ocl_buffer_stats st;
  clpar_ocl_buffer_stats_get(d, &st);
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_OUT, out);
  clpar_ocl_workspace_release(d);
  assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
  if (s != CLPAR_OK) fail_msg("the second slot did not grow: %s", clpar_last_error());
  assert_int_equal(st.workspace_bytes, big); /* the first slot was released */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_im2col),   cmocka_unit_test(test_implicit),
      cmocka_unit_test(test_winograd), cmocka_unit_test(test_convgemm),
      cmocka_unit_test(test_chunks),   cmocka_unit_test(test_out_of_memory),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
