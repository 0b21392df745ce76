/* cuda_elementwise.c — the CUDA backend's element-wise ops, reductions, the fused Linear
 * epilogues, softmax and the loss, and the optimizer steps: each one launcher of
 * kernels/cuda/ run as a profiled op of the device's stream; and the workspace entries (sum_rows'
 * scratch, cuDNN's workspace). */
#include <string.h>

#include "cuda/cuda_cudnn.h"
#include "cuda/cuda_internal.h"

/* ---- ops ---- */

clpar_status cuda_fill(void *dev, clpar_bref out, size_t n, float value) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  /* +0.0f is all zero bits: a memset needs no kernel of ours. -0.0f is not, and goes on. */
  if (bits == 0)
    s = clpar_cuda_check(cudaMemsetAsync(at(out), 0, n * sizeof(float), d->stream),
                         "cudaMemsetAsync(fill)");
  else
    s = clpar_cuda_check(clpar_cuda_fill(d->stream, at(out), n, value), "fill kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_binary(void *dev, clpar_binary_kind kind, size_t rows, size_t cols, clpar_bref a,
                         clpar_bref b, size_t b_rows, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(
        clpar_cuda_binary(d->stream, (int)kind, rows, cols, at(a), at(b), b_rows, at(out)),
        "binary kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_scale(void *dev, size_t n, float alpha, clpar_bref a, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_scale(d->stream, n, alpha, at(a), at(out)),
                         "scale kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

/* Makes d->scratch hold at least floats floats; scratch_lock held. An old buffer may still
 * be in use by enqueued work, so the stream is drained before it is freed (once per size the
 * scratch grows to: it never needs more than 1024 x 31 floats); the first one needs no
 * wait. */
static clpar_status scratch_reserve(cuda_dev *d, size_t floats) {
  if (d->scratch_floats >= floats) return CLPAR_OK;
  clpar_status s = CLPAR_OK;
  if (d->scratch) {
    s = clpar_cuda_check(cudaStreamSynchronize(d->stream),
                         "cudaStreamSynchronize(sum_rows scratch)");
    clpar_backend_waited();
    if (s == CLPAR_OK) s = clpar_cuda_check(cudaFree(d->scratch), "cudaFree(sum_rows scratch)");
    if (s != CLPAR_OK) return s; /* the old scratch is kept */
    __atomic_sub_fetch(&d->own_bytes, d->scratch_floats * sizeof(float), __ATOMIC_RELAXED);
    d->scratch = NULL;
    d->scratch_floats = 0;
  }
  void *p = NULL;
  s = clpar_cuda_check(cudaMalloc(&p, floats * sizeof(float)), "cudaMalloc(sum_rows scratch)");
  if (s == CLPAR_OK) {
    d->scratch = p;
    d->scratch_floats = floats;
    __atomic_add_fetch(&d->own_bytes, floats * sizeof(float), __ATOMIC_RELAXED);
  }
  return s;
}

clpar_status cuda_workspace_bytes(void *dev, uint64_t *bytes) {
  *bytes = __atomic_load_n(&((cuda_dev *)dev)->own_bytes, __ATOMIC_RELAXED);
  return CLPAR_OK;
}

/* On the worker, after the work posted before it: work enqueued on the buffers may still run,
 * so the stream is drained first (as scratch_reserve and cuDNN's ws_reserve do). */
clpar_status cuda_workspace_trim(void *dev) {
  cuda_dev *d = dev;
  if (__atomic_load_n(&d->own_bytes, __ATOMIC_RELAXED) == 0) return CLPAR_OK;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  pthread_mutex_lock(&d->scratch_lock);
  s = clpar_cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize(workspace trim)");
  clpar_backend_waited();
  if (s == CLPAR_OK && d->scratch) {
    s = clpar_cuda_check(cudaFree(d->scratch), "cudaFree(sum_rows scratch)");
    if (s == CLPAR_OK) {
      __atomic_sub_fetch(&d->own_bytes, d->scratch_floats * sizeof(float), __ATOMIC_RELAXED);
      d->scratch = NULL;
      d->scratch_floats = 0;
    }
  }
  pthread_mutex_unlock(&d->scratch_lock);
#ifdef CLPAR_HAVE_CUDNN
  if (s == CLPAR_OK) s = clpar_cudnn_trim(d);
#endif
  if (s == CLPAR_OK) s = clpar_cuda_lt_trim(d);
  return s;
}

/* Tall, narrow matrices take two passes through the device's scratch; the lock keeps another
 * thread from growing it between this op's sizing and its enqueueing. The scratch is sized
 * before the op's start event, so that a profile does not count the host's cudaMalloc. */
clpar_status cuda_sum_rows(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref out) {
  cuda_dev *d = dev;
  size_t need = clpar_cuda_sum_rows_scratch(rows, cols);
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  if (need) {
    pthread_mutex_lock(&d->scratch_lock);
    if ((s = scratch_reserve(d, need)) != CLPAR_OK) {
      pthread_mutex_unlock(&d->scratch_lock);
      return s;
    }
  }
  prof_pair prof;
  s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(
        clpar_cuda_sum_rows(d->stream, rows, cols, at(a), at(out), need ? d->scratch : NULL),
        "sum_rows kernel launch");
  if (need) pthread_mutex_unlock(&d->scratch_lock);
  return clpar_cuda_op_end(d, &prof, s);
}

/* ---- training ops ---- */

clpar_status cuda_broadcast_rows(void *dev, size_t rows, size_t cols, clpar_bref a,
                                 clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_broadcast_rows(d->stream, rows, cols, at(a), at(out)),
                         "broadcast_rows kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

/* outer == 1 with a wide inner is sum_rows' shape, whose narrow path has a scratch pass. */
clpar_status cuda_reduce_sum(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                             clpar_bref out) {
  if (outer == 1 && inner >= 16) return cuda_sum_rows(dev, red, inner, a, out);
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_reduce_sum(d->stream, outer, red, inner, at(a), at(out)),
                         "reduce_sum kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_expand(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                         clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_expand(d->stream, outer, red, inner, at(a), at(out)),
                         "expand kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_unary(void *dev, clpar_unary_kind kind, size_t n, clpar_bref a, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_unary(d->stream, kind, n, at(a), at(out)),
                         "unary kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

/* exp, sqrt and neg are forward only (backend.h): refused here by name rather than by the
 * launcher's cudaErrorInvalidValue. */
clpar_status cuda_unary_backward(void *dev, clpar_unary_kind kind, size_t n, clpar_bref g,
                                 clpar_bref saved, clpar_bref out) {
  cuda_dev *d = dev;
  if (kind != CLPAR_UNARY_RELU && kind != CLPAR_UNARY_SIGMOID && kind != CLPAR_UNARY_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "unary_backward: unary kind %d has no backward (forward only)",
                           (int)kind);
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_unary_backward(d->stream, kind, n, at(g), at(saved), at(out)),
                         "unary_backward kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_bias_act(void *dev, clpar_act_kind act, size_t rows, size_t cols, clpar_bref a,
                           clpar_bref bias, clpar_bref out) {
  cuda_dev *d = dev;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "bias_act: activation %d", (int)act);
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_bias_act(d->stream, act, rows, cols, at(a), at(bias), at(out)),
                         "bias_act kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_bias_act_backward(void *dev, clpar_act_kind act, size_t rows, size_t cols,
                                    clpar_bref g, clpar_bref y, clpar_bref out, clpar_bref db,
                                    int accumulate) {
  cuda_dev *d = dev;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "bias_act_backward: activation %d",
                           (int)act);
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(
        clpar_cuda_bias_act_backward(d->stream, act, rows, cols, at(g), y.buf ? at(y) : NULL,
                                     out.buf ? at(out) : NULL, db.buf ? at(db) : NULL, accumulate),
        "bias_act_backward kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_softmax(void *dev, int log, size_t rows, size_t cols, clpar_bref a,
                          clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_softmax(d->stream, log, rows, cols, at(a), at(out)),
                         log ? "log_softmax kernel launch" : "softmax kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_softmax_backward(void *dev, int log, size_t rows, size_t cols, clpar_bref y,
                                   clpar_bref g, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(
        clpar_cuda_softmax_backward(d->stream, log, rows, cols, at(y), at(g), at(out)),
        log ? "log_softmax_backward kernel launch" : "softmax_backward kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_pick(void *dev, int scatter, size_t rows, size_t cols, clpar_bref idx,
                       clpar_bref a, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_pick(d->stream, scatter, rows, cols,
                                         (const int32_t *)idx.buf + idx.off, at(a), at(out)),
                         "pick kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_nll(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref labels,
                      clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_nll(d->stream, rows, cols, at(a), at_i32(labels), at(out)),
                         "nll kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

/* All zeros but one element per row: a memset at full bandwidth, then one thread per row
 * writes -g[r] at its label (in stream order, after the memset). */
clpar_status cuda_nll_backward(void *dev, size_t rows, size_t cols, clpar_bref labels, clpar_bref g,
                               clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(cudaMemsetAsync(at(out), 0, rows * cols * sizeof(float), d->stream),
                         "cudaMemsetAsync(nll_backward)");
  if (s == CLPAR_OK)
    s = clpar_cuda_check(
        clpar_cuda_nll_backward(d->stream, rows, cols, at_i32(labels), at(g), at(out)),
        "nll_backward kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

/* Without momentum the core passes param as buf; the kernel then never touches buf. The
 * arguments come by value and the launch copies them into the kernel's parameters. */
clpar_status cuda_sgd_step(void *dev, size_t n, clpar_bref param, clpar_bref grad, clpar_bref buf,
                           clpar_sgd_args args) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  float *b = args.momentum != 0.0f ? at(buf) : NULL;
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_sgd_step(d->stream, n, at(param), at(grad), b, &args),
                         "sgd_step kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}

clpar_status cuda_adam_step(void *dev, size_t n, clpar_bref param, clpar_bref grad, clpar_bref m,
                            clpar_bref v, clpar_adam_args args) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(
        clpar_cuda_adam_step(d->stream, n, at(param), at(grad), at(m), at(v), &args),
        "adam_step kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}
