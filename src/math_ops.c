/* math_ops.c — the element-wise math of transformers (exp, log, sqrt, pow, GELU), argmax and
 * cross-entropy with targets on the device. exp and sqrt run the unary entry and take their
 * gradient from the output; log, pow and GELU run the pointwise entry both ways, from the
 * input. Cross-entropy is one node: the fused softmax cross-entropy entry (xent) per row, the
 * mean (or sum) over the targets that are not ignored, and one entry (xent_backward) for the
 * gradient of the logits. */
#include <string.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

static clpar_status check_x(const char *fn, const clpar_tensor *x, const void *out) {
  if (!x || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  return clpar_check_float(fn, "x", x);
}

static clpar_status failed(clpar_device *dev, clpar_status s, clpar_tensor *r) {
  clpar_device_fail(dev, s);
  clpar_tensor_free(r);
  return s;
}

/* ---- exp, sqrt: from the output ---- */

/* exp: g * y; sqrt: g / y / 2. */
static clpar_status from_output_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  if (n->iparam[0] == CLPAR_UNARY_EXP) return clpar_mul(g, n->saved[0], &gin[0]);
  clpar_tensor *q;
  clpar_status s = clpar_div(g, n->saved[0], &q);
  if (s != CLPAR_OK) return s;
  s = clpar_scale(q, 0.5f, &gin[0]);
  clpar_tensor_free(q);
  return s;
}

clpar_status clpar_exp(const clpar_tensor *x, clpar_tensor **out) {
  return clpar_unary_op("clpar_exp", CLPAR_UNARY_EXP, x, from_output_backward, out);
}

clpar_status clpar_sqrt(const clpar_tensor *x, clpar_tensor **out) {
  return clpar_unary_op("clpar_sqrt", CLPAR_UNARY_SQRT, x, from_output_backward, out);
}

/* ---- log, pow, GELU: from the input ---- */

static clpar_status pointwise_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *x = n->inputs[0], *r;
  clpar_device *dev = n->dev;
  clpar_status s = clpar_tensor_empty(dev, x->ndim, x->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_pointwise(dev, (clpar_pointwise_kind)n->iparam[0], (size_t)x->numel, n->fparam[0],
                          clpar_tensor_bref(x), clpar_tensor_bref(g), clpar_tensor_bref(r));
  if (s != CLPAR_OK) return failed(dev, s, r);
  gin[0] = r;
  return CLPAR_OK;
}

static clpar_status pointwise(const char *fn, clpar_pointwise_kind kind, float p,
                              const clpar_tensor *x, clpar_tensor **out) {
  clpar_status s = check_x(fn, x, out);
  if (s != CLPAR_OK) return s;
  clpar_device *dev = x->storage->dev;
  clpar_tensor *r;
  s = clpar_tensor_empty(dev, x->ndim, x->shape, &r);
  if (s != CLPAR_OK) return s;
  clpar_bref none = {NULL, 0};
  s = clpar_dev_pointwise(dev, kind, (size_t)x->numel, p, clpar_tensor_bref(x), none,
                          clpar_tensor_bref(r));
  if (s != CLPAR_OK) return failed(dev, s, r);
  clpar_node *node;
  s = clpar_record_op(r, fn, pointwise_backward, (clpar_tensor **)&x, 1, &node);
  if (node) node->iparam[0] = kind, node->fparam[0] = p;
  if (s == CLPAR_OK) *out = r;
  return s;
}

clpar_status clpar_ln(const clpar_tensor *x, clpar_tensor **out) {
  return pointwise("clpar_ln", CLPAR_PW_LOG, 0.0f, x, out);
}

clpar_status clpar_pow(const clpar_tensor *x, float exponent, clpar_tensor **out) {
  return pointwise("clpar_pow", CLPAR_PW_POW, exponent, x, out);
}

clpar_status clpar_gelu(const clpar_tensor *x, clpar_gelu_approx approximate, clpar_tensor **out) {
  if (approximate != CLPAR_GELU_NONE && approximate != CLPAR_GELU_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_gelu: approximate is %d; CLPAR_GELU_NONE or CLPAR_GELU_TANH",
                           (int)approximate);
  return pointwise("clpar_gelu",
                   approximate == CLPAR_GELU_TANH ? CLPAR_PW_GELU_TANH : CLPAR_PW_GELU_ERF, 0.0f, x,
                   out);
}

/* ---- argmax ---- */

clpar_status clpar_argmax(const clpar_tensor *x, clpar_tensor **out) {
  clpar_status s = check_x("clpar_argmax", x, out);
  if (s != CLPAR_OK) return s;
  int64_t one = 1, cols = x->shape[x->ndim - 1];
  clpar_device *dev = x->storage->dev;
  clpar_tensor *r;
  s = clpar_tensor_empty_dtype(dev, CLPAR_INT64, x->ndim > 1 ? x->ndim - 1 : 1,
                               x->ndim > 1 ? x->shape : &one, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_argmax(dev, (size_t)(x->numel / cols), (size_t)cols, clpar_tensor_bref(x),
                       clpar_tensor_bref(r));
  if (s != CLPAR_OK) return failed(dev, s, r);
  *out = r;
  return CLPAR_OK;
}

/* ---- cross-entropy with device targets and ignore_index ---- */

/* d loss / d logits, one fused entry: (softmax - onehot(t)) * scale per row whose target is
 * not ignored, with scale = g / count for the mean and g for the sum. saved: the targets and,
 * for the mean, the count. */
static clpar_status ce_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *logits = n->inputs[0], *t = n->saved[0], *count = n->saved[1];
  clpar_device *dev = n->dev;
  clpar_tensor *r = NULL;
  clpar_bref none = {NULL, 0};
  clpar_status s = clpar_tensor_empty(dev, 2, logits->shape, &r);
  if (s == CLPAR_OK)
    s = clpar_dev_xent_backward(
        dev, (size_t)logits->shape[0], (size_t)logits->shape[1], t->dtype == CLPAR_INT64,
        n->iparam[0], clpar_tensor_bref(logits), clpar_tensor_bref(t), clpar_tensor_bref(g),
        count ? clpar_tensor_bref(count) : none, 1.0f, clpar_tensor_bref(r));
  if (s != CLPAR_OK) return failed(dev, s, r);
  gin[0] = r;
  return CLPAR_OK;
}

static clpar_status ce_check(const clpar_tensor *logits, const clpar_tensor *targets,
                             clpar_reduction reduction) {
  const char *fn = "clpar_cross_entropy_targets";
  clpar_status s = clpar_check_float(fn, "logits", logits);
  if (s == CLPAR_OK) s = clpar_check_alive(fn, targets);
  if (s != CLPAR_OK) return s;
  if (reduction != CLPAR_REDUCTION_MEAN && reduction != CLPAR_REDUCTION_SUM)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: reduction %d is neither MEAN nor SUM",
                           fn, (int)reduction);
  if (targets->dtype != CLPAR_INT32 && targets->dtype != CLPAR_INT64)
    return clpar_set_error(CLPAR_ERROR_DTYPE, "%s: targets are %s; need int32 or int64", fn,
                           clpar_dtype_name(targets->dtype));
  if (logits->storage->dev != targets->storage->dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH,
                           "%s: logits are on %s and targets on %s; move one with clpar_tensor_to",
                           fn, logits->storage->dev->bd.info.id, targets->storage->dev->bd.info.id);
  int same = logits->ndim >= 2 && targets->ndim == logits->ndim - 1;
  for (int d = 0; same && d < targets->ndim; d++) same = targets->shape[d] == logits->shape[d];
  if (!same) {
    char a[128], b[128];
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: logits are %s and targets %s; need logits [..., classes] and "
                           "targets of the leading shape",
                           fn, SHAPE(logits, a), SHAPE(targets, b));
  }
  return CLPAR_OK;
}

/* total [1] from the per-row losses of logits [rows, cols]; with count [2], the mean: the
 * weights' and the losses' sums in one reduction (count[0], count[1]), then their quotient
 * (count[0] is the count the backward reads). */
static clpar_status ce_sums(clpar_tensor *logits, const clpar_tensor *t, int64_t ignore,
                            clpar_tensor *total, clpar_tensor *count) {
  clpar_device *dev = logits->storage->dev;
  int64_t rows = logits->shape[0], two[2] = {2, rows};
  clpar_tensor *lw; /* weight and loss per row */
  clpar_status s = clpar_tensor_empty(dev, 2, two, &lw);
  if (s != CLPAR_OK) return s;
  clpar_bref weight = clpar_tensor_bref(lw), loss = weight;
  loss.off += (size_t)rows;
  s = clpar_dev_xent(dev, (size_t)rows, (size_t)logits->shape[1], t->dtype == CLPAR_INT64, ignore,
                     clpar_tensor_bref(logits), clpar_tensor_bref(t), loss, weight);
  if (s == CLPAR_OK && !count)
    s = clpar_dev_reduce_sum(dev, 1, (size_t)rows, 1, loss, clpar_tensor_bref(total));
  if (s == CLPAR_OK && count) {
    clpar_bref sums = clpar_tensor_bref(count), loss_sum = sums;
    loss_sum.off += 1;
    s = clpar_dev_reduce_sum(dev, 2, (size_t)rows, 1, weight, sums);
    if (s == CLPAR_OK)
      s = clpar_dev_binary(dev, CLPAR_BINARY_DIV, 1, 1, loss_sum, sums, 1,
                           clpar_tensor_bref(total));
  }
  clpar_tensor_free(lw);
  return s == CLPAR_OK ? s : clpar_device_fail(dev, s);
}

clpar_status clpar_cross_entropy_targets(const clpar_tensor *logits, const clpar_tensor *targets,
                                         int64_t ignore_index, clpar_reduction reduction,
                                         clpar_tensor **out) {
  if (!logits || !targets || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_cross_entropy_targets: NULL argument");
  clpar_status s = ce_check(logits, targets, reduction);
  if (s != CLPAR_OK) return s;
  clpar_device *dev = logits->storage->dev;
  int64_t cols = logits->shape[logits->ndim - 1], shape2[2] = {logits->numel / cols, cols}, one = 1;
  clpar_tensor *flat = NULL, *r = NULL, *count = NULL, *t = NULL;
  s = clpar_tensor_reshape((clpar_tensor *)logits, 2, shape2, &flat);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &one, &r);
  if (s == CLPAR_OK && reduction == CLPAR_REDUCTION_MEAN) /* the count, then the losses' sum */
    s = clpar_tensor_empty(dev, 1, (int64_t[1]){2}, &count);
  if (s == CLPAR_OK) s = clpar_tensor_alias(targets, &t);
  if (s == CLPAR_OK) s = ce_sums(flat, t, ignore_index, r, count);
  if (s != CLPAR_OK) {
    clpar_tensor_free(flat), clpar_tensor_free(r), clpar_tensor_free(count), clpar_tensor_free(t);
    return s;
  }
  clpar_tensor *saved[2] = {t, count};
  clpar_node *node;
  s = clpar_record_op_keep(r, "clpar_cross_entropy_targets", ce_backward, &flat, 1, NULL, saved,
                           count ? 2 : 1, &node, out);
  if (s == CLPAR_OK && node) node->iparam[0] = ignore_index;
  clpar_tensor_free(flat);
  return s;
}
