/* test_ops.c — every op on every selected device against the host reference, with odd sizes,
 * views and broadcasting; and every op's bad input giving a clear error and changing nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

typedef clpar_status (*binary_fn)(const clpar_tensor *, const clpar_tensor *, clpar_tensor **);

static void check_binary(clpar_device *dev, binary_fn fn, const char *name) {
  static const int64_t a_shape[] = {37, 53}, row1[] = {53}, row2[] = {1, 53};
  const int64_t *b_shapes[] = {a_shape, row1, row2};
  const int b_ndims[] = {2, 1, 2};
  for (int v = 0; v < 3; v++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *a = tu_make(dev, 2, a_shape, 1), *b = tu_make(dev, b_ndims[v], b_shapes[v], 2);
    clpar_tensor *ha = tu_make(tu_host(), 2, a_shape, 1),
                 *hb = tu_make(tu_host(), b_ndims[v], b_shapes[v], 2);
    clpar_tensor *r, *hr;
    tu_ok(fn(a, b, &r));
    tu_ok(fn(ha, hb, &hr));
    tu_expect_equal(r, hr, 1e-6f, 1e-6f, name);
    clpar_scope_end(sc);
  }
}

static void test_elementwise(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    check_binary(dev, clpar_add, "add");
    check_binary(dev, clpar_sub, "sub");
    check_binary(dev, clpar_mul, "mul");
    clpar_scope *sc = clpar_scope_begin();
    int64_t shape[] = {3, 5, 7};
    clpar_tensor *a = tu_make(dev, 3, shape, 3), *ha = tu_make(tu_host(), 3, shape, 3), *r, *hr;
    tu_ok(clpar_scale(a, -2.5f, &r));
    tu_ok(clpar_scale(ha, -2.5f, &hr));
    tu_expect_equal(r, hr, 1e-6f, 0, "scale");
    tu_ok(clpar_fill(r, 0.75f));
    float *v = tu_read(r);
    for (int i = 0; i < 105; i++) assert_float_equal(v[i], 0.75f, 0);
    free(v);
    clpar_scope_end(sc);
  }
}

static void check_gemm(clpar_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k) {
  clpar_scope *sc = clpar_scope_begin();
  int64_t as[2] = {ta ? k : m, ta ? m : k}, bs[2] = {tb ? n : k, tb ? k : n};
  clpar_tensor *a = tu_make(dev, 2, as, 10), *b = tu_make(dev, 2, bs, 11), *r;
  clpar_tensor *ha = tu_make(tu_host(), 2, as, 10), *hb = tu_make(tu_host(), 2, bs, 11), *hr;
  tu_ok(clpar_matmul(a, b, ta, tb, &r));
  tu_ok(clpar_matmul(ha, hb, ta, tb, &hr));
  tu_expect_equal(r, hr, 1e-4f, 1e-4f, "matmul");
  /* Accumulating form: c = 0.5 op(a) op(b) - 2 c */
  int64_t cs[2] = {m, n};
  clpar_tensor *c = tu_make(dev, 2, cs, 12), *hc = tu_make(tu_host(), 2, cs, 12);
  tu_ok(clpar_gemm(ta, tb, 0.5f, a, b, -2.0f, c));
  tu_ok(clpar_gemm(ta, tb, 0.5f, ha, hb, -2.0f, hc));
  tu_expect_equal(c, hc, 1e-4f, 1e-4f, "gemm alpha beta");
  /* beta = 0 must ignore what c held, NaN included */
  tu_ok(clpar_fill(c, NAN));
  tu_ok(clpar_gemm(ta, tb, 1.0f, a, b, 0.0f, c));
  tu_expect_equal(c, hr, 1e-4f, 1e-4f, "gemm beta 0 over NaN");
  clpar_scope_end(sc);
}

static void test_gemm(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    for (int t = 0; t < 4; t++) {
      check_gemm(clpar_device_get(d), t & 1, t >> 1, 37, 53, 29);
      check_gemm(clpar_device_get(d), t & 1, t >> 1, 1, 7, 64);
      /* n and k multiples of 8: the OpenCL backend's small kernels on a CPU device */
      check_gemm(clpar_device_get(d), t & 1, t >> 1, 19, 24, 40);
      check_gemm(clpar_device_get(d), t & 1, t >> 1, 3, 8, 8);
      /* over 2^20 multiply-adds: a CPU device's register-tiled kernel, edges in m, n, k */
      check_gemm(clpar_device_get(d), t & 1, t >> 1, 45, 77, 401);
    }
    /* B transposed (nt), k a multiple of 8: a CPU device's small kernel at any size while B
     * holds at most 2^22 floats (m and n not multiples of a work-group), CLBlast past that */
    check_gemm(clpar_device_get(d), 0, 1, 67, 1029, 1024);
    check_gemm(clpar_device_get(d), 0, 1, 5, 2049, 2048);
    /* nn narrower than the tiled kernel's 32 columns, over 2^20 multiply-adds: the small
     * kernel on a CPU device; the same in tn: CLBlast */
    check_gemm(clpar_device_get(d), 0, 0, 129, 16, 1031);
    check_gemm(clpar_device_get(d), 1, 0, 129, 16, 1031);
  }
}

static void test_gemm_on_views(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_scope *sc = clpar_scope_begin();
    int64_t xs[2] = {30, 5}, ws[2] = {2, 5};
    clpar_tensor *x = tu_make(dev, 2, xs, 20), *w = tu_make(dev, 2, ws, 21);
    clpar_tensor *hx = tu_make(tu_host(), 2, xs, 20), *hw = tu_make(tu_host(), 2, ws, 21);
    clpar_tensor *xv, *hxv, *r, *hr;
    tu_ok(clpar_tensor_rows(x, 13, 11, &xv)); /* an odd offset into the buffer */
    tu_ok(clpar_tensor_rows(hx, 13, 11, &hxv));
    tu_ok(clpar_matmul(xv, w, 0, 1, &r));
    tu_ok(clpar_matmul(hxv, hw, 0, 1, &hr));
    tu_expect_equal(r, hr, 1e-5f, 1e-5f, "matmul of a view");
    clpar_scope_end(sc);
  }
}

/* c sharing memory with a or b is refused alike on every backend (the host backend computed
 * a wrong result in place, CLBlast a right one); disjoint rows of one tensor are fine. */
static void test_gemm_aliasing(void **state) {
  (void)state;
  for (int d = 0; d <= clpar_device_count(); d++) {
    clpar_device *dev = d < clpar_device_count() ? clpar_device_get(d) : tu_host();
    clpar_scope *sc = clpar_scope_begin();
    int64_t s4[2] = {4, 4}, s12[2] = {12, 4};
    clpar_tensor *a = tu_make(dev, 2, s4, 80), *b = tu_make(dev, 2, s4, 81);
    clpar_tensor *big = tu_make(dev, 2, s12, 82), *top, *mid, *bottom;
    float *before = tu_read(a), *after;
    assert_int_equal(clpar_gemm(0, 0, 1.0f, a, b, 0.0f, a), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "c shares memory with a"));
    assert_int_equal(clpar_gemm(1, 0, 1.0f, b, a, 1.0f, a), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "c shares memory with b"));
    after = tu_read(a);
    tu_assert_close(after, before, 16, 0, 0, "a unchanged by a refused gemm");
    free(after);
    tu_ok(clpar_tensor_rows(big, 0, 4, &top));
    tu_ok(clpar_tensor_rows(big, 2, 4, &mid));
    tu_ok(clpar_tensor_rows(big, 8, 4, &bottom));
    assert_int_equal(clpar_gemm(0, 0, 1.0f, top, b, 0.0f, mid), CLPAR_ERROR_INVALID_ARGUMENT);
    tu_ok(clpar_gemm(0, 0, 1.0f, top, top, 0.0f, bottom)); /* disjoint rows */
    clpar_tensor *ref;
    tu_ok(clpar_matmul(top, top, 0, 0, &ref));
    tu_expect_equal(bottom, ref, 1e-5f, 1e-5f, "gemm into disjoint rows of its input");
    free(before);
    clpar_scope_end(sc);
  }
}

static void test_sum_rows(void **state) {
  (void)state;
  static const int64_t shapes[][3] = {{1000, 33, 0}, {1, 17, 0}, {7, 3, 5}};
  static const int ndims[] = {2, 2, 3};
  for (int d = 0; d < clpar_device_count(); d++)
    for (int s = 0; s < 3; s++) {
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *a = tu_make(clpar_device_get(d), ndims[s], shapes[s], 30), *r;
      clpar_tensor *ha = tu_make(tu_host(), ndims[s], shapes[s], 30), *hr;
      tu_ok(clpar_sum_rows(a, &r));
      tu_ok(clpar_sum_rows(ha, &hr));
      tu_expect_equal(r, hr, 1e-5f, 1e-4f, "sum_rows");
      assert_int_equal(clpar_tensor_ndim(r), ndims[s] - 1);
      clpar_scope_end(sc);
    }
}

static void test_concat_split(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_scope *sc = clpar_scope_begin();
    int64_t s1[] = {3, 4}, s2[] = {5, 4}, s3[] = {1, 4};
    clpar_tensor *parts[3] = {tu_make(dev, 2, s1, 40), tu_make(dev, 2, s2, 41),
                              tu_make(dev, 2, s3, 42)};
    clpar_tensor *hparts[3] = {tu_make(tu_host(), 2, s1, 40), tu_make(tu_host(), 2, s2, 41),
                               tu_make(tu_host(), 2, s3, 42)};
    clpar_tensor *cat, *hcat;
    tu_ok(clpar_concat(parts, 3, &cat));
    tu_ok(clpar_concat(hparts, 3, &hcat));
    tu_expect_equal(cat, hcat, 0, 0, "concat");
    assert_int_equal(clpar_tensor_dim(cat, 0), 9);
    clpar_tensor *back[3];
    int64_t sizes[] = {3, 5, 1};
    tu_ok(clpar_split(cat, sizes, 3, back));
    for (int i = 0; i < 3; i++) tu_expect_equal(back[i], hparts[i], 0, 0, "split");
    clpar_scope_end(sc);
  }
}

static void test_chunk_sizes_match_tutorials(void **state) {
  (void)state;
  /* The tables of PyTorch's "Optional: Data Parallelism": batch 30 and the last batch of 10
   * (100 rows, batch 30) over 2, 3, 4 and 8 GPUs. */
  static const struct {
    int64_t rows;
    int k, n;
    int64_t sizes[8];
  } cases[] = {
      {30, 1, 1, {30}},
      {10, 1, 1, {10}},
      {30, 2, 2, {15, 15}},
      {10, 2, 2, {5, 5}},
      {30, 3, 3, {10, 10, 10}},
      {10, 3, 3, {4, 4, 2}},
      {30, 4, 4, {8, 8, 8, 6}},
      {10, 4, 4, {3, 3, 3, 1}},
      {30, 8, 8, {4, 4, 4, 4, 4, 4, 4, 2}},
      {10, 8, 5, {2, 2, 2, 2, 2}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int64_t got[8] = {0};
    int n = clpar_chunk_sizes(cases[c].rows, cases[c].k, got);
    assert_int_equal(n, cases[c].n);
    for (int i = 0; i < n; i++) assert_int_equal(got[i], cases[c].sizes[i]);
  }
  int64_t sz[4];
  assert_int_equal(clpar_chunk_sizes(0, 4, sz), CLPAR_ERROR_EMPTY);
  assert_int_equal(clpar_chunk_sizes(5, 0, sz), CLPAR_ERROR_INVALID_ARGUMENT);
}

/* Sizes near INT64_MAX: no signed overflow (UBSan would stop here), no endless loop, and the
 * sizes still add up (checked, since a wrapped sum could look right). */
static int64_t checked_sum(const int64_t *sizes, int n) {
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    assert_true(sizes[i] >= 0);
    assert_false(__builtin_add_overflow(total, sizes[i], &total));
  }
  return total;
}

static void test_huge_sizes(void **state) {
  (void)state;
  int64_t sz[8];
  for (int k = 1; k <= 8; k++) {
    assert_int_equal(clpar_chunk_sizes(INT64_MAX, k, sz), k);
    assert_int_equal(checked_sum(sz, k), INT64_MAX);
    assert_int_equal(sz[0], INT64_MAX / k + (INT64_MAX % k != 0));
  }
  assert_int_equal(clpar_chunk_sizes(INT64_MAX - 1, 2, sz), 2);
  assert_int_equal(sz[0], INT64_MAX / 2);
  /* weighted sizes (DataParallel's weights): the usual cases, then the largest batch */
  static const float w31[] = {3, 1}, w1[] = {1}, w111[] = {1, 1, 1}, wodd[] = {1e-3f, 7, 0.5f};
  clpar_weighted_sizes(100, w31, 2, sz);
  assert_int_equal(sz[0], 75);
  assert_int_equal(sz[1], 25);
  clpar_weighted_sizes(30, w31, 2, sz);
  assert_int_equal(sz[0], 23); /* 22.5 and 7.5: the tie goes to the first */
  assert_int_equal(sz[1], 7);
  clpar_weighted_sizes(10, w111, 3, sz);
  assert_int_equal(sz[0], 4);
  assert_int_equal(sz[1], 3);
  assert_int_equal(sz[2], 3);
  const float *ws[] = {w31, w1, w111, wodd};
  const int wn[] = {2, 1, 3, 3};
  for (int c = 0; c < 4; c++) {
    for (int64_t below = 0; below <= 2; below++) {
      clpar_weighted_sizes(INT64_MAX - below, ws[c], wn[c], sz);
      assert_int_equal(checked_sum(sz, wn[c]), INT64_MAX - below);
    }
  }
  /* split sizes whose sum overflows */
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *t = tu_make(dev, 2, (int64_t[]){4, 2}, 90), *outs[3] = {0};
  assert_int_equal(clpar_split(t, (int64_t[]){INT64_MAX, INT64_MAX, 2}, 3, outs),
                   CLPAR_ERROR_TOO_LARGE);
  assert_null(outs[0]);
  clpar_tensor_free(t);
}

/* Bad input: each op refuses with a clear error, allocates nothing and leaves out alone. */
static void test_bad_input_changes_nothing(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    int64_t as[] = {4, 3}, bs[] = {3, 4}, cs[] = {2, 3};
    clpar_tensor *a = tu_make(dev, 2, as, 50), *b = tu_make(dev, 2, bs, 51),
                 *c = tu_make(dev, 2, cs, 52);
    clpar_memory_stats before, after;
    tu_ok(clpar_device_memory_stats(dev, &before));
    clpar_tensor *sentinel = (clpar_tensor *)(uintptr_t)0x1234, *out = sentinel;
    assert_int_equal(clpar_add(a, b, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_non_null(strstr(clpar_last_error(), "[4, 3]"));
    assert_non_null(strstr(clpar_last_error(), "[3, 4]"));
    assert_int_equal(clpar_mul(a, c, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_int_equal(clpar_matmul(a, c, 0, 0, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_non_null(strstr(clpar_last_error(), "inner"));
    assert_int_equal(clpar_gemm(0, 0, 1, a, b, 0, a), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_int_equal(clpar_concat((clpar_tensor *[]){a, b}, 2, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    clpar_tensor *outs[2] = {sentinel, sentinel};
    assert_int_equal(clpar_split(a, (int64_t[]){1, 2}, 2, outs), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_int_equal(clpar_split(a, (int64_t[]){4, 0}, 2, outs), CLPAR_ERROR_EMPTY);
    assert_ptr_equal(outs[0], sentinel);
    assert_ptr_equal(outs[1], sentinel);
    assert_int_equal(clpar_add(NULL, b, &out), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_int_equal(clpar_copy(a, c), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_int_equal(clpar_copy(a, b), CLPAR_ERROR_SHAPE_MISMATCH); /* same numel, other shape */
    assert_non_null(strstr(clpar_last_error(), "dst is [4, 3], src is [3, 4]"));
    assert_ptr_equal(out, sentinel);
    tu_ok(clpar_device_memory_stats(dev, &after));
    assert_int_equal(after.bytes_in_use, before.bytes_in_use);
    assert_int_equal(after.driver_allocs, before.driver_allocs);
    float va[12];
    tu_ok(clpar_tensor_read(a, va, 12));
    float *ref = tu_rand(12, 50);
    tu_assert_close(va, ref, 12, 0, 0, "a unchanged");
    free(ref);
    clpar_tensor_free(a);
    clpar_tensor_free(b);
    clpar_tensor_free(c);
  }
}

/* clpar_copy takes src of dst's shape, or of dst's less leading 1s (torch's copy_ broadcasts
 * src to dst); another shape of the same numel is refused, naming both shapes. */
static void test_copy_shapes(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *a = tu_make(dev, 2, (int64_t[]){32, 96}, 53), *t;
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){96, 32}, &t));
  assert_int_equal(clpar_copy(t, a), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_non_null(strstr(clpar_last_error(), "dst is [96, 32], src is [32, 96]"));
  clpar_tensor *row = tu_make(dev, 1, (int64_t[]){96}, 54), *r;
  tu_ok(clpar_tensor_zeros(dev, 3, (int64_t[]){1, 1, 96}, &r));
  tu_ok(clpar_copy(r, row));
  assert_int_equal(clpar_copy(row, r), CLPAR_ERROR_SHAPE_MISMATCH); /* [1, 1, 96] into [96] */
  float *got = tu_read(r), *want = tu_rand(96, 54);
  tu_assert_close(got, want, 96, 0, 0, "[96] into [1, 1, 96]");
  free(got), free(want);
  clpar_tensor_free(a), clpar_tensor_free(t), clpar_tensor_free(row), clpar_tensor_free(r);
}

static void test_device_mismatch(void **state) {
  (void)state;
  clpar_device *dev = tu_non_host();
  if (!dev) {
    print_message("only the host device: no other device to mismatch\n");
    skip();
  }
  int64_t s[] = {2, 2};
  clpar_tensor *a = tu_make(dev, 2, s, 60), *h = tu_make(tu_host(), 2, s, 61), *out = NULL;
  assert_int_equal(clpar_add(a, h, &out), CLPAR_ERROR_DEVICE_MISMATCH);
  assert_non_null(strstr(clpar_last_error(), clpar_device_id(dev)));
  assert_null(out);
  clpar_tensor_free(a);
  clpar_tensor_free(h);
}

/* Profiling counts the ops where the backend can (OpenCL), and says so where not; how long they
 * took is for the benchmarks (bench_train_step prints it). */
static void test_profiling(void **state) {
  (void)state;
  assert_int_equal(clpar_device_profile_start(tu_host()), CLPAR_ERROR_UNSUPPORTED);
  assert_non_null(strstr(clpar_last_error(), "cannot be profiled"));
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_device_info info;
    tu_ok(clpar_device_get_info(dev, &info));
    if (strcmp(info.backend, "opencl") != 0) continue;
    int64_t s[] = {64, 64};
    clpar_tensor *a = tu_make(dev, 2, s, 70), *r = NULL, *q = NULL;
    tu_ok(clpar_device_profile_start(dev));
    tu_ok(clpar_matmul(a, a, 0, 0, &r)); /* one GEMM */
    tu_ok(clpar_add(r, a, &q));          /* one kernel */
    clpar_profile p;
    tu_ok(clpar_device_profile_read(dev, &p));
    assert_int_equal(p.ops, 2);
    assert_true(isfinite(p.device_seconds) && p.device_seconds >= 0);
    tu_ok(clpar_device_profile_stop(dev));
    tu_ok(clpar_device_profile_start(dev)); /* restarts from zero */
    tu_ok(clpar_device_profile_read(dev, &p));
    assert_int_equal(p.ops, 0);
    assert_true(p.device_seconds == 0);
    tu_ok(clpar_device_profile_stop(dev));
    clpar_tensor_free(a);
    clpar_tensor_free(r);
    clpar_tensor_free(q);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_elementwise),
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_gemm_on_views),
      cmocka_unit_test(test_gemm_aliasing),
      cmocka_unit_test(test_sum_rows),
      cmocka_unit_test(test_concat_split),
      cmocka_unit_test(test_chunk_sizes_match_tutorials),
      cmocka_unit_test(test_huge_sizes),
      cmocka_unit_test(test_bad_input_changes_nothing),
      cmocka_unit_test(test_copy_shapes),
      cmocka_unit_test(test_device_mismatch),
      cmocka_unit_test(test_profiling),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
