/* clip.c — clip_grad_norm with torch.nn.utils.clip_grad_norm_'s result (norm_type 2), on the
 * devices and without a host wait:
 *   1. on each device, every gradient piece (a flat group's whole gradient, or one parameter's)
 *      is squared into a scratch buffer and summed, CHUNK elements at a time, into one partial
 *      sum per chunk; the partial sums are summed into the device's total;
 *   2. the totals of the other devices are copied to the main device (the first gradient's) and
 *      summed: total_norm = sqrt of that sum;
 *   3. clip_coef = max_norm / max(total_norm + 1e-6, max_norm), which is PyTorch's
 *      min(max_norm / (total_norm + 1e-6), 1) composed from the backend's primitives: the max
 *      is max_norm + relu(total_norm + 1e-6 - max_norm), exact when it is max_norm and within
 *      one rounding of total_norm + 1e-6 otherwise;
 *   4. the coefficient is copied to the other devices and every piece is multiplied by it in
 *      place. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

#define CHUNK ((int64_t)1 << 20) /* elements squared at a time: the scratch buffer's size */

typedef struct {
  clpar_tensor *grad; /* borrowed */
} piece;

typedef struct {
  clpar_device *dev;
  int64_t chunks, largest;
  clpar_tensor *partial, *scratch, *total, *coef;
} dev_work;

static int64_t n_chunks(int64_t numel) {
  return (numel + CHUNK - 1) / CHUNK;
}

/* The pieces of the gradients of ts[0..n): a flat group all of whose members are among them
 * with a gradient each is one piece (its leaf's gradient), any other gradient its own. */
static int collect(clpar_tensor *const *ts, int n, int *group_of, clpar_tensor **leaves,
                   int *counts, piece *pieces) {
  int n_groups = clpar_flat_whole_groups(ts, n, group_of, leaves, counts);
  for (int k = 0; k < n_groups; k++) counts[k] = 1; /* 1: every member has a gradient */
  for (int i = 0; i < n; i++)
    if (group_of[i] >= 0 && !clpar_tensor_has_grad(ts[i])) counts[group_of[i]] = 0;
  int np = 0; /* in the order of ts: a group where its first member is */
  for (int i = 0; i < n; i++) {
    int k = group_of[i];
    if (k >= 0 && counts[k] == 1 && leaves[k]->grad && leaves[k]->numel > 0)
      pieces[np++].grad = leaves[k]->grad;
    if (k >= 0 && counts[k] >= 1) {
      counts[k] = 2; /* its piece is in */
      continue;
    }
    if (clpar_tensor_has_grad(ts[i]) && ts[i]->grad->numel > 0) pieces[np++].grad = ts[i]->grad;
  }
  return np;
}

static dev_work *work_for(dev_work *w, int *nw, clpar_device *dev) {
  for (int k = 0; k < *nw; k++)
    if (w[k].dev == dev) return &w[k];
  w[*nw] = (dev_work){.dev = dev};
  return &w[(*nw)++];
}

/* Step 1 on every device: the sum of squares into each device's total (one float). */
static clpar_status sum_squares(const piece *p, int np, dev_work *w, int nw) {
  for (int k = 0; k < nw; k++) {
    int64_t one = 1;
    clpar_status s = clpar_tensor_empty(w[k].dev, 1, &w[k].chunks, &w[k].partial);
    if (s == CLPAR_OK) s = clpar_tensor_empty(w[k].dev, 1, &w[k].largest, &w[k].scratch);
    if (s == CLPAR_OK) s = clpar_tensor_empty(w[k].dev, 1, &one, &w[k].total);
    if (s != CLPAR_OK) return s;
    w[k].chunks = 0; /* counts the partial sums written */
  }
  for (int i = 0; i < np; i++) {
    clpar_tensor *g = p[i].grad;
    dev_work *d = work_for(w, &nw, g->storage->dev);
    clpar_bref gb = clpar_tensor_bref(g), sb = clpar_tensor_bref(d->scratch);
    for (int64_t at = 0; at < g->numel; at += CHUNK) {
      size_t len = (size_t)(g->numel - at < CHUNK ? g->numel - at : CHUNK);
      clpar_bref c = {gb.buf, gb.off + (size_t)at}, out = clpar_tensor_bref(d->partial);
      out.off += (size_t)d->chunks++;
      clpar_status s = clpar_dev_binary(d->dev, CLPAR_BINARY_MUL, 1, len, c, c, 1, sb);
      if (s == CLPAR_OK) s = clpar_dev_reduce_sum(d->dev, 1, len, 1, sb, out);
      if (s != CLPAR_OK) return clpar_device_fail(d->dev, s);
    }
  }
  for (int k = 0; k < nw; k++) {
    clpar_status s =
        clpar_dev_reduce_sum(w[k].dev, 1, (size_t)w[k].chunks, 1, clpar_tensor_bref(w[k].partial),
                             clpar_tensor_bref(w[k].total));
    if (s != CLPAR_OK) return clpar_device_fail(w[k].dev, s);
  }
  return CLPAR_OK;
}

/* Steps 2 and 3 on the main device w[0]: the norm into norm, the coefficient into w[0].coef. */
static clpar_status coefficient(dev_work *w, int nw, float max_norm, clpar_tensor *norm) {
  clpar_device *dev = w[0].dev;
  int64_t nd = nw, four = 4, one = 1;
  clpar_tensor *sums = NULL, *c = NULL;
  clpar_status s = clpar_tensor_empty(dev, 1, &nd, &sums);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &four, &c);
  for (int k = 0; s == CLPAR_OK && k < nw; k++)
    s = clpar_transfer(dev, sums->storage, (sums->offset + (size_t)k) * sizeof(float), w[k].dev,
                       w[k].total->storage, w[k].total->offset * sizeof(float), sizeof(float));
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &one, &w[0].coef);
  if (s != CLPAR_OK) goto done;
  clpar_bref sb = clpar_tensor_bref(sums), nb = clpar_tensor_bref(norm), cb = clpar_tensor_bref(c);
  clpar_bref eps = cb, maxn = {cb.buf, cb.off + 1}, t = {cb.buf, cb.off + 2},
             d = {cb.buf, cb.off + 3}, coef = clpar_tensor_bref(w[0].coef);
  s = clpar_dev_reduce_sum(dev, 1, (size_t)nw, 1, sb, t);
  if (s == CLPAR_OK) s = clpar_dev_unary(dev, CLPAR_UNARY_SQRT, 1, t, nb);
  if (s == CLPAR_OK) s = clpar_dev_fill(dev, eps, 1, 1e-6f);
  if (s == CLPAR_OK) s = clpar_dev_fill(dev, maxn, 1, max_norm);
  if (s == CLPAR_OK) s = clpar_dev_binary(dev, CLPAR_BINARY_ADD, 1, 1, nb, eps, 1, t);
  if (s == CLPAR_OK) s = clpar_dev_binary(dev, CLPAR_BINARY_SUB, 1, 1, t, maxn, 1, d);
  if (s == CLPAR_OK) s = clpar_dev_unary(dev, CLPAR_UNARY_RELU, 1, d, d);
  if (s == CLPAR_OK) s = clpar_dev_binary(dev, CLPAR_BINARY_ADD, 1, 1, maxn, d, 1, d);
  if (s == CLPAR_OK) s = clpar_dev_binary(dev, CLPAR_BINARY_DIV, 1, 1, maxn, d, 1, coef);
  if (s != CLPAR_OK) s = clpar_device_fail(dev, s);
done:
  clpar_tensor_free(sums);
  clpar_tensor_free(c);
  return s;
}

/* Step 4: the coefficient on every device, and every piece scaled by it. */
static clpar_status scale_all(const piece *p, int np, dev_work *w, int nw) {
  int64_t one = 1;
  for (int k = 1; k < nw; k++) {
    clpar_status s = clpar_tensor_empty(w[k].dev, 1, &one, &w[k].coef);
    if (s == CLPAR_OK)
      s = clpar_transfer(w[k].dev, w[k].coef->storage, w[k].coef->offset * sizeof(float), w[0].dev,
                         w[0].coef->storage, w[0].coef->offset * sizeof(float), sizeof(float));
    if (s != CLPAR_OK) return s;
  }
  for (int i = 0; i < np; i++) {
    clpar_tensor *g = p[i].grad;
    dev_work *d = work_for(w, &nw, g->storage->dev);
    clpar_bref gb = clpar_tensor_bref(g);
    clpar_status s = clpar_dev_binary(d->dev, CLPAR_BINARY_MUL, (size_t)g->numel, 1, gb,
                                      clpar_tensor_bref(d->coef), 1, gb);
    clpar_tensor_touch(g);
    if (s != CLPAR_OK) return clpar_device_fail(d->dev, s);
  }
  return CLPAR_OK;
}

/* Plans the devices' work (w[0] the main device) and runs it; norm is made on w[0]. */
static clpar_status clip(const piece *p, int np, dev_work *w, float max_norm, clpar_tensor **norm) {
  int nw = 0;
  int64_t one = 1;
  for (int i = 0; i < np; i++) {
    dev_work *d = work_for(w, &nw, p[i].grad->storage->dev);
    d->chunks += n_chunks(p[i].grad->numel);
    if (p[i].grad->numel > d->largest) d->largest = p[i].grad->numel;
  }
  for (int k = 0; k < nw; k++)
    if (w[k].largest > CHUNK) w[k].largest = CHUNK;
  clpar_status s = sum_squares(p, np, w, nw);
  if (s == CLPAR_OK) s = clpar_tensor_empty(w[0].dev, 1, &one, norm);
  if (s == CLPAR_OK) s = coefficient(w, nw, max_norm, *norm);
  if (s == CLPAR_OK) s = scale_all(p, np, w, nw);
  for (int k = 0; k < nw; k++) {
    clpar_tensor_free(w[k].partial);
    clpar_tensor_free(w[k].scratch);
    clpar_tensor_free(w[k].total);
    clpar_tensor_free(w[k].coef);
  }
  if (s != CLPAR_OK) {
    clpar_tensor_free(*norm);
    *norm = NULL;
  }
  return s;
}

static clpar_status check_args(const char *fn, clpar_tensor *const *params, int n, float max_norm) {
  if (!params || n < 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: params is %s and n %d", fn,
                           params ? "given" : "NULL", n);
  if (!(max_norm >= 0.0f))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: max_norm is %g; it must be >= 0", fn,
                           (double)max_norm);
  for (int i = 0; i < n; i++) {
    if (!params[i])
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: parameter %d is NULL", fn, i);
    clpar_status s = clpar_check_alive(fn, params[i]);
    if (s == CLPAR_OK && clpar_tensor_has_grad(params[i]))
      s = clpar_check_float(fn, "a gradient", params[i]->grad);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

clpar_status clpar_clip_grad_norm(clpar_tensor *const *params, int n, float max_norm,
                                  clpar_tensor **total_norm) {
  const char *fn = "clpar_clip_grad_norm";
  clpar_status s = check_args(fn, params, n, max_norm);
  if (s != CLPAR_OK) return s;
  size_t m = n > 0 ? (size_t)n : 1;
  int *group_of = malloc(m * sizeof *group_of), *counts = malloc(m * sizeof *counts);
  clpar_tensor **leaves = malloc(m * sizeof *leaves);
  piece *pieces = malloc(m * sizeof *pieces);
  dev_work *w = calloc(m, sizeof *w);
  clpar_tensor *norm = NULL;
  int64_t one = 1;
  if (!group_of || !counts || !leaves || !pieces || !w)
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  int np = s == CLPAR_OK ? collect(params, n, group_of, leaves, counts, pieces) : 0;
  if (s == CLPAR_OK && np > 0) s = clip(pieces, np, w, max_norm, &norm);
  if (s == CLPAR_OK && np == 0 && total_norm) /* PyTorch: tensor(0.) */
    s = n > 0 ? clpar_tensor_zeros(params[0]->storage->dev, 1, &one, &norm)
              : clpar_tensor_zeros(clpar_device_get(0), 1, &one, &norm);
  free(group_of);
  free(counts);
  free(leaves);
  free(pieces);
  free(w);
  if (s != CLPAR_OK) return s;
  if (total_norm)
    *total_norm = norm;
  else
    clpar_tensor_free(norm);
  return CLPAR_OK;
}

clpar_status clpar_clip_grad_norm_module(clpar_module *m, float max_norm,
                                         clpar_tensor **total_norm) {
  const char *fn = "clpar_clip_grad_norm_module";
  if (!m) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the module is NULL", fn);
  int n = clpar_module_parameter_count(m);
  clpar_tensor **params = malloc((size_t)(n > 0 ? n : 1) * sizeof *params);
  if (!params) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < n; i++)
    s = clpar_module_parameter_at(m, i, NULL, &params[i]);
  if (s == CLPAR_OK) s = clpar_clip_grad_norm(params, n, max_norm, total_norm);
  free(params);
  return s;
}
