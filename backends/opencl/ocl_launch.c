/* ocl_launch.c — the OpenCL backend's kernel launches and profiling: every command that
 * enqueues work goes through here, so profiling (clpar_device_profile_*) sees each one. */
#include <stdlib.h>

#include "ocl_internal.h"

clpar_status clpar_ocl_fail(cl_int err, const char *call, const char *what) {
  if (what)
    return clpar_set_error(clpar_ocl_status(err), "%s(%s): %s", call, what,
                           clpar_ocl_error_name(err));
  return clpar_set_error(clpar_ocl_status(err), "%s: %s", call, clpar_ocl_error_name(err));
}

/* ---- kernel launches ---- */

/* Where the next enqueue should put its event: NULL unless profiling is on. */
cl_event *clpar_ocl_profile_slot(clpar_ocl_device *d, cl_event *ev) {
  *ev = NULL;
  return __atomic_load_n(&d->profiling, __ATOMIC_RELAXED) ? ev : NULL;
}

/* Keeps a recorded span for the profile (dropped when out of memory). */
void clpar_ocl_profile_keep_span(clpar_ocl_device *d, cl_event after, cl_event last) {
  pthread_mutex_lock(&d->prof_lock);
  if (d->n_spans == d->cap_spans) {
    size_t cap = d->cap_spans ? 2 * d->cap_spans : 256;
    clpar_ocl_span *grown = realloc(d->spans, cap * sizeof *grown);
    if (grown) {
      d->spans = grown;
      d->cap_spans = cap;
    }
  }
  if (d->n_spans < d->cap_spans) {
    d->spans[d->n_spans].after = after;
    d->spans[d->n_spans++].last = last;
  } else {
    if (after) clReleaseEvent(after);
    clReleaseEvent(last);
  }
  pthread_mutex_unlock(&d->prof_lock);
}

/* Keeps an enqueued command's event for the profile. */
void clpar_ocl_profile_keep(clpar_ocl_device *d, cl_event ev) {
  if (ev) clpar_ocl_profile_keep_span(d, NULL, ev);
}

/* Sets the arguments and enqueues; the caller holds d->lock. */
clpar_status clpar_ocl_launch_locked(clpar_ocl_device *d, const char *file, const char *name,
                                     const karg *args, int nargs, cl_uint dims,
                                     const size_t *global, const size_t *local) {
  cl_kernel k;
  clpar_status s = clpar_ocl_kernel_get(d, file, name, &k);
  if (s != CLPAR_OK) return s;
  for (int i = 0; i < nargs; i++) {
    cl_int err = clSetKernelArg(k, (cl_uint)i, args[i].size, args[i].value);
    if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clSetKernelArg", name);
  }
  cl_event ev;
  cl_int err = clEnqueueNDRangeKernel(d->queue, k, dims, NULL, global, local, 0, NULL,
                                      clpar_ocl_profile_slot(d, &ev));
  if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clEnqueueNDRangeKernel", name);
  clpar_ocl_profile_keep(d, ev);
  clpar_ocl_prepare_launch(d, k, name, args, nargs, dims, global, local); /* when recording */
  return CLPAR_OK;
}

clpar_status clpar_ocl_launch(clpar_ocl_device *d, const char *file, const char *name,
                              const karg *args, int nargs, cl_uint dims, const size_t *global,
                              const size_t *local) {
  pthread_mutex_lock(&d->lock);
  clpar_status s = clpar_ocl_launch_locked(d, file, name, args, nargs, dims, global, local);
  pthread_mutex_unlock(&d->lock);
  return s;
}

clpar_status clpar_ocl_launch_1d(clpar_ocl_device *d, const char *file, const char *name,
                                 const karg *args, int nargs, size_t n) {
  size_t local = d->max_wg_size < CLPAR_OCL_WG_1D ? d->max_wg_size : CLPAR_OCL_WG_1D;
  size_t global = clpar_ocl_round_up(n, local);
  return clpar_ocl_launch(d, file, name, args, nargs, 1, &global, &local);
}

/* (cols, rows) work-items in groups of CLPAR_OCL_WG_2D, shaped to waste little on narrow
 * matrices. */
void clpar_ocl_shape_2d(clpar_ocl_device *d, size_t cols, size_t rows, size_t global[2],
                        size_t local[2]) {
  size_t wg = d->max_wg_size < CLPAR_OCL_WG_2D ? d->max_wg_size : CLPAR_OCL_WG_2D;
  size_t l0 = 1;
  while (l0 < cols && l0 < wg) l0 *= 2;
  local[0] = l0;
  local[1] = wg / l0 ? wg / l0 : 1;
  if (local[1] > rows) local[1] = 1;
  global[0] = clpar_ocl_round_up(cols, local[0]);
  global[1] = clpar_ocl_round_up(rows, local[1]);
}

/* ---- profiling ---- */

static int event_time(cl_event ev, cl_profiling_info what, cl_ulong *t) {
  return clGetEventProfilingInfo(ev, what, sizeof *t, t, NULL) == CL_SUCCESS;
}

/* Sums the device time of the kept spans (waiting for them: a wait the caller counts unless
 * the queue was just finished) and releases their events. */
static void profile_harvest(clpar_ocl_device *d) {
  for (size_t i = 0; i < d->n_spans; i++) {
    clpar_ocl_span *sp = &d->spans[i];
    cl_ulong start = 0, end = 0;
    int ok = clWaitForEvents(1, &sp->last) == CL_SUCCESS &&
             event_time(sp->last, CL_PROFILING_COMMAND_END, &end) &&
             (sp->after ? event_time(sp->after, CL_PROFILING_COMMAND_END, &start)
                        : event_time(sp->last, CL_PROFILING_COMMAND_START, &start));
    if (ok && end >= start) {
      d->prof_seconds += (double)(end - start) * 1e-9;
      d->prof_ops++;
    }
    if (sp->after) clReleaseEvent(sp->after);
    clReleaseEvent(sp->last);
  }
  d->n_spans = 0;
}

/* Sends d's next commands to q, after everything already on the queue in use: a marker there
 * and, unless it already ran, a barrier on q that waits for it (no host wait), or a clFinish
 * where the driver refuses. The caller holds d->lock. */
static void queue_switch(clpar_ocl_device *d, cl_command_queue q) {
  if (!q || q == d->queue) return;
  cl_event last = NULL;
  cl_int status = CL_QUEUED;
  cl_int err = clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &last);
  if (err == CL_SUCCESS) err = clFlush(d->queue);
  if (err == CL_SUCCESS)
    err = clGetEventInfo(last, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  if (err == CL_SUCCESS && status != CL_COMPLETE)
    err = clEnqueueBarrierWithWaitList(q, 1, &last, NULL);
  if (last) clReleaseEvent(last);
  if (err != CL_SUCCESS) {
    clFinish(d->queue);
    clpar_backend_waited();
  }
  d->queue = q;
}

/* The queue a profile records on: one with CL_QUEUE_PROFILING_ENABLE, made once; the plain
 * queue where the driver refuses (the profile then counts nothing). */
static cl_command_queue profiling_queue(clpar_ocl_device *d) {
  cl_int err = CL_SUCCESS;
  if (!d->prof_queue)
    d->prof_queue = clCreateCommandQueue(d->context, d->device, CL_QUEUE_PROFILING_ENABLE, &err);
  return err == CL_SUCCESS && d->prof_queue ? d->prof_queue : d->plain_queue;
}

clpar_status ocl_profile(void *dev, int enable) {
  clpar_ocl_device *d = dev;
  pthread_mutex_lock(&d->lock);
  pthread_mutex_lock(&d->prof_lock);
  if (d->n_spans) clpar_backend_waited(); /* profile_harvest waits for them */
  profile_harvest(d);
  d->prof_seconds = 0;
  d->prof_ops = 0;
  queue_switch(d, enable ? profiling_queue(d) : d->plain_queue);
  __atomic_store_n(&d->profiling, enable != 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&d->prof_lock);
  pthread_mutex_unlock(&d->lock);
  return CLPAR_OK;
}

clpar_status ocl_profile_read(void *dev, double *seconds, uint64_t *ops) {
  clpar_ocl_device *d = dev;
  clpar_status s = ocl_finish(dev);
  pthread_mutex_lock(&d->prof_lock);
  profile_harvest(d);
  *seconds = d->prof_seconds;
  *ops = d->prof_ops;
  pthread_mutex_unlock(&d->prof_lock);
  return s;
}
