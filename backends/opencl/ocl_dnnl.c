/* ocl_dnnl.c — the OpenCL backend's convolutions through oneDNN on Intel GPUs, opt-in with
 * CLPAR_OCL_DNNL=1 (0 or unset: clpar's own kernels). oneDNN's GPU kernels serve Intel GPUs
 * only, so a device that is not a GPU of vendor 0x8086 refuses, as does one whose oneDNN
 * engine cannot be made, and keeps clpar's kernels; the reason is logged once per device.
 *
 * The engine and the stream are made at the first call from the device's own context and its
 * in-order queue, so oneDNN's kernels run in order with clpar's and nothing is waited for.
 * The descriptors, the primitives and their cache are dnnl_conv.c's and dnnl_prim.c's, the
 * ones the host backend runs on its CPU engine; only the memory is this file's: oneDNN memory
 * objects over clpar's buffers (a sub-buffer where the tensor starts at an offset), and the
 * device's work buffers for the reorders. The whole call holds the device's lock, as every
 * command on its queue does. Calls made while a profile or a graph is recorded keep clpar's
 * kernels (oneDNN's commands would be missing from either). A call oneDNN cannot run (an
 * offset the device cannot start a sub-buffer at, a primitive oneDNN does not make) falls back
 * to clpar's kernels, which write every output again.
 *
 * Built only where oneDNN has its OpenCL GPU runtime (CLPAR_HAVE_DNNL_OCL); without it, every
 * device refuses. This path has been built but never run on an Intel GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opencl/ocl_internal.h"

#ifdef CLPAR_HAVE_DNNL_OCL
#include <oneapi/dnnl/dnnl_ocl.h>

#include "dnnl_conv.h"
#endif

int clpar_ocl_dnnl_any_vendor;

/* A device's oneDNN state: made at its first call with the switch on. */
typedef struct clpar_ocl_dnnl {
  int ready;     /* 1: engine and stream made; 0: refused (why) */
  uint64_t runs; /* calls oneDNN ran */
  char why[256];
#ifdef CLPAR_HAVE_DNNL_OCL
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  hd_cache cache;
  /* The work buffers of the reorders and scratch outputs, one per operand slot, kept between
   * calls (backward weights reads gy's reorder that backward data left in slot 0), counted in
   * d->own_bytes. */
  cl_mem work[HD_MAX_ARGS];
  size_t work_bytes[HD_MAX_ARGS];
#endif
} clpar_ocl_dnnl;

clpar_status clpar_ocl_dnnl_setting(int *on) {
  const char *v = getenv("CLPAR_OCL_DNNL");
  *on = 0;
  if (!v || strcmp(v, "0") == 0) return CLPAR_OK;
  if (strcmp(v, "1") == 0) return *on = 1, CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "clpar_conv2d (opencl): CLPAR_OCL_DNNL is \"%.32s\"; use 1 (convolutions "
                         "through oneDNN on Intel GPUs) or 0 (clpar's kernels)",
                         v);
}

void clpar_ocl_dnnl_free(clpar_ocl_device *d) {
  clpar_ocl_dnnl *s = d->dnnl;
  if (!s) return;
#ifdef CLPAR_HAVE_DNNL_OCL
  hd_cache_clear(&s->cache);
  for (int i = 0; i < HD_MAX_ARGS; i++)
    if (s->work[i]) {
      clReleaseMemObject(s->work[i]);
      atomic_fetch_sub_explicit(&d->own_bytes, s->work_bytes[i], memory_order_relaxed);
    }
  if (s->stream) dnnl_stream_destroy(s->stream);
  if (s->engine) dnnl_engine_destroy(s->engine);
#endif
  free(s);
  d->dnnl = NULL;
}

/* Why d's convolutions stay clpar's, or NULL for an Intel GPU. */
static const char *vendor_refusal(clpar_ocl_device *d) {
  cl_device_type type = 0;
  cl_uint vendor = 0;
  if (clGetDeviceInfo(d->device, CL_DEVICE_TYPE, sizeof type, &type, NULL) != CL_SUCCESS ||
      clGetDeviceInfo(d->device, CL_DEVICE_VENDOR_ID, sizeof vendor, &vendor, NULL) != CL_SUCCESS)
    return "its type and vendor could not be read";
  if (clpar_ocl_dnnl_any_vendor) return NULL;
  if (!(type & CL_DEVICE_TYPE_GPU) || vendor != 0x8086)
    return "not an Intel GPU (oneDNN's OpenCL kernels serve Intel GPUs only)";
  return NULL;
}

/* Makes s's engine and stream from d's context and queue; the reason into s->why if not. */
static void make_engine(clpar_ocl_device *d, clpar_ocl_dnnl *s) {
  const char *why = vendor_refusal(d);
#ifdef CLPAR_HAVE_DNNL_OCL
  dnnl_status_t st = dnnl_success;
  if (!why &&
      (st = dnnl_ocl_interop_engine_create(&s->engine, d->device, d->context)) != dnnl_success) {
    s->engine = NULL;
    hd_fail("ocl_interop_engine_create", st);
    why = clpar_last_error();
  }
  if (!why && (st = dnnl_ocl_interop_stream_create(&s->stream, s->engine, d->plain_queue)) !=
                  dnnl_success) {
    s->stream = NULL;
    hd_fail("ocl_interop_stream_create", st);
    why = clpar_last_error();
  }
#else
  if (!why) why = "oneDNN was not found built with its OpenCL GPU runtime when clpar was built";
#endif
  s->ready = !why;
  if (why) snprintf(s->why, sizeof s->why, "%s", why);
}

/* d's state, made at the first call; NULL when out of memory. *fresh: made by this call, to
 * be logged (log_state) once the lock is let go. Lock held. */
static clpar_ocl_dnnl *state(clpar_ocl_device *d, int *fresh) {
  *fresh = 0;
  if (!d->dnnl && (d->dnnl = calloc(1, sizeof *d->dnnl)) != NULL) {
    make_engine(d, d->dnnl);
    *fresh = 1;
  }
  return d->dnnl;
}

/* Once per device, outside the lock (the log callback may call clpar). */
static void log_state(clpar_ocl_device *d, const clpar_ocl_dnnl *s) {
  if (!s->ready)
    clpar_log(CLPAR_LOG_INFO, "opencl: %s: CLPAR_OCL_DNNL=1 refused, clpar's kernels kept: %s",
              d->dev_name, s->why);
  else
    clpar_log(CLPAR_LOG_INFO, "opencl: %s: convolutions through oneDNN", d->dev_name);
}

const char *clpar_ocl_dnnl_why(clpar_ocl_device *d) {
  int fresh;
  pthread_mutex_lock(&d->lock);
  clpar_ocl_dnnl *s = state(d, &fresh);
  pthread_mutex_unlock(&d->lock);
  if (s && fresh) log_state(d, s);
  return !s ? "out of host memory" : s->ready ? NULL : s->why;
}

uint64_t clpar_ocl_dnnl_runs(clpar_ocl_device *d) {
  pthread_mutex_lock(&d->lock);
  uint64_t n = d->dnnl ? d->dnnl->runs : 0;
  pthread_mutex_unlock(&d->lock);
  return n;
}

#ifdef CLPAR_HAVE_DNNL_OCL
#define MAX_SUBS 16

/* One call's memory: the device, and the sub-buffers made for it (released at its end). */
typedef struct {
  hd_io io;
  clpar_ocl_device *d;
  cl_mem subs[MAX_SUBS];
  int n_subs;
} call_io;

/* What a handle is: a tensor's buffer and its offset in floats. */
typedef struct {
  cl_mem buf;
  size_t off;
} view;

/* The buffer v's tensor starts in: v's own at offset 0, else a sub-buffer of md's size. */
static clpar_status view_mem(call_io *c, const view *v, size_t bytes, cl_mem *out) {
  if (v->off == 0) return *out = v->buf, CLPAR_OK;
  cl_uint align_bits = 0;
  clGetDeviceInfo(c->d->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits,
                  NULL);
  size_t origin = v->off * sizeof(float), align = align_bits / 8;
  if (!align || origin % align || c->n_subs >= MAX_SUBS)
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "opencl oneDNN: a tensor at byte %zu, not a sub-buffer origin", origin);
  cl_buffer_region r = {origin, bytes};
  cl_int err;
  cl_mem sub = clCreateSubBuffer(v->buf, 0, CL_BUFFER_CREATE_TYPE_REGION, &r, &err);
  if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clCreateSubBuffer", "oneDNN view");
  c->subs[c->n_subs++] = sub;
  *out = sub;
  return CLPAR_OK;
}

static clpar_status user_memory(hd_io *io, const dnnl_memory_desc_t *md, void *handle,
                                dnnl_memory_t *m) {
  call_io *c = io->ctx;
  cl_mem mem = NULL;
  clpar_status st = view_mem(c, handle, dnnl_memory_desc_get_size(md), &mem);
  if (st != CLPAR_OK) return st;
  HD_TRY("ocl_interop_memory_create",
         dnnl_ocl_interop_memory_create(m, md, io->engine, dnnl_ocl_interop_buffer, mem));
  return CLPAR_OK;
}

static clpar_status work_memory(hd_io *io, int i, const dnnl_memory_desc_t *md, dnnl_memory_t *m) {
  call_io *c = io->ctx;
  clpar_ocl_dnnl *s = c->d->dnnl;
  clpar_status st =
      clpar_ocl_grow(c->d, &s->work[i], &s->work_bytes[i], dnnl_memory_desc_get_size(md));
  if (st != CLPAR_OK) return st;
  HD_TRY("ocl_interop_memory_create (work)",
         dnnl_ocl_interop_memory_create(m, md, io->engine, dnnl_ocl_interop_buffer, s->work[i]));
  return CLPAR_OK;
}

static clpar_status zero(hd_io *io, void *handle, size_t bytes) {
  call_io *c = io->ctx;
  const view *v = handle;
  float z = 0.0f;
  cl_int err = clEnqueueFillBuffer(c->d->queue, v->buf, &z, sizeof z, v->off * sizeof(float), bytes,
                                   0, NULL, NULL);
  return err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clEnqueueFillBuffer", "oneDNN dx");
}

static void call_begin(call_io *c, clpar_ocl_device *d, clpar_ocl_dnnl *s) {
  memset(c, 0, sizeof *c);
  c->d = d;
  c->io.engine = s->engine;
  c->io.stream = s->stream;
  c->io.cache = &s->cache;
  c->io.ctx = c;
  c->io.user = user_memory;
  c->io.work = work_memory;
  c->io.zero = zero;
}

/* Released while oneDNN's kernels may still be queued: OpenCL keeps a buffer until the
 * commands using it are done. */
static void call_end(call_io *c) {
  for (int i = 0; i < c->n_subs; i++) clReleaseMemObject(c->subs[i]);
}
#endif

/* d's state when this call goes to oneDNN (lock held), else NULL: the switch off, the device
 * refused, or a profile or a graph being recorded (oneDNN's commands would be missing from
 * either). A bad switch value in *st. */
static clpar_ocl_dnnl *take(clpar_ocl_device *d, clpar_status *st) {
  int on, fresh;
  *st = clpar_ocl_dnnl_setting(&on);
  if (*st != CLPAR_OK || !on) return NULL;
  pthread_mutex_lock(&d->lock);
  clpar_ocl_dnnl *s = state(d, &fresh);
  if (s && fresh) { /* logged outside the lock; the state stays until the device's destroy */
    pthread_mutex_unlock(&d->lock);
    log_state(d, s);
    pthread_mutex_lock(&d->lock);
  }
  if (s && s->ready && !d->recording && !__atomic_load_n(&d->profiling, __ATOMIC_RELAXED)) return s;
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

#ifdef CLPAR_HAVE_DNNL_OCL
/* After a call to oneDNN (lock held, let go here): counted, or the reason logged and clpar's
 * kernels take it. */
static void finish(clpar_ocl_device *d, clpar_status st, int *done) {
  d->dnnl->runs += st == CLPAR_OK;
  pthread_mutex_unlock(&d->lock);
  if (st != CLPAR_OK)
    clpar_log(CLPAR_LOG_WARN, "opencl: %s: oneDNN: %s; this convolution takes clpar's kernels",
              d->dev_name, clpar_last_error());
  *done = st == CLPAR_OK;
}
#endif

clpar_status clpar_ocl_dnnl_conv2d(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                   clpar_bref w, clpar_bref b, clpar_bref y, int *done) {
  clpar_status st;
  *done = 0;
  clpar_ocl_dnnl *o = take(d, &st);
  if (!o) return st;
#ifdef CLPAR_HAVE_DNNL_OCL
  call_io c;
  call_begin(&c, d, o);
  view vx = {AS_MEM(x.buf), x.off}, vw = {AS_MEM(w.buf), w.off}, vb = {AS_MEM(b.buf), b.off},
       vy = {AS_MEM(y.buf), y.off};
  clpar_status ran = hd_conv_forward(&c.io, s, &vx, &vw, b.buf ? &vb : NULL, &vy);
  call_end(&c);
  finish(d, ran, done);
#else
  (void)s, (void)x, (void)w, (void)b, (void)y;
  pthread_mutex_unlock(&d->lock); /* not reached: no device is ready without oneDNN */
#endif
  return CLPAR_OK;
}

clpar_status clpar_ocl_dnnl_conv2d_backward(clpar_ocl_device *d, const clpar_conv2d_shape *s,
                                            clpar_bref x, clpar_bref w, clpar_bref gy,
                                            clpar_bref dx, clpar_bref dw, clpar_bref db,
                                            int *done) {
  clpar_status st;
  *done = 0;
  clpar_ocl_dnnl *o = take(d, &st);
  if (!o) return st;
#ifdef CLPAR_HAVE_DNNL_OCL
  call_io c;
  call_begin(&c, d, o);
  view vx = {AS_MEM(x.buf), x.off}, vw = {AS_MEM(w.buf), w.off}, vg = {AS_MEM(gy.buf), gy.off},
       vdx = {AS_MEM(dx.buf), dx.off}, vdw = {AS_MEM(dw.buf), dw.off},
       vdb = {AS_MEM(db.buf), db.off};
  clpar_status ran = hd_conv_backward(&c.io, s, &vx, &vw, &vg, dx.buf ? &vdx : NULL,
                                      dw.buf ? &vdw : NULL, db.buf ? &vdb : NULL);
  call_end(&c);
  finish(d, ran, done);
#else
  (void)s, (void)x, (void)w, (void)gy, (void)dx, (void)dw, (void)db;
  pthread_mutex_unlock(&d->lock); /* not reached: no device is ready without oneDNN */
#endif
  return CLPAR_OK;
}
