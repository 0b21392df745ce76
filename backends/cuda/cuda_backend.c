/* cuda_backend.c — clpar's CUDA backend (backend ABI 12): the CUDA runtime for memory, streams
 * and events, cuBLAS for GEMM, and clpar's own kernels (kernels/cuda/) for the element-wise
 * ops, the row-wise ones (softmax, the loss) and the optimizer updates.
 *
 * Each device gets one non-blocking stream (it must not wait on the legacy default stream
 * that other code in the process may use) and one cuBLAS handle bound to it, so every op of
 * a device runs in the order it was enqueued, as backend.h requires. The core calls the
 * QUEUE entries from the device's worker thread and the DIRECT ones from any thread; the
 * runtime's current device is per host thread, so every entry makes its device current
 * first. GEMMs still take a per-device lock (a cuBLAS handle is not meant to be used by two
 * threads at once), which costs nothing when only the worker enqueues.
 *
 * No entry waits for the device but finish, profile_read, destroy, host_free (cudaFreeHost
 * synchronizes the device) and the two that free device memory other work may still use
 * (release, and sum_rows when its scratch grows); each reports its wait to the core
 * (clpar_backend_waited), which counts it in clpar_device_host_waits. write and read are
 * cudaMemcpyAsync on the stream, and the core keeps their host memory alive until an event recorded
 * after them has completed. Events are CUDA events without timing, recorded on the stream;
 * event_then waits for one on a second stream of the device (then_stream) and calls back from the
 * runtime's callback thread.
 *
 * Profiling brackets each op with a pair of CUDA events recorded on the stream, so the time
 * between them is the device's time for that op. Events are made only while profiling is
 * on: otherwise an op pays one atomic load and nothing else. On a stream with nothing
 * enqueued the start event happens at once, so the pair then also counts the host's few
 * microseconds between the two records (the launch itself); on a busy stream it happens
 * when the work before it ends.
 *
 * Copies to another CUDA device (copy_peer) are cudaMemcpyPeerAsync on the source's stream,
 * after peer_access has checked cudaDeviceCanAccessPeer and enabled the access. Like the rest
 * of this module, that has been compiled but never run: no GPU was available.
 *
 * With NCCL (CMake option CLPAR_NCCL), the comm_ entries give DistributedDataParallel an
 * all-reduce between processes on the device's own stream (cuda_nccl.c); without it they are
 * NULL and DDP reduces CUDA devices' gradients in pinned host memory over MPI.
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

#include "backend.h"
#include "cuda/cuda_kernels.h"
#ifdef CLPAR_HAVE_NCCL
#include "cuda/cuda_nccl.h"
#endif

/* The events around one profiled op, recorded on the device's stream before and after it. */
typedef struct prof_pair {
  cudaEvent_t start, stop;
} prof_pair;

typedef struct cuda_dev {
  int ordinal; /* the CUDA runtime's device number */
  cudaStream_t stream;
  /* event_then's waits and callbacks; then_lock keeps each wait next to its callback when
   * two threads ask at once (DIRECT entries come from any thread). */
  cudaStream_t then_stream;
  pthread_mutex_t then_lock;
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
  /* peer_access's answers by the peer's ordinal: 0 not asked yet, 1 yes (access enabled),
   * -1 no; guarded by peer_lock. */
  pthread_mutex_t peer_lock;
  signed char peer_ok[64];
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

/* nll's labels: int32 elements. */
static const int32_t *at_i32(clpar_bref r) {
  return (const int32_t *)r.buf + r.off;
}

/* ---- profiling ---- */

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

/* The core calls it with the queue idle, but a callback of event_then may still be pending
 * on then_stream: both streams are drained before they go. Errors are ignored: at process
 * exit the runtime may already be unloading. */
static clpar_status cuda_destroy(void *dev) {
  cuda_dev *d = dev;
  if (!d) return CLPAR_OK;
  if (cudaSetDevice(d->ordinal) == cudaSuccess) {
    if (d->stream) (void)cudaStreamSynchronize(d->stream);
    if (d->then_stream) (void)cudaStreamSynchronize(d->then_stream);
    clpar_backend_waited();
  }
  prof_discard(d);
  free(d->pairs);
  if (d->scratch) (void)cudaFree(d->scratch);
  if (d->blas) (void)cublasDestroy(d->blas);
  if (d->then_stream) (void)cudaStreamDestroy(d->then_stream);
  if (d->stream) (void)cudaStreamDestroy(d->stream);
  (void)cudaGetLastError();
  pthread_mutex_destroy(&d->then_lock);
  pthread_mutex_destroy(&d->prof_lock);
  pthread_mutex_destroy(&d->scratch_lock);
  pthread_mutex_destroy(&d->blas_lock);
  pthread_mutex_destroy(&d->peer_lock);
  free(d);
  return CLPAR_OK;
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

/* DIRECT: any thread, while the worker may still have work on the buffer enqueued (backend.h
 * lets the core release such a buffer). cudaFree only "may perform implicit synchronization"
 * for cudaMalloc'd memory (CUDA 13's cudaFree documentation), so the stream is drained
 * first. Releases are rare (the core caches buffers), so the wait is cheap. */
static clpar_status cuda_release(void *dev, void *buf) {
  cuda_dev *d = dev;
  if (!buf) return CLPAR_OK;
  clpar_status s = use_device(d);
  if (s == CLPAR_OK) {
    s = cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize(release)");
    clpar_backend_waited(); /* the sync and cudaFree's own: one wait */
  }
  if (s == CLPAR_OK) s = cuda_check(cudaFree(buf), "cudaFree");
  return s;
}

/* ---- events ---- */

/* A CUDA event without timing (cheaper to record than the profiling pairs), recorded on the
 * stream after everything enqueued so far. */
static clpar_status cuda_event_record(void *dev, void **ev) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  cudaEvent_t e = NULL;
  cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (err != cudaSuccess) return cuda_fail("cudaEventCreateWithFlags", err);
  err = cudaEventRecord(e, d->stream);
  if (err != cudaSuccess) {
    (void)cudaEventDestroy(e);
    return cuda_fail("cudaEventRecord", err);
  }
  *ev = e;
  return CLPAR_OK;
}

/* A NULL event is complete (backend.h). cudaEventQuery reports a device error that came
 * before the event (an illegal address in an earlier kernel) as its own. */
static clpar_status cuda_event_query(void *dev, void *ev, int *done) {
  cuda_dev *d = dev;
  *done = 0;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  if (!ev) {
    *done = 1;
    return CLPAR_OK;
  }
  cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError(); /* not an error: see cuda_fail */
    return CLPAR_OK;
  }
  if (e != cudaSuccess) return cuda_fail("cudaEventQuery", e);
  *done = 1;
  return CLPAR_OK;
}

typedef struct then_job {
  clpar_event_fn fn;
  void *user;
} then_job;

/* Runs in the runtime's callback thread, which must not call CUDA: it only hands the outcome
 * on. status is cudaSuccess, or the device error that stopped the stream. */
static void CUDART_CB then_done(cudaStream_t stream, cudaError_t status, void *arg) {
  (void)stream;
  then_job job = *(then_job *)arg;
  free(arg);
  job.fn(job.user, status == cudaSuccess ? CLPAR_OK : CLPAR_ERROR_BACKEND);
}

/* Calls fn(user, status) exactly once when this returns CLPAR_OK, and never when it returns
 * an error. A complete event calls fn at once, on this thread. Otherwise then_stream waits
 * for the event and then runs a stream callback: cudaStreamAddCallback rather than
 * cudaLaunchHostFunc, because a host function is not called at all after a device error,
 * and the core would wait for it forever; a callback is, with the error. The wait is on
 * then_stream, not on the device's stream, so that the callback neither waits for work
 * enqueued after the event nor holds up the stream (or its profiled ops) while it runs.
 * Waits from two threads at once may finish in either order: a callback is never early, but
 * may wait for a later event of the same stream as well. */
static clpar_status cuda_event_then(void *dev, void *ev, clpar_event_fn fn, void *user) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  cudaError_t e = ev ? cudaEventQuery((cudaEvent_t)ev) : cudaSuccess;
  if (e == cudaSuccess) {
    fn(user, CLPAR_OK);
    return CLPAR_OK;
  }
  if (e != cudaErrorNotReady) return cuda_fail("cudaEventQuery(event_then)", e);
  (void)cudaGetLastError();
  then_job *job = malloc(sizeof *job);
  if (!job) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  job->fn = fn;
  job->user = user;
  const char *what = "cudaStreamWaitEvent(event_then)";
  pthread_mutex_lock(&d->then_lock);
  e = cudaStreamWaitEvent(d->then_stream, (cudaEvent_t)ev, 0);
  if (e == cudaSuccess) {
    what = "cudaStreamAddCallback(event_then)";
    e = cudaStreamAddCallback(d->then_stream, then_done, job, 0);
  }
  pthread_mutex_unlock(&d->then_lock);
  if (e != cudaSuccess) {
    free(job); /* not registered: no callback will run */
    return cuda_fail(what, e);
  }
  return CLPAR_OK;
}

/* An event still pending is released by the runtime once it has happened, and a wait
 * already enqueued on it (event_then) still ends when it happens. */
static clpar_status cuda_event_free(void *dev, void *ev) {
  cuda_dev *d = dev;
  if (!ev) return CLPAR_OK;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  return cuda_check(cudaEventDestroy((cudaEvent_t)ev), "cudaEventDestroy");
}

/* Every optional entry is implemented on every CUDA device. */
#define cuda_supports_op NULL
#define cuda_tune_gemm NULL

/* ---- host staging memory and transfers ---- */

/* Pinned memory, so that write and read are truly asynchronous DMA. Portable: pinned for
 * every device of the process, should the core stage another device's transfers in it. */
static clpar_status cuda_host_alloc(void *dev, size_t bytes, void **handle, void **ptr) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    char what[64];
    snprintf(what, sizeof what, "cudaHostAlloc(%zu bytes)", bytes);
    return cuda_fail(what, e);
  }
  *handle = p;
  *ptr = p;
  return CLPAR_OK;
}

static clpar_status cuda_host_free(void *dev, void *handle) {
  cuda_dev *d = dev;
  if (!handle) return CLPAR_OK;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  s = cuda_check(cudaFreeHost(handle), "cudaFreeHost");
  clpar_backend_waited(); /* cudaFreeHost synchronizes the device */
  return s;
}

/* On the stream, after every op enqueued before it, and without waiting: the core keeps src
 * unchanged until an event recorded later has completed. From pinned memory (host_alloc)
 * the copy is DMA that overlaps the host; from pageable memory the runtime stages src and
 * may return before the copy is done. */
static clpar_status cuda_write(void *dev, void *buf, size_t off_bytes, const void *src,
                               size_t bytes) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  return cuda_check(
      cudaMemcpyAsync((char *)buf + off_bytes, src, bytes, cudaMemcpyHostToDevice, d->stream),
      "cudaMemcpyAsync(host to device)");
}

/* On the stream, without waiting: dst holds the data once an event recorded later has
 * completed. Into pinned memory it is asynchronous; into pageable memory the runtime itself
 * returns only when the copy is done (CUDA's rule for device-to-pageable copies). */
static clpar_status cuda_read(void *dev, const void *buf, size_t off_bytes, void *dst,
                              size_t bytes) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  return cuda_check(
      cudaMemcpyAsync(dst, (const char *)buf + off_bytes, bytes, cudaMemcpyDeviceToHost, d->stream),
      "cudaMemcpyAsync(device to host)");
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

/* The worker's own wait. Only profile_read, destroy, release and a sum_rows whose scratch
 * grows wait for the stream besides. */
static clpar_status cuda_finish(void *dev) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  if (s != CLPAR_OK) return s;
  s = cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize");
  clpar_backend_waited();
  return s;
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

/* Makes d->scratch hold at least floats floats; scratch_lock held. An old buffer may still
 * be in use by enqueued work, so the stream is drained before it is freed (once per size the
 * scratch grows to: it never needs more than 1024 x 31 floats); the first one needs no
 * wait. */
static clpar_status scratch_reserve(cuda_dev *d, size_t floats) {
  if (d->scratch_floats >= floats) return CLPAR_OK;
  clpar_status s = CLPAR_OK;
  if (d->scratch) {
    s = cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize(sum_rows scratch)");
    clpar_backend_waited();
    if (s == CLPAR_OK) s = cuda_check(cudaFree(d->scratch), "cudaFree(sum_rows scratch)");
    if (s != CLPAR_OK) return s; /* the old scratch is kept */
    d->scratch = NULL;
    d->scratch_floats = 0;
  }
  void *p = NULL;
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

/* As cuda_gemm, one cuBLAS call for the whole batch. */
static clpar_status cuda_gemm_batched(void *dev, int trans_a, int trans_b, size_t m, size_t n,
                                      size_t k, float alpha, clpar_bref a, size_t lda,
                                      size_t stride_a, clpar_bref b, size_t ldb, size_t stride_b,
                                      float beta, clpar_bref c, size_t ldc, size_t stride_c,
                                      size_t batch) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  int fits = m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
             ldc <= INT_MAX && batch <= INT_MAX;
  cublasStatus_t st;
  pthread_mutex_lock(&d->blas_lock);
  if (fits) {
    st = cublasSgemmStridedBatched(d->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, at(b),
                                   (int)ldb, (long long)stride_b, at(a), (int)lda,
                                   (long long)stride_a, &beta, at(c), (int)ldc, (long long)stride_c,
                                   (int)batch);
  } else {
#if CUBLAS_VER_MAJOR >= 12
    st = cublasSgemmStridedBatched_64(d->blas, op_b, op_a, (int64_t)n, (int64_t)m, (int64_t)k,
                                      &alpha, at(b), (int64_t)ldb, (long long)stride_b, at(a),
                                      (int64_t)lda, (long long)stride_a, &beta, at(c), (int64_t)ldc,
                                      (long long)stride_c, (int64_t)batch);
#else
    st = CUBLAS_STATUS_NOT_SUPPORTED; /* 32-bit sizes only before cuBLAS 12 */
#endif
  }
  pthread_mutex_unlock(&d->blas_lock);
  return op_end(d, &prof, blas_check(st, "cublasSgemmStridedBatched"));
}

/* ---- training ops ---- */

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

/* outer == 1 with a wide inner is sum_rows' shape, whose narrow path has a scratch pass. */
static clpar_status cuda_reduce_sum(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                                    clpar_bref out) {
  if (outer == 1 && inner >= 16) return cuda_sum_rows(dev, red, inner, a, out);
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_reduce_sum(d->stream, outer, red, inner, at(a), at(out)),
                   "reduce_sum kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_expand(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                                clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_expand(d->stream, outer, red, inner, at(a), at(out)),
                   "expand kernel launch");
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

/* exp, sqrt and neg are forward only (backend.h): refused here by name rather than by the
 * launcher's cudaErrorInvalidValue. */
static clpar_status cuda_unary_backward(void *dev, clpar_unary_kind kind, size_t n, clpar_bref g,
                                        clpar_bref saved, clpar_bref out) {
  cuda_dev *d = dev;
  if (kind != CLPAR_UNARY_RELU && kind != CLPAR_UNARY_SIGMOID && kind != CLPAR_UNARY_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "unary_backward: unary kind %d has no backward (forward only)",
                           (int)kind);
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_unary_backward(d->stream, kind, n, at(g), at(saved), at(out)),
                   "unary_backward kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_bias_act(void *dev, clpar_act_kind act, size_t rows, size_t cols,
                                  clpar_bref a, clpar_bref bias, clpar_bref out) {
  cuda_dev *d = dev;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "bias_act: activation %d", (int)act);
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_bias_act(d->stream, act, rows, cols, at(a), at(bias), at(out)),
                   "bias_act kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_bias_act_backward(void *dev, clpar_act_kind act, size_t rows, size_t cols,
                                           clpar_bref g, clpar_bref y, clpar_bref out,
                                           clpar_bref db, int accumulate) {
  cuda_dev *d = dev;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "bias_act_backward: activation %d",
                           (int)act);
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(
        clpar_cuda_bias_act_backward(d->stream, act, rows, cols, at(g), y.buf ? at(y) : NULL,
                                     out.buf ? at(out) : NULL, db.buf ? at(db) : NULL, accumulate),
        "bias_act_backward kernel launch");
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

static clpar_status cuda_pick(void *dev, int scatter, size_t rows, size_t cols, clpar_bref idx,
                              clpar_bref a, clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_pick(d->stream, scatter, rows, cols,
                                   (const int32_t *)idx.buf + idx.off, at(a), at(out)),
                   "pick kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_nll(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref labels,
                             clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_nll(d->stream, rows, cols, at(a), at_i32(labels), at(out)),
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
    s = cuda_check(clpar_cuda_nll_backward(d->stream, rows, cols, at_i32(labels), at(g), at(out)),
                   "nll_backward kernel launch");
  return op_end(d, &prof, s);
}

/* Without momentum the core passes param as buf; the kernel then never touches buf. The
 * arguments come by value and the launch copies them into the kernel's parameters. */
static clpar_status cuda_sgd_step(void *dev, size_t n, clpar_bref param, clpar_bref grad,
                                  clpar_bref buf, clpar_sgd_args args) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  float *b = args.momentum != 0.0f ? at(buf) : NULL;
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_sgd_step(d->stream, n, at(param), at(grad), b, &args),
                   "sgd_step kernel launch");
  return op_end(d, &prof, s);
}

static clpar_status cuda_adam_step(void *dev, size_t n, clpar_bref param, clpar_bref grad,
                                   clpar_bref m, clpar_bref v, clpar_adam_args args) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(clpar_cuda_adam_step(d->stream, n, at(param), at(grad), at(m), at(v), &args),
                   "adam_step kernel launch");
  return op_end(d, &prof, s);
}

/* ---- profiling entries ---- */

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

/* ---- peers ---- */

/* Copies issued by d into peer's memory go straight between the GPUs when the runtime says
 * d can access peer (then enabled once); otherwise the core stages them through host memory.
 * Two clpar devices are never one CUDA device. */
static clpar_status cuda_peer_access(void *dev, void *peer, int *yes) {
  cuda_dev *d = dev;
  const cuda_dev *p = peer;
  *yes = 0;
  if (p->ordinal == d->ordinal || p->ordinal < 0 || p->ordinal >= (int)sizeof d->peer_ok)
    return CLPAR_OK;
  pthread_mutex_lock(&d->peer_lock);
  signed char known = d->peer_ok[p->ordinal];
  clpar_status s = CLPAR_OK;
  if (!known) {
    int can = 0;
    s = cuda_check(cudaDeviceCanAccessPeer(&can, d->ordinal, p->ordinal),
                   "cudaDeviceCanAccessPeer");
    if (s == CLPAR_OK && can) s = use_device(d);
    if (s == CLPAR_OK && can) {
      cudaError_t e = cudaDeviceEnablePeerAccess(p->ordinal, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) { /* by other code in the process */
        (void)cudaGetLastError();
        e = cudaSuccess;
      }
      s = cuda_check(e, "cudaDeviceEnablePeerAccess");
    }
    if (s == CLPAR_OK) known = can ? 1 : -1;
    if (s == CLPAR_OK) d->peer_ok[p->ordinal] = known;
  }
  pthread_mutex_unlock(&d->peer_lock);
  *yes = known == 1;
  return s;
}

/* On d's (the source's) stream, after every op enqueued before it. */
static clpar_status cuda_copy_peer(void *dev, void *peer, void *dst, size_t dst_off_bytes,
                                   const void *src, size_t src_off_bytes, size_t bytes) {
  cuda_dev *d = dev;
  const cuda_dev *p = peer;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = cuda_check(
        cudaMemcpyPeerAsync((char *)dst + dst_off_bytes, p->ordinal,
                            (const char *)src + src_off_bytes, d->ordinal, bytes, d->stream),
        "cudaMemcpyPeerAsync");
  return op_end(d, &prof, s);
}

/* ---- convolution, pooling, batch norm (issue 10) ---- */

/* An optional input: NULL when absent. */
static float *opt(clpar_bref r) {
  return r.buf ? at(r) : NULL;
}

/* Runs one launcher as a profiled op of the device's stream. */
#define CUDA_OP(d, what, call)                                          \
  do {                                                                  \
    prof_pair prof_;                                                    \
    clpar_status s_ = op_begin((d), &prof_);                            \
    if (s_ == CLPAR_OK) s_ = cuda_check((call), what " kernel launch"); \
    return op_end((d), &prof_, s_);                                     \
  } while (0)

static clpar_status cuda_im2col(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref col) {
  cuda_dev *d = dev;
  CUDA_OP(d, "im2col", clpar_cuda_im2col(d->stream, g, at(x), at(col)));
}

static clpar_status cuda_col2im(void *dev, clpar_conv_geom g, clpar_bref col, clpar_bref x) {
  cuda_dev *d = dev;
  CUDA_OP(d, "col2im", clpar_cuda_col2im(d->stream, g, at(col), at(x)));
}

static clpar_status cuda_swap01(void *dev, size_t a, size_t b, size_t p, clpar_bref in,
                                clpar_bref bias, clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "swap01", clpar_cuda_swap01(d->stream, a, b, p, at(in), opt(bias), at(out)));
}

static int32_t *at_i32w(clpar_bref r) {
  return (int32_t *)r.buf + r.off;
}

static clpar_status cuda_maxpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y,
                                 clpar_bref idx) {
  cuda_dev *d = dev;
  CUDA_OP(d, "maxpool", clpar_cuda_maxpool(d->stream, g, at(x), at(y), at_i32w(idx)));
}

static clpar_status cuda_maxpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy,
                                          clpar_bref idx, clpar_bref dx) {
  cuda_dev *d = dev;
  CUDA_OP(d, "maxpool_backward",
          clpar_cuda_maxpool_backward(d->stream, g, at(dy), at_i32(idx), at(dx)));
}

static clpar_status cuda_avgpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y) {
  cuda_dev *d = dev;
  CUDA_OP(d, "avgpool", clpar_cuda_avgpool(d->stream, g, at(x), at(y)));
}

static clpar_status cuda_avgpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy,
                                          clpar_bref dx) {
  cuda_dev *d = dev;
  CUDA_OP(d, "avgpool_backward", clpar_cuda_avgpool_backward(d->stream, g, at(dy), at(dx)));
}

static clpar_status cuda_bn_stats(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                  clpar_bref mean, clpar_bref var, clpar_bref running_mean,
                                  clpar_bref running_var, float momentum) {
  cuda_dev *d = dev;
  CUDA_OP(d, "bn_stats",
          clpar_cuda_bn_stats(d->stream, n, c, p, at(x), at(mean), at(var), opt(running_mean),
                              opt(running_var), momentum));
}

static clpar_status cuda_bn_apply(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                  clpar_bref mean, clpar_bref var, clpar_bref weight,
                                  clpar_bref bias, float eps, clpar_bref y) {
  cuda_dev *d = dev;
  CUDA_OP(d, "bn_apply",
          clpar_cuda_bn_apply(d->stream, n, c, p, at(x), at(mean), at(var), opt(weight), opt(bias),
                              eps, at(y)));
}

static clpar_status cuda_bn_backward_sums(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                          clpar_bref g, clpar_bref mean, clpar_bref var, float eps,
                                          clpar_bref sum_g, clpar_bref sum_gxhat) {
  cuda_dev *d = dev;
  CUDA_OP(d, "bn_backward_sums",
          clpar_cuda_bn_backward_sums(d->stream, n, c, p, at(x), at(g), at(mean), at(var), eps,
                                      at(sum_g), at(sum_gxhat)));
}

static clpar_status cuda_bn_backward(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                     clpar_bref g, clpar_bref mean, clpar_bref var,
                                     clpar_bref weight, float eps, clpar_bref sum_g,
                                     clpar_bref sum_gxhat, int training, clpar_bref dx) {
  cuda_dev *d = dev;
  CUDA_OP(d, "bn_backward",
          clpar_cuda_bn_backward(d->stream, n, c, p, at(x), at(g), at(mean), at(var), opt(weight),
                                 eps, opt(sum_g), opt(sum_gxhat), training, at(dx)));
}

/* ---- collectives between processes: NCCL (cuda_nccl.c; CMake option CLPAR_NCCL) ---- */

#ifdef CLPAR_HAVE_NCCL
static clpar_status cuda_comm_id(void *dev, void *id, size_t bytes) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  return s == CLPAR_OK ? clpar_nccl_id(id, bytes) : s;
}

/* NCCL takes the communicator's device from the calling thread's current one. */
static clpar_status cuda_comm_init(void *dev, const void *id, size_t bytes, int nranks, int rank,
                                   void **comm) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  return s == CLPAR_OK ? clpar_nccl_init(d->ordinal, id, bytes, nranks, rank, comm) : s;
}

static clpar_status cuda_comm_query(void *dev, void *comm, int *pending) {
  cuda_dev *d = dev;
  clpar_status s = use_device(d);
  return s == CLPAR_OK ? clpar_nccl_query(comm, pending) : s;
}

static clpar_status cuda_comm_abort(void *dev, void *comm) {
  cuda_dev *d = dev;
  (void)use_device(d); /* abort whatever happens */
  clpar_clear_error();
  return clpar_nccl_abort(comm);
}

static clpar_status cuda_comm_free(void *dev, void *comm, double timeout_s) {
  cuda_dev *d = dev;
  (void)use_device(d);
  clpar_clear_error();
  return clpar_nccl_free(comm, timeout_s);
}

/* On the device's stream, in order with its other work: the gradients a backward kernel has
 * just written are averaged there, and the optimizer's kernels enqueued later read the
 * averages, with no host wait between (profiled as one op). */
static clpar_status cuda_comm_allreduce(void *dev, void *comm, clpar_bref data, size_t n,
                                        double timeout_s) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  return op_end(d, &prof, clpar_nccl_allreduce(comm, at(data), n, d->stream, timeout_s));
}
#else
#define cuda_comm_id NULL
#define cuda_comm_init NULL
#define cuda_comm_query NULL
#define cuda_comm_abort NULL
#define cuda_comm_free NULL
#define cuda_comm_allreduce NULL
#endif

/* Every entry of backend.h's list, cuda_<entry> (cuda_supports_op is NULL, and the comm_
 * entries without NCCL). */
/* Convolutions run as im2col and GEMMs in the core. */
#define cuda_conv2d NULL
#define cuda_conv2d_backward NULL
#define CLPAR_BE_PREFIX_ cuda
static const clpar_backend_iface cuda_iface = CLPAR_BACKEND_TABLE("cuda");
#undef CLPAR_BE_PREFIX_

/* ---- probe ---- */

/* Errors of cudaGetDeviceCount that only mean "no CUDA here". */
static int means_no_device(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary;
}

/* Makes the streams and the cuBLAS handle of device ordinal; the device is destroyed on
 * failure. */
static clpar_status cuda_dev_create(int ordinal, cuda_dev **out) {
  cuda_dev *d = calloc(1, sizeof *d);
  if (!d) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  d->ordinal = ordinal;
  pthread_mutex_init(&d->then_lock, NULL);
  pthread_mutex_init(&d->blas_lock, NULL);
  pthread_mutex_init(&d->scratch_lock, NULL);
  pthread_mutex_init(&d->prof_lock, NULL);
  pthread_mutex_init(&d->peer_lock, NULL);
  atomic_init(&d->profiling, 0);
  clpar_status s = use_device(d);
  if (s == CLPAR_OK)
    s = cuda_check(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
  if (s == CLPAR_OK)
    s = cuda_check(cudaStreamCreateWithFlags(&d->then_stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags(event_then)");
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
