/* half.c — bfloat16 and float16: the scalar conversions (the one C implementation, which the
 * host backend runs), host reads and writes in floats, and the differentiable cast
 * clpar_to_dtype over the backends' half_convert entry. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t clpar_float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  /* round to nearest, ties to even: add just under half an ulp, plus the lsb kept; a carry
   * into the exponent is the right rounding (up to Inf past the largest finite) */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float clpar_bf16_to_float(uint16_t h) {
  return bits_float((uint32_t)h << 16);
}

/* |f| below float16's smallest normal 2^-14: a multiple of 2^-24, rounded to even. */
static uint16_t fp16_subnormal(uint32_t a) {
  if (a <= 0x33000000u) return 0; /* up to 2^-25, the tie, rounds to 0 (even) */
  uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e; /* value / 2^-24 = m * 2^(e - 126); 14 <= shift <= 24 here */
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++; /* q 0x400: the smallest normal */
  return (uint16_t)q;
}

uint16_t clpar_float_to_fp16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x1ffu)); /* quiet NaN */
  if (a >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* 2^16 and up, Inf: Inf */
  if (a < 0x38800000u) return (uint16_t)(sign | fp16_subnormal(a));
  uint32_t r = a - 0x38000000u;   /* exponent rebiased from 127 to 15 */
  r += 0xfffu + ((r >> 13) & 1u); /* to nearest even; 65520 and up carry into Inf (0x7c00) */
  return (uint16_t)(sign | (r >> 13));
}

float clpar_fp16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13)); /* Inf, NaN */
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    e = 113; /* a subnormal m 2^-24, normalized */
    while (!(m & 0x400u)) m <<= 1, e--;
    return bits_float(sign | (e << 23) | ((m & 0x3ffu) << 13));
  }
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- host reads and writes in floats ---- */

static clpar_status check_floaty(const char *fn, const clpar_tensor *t) {
  if (t->dtype == CLPAR_FLOAT32 || clpar_dtype_is_half(t->dtype)) return CLPAR_OK;
  char buf[128];
  return clpar_set_error(CLPAR_ERROR_DTYPE,
                         "%s: the tensor is %s %s; it needs float32, bfloat16 or float16", fn,
                         clpar_dtype_name(t->dtype), clpar_tensor_shape_str(t, buf, sizeof buf));
}

static void to_half(clpar_dtype d, const float *src, uint16_t *dst, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = d == CLPAR_BFLOAT16 ? clpar_float_to_bf16(src[i]) : clpar_float_to_fp16(src[i]);
}

clpar_status clpar_tensor_read_floats(const clpar_tensor *t, float *dst, size_t dst_count) {
  const char *fn = "clpar_tensor_read_floats";
  if (!t || !dst) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  clpar_status s = clpar_check_alive(fn, t);
  if (s == CLPAR_OK) s = check_floaty(fn, t);
  if (s != CLPAR_OK) return s;
  if (t->dtype == CLPAR_FLOAT32) return clpar_tensor_read(t, dst, dst_count);
  size_t n = (size_t)t->numel;
  if (dst_count < n)
    return clpar_set_error(CLPAR_ERROR_BUFFER_TOO_SMALL,
                           "%s: the tensor has %zu elements, the buffer holds %zu", fn, n,
                           dst_count);
  uint16_t *h = malloc(n * sizeof *h);
  if (!h) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  s = clpar_tensor_read_raw(t, h, n * sizeof *h);
  for (size_t i = 0; s == CLPAR_OK && i < n; i++)
    dst[i] = t->dtype == CLPAR_BFLOAT16 ? clpar_bf16_to_float(h[i]) : clpar_fp16_to_float(h[i]);
  free(h);
  return s;
}

clpar_status clpar_tensor_write_floats(clpar_tensor *t, const float *src, size_t src_count) {
  const char *fn = "clpar_tensor_write_floats";
  if (!t || !src) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  clpar_status s = clpar_check_alive(fn, t);
  if (s == CLPAR_OK) s = check_floaty(fn, t);
  if (s != CLPAR_OK) return s;
  if (t->dtype == CLPAR_FLOAT32) return clpar_tensor_write(t, src, src_count);
  size_t n = (size_t)t->numel;
  if (src_count < n)
    return clpar_set_error(CLPAR_ERROR_BUFFER_TOO_SMALL,
                           "%s: the tensor has %zu elements, the buffer holds %zu", fn, n,
                           src_count);
  uint16_t *h = malloc(n * sizeof *h);
  if (!h) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  to_half(t->dtype, src, h, n);
  s = clpar_tensor_write_raw(t, h, n * sizeof *h);
  free(h);
  return s;
}

clpar_status clpar_tensor_from_floats(clpar_device *dev, clpar_dtype dtype, int ndim,
                                      const int64_t *shape, const float *data, clpar_tensor **out) {
  const char *fn = "clpar_tensor_from_floats";
  if (dtype == CLPAR_FLOAT32) return clpar_tensor_from_host(dev, ndim, shape, data, out);
  if (!clpar_dtype_is_half(dtype))
    return clpar_set_error(CLPAR_ERROR_DTYPE,
                           "%s: dtype is %s; it must be float32, bfloat16 or "
                           "float16",
                           fn, clpar_dtype_name(dtype));
  if (!data || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL data or out", fn);
  int64_t numel;
  clpar_status s = clpar_check_shape(fn, ndim, shape, &numel);
  if (s != CLPAR_OK) return s;
  uint16_t *h = malloc((size_t)numel * sizeof *h);
  if (!h) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  to_half(dtype, data, h, (size_t)numel);
  s = clpar_tensor_from_host_dtype(dev, dtype, ndim, shape, h, out);
  free(h);
  return s;
}

/* ---- the differentiable cast ---- */

/* y = x converted on x's device; x and y one float32 and one 16-bit. */
static clpar_status convert(const clpar_tensor *x, clpar_dtype dtype, clpar_tensor **y) {
  clpar_device *dev = x->storage->dev;
  clpar_tensor *r;
  clpar_status s = clpar_tensor_empty_dtype(dev, dtype, x->ndim, x->shape, &r);
  if (s != CLPAR_OK) return s;
  int to = clpar_dtype_is_half(dtype);
  clpar_dtype half = to ? dtype : x->dtype;
  s = clpar_dev_half_convert(dev, to, half == CLPAR_BFLOAT16, (size_t)x->numel,
                             clpar_tensor_bref(x), clpar_tensor_bref(r));
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(r);
    return s;
  }
  *y = r;
  return CLPAR_OK;
}

/* The gradient goes back converted to the input's dtype. */
static clpar_status to_dtype_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  return clpar_to_dtype(g, n->inputs[0]->dtype, &gin[0]);
}

/* The conversion alone, without a node: through float32 between the two 16-bit types. */
clpar_status clpar_convert_dtype(const clpar_tensor *x, clpar_dtype dtype, clpar_tensor **y) {
  if (x->dtype == CLPAR_FLOAT32 || dtype == CLPAR_FLOAT32) return convert(x, dtype, y);
  clpar_tensor *f = NULL;
  clpar_status s = convert(x, CLPAR_FLOAT32, &f);
  if (s == CLPAR_OK) s = convert(f, dtype, y);
  clpar_tensor_free(f);
  return s;
}

clpar_status clpar_to_dtype(const clpar_tensor *x, clpar_dtype dtype, clpar_tensor **y) {
  const char *fn = "clpar_to_dtype";
  if (!x || !y) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  clpar_status s = clpar_check_alive(fn, x);
  if (s == CLPAR_OK) s = check_floaty(fn, x);
  if (s != CLPAR_OK) return s;
  if (dtype != CLPAR_FLOAT32 && !clpar_dtype_is_half(dtype))
    return clpar_set_error(
        clpar_dtype_size(dtype) ? CLPAR_ERROR_DTYPE : CLPAR_ERROR_INVALID_ARGUMENT,
        "%s: dtype is %s (%d); it must be float32, bfloat16 or float16", fn,
        clpar_dtype_name(dtype), (int)dtype);
  if (x->dtype == dtype) /* torch's x.to(x.dtype) is x: a view here, with its node */
    return clpar_tensor_reshape((clpar_tensor *)x, x->ndim, x->shape, y);
  clpar_tensor *r;
  s = clpar_convert_dtype(x, dtype, &r);
  if (s != CLPAR_OK) return s;
  clpar_node *node;
  return clpar_record_op_keep(r, fn, to_dtype_backward, (clpar_tensor **)&x, 1, NULL, NULL, 0,
                              &node, y);
}

/* Writes x (any float dtype) converted into out (of out's dtype, x's numel) on x's device. */
static clpar_status convert_into(const clpar_tensor *x, clpar_tensor *out) {
  clpar_device *dev = x->storage->dev;
  clpar_status s;
  if (x->dtype == out->dtype) {
    s = clpar_copy_elements(out, x);
  } else {
    int to = clpar_dtype_is_half(out->dtype);
    clpar_dtype half = to ? out->dtype : x->dtype;
    s = clpar_dev_half_convert(dev, to, half == CLPAR_BFLOAT16, (size_t)x->numel,
                               clpar_tensor_bref(x), clpar_tensor_bref(out));
    if (s != CLPAR_OK) clpar_device_fail(dev, s);
  }
  clpar_tensor_touch(out);
  return s;
}

clpar_status clpar_convert_into(const clpar_tensor *x, clpar_tensor *out) {
  if (x->dtype == out->dtype || x->dtype == CLPAR_FLOAT32 || out->dtype == CLPAR_FLOAT32)
    return convert_into(x, out);
  clpar_tensor *f = NULL; /* between the two 16-bit types: through float32 */
  clpar_status s = convert(x, CLPAR_FLOAT32, &f);
  if (s == CLPAR_OK) s = convert_into(f, out);
  clpar_tensor_free(f);
  return s;
}

clpar_status clpar_half_add_into(clpar_tensor *acc, const clpar_tensor *g) {
  clpar_tensor *a = NULL, *b = NULL;
  clpar_status s = clpar_convert_dtype(acc, CLPAR_FLOAT32, &a);
  if (s == CLPAR_OK) s = clpar_convert_dtype(g, CLPAR_FLOAT32, &b);
  if (s == CLPAR_OK) {
    clpar_device *dev = a->storage->dev;
    s = clpar_dev_binary(dev, CLPAR_BINARY_ADD, 1, (size_t)a->numel, clpar_tensor_bref(a),
                         clpar_tensor_bref(b), 1, clpar_tensor_bref(a));
    if (s != CLPAR_OK) clpar_device_fail(dev, s);
  }
  if (s == CLPAR_OK) s = clpar_convert_into(a, acc);
  clpar_tensor_free(a), clpar_tensor_free(b);
  return s;
}

clpar_status clpar_half_add(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out) {
  *out = NULL;
  clpar_tensor *a32 = NULL, *b32 = NULL;
  clpar_status s = clpar_convert_dtype(a, CLPAR_FLOAT32, &a32);
  if (s == CLPAR_OK) s = clpar_convert_dtype(b, CLPAR_FLOAT32, &b32);
  if (s == CLPAR_OK) {
    clpar_device *dev = a32->storage->dev;
    s = clpar_dev_binary(dev, CLPAR_BINARY_ADD, 1, (size_t)a32->numel, clpar_tensor_bref(a32),
                         clpar_tensor_bref(b32), 1, clpar_tensor_bref(a32));
    if (s != CLPAR_OK) clpar_device_fail(dev, s);
  }
  if (s == CLPAR_OK) s = clpar_convert_dtype(a32, a->dtype, out);
  if (s == CLPAR_OK) clpar_tensor_unscope(*out);
  clpar_tensor_free(a32), clpar_tensor_free(b32);
  return s;
}
