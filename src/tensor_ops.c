/* tensor_ops.c — the shape ops of transformers: permute and transpose, narrow, concatenation
 * and split along any dimension, batched matmul and the upper-triangle (causal) mask. Tensors
 * are contiguous, so an op is a view when its result's elements keep their order in memory
 * (a permute that only moves size-1 dimensions, a narrow whose leading dimensions are all 1),
 * and otherwise one strided_copy (backend.h) into a new tensor. Every op is differentiable. */
#include <math.h>
#include <string.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

static clpar_status check_in(const char *fn, const clpar_tensor *t, const void *out) {
  if (!t || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  return clpar_check_alive(fn, t);
}

/* dim (negative: from the end) of an ndim-dimensional tensor, or -1 with the error set. */
static int norm_dim(const char *fn, int dim, int ndim) {
  int d = dim < 0 ? dim + ndim : dim;
  if (d >= 0 && d < ndim) return d;
  clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: dim %d is outside -%d .. %d", fn, dim, ndim,
                  ndim - 1);
  return -1;
}

/* Row-major strides of shape, in elements. */
static void contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    stride[d] = s;
    s *= shape[d];
  }
}

/* One strided_copy of the elements of shape from src (strides is, element offset io) to dst
 * (os, oo); strides in elements of the tensors' dtype. Size-1 dimensions are dropped and
 * neighbours that are contiguous in both merged, so that the kernel loops over few. */
static clpar_status strided(const clpar_tensor *src, const clpar_tensor *dst, int ndim,
                            const int64_t *shape, const int64_t *is, size_t io, const int64_t *os,
                            size_t oo) {
  clpar_strided_geom g;
  memset(&g, 0, sizeof g);
  int n = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    if (n > 0 && g.in_stride[n - 1] == is[d] * shape[d] &&
        g.out_stride[n - 1] == os[d] * shape[d]) {
      g.shape[n - 1] *= shape[d];
      g.in_stride[n - 1] = is[d];
      g.out_stride[n - 1] = os[d];
      continue;
    }
    g.shape[n] = shape[d], g.in_stride[n] = is[d], g.out_stride[n] = os[d];
    n++;
  }
  if (n == 0) g.shape[n] = 1, g.in_stride[n] = g.out_stride[n] = 0, n = 1;
  if (clpar_dtype_is_half(src->dtype))
    return clpar_set_error(CLPAR_ERROR_DTYPE,
                           "strided copy (permute, narrow, cat along dim > 0): %s tensors are not "
                           "supported; convert to float32 first (clpar_to_dtype)",
                           clpar_dtype_name(src->dtype));
  size_t wpe = clpar_dtype_size(src->dtype) / CLPAR_WORD_BYTES; /* words per element */
  if (wpe == 2) {
    for (int d = 0; d < n; d++) g.in_stride[d] *= 2, g.out_stride[d] *= 2;
    if (n == 8)
      return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                             "strided copy: an int64 tensor with 8 dimensions that cannot merge");
    g.shape[n] = 2, g.in_stride[n] = g.out_stride[n] = 1, n++;
  }
  g.ndim = n;
  clpar_device *dev = src->storage->dev;
  clpar_bref in = clpar_tensor_bref(src), out = clpar_tensor_bref(dst);
  in.off += io * wpe;
  out.off += oo * wpe;
  clpar_status s = clpar_dev_strided_copy(dev, g, in, out);
  return s == CLPAR_OK ? s : clpar_device_fail(dev, s);
}

/* ---- permute ---- */

static clpar_status permute_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  int inv[CLPAR_MAX_DIMS];
  for (int i = 0; i < g->ndim; i++) inv[(n->iparam[0] >> (4 * i)) & 15] = i;
  return clpar_permute(g, inv, g->ndim, &gin[0]);
}

/* True when the dimensions larger than 1 keep their order: the permute is a reshape. */
static int keeps_order(const clpar_tensor *x, const int *perm) {
  int last = -1;
  for (int i = 0; i < x->ndim; i++) {
    if (x->shape[perm[i]] == 1) continue;
    if (perm[i] < last) return 0;
    last = perm[i];
  }
  return 1;
}

clpar_status clpar_permute(const clpar_tensor *x, const int *dims, int ndim, clpar_tensor **out) {
  const char *fn = "clpar_permute";
  clpar_status s = check_in(fn, x, out);
  if (s == CLPAR_OK && (!dims || ndim != x->ndim))
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "%s: %d dims given for a tensor of %d dimensions", fn, ndim, x->ndim);
  if (s != CLPAR_OK) return s;
  int perm[CLPAR_MAX_DIMS], seen = 0;
  for (int i = 0; i < ndim; i++) {
    perm[i] = norm_dim(fn, dims[i], ndim);
    if (perm[i] < 0) return CLPAR_ERROR_INVALID_ARGUMENT;
    if (seen & (1 << perm[i]))
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: dim %d appears twice", fn, perm[i]);
    seen |= 1 << perm[i];
  }
  int64_t shape[CLPAR_MAX_DIMS], xs[CLPAR_MAX_DIMS], is[CLPAR_MAX_DIMS], os[CLPAR_MAX_DIMS];
  for (int i = 0; i < ndim; i++) shape[i] = x->shape[perm[i]];
  if (keeps_order(x, perm)) return clpar_tensor_reshape((clpar_tensor *)x, ndim, shape, out);
  contiguous_strides(ndim, x->shape, xs);
  contiguous_strides(ndim, shape, os);
  for (int i = 0; i < ndim; i++) is[i] = xs[perm[i]];
  clpar_tensor *r;
  s = clpar_tensor_empty_dtype(x->storage->dev, x->dtype, ndim, shape, &r);
  if (s == CLPAR_OK) s = strided(x, r, ndim, shape, is, 0, os, 0);
  if (s != CLPAR_OK) {
    clpar_tensor_free(r);
    return s;
  }
  clpar_node *node;
  s = clpar_record_op(r, fn, permute_backward, (clpar_tensor **)&x, 1, &node);
  if (node) {
    node->iparam[0] = 0;
    for (int i = 0; i < ndim; i++) node->iparam[0] |= (int64_t)perm[i] << (4 * i);
  }
  if (s == CLPAR_OK) *out = r;
  return s;
}

clpar_status clpar_transpose(const clpar_tensor *x, int dim0, int dim1, clpar_tensor **out) {
  clpar_status s = check_in("clpar_transpose", x, out);
  if (s != CLPAR_OK) return s;
  int d0 = norm_dim("clpar_transpose", dim0, x->ndim),
      d1 = norm_dim("clpar_transpose", dim1, x->ndim);
  if (d0 < 0 || d1 < 0) return CLPAR_ERROR_INVALID_ARGUMENT;
  int perm[CLPAR_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  return clpar_permute(x, perm, x->ndim, out);
}

/* ---- narrow ---- */

/* The gradient of a copied narrow: zeros with g in the window. */
static clpar_status narrow_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *x = n->inputs[0], *r;
  int dim = (int)n->iparam[0];
  clpar_status s = clpar_tensor_zeros(x->storage->dev, x->ndim, x->shape, &r);
  if (s != CLPAR_OK) return s;
  int64_t gs[CLPAR_MAX_DIMS], xs[CLPAR_MAX_DIMS];
  contiguous_strides(g->ndim, g->shape, gs);
  contiguous_strides(x->ndim, x->shape, xs);
  s = strided(g, r, g->ndim, g->shape, gs, 0, xs, (size_t)(n->iparam[1] * xs[dim]));
  if (s != CLPAR_OK) {
    clpar_tensor_free(r);
    return s;
  }
  gin[0] = r;
  return CLPAR_OK;
}

/* A view: x seen as [shape[dim], rest], rows start .. start + length, seen as shape. */
static clpar_status narrow_view(clpar_tensor *x, int dim, int64_t start, const int64_t *shape,
                                clpar_tensor **out) {
  int64_t flat[2] = {x->shape[dim], x->numel / x->shape[dim]};
  clpar_tensor *v, *rows = NULL;
  clpar_status s = clpar_tensor_reshape(x, 2, flat, &v);
  if (s == CLPAR_OK) s = clpar_tensor_rows(v, start, shape[dim], &rows);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(rows, x->ndim, shape, out);
  clpar_tensor_free(rows);
  clpar_tensor_free(v);
  return s;
}

clpar_status clpar_narrow(const clpar_tensor *x, int dim, int64_t start, int64_t length,
                          clpar_tensor **out) {
  const char *fn = "clpar_narrow";
  clpar_status s = check_in(fn, x, out);
  if (s != CLPAR_OK) return s;
  int d = norm_dim(fn, dim, x->ndim);
  if (d < 0) return CLPAR_ERROR_INVALID_ARGUMENT;
  if (start < 0 || length < 1 || start > x->shape[d] - length) {
    char a[128];
    return clpar_set_error(CLPAR_ERROR_INDEX,
                           "%s: %lld elements from %lld along dim %d of %s (need length >= 1 "
                           "within the dimension)",
                           fn, (long long)length, (long long)start, d, SHAPE(x, a));
  }
  int64_t shape[CLPAR_MAX_DIMS], is[CLPAR_MAX_DIMS], os[CLPAR_MAX_DIMS], lead = 1;
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof shape[0]);
  shape[d] = length;
  for (int i = 0; i < d; i++) lead *= x->shape[i];
  if (lead == 1) return narrow_view((clpar_tensor *)x, d, start, shape, out);
  contiguous_strides(x->ndim, x->shape, is);
  contiguous_strides(x->ndim, shape, os);
  clpar_tensor *r;
  s = clpar_tensor_empty_dtype(x->storage->dev, x->dtype, x->ndim, shape, &r);
  if (s == CLPAR_OK) s = strided(x, r, x->ndim, shape, is, (size_t)(start * is[d]), os, 0);
  if (s != CLPAR_OK) {
    clpar_tensor_free(r);
    return s;
  }
  clpar_node *node;
  s = clpar_record_op(r, fn, narrow_backward, (clpar_tensor **)&x, 1, &node);
  if (node) node->iparam[0] = d, node->iparam[1] = start;
  if (s == CLPAR_OK) *out = r;
  return s;
}

/* ---- concatenation and split along a dimension ---- */

static clpar_status cat_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  int dim = (int)n->iparam[0];
  int64_t start = 0;
  for (int i = 0; i < n->n_inputs; i++) {
    clpar_tensor *p = n->inputs[i];
    if (p->requires_grad) {
      clpar_status s = clpar_narrow(g, dim, start, p->shape[dim], &gin[i]);
      if (s != CLPAR_OK) return s;
    }
    start += p->shape[dim];
  }
  return CLPAR_OK;
}

/* Parts agree in dtype, device and every dimension but dim; *total is their sum along dim. */
static clpar_status cat_check(clpar_tensor *const *parts, int n, int dim, int64_t *total) {
  const clpar_tensor *q = parts[0];
  *total = 0;
  for (int i = 0; i < n; i++) {
    const clpar_tensor *p = parts[i];
    clpar_status s = check_in("clpar_cat", p, parts);
    if (s != CLPAR_OK) return s;
    int same = p->ndim == q->ndim && p->dtype == q->dtype && p->storage->dev == q->storage->dev;
    for (int d = 0; same && d < p->ndim; d++) same = d == dim || p->shape[d] == q->shape[d];
    if (!same) {
      char a[128], b[128];
      return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                             "clpar_cat: part 0 is %s %s on %s, part %d is %s %s on %s; all "
                             "but dim %d must match",
                             clpar_dtype_name(q->dtype), SHAPE(q, a), q->storage->dev->bd.info.id,
                             i, clpar_dtype_name(p->dtype), SHAPE(p, b),
                             p->storage->dev->bd.info.id, dim);
    }
    *total += p->shape[dim];
  }
  return CLPAR_OK;
}

clpar_status clpar_cat(clpar_tensor *const *parts, int n, int dim, clpar_tensor **out) {
  if (!parts || n < 1 || !parts[0] || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_cat: need n >= 1 parts and an out pointer");
  clpar_status s = clpar_check_alive("clpar_cat", parts[0]);
  if (s != CLPAR_OK) return s;
  int d = norm_dim("clpar_cat", dim, parts[0]->ndim);
  if (d < 0) return CLPAR_ERROR_INVALID_ARGUMENT;
  int64_t total, shape[CLPAR_MAX_DIMS], os[CLPAR_MAX_DIMS], is[CLPAR_MAX_DIMS];
  s = cat_check(parts, n, d, &total);
  if (s != CLPAR_OK) return s;
  memcpy(shape, parts[0]->shape, (size_t)parts[0]->ndim * sizeof shape[0]);
  shape[d] = total;
  contiguous_strides(parts[0]->ndim, shape, os);
  clpar_tensor *r;
  s = clpar_tensor_empty_dtype(parts[0]->storage->dev, parts[0]->dtype, parts[0]->ndim, shape, &r);
  int64_t at = 0;
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    const clpar_tensor *p = parts[i];
    contiguous_strides(p->ndim, p->shape, is);
    s = strided(p, r, p->ndim, p->shape, is, 0, os, (size_t)(at * os[d]));
    at += p->shape[d];
  }
  if (s != CLPAR_OK) {
    clpar_tensor_free(r);
    return s;
  }
  clpar_node *node;
  s = clpar_record_op(r, "clpar_cat", cat_backward, parts, n, &node);
  if (node) node->iparam[0] = d;
  if (s == CLPAR_OK) *out = r;
  return s;
}

clpar_status clpar_split_dim(const clpar_tensor *t, int dim, const int64_t *sizes, int n,
                             clpar_tensor **outs) {
  clpar_status s = check_in("clpar_split_dim", t, outs);
  if (s == CLPAR_OK && (!sizes || n < 1))
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_split_dim: need n >= 1 sizes");
  if (s != CLPAR_OK) return s;
  int d = norm_dim("clpar_split_dim", dim, t->ndim);
  if (d < 0) return CLPAR_ERROR_INVALID_ARGUMENT;
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 1)
      return clpar_set_error(CLPAR_ERROR_EMPTY,
                             "clpar_split_dim: size %d is %lld; sizes must be >= 1", i,
                             (long long)sizes[i]);
    else if (__builtin_add_overflow(total, sizes[i], &total))
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                             "clpar_split_dim: the sizes add up to more than %lld",
                             (long long)INT64_MAX);
  }
  if (total != t->shape[d])
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "clpar_split_dim: the sizes add up to %lld, dim %d has %lld",
                           (long long)total, d, (long long)t->shape[d]);
  int64_t start = 0;
  for (int i = 0; i < n; i++) {
    s = clpar_narrow(t, d, start, sizes[i], &outs[i]);
    if (s != CLPAR_OK) {
      while (i-- > 0) clpar_tensor_free(outs[i]);
      return s;
    }
    start += sizes[i];
  }
  return CLPAR_OK;
}

/* ---- batched matmul ---- */

/* op(x) op(y) per batch, summed over the leading dimensions when like (the operand whose
 * gradient it is) is a 2-D operand that was shared by every batch. */
static clpar_status bmm_grad(const clpar_tensor *x, const clpar_tensor *y, int tx, int ty,
                             const clpar_tensor *like, clpar_tensor **out) {
  clpar_tensor *full;
  clpar_status s = clpar_bmm(x, y, tx, ty, &full);
  if (s != CLPAR_OK || full->ndim == like->ndim) {
    if (s == CLPAR_OK) *out = full;
    return s;
  }
  int lead[CLPAR_MAX_DIMS];
  for (int d = 0; d < full->ndim - 2; d++) lead[d] = d;
  s = clpar_sum_dims(full, lead, full->ndim - 2, 0, out);
  clpar_tensor_free(full);
  return s;
}

/* C = op(A) op(B) per batch: dA = g op(B)^T (laid out as A is), dB = op(A)^T g. */
static clpar_status bmm_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *a = n->inputs[0], *b = n->inputs[1];
  int ta = (int)n->iparam[0], tb = (int)n->iparam[1];
  clpar_status s = CLPAR_OK;
  if (a->requires_grad)
    s = ta ? bmm_grad(b, g, tb, 1, a, &gin[0]) : bmm_grad(g, b, 0, !tb, a, &gin[0]);
  if (s == CLPAR_OK && b->requires_grad)
    s = tb ? bmm_grad(g, a, 1, ta, b, &gin[1]) : bmm_grad(a, g, !ta, 0, b, &gin[1]);
  return s;
}

/* The shape of a batched product: m, n, k, the batch count, the leading dimensions (of the
 * operand with more dimensions; a 2-D operand is shared by every batch) and the strides of a
 * and b between batches (0 for a shared one). */
typedef struct {
  int64_t m, n, k, batch, stride_a, stride_b;
  const clpar_tensor *lead; /* the operand whose leading dimensions the result takes */
} bmm_shape;

static clpar_status bmm_dims(const clpar_tensor *a, const clpar_tensor *b, int ta, int tb,
                             bmm_shape *p) {
  const char *fn = "clpar_bmm";
  clpar_status s = clpar_check_float(fn, "a", a);
  if (s == CLPAR_OK) s = clpar_check_float(fn, "b", b);
  if (s != CLPAR_OK) return s;
  if (a->storage->dev != b->storage->dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH,
                           "%s: inputs are on %s and %s; move one with clpar_tensor_to", fn,
                           a->storage->dev->bd.info.id, b->storage->dev->bd.info.id);
  p->lead = a->ndim >= b->ndim ? a : b;
  int nd = p->lead->ndim, ok = a->ndim >= 2 && b->ndim >= 2;
  ok = ok && (a->ndim == b->ndim || a->ndim == 2 || b->ndim == 2);
  p->batch = 1;
  for (int d = 0; ok && d < nd - 2; d++) {
    ok = a->ndim != b->ndim || a->shape[d] == b->shape[d];
    p->batch *= p->lead->shape[d];
  }
  const int64_t *as = a->shape + a->ndim - 2, *bs = b->shape + b->ndim - 2;
  p->m = ta ? as[1] : as[0];
  p->k = ta ? as[0] : as[1];
  p->n = tb ? bs[0] : bs[1];
  p->stride_a = a->ndim == nd ? p->m * p->k : 0;
  p->stride_b = b->ndim == nd ? p->k * p->n : 0;
  if (!ok || (tb ? bs[1] : bs[0]) != p->k) {
    char x[128], y[128];
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: a is %s and b is %s (trans_a %d, trans_b %d); need the same "
                           "leading dimensions (or one operand 2-D) and op(a)'s columns equal "
                           "to op(b)'s rows",
                           fn, SHAPE(a, x), SHAPE(b, y), ta != 0, tb != 0);
  }
  return CLPAR_OK;
}

clpar_status clpar_bmm(const clpar_tensor *a, const clpar_tensor *b, int trans_a, int trans_b,
                       clpar_tensor **out) {
  clpar_status s = check_in("clpar_bmm", a, out);
  if (s == CLPAR_OK) s = check_in("clpar_bmm", b, out);
  bmm_shape p = {0, 0, 0, 0, 0, 0, NULL};
  if (s == CLPAR_OK) s = bmm_dims(a, b, trans_a, trans_b, &p);
  if (s != CLPAR_OK) return s;
  int nd = p.lead->ndim;
  int64_t shape[CLPAR_MAX_DIMS];
  memcpy(shape, p.lead->shape, (size_t)nd * sizeof shape[0]);
  shape[nd - 2] = p.m;
  shape[nd - 1] = p.n;
  clpar_device *dev = a->storage->dev;
  clpar_tensor *r;
  s = clpar_tensor_empty(dev, nd, shape, &r);
  if (s != CLPAR_OK) return s;
  size_t lda = (size_t)a->shape[a->ndim - 1], ldb = (size_t)b->shape[b->ndim - 1];
  s = clpar_dev_gemm_batched(
      dev, trans_a != 0, trans_b != 0, (size_t)p.m, (size_t)p.n, (size_t)p.k, 1.0f,
      clpar_tensor_bref(a), lda, (size_t)p.stride_a, clpar_tensor_bref(b), ldb, (size_t)p.stride_b,
      0.0f, clpar_tensor_bref(r), (size_t)p.n, (size_t)(p.m * p.n), (size_t)p.batch);
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(r);
    return s;
  }
  clpar_node *node;
  clpar_tensor *in[2] = {(clpar_tensor *)a, (clpar_tensor *)b};
  s = clpar_record_op(r, "clpar_bmm", bmm_backward, in, 2, &node);
  if (node) node->iparam[0] = trans_a != 0, node->iparam[1] = trans_b != 0;
  if (s == CLPAR_OK) *out = r;
  return s;
}

/* ---- the upper-triangle mask ---- */

/* y = mask_upper(x, diagonal, value) over the last two dimensions (out may be x's memory). */
static clpar_status mask_run(const clpar_tensor *x, int64_t diagonal, float value,
                             clpar_tensor *r) {
  size_t rows = (size_t)x->shape[x->ndim - 2], cols = (size_t)x->shape[x->ndim - 1];
  clpar_device *dev = x->storage->dev;
  clpar_status s = clpar_dev_mask_upper(dev, (size_t)x->numel / (rows * cols), rows, cols, diagonal,
                                        value, clpar_tensor_bref(x), clpar_tensor_bref(r));
  return s == CLPAR_OK ? s : clpar_device_fail(dev, s);
}

/* The masked positions get no gradient. */
static clpar_status mask_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *r;
  clpar_status s = clpar_tensor_empty(g->storage->dev, g->ndim, g->shape, &r);
  if (s == CLPAR_OK) s = mask_run(g, n->iparam[0], 0.0f, r);
  if (s != CLPAR_OK) {
    clpar_tensor_free(r);
    return s;
  }
  gin[0] = r;
  return CLPAR_OK;
}

clpar_status clpar_masked_fill_upper(const clpar_tensor *x, int64_t diagonal, float value,
                                     clpar_tensor **out) {
  const char *fn = "clpar_masked_fill_upper";
  clpar_status s = check_in(fn, x, out);
  if (s == CLPAR_OK) s = clpar_check_float(fn, "x", x);
  if (s == CLPAR_OK && x->ndim < 2) {
    char a[128];
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s: x is %s; need at least 2 dimensions", fn,
                        SHAPE(x, a));
  }
  if (s != CLPAR_OK) return s;
  clpar_tensor *r;
  s = clpar_tensor_empty(x->storage->dev, x->ndim, x->shape, &r);
  if (s == CLPAR_OK) s = mask_run(x, diagonal, value, r);
  if (s != CLPAR_OK) {
    clpar_tensor_free(r);
    return s;
  }
  clpar_node *node;
  s = clpar_record_op(r, fn, mask_backward, (clpar_tensor **)&x, 1, &node);
  if (node) node->iparam[0] = diagonal;
  if (s == CLPAR_OK) *out = r;
  return s;
}

clpar_status clpar_causal_mask(const clpar_tensor *scores, clpar_tensor **out) {
  return clpar_masked_fill_upper(scores, 1, -INFINITY, out);
}
