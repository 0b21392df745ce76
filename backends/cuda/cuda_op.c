/* cuda_op.c — the CUDA backend's errors and the bracket every op runs in: op_begin makes the
 * device current and, while profiling is on, records a start event; op_end records the stop
 * event and keeps the pair, which the profiling entries here fold into the totals. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"

/* ---- errors ---- */

/* Sets the error for a failed runtime call. The runtime also keeps the error as this
 * thread's "last error"; it is cleared here so that a later launch check does not report
 * it again (an allocation that was too large must not fail the next kernel launch). */
clpar_status clpar_cuda_fail(const char *what, cudaError_t e) {
  (void)cudaGetLastError();
  clpar_status s = e == cudaErrorMemoryAllocation ? CLPAR_ERROR_OUT_OF_MEMORY : CLPAR_ERROR_BACKEND;
  return clpar_set_error(s, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

clpar_status clpar_cuda_check(cudaError_t e, const char *what) {
  return e == cudaSuccess ? CLPAR_OK : clpar_cuda_fail(what, e);
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

clpar_status clpar_cuda_blas_check(cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS) return CLPAR_OK;
  (void)cudaGetLastError(); /* cuBLAS may leave a runtime error behind; see cuda_fail */
  clpar_status s =
      st == CUBLAS_STATUS_ALLOC_FAILED ? CLPAR_ERROR_OUT_OF_MEMORY : CLPAR_ERROR_BACKEND;
  return clpar_set_error(s, "%s: %s", what, blas_status_name(st));
}

/* The runtime's current device is per host thread, and entries come from any thread. */
clpar_status clpar_cuda_use_device(const cuda_dev *d) {
  return clpar_cuda_check(cudaSetDevice(d->ordinal), "cudaSetDevice");
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
void clpar_cuda_prof_fold(cuda_dev *d, int wait) {
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
void clpar_cuda_prof_discard(cuda_dev *d) {
  for (size_t i = 0; i < d->n_pairs; i++) pair_destroy(&d->pairs[i]);
  d->n_pairs = 0;
}

/* Begins an op on the calling thread: makes the device current and, while profiling is on,
 * records the op's start event. Profiling never fails an op: a pair that cannot be made is
 * dropped (with a warning), and the runtime error it left is cleared (see cuda_fail). */
clpar_status clpar_cuda_op_begin(cuda_dev *d, prof_pair *prof) {
  prof->start = prof->stop = NULL;
  clpar_status s = clpar_cuda_use_device(d);
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
clpar_status clpar_cuda_op_end(cuda_dev *d, prof_pair *prof, clpar_status s) {
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
  if (d->n_pairs == d->cap_pairs) clpar_cuda_prof_fold(d, 0);
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

/* ---- profiling entries ---- */

/* Either way the totals restart from zero, and pairs kept so far are dropped. */
clpar_status cuda_profile(void *dev, int enable) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  pthread_mutex_lock(&d->prof_lock);
  clpar_cuda_prof_discard(d);
  d->prof_seconds = 0.0;
  d->prof_ops = 0;
  atomic_store_explicit(&d->profiling, enable != 0, memory_order_relaxed);
  pthread_mutex_unlock(&d->prof_lock);
  return CLPAR_OK;
}

clpar_status cuda_profile_read(void *dev, double *seconds, uint64_t *ops) {
  cuda_dev *d = dev;
  clpar_status s = cuda_finish(dev);
  pthread_mutex_lock(&d->prof_lock);
  clpar_cuda_prof_fold(d, 1);
  *seconds = d->prof_seconds;
  *ops = d->prof_ops;
  pthread_mutex_unlock(&d->prof_lock);
  return s;
}
