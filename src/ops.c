/* ops.c — the public ops: check every argument (shapes, devices, emptiness), allocate the
 * result, and hand the work to the device's backend. Nothing is allocated or changed when a
 * check fails, and nothing here waits for the device. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

/* Any dtype: the ops that only move memory (fill with zero, concat, split). */
static clpar_status check_any(const char *fn, const char *name, const clpar_tensor *t) {
  if (!t) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
  return clpar_check_alive(fn, t);
}

/* The math ops: float32 only. */
static clpar_status check_tensor(const char *fn, const char *name, const clpar_tensor *t) {
  clpar_status s = check_any(fn, name, t);
  return s == CLPAR_OK ? clpar_check_float(fn, name, t) : s;
}

static clpar_status check_same_device(const char *fn, const clpar_tensor *a,
                                      const clpar_tensor *b) {
  if (a->storage->dev == b->storage->dev) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH,
                         "%s: inputs are on %s and %s; move one with clpar_tensor_to", fn,
                         a->storage->dev->bd.info.id, b->storage->dev->bd.info.id);
}

/* Wraps a backend status: on failure, prefix the device id and free the half-made result. */
static clpar_status finish_op(clpar_device *dev, clpar_status s, clpar_tensor *result,
                              clpar_tensor **out) {
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(result);
    return s;
  }
  if (out) *out = result;
  return CLPAR_OK;
}

clpar_status clpar_fill(clpar_tensor *t, float value) {
  clpar_status s = check_any("clpar_fill", "t", t);
  if (s == CLPAR_OK && t->dtype != CLPAR_FLOAT32 && value != 0.0f) {
    clpar_check_float("clpar_fill", "t", t);
    clpar_append_error(" (a tensor of this dtype can be filled with 0 only, not %g)",
                       (double)value);
    s = CLPAR_ERROR_DTYPE;
  }
  if (s != CLPAR_OK) return s;
  clpar_device *dev = t->storage->dev;
  /* an int tensor: +0.0f's zero bits over its words; a 16-bit one of odd numel stops at its
   * last whole word, and its last element is zeroed alone (the word's other half is not its) */
  size_t words = clpar_tensor_bytes(t) / CLPAR_WORD_BYTES;
  s = words ? clpar_dev_fill(dev, clpar_tensor_bref(t), words,
                             t->dtype == CLPAR_FLOAT32 ? value : 0.0f)
            : CLPAR_OK;
  if (s == CLPAR_OK && clpar_tensor_bytes(t) % CLPAR_WORD_BYTES) {
    static const uint16_t zero16 = 0;
    s = clpar_upload(dev, t->storage->buf, (t->offset + words) * CLPAR_WORD_BYTES, &zero16, 2);
  }
  clpar_tensor_touch(t);
  return s == CLPAR_OK ? s : clpar_device_fail(dev, s);
}

/* g summed down to the shape of like: like is g's shape, or one row that was broadcast. */
static clpar_status reduce_to(clpar_tensor *g, const clpar_tensor *like, clpar_tensor **out) {
  if (like->numel == g->numel) return clpar_tensor_reshape(g, like->ndim, like->shape, out);
  int64_t cols = like->numel, shape2[2] = {g->numel / cols, cols};
  clpar_tensor *g2, *sum;
  clpar_status s = clpar_tensor_reshape(g, 2, shape2, &g2);
  if (s == CLPAR_OK) s = clpar_sum_rows(g2, &sum);
  clpar_tensor_free(g2);
  if (s == CLPAR_OK) {
    s = clpar_tensor_reshape(sum, like->ndim, like->shape, out);
    clpar_tensor_free(sum);
  }
  return s;
}

/* d(a / b): g / b for a; -(g / b) (a / b), summed to b's shape, for b. */
static clpar_status div_backward(clpar_tensor *a, clpar_tensor *b, clpar_tensor *g,
                                 clpar_tensor **gin) {
  clpar_tensor *gb = NULL, *q = NULL, *t = NULL, *nt = NULL;
  clpar_status s = clpar_div(g, b, &gb);
  if (s == CLPAR_OK && b->requires_grad) s = clpar_div(a, b, &q);
  if (s == CLPAR_OK && q) s = clpar_mul(gb, q, &t);
  if (s == CLPAR_OK && t) s = clpar_scale(t, -1.0f, &nt);
  if (s == CLPAR_OK && nt) s = reduce_to(nt, b, &gin[1]);
  if (s == CLPAR_OK && a->requires_grad) gin[0] = gb, gb = NULL;
  clpar_tensor_free(gb), clpar_tensor_free(q), clpar_tensor_free(t), clpar_tensor_free(nt);
  return s;
}

/* d(a op b): add passes g to both, sub negates b's, mul multiplies by the other input. */
static clpar_status binary_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_binary_kind kind = (clpar_binary_kind)n->iparam[0];
  clpar_tensor *a = n->inputs[0], *b = n->inputs[1], *t = NULL;
  clpar_status s = CLPAR_OK;
  if (kind == CLPAR_BINARY_DIV) return div_backward(a, b, g, gin);
  if (a->requires_grad)
    s = kind == CLPAR_BINARY_MUL ? clpar_mul(g, b, &gin[0]) : clpar_tensor_alias(g, &gin[0]);
  if (s != CLPAR_OK || !b->requires_grad) return s;
  if (kind == CLPAR_BINARY_ADD) return reduce_to(g, b, &gin[1]);
  s = kind == CLPAR_BINARY_SUB ? clpar_scale(g, -1.0f, &t) : clpar_mul(g, a, &t);
  if (s == CLPAR_OK) s = reduce_to(t, b, &gin[1]);
  clpar_tensor_free(t);
  return s;
}

/* b must have a's shape, or be a single row of a's last-dimension width. */
static clpar_status binary(const char *fn, clpar_binary_kind kind, const clpar_tensor *a,
                           const clpar_tensor *b, clpar_tensor **out) {
  if (a && b && out && clpar_check_alive(fn, a) == CLPAR_OK &&
      clpar_check_alive(fn, b) == CLPAR_OK &&
      (clpar_autocast_widens(a) || clpar_autocast_widens(b))) {
    static clpar_status (*const op[])(const clpar_tensor *, const clpar_tensor *,
                                      clpar_tensor **) = {[CLPAR_BINARY_ADD] = clpar_add,
                                                          [CLPAR_BINARY_SUB] = clpar_sub,
                                                          [CLPAR_BINARY_MUL] = clpar_mul,
                                                          [CLPAR_BINARY_DIV] = clpar_div};
    return clpar_autocast_binary(op[kind], a, b, out);
  }
  clpar_status s = check_tensor(fn, "a", a);
  if (s == CLPAR_OK) s = check_tensor(fn, "b", b);
  if (s == CLPAR_OK && !out)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  if (s == CLPAR_OK) s = check_same_device(fn, a, b);
  if (s != CLPAR_OK) return s;
  int64_t cols = a->shape[a->ndim - 1];
  int64_t rows = a->numel / cols;
  int same =
      a->ndim == b->ndim && memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0;
  int row = !same && b->numel == cols && b->shape[b->ndim - 1] == cols &&
            (b->ndim == 1 || b->shape[0] == 1);
  if (!same && !row) {
    char x[128], y[128];
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: a is %s and b is %s; b must have a's shape or be one row of %lld",
                           fn, SHAPE(a, x), SHAPE(b, y), (long long)cols);
  }
  clpar_device *dev = a->storage->dev;
  clpar_tensor *r;
  s = clpar_tensor_empty(dev, a->ndim, a->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_binary(dev, kind, (size_t)rows, (size_t)cols, clpar_tensor_bref(a),
                       clpar_tensor_bref(b), row ? 1 : (size_t)rows, clpar_tensor_bref(r));
  if (s != CLPAR_OK) return finish_op(dev, s, r, out);
  clpar_node *node;
  clpar_tensor *in[2] = {(clpar_tensor *)a, (clpar_tensor *)b};
  s = clpar_record_op(r, fn, binary_backward, in, 2, &node);
  if (node) node->iparam[0] = kind;
  return finish_op(dev, s, s == CLPAR_OK ? r : NULL, out);
}

clpar_status clpar_add(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out) {
  return binary("clpar_add", CLPAR_BINARY_ADD, a, b, out);
}

clpar_status clpar_sub(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out) {
  return binary("clpar_sub", CLPAR_BINARY_SUB, a, b, out);
}

clpar_status clpar_mul(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out) {
  return binary("clpar_mul", CLPAR_BINARY_MUL, a, b, out);
}

clpar_status clpar_div(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out) {
  return binary("clpar_div", CLPAR_BINARY_DIV, a, b, out);
}

static clpar_status scale_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  return clpar_scale(g, n->fparam[0], &gin[0]);
}

clpar_status clpar_scale(const clpar_tensor *a, float alpha, clpar_tensor **out) {
  clpar_status s = check_tensor("clpar_scale", "a", a);
  if (s == CLPAR_OK && !out)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_scale: out is NULL");
  if (s != CLPAR_OK) return s;
  clpar_device *dev = a->storage->dev;
  clpar_tensor *r;
  s = clpar_tensor_empty(dev, a->ndim, a->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_scale(dev, (size_t)a->numel, alpha, clpar_tensor_bref(a), clpar_tensor_bref(r));
  if (s != CLPAR_OK) return finish_op(dev, s, r, out);
  clpar_node *node;
  s = clpar_record_op(r, "clpar_scale", scale_backward, (clpar_tensor **)&a, 1, &node);
  if (node) node->fparam[0] = alpha;
  return finish_op(dev, s, s == CLPAR_OK ? r : NULL, out);
}

/* Checks a GEMM's operands: 2-D, one device, inner dimensions equal; gives m, n, k. */
static clpar_status gemm_dims(const char *fn, const clpar_tensor *a, const clpar_tensor *b, int ta,
                              int tb, int64_t *m, int64_t *n, int64_t *k) {
  clpar_status s = check_tensor(fn, "a", a);
  if (s == CLPAR_OK) s = check_tensor(fn, "b", b);
  if (s != CLPAR_OK) return s;
  char x[128], y[128];
  if (a->ndim != 2 || b->ndim != 2)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s: a is %s and b is %s; both must be 2-D",
                           fn, SHAPE(a, x), SHAPE(b, y));
  s = check_same_device(fn, a, b);
  if (s != CLPAR_OK) return s;
  *m = ta ? a->shape[1] : a->shape[0];
  *k = ta ? a->shape[0] : a->shape[1];
  int64_t kb = tb ? b->shape[1] : b->shape[0];
  *n = tb ? b->shape[0] : b->shape[1];
  if (*k != kb)
    return clpar_set_error(
        CLPAR_ERROR_SHAPE_MISMATCH,
        "%s: op(a) is [%lld, %lld] and op(b) is [%lld, %lld]; the inner sizes differ", fn,
        (long long)*m, (long long)*k, (long long)kb, (long long)*n);
  return CLPAR_OK;
}

static clpar_status run_gemm(clpar_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k,
                             float alpha, const clpar_tensor *a, const clpar_tensor *b, float beta,
                             clpar_tensor *c) {
  return clpar_dev_gemm(dev, ta != 0, tb != 0, (size_t)m, (size_t)n, (size_t)k, alpha,
                        clpar_tensor_bref(a), (size_t)a->shape[1], clpar_tensor_bref(b),
                        (size_t)b->shape[1], beta, clpar_tensor_bref(c), (size_t)n);
}

/* C = op(A) op(B): dA = g op(B)^T (laid out as A is), dB = op(A)^T g (laid out as B is). */
static clpar_status matmul_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *a = n->inputs[0], *b = n->inputs[1];
  int ta = (int)n->iparam[0], tb = (int)n->iparam[1];
  clpar_status s = CLPAR_OK;
  if (a->requires_grad)
    s = ta ? clpar_matmul(b, g, tb, 1, &gin[0]) : clpar_matmul(g, b, 0, !tb, &gin[0]);
  if (s == CLPAR_OK && b->requires_grad)
    s = tb ? clpar_matmul(g, a, 1, ta, &gin[1]) : clpar_matmul(a, g, !ta, 0, &gin[1]);
  return s;
}

clpar_status clpar_matmul(const clpar_tensor *a, const clpar_tensor *b, int trans_a, int trans_b,
                          clpar_tensor **out) {
  if (a && b && out && clpar_autocast_dtype() != CLPAR_FLOAT32)
    return clpar_autocast_matmul(a, b, trans_a, trans_b, out);
  int64_t m, n, k;
  clpar_status s = gemm_dims("clpar_matmul", a, b, trans_a, trans_b, &m, &n, &k);
  if (s == CLPAR_OK && !out)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_matmul: out is NULL");
  if (s != CLPAR_OK) return s;
  clpar_device *dev = a->storage->dev;
  clpar_tensor *r;
  int64_t shape[2] = {m, n};
  s = clpar_tensor_empty(dev, 2, shape, &r);
  if (s != CLPAR_OK) return s;
  s = run_gemm(dev, trans_a, trans_b, m, n, k, 1.0f, a, b, 0.0f, r);
  if (s != CLPAR_OK) return finish_op(dev, s, r, out);
  clpar_node *node;
  clpar_tensor *in[2] = {(clpar_tensor *)a, (clpar_tensor *)b};
  s = clpar_record_op(r, "clpar_matmul", matmul_backward, in, 2, &node);
  if (node) {
    node->iparam[0] = trans_a != 0;
    node->iparam[1] = trans_b != 0;
  }
  return finish_op(dev, s, s == CLPAR_OK ? r : NULL, out);
}

/* True when the elements of x and y share memory (views of one storage that overlap). */
static int overlaps(const clpar_tensor *x, const clpar_tensor *y) {
  return x->storage == y->storage && x->offset < y->offset + (size_t)y->numel &&
         y->offset < x->offset + (size_t)x->numel;
}

clpar_status clpar_gemm(int trans_a, int trans_b, float alpha, const clpar_tensor *a,
                        const clpar_tensor *b, float beta, clpar_tensor *c) {
  int64_t m, n, k;
  clpar_status s = gemm_dims("clpar_gemm", a, b, trans_a, trans_b, &m, &n, &k);
  if (s == CLPAR_OK) s = check_tensor("clpar_gemm", "c", c);
  if (s == CLPAR_OK) s = check_same_device("clpar_gemm", a, c);
  if (s != CLPAR_OK) return s;
  if (c->ndim != 2 || c->shape[0] != m || c->shape[1] != n) {
    char x[128];
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "clpar_gemm: c is %s, op(a) @ op(b) is [%lld, %lld]", SHAPE(c, x),
                           (long long)m, (long long)n);
  }
  /* Backends read a and b while they write c (the host backend row by row, CLBlast through
   * temporaries), so memory shared between them would give a backend-dependent answer. */
  const char *alias = overlaps(c, a) ? "a" : overlaps(c, b) ? "b" : NULL;
  if (alias)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_gemm: c shares memory with %s; write the result into a tensor of "
                           "its own (clpar_matmul makes one)",
                           alias);
  clpar_device *dev = a->storage->dev;
  s = run_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  clpar_tensor_touch(c);
  return s == CLPAR_OK ? s : clpar_device_fail(dev, s);
}

/* Every row of the input receives g. */
static clpar_status sum_rows_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *a = n->inputs[0], *r;
  clpar_status s = clpar_tensor_empty(a->storage->dev, a->ndim, a->shape, &r);
  if (s != CLPAR_OK) return s;
  clpar_device *dev = a->storage->dev;
  s = clpar_dev_broadcast_rows(dev, (size_t)a->shape[0], (size_t)(a->numel / a->shape[0]),
                               clpar_tensor_bref(g), clpar_tensor_bref(r));
  return finish_op(dev, s, r, &gin[0]);
}

clpar_status clpar_sum_rows(const clpar_tensor *a, clpar_tensor **out) {
  clpar_status s = check_tensor("clpar_sum_rows", "a", a);
  if (s == CLPAR_OK && !out)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_sum_rows: out is NULL");
  if (s != CLPAR_OK) return s;
  int64_t rows = a->shape[0], cols = a->numel / rows;
  int64_t one = 1;
  int ndim = a->ndim > 1 ? a->ndim - 1 : 1;
  const int64_t *shape = a->ndim > 1 ? a->shape + 1 : &one;
  clpar_device *dev = a->storage->dev;
  clpar_tensor *r;
  s = clpar_tensor_empty(dev, ndim, shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_sum_rows(dev, (size_t)rows, (size_t)cols, clpar_tensor_bref(a),
                         clpar_tensor_bref(r));
  if (s != CLPAR_OK) return finish_op(dev, s, r, out);
  clpar_node *node;
  s = clpar_record_op(r, "clpar_sum_rows", sum_rows_backward, (clpar_tensor **)&a, 1, &node);
  return finish_op(dev, s, s == CLPAR_OK ? r : NULL, out);
}

/* Each part gets its rows of g (views, no copy). */
static clpar_status concat_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  int64_t start = 0;
  for (int i = 0; i < n->n_inputs; i++) {
    clpar_tensor *p = n->inputs[i];
    if (p->requires_grad) {
      clpar_status s = clpar_tensor_rows(g, start, p->shape[0], &gin[i]);
      if (s != CLPAR_OK) return s;
    }
    start += p->shape[0];
  }
  return CLPAR_OK;
}

clpar_status clpar_concat(clpar_tensor *const *parts, int n, clpar_tensor **out) {
  if (!parts || n < 1 || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_concat: need n >= 1 parts and an out pointer");
  int64_t rows = 0;
  for (int i = 0; i < n; i++) {
    clpar_status s = check_any("clpar_concat", "a part", parts[i]);
    if (s == CLPAR_OK) s = check_same_device("clpar_concat", parts[0], parts[i]);
    if (s != CLPAR_OK) return s;
    const clpar_tensor *p = parts[i], *q = parts[0];
    if (p->dtype != q->dtype)
      return clpar_set_error(CLPAR_ERROR_DTYPE, "clpar_concat: part 0 is %s and part %d is %s",
                             clpar_dtype_name(q->dtype), i, clpar_dtype_name(p->dtype));
    if (p->ndim != q->ndim ||
        memcmp(p->shape + 1, q->shape + 1, (size_t)(p->ndim - 1) * sizeof p->shape[0])) {
      char x[128], y[128];
      return clpar_set_error(
          CLPAR_ERROR_SHAPE_MISMATCH,
          "clpar_concat: part 0 is %s and part %d is %s; all but dim 0 must match", SHAPE(q, x), i,
          SHAPE(p, y));
    }
    if (__builtin_add_overflow(rows, p->shape[0], &rows))
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "clpar_concat: more than %lld rows in all",
                             (long long)INT64_MAX);
  }
  int64_t shape[CLPAR_MAX_DIMS];
  memcpy(shape, parts[0]->shape, sizeof shape);
  shape[0] = rows;
  clpar_device *dev = parts[0]->storage->dev;
  clpar_tensor *r;
  clpar_status s = clpar_tensor_empty_dtype(dev, parts[0]->dtype, parts[0]->ndim, shape, &r);
  size_t at = 0;
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    size_t bytes = clpar_tensor_bytes(parts[i]);
    s = clpar_dev_copy(dev, r->storage->buf, at, parts[i]->storage->buf,
                       parts[i]->offset * CLPAR_WORD_BYTES, bytes);
    at += bytes;
    if (s != CLPAR_OK) return finish_op(dev, s, r, NULL);
  }
  if (s != CLPAR_OK) return s;
  clpar_node *node;
  s = clpar_record_op(r, "clpar_concat", concat_backward, parts, n, &node);
  return finish_op(dev, s, s == CLPAR_OK ? r : NULL, out);
}

clpar_status clpar_split(clpar_tensor *t, const int64_t *sizes, int n, clpar_tensor **outs) {
  clpar_status s = check_any("clpar_split", "t", t);
  if (s != CLPAR_OK) return s;
  if (!sizes || !outs || n < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_split: need n >= 1 sizes and outputs");
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 1)
      return clpar_set_error(CLPAR_ERROR_EMPTY, "clpar_split: size %d is %lld; sizes must be >= 1",
                             i, (long long)sizes[i]);
    if (__builtin_add_overflow(total, sizes[i], &total))
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                             "clpar_split: the sizes add up to more than %lld rows",
                             (long long)INT64_MAX);
  }
  if (total != t->shape[0])
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "clpar_split: the sizes add up to %lld, the tensor has %lld rows",
                           (long long)total, (long long)t->shape[0]);
  int64_t start = 0;
  for (int i = 0; i < n; i++) {
    s = clpar_tensor_rows(t, start, sizes[i], &outs[i]);
    if (s != CLPAR_OK) {
      while (i-- > 0) clpar_tensor_free(outs[i]);
      return s;
    }
    start += sizes[i];
  }
  return CLPAR_OK;
}

int clpar_chunk_sizes(int64_t rows, int k, int64_t *sizes) {
  if (rows < 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY,
                           "clpar_chunk_sizes: %lld rows; a batch needs at least one row",
                           (long long)rows);
  if (k < 1 || !sizes)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_chunk_sizes: k is %d (must be >= 1) or sizes is NULL", k);
  int64_t chunk = rows / k + (rows % k != 0); /* ceil without rows + k - 1, which overflows */
  int n = 0;
  for (int64_t left = rows; left > 0; left -= chunk) sizes[n++] = left < chunk ? left : chunk;
  return n;
}

void clpar_weighted_sizes(int64_t rows, const float *weights, int n, int64_t *sizes) {
  double total = 0, frac[64];
  for (int i = 0; i < n; i++) total += weights[i];
  int64_t given = 0;
  for (int i = 0; i < n; i++) {
    double exact = (double)rows * weights[i] / total;
    int64_t left = rows - given; /* >= 0: the sizes never add up past rows */
    sizes[i] = exact >= (double)left ? left : (int64_t)exact;
    frac[i] = exact - (double)sizes[i];
    given += sizes[i];
  }
  for (int r = 0; r < n && given < rows; r++, given++) {
    int best = 0;
    for (int i = 1; i < n; i++) best = frac[i] > frac[best] ? i : best;
    sizes[best]++;
    frac[best] = -1;
  }
  if (given < rows) { /* only when doubles lost rows of a huge batch: the largest share */
    int best = 0;
    for (int i = 1; i < n; i++) best = weights[i] > weights[best] ? i : best;
    sizes[best] += rows - given;
  }
}
