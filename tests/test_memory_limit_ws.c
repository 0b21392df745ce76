/* test_memory_limit_ws.c — CLPAR_DEVICE_MEMORY_LIMIT counts the backends' workspaces: ctest
 * runs it with CLPAR_DEVICE_MEMORY_LIMIT=96M (tests/CMakeLists.txt). On every OpenCL device
 * (two with POCL_DEVICES="pthread pthread"), once with the workspace a convolution grows and
 * once with a large one taken directly: the largest tensor the limit leaves room for beside
 * the tensors fits only once the workspace is released, so the allocator releases it and the
 * tensors and the workspace together stay within the limit; a tensor one step larger is
 * refused with CLPAR_ERROR_OUT_OF_MEMORY naming the limit, the workspace kept. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "ocl_test_util.h"
#include "test_util.h"

#define MIB ((uint64_t)1 << 20)
#define STEP ((uint64_t)64 << 10) /* the allocator's rounding above 1 MiB */

static const tu_conv_case conv = {
    "3x3 over 4 images", 4, 8, 16, 16, 8, 3, 3, TU_CONV_OPT(1, 1, 1, 1, 1, 1, 1), 1};

/* CLPAR_DEVICE_MEMORY_LIMIT in bytes as the test's ctest entry sets it ("96M"). */
static uint64_t env_cap(void) {
  const char *v = getenv("CLPAR_DEVICE_MEMORY_LIMIT");
  char *end;
  unsigned long long n = v ? strtoull(v, &end, 10) : 0;
  if (!v || n == 0 || strcmp(end, "M") != 0) return 0;
  return (uint64_t)n << 20;
}

static uint64_t ws_bytes(clpar_device *dev) {
  clpar_ocl_buffer_stats st;
  tu_ok(clpar_device_synchronize(dev));
  clpar_ocl_buffer_stats_get(dev->bd.ctx, &st);
  return st.workspace_bytes + st.scratch_bytes;
}

static uint64_t tensor_bytes(clpar_device *dev) {
  clpar_memory_stats st;
  tu_ok(clpar_device_memory_stats(dev, &st));
  return st.bytes_in_use;
}

/* A tensor of bytes (a multiple of STEP) of zeros, or the status of its allocation. */
static clpar_status make(clpar_device *dev, uint64_t bytes, clpar_tensor **t) {
  int64_t n = (int64_t)(bytes / sizeof(float));
  clpar_status s = clpar_tensor_zeros(dev, 1, &n, t);
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  return s;
}

/* With the workspace holding held bytes (at least STEP): the limit's room beside the tensors,
 * rounded down to STEP, fits only without the workspace; STEP more never fits. */
static void check_limit(clpar_device *dev, uint64_t cap, uint64_t held) {
  const char *id = dev->bd.info.id;
  uint64_t in_use = tensor_bytes(dev);
  uint64_t room = (cap - in_use) / STEP * STEP;
  print_message("%s: %llu bytes of workspace, %llu of tensors, a tensor of %llu\n", id,
                (unsigned long long)held, (unsigned long long)in_use, (unsigned long long)room);
  assert_true(held >= STEP && in_use + room + held > cap);

  clpar_tensor *over = NULL;
  clpar_status s = make(dev, room + STEP, &over);
  if (s != CLPAR_ERROR_OUT_OF_MEMORY) fail_msg("%s: a tensor past the limit gave %d", id, s);
  const char *msg = clpar_last_error();
  if (!strstr(msg, "CLPAR_DEVICE_MEMORY_LIMIT") || !strstr(msg, id))
    fail_msg("%s: the error does not name the device and the limit: %s", id, msg);
  clpar_clear_error();
  assert_int_equal(ws_bytes(dev), held); /* a request that cannot fit releases nothing */

  clpar_tensor *t = NULL;
  s = make(dev, room, &t);
  uint64_t ws_after = ws_bytes(dev), tensors_after = tensor_bytes(dev);
  clpar_tensor_free(t);
  tu_ok(clpar_device_empty_cache(dev));
  if (s != CLPAR_OK) fail_msg("%s: the tensor was refused: %s", id, clpar_last_error());
  if (tensors_after + ws_after > cap)
    fail_msg("%s: %llu bytes of tensors and %llu of workspace pass the limit of %llu", id,
             (unsigned long long)tensors_after, (unsigned long long)ws_after,
             (unsigned long long)cap);
  assert_int_equal(ws_after, 0); /* released for the tensor */
  assert_int_equal(clpar_memory_in_use(dev, CLPAR_MEM_WORKSPACE), 0);
}

static void run_on_opencl(void (*grow)(clpar_device *dev)) {
  uint64_t cap = env_cap();
  if (!cap) fail_msg("run through ctest: CLPAR_DEVICE_MEMORY_LIMIT=96M is not set");
  int seen = 0;
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_device *dev = clpar_device_get(i);
    if (strcmp(dev->bd.info.backend, "opencl") != 0) continue;
    tu_ok(clpar_device_empty_cache(dev));
    grow(dev);
    check_limit(dev, cap, ws_bytes(dev));
    seen++;
  }
  if (!seen) skip();
}

static void grow_by_conv(clpar_device *dev) {
  tu_conv_result r;
  tu_conv_run(dev, &conv, 7, &r);
  tu_conv_result_free(&r);
}

static void grow_by_take(clpar_device *dev) {
  clpar_ocl_device *d = dev->bd.ctx;
  void *cols = NULL;
  tu_ok(clpar_ocl_ws_take(d, CLPAR_OCL_WS_COLS, 32 * MIB, &cols));
  clpar_ocl_ws_give(d, CLPAR_OCL_WS_COLS, cols);
}

static void test_conv_workspace_counted(void **state) {
  (void)state;
  run_on_opencl(grow_by_conv);
}

static void test_large_workspace_counted(void **state) {
  (void)state;
  run_on_opencl(grow_by_take);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_workspace_counted),
      cmocka_unit_test(test_large_workspace_counted),
  };
  return cmocka_run_group_tests_name("memory_limit_ws", tests, tu_setup, tu_teardown);
}
