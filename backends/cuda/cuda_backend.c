/* cuda_backend.c — clpar's CUDA backend: the CUDA runtime for memory and streams, cuBLAS for
 * GEMM, and clpar's own kernels (kernels/cuda/) for the element-wise ops, the row-wise ones
 * (softmax, the loss) and the optimizer updates.
 *
 * Each device gets one non-blocking stream (it must not wait on the legacy default stream
 * that other code in the process may use) and one cuBLAS handle bound to it, so every op of
 * a device runs in the order it was enqueued, as backend.h requires. Entries may come from
 * any host thread: each one makes its device current first, and GEMMs take a per-device lock
 * because a cuBLAS handle is not meant to be used by two threads at once.
 *
 * Profiling (backend ABI 3) brackets each op with a pair of CUDA events recorded on the
 * stream, so the time between them is the device's time for that op. Events are made only
 * while profiling is on: otherwise an op pays one atomic load and nothing else. On a stream
 * with nothing enqueued the start event happens at once, so the pair then also counts the
 * host's few microseconds between the two records (the launch itself); on a busy stream it
 * happens when the work before it ends.
 *
 * A machine without a GPU or without the driver probes to no device, which is not an error:
 * the module is compiled and linked everywhere and runs where a GPU is. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_kernels.h"
#include "internal.h"

/* The events around one profiled op, recorded on the device's stream before and after it. */
typedef struct prof_pair {
  cudaEvent_t start, stop;
} prof_pair;

typedef struct cuda_dev {
  int ordinal; /* the CUDA runtime's device number */
  cudaStream_t stream;
  cublasHandle_t blas;
  pthread_mutex_t blas_lock;
  /* sum_rows's partial sums (see kernels/cuda/sum_rows.cu), grown on demand; the lock is
   * held from sizing it to enqueueing both passes, so that no thread frees it under another. */
  pthread_mutex_t scratch_lock;
  float *scratch;
  size_t scratch_floats;
  /* Profiling: while profiling is set, ops keep their event pairs in pairs[0 .. n_pairs);
   * their times are folded into prof_seconds and prof_ops as they are read. prof_lock guards
   * everything here but the flag. */
  atomic_int profiling;
  pthread_mutex_t prof_lock;
  prof_pair *pairs;
  size_t n_pairs, cap_pairs;
  double prof_seconds;
  uint64_t prof_ops;
} cuda_dev;

/* ---- errors ---- */

/* Sets the error for a failed runtime call. The runtime also keeps the error as this
 * thread's "last error"; it is cleared here so that a later launch check does not report
 * it again (an allocation that was too large must not fail the next kernel launch). */
static clpar_status cuda_fail(const char *what, cudaError_t e) {
  (void)cudaGetLastError();
  clpar_status s = e == cudaErrorMemoryAllocation ? CLPAR_ERROR_OUT_OF_MEMORY : CLPAR_ERROR_BACKEND;
  return clpar_set_error(s, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

static clpar_status cuda_check(cudaError_t e, const char *what) {
  return e == cudaSuccess ? CLPAR_OK : cuda_fail(what, e);
}

/* A table rather than cublasGetStatusName, which older cuBLAS versions lack. */
static const char *blas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

static clpar_status blas_check(cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS) return CLPAR_OK;
  (void)cudaGetLastError(); /* cuBLAS may leave a runtime error behind; see cuda_fail */
  clpar_status s =
      st == CUBLAS_STATUS_ALLOC_FAILED ? CLPAR_ERROR_OUT_OF_MEMORY : CLPAR_ERROR_BACKEND;
  return clpar_set_error(s, "%s: %s", what, blas_status_name(st));
}

/* The runtime's current device is per host thread, and entries come from any thread. */
static clpar_status use_device(const cuda_dev *d) {
  return cuda_check(cudaSetDevice(d->ordinal), "cudaSetDevice");
}

static float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

/* ---- profiling (ABI 3) ---- */

static void pair_destroy(prof_pair *p) {
  if (p->start) (void)cudaEventDestroy(p->start);
  if (p->stop) (void)cudaEventDestroy(p->stop);
  p->start = p->stop = NULL;
}

/* Folds the kept pairs into the totals and destroys them, oldest first: with wait, all of
 * them (waiting for each); without, those up to the first that has not finished yet (so
 * that a long profiled run does not hold an event pair per op). prof_lock held. */
static void prof_fold(cuda_dev *d, int wait) {
  size_t i = 0;
  for (; i < d->n_pairs; i++) {
    prof_pair *p = &d->pairs[i];
    cudaError_t e = wait ? cudaEventSynchronize(p->stop) : cudaEventQuery(p->stop);
    if (e == cudaErrorNotReady) break;
    float ms = 0.0f;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, p->start, p->stop);
    if (e == cudaSuccess) {
      d->prof_seconds += (double)ms * 1e-3;
      d->prof_ops++;
    }
    pair_destroy(p);
  }
  (void)cudaGetLastError(); /* cudaErrorNotReady, or a pair that could not be timed */
  memmove(d->pairs, d->pairs + i, (d->n_pairs - i) * sizeof *d->pairs);
  d->n_pairs -= i;
}

/* Destroys the kept pairs without timing them; an event whose work is still enqueued is
 * released by the runtime once it has happened. prof_lock held. */
static void prof_discard(cuda_dev *d) {
  for (size_t i = 0; i < d->n_pairs; i++) pair_destroy(&d->pairs[i]);
  d->n_pairs = 0;
}

/* Begins an op on the calling thread: makes the device current and, while profiling is on,
 * records the op's start event. Profiling never fails an op: a pair that cannot be made is
 * dropped (with a warning), and the runtime error it left is cleared (see cuda_fail). */
static clpar_status op_begin(cuda_dev *d, prof_pair *prof) {
  prof->start = prof->stop = NULL;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK || !atomic_load_explicit(&d->profiling, memory_order_relaxed)) return s;
  cudaError_t e = cudaEventCreate(&prof->start);
  if (e == cudaSuccess) e = cudaEventCreate(&prof->stop);
  if (e == cudaSuccess) e = cudaEventRecord(prof->start, d->stream);
  if (e != cudaSuccess) {
    clpar_log(CLPAR_LOG_WARN, "cuda device %d: an op goes unprofiled: %s", d->ordinal,
              cudaGetErrorName(e));
    pair_destroy(prof);
    (void)cudaGetLastError();
  }
  return CLPAR_OK;
}

/* Ends an op begun with op_begin, whose status is s: when it was enqueued and is profiled,
 * records its stop event after it and keeps the pair. Returns s. */
static clpar_status op_end(cuda_dev *d, prof_pair *prof, clpar_status s) {
  if (!prof->start) return s;
  cudaError_t e = s == CLPAR_OK ? cudaEventRecord(prof->stop, d->stream) : cudaSuccess;
  if (s != CLPAR_OK || e != cudaSuccess) {
    if (e != cudaSuccess)
      clpar_log(CLPAR_LOG_WARN, "cuda device %d: an op goes unprofiled: %s", d->ordinal,
                cudaGetErrorName(e));
    pair_destroy(prof);
    (void)cudaGetLastError();
    return s;
  }
  pthread_mutex_lock(&d->prof_lock);
  if (d->n_pairs == d->cap_pairs) prof_fold(d, 0);
  if (d->n_pairs == d->cap_pairs) {
    size_t cap = d->cap_pairs ? 2 * d->cap_pairs : 256;
    prof_pair *grown = realloc(d->pairs, cap * sizeof *grown);
    if (grown) {
      d->pairs = grown;
      d->cap_pairs = cap;
    }
  }
  if (d->n_pairs < d->cap_pairs)
    d->pairs[d->n_pairs++] = *prof;
  else
    pair_destroy(prof); /* out of host memory: the op goes uncounted */
  pthread_mutex_unlock(&d->prof_lock);
  return s;
}

/* ---- lifetime and memory ---- */

static void cuda_destroy(void *dev) {
  cuda_dev *d = dev;
  if (!d) return;
  /* Errors are ignored: at process exit the runtime may already be unloading. */
  if (cudaSetDevice(d->ordinal) == cudaSuccess && d->stream) (void)cudaStreamSynchronize(d->stream);
  prof_discard(d);
  free(d->pairs);
  if (d->scratch) (void)cudaFree(d->scratch);
  if (d->blas) (void)cublasDestroy(d->blas);
  if (d->stream) (void)cudaStreamDestroy(d->stream);
  (void)cudaGetLastError();
  pthread_mutex_destroy(&d->prof_lock);
  pthread_mutex_destroy(&d->scratch_lock);
  pthread_mutex_destroy(&d->blas_lock);
  free(d);
}

static clpar_status cuda_alloc(void *dev, size_t bytes, void **buf) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    char what[64];
    snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", bytes);
    return cuda_fail(what, e);
  }
  *buf = p;
  return CLPAR_OK;
}

static void cuda_release(void *dev, void *buf) {
  cuda_dev *d = dev;
  if (!buf || use_device(d) != CLPAR_OK) return;
  /* Work still enqueued may use the buffer; cudaFree alone does not promise to wait for a
   * non-blocking stream. Releases are rare (the core caches buffers), so waiting is cheap. */
  cudaError_t e = cudaStreamSynchronize(d->stream);
  if (e == cudaSuccess) e = cudaFree(buf);
  if (e != cudaSuccess) {
    clpar_log(CLPAR_LOG_WARN, "cuda device %d: releasing a buffer: %s (%s)", d->ordinal,
              cudaGetErrorName(e), cudaGetErrorString(e));
    (void)cudaGetLastError();
  }
}

/* Waits for the copy: from pageable memory cudaMemcpyAsync may return once src is staged,
 * but from pinned memory it returns at once, and the caller may reuse src on return. */
static clpar_status cuda_write(void *dev, void *buf, size_t off_bytes, const void *src,
                               size_t bytes) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s == CLPAR_OK)
    s = cuda_check(
        cudaMemcpyAsync((char *)buf + off_bytes, src, bytes, cudaMemcpyHostToDevice, d->stream),
        "cudaMemcpyAsync(host to device)");
  if (s == CLPAR_OK)
    s = cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize(write)");
  return s;
}

/* On the stream, so the copy starts after every op enqueued before it. */
static clpar_status cuda_read(void *dev, const void *buf, size_t off_bytes, void *dst,
                              size_t bytes) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s == CLPAR_OK)
    s = cuda_check(cudaMemcpyAsync(dst, (const char *)buf + off_bytes, bytes,
                                   cudaMemcpyDeviceToHost, d->stream),
                   "cudaMemcpyAsync(device to host)");
  if (s == CLPAR_OK)
    s = cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize(read)");
  return s;
}

static clpar_status cuda_copy(void *dev, void *dst, size_t dst_off_bytes, const void *src,
                              size_t src_off_bytes, size_t bytes) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(cudaMemcpyAsync((char *)dst + dst_off_bytes, (const char *)src + src_off_bytes,
                                   bytes, cudaMemcpyDeviceToDevice, d->stream),
                   "cudaMemcpyAsync(device to device)");
  return op_end(d, &prof, s);
}

static clpar_status cuda_finish(void *dev) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  return cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize");
}

/* ---- ops ---- */

static clpar_status cuda_fill(void *dev, clpar_bref out, size_t n, float value) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  /* +0.0f is all zero bits: a memset needs no kernel of ours. -0.0f is not, and goes on. */
  if (bits == 0)
    s = cuda_check(cudaMemsetAsync(at(out), 0, n * sizeof(float), d->stream),
                   "cudaMemsetAsync(fill)");
  else
    s = cuda_check(clpar_cuda_fill(d->stream, at(out), n, value), "fill kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_binary(void *dev, clpar_binary_kind kind, size_t rows, size_t cols,
                                clpar_bref a, clpar_bref b, size_t b_rows, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(
        clpar_cuda_binary(d->stream, (int)kind, rows, cols, at(a), at(b), b_rows, at(out)),
        "binary kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_scale(void *dev, size_t n, float alpha, clpar_bref a, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_scale(d->stream, n, alpha, at(a), at(out)), "scale kernel launch");
  return op_end(d, &prof, s);
}

/* Makes d->scratch hold at least floats floats; scratch_lock held. The old buffer may still
 * be in use by enqueued work, so the stream is drained before it is freed (once per size the
 * scratch grows to: it never needs more than 1024 x 31 floats). */
static clpar_status scratch_reserve(cuda_dev *d, size_t floats) {
  if (d->scratch_floats >= floats) return CLPAR_OK;
  clpar_status s = cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize(scratch)");
  if (s == CLPAR_OK && d->scratch) {
    s = cuda_check(cudaFree(d->scratch), "cudaFree(sum_rows scratch)");
    d->scratch = NULL;
    d->scratch_floats = 0;
  }
  void *p = NULL;
  if (s == CLPAR_OK)
    s = cuda_check(cudaMalloc(&p, floats * sizeof(float)), "cudaMalloc(sum_rows scratch)");
  if (s == CLPAR_OK) {
    d->scratch = p;
    d->scratch_floats = floats;
  }
  return s;
}

/* Tall, narrow matrices take two passes through the device's scratch; the lock keeps another
 * thread from growing it between this op's sizing and its enqueueing. The scratch is sized
 * before the op's start event, so that a profile does not count the host's cudaMalloc. */
static clpar_status cuda_sum_rows(void *dev, size_t rows, size_t cols, clpar_bref a,
                                  clpar_bref out) {
  cuda_dev *d = dev;
  size_t need = clpar_cuda_sum_rows_scratch(rows, cols);
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  if (need) {
    pthread_mutex_lock(&d->scratch_lock);
    if ((s = scratch_reserve(d, need)) != CLPAR_OK) {
      pthread_mutex_unlock(&d->scratch_lock);
      return s;
    }
  }
  prof_pair prof;
  s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(
        clpar_cuda_sum_rows(d->stream, rows, cols, at(a), at(out), need ? d->scratch : NULL),
        "sum_rows kernel launch");
  if (need) pthread_mutex_unlock(&d->scratch_lock);
  return op_end(d, &prof, s);
}

/* cuBLAS is column-major, and a row-major matrix read as column-major is its transpose. So
 * the row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: the
 * operands and m, n swap places, the transpose flags and leading dimensions stay with their
 * matrices. beta == 0 makes cuBLAS ignore C, NaNs included. cuBLAS's default math mode is
 * full FP32 (no TF32), which keeps results comparable with the host reference. */
static clpar_status cuda_gemm(void *dev, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                              float alpha, clpar_bref a, size_t lda, clpar_bref b, size_t ldb,
                              float beta, clpar_bref c, size_t ldc) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  int fits = m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
             ldc <= INT_MAX;
  cublasStatus_t st;
  pthread_mutex_lock(&d->blas_lock);
  if (fits) {
    st = cublasSgemm(d->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, at(b), (int)ldb, at(a),
                     (int)lda, &beta, at(c), (int)ldc);
  } else {
#if CUBLAS_VER_MAJOR >= 12
    st = cublasSgemm_64(d->blas, op_b, op_a, (int64_t)n, (int64_t)m, (int64_t)k, &alpha, at(b),
                        (int64_t)ldb, at(a), (int64_t)lda, &beta, at(c), (int64_t)ldc);
#else
    st = CUBLAS_STATUS_NOT_SUPPORTED; /* 32-bit sizes only before cuBLAS 12 */
#endif
  }
  pthread_mutex_unlock(&d->blas_lock);
  return op_end(d, &prof, blas_check(st, "cublasSgemm"));
}

/* ---- training ops (ABI 2) ---- */

static clpar_status cuda_broadcast_rows(void *dev, size_t rows, size_t cols, clpar_bref a,
                                        clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_broadcast_rows(d->stream, rows, cols, at(a), at(out)),
                   "broadcast_rows kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_unary(void *dev, clpar_unary_kind kind, size_t n, clpar_bref a,
                               clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_unary(d->stream, kind, n, at(a), at(out)), "unary kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_unary_backward(void *dev, clpar_unary_kind kind, size_t n, clpar_bref g,
                                        clpar_bref saved, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_unary_backward(d->stream, kind, n, at(g), at(saved), at(out)),
                   "unary_backward kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_softmax(void *dev, int log, size_t rows, size_t cols, clpar_bref a,
                                 clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_softmax(d->stream, log, rows, cols, at(a), at(out)),
                   log ? "log_softmax kernel launch" : "softmax kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_softmax_backward(void *dev, int log, size_t rows, size_t cols,
                                          clpar_bref y, clpar_bref g, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_softmax_backward(d->stream, log, rows, cols, at(y), at(g), at(out)),
                   log ? "log_softmax_backward kernel launch" : "softmax_backward kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_nll(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref labels,
                             clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_nll(d->stream, rows, cols, at(a), at(labels), at(out)),
                   "nll kernel launch");
  return op_end(d, &prof, s);
}

/* All zeros but one element per row: a memset at full bandwidth, then one thread per row
 * writes -g[r] at its label (in stream order, after the memset). */
static clpar_status cuda_nll_backward(void *dev, size_t rows, size_t cols, clpar_bref labels,
                                      clpar_bref g, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(cudaMemsetAsync(at(out), 0, rows * cols * sizeof(float), d->stream),
                   "cudaMemsetAsync(nll_backward)");
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_nll_backward(d->stream, rows, cols, at(labels), at(g), at(out)),
                   "nll_backward kernel launch");
  return op_end(d, &prof, s);
}

/* Without momentum the core passes param as buf; the kernel then never touches buf. */
static clpar_status cuda_sgd_step(void *dev, size_t n, clpar_bref param, clpar_bref grad,
                                  clpar_bref buf, const clpar_sgd_args *args) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  float *b = args->momentum != 0.0f ? at(buf) : NULL;
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_sgd_step(d->stream, n, at(param), at(grad), b, args),
                   "sgd_step kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_adam_step(void *dev, size_t n, clpar_bref param, clpar_bref grad,
                                   clpar_bref m, clpar_bref v, const clpar_adam_args *args) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_adam_step(d->stream, n, at(param), at(grad), at(m), at(v), args),
                   "adam_step kernel launch");
  return op_end(d, &prof, s);
}

/* ---- profiling entries (ABI 3) ---- */

/* Either way the totals restart from zero, and pairs kept so far are dropped. */
static clpar_status cuda_profile(void *dev, int enable) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  pthread_mutex_lock(&d->prof_lock);
  prof_discard(d);
  d->prof_seconds = 0.0;
  d->prof_ops = 0;
  atomic_store_explicit(&d->profiling, enable != 0, memory_order_relaxed);
  pthread_mutex_unlock(&d->prof_lock);
  return CLPAR_OK;
}

static clpar_status cuda_profile_read(void *dev, double *seconds, uint64_t *ops) {
  cuda_dev *d = dev;
  clpar_status s = cuda_finish(dev);
  pthread_mutex_lock(&d->prof_lock);
  prof_fold(d, 1);
  *seconds = d->prof_seconds;
  *ops = d->prof_ops;
  pthread_mutex_unlock(&d->prof_lock);
  return s;
}

static const clpar_backend_iface cuda_iface = {
    /* The version whose entries are all filled in below, not CLPAR_BACKEND_ABI_VERSION: a
     * later ABI must not find NULL entries behind a version that claims them. */
    .abi_version = 3,
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .write = cuda_write,
    .read = cuda_read,
    .copy = cuda_copy,
    .finish = cuda_finish,
    .fill = cuda_fill,
    .binary = cuda_binary,
    .scale = cuda_scale,
    .sum_rows = cuda_sum_rows,
    .gemm = cuda_gemm,
    .broadcast_rows = cuda_broadcast_rows,
    .unary = cuda_unary,
    .unary_backward = cuda_unary_backward,
    .softmax = cuda_softmax,
    .softmax_backward = cuda_softmax_backward,
    .nll = cuda_nll,
    .nll_backward = cuda_nll_backward,
    .sgd_step = cuda_sgd_step,
    .adam_step = cuda_adam_step,
    .profile = cuda_profile,
    .profile_read = cuda_profile_read,
};

/* ---- probe ---- */

/* Errors of cudaGetDeviceCount that only mean "no CUDA here". */
static int means_no_device(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary;
}

/* Makes the stream and the cuBLAS handle of device ordinal; *out is freed on failure. */
static clpar_status cuda_dev_create(int ordinal, cuda_dev **out) {
  cuda_dev *d = calloc(1, sizeof *d);
  if (!d) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  d->ordinal = ordinal;
  pthread_mutex_init(&d->blas_lock, NULL);
  pthread_mutex_init(&d->scratch_lock, NULL);
  pthread_mutex_init(&d->prof_lock, NULL);
  atomic_init(&d->profiling, 0);
  clpar_status s = use_device(d);
  if (s == CLPAR_OK)
    s = cuda_check(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
  if (s == CLPAR_OK) s = blas_check(cublasCreate(&d->blas), "cublasCreate");
  if (s == CLPAR_OK) s = blas_check(cublasSetStream(d->blas, d->stream), "cublasSetStream");
  if (s != CLPAR_OK) {
    cuda_destroy(d);
    return s;
  }
  *out = d;
  return CLPAR_OK;
}

static void fill_info(clpar_device_info *in, const struct cudaDeviceProp *prop, int driver) {
  snprintf(in->backend, sizeof in->backend, "cuda");
  snprintf(in->name, sizeof in->name, "%s", prop->name);
  snprintf(in->vendor, sizeof in->vendor, "NVIDIA");
  in->platform[0] = '\0';
  /* cudaDriverGetVersion gives 1000 * major + 10 * minor: 13000 is CUDA 13.0. */
  snprintf(in->driver_version, sizeof in->driver_version, "%d.%d", driver / 1000,
           (driver % 1000) / 10);
  in->type = CLPAR_DEVICE_GPU;
  in->global_mem_bytes = prop->totalGlobalMem;
  /* CUDA has no per-allocation limit below the device's memory. */
  in->max_alloc_bytes = prop->totalGlobalMem;
  in->compute_units = prop->multiProcessorCount;
}

/* Adds device ordinal, or skips it with a warning when clpar's kernels have no code for it
 * (the build's CMAKE_CUDA_ARCHITECTURES does not cover its compute capability): every op
 * would fail on it, and a device that is not listed is clearer than one that never works. */
static clpar_status probe_one(int ordinal, int driver, clpar_backend_device **devs, int *count) {
  struct cudaDeviceProp prop;
  clpar_status s = cuda_check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  if (s != CLPAR_OK) return s;
  s = cuda_check(cudaSetDevice(ordinal), "cudaSetDevice");
  cudaError_t image = s == CLPAR_OK ? clpar_cuda_kernel_image_check() : cudaSuccess;
  if (s == CLPAR_OK && image != cudaSuccess) {
    (void)cudaGetLastError();
    clpar_log(CLPAR_LOG_WARN,
              "CUDA device %d (%s, compute capability %d.%d) skipped: clpar's kernels were not "
              "built for it (%s); rebuild with CMAKE_CUDA_ARCHITECTURES including %d%d",
              ordinal, prop.name, prop.major, prop.minor, cudaGetErrorName(image), prop.major,
              prop.minor);
    return CLPAR_OK;
  }
  cuda_dev *d = NULL;
  if (s == CLPAR_OK) s = cuda_dev_create(ordinal, &d);
  if (s != CLPAR_OK) return s;
  clpar_backend_device *slot = clpar_backend_device_append(devs, count);
  if (!slot) {
    cuda_destroy(d);
    return CLPAR_ERROR_OUT_OF_MEMORY;
  }
  slot->iface = &cuda_iface;
  slot->ctx = d;
  fill_info(&slot->info, &prop, driver);
  clpar_log(CLPAR_LOG_DEBUG, "CUDA device %d: %s, compute capability %d.%d, %d SMs, %zu MiB",
            ordinal, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
            (size_t)(prop.totalGlobalMem >> 20));
  return CLPAR_OK;
}

/* Devices are reported in CUDA's order, so that cuda:N is CUDA device N (unless one was
 * skipped); a device that fails stops the probe and the ones before it stay. */
clpar_status clpar_cuda_probe(clpar_backend_device **devs, int *count) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (!means_no_device(e)) return cuda_fail("cudaGetDeviceCount", e);
    (void)cudaGetLastError();
    clpar_log(CLPAR_LOG_INFO, "no CUDA device: %s (%s)", cudaGetErrorName(e),
              cudaGetErrorString(e));
    return CLPAR_OK;
  }
  if (n <= 0) {
    clpar_log(CLPAR_LOG_INFO, "no CUDA device: the runtime reports 0 devices");
    return CLPAR_OK;
  }
  int driver = 0;
  clpar_status s = cuda_check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  for (int i = 0; i < n && s == CLPAR_OK; i++) s = probe_one(i, driver, devs, count);
  return s;
}
