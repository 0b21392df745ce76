/* batchnorm.c — F.batch_norm over x [N, C, ...] per channel, forward and backward.
 *
 * Training normalizes with the batch's statistics (bn_stats: mean and biased variance, in two
 * passes, and in the same kernel the running statistics' update with the unbiased variance);
 * eval with copies of the running statistics taken at forward (a later training step updates
 * the running tensors in place, and backward must see what forward used). Backward: one
 * reduction gives per channel sum(g) (the bias gradient) and sum(g xhat) (the weight
 * gradient), and one element-wise pass the input's gradient. The node keeps mean and var. */
#include <stdlib.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

static clpar_bref opt_ref(const clpar_tensor *t) {
  clpar_bref r = {NULL, 0};
  return t ? clpar_tensor_bref(t) : r;
}

/* x seen as [n, c, p]. */
static void dims_of(const clpar_tensor *x, size_t *n, size_t *c, size_t *p) {
  *n = (size_t)x->shape[0];
  *c = (size_t)x->shape[1];
  *p = (size_t)(x->numel / x->shape[0] / x->shape[1]);
}

static clpar_status bn_backward(clpar_node *node, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *x = node->inputs[0], *wt = node->inputs[1], *bias = node->inputs[2];
  clpar_tensor *mean = node->saved[0], *var = node->saved[1];
  int training = (int)node->iparam[0];
  float eps = node->fparam[0];
  clpar_device *dev = node->dev;
  size_t n, c, p;
  dims_of(x, &n, &c, &p);
  int64_t ch = (int64_t)c;
  clpar_tensor *sg = NULL, *sgx = NULL, *dx = NULL;
  clpar_status s = clpar_tensor_empty(dev, 1, &ch, &sg);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &ch, &sgx);
  if (s == CLPAR_OK)
    s = clpar_dev_bn_backward_sums(dev, n, c, p, clpar_tensor_bref(x), clpar_tensor_bref(g),
                                   clpar_tensor_bref(mean), clpar_tensor_bref(var), eps,
                                   clpar_tensor_bref(sg), clpar_tensor_bref(sgx));
  if (s == CLPAR_OK && x->requires_grad) {
    s = clpar_tensor_empty(dev, x->ndim, x->shape, &dx);
    if (s == CLPAR_OK)
      s = clpar_dev_bn_backward(dev, n, c, p, clpar_tensor_bref(x), clpar_tensor_bref(g),
                                clpar_tensor_bref(mean), clpar_tensor_bref(var), opt_ref(wt), eps,
                                clpar_tensor_bref(sg), clpar_tensor_bref(sgx), training,
                                clpar_tensor_bref(dx));
  }
  if (s != CLPAR_OK) {
    if (sgx) clpar_device_fail(dev, s);
    clpar_tensor_free(sg);
    clpar_tensor_free(sgx);
    clpar_tensor_free(dx);
    return s;
  }
  gin[0] = dx;
  if (wt && wt->requires_grad)
    gin[1] = sgx;
  else
    clpar_tensor_free(sgx);
  if (bias && bias->requires_grad)
    gin[2] = sg;
  else
    clpar_tensor_free(sg);
  return CLPAR_OK;
}

/* A [C] tensor on x's device, or NULL when t is NULL. */
static clpar_status check_channel(const char *fn, const char *name, const clpar_tensor *t,
                                  const clpar_tensor *x) {
  if (!t) return CLPAR_OK;
  clpar_status s = clpar_check_alive(fn, t);
  if (s == CLPAR_OK) s = clpar_check_float(fn, name, t);
  if (s != CLPAR_OK) return s;
  char a[128], b[128];
  if (t->ndim != 1 || t->shape[0] != x->shape[1])
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s: %s is %s for input %s; need [%lld]", fn,
                           name, SHAPE(t, a), SHAPE(x, b), (long long)x->shape[1]);
  if (t->storage->dev != x->storage->dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH, "%s: input on %s, %s on %s", fn,
                           x->storage->dev->bd.info.id, name, t->storage->dev->bd.info.id);
  return CLPAR_OK;
}

static clpar_status check_bn(const clpar_tensor *x, const clpar_tensor *rm, const clpar_tensor *rv,
                             const clpar_tensor *wt, const clpar_tensor *bias, int training,
                             clpar_tensor **out) {
  const char *fn = "clpar_batch_norm";
  if (!x || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: input or out is NULL", fn);
  clpar_status s = clpar_check_alive(fn, x);
  if (s == CLPAR_OK) s = clpar_check_float(fn, "input", x);
  if (s != CLPAR_OK) return s;
  char a[128];
  if (x->ndim < 2)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s: input is %s; need [N, C, ...]", fn,
                           SHAPE(x, a));
  if (!rm != !rv)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: give both running_mean and running_var, or neither", fn);
  if (!training && !rm)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: eval mode needs running_mean and running_var", fn);
  if (training && x->numel / x->shape[1] < 2)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: input is %s; training needs more than one value per channel", fn,
                           SHAPE(x, a));
  s = check_channel(fn, "running_mean", rm, x);
  if (s == CLPAR_OK) s = check_channel(fn, "running_var", rv, x);
  if (s == CLPAR_OK) s = check_channel(fn, "weight", wt, x);
  if (s == CLPAR_OK) s = check_channel(fn, "bias", bias, x);
  return s;
}

clpar_status clpar_batch_norm(const clpar_tensor *x, clpar_tensor *running_mean,
                              clpar_tensor *running_var, const clpar_tensor *weight,
                              const clpar_tensor *bias, int training, float momentum, float eps,
                              clpar_tensor **out) {
  if (out && clpar_autocast_takes("clpar_batch_norm", x)) { /* float32 math, x's dtype out */
    clpar_tensor *x32, *y = NULL;
    clpar_status s = clpar_autocast_widen(x, &x32);
    if (s == CLPAR_OK)
      s = clpar_batch_norm(x32, running_mean, running_var, weight, bias, training, momentum, eps,
                           &y);
    return clpar_autocast_round(s, x32, y, x->dtype, out);
  }
  clpar_status s = check_bn(x, running_mean, running_var, weight, bias, training, out);
  if (s != CLPAR_OK) return s;
  clpar_device *dev = x->storage->dev;
  size_t n, c, p;
  dims_of(x, &n, &c, &p);
  int64_t ch = (int64_t)c;
  clpar_tensor *mean = NULL, *var = NULL, *y = NULL;
  s = clpar_tensor_empty(dev, 1, &ch, &mean);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &ch, &var);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, x->ndim, x->shape, &y);
  if (s == CLPAR_OK && training) {
    s = clpar_dev_bn_stats(dev, n, c, p, clpar_tensor_bref(x), clpar_tensor_bref(mean),
                           clpar_tensor_bref(var), opt_ref(running_mean), opt_ref(running_var),
                           momentum);
    if (s == CLPAR_OK && running_mean) {
      clpar_tensor_touch(running_mean);
      clpar_tensor_touch(running_var);
    }
  } else if (s == CLPAR_OK) {
    size_t bytes = c * sizeof(float);
    s = clpar_dev_copy(dev, mean->storage->buf, mean->offset * sizeof(float),
                       running_mean->storage->buf, running_mean->offset * sizeof(float), bytes);
    if (s == CLPAR_OK)
      s = clpar_dev_copy(dev, var->storage->buf, var->offset * sizeof(float),
                         running_var->storage->buf, running_var->offset * sizeof(float), bytes);
  }
  if (s == CLPAR_OK)
    s = clpar_dev_bn_apply(dev, n, c, p, clpar_tensor_bref(x), clpar_tensor_bref(mean),
                           clpar_tensor_bref(var), opt_ref(weight), opt_ref(bias), eps,
                           clpar_tensor_bref(y));
  if (s != CLPAR_OK) {
    if (y) clpar_device_fail(dev, s);
    clpar_tensor_free(mean);
    clpar_tensor_free(var);
    clpar_tensor_free(y);
    return s;
  }
  clpar_node *node = NULL;
  clpar_tensor *in[3] = {(clpar_tensor *)x, (clpar_tensor *)weight, (clpar_tensor *)bias};
  clpar_tensor *saved[2] = {mean, var};
  s = clpar_record_op_keep(y, "clpar_batch_norm", bn_backward, in, 3, NULL, saved, 2, &node, out);
  if (node) {
    node->iparam[0] = training != 0;
    node->fparam[0] = eps;
  }
  return s;
}
