/* cuda_memory.c — the CUDA backend's memory: device buffers, events, pinned staging memory,
 * the transfers between host and device, and copies to another CUDA device. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_internal.h"

/* ---- buffers ---- */

clpar_status cuda_alloc(void *dev, size_t bytes, void **buf) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    char what[64];
    snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", bytes);
    return clpar_cuda_fail(what, e);
  }
  *buf = p;
  return CLPAR_OK;
}

/* DIRECT: any thread, while the worker may still have work on the buffer enqueued (backend.h
 * lets the core release such a buffer). cudaFree only "may perform implicit synchronization"
 * for cudaMalloc'd memory (CUDA 13's cudaFree documentation), so the stream is drained
 * first. Releases are rare (the core caches buffers), so the wait is cheap. */
clpar_status cuda_release(void *dev, void *buf) {
  cuda_dev *d = dev;
  if (!buf) return CLPAR_OK;
  clpar_status s = clpar_cuda_use_device(d);
  if (s == CLPAR_OK) {
    s = clpar_cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize(release)");
    clpar_backend_waited(); /* the sync and cudaFree's own: one wait */
  }
  if (s == CLPAR_OK) s = clpar_cuda_check(cudaFree(buf), "cudaFree");
  return s;
}

/* ---- events ---- */

/* A CUDA event without timing (cheaper to record than the profiling pairs), recorded on the
 * stream after everything enqueued so far. */
clpar_status cuda_event_record(void *dev, void **ev) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  cudaEvent_t e = NULL;
  cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (err != cudaSuccess) return clpar_cuda_fail("cudaEventCreateWithFlags", err);
  err = cudaEventRecord(e, d->stream);
  if (err != cudaSuccess) {
    (void)cudaEventDestroy(e);
    return clpar_cuda_fail("cudaEventRecord", err);
  }
  *ev = e;
  return CLPAR_OK;
}

/* A NULL event is complete (backend.h). cudaEventQuery reports a device error that came
 * before the event (an illegal address in an earlier kernel) as its own. */
clpar_status cuda_event_query(void *dev, void *ev, int *done) {
  cuda_dev *d = dev;
  *done = 0;
  clpar_status s = clpar_cuda_use_device(d);
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
  if (e != cudaSuccess) return clpar_cuda_fail("cudaEventQuery", e);
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
clpar_status cuda_event_then(void *dev, void *ev, clpar_event_fn fn, void *user) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  cudaError_t e = ev ? cudaEventQuery((cudaEvent_t)ev) : cudaSuccess;
  if (e == cudaSuccess) {
    fn(user, CLPAR_OK);
    return CLPAR_OK;
  }
  if (e != cudaErrorNotReady) return clpar_cuda_fail("cudaEventQuery(event_then)", e);
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
    return clpar_cuda_fail(what, e);
  }
  return CLPAR_OK;
}

/* An event still pending is released by the runtime once it has happened, and a wait
 * already enqueued on it (event_then) still ends when it happens. */
clpar_status cuda_event_free(void *dev, void *ev) {
  cuda_dev *d = dev;
  if (!ev) return CLPAR_OK;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  return clpar_cuda_check(cudaEventDestroy((cudaEvent_t)ev), "cudaEventDestroy");
}

/* ---- host staging memory and transfers ---- */

/* Pinned memory, so that write and read are truly asynchronous DMA. Portable: pinned for
 * every device of the process, should the core stage another device's transfers in it. */
clpar_status cuda_host_alloc(void *dev, size_t bytes, void **handle, void **ptr) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    char what[64];
    snprintf(what, sizeof what, "cudaHostAlloc(%zu bytes)", bytes);
    return clpar_cuda_fail(what, e);
  }
  *handle = p;
  *ptr = p;
  return CLPAR_OK;
}

clpar_status cuda_host_free(void *dev, void *handle) {
  cuda_dev *d = dev;
  if (!handle) return CLPAR_OK;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  s = clpar_cuda_check(cudaFreeHost(handle), "cudaFreeHost");
  clpar_backend_waited(); /* cudaFreeHost synchronizes the device */
  return s;
}

/* On the stream, after every op enqueued before it, and without waiting: the core keeps src
 * unchanged until an event recorded later has completed. From pinned memory (host_alloc)
 * the copy is DMA that overlaps the host; from pageable memory the runtime stages src and
 * may return before the copy is done. */
clpar_status cuda_write(void *dev, void *buf, size_t off_bytes, const void *src, size_t bytes) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  return clpar_cuda_check(
      cudaMemcpyAsync((char *)buf + off_bytes, src, bytes, cudaMemcpyHostToDevice, d->stream),
      "cudaMemcpyAsync(host to device)");
}

/* On the stream, without waiting: dst holds the data once an event recorded later has
 * completed. Into pinned memory it is asynchronous; into pageable memory the runtime itself
 * returns only when the copy is done (CUDA's rule for device-to-pageable copies). */
clpar_status cuda_read(void *dev, const void *buf, size_t off_bytes, void *dst, size_t bytes) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  return clpar_cuda_check(
      cudaMemcpyAsync(dst, (const char *)buf + off_bytes, bytes, cudaMemcpyDeviceToHost, d->stream),
      "cudaMemcpyAsync(device to host)");
}

clpar_status cuda_copy(void *dev, void *dst, size_t dst_off_bytes, const void *src,
                       size_t src_off_bytes, size_t bytes) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(
        cudaMemcpyAsync((char *)dst + dst_off_bytes, (const char *)src + src_off_bytes, bytes,
                        cudaMemcpyDeviceToDevice, d->stream),
        "cudaMemcpyAsync(device to device)");
  return clpar_cuda_op_end(d, &prof, s);
}

/* The worker's own wait. Only profile_read, destroy, release and a sum_rows whose scratch
 * grows wait for the stream besides. */
clpar_status cuda_finish(void *dev) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  s = clpar_cuda_check(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize");
  clpar_backend_waited();
  return s;
}

/* ---- peers ---- */

/* Copies issued by d into peer's memory go straight between the GPUs when the runtime says
 * d can access peer (then enabled once); otherwise the core stages them through host memory.
 * Two clpar devices are never one CUDA device. */
clpar_status cuda_peer_access(void *dev, void *peer, int *yes) {
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
    s = clpar_cuda_check(cudaDeviceCanAccessPeer(&can, d->ordinal, p->ordinal),
                         "cudaDeviceCanAccessPeer");
    if (s == CLPAR_OK && can) s = clpar_cuda_use_device(d);
    if (s == CLPAR_OK && can) {
      cudaError_t e = cudaDeviceEnablePeerAccess(p->ordinal, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) { /* by other code in the process */
        (void)cudaGetLastError();
        e = cudaSuccess;
      }
      s = clpar_cuda_check(e, "cudaDeviceEnablePeerAccess");
    }
    if (s == CLPAR_OK) known = can ? 1 : -1;
    if (s == CLPAR_OK) d->peer_ok[p->ordinal] = known;
  }
  pthread_mutex_unlock(&d->peer_lock);
  *yes = known == 1;
  return s;
}

/* On d's (the source's) stream, after every op enqueued before it. */
clpar_status cuda_copy_peer(void *dev, void *peer, void *dst, size_t dst_off_bytes, const void *src,
                            size_t src_off_bytes, size_t bytes) {
  cuda_dev *d = dev;
  const cuda_dev *p = peer;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(
        cudaMemcpyPeerAsync((char *)dst + dst_off_bytes, p->ordinal,
                            (const char *)src + src_off_bytes, d->ordinal, bytes, d->stream),
        "cudaMemcpyPeerAsync");
  return clpar_cuda_op_end(d, &prof, s);
}
