/* ocl_memory.c — the OpenCL backend's memory: device buffers, pinned staging blocks, events,
 * and the copies between host and device, within a device and between devices that share a
 * context. */
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

/* ---- buffers ---- */

/* A driver may allocate a buffer's memory only when a command first uses it; an allocation
 * failure then surfaces there, and PoCL 3.1 (CPU devices) does not report it at all: it
 * aborts the process (pocl_util.c, pocl_create_migration_commands: Assertion
 * `p->mem_ptr != NULL'). On a CPU device, CL_MEM_ALLOC_HOST_PTR makes PoCL allocate the host
 * memory that is the device's memory in clCreateBuffer, which then reports a failure
 * (CL_OUT_OF_HOST_MEMORY: CLPAR_ERROR_OUT_OF_MEMORY). Measured under ulimit -v: the same
 * buffers fit either way (no second copy). On other devices the flag would mean host memory:
 * there a failure on first use is an error of the op (CL_MEM_OBJECT_ALLOCATION_FAILURE or
 * CL_OUT_OF_RESOURCES, also CLPAR_ERROR_OUT_OF_MEMORY), returned by the next call. */
clpar_status ocl_alloc(void *dev, size_t bytes, void **buf) {
  clpar_ocl_device *d = dev;
  /* The specification makes a larger buffer CL_INVALID_BUFFER_SIZE, but some drivers
   * (NVIDIA's) accept one; the limit is enforced here so that every driver behaves the same. */
  if (d->max_alloc && bytes > d->max_alloc)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                           "clCreateBuffer(%zu bytes): over the device's "
                           "CL_DEVICE_MAX_MEM_ALLOC_SIZE (%llu bytes)",
                           bytes, (unsigned long long)d->max_alloc);
  cl_int err;
  cl_mem m = clCreateBuffer(d->context, d->buffer_flags, bytes ? bytes : sizeof(float), NULL, &err);
  atomic_fetch_add_explicit(&d->buffers_created, 1, memory_order_relaxed);
  if (err != CL_SUCCESS) {
    clpar_status s = clpar_ocl_status(err);
    return clpar_set_error(s, "clCreateBuffer(%zu bytes): %s", bytes, clpar_ocl_error_name(err));
  }
  *buf = m;
  return CLPAR_OK;
}

clpar_status ocl_release(void *dev, void *buf) {
  (void)dev;
  if (buf) clReleaseMemObject(AS_MEM(buf));
  return CLPAR_OK;
}

/* ---- pinned staging memory and events ---- */

typedef struct {
  cl_mem mem;
  void *ptr;
} pinned;

/* CL_MEM_ALLOC_HOST_PTR memory mapped once: transfers from and to its pointer run at the
 * device's full speed on drivers that pin it (NVIDIA's, AMD's). */
clpar_status ocl_host_alloc(void *dev, size_t bytes, void **handle, void **ptr) {
  clpar_ocl_device *d = dev;
  pinned *p = calloc(1, sizeof *p);
  if (!p)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl host_alloc: out of host memory");
  cl_int err;
  p->mem = clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &err);
  if (err == CL_SUCCESS) { /* a blocking map: the pointer is needed at once */
    p->ptr = clEnqueueMapBuffer(d->queue, p->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0,
                                NULL, NULL, &err);
    clpar_backend_waited();
  }
  if (err != CL_SUCCESS) {
    if (p->mem) clReleaseMemObject(p->mem);
    free(p);
    return clpar_ocl_fail(err, "clCreateBuffer/clEnqueueMapBuffer", "pinned staging");
  }
  *handle = p;
  *ptr = p->ptr;
  return CLPAR_OK;
}

clpar_status ocl_host_free(void *dev, void *handle) {
  clpar_ocl_device *d = dev;
  pinned *p = handle;
  clEnqueueUnmapMemObject(d->queue, p->mem, p->ptr, 0, NULL, NULL);
  clReleaseMemObject(p->mem); /* freed by the driver once the unmap is done */
  free(p);
  return CLPAR_OK;
}

clpar_status ocl_event_record(void *dev, void **ev) {
  clpar_ocl_device *d = dev;
  cl_event e;
  cl_int err = clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &e);
  if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clEnqueueMarkerWithWaitList", NULL);
  clFlush(d->queue); /* the marker must reach the device without a later wait */
  *ev = e;
  return CLPAR_OK;
}

clpar_status ocl_event_query(void *dev, void *ev, int *done) {
  (void)dev;
  cl_int status;
  cl_int err =
      clGetEventInfo((cl_event)ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clGetEventInfo", NULL);
  if (status < 0)
    return clpar_set_error(CLPAR_ERROR_BACKEND, "an event failed: %s",
                           clpar_ocl_error_name(status));
  *done = status == CL_COMPLETE;
  return CLPAR_OK;
}

typedef struct {
  clpar_event_fn fn;
  void *user;
} then_ctx;

static void CL_CALLBACK event_done(cl_event ev, cl_int status, void *user) {
  (void)ev;
  then_ctx *t = user;
  t->fn(t->user, status < 0 ? CLPAR_ERROR_BACKEND : CLPAR_OK);
  free(t);
}

clpar_status ocl_event_then(void *dev, void *ev, clpar_event_fn fn, void *user) {
  (void)dev;
  then_ctx *t = malloc(sizeof *t);
  if (!t)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl event_then: out of host memory");
  t->fn = fn;
  t->user = user;
  cl_int err = clSetEventCallback((cl_event)ev, CL_COMPLETE, event_done, t);
  if (err != CL_SUCCESS) {
    free(t);
    return clpar_ocl_fail(err, "clSetEventCallback", NULL);
  }
  return CLPAR_OK;
}

clpar_status ocl_event_free(void *dev, void *ev) {
  (void)dev;
  clReleaseEvent((cl_event)ev);
  return CLPAR_OK;
}

/* ---- peer copies (devices sharing one context: CLPAR_OPENCL_CONTEXT=platform) ---- */

/* A buffer of one context can be used by any queue of that context: devices that share it
 * copy between each other's buffers with clEnqueueCopyBuffer. Devices of separate contexts
 * (the default) cannot, and copy through host staging (src/runtime/transfer.c). */
clpar_status ocl_peer_access(void *dev, void *peer, int *yes) {
  const clpar_ocl_device *d = dev, *p = peer;
  *yes = d != p && d->context == p->context;
  return CLPAR_OK;
}

/* Runs on this (the source) device's queue. The core has made this queue wait for the
 * destination's earlier work (so nothing of it still uses dst) and makes the destination's
 * queue wait for this copy's completion before it enqueues anything after it: every use of a
 * buffer by a second queue of the context comes after the first queue's commands on it
 * completed, as the OpenCL memory model asks of objects shared between queues. */
clpar_status ocl_copy_peer(void *dev, void *peer, void *dst, size_t dst_off_bytes, const void *src,
                           size_t src_off_bytes, size_t bytes) {
  clpar_ocl_device *d = dev;
  (void)peer;
  pthread_mutex_lock(&d->lock);
  cl_event ev;
  cl_int err = clEnqueueCopyBuffer(d->queue, AS_MEM((void *)src), AS_MEM(dst), src_off_bytes,
                                   dst_off_bytes, bytes, 0, NULL, clpar_ocl_profile_slot(d, &ev));
  if (err == CL_SUCCESS) clpar_ocl_profile_keep(d, ev);
  pthread_mutex_unlock(&d->lock);
  return err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clEnqueueCopyBuffer", "peer copy");
}

/* src stays valid until a later event completes (the core's promise): nothing is copied and
 * nothing waits. */
static clpar_status ocl_write_locked(void *dev, void *buf, size_t off_bytes, const void *src,
                                     size_t bytes) {
  clpar_ocl_device *d = dev;
  cl_int err =
      clEnqueueWriteBuffer(d->queue, AS_MEM(buf), CL_FALSE, off_bytes, bytes, src, 0, NULL, NULL);
  return err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clEnqueueWriteBuffer", NULL);
}

clpar_status ocl_write(void *dev, void *buf, size_t off_bytes, const void *src, size_t bytes) {
  clpar_ocl_device *d_ = dev;
  pthread_mutex_lock(&d_->lock);
  clpar_status s_ = ocl_write_locked(dev, buf, off_bytes, src, bytes);
  pthread_mutex_unlock(&d_->lock);
  return s_;
}

/* Not waited for: dst stays valid until a later event completes. */
static clpar_status ocl_read_locked(void *dev, const void *buf, size_t off_bytes, void *dst,
                                    size_t bytes) {
  clpar_ocl_device *d = dev;
  cl_int err = clEnqueueReadBuffer(d->queue, AS_MEM((void *)buf), CL_FALSE, off_bytes, bytes, dst,
                                   0, NULL, NULL);
  return err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clEnqueueReadBuffer", NULL);
}

clpar_status ocl_read(void *dev, const void *buf, size_t off_bytes, void *dst, size_t bytes) {
  clpar_ocl_device *d_ = dev;
  pthread_mutex_lock(&d_->lock);
  clpar_status s_ = ocl_read_locked(dev, buf, off_bytes, dst, bytes);
  pthread_mutex_unlock(&d_->lock);
  return s_;
}

/* OpenCL refuses overlapping copies within one buffer: those go through d->scratch (grown
 * as sum_rows grows it; both run under d->lock, so their commands never interleave). */
static clpar_status copy_overlapping(clpar_ocl_device *d, cl_mem m, size_t dst_off, size_t src_off,
                                     size_t bytes) {
  clpar_status s = clpar_ocl_grow(d, &d->scratch, &d->scratch_bytes, bytes);
  if (s != CLPAR_OK) return s;
  cl_int err = clEnqueueCopyBuffer(d->queue, m, d->scratch, src_off, 0, bytes, 0, NULL, NULL);
  if (err == CL_SUCCESS)
    err = clEnqueueCopyBuffer(d->queue, d->scratch, m, 0, dst_off, bytes, 0, NULL, NULL);
  return err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clEnqueueCopyBuffer", NULL);
}

static clpar_status ocl_copy_locked(void *dev, void *dst, size_t dst_off_bytes, const void *src,
                                    size_t src_off_bytes, size_t bytes) {
  clpar_ocl_device *d = dev;
  if (dst == src) {
    if (dst_off_bytes == src_off_bytes) return CLPAR_OK;
    size_t lo = dst_off_bytes < src_off_bytes ? dst_off_bytes : src_off_bytes;
    size_t hi = dst_off_bytes < src_off_bytes ? src_off_bytes : dst_off_bytes;
    if (hi - lo < bytes)
      return copy_overlapping(d, AS_MEM(dst), dst_off_bytes, src_off_bytes, bytes);
  }
  cl_event ev;
  cl_int err = clEnqueueCopyBuffer(d->queue, AS_MEM((void *)src), AS_MEM(dst), src_off_bytes,
                                   dst_off_bytes, bytes, 0, NULL, clpar_ocl_profile_slot(d, &ev));
  if (err == CL_SUCCESS) clpar_ocl_profile_keep(d, ev);
  return err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clEnqueueCopyBuffer", NULL);
}

clpar_status ocl_copy(void *dev, void *dst, size_t dst_off_bytes, const void *src,
                      size_t src_off_bytes, size_t bytes) {
  clpar_ocl_device *d_ = dev;
  pthread_mutex_lock(&d_->lock);
  clpar_status s_ = ocl_copy_locked(dev, dst, dst_off_bytes, src, src_off_bytes, bytes);
  pthread_mutex_unlock(&d_->lock);
  return s_;
}

static clpar_status ocl_finish_locked(void *dev) {
  clpar_ocl_device *d = dev;
  cl_int err = clFinish(d->queue);
  clpar_backend_waited();
  return err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clFinish", NULL);
}

clpar_status ocl_finish(void *dev) {
  clpar_ocl_device *d_ = dev;
  pthread_mutex_lock(&d_->lock);
  clpar_status s_ = ocl_finish_locked(dev);
  pthread_mutex_unlock(&d_->lock);
  return s_;
}
