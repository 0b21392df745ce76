/* autocast.c — the autocast regions (clpar/half.h): a per-thread stack of dtypes, which
 * clpar_linear, clpar_matmul and clpar_conv2d consult. */
#include <stdlib.h>

#include "internal.h"

enum { MAX_DEPTH = 16 };

static _Thread_local clpar_dtype stack[MAX_DEPTH];
static _Thread_local int depth;

clpar_status clpar_autocast_begin(clpar_dtype dtype) {
  if (!clpar_dtype_is_half(dtype))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_autocast_begin: dtype is %s (%d); it must be bfloat16 or float16",
                           clpar_dtype_name(dtype), (int)dtype);
  if (depth == MAX_DEPTH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_autocast_begin: more than %d regions open on this thread",
                           MAX_DEPTH);
  stack[depth++] = dtype;
  return CLPAR_OK;
}

void clpar_autocast_end(void) {
  if (depth == 0) {
    clpar_log(CLPAR_LOG_ERROR, "clpar_autocast_end: no autocast region is open on this thread");
    return;
  }
  depth--;
}

clpar_dtype clpar_autocast_dtype(void) {
  return depth ? stack[depth - 1] : CLPAR_FLOAT32;
}

int clpar_autocast_widens(const clpar_tensor *t) {
  return clpar_dtype_is_half(t->dtype) && clpar_autocast_dtype() != CLPAR_FLOAT32;
}

clpar_status clpar_check_float_autocast(const char *fn, const char *name, const clpar_tensor *t) {
  if (clpar_dtype_is_half(t->dtype) && clpar_autocast_dtype() != CLPAR_FLOAT32) return CLPAR_OK;
  clpar_status s = clpar_check_float(fn, name, t);
  if (s != CLPAR_OK && clpar_dtype_is_half(t->dtype))
    clpar_append_error(
        " (16-bit inputs are taken inside clpar_autocast_begin/end, or convert "
        "with clpar_to_dtype)");
  return s;
}

/* ---- Linear under autocast ----
 *
 * One node over the 16-bit copies of the input and the weight (each made by clpar_to_dtype,
 * so their gradients go back to float32 through its node): forward runs the GEMM on them
 * through the device's gemm_half (float32 products and sums; src/autocast_gemm.c), or, on a
 * device without it, widens them to float32 temporaries for gemm; then the bias-and-activation
 * epilogue in float32, and the result rounded to the autocast dtype. The node keeps the 16-bit
 * input, weight and (for an activation) output: half the bytes of float32's. Backward computes
 * in float32 and gives each input's gradient in its dtype: without an activation its GEMMs
 * take the 16-bit incoming gradient and input or weight as they are, through gemm_half as the
 * forward does; with one, they multiply the float32 gradient through the activation by the
 * input or weight widened. */

/* A float32 copy of t (no node, outside any scope), or t itself (one more reference) when it
 * is float32; either way dropped with clpar_tensor_release. */
static clpar_status widen(const clpar_tensor *t, clpar_tensor **out) {
  if (t->dtype == CLPAR_FLOAT32) {
    *out = clpar_tensor_retain((clpar_tensor *)t);
    return CLPAR_OK;
  }
  clpar_status s = clpar_convert_dtype(t, CLPAR_FLOAT32, out);
  if (s == CLPAR_OK) clpar_tensor_unscope(*out);
  return s;
}

/* C[m, n] = op(A) op(B) in float32 (beta 0), C new. */
static clpar_status gemm_new(clpar_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k,
                             const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **c) {
  int64_t shape[2] = {m, n};
  clpar_status s = clpar_tensor_empty(dev, 2, shape, c);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(*c);
  s = clpar_dev_gemm(dev, ta, tb, (size_t)m, (size_t)n, (size_t)k, 1.0f, clpar_tensor_bref(a),
                     (size_t)(ta ? m : k), clpar_tensor_bref(b), (size_t)(tb ? k : n), 0.0f,
                     clpar_tensor_bref(*c), (size_t)n);
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_release(*c);
    *c = NULL;
  }
  return s;
}

/* gin = g32 converted to like's dtype (or g32 itself), in the caller's scope. */
static clpar_status narrow_grad(clpar_tensor *g32, const clpar_tensor *like, clpar_tensor **gin) {
  if (like->dtype == CLPAR_FLOAT32) {
    *gin = clpar_tensor_retain(g32);
    return CLPAR_OK;
  }
  return clpar_convert_dtype(g32, like->dtype, gin);
}

/* d = g * act'(y) in float32 and, when the bias wants one, its gradient (into its slot or a
 * new gin[2]). */
static clpar_status ac_act_backward(clpar_node *n, const clpar_tensor *g32, clpar_tensor **d,
                                    clpar_tensor **gin) {
  clpar_tensor *b = n->n_inputs > 2 ? n->inputs[2] : NULL, *db = NULL, *y32 = NULL;
  clpar_act_kind act = (clpar_act_kind)n->iparam[0];
  clpar_device *dev = n->dev;
  int want_b = b && b->requires_grad, b_slot = 0;
  *d = clpar_tensor_retain((clpar_tensor *)g32);
  if (!want_b && act == CLPAR_ACT_NONE) return CLPAR_OK;
  clpar_status s = want_b ? clpar_grad_slot(n, 2, &db) : CLPAR_OK;
  b_slot = db != NULL;
  if (s == CLPAR_OK && want_b && !db) s = clpar_tensor_empty(dev, b->ndim, b->shape, &db);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE) s = widen(n->saved[0], &y32);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE) {
    clpar_tensor_release(*d);
    s = clpar_tensor_empty(dev, 2, g32->shape, d);
    if (s == CLPAR_OK) clpar_tensor_unscope(*d);
  }
  clpar_bref none = {NULL, 0};
  if (s == CLPAR_OK) {
    s = clpar_dev_bias_act_backward(dev, act, (size_t)g32->shape[0], (size_t)g32->shape[1],
                                    clpar_tensor_bref(g32), y32 ? clpar_tensor_bref(y32) : none,
                                    act != CLPAR_ACT_NONE ? clpar_tensor_bref(*d) : none,
                                    want_b ? clpar_tensor_bref(db) : none, b_slot);
    if (s != CLPAR_OK) clpar_device_fail(dev, s);
  }
  clpar_tensor_release(y32);
  if (s == CLPAR_OK && want_b && !b_slot) s = narrow_grad(db, b, &gin[2]);
  clpar_tensor_free(db);
  return s;
}

/* r = op(d) o in float32 ([m, k] by [k, n]): gemm_half on dh and o where dh is d's 16-bit
 * source (d widened from it exactly) and the device has the entry, else d by o widened. */
static clpar_status ac_backward_gemm(clpar_device *dev, int ta, int64_t m, int64_t n, int64_t k,
                                     const clpar_tensor *d, const clpar_tensor *dh,
                                     const clpar_tensor *o, clpar_tensor **r) {
  clpar_tensor *o32 = NULL;
  int done = 0;
  clpar_status s = dh ? clpar_autocast_gemm_half(dev, ta, 0, m, n, k, dh, o, r, &done) : CLPAR_OK;
  if (s == CLPAR_OK && !done) s = widen(o, &o32);
  if (s == CLPAR_OK && !done) s = gemm_new(dev, ta, 0, m, n, k, d, o32, r);
  clpar_tensor_release(o32);
  return s;
}

static clpar_status ac_linear_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *x = n->inputs[0], *w = n->inputs[1];
  clpar_device *dev = n->dev;
  int64_t rows = g->shape[0], cols = g->shape[1], in = w->shape[1];
  clpar_tensor *g32 = NULL, *d = NULL, *r32 = NULL;
  /* without an activation d is g32, g widened exactly: the GEMMs may take g itself */
  const clpar_tensor *dh = n->iparam[0] == CLPAR_ACT_NONE ? g : NULL;
  clpar_status s = widen(g, &g32);
  if (s == CLPAR_OK) s = ac_act_backward(n, g32, &d, gin);
  if (s == CLPAR_OK && w->requires_grad) { /* dW = d^T x: [cols, in] */
    s = ac_backward_gemm(dev, 1, cols, in, rows, d, dh, x, &r32);
    if (s == CLPAR_OK) s = narrow_grad(r32, w, &gin[1]);
    clpar_tensor_release(r32);
    r32 = NULL;
  }
  if (s == CLPAR_OK && x->requires_grad) { /* dx = d W: [rows, in] */
    s = ac_backward_gemm(dev, 0, rows, in, cols, d, dh, w, &r32);
    if (s == CLPAR_OK) s = narrow_grad(r32, x, &gin[0]);
    clpar_tensor_release(r32);
  }
  clpar_tensor_release(g32), clpar_tensor_release(d);
  return s;
}

/* y32 = x W^T (gemm_half, or x32 W32^T), then the bias and the activation, in float32. */
static clpar_status ac_linear_compute(const clpar_tensor *xh, const clpar_tensor *wh,
                                      const clpar_tensor *b, clpar_act_kind act,
                                      clpar_tensor **y32) {
  clpar_device *dev = xh->storage->dev;
  int64_t rows = xh->shape[0], cols = wh->shape[0], in = xh->shape[1];
  clpar_tensor *x32 = NULL, *w32 = NULL, *b32 = NULL;
  int done = 0;
  clpar_status s = clpar_autocast_gemm_half(dev, 0, 1, rows, cols, in, xh, wh, y32, &done);
  if (s == CLPAR_OK && !done) s = widen(xh, &x32);
  if (s == CLPAR_OK && !done) s = widen(wh, &w32);
  if (s == CLPAR_OK && b) s = widen(b, &b32); /* a 16-bit bias (clpar_master_weights) */
  if (s == CLPAR_OK && !done) s = gemm_new(dev, 0, 1, rows, cols, in, x32, w32, y32);
  clpar_tensor_release(x32), clpar_tensor_release(w32);
  if (s != CLPAR_OK && done) clpar_tensor_release(*y32), *y32 = NULL;
  if (s != CLPAR_OK || (!b && act == CLPAR_ACT_NONE)) {
    clpar_tensor_release(b32);
    return s;
  }
  clpar_bref y = clpar_tensor_bref(*y32);
  if (b)
    s = clpar_dev_bias_act(dev, act, (size_t)rows, (size_t)cols, y, clpar_tensor_bref(b32), y);
  else
    s = clpar_dev_unary(dev,
                        act == CLPAR_ACT_RELU      ? CLPAR_UNARY_RELU
                        : act == CLPAR_ACT_SIGMOID ? CLPAR_UNARY_SIGMOID
                                                   : CLPAR_UNARY_TANH,
                        (size_t)(rows * cols), y, y);
  clpar_tensor_release(b32);
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_release(*y32);
    *y32 = NULL;
  }
  return s;
}

/* The node on yh over xh, wh (and b); for an activation it keeps an alias of yh. On failure
 * yh is freed. */
static clpar_status ac_linear_record(clpar_tensor *yh, clpar_tensor *xh, clpar_tensor *wh,
                                     const clpar_tensor *b, clpar_act_kind act) {
  clpar_tensor *inputs[3] = {xh, wh, (clpar_tensor *)b};
  clpar_node *node;
  clpar_status s =
      clpar_record_op(yh, "clpar_linear (autocast)", ac_linear_backward, inputs, b ? 3 : 2, &node);
  if (s != CLPAR_OK || !node) return s; /* a failed record freed yh */
  node->iparam[0] = act;
  if (act == CLPAR_ACT_NONE) return CLPAR_OK;
  s = clpar_tensor_alias(yh, &node->saved[0]); /* no reference cycle */
  if (s == CLPAR_OK)
    clpar_tensor_unscope(node->saved[0]);
  else
    clpar_tensor_free(yh);
  return s;
}

clpar_status clpar_autocast_linear(const clpar_tensor *x, const clpar_tensor *weight,
                                   const clpar_tensor *bias, clpar_act_kind act,
                                   clpar_tensor **out) {
  clpar_dtype dt = clpar_autocast_dtype();
  clpar_tensor *xh = NULL, *wh = NULL, *y32 = NULL, *yh = NULL;
  clpar_status s = clpar_to_dtype(x, dt, &xh);
  if (s == CLPAR_OK) s = clpar_to_dtype(weight, dt, &wh);
  if (s == CLPAR_OK) s = ac_linear_compute(xh, wh, bias, act, &y32);
  if (s == CLPAR_OK) s = clpar_convert_dtype(y32, dt, &yh);
  clpar_tensor_release(y32);
  if (s == CLPAR_OK) {
    s = ac_linear_record(yh, xh, wh, bias, act);
    if (s == CLPAR_OK) *out = yh;
  }
  clpar_tensor_free(xh), clpar_tensor_free(wh); /* the node holds them */
  return s;
}

/* ---- matmul under autocast: the same scheme; each GEMM through gemm_half where both operands
 * are of one 16-bit dtype (the forward's; backward's, whose incoming gradient is of the
 * result's dtype: clpar_backward seeds ones of it, clpar_backward_grad converts to it) and the
 * device has the entry, else the float32 work done by clpar_matmul itself on float32 copies
 * that need no gradient (so it records no node), with autocast suspended on this thread while
 * it runs ---- */

static int suspend(void) {
  int d = depth;
  depth = 0;
  return d;
}

/* r = op(a) op(b) in float32 from a and b of any float dtype; no node. */
static clpar_status matmul32(const clpar_tensor *a, const clpar_tensor *b, int ta, int tb,
                             clpar_tensor **r) {
  clpar_tensor *a32 = NULL, *b32 = NULL;
  clpar_status s = widen(a, &a32);
  if (s == CLPAR_OK) s = widen(b, &b32);
  int was = clpar_set_grad_enabled(0), d = suspend();
  if (s == CLPAR_OK) s = clpar_matmul(a32, b32, ta, tb, r);
  depth = d;
  clpar_set_grad_enabled(was);
  clpar_tensor_release(a32), clpar_tensor_release(b32);
  return s;
}

/* r = op(a) op(b) in float32, a and b of any float dtype: gemm_half for a valid pair of one
 * 16-bit dtype on one device, else matmul32 (which also reports what is wrong with them). */
static clpar_status ac_matmul_gemm(const clpar_tensor *a, const clpar_tensor *b, int ta, int tb,
                                   clpar_tensor **r) {
  int done = 0;
  clpar_status s = CLPAR_OK;
  if (a->ndim == 2 && b->ndim == 2 && a->storage->dev == b->storage->dev &&
      a->shape[ta ? 0 : 1] == b->shape[tb ? 1 : 0])
    s = clpar_autocast_gemm_half(a->storage->dev, ta, tb, a->shape[ta ? 1 : 0],
                                 b->shape[tb ? 0 : 1], a->shape[ta ? 0 : 1], a, b, r, &done);
  return s != CLPAR_OK || done ? s : matmul32(a, b, ta, tb, r);
}

static clpar_status ac_matmul_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *a = n->inputs[0], *b = n->inputs[1], *r = NULL;
  int ta = (int)n->iparam[0], tb = (int)n->iparam[1];
  clpar_status s = CLPAR_OK;
  if (a->requires_grad) {
    s = ta ? ac_matmul_gemm(b, g, tb, 1, &r) : ac_matmul_gemm(g, b, 0, !tb, &r);
    if (s == CLPAR_OK) s = narrow_grad(r, a, &gin[0]);
    clpar_tensor_free(r);
    r = NULL;
  }
  if (s == CLPAR_OK && b->requires_grad) {
    s = tb ? ac_matmul_gemm(g, a, 1, ta, &r) : ac_matmul_gemm(a, g, !ta, 0, &r);
    if (s == CLPAR_OK) s = narrow_grad(r, b, &gin[1]);
    clpar_tensor_free(r);
  }
  return s;
}

clpar_status clpar_autocast_matmul(const clpar_tensor *a, const clpar_tensor *b, int trans_a,
                                   int trans_b, clpar_tensor **out) {
  clpar_dtype dt = clpar_autocast_dtype();
  clpar_tensor *ah = NULL, *bh = NULL, *r32 = NULL, *rh = NULL;
  clpar_status s = clpar_check_alive("clpar_matmul", a);
  if (s == CLPAR_OK) s = clpar_check_alive("clpar_matmul", b);
  if (s == CLPAR_OK) s = clpar_check_float_autocast("clpar_matmul", "a", a);
  if (s == CLPAR_OK) s = clpar_check_float_autocast("clpar_matmul", "b", b);
  if (s == CLPAR_OK) s = clpar_to_dtype(a, dt, &ah);
  if (s == CLPAR_OK) s = clpar_to_dtype(b, dt, &bh);
  if (s == CLPAR_OK) s = ac_matmul_gemm(ah, bh, trans_a != 0, trans_b != 0, &r32);
  if (s == CLPAR_OK) s = clpar_convert_dtype(r32, dt, &rh);
  clpar_tensor_free(r32);
  clpar_node *node = NULL;
  clpar_tensor *in[2] = {ah, bh};
  if (s == CLPAR_OK)
    s = clpar_record_op(rh, "clpar_matmul (autocast)", ac_matmul_backward, in, 2, &node);
  if (node) node->iparam[0] = trans_a != 0, node->iparam[1] = trans_b != 0;
  if (s == CLPAR_OK) *out = rh;
  clpar_tensor_free(ah), clpar_tensor_free(bh); /* the node holds them */
  return s;
}

/* ---- elementwise add, sub, mul, div under autocast: compositions of recorded ops ---- */

clpar_status clpar_autocast_binary(clpar_status (*op)(const clpar_tensor *, const clpar_tensor *,
                                                      clpar_tensor **),
                                   const clpar_tensor *a, const clpar_tensor *b,
                                   clpar_tensor **out) {
  clpar_tensor *a32 = NULL, *b32 = NULL, *r = NULL;
  clpar_status s = clpar_to_dtype(a, CLPAR_FLOAT32, &a32);
  if (s == CLPAR_OK) s = clpar_to_dtype(b, CLPAR_FLOAT32, &b32);
  if (s == CLPAR_OK) s = op(a32, b32, &r);
  if (s == CLPAR_OK && a->dtype == b->dtype) {
    s = clpar_to_dtype(r, a->dtype, out);
    clpar_tensor_free(r); /* the graph holds it */
  } else if (s == CLPAR_OK) {
    *out = r;
  }
  clpar_tensor_free(a32), clpar_tensor_free(b32);
  return s;
}

/* ---- ops that run in float32 on a 16-bit input and return its dtype (activations,
 * normalization, pooling), and the convolution ---- */

int clpar_autocast_takes(const char *fn, const clpar_tensor *x) {
  return x && clpar_check_alive(fn, x) == CLPAR_OK && clpar_autocast_widens(x);
}

clpar_status clpar_autocast_widen(const clpar_tensor *x, clpar_tensor **x32) {
  *x32 = NULL;
  return clpar_to_dtype(x, CLPAR_FLOAT32, x32);
}

clpar_status clpar_autocast_round(clpar_status s, clpar_tensor *x32, clpar_tensor *y32,
                                  clpar_dtype dtype, clpar_tensor **out) {
  if (s == CLPAR_OK) s = clpar_to_dtype(y32, dtype, out);
  clpar_tensor_free(y32), clpar_tensor_free(x32);
  return s;
}

/* ---- conv2d under autocast: Linear's scheme. One node over the 16-bit copies of the input,
 * the weight and the bias (each made by clpar_to_dtype): forward widens them to float32
 * temporaries and convolves in float32 (the devices' convolutions are float32), the output
 * rounded to the dtype; the node keeps only the 16-bit copies, and backward widens them
 * again, computes every gradient in float32 and gives each in its input's dtype. The numbers
 * are those of the casts written out (round, widen, convolve, round). ---- */

static clpar_status ac_conv_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  clpar_tensor *g32 = NULL, *x32 = NULL, *w32 = NULL, *r[3] = {0};
  int want[3] = {0};
  for (int i = 0; i < n->n_inputs; i++) want[i] = n->inputs[i]->requires_grad;
  clpar_status s = widen(g, &g32);
  if (s == CLPAR_OK) s = widen(n->inputs[0], &x32);
  if (s == CLPAR_OK) s = widen(n->inputs[1], &w32);
  if (s == CLPAR_OK) s = clpar_conv2d_grads(x32, w32, n->ctx, g32, want, r);
  clpar_tensor_release(g32), clpar_tensor_release(x32), clpar_tensor_release(w32);
  for (int i = 0; i < 3; i++) {
    if (s == CLPAR_OK && r[i]) s = narrow_grad(r[i], n->inputs[i], &gin[i]);
    clpar_tensor_free(r[i]);
  }
  return s;
}

/* y32 = conv2d(h[0], h[1], h[2]) in float32 on widened copies, with no node. */
static clpar_status ac_conv_compute(clpar_tensor *const h[3], const clpar_conv2d_options *options,
                                    clpar_tensor **y32) {
  clpar_tensor *f[3] = {0};
  clpar_status s = CLPAR_OK;
  for (int i = 0; i < 3 && s == CLPAR_OK; i++)
    if (h[i]) s = widen(h[i], &f[i]);
  int was = clpar_set_grad_enabled(0), d = suspend();
  if (s == CLPAR_OK) s = clpar_conv2d(f[0], f[1], f[2], options, y32);
  depth = d;
  clpar_set_grad_enabled(was);
  if (s == CLPAR_OK) clpar_tensor_unscope(*y32);
  for (int i = 0; i < 3; i++) clpar_tensor_release(f[i]);
  return s;
}

clpar_status clpar_autocast_conv2d(const clpar_tensor *x, const clpar_tensor *weight,
                                   const clpar_tensor *bias, const clpar_conv2d_options *options,
                                   clpar_tensor **out) {
  clpar_dtype dt = clpar_autocast_dtype();
  const clpar_tensor *in[3] = {x, weight, bias};
  clpar_tensor *h[3] = {0}, *y32 = NULL, *yh = NULL;
  clpar_conv2d_options *ctx = NULL;
  clpar_status s = CLPAR_OK;
  for (int i = 0; i < 3 && s == CLPAR_OK; i++)
    if (in[i]) s = clpar_to_dtype(in[i], dt, &h[i]);
  if (s == CLPAR_OK) s = ac_conv_compute(h, options, &y32);
  if (s == CLPAR_OK) s = clpar_convert_dtype(y32, dt, &yh);
  clpar_tensor_release(y32);
  if (s == CLPAR_OK && clpar_needs_grad(h, 3) && !(ctx = malloc(sizeof *ctx))) {
    clpar_tensor_free(yh);
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_conv2d: out of host memory");
  }
  if (ctx) *ctx = options ? *options : (clpar_conv2d_options){{0, 0}, {0, 0}, {0, 0}, 0};
  if (s == CLPAR_OK)
    s = clpar_record_op_keep(yh, "clpar_conv2d (autocast)", ac_conv_backward, h, bias ? 3 : 2, ctx,
                             NULL, 0, NULL, out);
  for (int i = 0; i < 3; i++) clpar_tensor_free(h[i]); /* the node holds them */
  return s;
}
