/* test_dtype.c — int32 and int64 tensors on every selected device: created, read and written
 * byte for byte (int64 values past 2^53, negatives), copied and moved between two devices,
 * viewed (rows, split, reshape with -1, flatten), concatenated, zero-filled, scoped; every
 * float op refusing them with an error naming the dtype and allocating nothing; and
 * safetensors files of I32 and I64 tensors. Also reshape's -1 and flatten on floats, with
 * their gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "io/safetensors.h"
#include "test_util.h"

#define N64 12
/* past 2^53 (not a double), negatives, the extremes: only a byte-exact path keeps them */
static const int64_t vals64[N64] = {0,
                                    -1,
                                    1,
                                    (INT64_C(1) << 53) + 1,
                                    -((INT64_C(1) << 53) + 3),
                                    INT64_MAX,
                                    INT64_MIN,
                                    INT64_C(0x0123456789abcdef),
                                    -INT64_C(0x0123456789abcdef),
                                    (INT64_C(1) << 62) + 7,
                                    -42,
                                    INT64_C(4294967296)};
static const int32_t vals32[6] = {0, -1, INT32_MAX, INT32_MIN, 16777217, -16777219};

static void expect_i64(const clpar_tensor *t, const int64_t *want, size_t n, const char *what) {
  int64_t got[64];
  assert_true(n <= 64);
  assert_int_equal(clpar_tensor_dtype(t), CLPAR_INT64);
  assert_int_equal(clpar_tensor_numel(t), (int64_t)n);
  tu_ok(clpar_tensor_read_raw(t, got, sizeof got));
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i])
      fail_msg("%s: element %zu is %lld, want %lld", what, i, (long long)got[i],
               (long long)want[i]);
}

static void test_dtype_names_and_sizes(void **state) {
  (void)state;
  assert_int_equal(clpar_dtype_size(CLPAR_FLOAT32), 4);
  assert_int_equal(clpar_dtype_size(CLPAR_INT32), 4);
  assert_int_equal(clpar_dtype_size(CLPAR_INT64), 8);
  assert_int_equal(clpar_dtype_size((clpar_dtype)7), 0);
  assert_string_equal(clpar_dtype_name(CLPAR_FLOAT32), "float32");
  assert_string_equal(clpar_dtype_name(CLPAR_INT32), "int32");
  assert_string_equal(clpar_dtype_name(CLPAR_INT64), "int64");
  assert_string_equal(clpar_dtype_name((clpar_dtype)-1), "unknown");
  clpar_tensor *t = NULL;
  int64_t shape[] = {3};
  assert_int_equal(clpar_tensor_zeros_dtype(tu_host(), (clpar_dtype)7, 1, shape, &t),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(t);
  tu_ok(clpar_tensor_zeros(tu_host(), 1, shape, &t));
  assert_int_equal(clpar_tensor_dtype(t), CLPAR_FLOAT32);
  clpar_tensor_free(t);
  assert_int_equal(clpar_tensor_dtype(NULL), CLPAR_FLOAT32);
}

/* Every selected device and the host: create, read, write, zeros; byte for byte. */
static void test_int_roundtrip_every_device(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    clpar_scope *sc = clpar_scope_begin();
    int64_t shape[] = {3, 4}, s32[] = {2, 3};
    clpar_tensor *a, *b, *z;
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 2, shape, vals64, &a));
    expect_i64(a, vals64, N64, clpar_device_id(dev));
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, s32, vals32, &b));
    assert_int_equal(clpar_tensor_dtype(b), CLPAR_INT32);
    int32_t got32[6];
    tu_ok(clpar_tensor_read_raw(b, got32, sizeof got32));
    assert_memory_equal(got32, vals32, sizeof got32);
    /* zeros of int64 are 8 zero bytes each; write_raw then replaces them */
    tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT64, 2, shape, &z));
    int64_t zero[N64] = {0};
    expect_i64(z, zero, N64, "zeros_dtype");
    tu_ok(clpar_tensor_write_raw(z, vals64, sizeof vals64));
    expect_i64(z, vals64, N64, "write_raw");
    /* fill with 0 zeroes every byte; any other value is refused */
    tu_ok(clpar_fill(z, 0.0f));
    expect_i64(z, zero, N64, "fill 0");
    assert_int_equal(clpar_fill(z, 1.0f), CLPAR_ERROR_DTYPE);
    assert_non_null(strstr(clpar_last_error(), "int64"));
    /* the float API refuses, naming the dtype; the raw API checks the buffer's size */
    float f[N64];
    assert_int_equal(clpar_tensor_read(a, f, N64), CLPAR_ERROR_DTYPE);
    assert_non_null(strstr(clpar_last_error(), "int64"));
    assert_int_equal(clpar_tensor_write(b, f, N64), CLPAR_ERROR_DTYPE);
    assert_non_null(strstr(clpar_last_error(), "int32"));
    int64_t small[N64];
    assert_int_equal(clpar_tensor_read_raw(a, small, sizeof small - 1),
                     CLPAR_ERROR_BUFFER_TOO_SMALL);
    assert_int_equal(clpar_tensor_write_raw(a, small, 8), CLPAR_ERROR_BUFFER_TOO_SMALL);
    expect_i64(a, vals64, N64, "unchanged after refused writes");
    clpar_scope_end(sc);
  }
}

/* clpar_tensor_to and clpar_copy between two devices, both ways, and within one. */
static void test_int_transfers(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d), *other = tu_second_device(dev);
    if (!other) skip();
    clpar_scope *sc = clpar_scope_begin();
    int64_t shape[] = {N64};
    clpar_tensor *a, *b, *c, *e;
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 1, shape, vals64, &a));
    tu_ok(clpar_tensor_to(a, other, &b));
    assert_ptr_equal(clpar_tensor_device(b), other);
    expect_i64(b, vals64, N64, "to the second device");
    tu_ok(clpar_tensor_to(b, dev, &c));
    expect_i64(c, vals64, N64, "and back");
    /* copy into a view of rows 4..11 of an int64 tensor on the other device */
    tu_ok(clpar_tensor_zeros_dtype(other, CLPAR_INT64, 1, shape, &e));
    clpar_tensor *rows, *src;
    tu_ok(clpar_tensor_rows(e, 4, 8, &rows));
    tu_ok(clpar_tensor_rows(a, 0, 8, &src));
    tu_ok(clpar_copy(rows, src));
    int64_t want[N64] = {0};
    memcpy(want + 4, vals64, 8 * sizeof *want);
    expect_i64(e, want, N64, "copy into rows");
    /* a dtype mismatch is refused, naming both */
    clpar_tensor *i32, *f;
    tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT32, 1, shape, &i32));
    tu_ok(clpar_tensor_zeros(other, 1, shape, &f));
    assert_int_equal(clpar_copy(i32, a), CLPAR_ERROR_DTYPE);
    assert_non_null(strstr(clpar_last_error(), "int32"));
    assert_non_null(strstr(clpar_last_error(), "int64"));
    assert_int_equal(clpar_copy(f, a), CLPAR_ERROR_DTYPE);
    /* moving a device's int32 through clpar_tensor_to keeps the bits too */
    clpar_tensor *x32, *y32;
    int64_t s6[] = {6};
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 1, s6, vals32, &x32));
    tu_ok(clpar_tensor_to(x32, other, &y32));
    int32_t got[6];
    tu_ok(clpar_tensor_read_raw(y32, got, sizeof got));
    assert_memory_equal(got, vals32, sizeof got);
    clpar_scope_end(sc);
  }
}

/* Views and concatenation of int64 tensors start at whole elements (offsets in 4-byte words). */
static void test_int_views(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_scope *sc = clpar_scope_begin();
    int64_t shape[] = {4, 3};
    clpar_tensor *a, *r, *v, *fl, *parts[3], *cat;
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 2, shape, vals64, &a));
    tu_ok(clpar_tensor_rows(a, 1, 2, &r));
    expect_i64(r, vals64 + 3, 6, "rows 1..2");
    int64_t vshape[] = {-1, 2};
    tu_ok(clpar_tensor_reshape(r, 2, vshape, &v));
    assert_int_equal(clpar_tensor_dim(v, 0), 3);
    expect_i64(v, vals64 + 3, 6, "reshape -1 of a view");
    tu_ok(clpar_tensor_flatten(a, 0, -1, &fl));
    assert_int_equal(clpar_tensor_ndim(fl), 1);
    expect_i64(fl, vals64, N64, "flatten");
    int64_t sizes[] = {1, 2, 1};
    tu_ok(clpar_split(a, sizes, 3, parts));
    expect_i64(parts[2], vals64 + 9, 3, "split part 2");
    clpar_tensor *order[] = {parts[2], parts[0], parts[1]};
    tu_ok(clpar_concat(order, 3, &cat));
    int64_t want[N64];
    memcpy(want, vals64 + 9, 3 * sizeof *want);
    memcpy(want + 3, vals64, 9 * sizeof *want);
    expect_i64(cat, want, N64, "concat");
    /* concat refuses mixed dtypes */
    clpar_tensor *f, *mixed[2], *bad = NULL;
    tu_ok(clpar_tensor_zeros(dev, 2, shape, &f));
    mixed[0] = a;
    mixed[1] = f;
    assert_int_equal(clpar_concat(mixed, 2, &bad), CLPAR_ERROR_DTYPE);
    assert_null(bad);
    clpar_scope_end(sc);
  }
}

/* Int tensors made in a scope go with it (the sanitizer build checks for leaks). */
static void test_int_scope_and_retain(void **state) {
  (void)state;
  int64_t shape[] = {5};
  clpar_tensor *kept;
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *a, *b;
  tu_ok(clpar_tensor_zeros_dtype(tu_host(), CLPAR_INT64, 1, shape, &a));
  tu_ok(clpar_tensor_zeros_dtype(tu_host(), CLPAR_INT32, 1, shape, &b));
  kept = clpar_tensor_retain(a);
  clpar_scope_end(sc);
  int64_t zero[5] = {0};
  expect_i64(kept, zero, 5, "retained past the scope");
  clpar_tensor_free(kept);
}

/* Every float op refuses an int tensor with CLPAR_ERROR_DTYPE naming the dtype, and leaves
 * out as it was. */
static clpar_status identity(clpar_module *self, clpar_tensor *in, clpar_tensor **out, void *u) {
  (void)self;
  (void)u;
  *out = clpar_tensor_retain(in);
  return CLPAR_OK;
}

static void test_float_ops_refuse_int(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  int64_t shape[] = {4, 3}, wshape[] = {2, 3};
  clpar_tensor *i, *f, *w, *out = NULL;
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT32, 2, shape, &i));
  tu_ok(clpar_tensor_zeros(dev, 2, shape, &f));
  tu_ok(clpar_tensor_zeros(dev, 2, wshape, &w));
  int dims[] = {0};
  int32_t labels[4] = {0};
#define REFUSES(call)                                                               \
  do {                                                                              \
    clpar_status s_ = (call);                                                       \
    if (s_ != CLPAR_ERROR_DTYPE)                                                    \
      fail_msg("%s gave %s, not CLPAR_ERROR_DTYPE", #call, clpar_status_name(s_));  \
    if (!strstr(clpar_last_error(), "int32"))                                       \
      fail_msg("%s: the error does not name int32: %s", #call, clpar_last_error()); \
    assert_null(out);                                                               \
  } while (0)
  REFUSES(clpar_add(i, f, &out));
  REFUSES(clpar_sub(f, i, &out));
  REFUSES(clpar_mul(i, i, &out));
  REFUSES(clpar_scale(i, 2.0f, &out));
  REFUSES(clpar_matmul(i, w, 0, 1, &out));
  REFUSES(clpar_gemm(0, 1, 1.0f, f, w, 0.0f, i));
  REFUSES(clpar_sum_rows(i, &out));
  REFUSES(clpar_relu(i, &out));
  REFUSES(clpar_sigmoid(i, &out));
  REFUSES(clpar_tanh(i, &out));
  REFUSES(clpar_softmax(i, &out));
  REFUSES(clpar_log_softmax(i, &out));
  REFUSES(clpar_sum(i, &out));
  REFUSES(clpar_mean(i, &out));
  REFUSES(clpar_linear(i, w, NULL, &out));
  REFUSES(clpar_linear(f, w, i, &out));
  REFUSES(clpar_mse_loss(f, i, CLPAR_REDUCTION_MEAN, &out));
  REFUSES(clpar_cross_entropy(i, labels, 4, CLPAR_REDUCTION_MEAN, &out));
  REFUSES(clpar_sum_dims(i, dims, 1, 0, &out));
  REFUSES(clpar_mean_dims(i, dims, 1, 0, &out));
  REFUSES(clpar_var_dims(i, dims, 1, 1, 0, &out));
  REFUSES(clpar_expand(i, 2, shape, &out));
  REFUSES(clpar_tensor_set_requires_grad(i, 1));
  assert_false(clpar_tensor_requires_grad(i));
  clpar_module *m;
  tu_ok(clpar_module_create("Holder", identity, NULL, NULL, &m));
  REFUSES(clpar_module_add_parameter(m, "count", i));
  assert_null(clpar_module_parameter(m, "count"));
  assert_int_equal(clpar_module_parameter_count(m), 0);
  clpar_module_free(m);
  clpar_optimizer *opt = NULL;
  clpar_sgd_options so = {.lr = 0.1f};
  REFUSES(clpar_sgd_create(&i, 1, &so, &opt));
  assert_null(opt);
#undef REFUSES
  clpar_scope_end(sc);
}

/* reshape's -1 and flatten on a float tensor: views, and the gradient flows back through. */
static void test_reshape_infer_and_flatten(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  int64_t shape[] = {2, 3, 4, 5};
  clpar_tensor *x = tu_make(dev, 4, shape, 1), *v, *f, *out = NULL;
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  int64_t s1[] = {6, -1, 5};
  tu_ok(clpar_tensor_reshape(x, 3, s1, &v));
  assert_int_equal(clpar_tensor_dim(v, 1), 4);
  int64_t two[] = {-1, 4, -1};
  assert_int_equal(clpar_tensor_reshape(x, 3, two, &out), CLPAR_ERROR_INVALID_ARGUMENT);
  int64_t odd[] = {7, -1};
  assert_int_equal(clpar_tensor_reshape(x, 2, odd, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  int64_t neg[] = {-2, 60};
  assert_int_equal(clpar_tensor_reshape(x, 2, neg, &out), CLPAR_ERROR_EMPTY);
  assert_null(out);
  /* flatten(1, -1): [2, 60]; flatten(-3, 2): [2, 12, 5]; flatten(2, 2): the same shape */
  tu_ok(clpar_tensor_flatten(x, 1, -1, &f));
  assert_int_equal(clpar_tensor_ndim(f), 2);
  assert_int_equal(clpar_tensor_dim(f, 1), 60);
  clpar_tensor *g;
  tu_ok(clpar_tensor_flatten(x, -3, 2, &g));
  assert_int_equal(clpar_tensor_ndim(g), 3);
  assert_int_equal(clpar_tensor_dim(g, 1), 12);
  tu_ok(clpar_tensor_flatten(x, 2, 2, &g));
  assert_int_equal(clpar_tensor_ndim(g), 4);
  assert_int_equal(clpar_tensor_flatten(x, 2, 1, &out), CLPAR_ERROR_INDEX);
  assert_int_equal(clpar_tensor_flatten(x, 0, 4, &out), CLPAR_ERROR_INDEX);
  assert_int_equal(clpar_tensor_flatten(x, -5, 0, &out), CLPAR_ERROR_INDEX);
  assert_null(out);
  /* the same memory: values equal x's; d sum(w * flatten(x)) / dx = w */
  float *xv = tu_read(x), *fv = tu_read(f);
  assert_memory_equal(xv, fv, 120 * sizeof *xv);
  int64_t fs[] = {2, 60};
  clpar_tensor *w = tu_make(dev, 2, fs, 9), *p, *loss;
  tu_ok(clpar_mul(f, w, &p));
  tu_ok(clpar_sum(p, &loss));
  tu_ok(clpar_backward(loss));
  float *gv = tu_read(clpar_tensor_grad(x)), *wv = tu_read(w);
  tu_assert_close(gv, wv, 120, 0, 0, "gradient through flatten");
  free(xv);
  free(fv);
  free(gv);
  free(wv);
  clpar_scope_end(sc);
}

static clpar_status fill_from(const void *src, void *dst, size_t bytes) {
  memcpy(dst, src, bytes);
  return CLPAR_OK;
}

/* I32 and I64 tensors through a safetensors file: the entries a checkpoint makes of int
 * tensors (clpar_st_dtype_of, clpar_st_tensor_fill) read back byte for byte. */
static void test_safetensors_int(void **state) {
  (void)state;
  char path[] = "/tmp/clpar_test_dtype_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  int64_t s64[] = {N64}, s32[] = {2, 3};
  clpar_tensor *a, *b;
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 1, s64, vals64, &a));
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, s32, vals32, &b));
  assert_int_equal(clpar_st_dtype_of(CLPAR_INT64), CLPAR_ST_I64);
  assert_int_equal(clpar_st_dtype_of(CLPAR_INT32), CLPAR_ST_I32);
  assert_int_equal(clpar_st_dtype_of(CLPAR_FLOAT32), CLPAR_ST_F32);
  clpar_st_entry e[2] = {
      {"bn.num_batches_tracked", clpar_st_dtype_of(CLPAR_INT64), 1, s64, NULL, clpar_st_tensor_fill,
       a},
      {"labels", clpar_st_dtype_of(CLPAR_INT32), 2, s32, NULL, clpar_st_tensor_fill, b}};
  tu_ok(clpar_st_write(path, e, 2, NULL, NULL, 0));
  clpar_st_file f;
  tu_ok(clpar_st_read(path, &f));
  int i64 = clpar_st_find(&f, "bn.num_batches_tracked"), i32 = clpar_st_find(&f, "labels");
  assert_true(i64 >= 0 && i32 >= 0);
  assert_int_equal(f.tensors[i64].dtype, CLPAR_ST_I64);
  assert_int_equal(f.tensors[i32].dtype, CLPAR_ST_I32);
  int64_t back[N64];
  int32_t back32[6];
  tu_ok(clpar_st_tensor_read(&f, i64, back));
  tu_ok(clpar_st_tensor_read(&f, i32, back32));
  assert_memory_equal(back, vals64, sizeof back);
  assert_memory_equal(back32, vals32, sizeof back32);
  /* and into a fresh tensor on the device */
  clpar_tensor *c;
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT64, 1, s64, &c));
  tu_ok(clpar_tensor_write_raw(c, back, sizeof back));
  expect_i64(c, vals64, N64, "loaded");
  clpar_st_free(&f);
  clpar_scope_end(sc);
  unlink(path);
}

/* Loading an I64 entry into a float parameter is a mismatch naming the name and both dtypes,
 * and changes nothing. */
static void test_safetensors_dtype_mismatch(void **state) {
  (void)state;
  char path[] = "/tmp/clpar_test_dtype_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  clpar_module *lin;
  tu_ok(clpar_linear_create(3, 2, 1, clpar_device_get(0), &lin));
  clpar_tensor *w = clpar_module_parameter(lin, "weight");
  float before[6], after[6];
  tu_ok(clpar_tensor_read(w, before, 6));
  int64_t wshape[] = {2, 3}, bshape[] = {2};
  int64_t wdata[6] = {1, 2, 3, 4, 5, 6};
  float bdata[2] = {0.5f, -0.5f};
  clpar_st_entry e[2] = {{"weight", CLPAR_ST_I64, 2, wshape, NULL, fill_from, wdata},
                         {"bias", CLPAR_ST_F32, 1, bshape, NULL, fill_from, bdata}};
  tu_ok(clpar_st_write(path, e, 2, NULL, NULL, 0));
  clpar_status s = clpar_safetensors_load(lin, path, 1, NULL);
  assert_int_equal(s, CLPAR_ERROR_SHAPE_MISMATCH);
  const char *msg = clpar_last_error();
  if (!strstr(msg, "weight (I64 [2, 3] in the file, F32 [2, 3] in the module)"))
    fail_msg("the error does not name the entry and both dtypes: %s", msg);
  tu_ok(clpar_tensor_read(w, after, 6));
  assert_memory_equal(before, after, sizeof before);
  clpar_module_free(lin);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_names_and_sizes),
      cmocka_unit_test(test_int_roundtrip_every_device),
      cmocka_unit_test(test_int_transfers),
      cmocka_unit_test(test_int_views),
      cmocka_unit_test(test_int_scope_and_retain),
      cmocka_unit_test(test_float_ops_refuse_int),
      cmocka_unit_test(test_reshape_infer_and_flatten),
      cmocka_unit_test(test_safetensors_int),
      cmocka_unit_test(test_safetensors_dtype_mismatch),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
