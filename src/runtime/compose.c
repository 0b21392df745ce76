/* compose.c — the fused optional entries (softmax_backward, nll, nll_backward, xent,
 * xent_backward, sgd_step, adam_step, bias_act, bias_act_backward, linear_act,
 * linear_act_backward) built from primitive entries, for a device whose backend lacks them or
 * refuses them (supports_op), so that a new backend can start with the primitives only.
 *
 * The dispatch (src/runtime/worker.c) calls clpar_compose_<entry> instead of posting the entry when
 * the entry's bit is set in dev->composed. A composition runs on the calling thread like the
 * entry's posting would: it takes scratch memory from the device's cache, posts primitive
 * entries (fill, copy, binary, scale, unary, gemm, pick) to the device's queue in order, and gives
 * the scratch back at once (later work on the same queue runs after the primitives, and the
 * allocator orders other queues' use of a cached buffer). It never waits.
 *
 * Each composition follows the fused entry's formula (backend.h) operation by operation, in
 * the host backend's order of rounding, so that it matches the fused entry to a few ulps;
 * the only difference is that the host's softmax backward sums rows in double and this one
 * in float (a GEMM with a vector of ones). */
#include <math.h>
#include <string.h>

#include "runtime.h"

/* One scratch buffer from the device's cache, cut into regions of floats. */
typedef struct {
  clpar_device *dev;
  void *buf;
  size_t capacity;
} scratch;

/* parts regions of n floats, then extra floats (region(sc, n, parts) is where they start). */
static clpar_status scratch_get(clpar_device *dev, const char *op, size_t n, size_t parts,
                                size_t extra, scratch *sc) {
  sc->dev = dev;
  sc->buf = NULL;
  size_t limit = SIZE_MAX / sizeof(float);
  if (n > (limit - extra) / parts)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: %s: %zu x %zu floats of scratch overflow",
                           dev->bd.info.id, op, parts, n);
  return clpar_alloc_buffer(dev, (n * parts + extra) * sizeof(float), &sc->buf, &sc->capacity);
}

static clpar_bref region(const scratch *sc, size_t n, size_t i) {
  clpar_bref r = {sc->buf, i * n};
  return r;
}

static void scratch_put(scratch *sc) {
  if (sc->buf) clpar_free_buffer(sc->dev, sc->buf, sc->capacity, NULL);
  sc->buf = NULL;
}

/* Elementwise out = a (op) b over n elements: one row of n columns. */
static clpar_status ew(clpar_device *dev, clpar_binary_kind kind, size_t n, clpar_bref a,
                       clpar_bref b, clpar_bref out) {
  return clpar_dev_binary(dev, kind, 1, n, a, b, 1, out);
}

static clpar_status copy_floats(clpar_device *dev, clpar_bref dst, clpar_bref src, size_t n) {
  return clpar_dev_copy(dev, dst.buf, dst.off * sizeof(float), src.buf, src.off * sizeof(float),
                        n * sizeof(float));
}

/* ---- softmax backward ----
 *   softmax:     out = y * (g - rowsum(g * y))
 *   log-softmax: out = g - exp(y) * rowsum(g)
 * rowsum(x) is x @ ones (rows x 1), and s broadcast over a row is s @ ones^T (k = 1). */
clpar_status clpar_compose_softmax_backward(clpar_device *dev, int log, size_t rows, size_t cols,
                                            clpar_bref y, clpar_bref g, clpar_bref out) {
  if (rows > SIZE_MAX / cols)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: softmax_backward: %zu x %zu overflows",
                           dev->bd.info.id, rows, cols);
  size_t n = rows * cols;
  scratch sc; /* tmp, tmp2 (n each), then ones (cols) and sums (rows) */
  clpar_status s = scratch_get(dev, "softmax_backward", n, 2, cols + rows, &sc);
  if (s != CLPAR_OK) return s;
  clpar_bref tmp = region(&sc, n, 0), tmp2 = region(&sc, n, 1), ones = region(&sc, n, 2);
  clpar_bref sums = {sc.buf, ones.off + cols};
  s = clpar_dev_fill(dev, ones, cols, 1.0f);
  if (!log) {
    if (s == CLPAR_OK) s = clpar_dev_binary(dev, CLPAR_BINARY_MUL, rows, cols, g, y, rows, tmp);
    if (s == CLPAR_OK)
      s = clpar_dev_gemm(dev, 0, 0, rows, 1, cols, 1.0f, tmp, cols, ones, 1, 0.0f, sums, 1);
    if (s == CLPAR_OK) s = copy_floats(dev, tmp, g, n);
    if (s == CLPAR_OK) /* tmp = g - sums @ ones^T */
      s = clpar_dev_gemm(dev, 0, 0, rows, cols, 1, -1.0f, sums, 1, ones, cols, 1.0f, tmp, cols);
    if (s == CLPAR_OK) s = clpar_dev_binary(dev, CLPAR_BINARY_MUL, rows, cols, y, tmp, rows, out);
  } else {
    if (s == CLPAR_OK)
      s = clpar_dev_gemm(dev, 0, 0, rows, 1, cols, 1.0f, g, cols, ones, 1, 0.0f, sums, 1);
    if (s == CLPAR_OK) s = clpar_dev_unary(dev, CLPAR_UNARY_EXP, n, y, tmp);
    if (s == CLPAR_OK)
      s = clpar_dev_gemm(dev, 0, 0, rows, cols, 1, 1.0f, sums, 1, ones, cols, 0.0f, tmp2, cols);
    if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_MUL, n, tmp, tmp2, tmp);
    if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_SUB, n, g, tmp, out);
  }
  scratch_put(&sc);
  return s;
}

/* ---- SGD (torch.optim.SGD; clpar_sgd_args in backend.h) ----
 *   g = grad + wd * p
 *   momentum: buf = first ? g : momentum * buf + (1 - dampening) * g
 *             g = nesterov ? g + momentum * buf : buf
 *   p = p - lr * g
 * grad is never written. */
clpar_status clpar_compose_sgd_step(clpar_device *dev, size_t n, clpar_bref param, clpar_bref grad,
                                    clpar_bref buf, clpar_sgd_args a) {
  scratch sc;
  clpar_status s = scratch_get(dev, "sgd_step", n, 2, 0, &sc);
  if (s != CLPAR_OK) return s;
  clpar_bref g2 = region(&sc, n, 0), t = region(&sc, n, 1), g = grad;
  if (a.weight_decay != 0.0f) {
    s = clpar_dev_scale(dev, n, a.weight_decay, param, g2);
    if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_ADD, n, grad, g2, g2);
    g = g2;
  }
  if (s == CLPAR_OK && a.momentum != 0.0f) {
    if (a.first) {
      s = copy_floats(dev, buf, g, n);
    } else {
      s = clpar_dev_scale(dev, n, a.momentum, buf, buf);
      clpar_bref damped = g;
      if (s == CLPAR_OK && a.dampening != 0.0f) {
        s = clpar_dev_scale(dev, n, 1.0f - a.dampening, g, t);
        damped = t;
      }
      if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_ADD, n, buf, damped, buf);
    }
    if (s == CLPAR_OK && a.nesterov) {
      s = clpar_dev_scale(dev, n, a.momentum, buf, t);
      if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_ADD, n, g, t, g2);
      g = g2;
    } else {
      g = buf;
    }
  }
  if (s == CLPAR_OK) s = clpar_dev_scale(dev, n, a.lr, g, t);
  if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_SUB, n, param, t, param);
  scratch_put(&sc);
  return s;
}

/* ---- Adam and AdamW (torch.optim.Adam/AdamW; clpar_adam_args in backend.h) ----
 *   AdamW: p = p * keep;  Adam: g = grad + wd * p
 *   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
 *   p = p - (step * m) / (sqrt(v) / root2 + eps)
 * Each operation rounds on its own here: within an ulp or so of the fused entries' fma. */
clpar_status clpar_compose_adam_step(clpar_device *dev, size_t n, clpar_bref param, clpar_bref grad,
                                     clpar_bref m, clpar_bref v, clpar_adam_args a) {
  scratch sc;
  clpar_status s = scratch_get(dev, "adam_step", n, 3, 0, &sc);
  if (s != CLPAR_OK) return s;
  clpar_bref g2 = region(&sc, n, 0), t = region(&sc, n, 1), e = region(&sc, n, 2), g = grad;
  float step = a.step, root2 = a.root2;
  if (a.decoupled) {
    if (a.keep != 1.0f) s = clpar_dev_scale(dev, n, a.keep, param, param);
  } else if (a.weight_decay != 0.0f) {
    s = clpar_dev_scale(dev, n, a.weight_decay, param, g2);
    if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_ADD, n, grad, g2, g2);
    g = g2;
  }
  /* m = beta1 * m + (1 - beta1) * g */
  if (s == CLPAR_OK) s = clpar_dev_scale(dev, n, a.beta1, m, m);
  if (s == CLPAR_OK) s = clpar_dev_scale(dev, n, a.one_minus_beta1, g, t);
  if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_ADD, n, m, t, m);
  /* v = beta2 * v + ((1 - beta2) * g) * g */
  if (s == CLPAR_OK) s = clpar_dev_scale(dev, n, a.beta2, v, v);
  if (s == CLPAR_OK) s = clpar_dev_scale(dev, n, a.one_minus_beta2, g, t);
  if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_MUL, n, t, g, t);
  if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_ADD, n, v, t, v);
  /* t = sqrt(v) / root2 + eps (each a full-length operand: no scalar primitive needed) */
  if (s == CLPAR_OK) s = clpar_dev_unary(dev, CLPAR_UNARY_SQRT, n, v, t);
  if (s == CLPAR_OK) s = clpar_dev_fill(dev, e, n, root2);
  if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_DIV, n, t, e, t);
  if (s == CLPAR_OK) s = clpar_dev_fill(dev, e, n, a.eps);
  if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_ADD, n, t, e, t);
  /* p = p - (step * m) / t */
  if (s == CLPAR_OK) s = clpar_dev_scale(dev, n, step, m, e);
  if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_DIV, n, e, t, e);
  if (s == CLPAR_OK) s = ew(dev, CLPAR_BINARY_SUB, n, param, e, param);
  scratch_put(&sc);
  return s;
}

/* ---- nll (labels are int32 class indices, checked by the caller) ----
 *   nll:          out[r] = -a[r, labels[r]]
 *   nll_backward: out[r, c] = c == labels[r] ? -g[r] : 0 */
clpar_status clpar_compose_nll(clpar_device *dev, size_t rows, size_t cols, clpar_bref a,
                               clpar_bref labels, clpar_bref out) {
  clpar_status s = clpar_dev_pick(dev, 0, rows, cols, labels, a, out);
  if (s == CLPAR_OK) s = clpar_dev_unary(dev, CLPAR_UNARY_NEG, rows, out, out);
  return s;
}

clpar_status clpar_compose_nll_backward(clpar_device *dev, size_t rows, size_t cols,
                                        clpar_bref labels, clpar_bref g, clpar_bref out) {
  if (rows > SIZE_MAX / cols)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: nll_backward: %zu x %zu overflows",
                           dev->bd.info.id, rows, cols);
  scratch sc; /* -g */
  clpar_status s = scratch_get(dev, "nll_backward", rows, 1, 0, &sc);
  if (s != CLPAR_OK) return s;
  clpar_bref neg = region(&sc, rows, 0);
  s = clpar_dev_fill(dev, out, rows * cols, 0.0f);
  if (s == CLPAR_OK) s = clpar_dev_unary(dev, CLPAR_UNARY_NEG, rows, g, neg);
  if (s == CLPAR_OK) s = clpar_dev_pick(dev, 1, rows, cols, labels, neg, out);
  scratch_put(&sc);
  return s;
}

/* ---- softmax cross-entropy (targets as nll_ignore) ----
 *   xent:          logp = log_softmax(a); loss, weight = nll_ignore(logp)
 *   xent_backward: s = g / count or alpha g; d = nll_ignore_backward(s);
 *                  out = log_softmax's backward of d from logp */
clpar_status clpar_compose_xent(clpar_device *dev, size_t rows, size_t cols, int idx64,
                                int64_t ignore, clpar_bref a, clpar_bref idx, clpar_bref loss,
                                clpar_bref weight) {
  if (rows > SIZE_MAX / cols)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: xent: %zu x %zu overflows", dev->bd.info.id,
                           rows, cols);
  scratch sc; /* logp */
  clpar_status s = scratch_get(dev, "xent", rows * cols, 1, 0, &sc);
  if (s != CLPAR_OK) return s;
  clpar_bref logp = region(&sc, rows * cols, 0);
  s = clpar_dev_softmax(dev, 1, rows, cols, a, logp);
  if (s == CLPAR_OK)
    s = clpar_dev_nll_ignore(dev, rows, cols, idx64, ignore, logp, idx, loss, weight);
  scratch_put(&sc);
  return s;
}

clpar_status clpar_compose_xent_backward(clpar_device *dev, size_t rows, size_t cols, int idx64,
                                         int64_t ignore, clpar_bref a, clpar_bref idx, clpar_bref g,
                                         clpar_bref count, float alpha, clpar_bref out) {
  if (rows > SIZE_MAX / cols)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: xent_backward: %zu x %zu overflows",
                           dev->bd.info.id, rows, cols);
  size_t n = rows * cols;
  scratch sc; /* logp, d, then s */
  clpar_status s = scratch_get(dev, "xent_backward", n, 2, 1, &sc);
  if (s != CLPAR_OK) return s;
  clpar_bref logp = region(&sc, n, 0), d = region(&sc, n, 1), sv = region(&sc, n, 2);
  if (count.buf)
    s = clpar_dev_binary(dev, CLPAR_BINARY_DIV, 1, 1, g, count, 1, sv);
  else
    s = clpar_dev_scale(dev, 1, alpha, g, sv);
  if (s == CLPAR_OK) s = clpar_dev_softmax(dev, 1, rows, cols, a, logp);
  if (s == CLPAR_OK) s = clpar_dev_nll_ignore_backward(dev, rows, cols, idx64, ignore, idx, sv, d);
  if (s == CLPAR_OK) s = clpar_dev_softmax_backward(dev, 1, rows, cols, logp, d, out);
  scratch_put(&sc);
  return s;
}

/* ---- the fused Linear epilogues ----
 *   bias_act:          out = f(a + bias)                  (a row add, then the activation)
 *   bias_act_backward: d = g * f'(y); out = d; db (+)= sum_rows(d)
 * relu's unary_backward reads the input's sign; the output's is the same (y > 0 iff x > 0). */

static clpar_unary_kind unary_of(clpar_act_kind act) {
  return act == CLPAR_ACT_SIGMOID ? CLPAR_UNARY_SIGMOID
         : act == CLPAR_ACT_TANH  ? CLPAR_UNARY_TANH
                                  : CLPAR_UNARY_RELU;
}

static clpar_status check_act(const clpar_device *dev, const char *entry, clpar_act_kind act) {
  if ((int)act >= CLPAR_ACT_NONE && act <= CLPAR_ACT_TANH) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %s: activation %d", dev->bd.info.id,
                         entry, (int)act);
}

clpar_status clpar_compose_bias_act(clpar_device *dev, clpar_act_kind act, size_t rows, size_t cols,
                                    clpar_bref a, clpar_bref bias, clpar_bref out) {
  clpar_status s = check_act(dev, "bias_act", act);
  if (s == CLPAR_OK) s = clpar_dev_binary(dev, CLPAR_BINARY_ADD, rows, cols, a, bias, 1, out);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE)
    s = clpar_dev_unary(dev, unary_of(act), rows * cols, out, out);
  return s;
}

clpar_status clpar_compose_bias_act_backward(clpar_device *dev, clpar_act_kind act, size_t rows,
                                             size_t cols, clpar_bref g, clpar_bref y,
                                             clpar_bref out, clpar_bref db, int accumulate) {
  clpar_status s = check_act(dev, "bias_act_backward", act);
  if (s != CLPAR_OK || (!out.buf && !db.buf)) return s;
  if (cols && rows > SIZE_MAX / cols)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: bias_act_backward: %zu x %zu overflows",
                           dev->bd.info.id, rows, cols);
  size_t n = rows * cols;
  /* scratch: d when out is not wanted (n), the column sums when they are added (cols) */
  int need_d = !out.buf && act != CLPAR_ACT_NONE, need_sum = db.buf && accumulate;
  scratch sc = {dev, NULL, 0};
  if (need_d || need_sum)
    s = scratch_get(dev, "bias_act_backward", need_d ? n : 0, 1, need_sum ? cols : 0, &sc);
  if (s != CLPAR_OK) return s;
  clpar_bref d = act == CLPAR_ACT_NONE ? g : need_d ? region(&sc, n, 0) : out;
  if (act != CLPAR_ACT_NONE)
    s = clpar_dev_unary_backward(dev, unary_of(act), n, g, y, d);
  else if (out.buf && (out.buf != g.buf || out.off != g.off))
    s = copy_floats(dev, out, g, n);
  if (s == CLPAR_OK && db.buf) {
    clpar_bref sums = need_sum ? region(&sc, need_d ? n : 0, 1) : db;
    s = clpar_dev_sum_rows(dev, rows, cols, d, sums);
    if (s == CLPAR_OK && need_sum) s = ew(dev, CLPAR_BINARY_ADD, cols, db, sums, db);
  }
  scratch_put(&sc);
  return s;
}

/* ---- entries that cannot be composed ----
 * The dispatch needs a composition for every optional queue entry, but these bits are never
 * set (not in composable_mask): a backend without profile, copy_peer, tune_gemm or
 * comm_allreduce has the entry posted as before, and it fails on the worker naming the entry
 * (profile), or is never called (copy_peer: transfer.c asks peer_access first; tune_gemm:
 * tune.c checks the table, workspace_trim: allocator.c too; comm_allreduce: DistributedDataParallel
 * checks the device has every comm_ entry). */

static clpar_status refuse(const clpar_device *dev, const char *what) {
  return clpar_set_error(CLPAR_ERROR_UNSUPPORTED, "%s: the %s backend has no %s", dev->bd.info.id,
                         dev->bd.info.backend, what);
}

clpar_status clpar_compose_profile(clpar_device *dev, int enable) {
  (void)enable;
  return refuse(dev, "profile");
}

clpar_status clpar_compose_profile_read(clpar_device *dev, double *seconds, uint64_t *ops) {
  (void)seconds;
  (void)ops;
  return refuse(dev, "profile_read");
}

/* A backend without its own convolution entries gets im2col and GEMMs from src/nn/conv.c,
 * which never posts these. */
/* linear_act: gemm (x w^T), then bias_act, or the activation's unary without a bias. */
clpar_status clpar_compose_linear_act(clpar_device *dev, clpar_act_kind act, size_t m, size_t n,
                                      size_t k, clpar_bref x, clpar_bref w, clpar_bref bias,
                                      clpar_bref out) {
  clpar_status s = check_act(dev, "linear_act", act);
  if (s == CLPAR_OK) s = clpar_dev_gemm(dev, 0, 1, m, n, k, 1.0f, x, k, w, k, 0.0f, out, n);
  if (s == CLPAR_OK && bias.buf) return clpar_dev_bias_act(dev, act, m, n, out, bias, out);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE)
    s = clpar_dev_unary(dev,
                        act == CLPAR_ACT_RELU      ? CLPAR_UNARY_RELU
                        : act == CLPAR_ACT_SIGMOID ? CLPAR_UNARY_SIGMOID
                                                   : CLPAR_UNARY_TANH,
                        m * n, out, out);
  return s;
}

/* linear_act_backward: bias_act_backward (d into scratch, db), then dw = d^T x and dx = d w
 * as GEMMs with beta 1 where they accumulate; the order of the Linear node's backward before
 * the entry existed, so that the composition gives its bits. */
clpar_status clpar_compose_linear_act_backward(clpar_device *dev, clpar_act_kind act, size_t m,
                                               size_t n, size_t k, clpar_bref g, clpar_bref y,
                                               clpar_bref x, clpar_bref w, clpar_bref scratch,
                                               clpar_bref dx, clpar_bref dw, clpar_bref db,
                                               int accumulate) {
  clpar_status s = check_act(dev, "linear_act_backward", act);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE && !scratch.buf)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: linear_act_backward: no scratch for d",
                        dev->bd.info.id);
  if (s != CLPAR_OK) return s;
  clpar_bref none = {NULL, 0}, d = act == CLPAR_ACT_NONE ? g : scratch;
  if (act != CLPAR_ACT_NONE || db.buf)
    s = clpar_dev_bias_act_backward(dev, act, m, n, g, y, act != CLPAR_ACT_NONE ? d : none, db,
                                    (accumulate & CLPAR_ACC_DB) != 0);
  if (s == CLPAR_OK && dw.buf)
    s = clpar_dev_gemm(dev, 1, 0, n, k, m, 1.0f, d, n, x, k,
                       accumulate & CLPAR_ACC_DW ? 1.0f : 0.0f, dw, k);
  if (s == CLPAR_OK && dx.buf)
    s = clpar_dev_gemm(dev, 0, 0, m, k, n, 1.0f, d, n, w, k,
                       accumulate & CLPAR_ACC_DX ? 1.0f : 0.0f, dx, k);
  return s;
}

clpar_status clpar_compose_conv2d(clpar_device *dev, clpar_conv2d_shape s, clpar_bref x,
                                  clpar_bref weight, clpar_bref bias, clpar_bref y) {
  (void)s, (void)x, (void)weight, (void)bias, (void)y;
  return refuse(dev, "conv2d");
}

clpar_status clpar_compose_conv2d_backward(clpar_device *dev, clpar_conv2d_shape s, clpar_bref x,
                                           clpar_bref weight, clpar_bref gy, clpar_bref dx,
                                           clpar_bref dw, clpar_bref db) {
  (void)s, (void)x, (void)weight, (void)gy, (void)dx, (void)dw, (void)db;
  return refuse(dev, "conv2d_backward");
}

clpar_status clpar_compose_copy_peer(clpar_device *dev, void *peer, void *dst, size_t dst_off_bytes,
                                     const void *src, size_t src_off_bytes, size_t bytes) {
  (void)peer, (void)dst, (void)dst_off_bytes, (void)src, (void)src_off_bytes, (void)bytes;
  return refuse(dev, "copy_peer");
}

clpar_status clpar_compose_workspace_trim(clpar_device *dev) { /* allocator.c asks the table */
  return refuse(dev, "workspace_trim");
}

clpar_status clpar_compose_tune_gemm(clpar_device *dev, const clpar_gemm_shape *shapes,
                                     int n_shapes, const clpar_tune_options *options,
                                     clpar_tune_result *result) {
  (void)shapes, (void)n_shapes, (void)options, (void)result;
  return refuse(dev, "tune_gemm");
}

/* Never posted while its bit is set: the core widens the 16-bit operands into float32 tensors
 * and calls gemm itself (src/autocast_gemm.c), counting the call in composed_calls. */
clpar_status clpar_compose_gemm_half(clpar_device *dev, int bf16, int trans_a, int trans_b,
                                     size_t m, size_t n, size_t k, float alpha, clpar_bref a,
                                     size_t lda, clpar_bref b, size_t ldb, float beta, clpar_bref c,
                                     size_t ldc) {
  (void)bf16, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a;
  (void)lda, (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
  return refuse(dev, "gemm_half");
}

/* Never posted: capture fuses a chain only on a device whose backend has ew_chain. */
clpar_status clpar_compose_ew_chain(clpar_device *dev, const clpar_ew_chain *chain) {
  (void)chain;
  return refuse(dev, "ew_chain");
}

clpar_status clpar_compose_comm_allreduce(clpar_device *dev, void *comm, clpar_bref data, size_t n,
                                          double timeout_s) {
  (void)comm, (void)data, (void)n, (void)timeout_s;
  return refuse(dev, "comm_allreduce");
}

/* ---- which entries are composed ---- */

/* The entries composed above (all below 64: word 0 of a device's masks). */
_Static_assert(CLPAR_ENTRY_softmax_backward < 64 && CLPAR_ENTRY_nll < 64 &&
                   CLPAR_ENTRY_nll_backward < 64 && CLPAR_ENTRY_sgd_step < 64 &&
                   CLPAR_ENTRY_adam_step < 64 && CLPAR_ENTRY_bias_act < 64 &&
                   CLPAR_ENTRY_bias_act_backward < 64 && CLPAR_ENTRY_xent < 64 &&
                   CLPAR_ENTRY_xent_backward < 64 && CLPAR_ENTRY_linear_act < 64 &&
                   CLPAR_ENTRY_linear_act_backward < 64 && CLPAR_ENTRY_gemm_half < 64,
               "the composable entries are in word 0 of the masks");
static uint64_t composable_mask(void) {
  return (uint64_t)1 << CLPAR_ENTRY_softmax_backward | (uint64_t)1 << CLPAR_ENTRY_nll |
         (uint64_t)1 << CLPAR_ENTRY_nll_backward | (uint64_t)1 << CLPAR_ENTRY_sgd_step |
         (uint64_t)1 << CLPAR_ENTRY_adam_step | (uint64_t)1 << CLPAR_ENTRY_bias_act |
         (uint64_t)1 << CLPAR_ENTRY_bias_act_backward | (uint64_t)1 << CLPAR_ENTRY_xent |
         (uint64_t)1 << CLPAR_ENTRY_xent_backward | (uint64_t)1 << CLPAR_ENTRY_linear_act |
         (uint64_t)1 << CLPAR_ENTRY_linear_act_backward;
}

/* The composable entries and gemm_half, which the core routes around where its bit is set
 * (src/autocast_gemm.c) instead of composing it here: the bits a device keeps and a test may
 * force. */
static uint64_t forceable_mask(void) {
  return composable_mask() | (uint64_t)1 << CLPAR_ENTRY_gemm_half;
}

static int forceable(int entry) {
  return entry < 64 && ((forceable_mask() >> entry) & 1);
}

void clpar_compose_init(clpar_device *dev) {
  const clpar_backend_iface *f = dev->bd.iface;
  uint64_t natural = 0; /* the composable entries are all below 64 */
#define NATURAL_(name, kind, required)                                                  \
  if (forceable(CLPAR_ENTRY_##name)) {                                                  \
    int yes = f->name != NULL;                                                          \
    if (yes && f->supports_op && clpar_dev_supports_op(dev, #name, &yes) != CLPAR_OK) { \
      clpar_log(CLPAR_LOG_WARN, "%s: composing " #name ": %s", dev->bd.info.id,         \
                clpar_last_error());                                                    \
      yes = 0;                                                                          \
    }                                                                                   \
    if (!yes) natural |= (uint64_t)1 << (CLPAR_ENTRY_##name % 64);                      \
  }
  CLPAR_BACKEND_ENTRIES(NATURAL_)
#undef NATURAL_
  memset(dev->natural, 0, sizeof dev->natural);
  memset(dev->composed, 0, sizeof dev->composed);
  dev->natural[0] = natural;
  dev->composed[0] = natural;
}

clpar_status clpar_compose_force(clpar_device *dev, uint64_t mask) {
  if (!dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_compose_force: NULL device");
  if (mask & ~forceable_mask())
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_compose_force: mask 0x%llx names entries that cannot be "
                           "composed (softmax_backward, nll, nll_backward, xent, "
                           "xent_backward, sgd_step, adam_step, bias_act, "
                           "bias_act_backward, linear_act, linear_act_backward and gemm_half "
                           "can)",
                           (unsigned long long)mask);
  __atomic_store_n(&dev->composed[0], dev->natural[0] | mask, __ATOMIC_RELAXED);
  return CLPAR_OK;
}
