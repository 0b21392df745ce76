/* ocl_elementwise.c — the OpenCL backend's element-wise ops, reductions, the fused Linear
 * epilogues, softmax and the loss kernels, and the optimizer steps: each a launch of a kernel
 * of kernels/opencl/. */
#include <math.h>

#include "ocl_internal.h"

/* sum_rows sums up to this many rows in one pass; longer matrices are cut into chunks of at
 * least SUM_ROWS_CHUNK rows (a work-group's tile then stays in a CPU's cache, and narrow
 * matrices get parallelism) and at most SUM_ROWS_MAX_CHUNKS chunks, whose partial sums a
 * second pass adds. Measured on PoCL: 4M x 1 went from 11 ms (one work-item per column) to
 * 1.2 ms, 1024 x 4096 from 12 ms to 2.4 ms. */
#define SUM_ROWS_ONE_PASS CLPAR_OCL_SUM_ROWS_ONE_PASS
#define SUM_ROWS_CHUNK 64
#define SUM_ROWS_MAX_CHUNKS 1024

/* ---- ops ---- */

clpar_status ocl_fill(void *dev, clpar_bref out, size_t n, float value) {
  cl_mem m = AS_MEM(out.buf);
  cl_ulong off = out.off, count = n;
  karg args[] = {KARG(m), KARG(off), KARG(count), KARG(value)};
  return clpar_ocl_launch_1d(dev, "fill.cl", "fill_f32", args, 4, n);
}

clpar_status ocl_binary(void *dev, clpar_binary_kind kind, size_t rows, size_t cols, clpar_bref a,
                        clpar_bref b, size_t b_rows, clpar_bref out) {
  static const char *full[] = {"binary_add", "binary_sub", "binary_mul", "binary_div"};
  static const char *row[] = {"binary_add_row", "binary_sub_row", "binary_mul_row",
                              "binary_div_row"};
  if ((int)kind < 0 || kind > CLPAR_BINARY_DIV)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl binary: kind %d", (int)kind);
  cl_mem am = AS_MEM(a.buf), bm = AS_MEM(b.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, boff = b.off, ooff = out.off, r = rows, c = cols, n = rows * cols;
  if (b_rows == rows) { /* also when rows == 1: the plain kernel is cheaper */
    karg args[] = {KARG(am), KARG(aoff), KARG(bm), KARG(boff), KARG(om), KARG(ooff), KARG(n)};
    return clpar_ocl_launch_1d(dev, "elementwise.cl", full[kind], args, 7, rows * cols);
  }
  size_t global[2], local[2];
  clpar_ocl_shape_2d(dev, cols, rows, global, local);
  karg args[] = {KARG(am), KARG(aoff), KARG(bm), KARG(boff),
                 KARG(om), KARG(ooff), KARG(r),  KARG(c)};
  return clpar_ocl_launch(dev, "elementwise.cl", row[kind], args, 8, 2, global, local);
}

clpar_status ocl_scale(void *dev, size_t n, float alpha, clpar_bref a, clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, count = n;
  karg args[] = {KARG(am), KARG(aoff), KARG(om), KARG(ooff), KARG(count), KARG(alpha)};
  return clpar_ocl_launch_1d(dev, "elementwise.cl", "scale_f32", args, 6, n);
}

/* One pass of sum_rows_f32: chunks of `chunk` rows, one partial row per chunk; d->lock held. */
static clpar_status sum_pass(clpar_ocl_device *d, cl_mem a, cl_ulong a_off, size_t rows,
                             size_t cols, size_t chunk, cl_mem out, cl_ulong out_off) {
  size_t nchunks = (rows + chunk - 1) / chunk, global[2], local[2];
  cl_ulong r = rows, c = cols, ch = chunk;
  clpar_ocl_shape_2d(d, cols, 1, global, local);
  global[1] = nchunks;
  karg args[] = {KARG(a), KARG(a_off), KARG(r), KARG(c), KARG(ch), KARG(out), KARG(out_off)};
  return clpar_ocl_launch_locked(d, "reduce.cl", "sum_rows_f32", args, 7, 2, global, local);
}

/* The scratch buffer for partial sums (ocl_workspace.c: clpar_ocl_grow). d->lock held. */
static clpar_status ensure_scratch(clpar_ocl_device *d, size_t bytes) {
  return clpar_ocl_grow(d, &d->scratch, &d->scratch_bytes, bytes);
}

/* How a sum over rows is split: one pass for up to SUM_ROWS_ONE_PASS rows, else chunks of at
 * least SUM_ROWS_CHUNK rows, at most SUM_ROWS_MAX_CHUNKS of them; returns their number. */
static size_t sum_chunks(size_t rows, size_t *chunk) {
  *chunk = rows;
  if (rows <= SUM_ROWS_ONE_PASS) return 1;
  *chunk = (rows + SUM_ROWS_MAX_CHUNKS - 1) / SUM_ROWS_MAX_CHUNKS;
  if (*chunk < SUM_ROWS_CHUNK) *chunk = SUM_ROWS_CHUNK;
  return (rows + *chunk - 1) / *chunk;
}

clpar_status ocl_sum_rows(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref out) {
  clpar_ocl_device *d = dev;
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  size_t chunk, nchunks = sum_chunks(rows, &chunk);
  pthread_mutex_lock(&d->lock);
  clpar_status s = nchunks > 1 ? ensure_scratch(d, nchunks * cols * sizeof(float)) : CLPAR_OK;
  if (s == CLPAR_OK && nchunks > 1) {
    s = sum_pass(d, am, a.off, rows, cols, chunk, d->scratch, 0);
    if (s == CLPAR_OK) s = sum_pass(d, d->scratch, 0, nchunks, cols, nchunks, om, out.off);
  } else {
    if (s != CLPAR_OK) clpar_clear_error(); /* no room for partial sums: one slower pass */
    s = sum_pass(d, am, a.off, rows, cols, rows, om, out.off);
  }
  pthread_mutex_unlock(&d->lock);
  return s;
}

/* ---- training ops ---- */

clpar_status ocl_broadcast_rows(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, r = rows, c = cols;
  size_t global[2], local[2];
  clpar_ocl_shape_2d(dev, cols, rows, global, local);
  karg args[] = {KARG(am), KARG(aoff), KARG(om), KARG(ooff), KARG(r), KARG(c)};
  return clpar_ocl_launch(dev, "elementwise.cl", "broadcast_rows_f32", args, 6, 2, global, local);
}

/* Reductions along dimensions (kernels/opencl/reduce_dims.cl). A narrow inner with a long
 * red takes a work-group per output; outer == 1 with a wide inner is sum_rows' shape (its
 * chunked two-pass path); everything else a work-item per output. */
#define REDUCE_NARROW 16 /* inner below this is narrow */
#define REDUCE_LONG 64   /* red from this on is long */

clpar_status ocl_reduce_sum(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                            clpar_bref out) {
  clpar_ocl_device *d = dev;
  if (outer == 1 && inner >= REDUCE_NARROW) return ocl_sum_rows(dev, red, inner, a, out);
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, o = outer, r = red, in = inner;
  if (inner < REDUCE_NARROW && red >= REDUCE_LONG) {
    size_t most = d->max_wg_size < 64 ? d->max_wg_size : 64, local = 1; /* RD_GROUP */
    while (local * 2 <= most) local *= 2;
    size_t global = outer * inner * local;
    karg args[] = {KARG(am), KARG(aoff), KARG(r), KARG(in), KARG(om), KARG(ooff)};
    return clpar_ocl_launch(d, "reduce_dims.cl", "reduce_sum_group_f32", args, 6, 1, &global,
                            &local);
  }
  size_t global[2], local[2];
  clpar_ocl_shape_2d(d, inner, outer, global, local);
  karg args[] = {KARG(am), KARG(aoff), KARG(o), KARG(r), KARG(in), KARG(om), KARG(ooff)};
  return clpar_ocl_launch(d, "reduce_dims.cl", "reduce_sum_items_f32", args, 7, 2, global, local);
}

clpar_status ocl_expand(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                        clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, r = red, in = inner, n = outer * red * inner;
  karg args[] = {KARG(am), KARG(aoff), KARG(r), KARG(in), KARG(om), KARG(ooff), KARG(n)};
  return clpar_ocl_launch_1d(dev, "reduce_dims.cl", "expand_f32", args, 7, (size_t)n);
}

clpar_status ocl_unary(void *dev, clpar_unary_kind kind, size_t n, clpar_bref a, clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, count = n;
  cl_int k = (cl_int)kind;
  karg args[] = {KARG(am), KARG(aoff), KARG(om), KARG(ooff), KARG(count), KARG(k)};
  return clpar_ocl_launch_1d(dev, "activation.cl", "unary_f32", args, 6, n);
}

clpar_status ocl_unary_backward(void *dev, clpar_unary_kind kind, size_t n, clpar_bref g,
                                clpar_bref saved, clpar_bref out) {
  cl_mem gm = AS_MEM(g.buf), sm = AS_MEM(saved.buf), om = AS_MEM(out.buf);
  cl_ulong goff = g.off, soff = saved.off, ooff = out.off, count = n;
  cl_int k = (cl_int)kind;
  karg args[] = {KARG(gm), KARG(goff), KARG(sm),    KARG(soff),
                 KARG(om), KARG(ooff), KARG(count), KARG(k)};
  return clpar_ocl_launch_1d(dev, "activation.cl", "unary_backward_f32", args, 8, n);
}

/* ---- the fused Linear epilogues ---- */

clpar_status ocl_bias_act(void *dev, clpar_act_kind act, size_t rows, size_t cols, clpar_bref a,
                          clpar_bref bias, clpar_bref out) {
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl bias_act: activation %d",
                           (int)act);
  cl_mem am = AS_MEM(a.buf), bm = AS_MEM(bias.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, boff = bias.off, ooff = out.off, r = rows, c = cols;
  cl_int k = (cl_int)act;
  size_t global[2], local[2];
  clpar_ocl_shape_2d(dev, cols, rows, global, local);
  karg args[] = {KARG(am),   KARG(aoff), KARG(bm), KARG(boff), KARG(om),
                 KARG(ooff), KARG(r),    KARG(c),  KARG(k)};
  return clpar_ocl_launch(dev, "activation.cl", "bias_act_f32", args, 9, 2, global, local);
}

/* One pass of bias_act_backward_f32 over chunks of `chunk` rows; d->lock held. */
static clpar_status act_pass(clpar_ocl_device *d, clpar_act_kind act, cl_mem g, cl_ulong g_off,
                             cl_mem y, cl_ulong y_off, cl_mem out, cl_ulong out_off, size_t rows,
                             size_t cols, size_t chunk, cl_mem db, cl_ulong db_off,
                             int accumulate) {
  size_t global[2], local[2];
  clpar_ocl_shape_2d(d, cols, 1, global, local);
  global[1] = (rows + chunk - 1) / chunk;
  cl_int has_out = out != NULL, k = (cl_int)act, acc = accumulate != 0;
  cl_ulong r = rows, c = cols, ch = chunk;
  karg args[] = {KARG(g),       KARG(g_off),   KARG(y),      KARG(y_off), KARG(out),
                 KARG(out_off), KARG(has_out), KARG(r),      KARG(c),     KARG(ch),
                 KARG(k),       KARG(db),      KARG(db_off), KARG(acc)};
  return clpar_ocl_launch_locked(d, "activation.cl", "bias_act_backward_f32", args, 14, 2, global,
                                 local);
}

/* Chunked like ocl_sum_rows: one pass for up to SUM_ROWS_ONE_PASS rows, else partial sums in
 * the scratch buffer and a second pass (act none) that adds them into db. */
clpar_status ocl_bias_act_backward(void *dev, clpar_act_kind act, size_t rows, size_t cols,
                                   clpar_bref g, clpar_bref y, clpar_bref out, clpar_bref db,
                                   int accumulate) {
  clpar_ocl_device *d = dev;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl bias_act_backward: activation %d",
                           (int)act);
  if (!db.buf) { /* the gradient alone */
    if (!out.buf) return CLPAR_OK;
    if (act == CLPAR_ACT_NONE)
      return ocl_copy(dev, out.buf, out.off * sizeof(float), g.buf, g.off * sizeof(float),
                      rows * cols * sizeof(float));
    clpar_unary_kind kind = act == CLPAR_ACT_RELU      ? CLPAR_UNARY_RELU
                            : act == CLPAR_ACT_SIGMOID ? CLPAR_UNARY_SIGMOID
                                                       : CLPAR_UNARY_TANH;
    return ocl_unary_backward(dev, kind, rows * cols, g, y, out);
  }
  cl_mem gm = AS_MEM(g.buf), ym = AS_MEM(y.buf), om = AS_MEM(out.buf), dm = AS_MEM(db.buf);
  size_t chunk, nchunks = sum_chunks(rows, &chunk);
  pthread_mutex_lock(&d->lock);
  clpar_status s = nchunks > 1 ? ensure_scratch(d, nchunks * cols * sizeof(float)) : CLPAR_OK;
  if (s == CLPAR_OK && nchunks > 1) {
    s = act_pass(d, act, gm, g.off, ym, y.off, om, out.off, rows, cols, chunk, d->scratch, 0, 0);
    if (s == CLPAR_OK)
      s = act_pass(d, CLPAR_ACT_NONE, d->scratch, 0, NULL, 0, NULL, 0, nchunks, cols, nchunks, dm,
                   db.off, accumulate);
  } else {
    if (s != CLPAR_OK) clpar_clear_error(); /* no room for partial sums: one slower pass */
    s = act_pass(d, act, gm, g.off, ym, y.off, om, out.off, rows, cols, rows, dm, db.off,
                 accumulate);
  }
  pthread_mutex_unlock(&d->lock);
  return s;
}

/* One work-group per row; its size is a power of two (the kernels' tree reductions). */
static clpar_status launch_rows(clpar_ocl_device *d, const char *name, karg *args, int nargs,
                                size_t rows, size_t cols) {
  size_t wg = d->max_wg_size < CLPAR_OCL_WG_2D ? d->max_wg_size : CLPAR_OCL_WG_2D, local = 1;
  while (local * 2 <= wg && local < cols) local *= 2;
  size_t global = rows * local;
  args[nargs - 1].size = local * sizeof(float); /* the __local scratch, value NULL */
  return clpar_ocl_launch(d, "softmax.cl", name, args, nargs, 1, &global, &local);
}

clpar_status ocl_softmax(void *dev, int log, size_t rows, size_t cols, clpar_bref a,
                         clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, c = cols;
  cl_int take_log = log != 0;
  karg args[] = {KARG(am), KARG(aoff), KARG(om), KARG(ooff), KARG(c), KARG(take_log), {0, NULL}};
  return launch_rows(dev, "softmax_f32", args, 7, rows, cols);
}

clpar_status ocl_softmax_backward(void *dev, int log, size_t rows, size_t cols, clpar_bref y,
                                  clpar_bref g, clpar_bref out) {
  cl_mem ym = AS_MEM(y.buf), gm = AS_MEM(g.buf), om = AS_MEM(out.buf);
  cl_ulong yoff = y.off, goff = g.off, ooff = out.off, c = cols;
  cl_int take_log = log != 0;
  karg args[] = {KARG(ym),   KARG(yoff), KARG(gm),       KARG(goff), KARG(om),
                 KARG(ooff), KARG(c),    KARG(take_log), {0, NULL}};
  return launch_rows(dev, "softmax_backward_f32", args, 9, rows, cols);
}

/* Rows of at most this many columns on a CPU device run softmax.cl's one-work-item-a-row
 * kernels: on 32 x 64 logits (bench_graph's MLP, `POCL_DEVICES=basic`, perf over replayed
 * steps) xent and its backward took 10% of the step with one work-group a row, under 1% so. */
#define XENT_ROW_COLS 256

/* One work-item a row (xent_row_f32, xent_backward_row_f32), rows in the last argument. */
static clpar_status launch_row_items(clpar_ocl_device *d, const char *name, karg *args, int nargs,
                                     size_t rows) {
  cl_ulong rows_ = rows;
  args[nargs - 1] = (karg)KARG(rows_);
  size_t local = 1;
  while (local < rows && local < 16) local *= 2;
  size_t global = clpar_ocl_round_up(rows, local);
  return clpar_ocl_launch(d, "softmax.cl", name, args, nargs, 1, &global, &local);
}

clpar_status ocl_xent(void *dev, size_t rows, size_t cols, int idx64, int64_t ignore, clpar_bref a,
                      clpar_bref idx, clpar_bref loss, clpar_bref weight) {
  cl_mem am = AS_MEM(a.buf), im = AS_MEM(idx.buf), lm = AS_MEM(loss.buf), wm = AS_MEM(weight.buf);
  cl_ulong ao = a.off, io = idx.off, lo = loss.off, wo = weight.off, c = cols;
  cl_int i64 = idx64;
  cl_long ig = ignore;
  karg args[] = {KARG(am), KARG(ao), KARG(im), KARG(io), KARG(i64), KARG(ig),
                 KARG(lm), KARG(lo), KARG(wm), KARG(wo), KARG(c),   {0, NULL}};
  clpar_ocl_device *d = dev;
  if (d->cpu && cols <= XENT_ROW_COLS) return launch_row_items(d, "xent_row_f32", args, 12, rows);
  return launch_rows(dev, "xent_f32", args, 12, rows, cols);
}

clpar_status ocl_xent_backward(void *dev, size_t rows, size_t cols, int idx64, int64_t ignore,
                               clpar_bref a, clpar_bref idx, clpar_bref g, clpar_bref count,
                               float alpha, clpar_bref out) {
  /* without a count, g's buffer stands in for it (never read: has_count says so) */
  cl_mem am = AS_MEM(a.buf), im = AS_MEM(idx.buf), gm = AS_MEM(g.buf), om = AS_MEM(out.buf),
         cm = AS_MEM(count.buf ? count.buf : g.buf);
  cl_ulong ao = a.off, io = idx.off, go = g.off, co = count.off, oo = out.off, c = cols;
  cl_int i64 = idx64, has_count = count.buf != NULL;
  cl_long ig = ignore;
  cl_float al = alpha;
  karg args[] = {KARG(am), KARG(ao), KARG(im), KARG(io), KARG(i64),       KARG(ig),
                 KARG(gm), KARG(go), KARG(cm), KARG(co), KARG(has_count), KARG(al),
                 KARG(om), KARG(oo), KARG(c),  {0, NULL}};
  clpar_ocl_device *d = dev;
  if (d->cpu && cols <= XENT_ROW_COLS)
    return launch_row_items(d, "xent_backward_row_f32", args, 16, rows);
  return launch_rows(dev, "xent_backward_f32", args, 16, rows, cols);
}

clpar_status ocl_pick(void *dev, int scatter, size_t rows, size_t cols, clpar_bref idx,
                      clpar_bref a, clpar_bref out) {
  cl_mem im = AS_MEM(idx.buf), am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong ioff = idx.off, aoff = a.off, ooff = out.off, r = rows, c = cols;
  karg args[] = {KARG(im), KARG(ioff), KARG(am), KARG(aoff),
                 KARG(om), KARG(ooff), KARG(r),  KARG(c)};
  return clpar_ocl_launch_1d(dev, "index.cl", scatter ? "pick_scatter_f32" : "pick_gather_f32",
                             args, 8, rows);
}

clpar_status ocl_nll(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref labels,
                     clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), lm = AS_MEM(labels.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, loff = labels.off, ooff = out.off, r = rows, c = cols;
  karg args[] = {KARG(am), KARG(aoff), KARG(lm), KARG(loff),
                 KARG(om), KARG(ooff), KARG(r),  KARG(c)};
  return clpar_ocl_launch_1d(dev, "softmax.cl", "nll_f32", args, 8, rows);
}

clpar_status ocl_nll_backward(void *dev, size_t rows, size_t cols, clpar_bref labels, clpar_bref g,
                              clpar_bref out) {
  cl_mem lm = AS_MEM(labels.buf), gm = AS_MEM(g.buf), om = AS_MEM(out.buf);
  cl_ulong loff = labels.off, goff = g.off, ooff = out.off, r = rows, c = cols;
  size_t global[2], local[2];
  clpar_ocl_shape_2d(dev, cols, rows, global, local);
  karg args[] = {KARG(lm), KARG(loff), KARG(gm), KARG(goff),
                 KARG(om), KARG(ooff), KARG(r),  KARG(c)};
  return clpar_ocl_launch(dev, "softmax.cl", "nll_backward_f32", args, 8, 2, global, local);
}

clpar_status ocl_sgd_step(void *dev, size_t n, clpar_bref param, clpar_bref grad, clpar_bref buf,
                          clpar_sgd_args sgd) {
  const clpar_sgd_args *o = &sgd;
  cl_mem pm = AS_MEM(param.buf), gm = AS_MEM(grad.buf), bm = AS_MEM(buf.buf);
  cl_ulong poff = param.off, goff = grad.off, boff = buf.off, count = n;
  float lr = o->lr, mom = o->momentum, damp = o->dampening, wd = o->weight_decay;
  cl_int nesterov = o->nesterov != 0, first = o->first != 0;
  if (mom == 0.0f) { /* no buffer then: buf may be NULL */
    karg args[] = {KARG(pm), KARG(poff), KARG(gm), KARG(goff), KARG(count), KARG(lr), KARG(wd)};
    return clpar_ocl_launch_1d(dev, "optim.cl", "sgd_f32", args, 7, n);
  }
  karg args[] = {KARG(pm),   KARG(poff),     KARG(gm),   KARG(goff), KARG(bm),
                 KARG(boff), KARG(count),    KARG(lr),   KARG(mom),  KARG(damp),
                 KARG(wd),   KARG(nesterov), KARG(first)};
  return clpar_ocl_launch_1d(dev, "optim.cl", "sgd_momentum_f32", args, 13, n);
}

clpar_status ocl_adam_step(void *dev, size_t n, clpar_bref param, clpar_bref grad, clpar_bref m,
                           clpar_bref v, clpar_adam_args adam) {
  const clpar_adam_args *o = &adam;
  cl_mem pm = AS_MEM(param.buf), gm = AS_MEM(grad.buf), mm = AS_MEM(m.buf), vm = AS_MEM(v.buf);
  cl_ulong poff = param.off, goff = grad.off, moff = m.off, voff = v.off, count = n;
  float b1 = o->beta1, b2 = o->beta2, eps = o->eps, wd = o->weight_decay;
  float omb1 = o->one_minus_beta1, omb2 = o->one_minus_beta2, step = o->step, root2 = o->root2;
  float keep = o->keep;
  cl_int decoupled = o->decoupled != 0;
  karg args[] = {KARG(pm),   KARG(poff), KARG(gm),    KARG(goff),     KARG(mm),
                 KARG(moff), KARG(vm),   KARG(voff),  KARG(count),    KARG(b1),
                 KARG(b2),   KARG(omb1), KARG(omb2),  KARG(eps),      KARG(wd),
                 KARG(keep), KARG(step), KARG(root2), KARG(decoupled)};
  return clpar_ocl_launch_1d(dev, "optim.cl", "adam_f32", args, 19, n);
}
