/* test_memory.c — running out of device memory is an error, never an abort:
 * on every selected device and on the host, tensors are allocated until one fails, the
 * failure must be CLPAR_ERROR_OUT_OF_MEMORY naming the device, the request and the bytes in
 * use, and after freeing them the device must keep working (a larger request empties the
 * cache and fits; an op gives right values).
 *
 * ctest runs it twice (tests/CMakeLists.txt):
 * - test_memory: with CLPAR_DEVICE_MEMORY_LIMIT=256M, so clpar's own accounting refuses the
 *   request that would pass the limit (the path that protects PoCL, which would otherwise
 *   abort);
 * - test_memory_driver (not in sanitizer builds): without that cap; the driver (PoCL's
 *   clCreateBuffer, the host backend's posix_memalign) refuses first, because the test lowers
 *   its own address-space limit (RLIMIT_AS) to what it uses plus DRIVER_HEADROOM.
 * Either way the process's address space is capped while it fills devices (outside
 * AddressSanitizer, whose shadow memory needs an unlimited one; there the 256M cap alone
 * bounds it), so the kernel's OOM killer cannot be what ends it. The cap is set at run time,
 * from /proc/self/status, because what the process maps before (driver threads, CUDA's
 * libraries) differs from machine to machine: a fixed ulimit -v in CMake would be wrong on
 * some. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "test_util.h"

#define MIB ((int64_t)1 << 20)
#define SMALL (16 * MIB) /* bytes of the tensors that fill a device */
#define LARGE (40 * MIB) /* bytes of the ones that need the cache emptied (not within 25%) */
#define MAX_TENSORS 512
#define DRIVER_HEADROOM ((rlim_t)768 << 20)

/* CLPAR_DEVICE_MEMORY_LIMIT in bytes as the test's ctest entry sets it ("256M"), 0 if unset. */
static uint64_t clpar_cap(void) {
  const char *v = getenv("CLPAR_DEVICE_MEMORY_LIMIT");
  if (!v || !*v) return 0;
  char *end;
  unsigned long long n = strtoull(v, &end, 10);
  if (strcmp(end, "M") != 0) fail_msg("this test reads CLPAR_DEVICE_MEMORY_LIMIT in M, not %s", v);
  return (uint64_t)n << 20;
}

/* Caps the address space at what is mapped now plus headroom (a lower limit already set is
 * kept); returns the old limit. */
static struct rlimit cap_address_space(rlim_t headroom) {
  struct rlimit old;
  tu_limit_address_space(headroom, &old);
  return old;
}

/* A tensor of bytes/4 floats set to value, or the status of the first step that failed. */
static clpar_status make_filled(clpar_device *dev, int64_t bytes, float value, clpar_tensor **t) {
  int64_t n = bytes / (int64_t)sizeof(float);
  clpar_status s = clpar_tensor_zeros(dev, 1, &n, t); /* zeros: the public way to get one */
  if (s != CLPAR_OK) return s;
  s = clpar_fill(*t, value);
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  if (s != CLPAR_OK) {
    clpar_tensor_free(*t);
    *t = NULL;
  }
  return s;
}

/* Element i of a 1-D tensor, read through a one-element view (no large host buffer while
 * the address space is exhausted). */
static float element(clpar_tensor *t, int64_t i) {
  clpar_tensor *v;
  float x;
  tu_ok(clpar_tensor_rows(t, i, 1, &v));
  tu_ok(clpar_tensor_read(v, &x, 1));
  clpar_tensor_free(v);
  return x;
}

/* a + b on 1M elements, each filled on the device, read back and checked exactly. */
static void check_device_works(clpar_device *dev) {
  clpar_tensor *a, *b, *c;
  tu_ok(make_filled(dev, 4 * MIB, 1.5f, &a));
  tu_ok(make_filled(dev, 4 * MIB, 2.5f, &b));
  tu_ok(clpar_add(a, b, &c));
  float *v = tu_read(c);
  for (int64_t i = 0; i < MIB; i++)
    if (v[i] != 4.0f)
      fail_msg("%s: element %lld is %g, not 4", clpar_device_id(dev), (long long)i, (double)v[i]);
  free(v);
  clpar_tensor_free(a);
  clpar_tensor_free(b);
  clpar_tensor_free(c);
}

static void check_out_of_memory(clpar_device *dev) {
  const char *id = clpar_device_id(dev);
  uint64_t cap = clpar_cap();
  check_device_works(dev); /* compiles the kernels and starts the threads first */
  clpar_memory_stats base, st;
  tu_ok(clpar_device_empty_cache(dev));
  tu_ok(clpar_device_memory_stats(dev, &base));

  struct rlimit old;
  int capped = !TU_UNDER_ASAN;
  if (capped)
    old = cap_address_space(cap ? 2 * (rlim_t)cap + ((rlim_t)512 << 20) : DRIVER_HEADROOM);

  /* Fill the device with SMALL tensors until a request fails. */
  clpar_tensor **t = calloc(MAX_TENSORS, sizeof *t);
  assert_non_null(t);
  int n = 0;
  clpar_status s = CLPAR_OK;
  while (n < MAX_TENSORS && (s = make_filled(dev, SMALL, (float)n, &t[n])) == CLPAR_OK) n++;
  if (s != CLPAR_ERROR_OUT_OF_MEMORY)
    fail_msg("%s: %d tensors of %lld bytes, then %s: %s (expected CLPAR_ERROR_OUT_OF_MEMORY)", id,
             n, (long long)SMALL, clpar_status_name(s), clpar_last_error());
  char msg[1024], want[64];
  snprintf(msg, sizeof msg, "%s", clpar_last_error());
  snprintf(want, sizeof want, "%s: out of memory", id);
  if (strncmp(msg, want, strlen(want)) != 0) fail_msg("message does not name %s: %s", id, msg);
  snprintf(want, sizeof want, "%lld bytes", (long long)SMALL);
  if (!strstr(msg, want)) fail_msg("message does not name the request (%s): %s", want, msg);
  tu_ok(clpar_device_memory_stats(dev, &st));
  snprintf(want, sizeof want, "%llu bytes", (unsigned long long)st.bytes_in_use);
  if (!strstr(msg, want)) fail_msg("message does not give the bytes in use (%s): %s", want, msg);
  assert_true(n > 0);
  if (cap) { /* clpar's accounting refused it: the limit is met, not passed */
    assert_non_null(strstr(msg, "CLPAR_DEVICE_MEMORY_LIMIT"));
    assert_true(st.bytes_in_use + st.bytes_cached <= cap);
    assert_true(st.bytes_in_use + st.bytes_cached + (uint64_t)SMALL > cap);
  } else { /* the driver refused it */
    if (!strstr(msg, "the driver refused")) fail_msg("%s: not the driver's refusal: %s", id, msg);
  }
  /* Nothing was left behind by the failed request; every tensor still holds its value. */
  assert_int_equal(st.bytes_in_use, base.bytes_in_use + (uint64_t)n * (uint64_t)SMALL);
  for (int i = 0; i < n; i++) {
    assert_float_equal(element(t[i], 0), (float)i, 0);
    assert_float_equal(element(t[i], SMALL / 4 - 1), (float)i, 0);
  }

  /* Free them all: they go to the cache. A LARGE request cannot reuse a SMALL block, so it
   * fits only once the cache is emptied (by the accounting, or after the driver refused). */
  for (int i = 0; i < n; i++) clpar_tensor_free(t[i]);
  tu_ok(clpar_device_memory_stats(dev, &st));
  assert_true(st.bytes_cached >= (uint64_t)n * (uint64_t)SMALL);
  int m = 0;
  while (m < MAX_TENSORS && make_filled(dev, LARGE, 3.0f, &t[m]) == CLPAR_OK) m++;
  /* Under the cap the accounting is exact: about as much fits again. Under the address-space
   * limit, only one LARGE is asked for: the blocks the driver freed go back to malloc, which
   * may keep them mapped (glibc raises its mmap threshold after a free), so how many more fit
   * is malloc's business; but none would fit without emptying the cache. */
  if (cap ? m * LARGE < (n * SMALL) / 2 : m < 1)
    fail_msg("%s: only %d tensors of %lld bytes after freeing %d of %lld: %s", id, m,
             (long long)LARGE, n, (long long)SMALL, clpar_last_error());
  tu_ok(clpar_device_memory_stats(dev, &st));
  assert_int_equal(st.bytes_cached, 0); /* every SMALL block went back to the driver */
  for (int i = 0; i < m; i++) clpar_tensor_free(t[i]);
  free(t);

  /* The device keeps working. */
  check_device_works(dev);
  tu_ok(clpar_device_empty_cache(dev));
  tu_ok(clpar_device_memory_stats(dev, &st));
  assert_int_equal(st.bytes_in_use, base.bytes_in_use);
  if (capped) assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
}

static void test_out_of_memory_then_keep_working(void **state) {
  (void)state;
  check_out_of_memory(tu_host());
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    if (dev == tu_host()) continue;
    /* Without clpar's cap, the driver must refuse: lowering RLIMIT_AS makes a CPU device's
     * driver do so, but a GPU's memory is not the process's address space (and NVIDIA's
     * OpenCL allocates a buffer only when a kernel first touches it), so this method cannot
     * make a GPU driver refuse: the capped run (test_memory) covers GPUs. */
    clpar_device_info info;
    tu_ok(clpar_device_get_info(dev, &info));
    if (!clpar_cap() && info.type == CLPAR_DEVICE_GPU) {
      fprintf(stderr, "%s: a GPU; the driver's refusal is not provoked here\n",
              clpar_device_id(dev));
      continue;
    }
    check_out_of_memory(dev);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_out_of_memory_then_keep_working),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
