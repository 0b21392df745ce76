/* pool.c — max pooling (F.max_pool2d, backward through the argmax) and adaptive average
 * pooling (F.adaptive_avg_pool2d), and the modules nn.MaxPool2d, nn.AdaptiveAvgPool2d and
 * nn.Flatten. Inputs are [N, C, H, W] or [C, H, W]: every H x W plane is pooled alike. The
 * argmax of each output (its position y * W + x in the plane) is kept as an int32 in a buffer
 * from the device's cache, held by the backward's node. */
#include <stdlib.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

_Static_assert(sizeof(int32_t) == sizeof(float), "argmax indices sit in 4-byte elements");

/* x is [N, C, H, W] or [C, H, W]; planes = numel / (H W). */
static clpar_status check_image(const char *fn, const clpar_tensor *x, clpar_tensor **out) {
  if (!x || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  clpar_status s = clpar_check_alive(fn, x);
  if (s == CLPAR_OK) s = clpar_check_float(fn, "input", x);
  if (s != CLPAR_OK) return s;
  char a[128];
  if (x->ndim != 3 && x->ndim != 4)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: input is %s; need [N, C, H, W] or [C, H, W]", fn, SHAPE(x, a));
  return CLPAR_OK;
}

/* The output: x's shape with the last two dimensions oh, ow. */
static clpar_status pooled(clpar_device *dev, clpar_dtype dtype, const clpar_tensor *x, int64_t oh,
                           int64_t ow, clpar_tensor **out) {
  int64_t shape[4];
  for (int i = 0; i < x->ndim - 2; i++) shape[i] = x->shape[i];
  shape[x->ndim - 2] = oh;
  shape[x->ndim - 1] = ow;
  return clpar_tensor_empty_dtype(dev, dtype, x->ndim, shape, out);
}

static clpar_conv_geom node_geom(const clpar_node *n) {
  return *(const clpar_conv_geom *)n->ctx;
}

static clpar_status max_pool_backward(clpar_node *node, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *x = node->inputs[0], *r;
  clpar_device *dev = node->dev;
  clpar_status s = clpar_tensor_empty(dev, x->ndim, x->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_maxpool_backward(dev, node_geom(node), clpar_tensor_bref(g),
                                 clpar_tensor_bref(node->saved[0]), clpar_tensor_bref(r));
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(r);
    return s;
  }
  gin[0] = r;
  return CLPAR_OK;
}

/* Allocates nothing before every check passed; the node owns the geometry and the argmax. */
clpar_status clpar_max_pool2d(const clpar_tensor *x, const int64_t kernel[2],
                              const int64_t stride[2], const int64_t padding[2],
                              clpar_tensor **out) {
  const char *fn = "clpar_max_pool2d";
  if (out && clpar_autocast_takes(fn, x)) { /* in float32, the result in x's dtype */
    clpar_tensor *x32, *y = NULL;
    clpar_status s = clpar_autocast_widen(x, &x32);
    if (s == CLPAR_OK) s = clpar_max_pool2d(x32, kernel, stride, padding, &y);
    return clpar_autocast_round(s, x32, y, x->dtype, out);
  }
  clpar_status s = check_image(fn, x, out);
  if (s != CLPAR_OK) return s;
  if (!kernel) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: kernel is NULL", fn);
  int64_t k[2] = {kernel[0], kernel[1]}, st[2] = {k[0], k[1]}, pd[2] = {0, 0};
  if (stride) st[0] = stride[0], st[1] = stride[1];
  if (padding) pd[0] = padding[0], pd[1] = padding[1];
  char a[128];
  for (int i = 0; i < 2; i++)
    if (k[i] < 1 || st[i] < 1 || pd[i] < 0 || pd[i] > k[i] / 2)
      return clpar_set_error(
          CLPAR_ERROR_INVALID_ARGUMENT,
          "%s: kernel (%lld, %lld) and stride (%lld, %lld) must be >= 1, padding "
          "(%lld, %lld) between 0 and half the kernel",
          fn, (long long)k[0], (long long)k[1], (long long)st[0], (long long)st[1],
          (long long)pd[0], (long long)pd[1]);
  int64_t h = x->shape[x->ndim - 2], w = x->shape[x->ndim - 1];
  if (k[0] > h + 2 * pd[0] || k[1] > w + 2 * pd[1])
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: input is %s; the kernel %lldx%lld is larger than the padded input "
                           "%lldx%lld",
                           fn, SHAPE(x, a), (long long)k[0], (long long)k[1],
                           (long long)(h + 2 * pd[0]), (long long)(w + 2 * pd[1]));
  clpar_conv_geom g = {x->numel / (h * w),
                       1,
                       h,
                       w,
                       h * w,
                       k[0],
                       k[1],
                       st[0],
                       st[1],
                       pd[0],
                       pd[1],
                       1,
                       1,
                       (h + 2 * pd[0] - k[0]) / st[0] + 1,
                       (w + 2 * pd[1] - k[1]) / st[1] + 1};
  clpar_conv_geom *ctx = malloc(sizeof *ctx);
  if (!ctx) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  *ctx = g;
  clpar_device *dev = x->storage->dev;
  clpar_tensor *y = NULL, *idx = NULL;
  s = pooled(dev, CLPAR_FLOAT32, x, g.oh, g.ow, &y);
  if (s == CLPAR_OK) s = pooled(dev, CLPAR_INT32, x, g.oh, g.ow, &idx); /* the argmax */
  if (s == CLPAR_OK)
    s = clpar_dev_maxpool(dev, g, clpar_tensor_bref(x), clpar_tensor_bref(y),
                          clpar_tensor_bref(idx));
  if (s != CLPAR_OK) {
    if (idx) clpar_device_fail(dev, s);
    clpar_tensor_free(y);
    clpar_tensor_free(idx);
    free(ctx);
    return s;
  }
  return clpar_record_op_keep(y, fn, max_pool_backward, (clpar_tensor **)&x, 1, ctx, &idx, 1, NULL,
                              out);
}

static clpar_status adaptive_backward(clpar_node *node, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *x = node->inputs[0], *r;
  clpar_device *dev = node->dev;
  clpar_status s = clpar_tensor_empty(dev, x->ndim, x->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_avgpool_backward(dev, node_geom(node), clpar_tensor_bref(g), clpar_tensor_bref(r));
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(r);
    return s;
  }
  gin[0] = r;
  return CLPAR_OK;
}

clpar_status clpar_adaptive_avg_pool2d(const clpar_tensor *x, int64_t out_h, int64_t out_w,
                                       clpar_tensor **out) {
  const char *fn = "clpar_adaptive_avg_pool2d";
  if (out && clpar_autocast_takes(fn, x)) { /* in float32, the result in x's dtype */
    clpar_tensor *x32, *y = NULL;
    clpar_status s = clpar_autocast_widen(x, &x32);
    if (s == CLPAR_OK) s = clpar_adaptive_avg_pool2d(x32, out_h, out_w, &y);
    return clpar_autocast_round(s, x32, y, x->dtype, out);
  }
  clpar_status s = check_image(fn, x, out);
  if (s != CLPAR_OK) return s;
  char a[128];
  if (out_h < 1 || out_w < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: input is %s; the output size %lldx%lld must be >= 1", fn,
                           SHAPE(x, a), (long long)out_h, (long long)out_w);
  int64_t h = x->shape[x->ndim - 2], w = x->shape[x->ndim - 1];
  clpar_conv_geom g = {x->numel / (h * w), 1, h, w, h * w, 1, 1, 1, 1, 0, 0, 1, 1, out_h, out_w};
  clpar_conv_geom *ctx = malloc(sizeof *ctx);
  if (!ctx) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  *ctx = g;
  clpar_device *dev = x->storage->dev;
  clpar_tensor *y = NULL;
  s = pooled(dev, CLPAR_FLOAT32, x, out_h, out_w, &y);
  if (s == CLPAR_OK) s = clpar_dev_avgpool(dev, g, clpar_tensor_bref(x), clpar_tensor_bref(y));
  if (s != CLPAR_OK) {
    if (y) clpar_device_fail(dev, s);
    clpar_tensor_free(y);
    free(ctx);
    return s;
  }
  return clpar_record_op_keep(y, fn, adaptive_backward, (clpar_tensor **)&x, 1, ctx, NULL, 0, NULL,
                              out);
}

/* ---- modules ---- */

typedef struct {
  int64_t kernel[2], stride[2], padding[2];
} pool_args;

static clpar_status max_pool_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                     void *user) {
  (void)self;
  const pool_args *a = user;
  return clpar_max_pool2d(x, a->kernel, a->stride, a->padding, y);
}

clpar_status clpar_max_pool2d_create(const int64_t kernel[2], const int64_t stride[2],
                                     const int64_t padding[2], clpar_module **out) {
  const char *fn = "clpar_max_pool2d_create";
  if (!kernel || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: kernel or out is NULL", fn);
  pool_args a = {{kernel[0], kernel[1]}, {kernel[0], kernel[1]}, {0, 0}};
  if (stride) a.stride[0] = stride[0], a.stride[1] = stride[1];
  if (padding) a.padding[0] = padding[0], a.padding[1] = padding[1];
  for (int i = 0; i < 2; i++)
    if (a.kernel[i] < 1 || a.stride[i] < 1 || a.padding[i] < 0 || a.padding[i] > a.kernel[i] / 2)
      return clpar_set_error(
          CLPAR_ERROR_INVALID_ARGUMENT,
          "%s: kernel (%lld, %lld) and stride (%lld, %lld) must be >= 1, padding "
          "(%lld, %lld) between 0 and half the kernel",
          fn, (long long)a.kernel[0], (long long)a.kernel[1], (long long)a.stride[0],
          (long long)a.stride[1], (long long)a.padding[0], (long long)a.padding[1]);
  pool_args *user = malloc(sizeof *user);
  if (!user) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  *user = a;
  clpar_status s = clpar_module_create("MaxPool2d", max_pool_forward, user, free, out);
  if (s != CLPAR_OK) free(user);
  return s;
}

static clpar_status adaptive_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                     void *user) {
  (void)self;
  const int64_t *size = user;
  return clpar_adaptive_avg_pool2d(x, size[0], size[1], y);
}

clpar_status clpar_adaptive_avg_pool2d_create(int64_t out_h, int64_t out_w, clpar_module **out) {
  const char *fn = "clpar_adaptive_avg_pool2d_create";
  if (out_h < 1 || out_w < 1 || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: output size %lldx%lld must be >= 1 and out non-NULL", fn,
                           (long long)out_h, (long long)out_w);
  int64_t *user = malloc(2 * sizeof *user);
  if (!user) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  user[0] = out_h;
  user[1] = out_w;
  clpar_status s = clpar_module_create("AdaptiveAvgPool2d", adaptive_forward, user, free, out);
  if (s != CLPAR_OK) free(user);
  return s;
}

/* nn.Flatten: dimensions start..end (negative: from the end) merged; a reshape of the
 * contiguous input, which is differentiable and copies nothing. */
static clpar_status flatten_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                    void *user) {
  (void)self;
  const int *dims = user;
  const char *fn = "Flatten";
  if (!x || !y) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  int nd = x->ndim, start = dims[0] < 0 ? dims[0] + nd : dims[0];
  int end = dims[1] < 0 ? dims[1] + nd : dims[1];
  char a[128];
  if (start < 0 || end >= nd || start > end)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: start_dim %d and end_dim %d do not fit the input %s", fn, dims[0],
                           dims[1], SHAPE(x, a));
  int64_t shape[CLPAR_MAX_DIMS], merged = 1;
  int k = 0;
  for (int i = 0; i < start; i++) shape[k++] = x->shape[i];
  for (int i = start; i <= end; i++) merged *= x->shape[i];
  shape[k++] = merged;
  for (int i = end + 1; i < nd; i++) shape[k++] = x->shape[i];
  return clpar_tensor_reshape(x, k, shape, y);
}

clpar_status clpar_flatten_create(int start_dim, int end_dim, clpar_module **out) {
  if (!out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_flatten_create: out is NULL");
  int *user = malloc(2 * sizeof *user);
  if (!user)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_flatten_create: out of host memory");
  user[0] = start_dim;
  user[1] = end_dim;
  clpar_status s = clpar_module_create("Flatten", flatten_forward, user, free, out);
  if (s != CLPAR_OK) free(user);
  return s;
}
