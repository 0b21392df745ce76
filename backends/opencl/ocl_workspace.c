/* ocl_workspace.c — a device's grow-only temporaries: the convolutions' workspace (im2col's
 * columns, Winograd's transforms, backward weights' partial sums, the flipped filter) and
 * d->scratch (sum_rows' partial sums, overlapping copies; under d->lock), each a buffer kept
 * between calls and replaced by a larger one when a call needs more, instead of a clCreateBuffer
 * and a release per call (about 200 in a ResNet-50 training step: on GPU drivers each is costly, on
 * PoCL each costs page faults). cuDNN takes a workspace the same way; PyTorch's caching allocator
 * reuses memory likewise.
 *
 * Reuse is safe because every command of a device goes to its one in-order queue (d->queue;
 * CLBlast gets the same queue, and a switch to the profiling queue makes it wait for the old
 * one: ocl_launch.c), so a call's commands run after the previous call's commands that used the
 * same buffer. A replaced buffer is released at once: OpenCL keeps it until the commands queued
 * on it are done. The workspace's lock is held from a slot's take to its give, so that two
 * threads (the worker, a tuner) never share a slot; it is recursive because backward data's
 * Winograd takes the flipped filter's slot, then calls the forward Winograd, which takes three
 * others. The buffers are the device's memory outside the allocator: at most the largest
 * temporaries one convolution needs (bounded by clpar_ocl_conv_chunk_floats), counted in
 * d->own_bytes (the workspace_bytes entry: the core's CLPAR_MEM_WORKSPACE), released by the
 * workspace_trim entry (clpar_device_empty_cache, the allocator's out-of-memory retry) but for
 * a slot taken, and freed when the device closes. Captured graphs: the convolutions are not
 * recorded (ocl_prepared.c), so a replay calls the entry, which takes its slots again; the launches
 * a graph does record keep (retain) the d->scratch they were recorded with. */
#include <string.h>

#include "ocl_internal.h"

clpar_status clpar_ocl_grow(clpar_ocl_device *d, cl_mem *m, size_t *have, size_t bytes) {
  if (*m && *have >= bytes) return CLPAR_OK;
  if (*m) { /* the queue keeps it until its commands are done */
    clReleaseMemObject(*m);
    atomic_fetch_sub_explicit(&d->own_bytes, *have, memory_order_relaxed);
  }
  *m = NULL;
  *have = 0;
  void *buf;
  clpar_status s = ocl_alloc(d, bytes, &buf);
  if (s != CLPAR_OK) return s;
  *m = AS_MEM(buf);
  *have = bytes;
  atomic_fetch_add_explicit(&d->own_bytes, bytes, memory_order_relaxed);
  return CLPAR_OK;
}

/* Releases *m (NULL: nothing) and counts it out of d->own_bytes. */
static void drop(clpar_ocl_device *d, cl_mem *m, size_t *have) {
  if (!*m) return;
  clReleaseMemObject(*m);
  atomic_fetch_sub_explicit(&d->own_bytes, *have, memory_order_relaxed);
  *m = NULL;
  *have = 0;
}

void clpar_ocl_workspace_init(clpar_ocl_device *d) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&d->ws.lock, &attr);
  pthread_mutexattr_destroy(&attr);
}

/* Releases the slots not taken; d->ws.lock held. */
static void release_free_slots(clpar_ocl_device *d) {
  for (int i = 0; i < CLPAR_OCL_WS_SLOTS; i++)
    if (!(d->ws.held & (1u << i))) drop(d, &d->ws.slot[i], &d->ws.bytes[i]);
}

static size_t total_bytes(const clpar_ocl_workspace *ws) {
  size_t t = 0;
  for (int i = 0; i < CLPAR_OCL_WS_SLOTS; i++) t += ws->bytes[i];
  return t;
}

clpar_status clpar_ocl_ws_take(clpar_ocl_device *d, int slot, size_t bytes, void **buf) {
  clpar_ocl_workspace *ws = &d->ws;
  if (slot < 0 || slot >= CLPAR_OCL_WS_SLOTS)
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl workspace: no slot %d", slot);
  pthread_mutex_lock(&ws->lock);
  if (ws->held & (1u << slot)) {
    pthread_mutex_unlock(&ws->lock);
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl workspace: slot %d taken twice", slot);
  }
  int grows = !ws->slot[slot] || ws->bytes[slot] < bytes;
  clpar_status s = clpar_ocl_grow(d, &ws->slot[slot], &ws->bytes[slot], bytes);
  if (s == CLPAR_ERROR_OUT_OF_MEMORY) { /* the other slots' memory may make room */
    clpar_log(CLPAR_LOG_INFO, "opencl: %s: no memory for %zu bytes of workspace; releasing it",
              d->dev_name, bytes);
    release_free_slots(d);
    clpar_clear_error();
    s = clpar_ocl_grow(d, &ws->slot[slot], &ws->bytes[slot], bytes);
  }
  if (s != CLPAR_OK) {
    pthread_mutex_unlock(&ws->lock);
    return s;
  }
  if (grows) {
    ws->grows++;
    size_t total = total_bytes(ws);
    if (total > ws->peak_bytes) ws->peak_bytes = total;
    clpar_log(CLPAR_LOG_DEBUG, "opencl: %s: workspace slot %d grown to %zu bytes (%zu in all)",
              d->dev_name, slot, bytes, total);
  }
  ws->held |= 1u << slot;
  *buf = ws->slot[slot];
  return CLPAR_OK; /* the lock stays held until the give */
}

void clpar_ocl_ws_give(clpar_ocl_device *d, int slot, void *buf) {
  if (!buf) return; /* not taken */
  d->ws.held &= ~(1u << slot);
  pthread_mutex_unlock(&d->ws.lock);
}

void clpar_ocl_workspace_release(clpar_ocl_device *d) {
  pthread_mutex_lock(&d->ws.lock);
  release_free_slots(d);
  pthread_mutex_unlock(&d->ws.lock);
}

void clpar_ocl_workspace_free(clpar_ocl_device *d) {
  clpar_ocl_workspace_release(d);
  drop(d, &d->scratch, &d->scratch_bytes);
  pthread_mutex_destroy(&d->ws.lock);
}

clpar_status clpar_ocl_workspace_bytes(void *dev, uint64_t *bytes) {
  clpar_ocl_device *d = dev;
  *bytes = atomic_load_explicit(&d->own_bytes, memory_order_relaxed);
  return CLPAR_OK;
}

/* On the worker, after the commands posted before: a released buffer stays alive in OpenCL
 * until the commands queued on it are done, and the prepared launches of a graph retain the
 * d->scratch they recorded. A slot a tuner holds is kept (its lock is held until the give). */
clpar_status clpar_ocl_workspace_trim(void *dev) {
  clpar_ocl_device *d = dev;
  clpar_ocl_workspace_release(d);
  pthread_mutex_lock(&d->lock);
  drop(d, &d->scratch, &d->scratch_bytes);
  pthread_mutex_unlock(&d->lock);
  return CLPAR_OK;
}

clpar_status clpar_ocl_workspace_poison(clpar_ocl_device *d) {
  const float nan = __builtin_nanf("");
  cl_int err = CL_SUCCESS;
  pthread_mutex_lock(&d->ws.lock);
  pthread_mutex_lock(&d->lock);
  for (int i = 0; i < CLPAR_OCL_WS_SLOTS && err == CL_SUCCESS; i++)
    if (d->ws.slot[i] && !(d->ws.held & (1u << i)))
      err = clEnqueueFillBuffer(d->queue, d->ws.slot[i], &nan, sizeof nan, 0,
                                d->ws.bytes[i] / sizeof nan * sizeof nan, 0, NULL, NULL);
  pthread_mutex_unlock(&d->lock);
  pthread_mutex_unlock(&d->ws.lock);
  return err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clEnqueueFillBuffer", "workspace");
}

void clpar_ocl_buffer_stats_get(clpar_ocl_device *d, clpar_ocl_buffer_stats *out) {
  memset(out, 0, sizeof *out);
  out->created = atomic_load_explicit(&d->buffers_created, memory_order_relaxed);
  pthread_mutex_lock(&d->ws.lock);
  out->workspace_grows = d->ws.grows;
  out->workspace_bytes = total_bytes(&d->ws);
  out->workspace_peak_bytes = d->ws.peak_bytes;
  pthread_mutex_unlock(&d->ws.lock);
  pthread_mutex_lock(&d->lock);
  out->scratch_bytes = d->scratch_bytes;
  pthread_mutex_unlock(&d->lock);
}
