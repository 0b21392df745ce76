/* embedding.c — F.embedding and nn.Embedding: rows of a weight [num, dim] gathered by int32
 * or int64 indices on the device.
 *
 * The backward is a scatter-add of the output's gradient into the rows that were read. It is
 * deterministic: each element of the weight's gradient is one work-item that adds the
 * positions using its row in increasing order (no atomics), so repeated indices give the same
 * bits on every run and the same order on every backend. The cost is num * dim * n additions
 * and compares, fine for a character vocabulary; a large vocabulary would want the indices
 * sorted first. */
#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

static clpar_status embedding_backward(clpar_node *node, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *w = node->inputs[0], *idx = node->saved[0], *dw = NULL;
  clpar_device *dev = node->dev;
  size_t num = (size_t)w->shape[0], dim = (size_t)w->shape[1];
  clpar_status s = clpar_tensor_empty(dev, 2, w->shape, &dw);
  if (s == CLPAR_OK)
    s = clpar_dev_embedding_backward(dev, (size_t)idx->numel, num, dim, idx->dtype == CLPAR_INT64,
                                     clpar_tensor_bref(idx), clpar_tensor_bref(g),
                                     clpar_tensor_bref(dw));
  if (s != CLPAR_OK) {
    if (dw) clpar_device_fail(dev, s);
    clpar_tensor_free(dw);
    return s;
  }
  gin[0] = dw;
  return CLPAR_OK;
}

static clpar_status embedding_check(const clpar_tensor *idx, const clpar_tensor *w) {
  const char *fn = "clpar_embedding";
  clpar_status s = clpar_check_alive(fn, idx);
  if (s == CLPAR_OK) s = clpar_check_float(fn, "weight", w);
  if (s != CLPAR_OK) return s;
  char a[128], b[128];
  if (idx->dtype != CLPAR_INT32 && idx->dtype != CLPAR_INT64)
    return clpar_set_error(CLPAR_ERROR_DTYPE, "%s: indices are %s; need int32 or int64", fn,
                           clpar_dtype_name(idx->dtype));
  if (w->ndim != 2)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s: weight is %s; need [num, dim]", fn,
                           SHAPE(w, a));
  if (idx->ndim >= CLPAR_MAX_DIMS)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: indices are %s; the result would have more than %d dimensions", fn,
                           SHAPE(idx, a), CLPAR_MAX_DIMS);
  if (idx->storage->dev != w->storage->dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH,
                           "%s: indices %s on %s and weight %s on %s; move one with "
                           "clpar_tensor_to",
                           fn, SHAPE(idx, a), idx->storage->dev->bd.info.id, SHAPE(w, b),
                           w->storage->dev->bd.info.id);
  return CLPAR_OK;
}

clpar_status clpar_embedding(const clpar_tensor *indices, const clpar_tensor *weight,
                             clpar_tensor **out) {
  if (!indices || !weight || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_embedding: NULL argument");
  clpar_status s = embedding_check(indices, weight);
  if (s != CLPAR_OK) return s;
  clpar_device *dev = weight->storage->dev;
  int64_t shape[CLPAR_MAX_DIMS];
  for (int d = 0; d < indices->ndim; d++) shape[d] = indices->shape[d];
  shape[indices->ndim] = weight->shape[1];
  clpar_tensor *y = NULL, *idx = NULL;
  s = clpar_tensor_empty(dev, indices->ndim + 1, shape, &y);
  if (s == CLPAR_OK)
    s = clpar_dev_embedding(dev, (size_t)indices->numel, (size_t)weight->shape[0],
                            (size_t)weight->shape[1], indices->dtype == CLPAR_INT64,
                            clpar_tensor_bref(indices), clpar_tensor_bref(weight),
                            clpar_tensor_bref(y));
  if (s == CLPAR_OK) s = clpar_tensor_alias(indices, &idx);
  if (s != CLPAR_OK) {
    if (y) clpar_device_fail(dev, s);
    clpar_tensor_free(y);
    return s;
  }
  clpar_tensor *in = (clpar_tensor *)weight;
  return clpar_record_op_keep(y, "clpar_embedding", embedding_backward, &in, 1, NULL, &idx, 1, NULL,
                              out);
}

static clpar_status embedding_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                      void *user) {
  (void)user;
  return clpar_embedding(x, clpar_module_parameter(self, "weight"), y);
}

/* nn.Embedding's initialization: weight standard normal. */
clpar_status clpar_embedding_create(int64_t num_embeddings, int64_t embedding_dim,
                                    clpar_device *dev, clpar_module **out) {
  const char *fn = "clpar_embedding_create";
  if (num_embeddings < 1 || embedding_dim < 1 || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: num_embeddings and embedding_dim must be >= 1 (got %lld, %lld)", fn,
                           (long long)num_embeddings, (long long)embedding_dim);
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_init first", fn);
  if (!dev) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: device is NULL", fn);
  int64_t ws[2] = {num_embeddings, embedding_dim}, numel;
  clpar_status s = clpar_check_size(fn, dev, 2, ws, &numel);
  if (s != CLPAR_OK) return s;
  clpar_module *m = NULL;
  clpar_tensor *w = NULL;
  s = clpar_module_create("Embedding", embedding_forward, NULL, NULL, &m);
  if (s == CLPAR_OK) s = clpar_tensor_rand_normal(dev, 2, ws, clpar_param_seed_next(), 0, 1, &w);
  if (s == CLPAR_OK) s = clpar_module_add_parameter(m, "weight", w);
  clpar_tensor_free(w);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}
