/* test_memory_workspace.c — the backends' workspaces (the OpenCL convolutions' workspace and
 * scratch, the host backend's oneDNN work buffers) in the memory counts and released by
 * clpar_device_empty_cache: after convolutions CLPAR_MEM_WORKSPACE holds what the backend's
 * own counters say and is part of CLPAR_MEM_TOTAL; clpar_device_empty_cache brings it to 0 and
 * the convolutions then give the same bits; its peak follows the marks; the allocator's
 * out-of-memory retry releases the workspace before it gives up. On every OpenCL device (two
 * with POCL_DEVICES="pthread pthread") and the host device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "internal.h"
#include "ocl_test_util.h"
#include "test_util.h"

static const clpar_mem_category WS = CLPAR_MEM_WORKSPACE;

/* Large enough that im2col's columns and sum_rows' partial sums take workspace. */
static const tu_conv_case conv = {
    "3x3 over 4 images", 4, 8, 16, 16, 8, 3, 3, TU_CONV_OPT(1, 1, 1, 1, 1, 1, 1), 1};
#define ALL_GRADS 7

static void assert_same_bits(const tu_conv_result *a, const tu_conv_result *b, const char *what) {
  for (int p = 0; p < 4; p++) {
    assert_int_equal(a->n[p], b->n[p]);
    if (a->n[p] && memcmp(a->v[p], b->v[p], a->n[p] * sizeof(float)) != 0)
      fail_msg("%s: %s differs after clpar_device_empty_cache", what, tu_conv_part[p]);
  }
}

/* The bytes the backend says its workspaces hold (its OpenCL counters, else its entry). */
static uint64_t backend_bytes(clpar_device *dev) {
  uint64_t b = 0;
  tu_ok(clpar_device_synchronize(dev));
  if (strcmp(dev->bd.info.backend, "opencl") == 0) {
    clpar_ocl_buffer_stats st;
    clpar_ocl_buffer_stats_get(dev->bd.ctx, &st);
    return st.workspace_bytes + st.scratch_bytes;
  }
  if (dev->bd.iface->workspace_bytes) tu_ok(dev->bd.iface->workspace_bytes(dev->bd.ctx, &b));
  return b;
}

static void assert_total_sums(clpar_device *dev) {
  uint64_t sum = 0;
  for (int c = 0; c < CLPAR_MEM_CATEGORIES; c++)
    if (c != CLPAR_MEM_TOTAL) sum += clpar_memory_in_use(dev, (clpar_mem_category)c);
  assert_int_equal(clpar_memory_in_use(dev, CLPAR_MEM_TOTAL), sum);
}

static void check_device(clpar_device *dev, int must_hold) {
  const char *id = dev->bd.info.id;
  tu_conv_result first, again;
  tu_conv_run(dev, &conv, ALL_GRADS, &first);
  uint64_t held = backend_bytes(dev);
  print_message("%s: %llu bytes of workspace after a convolution\n", id, (unsigned long long)held);
  if (must_hold && held == 0) fail_msg("%s: the convolution took no workspace", id);
  if (clpar_memory_in_use(dev, WS) != held)
    fail_msg("%s: CLPAR_MEM_WORKSPACE is %llu bytes, the backend holds %llu", id,
             (unsigned long long)clpar_memory_in_use(dev, WS), (unsigned long long)held);
  assert_total_sums(dev);
  tu_ok(clpar_memory_mark(dev));
  assert_int_equal(clpar_memory_peak(dev, WS), held);

  tu_ok(clpar_device_empty_cache(dev));
  if (backend_bytes(dev) != 0 || clpar_memory_in_use(dev, WS) != 0)
    fail_msg("%s: %llu bytes of workspace (counted %llu) after clpar_device_empty_cache", id,
             (unsigned long long)backend_bytes(dev),
             (unsigned long long)clpar_memory_in_use(dev, WS));
  assert_total_sums(dev);
  assert_int_equal(clpar_memory_peak(dev, WS), held); /* the peak since the mark stays */
  tu_ok(clpar_memory_mark(dev));
  assert_int_equal(clpar_memory_peak(dev, WS), 0);

  tu_conv_run(dev, &conv, ALL_GRADS, &again); /* the workspace grows again */
  assert_same_bits(&first, &again, id);
  uint64_t now = backend_bytes(dev); /* less than held where the first call tried algorithms */
  if (must_hold) assert_true(now > 0);
  assert_int_equal(clpar_memory_in_use(dev, WS), now);
  assert_int_equal(clpar_memory_peak(dev, WS), now); /* grown only since the mark */
  assert_true(clpar_memory_peak(dev, CLPAR_MEM_TOTAL) >= now);
  tu_conv_result_free(&first);
  tu_conv_result_free(&again);
}

static void test_opencl_workspace_counted(void **state) {
  (void)state;
  int seen = 0;
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_device *dev = clpar_device_get(i);
    if (strcmp(dev->bd.info.backend, "opencl") != 0) continue;
    check_device(dev, 1);
    seen++;
  }
  if (!seen) skip();
}

/* The host backend's figure is its oneDNN work buffers' (0 without oneDNN). */
static void test_host_workspace_counted(void **state) {
  (void)state;
  clpar_device *host = tu_host();
  if (!host) skip();
  check_device(host, 0);
}

static void test_name(void **state) {
  (void)state;
  assert_string_equal(clpar_memory_category_name(WS), "workspace");
  assert_int_equal(CLPAR_MEM_TOTAL, 5); /* the values before it keep theirs */
  assert_null(clpar_memory_category_name(CLPAR_MEM_CATEGORIES));
}

/* A tensor the driver refuses while the workspace holds a large buffer: the allocator releases
 * the workspace and its retry succeeds. A CPU device's buffers are host memory, which an
 * address-space limit bounds; not under ASan, whose shadow memory takes the space. */
static void test_out_of_memory_trims(void **state) {
  (void)state;
  const size_t big = (size_t)512 << 20;
  clpar_device *dev = tu_ocl_device();
  if (!dev || TU_UNDER_ASAN || !((clpar_ocl_device *)dev->bd.ctx)->cpu) skip();
  clpar_ocl_device *d = dev->bd.ctx;
  tu_ok(clpar_device_empty_cache(dev));
  void *cols = NULL;
  tu_ok(clpar_ocl_ws_take(d, CLPAR_OCL_WS_COLS, big, &cols));
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_COLS, cols);
  struct rlimit old; /* room for one of the two buffers, not both */
  if (!tu_limit_address_space(big / 2, &old)) skip();
  int64_t shape[1] = {(int64_t)(big / sizeof(float))};
  clpar_tensor *t = NULL;
  clpar_status s = clpar_tensor_zeros(dev, 1, shape, &t);
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  uint64_t after = backend_bytes(dev);
  clpar_tensor_free(t);
  assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
  tu_ok(clpar_device_empty_cache(dev));
  if (s != CLPAR_OK) fail_msg("the tensor was refused: %s", clpar_last_error());
  assert_int_equal(after, 0); /* the workspace was released for it */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_opencl_workspace_counted),
      cmocka_unit_test(test_host_workspace_counted),
      cmocka_unit_test(test_name),
      cmocka_unit_test(test_out_of_memory_trims),
  };
  return cmocka_run_group_tests_name("memory_workspace", tests, tu_setup, tu_teardown);
}
