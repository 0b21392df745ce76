/* test_half.c — bfloat16 and float16: the scalar conversions against a reference written here
 * from the definition (the nearest half by search over every finite half, ties to the even
 * pattern, past the largest finite to Inf), every 16-bit pattern round-tripped; the tensors
 * on every selected device and the host (created, read and written in floats and raw,
 * converted on the device bit for bit as the host converts, moved between devices, viewed,
 * zero-filled, saved to safetensors as BF16 and F16); and clpar_to_dtype's gradient. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "io/safetensors.h"
#include "test_util.h"

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- the reference: values of halves from the format's definition, in double ---- */

/* The value of a finite 16-bit pattern with ebits exponent and mbits mantissa bits. */
static double half_value(uint16_t h, int ebits, int mbits) {
  int bias = (1 << (ebits - 1)) - 1;
  int e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
  double v = e == 0 ? ldexp(m, 1 - bias - mbits) : ldexp(m + (1 << mbits), e - bias - mbits);
  return (h >> 15) ? -v : v;
}

typedef struct {
  int ebits, mbits;
  uint16_t inf;       /* the +Inf pattern */
  double vals[65536]; /* value of each non-negative finite pattern 0 .. inf - 1, then the
                       * value Inf stands for in rounding (the next step past the largest) */
} ref_fmt;

static ref_fmt *ref_make(int ebits, int mbits) {
  ref_fmt *r = malloc(sizeof *r);
  assert_non_null(r);
  r->ebits = ebits, r->mbits = mbits;
  r->inf = (uint16_t)(((1 << ebits) - 1) << mbits);
  for (unsigned h = 0; h < r->inf; h++) r->vals[h] = half_value((uint16_t)h, ebits, mbits);
  int bias = (1 << (ebits - 1)) - 1;
  r->vals[r->inf] = ldexp(1.0, (1 << ebits) - 1 - bias); /* 2^(emax + 1) */
  return r;
}

/* The nearest half to f: largest j with vals[j] <= |f| by binary search, then j or j + 1
 * by distance, a tie to the even pattern; j + 1 == inf is Inf. */
static uint16_t ref_round(const ref_fmt *r, float f) {
  double a = fabs((double)f);
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  if (isinf(f) || a >= r->vals[r->inf]) return sign | r->inf;
  unsigned lo = 0, hi = r->inf; /* vals[lo] <= a < vals[hi] */
  while (hi - lo > 1) {
    unsigned mid = (lo + hi) / 2;
    if (r->vals[mid] <= a)
      lo = mid;
    else
      hi = mid;
  }
  double dl = a - r->vals[lo], dh = r->vals[hi] - a;
  unsigned pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return (uint16_t)(sign | pick);
}

static int is_nan16(uint16_t h, const ref_fmt *r) {
  return (h & 0x7fff) > r->inf;
}

static int is_quiet_nan16(uint16_t h, const ref_fmt *r) {
  return is_nan16(h, r) && (h & (1u << (r->mbits - 1)));
}

/* Floats to test rounding on: a stride through every pattern, every half's neighbourhood
 * (the half itself, the midpoints to its neighbours, the floats either side of them). */
static float *test_floats(const ref_fmt *r, size_t *n) {
  size_t cap = 8 * 65536 + (1u << 22) + 16, k = 0;
  float *f = malloc(cap * sizeof *f);
  assert_non_null(f);
  for (uint64_t u = 0; u < (1ull << 32); u += 1031) f[k++] = bitsf((uint32_t)u);
  for (unsigned h = 0; h < r->inf; h++) {
    float v = (float)r->vals[h], mid = (float)((r->vals[h] + r->vals[h + 1]) / 2);
    assert_true((double)mid == (r->vals[h] + r->vals[h + 1]) / 2); /* exact in float */
    f[k++] = v, f[k++] = -v, f[k++] = mid, f[k++] = -mid;
    f[k++] = nextafterf(mid, 0.0f), f[k++] = nextafterf(mid, INFINITY);
  }
  const float extra[] = {INFINITY,
                         -INFINITY,
                         NAN,
                         -NAN,
                         bitsf(0x7f800001u),
                         bitsf(0xffc12345u),
                         bitsf(1u),
                         bitsf(0x807fffffu),
                         FLT_MAX,
                         -FLT_MAX,
                         65504.0f,
                         65519.99f,
                         65520.0f,
                         1e-8f,
                         -0.0f,
                         0.0f};
  for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) f[k++] = extra[i];
  assert_true(k <= cap);
  *n = k;
  return f;
}

typedef uint16_t (*to_fn)(float);
typedef float (*from_fn)(uint16_t);

/* The library's float -> half against the reference on every test float. */
static void check_rounding(const ref_fmt *r, to_fn to, const char *what) {
  size_t n;
  float *f = test_floats(r, &n);
  for (size_t i = 0; i < n; i++) {
    uint16_t got = to(f[i]);
    if (isnan(f[i])) {
      if (!is_quiet_nan16(got, r) || (got >> 15) != (fbits(f[i]) >> 31))
        fail_msg("%s: NaN 0x%08x gave 0x%04x, not a quiet NaN of its sign", what, fbits(f[i]), got);
      continue;
    }
    uint16_t want = ref_round(r, f[i]);
    if (got != want)
      fail_msg("%s: %.9g (0x%08x) gave 0x%04x, want 0x%04x", what, (double)f[i], fbits(f[i]), got,
               want);
  }
  free(f);
}

/* Every pattern: half -> float exact (the reference's value), back to the same pattern; a NaN
 * stays a NaN. */
static void check_patterns(const ref_fmt *r, to_fn to, from_fn from, const char *what) {
  for (unsigned h = 0; h < 65536; h++) {
    float f = from((uint16_t)h);
    uint16_t back = to(f);
    if (is_nan16((uint16_t)h, r)) {
      if (!isnan(f) || !is_nan16(back, r))
        fail_msg("%s: NaN 0x%04x gave %g and back 0x%04x", what, h, (double)f, back);
      continue;
    }
    unsigned mag = h & 0x7fff;
    double want = mag == r->inf ? INFINITY : r->vals[mag];
    if ((h & 0x8000) ? (double)f != -want : (double)f != want)
      fail_msg("%s: 0x%04x gave %.9g, want %.9g", what, h, (double)f, (h & 0x8000) ? -want : want);
    if (back != h) fail_msg("%s: 0x%04x -> %.9g -> 0x%04x", what, h, (double)f, back);
  }
}

static void test_scalar_bf16(void **state) {
  (void)state;
  ref_fmt *r = ref_make(8, 7);
  check_patterns(r, clpar_float_to_bf16, clpar_bf16_to_float, "bf16");
  check_rounding(r, clpar_float_to_bf16, "float -> bf16");
  free(r);
}

static void test_scalar_fp16(void **state) {
  (void)state;
  ref_fmt *r = ref_make(5, 10);
  check_patterns(r, clpar_float_to_fp16, clpar_fp16_to_float, "fp16");
  check_rounding(r, clpar_float_to_fp16, "float -> fp16");
  /* the values the rules name */
  assert_int_equal(clpar_float_to_fp16(65519.0f), 0x7bff);    /* below the tie: largest */
  assert_int_equal(clpar_float_to_fp16(65520.0f), 0x7c00);    /* the tie: to Inf (even) */
  assert_int_equal(clpar_float_to_fp16(0x1p-25f), 0x0000);    /* tie: to 0 (even) */
  assert_int_equal(clpar_float_to_fp16(0x1.8p-24f), 0x0002);  /* tie 1.5: to 2 (even) */
  assert_int_equal(clpar_float_to_bf16(1.00390625f), 0x3f80); /* 1 + 2^-8: tie, to 1 */
  assert_int_equal(clpar_float_to_bf16(1.01171875f), 0x3f82); /* 1 + 3 2^-8: tie, to even */
  free(r);
}

static void test_names_and_sizes(void **state) {
  (void)state;
  assert_int_equal(clpar_dtype_size(CLPAR_BFLOAT16), 2);
  assert_int_equal(clpar_dtype_size(CLPAR_FLOAT16), 2);
  assert_string_equal(clpar_dtype_name(CLPAR_BFLOAT16), "bfloat16");
  assert_string_equal(clpar_dtype_name(CLPAR_FLOAT16), "float16");
  int64_t shape[] = {3};
  clpar_tensor *t = NULL;
  tu_ok(clpar_tensor_zeros_dtype(tu_host(), CLPAR_BFLOAT16, 1, shape, &t));
  clpar_tensor *y = NULL;
  assert_int_equal(clpar_relu(t, &y), CLPAR_ERROR_DTYPE); /* math ops refuse, naming it */
  assert_non_null(strstr(clpar_last_error(), "bfloat16"));
  assert_null(y);
  float f[3];
  assert_int_equal(clpar_tensor_read(t, f, 3), CLPAR_ERROR_DTYPE);
  tu_ok(clpar_tensor_read_floats(t, f, 3));
  assert_true(f[0] == 0.0f && f[1] == 0.0f && f[2] == 0.0f);
  assert_int_equal(clpar_tensor_read_floats(t, f, 2), CLPAR_ERROR_BUFFER_TOO_SMALL);
  assert_int_equal(clpar_to_dtype(t, CLPAR_INT32, &y), CLPAR_ERROR_DTYPE);
  assert_int_equal(clpar_to_dtype(t, (clpar_dtype)9, &y), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_tensor_free(t);
}

/* Every 16-bit pattern as a tensor on dev, converted there to float32 and back. */
static void device_patterns(clpar_device *dev, clpar_dtype dt, const ref_fmt *r) {
  from_fn from = dt == CLPAR_BFLOAT16 ? clpar_bf16_to_float : clpar_fp16_to_float;
  clpar_scope *sc = clpar_scope_begin();
  uint16_t *pat = malloc(65536 * sizeof *pat), *back = malloc(65536 * sizeof *back);
  float *f = malloc(65536 * sizeof *f);
  for (unsigned h = 0; h < 65536; h++) pat[h] = (uint16_t)h;
  int64_t shape[] = {256, 256};
  clpar_tensor *t, *tf, *t2;
  tu_ok(clpar_tensor_from_host_dtype(dev, dt, 2, shape, pat, &t));
  tu_ok(clpar_to_dtype(t, CLPAR_FLOAT32, &tf));
  assert_int_equal(clpar_tensor_dtype(tf), CLPAR_FLOAT32);
  tu_ok(clpar_tensor_read(tf, f, 65536));
  tu_ok(clpar_to_dtype(tf, dt, &t2));
  tu_ok(clpar_tensor_read_raw(t2, back, 65536 * sizeof *back));
  for (unsigned h = 0; h < 65536; h++) {
    float want = from((uint16_t)h);
    if (is_nan16((uint16_t)h, r)) {
      if (!isnan(f[h]) || !is_nan16(back[h], r))
        fail_msg("%s %s: NaN 0x%04x gave %g, back 0x%04x", clpar_device_id(dev),
                 clpar_dtype_name(dt), h, (double)f[h], back[h]);
    } else if (fbits(f[h]) != fbits(want) || back[h] != h) {
      fail_msg("%s %s: 0x%04x gave 0x%08x (want 0x%08x), back 0x%04x", clpar_device_id(dev),
               clpar_dtype_name(dt), h, fbits(f[h]), fbits(want), back[h]);
    }
  }
  free(pat), free(back), free(f);
  clpar_scope_end(sc);
}

/* The test floats converted on dev: the host's scalar function's bits (NaN: a quiet NaN). */
static void device_rounding(clpar_device *dev, clpar_dtype dt, const ref_fmt *r) {
  to_fn to = dt == CLPAR_BFLOAT16 ? clpar_float_to_bf16 : clpar_float_to_fp16;
  size_t n;
  float *f = test_floats(r, &n);
  uint16_t *got = malloc(n * sizeof *got);
  clpar_scope *sc = clpar_scope_begin();
  int64_t shape[] = {(int64_t)n};
  clpar_tensor *t, *h;
  tu_ok(clpar_tensor_from_host(dev, 1, shape, f, &t));
  tu_ok(clpar_to_dtype(t, dt, &h));
  assert_int_equal(clpar_tensor_dtype(h), dt);
  tu_ok(clpar_tensor_read_raw(h, got, n * sizeof *got));
  for (size_t i = 0; i < n; i++) {
    int ok = isnan(f[i]) ? is_quiet_nan16(got[i], r) && (got[i] >> 15) == (fbits(f[i]) >> 31)
                         : got[i] == to(f[i]);
    if (!ok)
      fail_msg("%s %s: %.9g (0x%08x) gave 0x%04x, the host 0x%04x", clpar_device_id(dev),
               clpar_dtype_name(dt), (double)f[i], fbits(f[i]), got[i], to(f[i]));
  }
  clpar_scope_end(sc);
  free(f), free(got);
}

static void test_device_conversions(void **state) {
  (void)state;
  ref_fmt *rb = ref_make(8, 7), *rh = ref_make(5, 10);
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    device_patterns(dev, CLPAR_BFLOAT16, rb);
    device_patterns(dev, CLPAR_FLOAT16, rh);
    device_rounding(dev, CLPAR_BFLOAT16, rb);
    device_rounding(dev, CLPAR_FLOAT16, rh);
  }
  free(rb), free(rh);
}

/* Odd sizes between devices; floats in and out; views at even elements only; a zero fill of
 * a view of odd size leaves its neighbour alone. */
static void test_tensors_every_device(void **state) {
  (void)state;
  const float vals[5] = {1.0f, -2.5f, 3.140625f, 65504.0f, 1e-7f};
  clpar_device *second = tu_second_device(tu_host());
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    for (int k = 0; k < 2; k++) {
      clpar_dtype dt = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      to_fn to = k ? clpar_float_to_fp16 : clpar_float_to_bf16;
      clpar_scope *sc = clpar_scope_begin();
      int64_t shape[] = {5};
      clpar_tensor *t, *moved, *back;
      tu_ok(clpar_tensor_from_floats(dev, dt, 1, shape, vals, &t));
      uint16_t raw[5], want[5];
      for (int i = 0; i < 5; i++) want[i] = to(vals[i]);
      tu_ok(clpar_tensor_read_raw(t, raw, sizeof raw));
      assert_memory_equal(raw, want, sizeof raw);
      clpar_device *other = second && second != dev ? second : tu_host();
      tu_ok(clpar_tensor_to(t, other, &moved));
      tu_ok(clpar_tensor_to(moved, dev, &back));
      memset(raw, 0, sizeof raw);
      tu_ok(clpar_tensor_read_raw(back, raw, sizeof raw));
      assert_memory_equal(raw, want, sizeof raw);
      float f[5];
      tu_ok(clpar_tensor_read_floats(moved, f, 5));
      for (int i = 0; i < 5; i++)
        assert_true(fbits(f[i]) ==
                    fbits(k ? clpar_fp16_to_float(want[i]) : clpar_bf16_to_float(want[i])));
      /* rows of 1 element: row 1 starts at an odd element */
      clpar_tensor *v;
      assert_int_equal(clpar_tensor_rows(t, 1, 2, &v), CLPAR_ERROR_INVALID_ARGUMENT);
      assert_non_null(strstr(clpar_last_error(), clpar_dtype_name(dt)));
      tu_ok(clpar_tensor_rows(t, 2, 1, &v)); /* element 2 alone, its word shared with 3 */
      tu_ok(clpar_fill(v, 0.0f));
      tu_ok(clpar_tensor_read_raw(t, raw, sizeof raw));
      want[2] = 0;
      assert_memory_equal(raw, want, sizeof raw);
      const float nv[1] = {0.5f};
      tu_ok(clpar_tensor_write_floats(v, nv, 1));
      tu_ok(clpar_tensor_read_raw(t, raw, sizeof raw));
      want[2] = to(0.5f);
      assert_memory_equal(raw, want, sizeof raw);
      clpar_scope_end(sc);
    }
  }
}

/* BF16 and F16 entries of a safetensors file, byte for byte. */
static void test_safetensors_half(void **state) {
  (void)state;
  char path[] = "/tmp/clpar_test_half_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  const float vals[3] = {1.5f, -0.333333f, 1e4f};
  int64_t shape[] = {3};
  clpar_tensor *a, *b;
  tu_ok(clpar_tensor_from_floats(dev, CLPAR_BFLOAT16, 1, shape, vals, &a));
  tu_ok(clpar_tensor_from_floats(dev, CLPAR_FLOAT16, 1, shape, vals, &b));
  assert_int_equal(clpar_st_dtype_of(CLPAR_BFLOAT16), CLPAR_ST_BF16);
  assert_int_equal(clpar_st_dtype_of(CLPAR_FLOAT16), CLPAR_ST_F16);
  clpar_st_entry e[2] = {
      {"a", clpar_st_dtype_of(CLPAR_BFLOAT16), 1, shape, NULL, clpar_st_tensor_fill, a},
      {"b", clpar_st_dtype_of(CLPAR_FLOAT16), 1, shape, NULL, clpar_st_tensor_fill, b}};
  tu_ok(clpar_st_write(path, e, 2, NULL, NULL, 0));
  clpar_st_file f;
  tu_ok(clpar_st_read(path, &f));
  int ia = clpar_st_find(&f, "a"), ib = clpar_st_find(&f, "b");
  assert_true(ia >= 0 && ib >= 0);
  assert_string_equal(clpar_st_dtype_name(f.tensors[ia].dtype), "BF16");
  assert_string_equal(clpar_st_dtype_name(f.tensors[ib].dtype), "F16");
  uint16_t got[3];
  tu_ok(clpar_st_tensor_read(&f, ia, got));
  for (int i = 0; i < 3; i++) assert_int_equal(got[i], clpar_float_to_bf16(vals[i]));
  tu_ok(clpar_st_tensor_read(&f, ib, got));
  for (int i = 0; i < 3; i++) assert_int_equal(got[i], clpar_float_to_fp16(vals[i]));
  clpar_st_free(&f);
  clpar_scope_end(sc);
  unlink(path);
}

/* d/dx of sum(w * float(half(x))): the gradient w, rounded to the half type on its way back
 * through the cast (torch: x.to(bf16).float() gives w.to(bf16).float()). */
static void test_cast_gradient(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    for (int k = 0; k < 2; k++) {
      clpar_dtype dt = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      clpar_scope *sc = clpar_scope_begin();
      int64_t shape[] = {4, 6};
      clpar_tensor *x = tu_make(dev, 2, shape, 1), *w = tu_make(dev, 2, shape, 2);
      tu_ok(clpar_tensor_set_requires_grad(x, 1));
      clpar_tensor *h, *f, *p, *loss, *same;
      tu_ok(clpar_to_dtype(x, dt, &h));
      tu_ok(clpar_to_dtype(h, dt, &same)); /* a view, with its node */
      tu_ok(clpar_to_dtype(same, CLPAR_FLOAT32, &f));
      tu_ok(clpar_mul(f, w, &p));
      tu_ok(clpar_sum(p, &loss));
      tu_ok(clpar_backward(loss));
      float *g = tu_read(clpar_tensor_grad(x)), *wv = tu_read(w);
      for (int i = 0; i < 24; i++) {
        float want = k ? clpar_fp16_to_float(clpar_float_to_fp16(wv[i]))
                       : clpar_bf16_to_float(clpar_float_to_bf16(wv[i]));
        if (fbits(g[i]) != fbits(want))
          fail_msg("%s %s: grad[%d] = %.9g, want %.9g", clpar_device_id(dev), clpar_dtype_name(dt),
                   i, (double)g[i], (double)want);
      }
      free(g), free(wv);
      clpar_scope_end(sc);
    }
  }
}

/* The gradient through rows of a 16-bit tensor made inside the graph: two slices of
 * half(x) [4, 7] (rows 2-3 and 0-1: each starts at an even element), each weighted; d/dx is each
 * weight rounded to the half type in its rows (torch: x.to(bf16)[2:4].float() and so on). */
static void test_rows_gradient(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    for (int k = 0; k < 2; k++) {
      clpar_dtype dt = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      clpar_scope *sc = clpar_scope_begin();
      int64_t shape[] = {4, 7}, half_shape[] = {2, 7};
      clpar_tensor *x = tu_make(dev, 2, shape, 3), *w[2];
      w[0] = tu_make(dev, 2, half_shape, 4), w[1] = tu_make(dev, 2, half_shape, 5);
      tu_ok(clpar_tensor_set_requires_grad(x, 1));
      clpar_tensor *h, *loss = NULL;
      tu_ok(clpar_to_dtype(x, dt, &h));
      for (int j = 0; j < 2; j++) {
        clpar_tensor *v, *f, *p, *part, *sum;
        tu_ok(clpar_tensor_rows(h, j ? 0 : 2, 2, &v));
        tu_ok(clpar_to_dtype(v, CLPAR_FLOAT32, &f));
        tu_ok(clpar_mul(f, w[j], &p));
        tu_ok(clpar_sum(p, &part));
        if (loss) tu_ok(clpar_add(loss, part, &sum));
        loss = loss ? sum : part;
      }
      tu_ok(clpar_backward(loss));
      float *g = tu_read(clpar_tensor_grad(x)), *wv[2] = {tu_read(w[0]), tu_read(w[1])};
      for (int i = 0; i < 28; i++) {
        float wi = i < 14 ? wv[1][i] : wv[0][i - 14];
        float want = k ? clpar_fp16_to_float(clpar_float_to_fp16(wi))
                       : clpar_bf16_to_float(clpar_float_to_bf16(wi));
        if (fbits(g[i]) != fbits(want))
          fail_msg("%s %s: grad[%d] = %.9g, want %.9g", clpar_device_id(dev), clpar_dtype_name(dt),
                   i, (double)g[i], (double)want);
      }
      free(g), free(wv[0]), free(wv[1]);
      clpar_scope_end(sc);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scalar_bf16),          cmocka_unit_test(test_scalar_fp16),
      cmocka_unit_test(test_names_and_sizes),      cmocka_unit_test(test_device_conversions),
      cmocka_unit_test(test_tensors_every_device), cmocka_unit_test(test_safetensors_half),
      cmocka_unit_test(test_cast_gradient),        cmocka_unit_test(test_rows_gradient),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
