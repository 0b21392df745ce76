/* reduce.c — sums, means and variances along any set of dimensions, and their counterpart
 * clpar_expand (a broadcast into a larger shape), each the other's gradient.
 *
 * A set of dimensions is reduced in passes over runs of adjacent dimensions, the last run
 * first: each pass sees the tensor as [outer, red, inner] and is one backend reduce_sum
 * (NCHW over {0, 2, 3}: [N*C, H*W, 1] to [N, C, 1, 1], then [1, N, C] to [1, C, 1, 1]).
 * clpar_expand is the same in reverse with the backend's expand. The mean scales the sum;
 * the variance is two-pass for accuracy (the mean, then the sum of squared deviations from
 * it), composed from differentiable ops, so its backward comes from theirs. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

static clpar_status check_input(const char *fn, const clpar_tensor *x, clpar_tensor **out) {
  if (!x || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  clpar_status s = clpar_check_alive(fn, x);
  return s == CLPAR_OK ? clpar_check_float(fn, "x", x) : s;
}

/* The dims as a bit mask over x's dimensions (bit d: dimension d is reduced); negative dims
 * count from the end; NULL dims with n_dims 0: every dimension. */
static clpar_status dims_mask(const char *fn, const clpar_tensor *x, const int *dims, int n_dims,
                              unsigned *mask) {
  char b[128];
  *mask = 0;
  if (n_dims == 0 && !dims) {
    *mask = (1u << x->ndim) - 1;
    return CLPAR_OK;
  }
  if (n_dims < 1 || !dims)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: %d dims%s; give n_dims >= 1 dims, or NULL and 0 for every "
                           "dimension",
                           fn, n_dims, dims ? "" : " and dims NULL");
  for (int k = 0; k < n_dims; k++) {
    int d = dims[k] < 0 ? dims[k] + x->ndim : dims[k];
    if (d < 0 || d >= x->ndim)
      return clpar_set_error(CLPAR_ERROR_INDEX, "%s: dim %d is out of range for %s (%d dimensions)",
                             fn, dims[k], SHAPE(x, b), x->ndim);
    if (*mask & (1u << d))
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: dimension %d appears twice in dims (for %s)", fn, d, SHAPE(x, b));
    *mask |= 1u << d;
  }
  return CLPAR_OK;
}

/* The shape of the result: x's with the masked dims 1 (keepdim) or dropped ([1] when none
 * is left). Returns its ndim. */
static int reduced_shape(const clpar_tensor *x, unsigned mask, int keepdim, int64_t *shape) {
  int n = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (!(mask & (1u << d)))
      shape[n++] = x->shape[d];
    else if (keepdim)
      shape[n++] = 1;
  }
  if (n == 0) shape[n++] = 1;
  return n;
}

static int64_t prod(const int64_t *shape, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= shape[d];
  return p;
}

/* The runs of adjacent set bits of mask (ndim bits), last first: starts and ends (exclusive). */
static int runs_of(unsigned mask, int ndim, int *start, int *end) {
  int n = 0;
  for (int d = ndim - 1; d >= 0;) {
    if (!(mask & (1u << d))) {
      d--;
      continue;
    }
    end[n] = d + 1;
    while (d >= 0 && (mask & (1u << d))) d--;
    start[n++] = d + 1;
  }
  return n;
}

/* Posts the passes of x summed over mask into a new tensor of shape (ndim, shape). */
static clpar_status sum_passes(const clpar_tensor *x, unsigned mask, int ndim, const int64_t *shape,
                               clpar_tensor **out) {
  clpar_device *dev = x->storage->dev;
  int start[CLPAR_MAX_DIMS], end[CLPAR_MAX_DIMS], n = runs_of(mask, x->ndim, start, end);
  int64_t cur[CLPAR_MAX_DIMS];
  memcpy(cur, x->shape, sizeof cur);
  const clpar_tensor *src = x;
  clpar_tensor *r = NULL;
  clpar_status s = CLPAR_OK;
  for (int k = 0; k < n && s == CLPAR_OK; k++) {
    int64_t outer = prod(cur, 0, start[k]), red = prod(cur, start[k], end[k]);
    int64_t inner = prod(cur, end[k], x->ndim);
    for (int d = start[k]; d < end[k]; d++) cur[d] = 1;
    /* the last pass writes the result in its final shape (the same elements) */
    r = NULL;
    s = k + 1 < n ? clpar_tensor_empty(dev, x->ndim, cur, &r)
                  : clpar_tensor_empty(dev, ndim, shape, &r);
    if (s == CLPAR_OK)
      s = clpar_dev_reduce_sum(dev, (size_t)outer, (size_t)red, (size_t)inner,
                               clpar_tensor_bref(src), clpar_tensor_bref(r));
    if (s != CLPAR_OK && r) {
      clpar_device_fail(dev, s);
      clpar_tensor_free(r);
      r = NULL;
    }
    if (src != x) clpar_tensor_free((clpar_tensor *)src);
    src = r;
  }
  if (s == CLPAR_OK) *out = r;
  return s;
}

/* Posts the passes of a (x's shape with the masked dims 1) broadcast to shape full. */
static clpar_status expand_passes(const clpar_tensor *a, unsigned mask, int ndim,
                                  const int64_t *full, clpar_tensor **out) {
  clpar_device *dev = a->storage->dev;
  int start[CLPAR_MAX_DIMS], end[CLPAR_MAX_DIMS], n = runs_of(mask, ndim, start, end);
  int64_t cur[CLPAR_MAX_DIMS];
  for (int d = 0; d < ndim; d++) cur[d] = mask & (1u << d) ? 1 : full[d];
  const clpar_tensor *src = a;
  clpar_tensor *r = NULL;
  clpar_status s = CLPAR_OK;
  for (int k = 0; k < n && s == CLPAR_OK; k++) {
    for (int d = start[k]; d < end[k]; d++) cur[d] = full[d];
    int64_t outer = prod(cur, 0, start[k]), red = prod(cur, start[k], end[k]);
    int64_t inner = prod(cur, end[k], ndim);
    r = NULL;
    s = clpar_tensor_empty(dev, ndim, cur, &r);
    if (s == CLPAR_OK)
      s = clpar_dev_expand(dev, (size_t)outer, (size_t)red, (size_t)inner, clpar_tensor_bref(src),
                           clpar_tensor_bref(r));
    if (s != CLPAR_OK && r) {
      clpar_device_fail(dev, s);
      clpar_tensor_free(r);
      r = NULL;
    }
    if (src != a) clpar_tensor_free((clpar_tensor *)src);
    src = r;
  }
  if (s == CLPAR_OK) *out = r;
  return s;
}

/* d sum / dx: the gradient broadcast back over the summed dims. */
static clpar_status sum_dims_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  const clpar_tensor *x = n->inputs[0];
  unsigned mask = (unsigned)n->iparam[0];
  int64_t keep[CLPAR_MAX_DIMS];
  int nk = reduced_shape(x, mask, 1, keep);
  clpar_tensor *gk;
  clpar_status s = clpar_tensor_reshape(g, nk, keep, &gk);
  if (s != CLPAR_OK) return s;
  s = clpar_expand(gk, x->ndim, x->shape, &gin[0]);
  clpar_tensor_free(gk);
  return s;
}

static clpar_status sum_mask(const char *fn, const clpar_tensor *x, unsigned mask, int keepdim,
                             clpar_tensor **out) {
  int64_t shape[CLPAR_MAX_DIMS];
  int ndim = reduced_shape(x, mask, keepdim, shape);
  clpar_tensor *r;
  clpar_status s = sum_passes(x, mask, ndim, shape, &r);
  if (s != CLPAR_OK) return s;
  clpar_node *node;
  s = clpar_record_op(r, fn, sum_dims_backward, (clpar_tensor **)&x, 1, &node);
  if (node) node->iparam[0] = mask;
  if (s == CLPAR_OK) *out = r;
  return s;
}

clpar_status clpar_sum_dims(const clpar_tensor *x, const int *dims, int n_dims, int keepdim,
                            clpar_tensor **out) {
  const char *fn = "clpar_sum_dims";
  unsigned mask;
  clpar_status s = check_input(fn, x, out);
  if (s == CLPAR_OK) s = dims_mask(fn, x, dims, n_dims, &mask);
  return s == CLPAR_OK ? sum_mask(fn, x, mask, keepdim, out) : s;
}

/* The elements each output sums. */
static int64_t reduced_count(const clpar_tensor *x, unsigned mask) {
  int64_t c = 1;
  for (int d = 0; d < x->ndim; d++)
    if (mask & (1u << d)) c *= x->shape[d];
  return c;
}

clpar_status clpar_mean_dims(const clpar_tensor *x, const int *dims, int n_dims, int keepdim,
                             clpar_tensor **out) {
  const char *fn = "clpar_mean_dims";
  unsigned mask;
  clpar_status s = check_input(fn, x, out);
  if (s == CLPAR_OK) s = dims_mask(fn, x, dims, n_dims, &mask);
  if (s != CLPAR_OK) return s;
  clpar_tensor *sum;
  s = sum_mask(fn, x, mask, keepdim, &sum);
  if (s != CLPAR_OK) return s;
  s = clpar_scale(sum, (float)(1.0 / (double)reduced_count(x, mask)), out);
  clpar_tensor_free(sum);
  return s;
}

clpar_status clpar_var_dims(const clpar_tensor *x, const int *dims, int n_dims, int unbiased,
                            int keepdim, clpar_tensor **out) {
  const char *fn = "clpar_var_dims";
  unsigned mask;
  clpar_status s = check_input(fn, x, out);
  if (s == CLPAR_OK) s = dims_mask(fn, x, dims, n_dims, &mask);
  if (s != CLPAR_OK) return s;
  int64_t count = reduced_count(x, mask);
  clpar_tensor *sum = NULL, *mean = NULL, *wide = NULL, *dev = NULL, *sq = NULL, *ss = NULL;
  s = sum_mask(fn, x, mask, 1, &sum);
  if (s == CLPAR_OK) s = clpar_scale(sum, (float)(1.0 / (double)count), &mean);
  if (s == CLPAR_OK) s = clpar_expand(mean, x->ndim, x->shape, &wide);
  if (s == CLPAR_OK) s = clpar_sub(x, wide, &dev);
  if (s == CLPAR_OK) s = clpar_mul(dev, dev, &sq);
  if (s == CLPAR_OK) s = sum_mask(fn, sq, mask, keepdim, &ss);
  /* count 1 with the unbiased estimate divides by 0: NaN, as torch.var gives */
  double div = unbiased ? (double)count - 1.0 : (double)count;
  if (s == CLPAR_OK) s = clpar_scale(ss, (float)(1.0 / div), out);
  clpar_tensor_free(sum);
  clpar_tensor_free(mean);
  clpar_tensor_free(wide);
  clpar_tensor_free(dev);
  clpar_tensor_free(sq);
  clpar_tensor_free(ss);
  return s;
}

/* d expand / da: the gradient summed over the broadcast dims, back to a's shape. */
static clpar_status expand_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  return sum_mask("clpar_expand", g, (unsigned)n->iparam[0], 1, &gin[0]);
}

clpar_status clpar_expand(const clpar_tensor *x, int ndim, const int64_t *shape,
                          clpar_tensor **out) {
  const char *fn = "clpar_expand";
  clpar_status s = check_input(fn, x, out);
  if (s != CLPAR_OK) return s;
  int64_t numel;
  s = clpar_check_shape(fn, ndim, shape, &numel);
  if (s != CLPAR_OK) return s;
  unsigned mask = 0;
  int fits = ndim == x->ndim;
  for (int d = 0; fits && d < ndim; d++) {
    fits = x->shape[d] == shape[d] || x->shape[d] == 1;
    if (x->shape[d] != shape[d]) mask |= 1u << d;
  }
  if (!fits) {
    char a[128], b[128] = "[";
    for (int d = 0; d < ndim; d++)
      snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", d ? ", " : "", (long long)shape[d]);
    snprintf(b + strlen(b), sizeof b - strlen(b), "]");
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: x is %s and the shape %s; x needs as many dimensions, each equal "
                           "to the shape's or 1",
                           fn, SHAPE(x, a), b);
  }
  clpar_tensor *r;
  if (!mask) return clpar_tensor_reshape((clpar_tensor *)x, ndim, shape, out); /* a view */
  s = expand_passes(x, mask, ndim, shape, &r);
  if (s != CLPAR_OK) return s;
  clpar_node *node;
  s = clpar_record_op(r, fn, expand_backward, (clpar_tensor **)&x, 1, &node);
  if (node) node->iparam[0] = mask;
  if (s == CLPAR_OK) *out = r;
  return s;
}
