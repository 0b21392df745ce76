/* functional.c — sum, mean, linear and the losses, composed from differentiable ops so that
 * their backward comes from the parts; Linear and cross-entropy have fused nodes of their own.
 * Intermediates are freed here; the graph keeps what it needs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))

clpar_status clpar_sum(const clpar_tensor *x, clpar_tensor **out) {
  if (!x || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_sum: NULL argument");
  if (clpar_check_float("clpar_sum", "x", x) != CLPAR_OK) return CLPAR_ERROR_DTYPE;
  int64_t column[2] = {x->numel, 1};
  clpar_tensor *v;
  clpar_status s = clpar_tensor_reshape((clpar_tensor *)x, 2, column, &v);
  if (s != CLPAR_OK) return s;
  s = clpar_sum_rows(v, out); /* [numel, 1] summed over rows: [1] */
  clpar_tensor_free(v);
  return s;
}

clpar_status clpar_mean(const clpar_tensor *x, clpar_tensor **out) {
  if (!x || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_mean: NULL argument");
  if (clpar_check_float("clpar_mean", "x", x) != CLPAR_OK) return CLPAR_ERROR_DTYPE;
  clpar_tensor *sum;
  clpar_status s = clpar_sum(x, &sum);
  if (s != CLPAR_OK) return s;
  s = clpar_scale(sum, 1.0f / (float)x->numel, out);
  clpar_tensor_free(sum);
  return s;
}

/* ---- Linear: one node for x W^T + b and its activation ----
 *
 * Forward is one linear_act entry: the GEMM with the bias and the activation in its epilogue
 * where the backend can (OpenCL CPU devices' small GEMMs), else a GEMM and one fused epilogue
 * (bias_act: the bias and the activation; a plain unary without a bias). Backward is one
 * linear_act_backward entry: the activation's gradient d, the bias gradient summed from it,
 * dW = d^T x and dx = d W, one kernel on OpenCL CPU devices' small shapes, else
 * bias_act_backward and two GEMMs. Each gradient goes straight into the memory where it
 * accumulates when the engine gives a slot (clpar_grad_slot: the parameter's grad, a slice of
 * a flat gradient): the entry adds to it (its accumulate bits). So a layer costs 1 or 2
 * kernels forward and 1 or 3 backward, where a matmul, an add and a relu node cost 3 and 6
 * (the bias sum, the relu gradient, two GEMMs, and an add into each parameter's slice). */

/* The gradient of input i: its slot (*acc set, unless the slot's memory holds no gradient
 * yet: then the entry overwrites it) or a new tensor of t's shape, into *out; *slotted: the
 * gradient is in its place once written. */
static clpar_status grad_target(clpar_node *n, int i, const clpar_tensor *t, int *acc, int *slotted,
                                clpar_tensor **out) {
  int replace = 0;
  clpar_status s = clpar_grad_slot_replace(n, i, out, &replace);
  *slotted = s == CLPAR_OK && *out != NULL;
  *acc = *slotted && !replace;
  if (s == CLPAR_OK && !*out) s = clpar_tensor_empty(n->dev, t->ndim, t->shape, out);
  return s;
}

static clpar_status linear_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *x = n->inputs[0], *w = n->inputs[1], *b = n->n_inputs > 2 ? n->inputs[2] : NULL;
  clpar_act_kind act = (clpar_act_kind)n->iparam[0];
  clpar_tensor *t[3] = {NULL, NULL, NULL}, *d = NULL; /* dx, dw, db */
  const clpar_tensor *in[3] = {x, w, b};
  int acc[3] = {0, 0, 0}, want[3] = {x->requires_grad, w->requires_grad, b && b->requires_grad};
  int slotted[3] = {0, 0, 0};
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < 3; i++)
    if (want[i]) s = grad_target(n, i, in[i], &acc[i], &slotted[i], &t[i]);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE) s = clpar_tensor_empty(n->dev, 2, g->shape, &d);
  if (s == CLPAR_OK) {
    clpar_bref none = {NULL, 0}, br[4];
    for (int i = 0; i < 3; i++) br[i] = t[i] ? clpar_tensor_bref(t[i]) : none;
    br[3] = d ? clpar_tensor_bref(d) : none;
    s = clpar_dev_linear_act_backward(
        n->dev, act, (size_t)g->shape[0], (size_t)g->shape[1], (size_t)w->shape[1],
        clpar_tensor_bref(g), d ? clpar_tensor_bref(n->saved[0]) : none, clpar_tensor_bref(x),
        clpar_tensor_bref(w), br[3], br[0], br[1], br[2],
        (acc[0] ? CLPAR_ACC_DX : 0) | (acc[1] ? CLPAR_ACC_DW : 0) | (acc[2] ? CLPAR_ACC_DB : 0));
    if (s != CLPAR_OK) clpar_device_fail(n->dev, s);
  }
  for (int i = 0; i < 3; i++) {
    if (s == CLPAR_OK && t[i] && !slotted[i]) gin[i] = t[i], t[i] = NULL;
    clpar_tensor_free(t[i]);
  }
  clpar_tensor_free(d);
  return s;
}

clpar_status clpar_linear_act(const clpar_tensor *x, const clpar_tensor *weight,
                              const clpar_tensor *bias, clpar_act_kind act, clpar_tensor **out) {
  if (!x || !weight || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_linear: NULL argument");
  clpar_status alive = clpar_check_alive("clpar_linear", x);
  if (alive == CLPAR_OK) alive = clpar_check_alive("clpar_linear", weight);
  if (alive == CLPAR_OK && bias) alive = clpar_check_alive("clpar_linear", bias);
  if (alive != CLPAR_OK) return alive;
  if (clpar_check_float_autocast("clpar_linear", "input", x) != CLPAR_OK ||
      clpar_check_float_autocast("clpar_linear", "weight", weight) != CLPAR_OK ||
      (bias && clpar_check_float_autocast("clpar_linear", "bias", bias) != CLPAR_OK))
    return CLPAR_ERROR_DTYPE;
  char a[128], b[128];
  if (x->ndim != 2 || weight->ndim != 2 || x->shape[1] != weight->shape[1])
    return clpar_set_error(
        CLPAR_ERROR_SHAPE_MISMATCH,
        "clpar_linear: input is %s and weight is %s; need [batch, in] and [out, in]%s", SHAPE(x, a),
        SHAPE(weight, b),
        x->ndim > 2 ? " (flatten the input to [batch, in] first: a Flatten, "
                      "clpar_flatten_create(1, -1, &m), before the Linear)"
                    : "");
  if (bias && (bias->numel != weight->shape[0] || bias->ndim > 2 ||
               bias->shape[bias->ndim - 1] != weight->shape[0]))
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "clpar_linear: bias is %s for %lld outputs",
                           SHAPE(bias, a), (long long)weight->shape[0]);
  clpar_device *dev = x->storage->dev;
  if (weight->storage->dev != dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH,
                           "clpar_linear: input on %s, weight on %s; move one with "
                           "clpar_tensor_to",
                           dev->bd.info.id, weight->storage->dev->bd.info.id);
  if (bias && bias->storage->dev != dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH, "clpar_linear: input on %s, bias on %s",
                           dev->bd.info.id, bias->storage->dev->bd.info.id);
  if (clpar_autocast_dtype() != CLPAR_FLOAT32)
    return clpar_autocast_linear(x, weight, bias, act, out);
  int64_t rows = x->shape[0], cols = weight->shape[0], in = x->shape[1];
  int64_t shape[2] = {rows, cols};
  clpar_tensor *y;
  clpar_status s = clpar_tensor_empty(dev, 2, shape, &y);
  if (s != CLPAR_OK) return s;
  clpar_bref none = {NULL, 0};
  s = clpar_dev_linear_act(dev, act, (size_t)rows, (size_t)cols, (size_t)in, clpar_tensor_bref(x),
                           clpar_tensor_bref(weight), bias ? clpar_tensor_bref(bias) : none,
                           clpar_tensor_bref(y));
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(y);
    return s;
  }
  clpar_tensor *inputs[3] = {(clpar_tensor *)x, (clpar_tensor *)weight, (clpar_tensor *)bias};
  clpar_node *node;
  s = clpar_record_op(y, "clpar_linear", linear_backward, inputs, bias ? 3 : 2, &node);
  if (s == CLPAR_OK && node) {
    node->iparam[0] = act;
    if (act != CLPAR_ACT_NONE) { /* the output, as an alias: no reference cycle */
      s = clpar_tensor_alias(y, &node->saved[0]);
      if (s == CLPAR_OK)
        clpar_tensor_unscope(node->saved[0]);
      else
        clpar_tensor_free(y);
    }
  }
  if (s == CLPAR_OK) *out = y;
  return s;
}

clpar_status clpar_linear(const clpar_tensor *x, const clpar_tensor *weight,
                          const clpar_tensor *bias, clpar_tensor **out) {
  return clpar_linear_act(x, weight, bias, CLPAR_ACT_NONE, out);
}

/* The mean or sum of a loss per element or per row. */
static clpar_status reduce(const clpar_tensor *per, clpar_reduction reduction, clpar_tensor **out) {
  return reduction == CLPAR_REDUCTION_SUM ? clpar_sum(per, out) : clpar_mean(per, out);
}

static clpar_status check_reduction(const char *fn, clpar_reduction r) {
  if (r == CLPAR_REDUCTION_MEAN || r == CLPAR_REDUCTION_SUM) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: reduction %d is neither MEAN nor SUM",
                         fn, (int)r);
}

clpar_status clpar_mse_loss(const clpar_tensor *input, const clpar_tensor *target,
                            clpar_reduction reduction, clpar_tensor **out) {
  if (!input || !target || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_mse_loss: NULL argument");
  clpar_status s = check_reduction("clpar_mse_loss", reduction);
  if (s == CLPAR_OK && clpar_autocast_widens(input)) { /* losses run in float32 */
    clpar_tensor *wide;
    s = clpar_to_dtype(input, CLPAR_FLOAT32, &wide);
    if (s == CLPAR_OK) s = clpar_mse_loss(wide, target, reduction, out);
    clpar_tensor_free(wide);
    return s;
  }
  if (s == CLPAR_OK) s = clpar_check_float("clpar_mse_loss", "input", input);
  if (s == CLPAR_OK) s = clpar_check_float("clpar_mse_loss", "target", target);
  if (s != CLPAR_OK) return s;
  char a[128], b[128];
  int same = input->ndim == target->ndim;
  for (int i = 0; same && i < input->ndim; i++) same = input->shape[i] == target->shape[i];
  if (!same) /* checked here, or clpar_sub would report it under its own name */
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "clpar_mse_loss: input is %s and target is %s; they must have the same "
                           "shape",
                           SHAPE(input, a), SHAPE(target, b));
  clpar_tensor *diff, *sq = NULL;
  s = clpar_sub(input, target, &diff);
  if (s != CLPAR_OK) return s;
  s = clpar_mul(diff, diff, &sq);
  if (s == CLPAR_OK) s = reduce(sq, reduction, out);
  clpar_tensor_free(diff);
  clpar_tensor_free(sq);
  return s;
}

/* d loss / d logits: alpha g (softmax - onehot(label)) per row, one fused entry (xent_backward;
 * no label is the ignore value -1, the labels being checked). */
static clpar_status ce_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *logits = n->inputs[0], *labels = n->saved[0], *r;
  clpar_device *dev = n->dev;
  clpar_bref none = {NULL, 0};
  clpar_status s = clpar_tensor_empty(dev, logits->ndim, logits->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_xent_backward(dev, (size_t)logits->shape[0], (size_t)logits->shape[1], 0, -1,
                              clpar_tensor_bref(logits), clpar_tensor_bref(labels),
                              clpar_tensor_bref(g), none, n->fparam[0], clpar_tensor_bref(r));
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(r);
    return s;
  }
  gin[0] = r;
  return CLPAR_OK;
}

/* The labels travel to the device as an int32 tensor, as the user gave them: a float holds a
 * class index exactly only up to 2^24. The node keeps it for the backward.
 *
 * The per-row losses come from the fused entry xent (log_softmax and the pick of the label in
 * one pass), their sum from sum_rows and the mean from a scale by 1 / rows, as clpar_mean
 * takes it; one node for the whole loss. */
static clpar_status ce_fused(clpar_tensor *logits, const int32_t *labels, clpar_reduction red,
                             clpar_tensor **out) {
  clpar_device *dev = logits->storage->dev;
  int64_t rows = logits->shape[0], two[2] = {2, rows}, one = 1;
  float alpha = red == CLPAR_REDUCTION_MEAN ? 1.0f / (float)rows : 1.0f;
  clpar_tensor *lab, *lw = NULL, *r = NULL;
  clpar_status s = clpar_tensor_empty_dtype(dev, CLPAR_INT32, 1, &rows, &lab);
  if (s != CLPAR_OK) return s;
  s = clpar_upload(dev, lab->storage->buf, 0, labels, clpar_tensor_bytes(lab));
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 2, two, &lw);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &one, &r);
  clpar_bref loss = lw ? clpar_tensor_bref(lw) : (clpar_bref){NULL, 0}, weight = loss;
  weight.off += (size_t)rows;
  if (s == CLPAR_OK)
    s = clpar_dev_xent(dev, (size_t)rows, (size_t)logits->shape[1], 0, -1,
                       clpar_tensor_bref(logits), clpar_tensor_bref(lab), loss, weight);
  if (s == CLPAR_OK) s = clpar_dev_sum_rows(dev, (size_t)rows, 1, loss, clpar_tensor_bref(r));
  if (s == CLPAR_OK && red == CLPAR_REDUCTION_MEAN)
    s = clpar_dev_scale(dev, 1, alpha, clpar_tensor_bref(r), clpar_tensor_bref(r));
  clpar_tensor_free(lw);
  if (s != CLPAR_OK) {
    if (r) clpar_device_fail(dev, s);
    clpar_tensor_free(r);
    clpar_tensor_free(lab);
    return s;
  }
  clpar_node *node;
  s = clpar_record_op_keep(r, "clpar_cross_entropy", ce_backward, &logits, 1, NULL, &lab, 1, &node,
                           out);
  if (s == CLPAR_OK && node) node->fparam[0] = alpha;
  return s;
}

clpar_status clpar_cross_entropy(const clpar_tensor *logits, const int32_t *labels,
                                 int64_t n_labels, clpar_reduction reduction, clpar_tensor **out) {
  if (!logits || !labels || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_cross_entropy: NULL argument");
  clpar_status s = check_reduction("clpar_cross_entropy", reduction);
  if (s == CLPAR_OK && clpar_autocast_widens(logits)) { /* losses run in float32 */
    clpar_tensor *wide;
    s = clpar_to_dtype(logits, CLPAR_FLOAT32, &wide);
    if (s == CLPAR_OK) s = clpar_cross_entropy(wide, labels, n_labels, reduction, out);
    clpar_tensor_free(wide);
    return s;
  }
  if (s == CLPAR_OK) s = clpar_check_float("clpar_cross_entropy", "logits", logits);
  if (s != CLPAR_OK) return s;
  char a[128];
  if (logits->ndim != 2)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "clpar_cross_entropy: logits are %s; need [batch, classes]",
                           SHAPE(logits, a));
  if (n_labels != logits->shape[0])
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "clpar_cross_entropy: %lld labels for logits %s", (long long)n_labels,
                           SHAPE(logits, a));
  for (int64_t r = 0; r < n_labels; r++)
    if (labels[r] < 0 || labels[r] >= logits->shape[1]) {
      s = clpar_set_error(CLPAR_ERROR_INDEX,
                          "clpar_cross_entropy: label %d of row %lld is outside 0..%lld", labels[r],
                          (long long)r, (long long)logits->shape[1] - 1);
      float f; /* float labels passed as int32: the bits of a small whole number */
      memcpy(&f, &labels[r], sizeof f);
      if (labels[r] >= (1 << 23) && f >= 0.0f && f < 1e9f && f == floorf(f))
        clpar_append_error(
            " (those are the bits of float %g: labels are int32 class indices; "
            "convert float labels to int32 first)",
            (double)f);
      return s;
    }
  return ce_fused((clpar_tensor *)logits, labels, reduction, out);
}
