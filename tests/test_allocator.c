/* test_allocator.c — the caching allocator: a steady-state loop takes every buffer from the
 * cache (no driver allocation after the first step), empty_cache gives them back, and a
 * request the device cannot hold is refused without touching the cache. */
#include <string.h>

#include "internal.h"
#include "test_util.h"

/* One "training-like" step: a few temporaries of several sizes, released by a scope. */
static void step(clpar_device *dev, clpar_tensor *w) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *y, *z, *g;
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){32, 64}, 5, -1, 1, &x));
  tu_ok(clpar_matmul(x, w, 0, 0, &y));
  tu_ok(clpar_add(y, y, &z));
  tu_ok(clpar_sum_rows(z, &g));
  clpar_scope_end(sc);
}

static void test_steady_state_allocates_nothing(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_tensor *w;
    tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){64, 16}, 6, -1, 1, &w));
    step(dev, w);
    clpar_memory_stats first, later;
    tu_ok(clpar_device_memory_stats(dev, &first));
    for (int i = 0; i < 20; i++) step(dev, w);
    tu_ok(clpar_device_synchronize(dev));
    tu_ok(clpar_device_memory_stats(dev, &later));
    assert_int_equal(later.driver_allocs, first.driver_allocs);
    assert_true(later.cache_hits >= first.cache_hits + 20 * 4);
    assert_int_equal(later.bytes_in_use, first.bytes_in_use);
    assert_true(later.bytes_cached > 0);
    clpar_tensor_free(w);
    tu_ok(clpar_device_empty_cache(dev));
    clpar_memory_stats emptied;
    tu_ok(clpar_device_memory_stats(dev, &emptied));
    assert_int_equal(emptied.bytes_cached, 0);
    assert_int_equal(emptied.bytes_in_use, 0);
    assert_int_equal(emptied.driver_frees, emptied.driver_allocs);
  }
}

/* A cached block far larger than the request is not handed out (bounded waste). */
static void test_best_fit_bounds_waste(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  tu_ok(clpar_device_empty_cache(dev));
  clpar_tensor *big, *small;
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){1 << 20}, &big));
  clpar_tensor_free(big);
  clpar_memory_stats a, b;
  tu_ok(clpar_device_memory_stats(dev, &a));
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){1000}, &small));
  tu_ok(clpar_device_memory_stats(dev, &b));
  assert_int_equal(b.driver_allocs, a.driver_allocs + 1);
  assert_int_equal(b.bytes_in_use, 4096); /* 4000 bytes rounded to 512 */
  clpar_tensor_free(small);
  tu_ok(clpar_device_empty_cache(dev));
}

/* The cache (its blocks and the driver's counts) as seen by the stats. */
static void expect_cache_unchanged(clpar_device *dev, const clpar_memory_stats *before) {
  clpar_memory_stats after;
  tu_ok(clpar_device_memory_stats(dev, &after));
  assert_int_equal(after.bytes_cached, before->bytes_cached);
  assert_int_equal(after.bytes_in_use, before->bytes_in_use);
  assert_int_equal(after.driver_allocs, before->driver_allocs);
  assert_int_equal(after.driver_frees, before->driver_frees);
  assert_int_equal(after.cache_hits, before->cache_hits);
}

/* A request larger than one buffer of the device, and one larger than the device's memory
 * less what tensors hold, are refused; the cached blocks stay, since giving them back could
 * not have made either fit. */
static void test_impossible_request_keeps_cache(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  tu_ok(clpar_device_empty_cache(dev));
  clpar_tensor *held, *cached, *t = NULL;
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){1 << 16}, &held));
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){1 << 18}, &cached));
  clpar_tensor_free(cached); /* 1 MiB in the cache */
  clpar_memory_stats before;
  tu_ok(clpar_device_memory_stats(dev, &before));
  assert_true(before.bytes_cached >= (1u << 20));

  int64_t too_big = (int64_t)(dev->bd.info.max_alloc_bytes / sizeof(float)) + 1;
  assert_int_equal(clpar_tensor_zeros(dev, 1, &too_big, &t), CLPAR_ERROR_TOO_LARGE);
  assert_null(t);
  expect_cache_unchanged(dev, &before);

  /* a limit that leaves 2 MiB beside the tensors: 4 MiB cannot fit, cache or not */
  uint64_t limit = dev->mem_limit;
  dev->mem_limit = before.bytes_in_use + before.bytes_cached + ((uint64_t)1 << 20);
  clpar_status s = clpar_tensor_zeros(dev, 1, (int64_t[]){1 << 20}, &t);
  dev->mem_limit = limit;
  assert_int_equal(s, CLPAR_ERROR_OUT_OF_MEMORY);
  assert_non_null(strstr(clpar_last_error(), clpar_device_id(dev)));
  assert_null(t);
  expect_cache_unchanged(dev, &before);
  clpar_tensor_free(held);
  tu_ok(clpar_device_empty_cache(dev));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_steady_state_allocates_nothing),
      cmocka_unit_test(test_best_fit_bounds_waste),
      cmocka_unit_test(test_impossible_request_keeps_cache),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
