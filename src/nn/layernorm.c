/* layernorm.c — F.layer_norm over the last dimension and nn.LayerNorm (with or without bias).
 *
 * Forward: one pass per row gives the mean, the reciprocal standard deviation (biased
 * variance from squared deviations, as torch) and y; the node keeps mean and rstd. Backward:
 * one pass per row gives dx, one per column dw (sum of g xhat) and db (sum of g). */
#include <stdlib.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

static clpar_bref opt_ref(const clpar_tensor *t) {
  clpar_bref r = {NULL, 0};
  return t ? clpar_tensor_bref(t) : r;
}

static clpar_status ln_backward(clpar_node *node, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *x = node->inputs[0], *w = node->inputs[1], *b = node->inputs[2];
  clpar_tensor *mean = node->saved[0], *rstd = node->saved[1];
  clpar_device *dev = node->dev;
  int64_t cols = x->shape[x->ndim - 1];
  size_t rows = (size_t)(x->numel / cols);
  clpar_tensor *dx = NULL, *dw = NULL, *db = NULL;
  clpar_status s = CLPAR_OK;
  if (x->requires_grad) s = clpar_tensor_empty(dev, x->ndim, x->shape, &dx);
  if (s == CLPAR_OK && w && w->requires_grad) s = clpar_tensor_empty(dev, 1, &cols, &dw);
  if (s == CLPAR_OK && b && b->requires_grad) s = clpar_tensor_empty(dev, 1, &cols, &db);
  if (s == CLPAR_OK)
    s = clpar_dev_layernorm_backward(dev, rows, (size_t)cols, clpar_tensor_bref(x),
                                     clpar_tensor_bref(g), clpar_tensor_bref(mean),
                                     clpar_tensor_bref(rstd), opt_ref(w), opt_ref(dx), opt_ref(dw),
                                     opt_ref(db));
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(dx), clpar_tensor_free(dw), clpar_tensor_free(db);
    return s;
  }
  gin[0] = dx;
  gin[1] = dw;
  gin[2] = db;
  return CLPAR_OK;
}

/* A float [cols] tensor on x's device, or NULL. */
static clpar_status check_affine(const char *name, const clpar_tensor *t, const clpar_tensor *x) {
  const char *fn = "clpar_layer_norm";
  if (!t) return CLPAR_OK;
  clpar_status s = clpar_check_float(fn, name, t);
  if (s != CLPAR_OK) return s;
  char a[128], b[128];
  int64_t cols = x->shape[x->ndim - 1];
  if (t->ndim != 1 || t->shape[0] != cols)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s: %s is %s for input %s; need [%lld]", fn,
                           name, SHAPE(t, a), SHAPE(x, b), (long long)cols);
  if (t->storage->dev != x->storage->dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH, "%s: input on %s, %s on %s", fn,
                           x->storage->dev->bd.info.id, name, t->storage->dev->bd.info.id);
  return CLPAR_OK;
}

clpar_status clpar_layer_norm(const clpar_tensor *x, const clpar_tensor *weight,
                              const clpar_tensor *bias, float eps, clpar_tensor **out) {
  if (!x || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_layer_norm: input or out is NULL");
  clpar_status s = clpar_check_float("clpar_layer_norm", "input", x);
  if (s == CLPAR_OK) s = check_affine("weight", weight, x);
  if (s == CLPAR_OK) s = check_affine("bias", bias, x);
  if (s != CLPAR_OK) return s;
  if (!(eps >= 0.0f))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_layer_norm: eps is %g; need >= 0 (PyTorch's default 1e-5)",
                           (double)eps);
  clpar_device *dev = x->storage->dev;
  int64_t cols = x->shape[x->ndim - 1], rows = x->numel / cols;
  clpar_tensor *mean = NULL, *rstd = NULL, *y = NULL;
  s = clpar_tensor_empty(dev, 1, &rows, &mean);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &rows, &rstd);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, x->ndim, x->shape, &y);
  if (s == CLPAR_OK)
    s = clpar_dev_layernorm(dev, (size_t)rows, (size_t)cols, eps, clpar_tensor_bref(x),
                            opt_ref(weight), opt_ref(bias), clpar_tensor_bref(y),
                            clpar_tensor_bref(mean), clpar_tensor_bref(rstd));
  if (s != CLPAR_OK) {
    if (y) clpar_device_fail(dev, s);
    clpar_tensor_free(mean), clpar_tensor_free(rstd), clpar_tensor_free(y);
    return s;
  }
  clpar_tensor *in[3] = {(clpar_tensor *)x, (clpar_tensor *)weight, (clpar_tensor *)bias};
  clpar_tensor *saved[2] = {mean, rstd};
  return clpar_record_op_keep(y, "clpar_layer_norm", ln_backward, in, 3, NULL, saved, 2, NULL, out);
}

static clpar_status ln_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *user) {
  const float *eps = user;
  return clpar_layer_norm(x, clpar_module_parameter(self, "weight"),
                          clpar_module_parameter(self, "bias"), *eps, y);
}

static clpar_status add_filled(clpar_module *m, const char *name, int64_t n, float v,
                               clpar_device *dev) {
  clpar_tensor *t = NULL;
  clpar_status s = clpar_tensor_zeros(dev, 1, &n, &t);
  if (s == CLPAR_OK && v != 0.0f) s = clpar_fill(t, v);
  if (s == CLPAR_OK) s = clpar_module_add_parameter(m, name, t);
  clpar_tensor_free(t);
  return s;
}

/* nn.LayerNorm(dim, eps, bias=bias): weight 1, bias 0. */
clpar_status clpar_layernorm_create(int64_t dim, float eps, int bias, clpar_device *dev,
                                    clpar_module **out) {
  const char *fn = "clpar_layernorm_create";
  if (dim < 1 || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: dim must be >= 1 (got %lld)", fn,
                           (long long)dim);
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_init first", fn);
  if (!dev) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: device is NULL", fn);
  float e = clpar_opt_float(eps, 1e-5f);
  if (!(e >= 0.0f))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: eps is %g; need >= 0", fn,
                           (double)eps);
  float *ep = malloc(sizeof *ep);
  if (!ep) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  *ep = e;
  clpar_module *m = NULL;
  clpar_status s = clpar_module_create("LayerNorm", ln_forward, ep, free, &m);
  if (s != CLPAR_OK) {
    free(ep);
    return s;
  }
  s = add_filled(m, "weight", dim, 1.0f, dev);
  if (s == CLPAR_OK && bias) s = add_filled(m, "bias", dim, 0.0f, dev);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}
