/* activation.c — relu, sigmoid, tanh, softmax and log_softmax, forward and backward side by
 * side. Backward keeps what the derivative is cheapest from: the input for relu, the output
 * for the others (held as an alias, so the node does not keep its own output alive). */
#include "internal.h"

static clpar_status check_input(const char *fn, const clpar_tensor *x, clpar_tensor **out) {
  if (!x || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  return clpar_check_float(fn, "x", x);
}

/* A failed backend call: name the device, free the half-made result. */
static clpar_status failed(clpar_device *dev, clpar_status s, clpar_tensor *r) {
  clpar_device_fail(dev, s);
  clpar_tensor_free(r);
  return s;
}

/* Keeps an alias of the op's output r in its node (for a backward computed from the output);
 * on failure frees r, which takes the node with it. */
static clpar_status save_output(clpar_node *node, clpar_tensor *r) {
  clpar_status s = clpar_tensor_alias(r, &node->saved[0]);
  if (s == CLPAR_OK)
    clpar_tensor_unscope(node->saved[0]);
  else
    clpar_tensor_free(r);
  return s;
}

static clpar_status unary_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_unary_kind kind = (clpar_unary_kind)n->iparam[0];
  clpar_tensor *saved = kind == CLPAR_UNARY_RELU ? n->inputs[0] : n->saved[0], *r;
  clpar_device *dev = n->dev;
  clpar_status s = clpar_tensor_empty(dev, g->ndim, g->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_unary_backward(dev, kind, (size_t)g->numel, clpar_tensor_bref(g),
                               clpar_tensor_bref(saved), clpar_tensor_bref(r));
  if (s != CLPAR_OK) return failed(dev, s, r);
  gin[0] = r;
  return CLPAR_OK;
}

clpar_status clpar_unary_op(const char *fn, clpar_unary_kind kind, const clpar_tensor *x,
                            clpar_backward_fn backward, clpar_tensor **out) {
  if (out && clpar_autocast_takes(fn, x)) { /* in float32, the result in x's dtype */
    clpar_tensor *x32, *y = NULL;
    clpar_status s = clpar_autocast_widen(x, &x32);
    if (s == CLPAR_OK) s = clpar_unary_op(fn, kind, x32, backward, &y);
    return clpar_autocast_round(s, x32, y, x->dtype, out);
  }
  clpar_status s = check_input(fn, x, out);
  if (s != CLPAR_OK) return s;
  clpar_device *dev = x->storage->dev;
  clpar_tensor *r;
  s = clpar_tensor_empty(dev, x->ndim, x->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_unary(dev, kind, (size_t)x->numel, clpar_tensor_bref(x), clpar_tensor_bref(r));
  if (s != CLPAR_OK) return failed(dev, s, r);
  clpar_node *node;
  s = clpar_record_op(r, fn, backward ? backward : unary_backward, (clpar_tensor **)&x, 1, &node);
  if (s == CLPAR_OK && node) {
    node->iparam[0] = kind;
    if (kind != CLPAR_UNARY_RELU) s = save_output(node, r);
  }
  if (s == CLPAR_OK) *out = r;
  return s;
}

clpar_status clpar_relu(const clpar_tensor *x, clpar_tensor **out) {
  return clpar_unary_op("clpar_relu", CLPAR_UNARY_RELU, x, NULL, out);
}

clpar_status clpar_sigmoid(const clpar_tensor *x, clpar_tensor **out) {
  return clpar_unary_op("clpar_sigmoid", CLPAR_UNARY_SIGMOID, x, NULL, out);
}

clpar_status clpar_tanh(const clpar_tensor *x, clpar_tensor **out) {
  return clpar_unary_op("clpar_tanh", CLPAR_UNARY_TANH, x, NULL, out);
}

static clpar_status softmax_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *y = n->saved[0], *r;
  clpar_device *dev = n->dev;
  int64_t cols = g->shape[g->ndim - 1];
  clpar_status s = clpar_tensor_empty(dev, g->ndim, g->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_softmax_backward(dev, (int)n->iparam[0], (size_t)(g->numel / cols), (size_t)cols,
                                 clpar_tensor_bref(y), clpar_tensor_bref(g), clpar_tensor_bref(r));
  if (s != CLPAR_OK) return failed(dev, s, r);
  gin[0] = r;
  return CLPAR_OK;
}

static clpar_status softmax(const char *fn, int log, const clpar_tensor *x, clpar_tensor **out) {
  clpar_status s = check_input(fn, x, out);
  if (s != CLPAR_OK) return s;
  clpar_device *dev = x->storage->dev;
  int64_t cols = x->shape[x->ndim - 1];
  clpar_tensor *r;
  s = clpar_tensor_empty(dev, x->ndim, x->shape, &r);
  if (s != CLPAR_OK) return s;
  s = clpar_dev_softmax(dev, log, (size_t)(x->numel / cols), (size_t)cols, clpar_tensor_bref(x),
                        clpar_tensor_bref(r));
  if (s != CLPAR_OK) return failed(dev, s, r);
  clpar_node *node;
  s = clpar_record_op(r, fn, softmax_backward, (clpar_tensor **)&x, 1, &node);
  if (s == CLPAR_OK && node) {
    node->iparam[0] = log;
    s = save_output(node, r);
  }
  if (s == CLPAR_OK) *out = r;
  return s;
}

clpar_status clpar_softmax(const clpar_tensor *x, clpar_tensor **out) {
  return softmax("clpar_softmax", 0, x, out);
}

clpar_status clpar_log_softmax(const clpar_tensor *x, clpar_tensor **out) {
  return softmax("clpar_log_softmax", 1, x, out);
}
