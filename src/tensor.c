/* tensor.c — tensor creation, views, reference counting, transfers between host and devices.
 * A tensor is a shape over a range of a reference-counted storage (one device buffer); views
 * of rows share the storage, so chunks along dim 0 cost no copy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

clpar_status clpar_check_shape(const char *fn, int ndim, const int64_t *shape, int64_t *numel) {
  if (ndim < 1 || ndim > CLPAR_MAX_DIMS)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: ndim is %d, must be 1..%d", fn, ndim,
                           CLPAR_MAX_DIMS);
  if (!shape) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: shape is NULL", fn);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1)
      return clpar_set_error(CLPAR_ERROR_EMPTY,
                             "%s: dimension %d is %lld; every dimension must be >= 1", fn, i,
                             (long long)shape[i]);
    if (n > INT64_MAX / 8 / shape[i]) /* bytes of any dtype fit an int64 */
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: the shape has too many elements", fn);
    n *= shape[i];
  }
  *numel = n;
  return CLPAR_OK;
}

clpar_status clpar_check_size(const char *fn, const clpar_device *dev, int ndim,
                              const int64_t *shape, int64_t *numel) {
  clpar_status s = clpar_check_shape(fn, ndim, shape, numel);
  if (s != CLPAR_OK) return s;
  uint64_t bytes = (uint64_t)*numel * sizeof(float); /* < INT64_MAX: checked above */
  if (bytes > dev->bd.info.max_alloc_bytes)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                           "%s: %lld elements (%llu bytes) do not fit one buffer of %s (at most "
                           "%llu bytes)",
                           fn, (long long)*numel, (unsigned long long)bytes, dev->bd.info.id,
                           (unsigned long long)dev->bd.info.max_alloc_bytes);
  return CLPAR_OK;
}

static clpar_status check_device(const char *fn, const clpar_device *dev) {
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_init first", fn);
  if (!dev) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: device is NULL", fn);
  return CLPAR_OK;
}

size_t clpar_dtype_size(clpar_dtype dtype) {
  switch (dtype) {
    case CLPAR_FLOAT32:
    case CLPAR_INT32:
      return 4;
    case CLPAR_INT64:
      return 8;
    case CLPAR_BFLOAT16:
    case CLPAR_FLOAT16:
      return 2;
  }
  return 0;
}

const char *clpar_dtype_name(clpar_dtype dtype) {
  switch (dtype) {
    case CLPAR_FLOAT32:
      return "float32";
    case CLPAR_INT32:
      return "int32";
    case CLPAR_INT64:
      return "int64";
    case CLPAR_BFLOAT16:
      return "bfloat16";
    case CLPAR_FLOAT16:
      return "float16";
  }
  return "unknown";
}

static clpar_status check_dtype(const char *fn, clpar_dtype dtype) {
  if (clpar_dtype_size(dtype)) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: dtype %d is not a clpar_dtype", fn,
                         (int)dtype);
}

clpar_status clpar_check_float(const char *fn, const char *name, const clpar_tensor *t) {
  if (t->dtype == CLPAR_FLOAT32) return CLPAR_OK;
  char buf[128];
  return clpar_set_error(CLPAR_ERROR_DTYPE, "%s: %s is %s %s; the operation needs float32", fn,
                         name, clpar_dtype_name(t->dtype),
                         clpar_tensor_shape_str(t, buf, sizeof buf));
}

static clpar_tensor *tensor_alloc(clpar_storage *st, size_t offset, clpar_dtype dtype, int ndim,
                                  const int64_t *shape) {
  clpar_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->magic = CLPAR_TENSOR_LIVE;
  t->refcount = 1;
  t->storage = st;
  t->offset = offset;
  t->dtype = dtype;
  t->ndim = ndim;
  t->numel = 1;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    t->numel *= shape[i];
  }
  clpar_debug_tensor_made();
  return t;
}

/* A tensor that outlived clpar_shutdown has no memory left: only freeing it is allowed. */
clpar_status clpar_check_alive(const char *fn, const clpar_tensor *t) {
  if (t->magic != CLPAR_TENSOR_LIVE) return clpar_debug_freed_error(fn, t);
  if (t->storage->dev) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                         "%s: the tensor outlived clpar_shutdown; it can only be freed", fn);
}

clpar_status clpar_tensor_empty(clpar_device *dev, int ndim, const int64_t *shape,
                                clpar_tensor **out) {
  return clpar_tensor_empty_dtype(dev, CLPAR_FLOAT32, ndim, shape, out);
}

clpar_status clpar_tensor_empty_dtype(clpar_device *dev, clpar_dtype dtype, int ndim,
                                      const int64_t *shape, clpar_tensor **out) {
  /* A 0-d tensor (shape [], one element) only of an int dtype: a counter such as BatchNorm's
   * num_batches_tracked, which PyTorch keeps 0-d. Float tensors keep 1..8 dimensions, so no
   * math op meets a tensor without one. */
  int64_t numel = 1;
  clpar_status s = ndim == 0 && dtype != CLPAR_FLOAT32
                       ? CLPAR_OK
                       : clpar_check_shape("tensor", ndim, shape, &numel);
  if (s != CLPAR_OK) return s;
  clpar_storage *st;
  /* whole words: a 16-bit tensor of odd numel is rounded up */
  size_t bytes = (size_t)numel * clpar_dtype_size(dtype);
  s = clpar_storage_new(dev, (bytes + CLPAR_WORD_BYTES - 1) & ~(size_t)(CLPAR_WORD_BYTES - 1), &st);
  if (s != CLPAR_OK) return s;
  clpar_tensor *t = tensor_alloc(st, 0, dtype, ndim, shape);
  if (!t) {
    clpar_storage_release(st);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  }
  clpar_scope_adopt(t);
  *out = t;
  return CLPAR_OK;
}

/* A freed tensor passed to fn where no status can be returned: logged, and left alone. */
static int freed_handle(const char *fn, const clpar_tensor *t) {
  if (t->magic == CLPAR_TENSOR_LIVE) return 0;
  clpar_debug_freed_error(fn, t);
  clpar_log(CLPAR_LOG_ERROR, "%s; ignored", clpar_last_error());
  return 1;
}

clpar_tensor *clpar_tensor_retain(clpar_tensor *t) {
  if (t && freed_handle("clpar_tensor_retain", t)) return NULL;
  if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
  return t;
}

void clpar_tensor_release(clpar_tensor *t) {
  if (t && __atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    if (t->flat) { /* a flattened parameter leaves its group */
      __atomic_sub_fetch(&t->flat->flat_members, 1, __ATOMIC_RELAXED);
      clpar_tensor_release(t->flat);
    }
    clpar_node_release(t->node);
    clpar_tensor_free(t->grad);
    clpar_storage_release(t->storage);
    clpar_debug_discard(t);
  }
}

void clpar_tensor_free(clpar_tensor *t) {
  if (!t || freed_handle("clpar_tensor_free", t)) return;
  clpar_scope_forget(t); /* the caller takes over the scope's reference, then drops it */
  clpar_tensor_release(t);
}

void clpar_tensor_unscope(clpar_tensor *t) {
  clpar_scope_forget(t);
}

/* Uploads host data into a fresh tensor; on failure nothing is left behind. */
static clpar_status upload_new(clpar_device *dev, clpar_dtype dtype, int ndim, const int64_t *shape,
                               const void *data, clpar_tensor **out) {
  clpar_tensor *t;
  clpar_status s = clpar_tensor_empty_dtype(dev, dtype, ndim, shape, &t);
  if (s != CLPAR_OK) return s;
  s = clpar_upload(dev, t->storage->buf, 0, data, clpar_tensor_bytes(t));
  if (s != CLPAR_OK) {
    clpar_tensor_free(t);
    return s;
  }
  *out = t;
  return CLPAR_OK;
}

static clpar_status zeros(const char *fn, clpar_device *dev, clpar_dtype dtype, int ndim,
                          const int64_t *shape, clpar_tensor **out) {
  clpar_status s = check_device(fn, dev);
  if (s == CLPAR_OK) s = check_dtype(fn, dtype);
  if (s != CLPAR_OK) return s;
  if (!out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  clpar_tensor *t;
  s = clpar_tensor_empty_dtype(dev, dtype, ndim, shape, &t);
  if (s != CLPAR_OK) return s;
  /* +0.0f is all zero bits: it zeroes the words of any dtype */
  s = clpar_dev_fill(dev, clpar_tensor_bref(t), clpar_tensor_words(t), 0.0f);
  if (s != CLPAR_OK) {
    clpar_tensor_free(t);
    return s;
  }
  *out = t;
  return CLPAR_OK;
}

clpar_status clpar_tensor_zeros(clpar_device *dev, int ndim, const int64_t *shape,
                                clpar_tensor **out) {
  return zeros("clpar_tensor_zeros", dev, CLPAR_FLOAT32, ndim, shape, out);
}

clpar_status clpar_tensor_zeros_dtype(clpar_device *dev, clpar_dtype dtype, int ndim,
                                      const int64_t *shape, clpar_tensor **out) {
  return zeros("clpar_tensor_zeros_dtype", dev, dtype, ndim, shape, out);
}

static clpar_status from_host(const char *fn, clpar_device *dev, clpar_dtype dtype, int ndim,
                              const int64_t *shape, const void *data, clpar_tensor **out) {
  clpar_status s = check_device(fn, dev);
  if (s == CLPAR_OK) s = check_dtype(fn, dtype);
  if (s != CLPAR_OK) return s;
  if (!data || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL data or out", fn);
  return upload_new(dev, dtype, ndim, shape, data, out);
}

clpar_status clpar_tensor_from_host(clpar_device *dev, int ndim, const int64_t *shape,
                                    const float *data, clpar_tensor **out) {
  return from_host("clpar_tensor_from_host", dev, CLPAR_FLOAT32, ndim, shape, data, out);
}

clpar_status clpar_tensor_from_host_dtype(clpar_device *dev, clpar_dtype dtype, int ndim,
                                          const int64_t *shape, const void *data,
                                          clpar_tensor **out) {
  return from_host("clpar_tensor_from_host_dtype", dev, dtype, ndim, shape, data, out);
}

/* Allocates the tensor first (so that a size the device cannot hold fails before any work),
 * then fills it from the counter-based generator a block at a time, so that host memory stays
 * small whatever the tensor's size. */
static clpar_status rand_tensor(const char *fn, clpar_device *dev, int ndim, const int64_t *shape,
                                uint64_t seed, int normal, float a, float b, clpar_tensor **out) {
  enum { BLOCK = 1 << 20 }; /* floats: 4 MiB, one staging chunk (src/runtime/transfer.c) */
  clpar_status s = check_device(fn, dev);
  if (s != CLPAR_OK) return s;
  if (!out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  int64_t numel;
  s = clpar_check_size(fn, dev, ndim, shape, &numel);
  if (s != CLPAR_OK) return s;
  clpar_tensor *t;
  s = clpar_tensor_empty(dev, ndim, shape, &t);
  if (s != CLPAR_OK) return s;
  float *host = malloc((size_t)(numel < BLOCK ? numel : BLOCK) * sizeof *host);
  if (!host) s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  for (int64_t at = 0; s == CLPAR_OK && at < numel; at += BLOCK) {
    int64_t n = numel - at < BLOCK ? numel - at : BLOCK;
    for (int64_t j = 0; j < n; j++) {
      uint64_t i = (uint64_t)(at + j);
      if (!normal) {
        host[j] = a + (b - a) * clpar_rng_uniform01(seed, i);
        continue;
      }
      /* Box-Muller on two streams of the same counter; 1 - u keeps the log finite. */
      float u1 = 1.0f - clpar_rng_uniform01(seed, 2 * i);
      float u2 = clpar_rng_uniform01(seed, 2 * i + 1);
      host[j] = a + b * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795865f * u2);
    }
    s = clpar_upload(dev, t->storage->buf, (size_t)at * sizeof(float), host,
                     (size_t)n * sizeof(float));
  }
  free(host);
  if (s != CLPAR_OK) {
    clpar_tensor_free(t);
    return s;
  }
  *out = t;
  return CLPAR_OK;
}

clpar_status clpar_tensor_rand_uniform(clpar_device *dev, int ndim, const int64_t *shape,
                                       uint64_t seed, float lo, float hi, clpar_tensor **out) {
  return rand_tensor("clpar_tensor_rand_uniform", dev, ndim, shape, seed, 0, lo, hi, out);
}

clpar_status clpar_tensor_rand_normal(clpar_device *dev, int ndim, const int64_t *shape,
                                      uint64_t seed, float mean, float std, clpar_tensor **out) {
  return rand_tensor("clpar_tensor_rand_normal", dev, ndim, shape, seed, 1, mean, std, out);
}

clpar_status clpar_tensor_read(const clpar_tensor *t, float *dst, size_t dst_count) {
  if (!t || !dst)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_tensor_read: NULL argument");
  clpar_status alive = clpar_check_alive("clpar_tensor_read", t);
  if (alive != CLPAR_OK) return alive;
  if (t->dtype != CLPAR_FLOAT32) {
    clpar_check_float("clpar_tensor_read", "the tensor", t);
    clpar_append_error(" (clpar_tensor_read_raw reads any dtype)");
    return CLPAR_ERROR_DTYPE;
  }
  if (dst_count < (size_t)t->numel)
    return clpar_set_error(CLPAR_ERROR_BUFFER_TOO_SMALL,
                           "clpar_tensor_read: the tensor has %lld elements, the buffer holds %zu",
                           (long long)t->numel, dst_count);
  return clpar_download(t->storage->dev, t->storage->buf, t->offset * sizeof(float), dst,
                        (size_t)t->numel * sizeof(float));
}

clpar_status clpar_tensor_write(clpar_tensor *t, const float *src, size_t src_count) {
  if (!t || !src)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_tensor_write: NULL argument");
  clpar_status alive = clpar_check_alive("clpar_tensor_write", t);
  if (alive != CLPAR_OK) return alive;
  if (t->dtype != CLPAR_FLOAT32) {
    clpar_check_float("clpar_tensor_write", "the tensor", t);
    clpar_append_error(" (clpar_tensor_write_raw writes any dtype)");
    return CLPAR_ERROR_DTYPE;
  }
  if (src_count < (size_t)t->numel)
    return clpar_set_error(CLPAR_ERROR_BUFFER_TOO_SMALL,
                           "clpar_tensor_write: the tensor has %lld elements, the buffer holds %zu",
                           (long long)t->numel, src_count);
  clpar_tensor_touch(t);
  return clpar_upload(t->storage->dev, t->storage->buf, t->offset * sizeof(float), src,
                      (size_t)t->numel * sizeof(float));
}

clpar_status clpar_tensor_read_raw(const clpar_tensor *t, void *dst, size_t dst_bytes) {
  const char *fn = "clpar_tensor_read_raw";
  if (!t || !dst) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  clpar_status alive = clpar_check_alive(fn, t);
  if (alive != CLPAR_OK) return alive;
  if (dst_bytes < clpar_tensor_bytes(t))
    return clpar_set_error(CLPAR_ERROR_BUFFER_TOO_SMALL,
                           "%s: the tensor has %lld elements of %s (%zu bytes), the buffer holds "
                           "%zu bytes",
                           fn, (long long)t->numel, clpar_dtype_name(t->dtype),
                           clpar_tensor_bytes(t), dst_bytes);
  return clpar_download(t->storage->dev, t->storage->buf, t->offset * CLPAR_WORD_BYTES, dst,
                        clpar_tensor_bytes(t));
}

clpar_status clpar_tensor_write_raw(clpar_tensor *t, const void *src, size_t src_bytes) {
  const char *fn = "clpar_tensor_write_raw";
  if (!t || !src) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  clpar_status alive = clpar_check_alive(fn, t);
  if (alive != CLPAR_OK) return alive;
  if (src_bytes < clpar_tensor_bytes(t))
    return clpar_set_error(CLPAR_ERROR_BUFFER_TOO_SMALL,
                           "%s: the tensor has %lld elements of %s (%zu bytes), the buffer holds "
                           "%zu bytes",
                           fn, (long long)t->numel, clpar_dtype_name(t->dtype),
                           clpar_tensor_bytes(t), src_bytes);
  clpar_tensor_touch(t);
  return clpar_upload(t->storage->dev, t->storage->buf, t->offset * CLPAR_WORD_BYTES, src,
                      clpar_tensor_bytes(t));
}

clpar_status clpar_tensor_write_fill(clpar_tensor *t, clpar_fill_fn fill, void *user) {
  clpar_status s = clpar_check_alive("clpar_tensor_write_fill", t);
  if (s != CLPAR_OK) return s;
  clpar_tensor_touch(t);
  return clpar_upload_fill(t->storage->dev, t->storage->buf, t->offset * CLPAR_WORD_BYTES,
                           clpar_tensor_bytes(t), fill, user);
}

/* src broadcasts to dst without repeating an element: the shapes match aligned at their last
 * dimensions, and dst's extra leading dimensions (if any) are 1. */
static int copy_shapes_match(const clpar_tensor *dst, const clpar_tensor *src) {
  if (src->ndim > dst->ndim) return 0;
  int lead = dst->ndim - src->ndim;
  for (int i = 0; i < dst->ndim; i++)
    if (dst->shape[i] != (i < lead ? 1 : src->shape[i - lead])) return 0;
  return 1;
}

clpar_status clpar_copy(clpar_tensor *dst, const clpar_tensor *src) {
  if (!dst || !src) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_copy: NULL tensor");
  clpar_status alive = clpar_check_alive("clpar_copy", dst);
  if (alive == CLPAR_OK) alive = clpar_check_alive("clpar_copy", src);
  if (alive != CLPAR_OK) return alive;
  if (!copy_shapes_match(dst, src)) {
    char a[128], b[128];
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "clpar_copy: dst is %s, src is %s; src must have dst's shape "
                           "(clpar_tensor_reshape src to %s first to copy its elements in order)",
                           clpar_tensor_shape_str(dst, a, sizeof a),
                           clpar_tensor_shape_str(src, b, sizeof b), a);
  }
  return clpar_copy_elements(dst, src);
}

clpar_status clpar_copy_elements(clpar_tensor *dst, const clpar_tensor *src) {
  char a[128], b[128];
  if (dst->numel != src->numel)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "clpar_copy: dst is %s, src is %s",
                           clpar_tensor_shape_str(dst, a, sizeof a),
                           clpar_tensor_shape_str(src, b, sizeof b));
  if (dst->dtype != src->dtype)
    return clpar_set_error(CLPAR_ERROR_DTYPE, "clpar_copy: dst is %s %s, src is %s %s",
                           clpar_dtype_name(dst->dtype), clpar_tensor_shape_str(dst, a, sizeof a),
                           clpar_dtype_name(src->dtype), clpar_tensor_shape_str(src, b, sizeof b));
  clpar_tensor_touch(dst);
  return clpar_transfer(dst->storage->dev, dst->storage, dst->offset * CLPAR_WORD_BYTES,
                        src->storage->dev, src->storage, src->offset * CLPAR_WORD_BYTES,
                        clpar_tensor_bytes(src));
}

/* A differentiable copy between devices: the gradient goes back to the source's device. */
static clpar_status to_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  return clpar_tensor_to(g, n->inputs[0]->storage->dev, &gin[0]);
}

/* One copy and one node, whatever the two devices: the transfer is posted to their workers
 * and nothing waits (src/runtime/transfer.c). */
clpar_status clpar_tensor_to(const clpar_tensor *t, clpar_device *dev, clpar_tensor **out) {
  clpar_status s = check_device("clpar_tensor_to", dev);
  if (s != CLPAR_OK) return s;
  if (!t || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_tensor_to: NULL argument");
  clpar_tensor *r;
  s = clpar_tensor_empty_dtype(dev, t->dtype, t->ndim, t->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_copy(r, t);
  if (s != CLPAR_OK) {
    clpar_tensor_free(r);
    return s;
  }
  clpar_node *node;
  s = clpar_record_op(r, "clpar_tensor_to", to_backward, (clpar_tensor **)&t, 1, &node);
  if (node) node->transfer = t->storage->dev != dev;
  if (s == CLPAR_OK) *out = r;
  return s;
}

/* clpar_tensor_to in two halves (internal.h). */
struct clpar_tensor_transit {
  clpar_tensor *src; /* retained until finish or cancel */
  clpar_device *dev;
  clpar_transfer_half *half;
};

clpar_status clpar_tensor_to_begin(const clpar_tensor *t, clpar_device *dev,
                                   clpar_tensor_transit **out) {
  clpar_status s = check_device("clpar_tensor_to", dev);
  if (s != CLPAR_OK) return s;
  if (!t || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_tensor_to: NULL argument");
  clpar_status alive = clpar_check_alive("clpar_tensor_to", t);
  if (alive != CLPAR_OK) return alive;
  clpar_tensor_transit *m = calloc(1, sizeof *m);
  if (!m) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  m->src = clpar_tensor_retain((clpar_tensor *)t);
  m->dev = dev;
  s = clpar_transfer_begin(dev, t->storage->dev, t->storage, t->offset * CLPAR_WORD_BYTES,
                           clpar_tensor_bytes(t), &m->half);
  if (s != CLPAR_OK) {
    clpar_tensor_release(m->src);
    free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}

clpar_status clpar_tensor_to_finish(clpar_tensor_transit *m, clpar_tensor **out) {
  const clpar_tensor *t = m->src;
  clpar_tensor *r = NULL;
  clpar_status s = clpar_tensor_empty_dtype(m->dev, t->dtype, t->ndim, t->shape, &r);
  if (s == CLPAR_OK) {
    clpar_tensor_touch(r);
    s = clpar_transfer_finish(m->half, m->dev, r->storage, r->offset * CLPAR_WORD_BYTES);
  } else {
    clpar_transfer_cancel(m->half);
  }
  if (s == CLPAR_OK) {
    clpar_node *node;
    s = clpar_record_op(r, "clpar_tensor_to", to_backward, (clpar_tensor **)&t, 1, &node);
    if (node) node->transfer = t->storage->dev != m->dev;
  }
  if (s == CLPAR_OK)
    *out = r;
  else
    clpar_tensor_free(r);
  clpar_tensor_release(m->src);
  free(m);
  return s;
}

void clpar_tensor_to_cancel(clpar_tensor_transit *m) {
  if (!m) return;
  clpar_transfer_cancel(m->half);
  clpar_tensor_release(m->src);
  free(m);
}

/* A view of t's storage with another offset and shape, registered with the scope. */
static clpar_status make_view(clpar_tensor *t, size_t offset, int ndim, const int64_t *shape,
                              clpar_tensor **out) {
  clpar_tensor *v = tensor_alloc(t->storage, offset, t->dtype, ndim, shape);
  if (!v) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  clpar_storage_retain(t->storage);
  clpar_scope_adopt(v);
  *out = v;
  return CLPAR_OK;
}

clpar_status clpar_tensor_alias(const clpar_tensor *t, clpar_tensor **out) {
  return make_view((clpar_tensor *)t, t->offset, t->ndim, t->shape, out);
}

clpar_status clpar_tensor_view_at(const clpar_tensor *t, size_t offset, int ndim,
                                  const int64_t *shape, clpar_tensor **out) {
  clpar_status s = make_view((clpar_tensor *)t, t->offset + offset, ndim, shape, out);
  if (s == CLPAR_OK) clpar_tensor_unscope(*out);
  return s;
}

void clpar_tensor_repoint(clpar_tensor *t, clpar_storage *st, size_t offset) {
  clpar_storage_retain(st);
  clpar_storage *old = t->storage;
  t->storage = st;
  t->offset = offset;
  clpar_storage_release(old);
}

/* The view's rows of the input get g, added in place into the input's gradient at the rows'
 * offset (a partial node: the engine does the placing, the others rows keep zeros). */
static clpar_status rows_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  (void)n;
  return clpar_tensor_alias(g, &gin[0]);
}

static clpar_status reshape_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  return clpar_tensor_reshape(g, n->inputs[0]->ndim, n->inputs[0]->shape, &gin[0]);
}

clpar_status clpar_tensor_rows(clpar_tensor *t, int64_t start, int64_t count, clpar_tensor **out) {
  if (!t || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_tensor_rows: NULL argument");
  if (count < 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY, "clpar_tensor_rows: count is %lld, must be >= 1",
                           (long long)count);
  if (start < 0 || start > t->shape[0] - count)
    return clpar_set_error(CLPAR_ERROR_INDEX,
                           "clpar_tensor_rows: %lld rows from row %lld of a tensor with %lld rows",
                           (long long)count, (long long)start, (long long)t->shape[0]);
  int64_t shape[CLPAR_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[0] = count;
  int64_t row = t->numel / t->shape[0] * (int64_t)clpar_dtype_words(t->dtype); /* words */
  int64_t at = start * row;
  if (clpar_dtype_is_half(t->dtype)) { /* two elements a word: the view starts at an even one */
    if (at % 2)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "clpar_tensor_rows: row %lld of a %s tensor of rows of %lld elements "
                             "starts at an odd element; views of 16-bit tensors start at even ones",
                             (long long)start, clpar_dtype_name(t->dtype), (long long)row);
    at /= 2;
  }
  clpar_tensor *v = NULL;
  clpar_status s = make_view(t, t->offset + (size_t)at, t->ndim, shape, &v);
  clpar_node *node = NULL;
  if (s == CLPAR_OK) s = clpar_record_op(v, "clpar_tensor_rows", rows_backward, &t, 1, &node);
  if (node) node->partial_offset = at;
  if (s == CLPAR_OK) *out = v;
  return s;
}

/* shape with its one -1 (if any) replaced by what makes numel elements; names fn in errors. */
static clpar_status infer_shape(const char *fn, const clpar_tensor *t, int ndim,
                                const int64_t *shape, int64_t *full) {
  int64_t numel;
  if (ndim < 1 || ndim > CLPAR_MAX_DIMS || !shape)
    return clpar_check_shape(fn, ndim, shape, &numel);
  int free_dim = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    full[i] = shape[i];
    if (shape[i] == -1 && free_dim < 0) {
      free_dim = i;
      continue;
    }
    if (shape[i] == -1)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: dimensions %d and %d are both -1; only one can be inferred", fn,
                             free_dim, i);
    if (shape[i] >= 1 && known <= t->numel) known *= shape[i]; /* stops growing past numel */
  }
  if (free_dim >= 0) {
    char a[128];
    if (known > t->numel || t->numel % known != 0)
      return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                             "%s: %s has %lld elements, which dimension %d (-1) cannot make up "
                             "with the others (product %lld)",
                             fn, clpar_tensor_shape_str(t, a, sizeof a), (long long)t->numel,
                             free_dim, (long long)known);
    full[free_dim] = t->numel / known;
  }
  return CLPAR_OK;
}

/* A view of t with shape (numel checked) and a node that reshapes the gradient back. */
static clpar_status reshape_view(const char *fn, clpar_tensor *t, int ndim, const int64_t *shape,
                                 clpar_tensor **out) {
  int64_t numel;
  clpar_status s = clpar_check_shape(fn, ndim, shape, &numel);
  if (s != CLPAR_OK) return s;
  if (numel != t->numel) {
    char a[128];
    return clpar_set_error(
        CLPAR_ERROR_SHAPE_MISMATCH, "%s: %s has %lld elements, the new shape %lld", fn,
        clpar_tensor_shape_str(t, a, sizeof a), (long long)t->numel, (long long)numel);
  }
  clpar_tensor *v = NULL;
  s = make_view(t, t->offset, ndim, shape, &v);
  clpar_node *node;
  if (s == CLPAR_OK) s = clpar_record_op(v, fn, reshape_backward, &t, 1, &node);
  if (s == CLPAR_OK) *out = v;
  return s;
}

clpar_status clpar_tensor_reshape(clpar_tensor *t, int ndim, const int64_t *shape,
                                  clpar_tensor **out) {
  const char *fn = "clpar_tensor_reshape";
  if (!t || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  int64_t full[CLPAR_MAX_DIMS];
  clpar_status s = infer_shape(fn, t, ndim, shape, full);
  return s == CLPAR_OK ? reshape_view(fn, t, ndim, full, out) : s;
}

clpar_status clpar_tensor_flatten(clpar_tensor *t, int start_dim, int end_dim, clpar_tensor **out) {
  const char *fn = "clpar_tensor_flatten";
  if (!t || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  int a = start_dim < 0 ? start_dim + t->ndim : start_dim;
  int b = end_dim < 0 ? end_dim + t->ndim : end_dim;
  char buf[128];
  if (a < 0 || a >= t->ndim || b < 0 || b >= t->ndim || a > b)
    return clpar_set_error(CLPAR_ERROR_INDEX,
                           "%s: start_dim %d and end_dim %d for %s (%d dimensions); need "
                           "-%d <= start_dim <= end_dim < %d after counting negatives from the end",
                           fn, start_dim, end_dim, clpar_tensor_shape_str(t, buf, sizeof buf),
                           t->ndim, t->ndim, t->ndim);
  int64_t shape[CLPAR_MAX_DIMS];
  int n = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (i <= a || i > b)
      shape[n++] = t->shape[i];
    else
      shape[n - 1] *= t->shape[i];
  }
  return reshape_view(fn, t, n, shape, out);
}

clpar_status clpar_tensor_move(clpar_tensor *t, clpar_device *dev) {
  if (t->node)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "moving a tensor in place: it is the result of %s, not a leaf",
                           t->node->op);
  if (t->flat) { /* a flattened parameter: its whole flat group moves, then it follows */
    clpar_tensor *f = t->flat;
    size_t at = t->offset - f->offset, grad_at = t->grad ? t->grad->offset - f->grad->offset : 0;
    clpar_status s = clpar_tensor_move(f, dev);
    if (s != CLPAR_OK) return s;
    if (t->storage != f->storage) clpar_tensor_repoint(t, f->storage, f->offset + at);
    if (t->grad && t->grad->storage != f->grad->storage)
      clpar_tensor_repoint(t->grad, f->grad->storage, f->grad->offset + grad_at);
    return CLPAR_OK;
  }
  if (t->storage->dev == dev) return CLPAR_OK;
  int was = clpar_set_grad_enabled(0);
  clpar_tensor *moved = NULL, *grad = NULL;
  clpar_status s = clpar_tensor_to(t, dev, &moved);
  if (s == CLPAR_OK && t->grad) s = clpar_tensor_to(t->grad, dev, &grad);
  clpar_set_grad_enabled(was);
  if (s != CLPAR_OK) {
    clpar_tensor_free(moved);
    return s;
  }
  clpar_tensor_unscope(moved);
  clpar_tensor_unscope(grad);
  /* Swap the storages: t takes moved's memory, moved takes t's old one and frees it. */
  clpar_storage *old = t->storage;
  clpar_storage_tag(moved->storage, old->category); /* a parameter stays one */
  if (grad) clpar_storage_tag(grad->storage, CLPAR_MEM_GRADIENTS);
  t->storage = moved->storage;
  t->offset = 0;
  moved->storage = old;
  clpar_tensor_free(moved);
  clpar_tensor_free(t->grad);
  t->grad = grad;
  return CLPAR_OK;
}

int clpar_tensor_ndim(const clpar_tensor *t) {
  return t ? t->ndim : 0;
}

int64_t clpar_tensor_dim(const clpar_tensor *t, int i) {
  if (!t) return 0;
  if (i < 0) i += t->ndim;
  return (i >= 0 && i < t->ndim) ? t->shape[i] : 0;
}

int64_t clpar_tensor_numel(const clpar_tensor *t) {
  return t ? t->numel : 0;
}

clpar_dtype clpar_tensor_dtype(const clpar_tensor *t) {
  return t ? t->dtype : CLPAR_FLOAT32;
}

clpar_device *clpar_tensor_device(const clpar_tensor *t) {
  return t ? t->storage->dev : NULL;
}

int64_t clpar_tensor_rows_of(const clpar_tensor *t) {
  return t->ndim >= 1 ? t->shape[0] : 1;
}

char *clpar_tensor_shape_str(const clpar_tensor *t, char *buf, size_t size) {
  if (!buf || size == 0) return buf;
  if (!t) {
    snprintf(buf, size, "(null)");
    return buf;
  }
  size_t used = (size_t)snprintf(buf, size, "[");
  for (int i = 0; i < t->ndim && used < size; i++)
    used +=
        (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (used < size) snprintf(buf + used, size - used, "]");
  return buf;
}
