/* test_tensor.c — creation, transfers between host and devices (and between devices), views,
 * reshape, reference counting and scopes, random tensors that agree on every backend, and the
 * bad input of each (0 rows, too large, a host buffer too small, NULL). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

static void test_roundtrip_every_device(void **state) {
  (void)state;
  float data[6] = {1, 2, 3, 4, 5, 6}, back[6];
  int64_t shape[] = {2, 3};
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_tensor *t;
    tu_ok(clpar_tensor_from_host(clpar_device_get(d), 2, shape, data, &t));
    assert_int_equal(clpar_tensor_ndim(t), 2);
    assert_int_equal(clpar_tensor_dim(t, 0), 2);
    assert_int_equal(clpar_tensor_dim(t, -1), 3);
    assert_int_equal(clpar_tensor_dim(t, 2), 0);
    assert_int_equal(clpar_tensor_numel(t), 6);
    assert_ptr_equal(clpar_tensor_device(t), clpar_device_get(d));
    tu_ok(clpar_tensor_read(t, back, 6));
    assert_memory_equal(back, data, sizeof data);
    float other[6] = {-1, -2, -3, -4, -5, -6};
    tu_ok(clpar_tensor_write(t, other, 6));
    tu_ok(clpar_tensor_read(t, back, 6));
    assert_memory_equal(back, other, sizeof other);
    clpar_tensor *z;
    tu_ok(clpar_tensor_zeros(clpar_device_get(d), 2, shape, &z));
    tu_ok(clpar_tensor_read(z, back, 6));
    for (int i = 0; i < 6; i++) assert_float_equal(back[i], 0.0f, 0);
    clpar_tensor_free(z);
    clpar_tensor_free(t);
  }
}

/* Moves a tensor along every device, the host between each, and expects the same values. */
static void test_to_across_devices(void **state) {
  (void)state;
  int64_t shape[] = {17, 9};
  float *data = tu_rand(153, 7);
  clpar_tensor *cur;
  tu_ok(clpar_tensor_from_host(tu_host(), 2, shape, data, &cur));
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_tensor *next;
    tu_ok(clpar_tensor_to(cur, clpar_device_get(d), &next));
    clpar_tensor_free(cur);
    cur = next;
    float *v = tu_read(cur);
    assert_memory_equal(v, data, 153 * sizeof(float));
    free(v);
  }
  clpar_tensor *last;
  tu_ok(clpar_tensor_to(cur, tu_host(), &last));
  float *v = tu_read(last);
  assert_memory_equal(v, data, 153 * sizeof(float));
  free(v);
  free(data);
  clpar_tensor_free(cur);
  clpar_tensor_free(last);
}

static void test_rows_view_shares_memory(void **state) {
  (void)state;
  int64_t shape[] = {10, 4};
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    float *data = tu_rand(40, 8);
    clpar_tensor *t, *v;
    tu_ok(clpar_tensor_from_host(dev, 2, shape, data, &t));
    clpar_memory_stats before, after;
    tu_ok(clpar_device_memory_stats(dev, &before));
    tu_ok(clpar_tensor_rows(t, 3, 5, &v));
    tu_ok(clpar_device_memory_stats(dev, &after));
    assert_int_equal(after.bytes_in_use, before.bytes_in_use); /* a view, not a copy */
    assert_int_equal(clpar_tensor_dim(v, 0), 5);
    float *got = tu_read(v);
    assert_memory_equal(got, data + 12, 20 * sizeof(float));
    free(got);
    tu_ok(clpar_fill(v, 9.0f)); /* writes through to t */
    float *all = tu_read(t);
    for (int i = 0; i < 40; i++)
      assert_float_equal(all[i], (i >= 12 && i < 32) ? 9.0f : data[i], 0);
    free(all);
    clpar_tensor_free(t); /* the view keeps the storage alive */
    got = tu_read(v);
    assert_float_equal(got[0], 9.0f, 0);
    free(got);
    clpar_tensor *r;
    tu_ok(clpar_tensor_reshape(v, 1, (int64_t[]){20}, &r));
    assert_int_equal(clpar_tensor_dim(r, 0), 20);
    assert_int_equal(clpar_tensor_reshape(v, 1, (int64_t[]){21}, &r), CLPAR_ERROR_SHAPE_MISMATCH);
    clpar_tensor_free(r);
    clpar_tensor_free(v);
    free(data);
  }
}

/* The same seed gives the same values on every device, and a known value everywhere. */
static void test_random_is_device_independent(void **state) {
  (void)state;
  int64_t shape[] = {64, 33};
  clpar_tensor *hu, *hn;
  tu_ok(clpar_tensor_rand_uniform(tu_host(), 2, shape, 42, -0.5f, 0.5f, &hu));
  tu_ok(clpar_tensor_rand_normal(tu_host(), 2, shape, 42, 1.0f, 2.0f, &hn));
  float *u = tu_read(hu), *n = tu_read(hn);
  double mean = 0, var = 0;
  for (int i = 0; i < 64 * 33; i++) {
    assert_true(u[i] >= -0.5f && u[i] < 0.5f);
    mean += n[i];
  }
  mean /= 64 * 33;
  for (int i = 0; i < 64 * 33; i++) var += (n[i] - mean) * (n[i] - mean);
  var /= 64 * 33 - 1;
  assert_true(mean > 0.85 && mean < 1.15); /* 2112 samples: the mean's sd is 0.044 */
  assert_true(var > 3.5 && var < 4.5);
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_tensor *du, *dn;
    tu_ok(clpar_tensor_rand_uniform(clpar_device_get(d), 2, shape, 42, -0.5f, 0.5f, &du));
    tu_ok(clpar_tensor_rand_normal(clpar_device_get(d), 2, shape, 42, 1.0f, 2.0f, &dn));
    float *a = tu_read(du), *b = tu_read(dn);
    assert_memory_equal(a, u, 64 * 33 * sizeof(float));
    assert_memory_equal(b, n, 64 * 33 * sizeof(float));
    free(a);
    free(b);
    clpar_tensor_free(du);
    clpar_tensor_free(dn);
  }
  clpar_tensor *other;
  tu_ok(clpar_tensor_rand_uniform(tu_host(), 2, shape, 43, -0.5f, 0.5f, &other));
  float *o = tu_read(other);
  assert_memory_not_equal(o, u, 64 * 33 * sizeof(float));
  free(o);
  free(u);
  free(n);
  clpar_tensor_free(other);
  clpar_tensor_free(hu);
  clpar_tensor_free(hn);
}

static void test_scope_releases_temporaries(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  int64_t shape[] = {8, 8};
  clpar_memory_stats base, mid, end;
  tu_ok(clpar_device_memory_stats(dev, &base));
  clpar_tensor *kept, *freed_by_hand;
  clpar_scope *outer = clpar_scope_begin();
  assert_non_null(outer);
  clpar_tensor *a, *b;
  tu_ok(clpar_tensor_zeros(dev, 2, shape, &a));
  clpar_scope *inner = clpar_scope_begin();
  tu_ok(clpar_add(a, a, &b));
  tu_ok(clpar_scale(b, 2.0f, &kept));
  clpar_tensor_retain(kept);
  tu_ok(clpar_add(b, b, &freed_by_hand));
  clpar_tensor_free(freed_by_hand); /* allowed inside a scope */
  clpar_scope_end(inner);
  tu_ok(clpar_device_memory_stats(dev, &mid));
  assert_true(mid.bytes_in_use > base.bytes_in_use); /* a and kept */
  clpar_scope_end(outer);
  float v[64];
  tu_ok(clpar_tensor_read(kept, v, 64)); /* still alive: it was retained */
  clpar_tensor_free(kept);
  tu_ok(clpar_device_memory_stats(dev, &end));
  assert_int_equal(end.bytes_in_use, base.bytes_in_use);
  clpar_scope_end(NULL);
  clpar_tensor_free(NULL);
}

static size_t bytes_in_use(clpar_device *dev) {
  clpar_memory_stats m;
  tu_ok(clpar_device_memory_stats(dev, &m));
  return (size_t)m.bytes_in_use;
}

static void *end_scope_elsewhere(void *scope) {
  clpar_scope_end(scope); /* not this thread's scope: left open */
  return NULL;
}

/* Ending an outer scope ends the inner ones too; their handles then end nothing (ending one
 * was a use-after-free), nor does a handle ended twice, a stale handle whose address a newer
 * scope took over, or a scope of another thread. */
static void test_scopes_out_of_order(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  int64_t shape[] = {8, 8};
  size_t base = bytes_in_use(dev);
  clpar_tensor *a, *b, *c;
  clpar_scope *outer = clpar_scope_begin(), *inner = clpar_scope_begin();
  tu_ok(clpar_tensor_zeros(dev, 2, shape, &a)); /* in inner */
  clpar_scope *innermost = clpar_scope_begin();
  tu_ok(clpar_tensor_zeros(dev, 2, shape, &b));
  clpar_scope_end(outer); /* before inner and innermost */
  assert_int_equal(bytes_in_use(dev), base);
  clpar_scope_end(innermost);
  clpar_scope_end(inner);
  clpar_scope_end(outer);
  /* No scope is open now: a new tensor belongs to the caller, not to an ended scope. */
  tu_ok(clpar_tensor_zeros(dev, 2, shape, &c));
  clpar_scope *later = clpar_scope_begin();
  clpar_scope_end(later);
  float v[64];
  tu_ok(clpar_tensor_read(c, v, 64));
  clpar_tensor_free(c);
  assert_int_equal(bytes_in_use(dev), base);

  /* A stale handle must not end the scope that now lives at its old address. */
  clpar_scope *old = clpar_scope_begin();
  clpar_scope_end(old);
  clpar_scope *fresh = clpar_scope_begin();
  tu_ok(clpar_tensor_zeros(dev, 2, shape, &a));
  clpar_scope_end(old);
  tu_ok(clpar_tensor_read(a, v, 64));
  /* Another thread cannot end it either. */
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, end_scope_elsewhere, fresh), 0);
  pthread_join(th, NULL);
  tu_ok(clpar_tensor_read(a, v, 64));
  clpar_scope_end(fresh);
  assert_int_equal(bytes_in_use(dev), base);
}

/* Internal holders (a graph node, an optimizer) take references of their own: dropping them
 * must not take the scope's reference away (a leak, found by the CUDA tests' author). */
static void test_scope_and_internal_references(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_memory_stats base, end;
  tu_ok(clpar_device_memory_stats(dev, &base));
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *p, *y, *loss;
  tu_ok(clpar_tensor_rand_uniform(dev, 1, (int64_t[]){8}, 1, -1, 1, &p));
  tu_ok(clpar_tensor_set_requires_grad(p, 1));
  clpar_optimizer *opt;
  clpar_sgd_options o = {.lr = 0.1f, .momentum = 0.9f};
  tu_ok(clpar_sgd_create(&p, 1, &o, &opt));
  tu_ok(clpar_mul(p, p, &y));
  tu_ok(clpar_sum(y, &loss));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_optimizer_step(opt));
  clpar_tensor_free(loss); /* by hand, inside the scope */
  clpar_optimizer_free(opt);
  clpar_scope_end(sc);
  tu_ok(clpar_device_memory_stats(dev, &end));
  assert_int_equal(end.bytes_in_use, base.bytes_in_use);
}

/* An int tensor may be 0-d (BatchNorm's num_batches_tracked, shape [] as in PyTorch); a float
 * one may not. */
static void test_zero_dim_int(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0), *other = tu_second_device(dev);
  clpar_tensor *c, *moved = NULL, *f = NULL, *rows = NULL;
  int64_t v = 41, back = 0;
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT64, 0, NULL, &c));
  char buf[16];
  assert_int_equal(clpar_tensor_ndim(c), 0);
  assert_int_equal(clpar_tensor_numel(c), 1);
  assert_string_equal(clpar_tensor_shape_str(c, buf, sizeof buf), "[]");
  tu_ok(clpar_tensor_read_raw(c, &back, sizeof back));
  assert_int_equal(back, 0);
  tu_ok(clpar_tensor_write_raw(c, &v, sizeof v));
  if (other) {
    tu_ok(clpar_tensor_to(c, other, &moved));
    assert_int_equal(clpar_tensor_ndim(moved), 0);
    tu_ok(clpar_tensor_read_raw(moved, &back, sizeof back));
    assert_int_equal(back, 41);
  }
  assert_int_not_equal(clpar_tensor_rows(c, 0, 1, &rows), CLPAR_OK);
  assert_int_equal(clpar_tensor_zeros(dev, 0, NULL, &f), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_tensor_zeros_dtype(dev, CLPAR_FLOAT32, 0, NULL, &f),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(f);
  assert_null(rows);
  clpar_tensor_free(moved);
  clpar_tensor_free(c);
}

static void test_bad_input(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *t = (clpar_tensor *)(uintptr_t)0x99, *sentinel = t;
  assert_int_equal(clpar_tensor_zeros(dev, 2, (int64_t[]){0, 5}, &t), CLPAR_ERROR_EMPTY);
  assert_non_null(strstr(clpar_last_error(), "dimension 0 is 0"));
  assert_int_equal(clpar_tensor_zeros(dev, 0, (int64_t[]){1}, &t), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_tensor_zeros(NULL, 1, (int64_t[]){1}, &t), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_tensor_from_host(dev, 1, (int64_t[]){3}, NULL, &t),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  /* Larger than the device allows: refused before the driver is asked. */
  clpar_device_info info;
  tu_ok(clpar_device_get_info(dev, &info));
  int64_t huge[] = {(int64_t)(info.max_alloc_bytes / sizeof(float)) + 1};
  clpar_memory_stats before, after;
  tu_ok(clpar_device_memory_stats(dev, &before));
  assert_int_equal(clpar_tensor_zeros(dev, 1, huge, &t), CLPAR_ERROR_TOO_LARGE);
  assert_non_null(strstr(clpar_last_error(), clpar_device_id(dev)));
  tu_ok(clpar_device_memory_stats(dev, &after));
  assert_int_equal(after.driver_allocs, before.driver_allocs);
  assert_ptr_equal(t, sentinel);
  /* A host buffer too small: an error, and the buffer untouched. */
  clpar_tensor *x;
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){3, 3}, &x));
  float small[8];
  for (int i = 0; i < 8; i++) small[i] = 7.0f;
  assert_int_equal(clpar_tensor_read(x, small, 8), CLPAR_ERROR_BUFFER_TOO_SMALL);
  assert_non_null(strstr(clpar_last_error(), "9 elements"));
  for (int i = 0; i < 8; i++) assert_float_equal(small[i], 7.0f, 0);
  assert_int_equal(clpar_tensor_write(x, small, 8), CLPAR_ERROR_BUFFER_TOO_SMALL);
  /* Rows out of range, or none. */
  clpar_tensor *v = sentinel;
  assert_int_equal(clpar_tensor_rows(x, 0, 0, &v), CLPAR_ERROR_EMPTY);
  assert_int_equal(clpar_tensor_rows(x, 2, 2, &v), CLPAR_ERROR_INDEX);
  assert_int_equal(clpar_tensor_rows(x, -1, 1, &v), CLPAR_ERROR_INDEX);
  assert_ptr_equal(v, sentinel);
  /* Shapes and row ranges near INT64_MAX: refused without signed overflow. */
  static const int64_t huge1[] = {INT64_MAX}, huge2[] = {INT64_MAX, INT64_MAX},
                       square[] = {(int64_t)1 << 32, (int64_t)1 << 32},
                       many[] = {1 << 16, 1 << 16, 1 << 16, 1 << 16};
  assert_int_equal(clpar_tensor_zeros(dev, 1, huge1, &t), CLPAR_ERROR_TOO_LARGE);
  assert_int_equal(clpar_tensor_zeros(dev, 2, huge2, &t), CLPAR_ERROR_TOO_LARGE);
  assert_int_equal(clpar_tensor_zeros(dev, 2, square, &t), CLPAR_ERROR_TOO_LARGE);
  assert_int_equal(clpar_tensor_zeros(dev, 4, many, &t), CLPAR_ERROR_TOO_LARGE);
  assert_int_equal(clpar_tensor_reshape(x, 2, huge2, &v), CLPAR_ERROR_TOO_LARGE);
  assert_int_equal(clpar_tensor_rows(x, INT64_MAX, 1, &v), CLPAR_ERROR_INDEX);
  assert_non_null(strstr(clpar_last_error(), "1 rows from row 9223372036854775807"));
  assert_int_equal(clpar_tensor_rows(x, 1, INT64_MAX, &v), CLPAR_ERROR_INDEX);
  assert_int_equal(clpar_tensor_rows(x, INT64_MIN, 1, &v), CLPAR_ERROR_INDEX);
  assert_ptr_equal(v, sentinel);
  assert_ptr_equal(t, sentinel);
  char buf[32];
  assert_string_equal(clpar_tensor_shape_str(x, buf, sizeof buf), "[3, 3]");
  clpar_tensor_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_every_device),
      cmocka_unit_test(test_to_across_devices),
      cmocka_unit_test(test_rows_view_shares_memory),
      cmocka_unit_test(test_random_is_device_independent),
      cmocka_unit_test(test_scope_releases_temporaries),
      cmocka_unit_test(test_scopes_out_of_order),
      cmocka_unit_test(test_scope_and_internal_references),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_zero_dim_int),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
