/* ocl_backend.c — the OpenCL backend: finds every device of every platform and implements
 * clpar_backend_iface on it with the kernels of kernels/opencl/ and CLBlast's SGEMM.
 *
 * Each device gets its own context and one in-order queue: PoCL runs two devices in
 * parallel only when they live in separate contexts, and an in-order queue gives every op
 * its ordering for free, so ops enqueue and return. With CLPAR_OPENCL_CONTEXT=platform the
 * devices of a platform share one context instead (each keeps its own queue) and copy
 * between each other's buffers directly (ocl_peer_access, ocl_copy_peer). Buffers are cl_mem
 * handles; offsets are kernel arguments (sub-buffers have alignment rules an arbitrary row offset
 * breaks). */
#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"
#include "ocl_tune.h"

/* CLBlast compiles its kernels on the first call on a device, and that compilation races
 * when it runs for two devices at once: the first GEMM of each device runs alone. */
pthread_mutex_t clpar_ocl_gemm_warmup_lock = PTHREAD_MUTEX_INITIALIZER;
/* Devices alive; CLBlast's caches (which keep contexts alive) are cleared with the last. */
static atomic_int live_devices;

/* Work-group sizes: small enough for any device, large enough that a CPU device does not
 * spend its time scheduling groups. */
#define WG_1D 256
#define WG_2D 64
/* sum_rows sums up to this many rows in one pass; longer matrices are cut into chunks of at
 * least SUM_ROWS_CHUNK rows (a work-group's tile then stays in a CPU's cache, and narrow
 * matrices get parallelism) and at most SUM_ROWS_MAX_CHUNKS chunks, whose partial sums a
 * second pass adds. Measured on PoCL: 4M x 1 went from 11 ms (one work-item per column) to
 * 1.2 ms, 1024 x 4096 from 12 ms to 2.4 ms. */
#define SUM_ROWS_ONE_PASS 256
#define SUM_ROWS_CHUNK 64
#define SUM_ROWS_MAX_CHUNKS 1024

#define AS_MEM(buf) ((cl_mem)(buf))

static clpar_status cl_fail(cl_int err, const char *call, const char *what) {
  if (what)
    return clpar_set_error(clpar_ocl_status(err), "%s(%s): %s", call, what,
                           clpar_ocl_error_name(err));
  return clpar_set_error(clpar_ocl_status(err), "%s: %s", call, clpar_ocl_error_name(err));
}

static size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

/* ---- kernel launches ---- */

/* karg and KARG are in ocl_internal.h (ocl_conv.c launches kernels too). */

/* Where the next enqueue should put its event: NULL unless profiling is on. */
static cl_event *profile_slot(clpar_ocl_device *d, cl_event *ev) {
  *ev = NULL;
  return __atomic_load_n(&d->profiling, __ATOMIC_RELAXED) ? ev : NULL;
}

/* Keeps a recorded span for the profile (dropped when out of memory). */
static void profile_keep_span(clpar_ocl_device *d, cl_event after, cl_event last) {
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
static void profile_keep(clpar_ocl_device *d, cl_event ev) {
  if (ev) profile_keep_span(d, NULL, ev);
}

/* Sets the arguments and enqueues; the caller holds d->lock. */
static clpar_status launch_locked(clpar_ocl_device *d, const char *file, const char *name,
                                  const karg *args, int nargs, cl_uint dims, const size_t *global,
                                  const size_t *local) {
  cl_kernel k;
  clpar_status s = clpar_ocl_kernel_get(d, file, name, &k);
  if (s != CLPAR_OK) return s;
  for (int i = 0; i < nargs; i++) {
    cl_int err = clSetKernelArg(k, (cl_uint)i, args[i].size, args[i].value);
    if (err != CL_SUCCESS) return cl_fail(err, "clSetKernelArg", name);
  }
  cl_event ev;
  cl_int err =
      clEnqueueNDRangeKernel(d->queue, k, dims, NULL, global, local, 0, NULL, profile_slot(d, &ev));
  if (err != CL_SUCCESS) return cl_fail(err, "clEnqueueNDRangeKernel", name);
  profile_keep(d, ev);
  return CLPAR_OK;
}

static clpar_status launch(clpar_ocl_device *d, const char *file, const char *name,
                           const karg *args, int nargs, cl_uint dims, const size_t *global,
                           const size_t *local) {
  pthread_mutex_lock(&d->lock);
  clpar_status s = launch_locked(d, file, name, args, nargs, dims, global, local);
  pthread_mutex_unlock(&d->lock);
  return s;
}

/* One work-item per element, n of them (the kernels check i < n). */
static clpar_status launch_1d(clpar_ocl_device *d, const char *file, const char *name,
                              const karg *args, int nargs, size_t n) {
  size_t local = d->max_wg_size < WG_1D ? d->max_wg_size : WG_1D;
  size_t global = round_up(n, local);
  return launch(d, file, name, args, nargs, 1, &global, &local);
}

clpar_status clpar_ocl_launch(clpar_ocl_device *d, const char *file, const char *name,
                              const karg *args, int nargs, cl_uint dims, const size_t *global,
                              const size_t *local) {
  return launch(d, file, name, args, nargs, dims, global, local);
}

clpar_status clpar_ocl_launch_1d(clpar_ocl_device *d, const char *file, const char *name,
                                 const karg *args, int nargs, size_t n) {
  return launch_1d(d, file, name, args, nargs, n);
}

/* (cols, rows) work-items in groups of WG_2D, shaped to waste little on narrow matrices. */
static void shape_2d(clpar_ocl_device *d, size_t cols, size_t rows, size_t global[2],
                     size_t local[2]) {
  size_t wg = d->max_wg_size < WG_2D ? d->max_wg_size : WG_2D;
  size_t l0 = 1;
  while (l0 < cols && l0 < wg) l0 *= 2;
  local[0] = l0;
  local[1] = wg / l0 ? wg / l0 : 1;
  if (local[1] > rows) local[1] = 1;
  global[0] = round_up(cols, local[0]);
  global[1] = round_up(rows, local[1]);
}

/* ---- memory ---- */

/* A driver may allocate a buffer's memory only when a command first uses it; an allocation
 * failure then surfaces there, and PoCL 3.1 (CPU devices) does not report it at all: it
 * aborts the process (pocl_util.c, pocl_create_migration_commands: Assertion
 * `p->mem_ptr != NULL'). On a CPU device, CL_MEM_ALLOC_HOST_PTR makes PoCL allocate the host
 * memory that is the device's memory in clCreateBuffer, which then reports a failure
 * (CL_OUT_OF_HOST_MEMORY: CLPAR_ERROR_OUT_OF_MEMORY). Measured under ulimit -v: the same
 * buffers fit either way (no second copy). On other devices the flag would mean host memory:
 * there a failure on first use is an error of the op (CL_MEM_OBJECT_ALLOCATION_FAILURE or
 * CL_OUT_OF_RESOURCES, also CLPAR_ERROR_OUT_OF_MEMORY), returned by the next call. */
static clpar_status ocl_alloc(void *dev, size_t bytes, void **buf) {
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
  if (err != CL_SUCCESS) {
    clpar_status s = clpar_ocl_status(err);
    return clpar_set_error(s, "clCreateBuffer(%zu bytes): %s", bytes, clpar_ocl_error_name(err));
  }
  *buf = m;
  return CLPAR_OK;
}

static clpar_status ocl_release(void *dev, void *buf) {
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
static clpar_status ocl_host_alloc(void *dev, size_t bytes, void **handle, void **ptr) {
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
    return cl_fail(err, "clCreateBuffer/clEnqueueMapBuffer", "pinned staging");
  }
  *handle = p;
  *ptr = p->ptr;
  return CLPAR_OK;
}

static clpar_status ocl_host_free(void *dev, void *handle) {
  clpar_ocl_device *d = dev;
  pinned *p = handle;
  clEnqueueUnmapMemObject(d->queue, p->mem, p->ptr, 0, NULL, NULL);
  clReleaseMemObject(p->mem); /* freed by the driver once the unmap is done */
  free(p);
  return CLPAR_OK;
}

static clpar_status ocl_event_record(void *dev, void **ev) {
  clpar_ocl_device *d = dev;
  cl_event e;
  cl_int err = clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &e);
  if (err != CL_SUCCESS) return cl_fail(err, "clEnqueueMarkerWithWaitList", NULL);
  clFlush(d->queue); /* the marker must reach the device without a later wait */
  *ev = e;
  return CLPAR_OK;
}

static clpar_status ocl_event_query(void *dev, void *ev, int *done) {
  (void)dev;
  cl_int status;
  cl_int err =
      clGetEventInfo((cl_event)ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  if (err != CL_SUCCESS) return cl_fail(err, "clGetEventInfo", NULL);
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

static clpar_status ocl_event_then(void *dev, void *ev, clpar_event_fn fn, void *user) {
  (void)dev;
  then_ctx *t = malloc(sizeof *t);
  if (!t)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl event_then: out of host memory");
  t->fn = fn;
  t->user = user;
  cl_int err = clSetEventCallback((cl_event)ev, CL_COMPLETE, event_done, t);
  if (err != CL_SUCCESS) {
    free(t);
    return cl_fail(err, "clSetEventCallback", NULL);
  }
  return CLPAR_OK;
}

static clpar_status ocl_event_free(void *dev, void *ev) {
  (void)dev;
  clReleaseEvent((cl_event)ev);
  return CLPAR_OK;
}

#define ocl_supports_op NULL
/* Convolutions run as im2col and GEMMs in the core. */
#define ocl_conv2d NULL
#define ocl_conv2d_backward NULL
/* No OpenCL all-reduce library exists: DistributedDataParallel reduces OpenCL devices'
 * gradients in host memory over MPI. */
#define ocl_comm_id NULL
#define ocl_comm_init NULL
#define ocl_comm_query NULL
#define ocl_comm_abort NULL
#define ocl_comm_free NULL
#define ocl_comm_allreduce NULL

/* ---- peer copies (devices sharing one context: CLPAR_OPENCL_CONTEXT=platform) ---- */

/* A buffer of one context can be used by any queue of that context: devices that share it
 * copy between each other's buffers with clEnqueueCopyBuffer. Devices of separate contexts
 * (the default) cannot, and copy through host staging (src/transfer.c). */
static clpar_status ocl_peer_access(void *dev, void *peer, int *yes) {
  const clpar_ocl_device *d = dev, *p = peer;
  *yes = d != p && d->context == p->context;
  return CLPAR_OK;
}

/* Runs on this (the source) device's queue. The core has made this queue wait for the
 * destination's earlier work (so nothing of it still uses dst) and makes the destination's
 * queue wait for this copy's completion before it enqueues anything after it: every use of a
 * buffer by a second queue of the context comes after the first queue's commands on it
 * completed, as the OpenCL memory model asks of objects shared between queues. */
static clpar_status ocl_copy_peer(void *dev, void *peer, void *dst, size_t dst_off_bytes,
                                  const void *src, size_t src_off_bytes, size_t bytes) {
  clpar_ocl_device *d = dev;
  (void)peer;
  pthread_mutex_lock(&d->lock);
  cl_event ev;
  cl_int err = clEnqueueCopyBuffer(d->queue, AS_MEM((void *)src), AS_MEM(dst), src_off_bytes,
                                   dst_off_bytes, bytes, 0, NULL, profile_slot(d, &ev));
  if (err == CL_SUCCESS) profile_keep(d, ev);
  pthread_mutex_unlock(&d->lock);
  return err == CL_SUCCESS ? CLPAR_OK : cl_fail(err, "clEnqueueCopyBuffer", "peer copy");
}

/* src stays valid until a later event completes (the core's promise): nothing is copied and
 * nothing waits. */
static clpar_status ocl_write_locked(void *dev, void *buf, size_t off_bytes, const void *src,
                                     size_t bytes) {
  clpar_ocl_device *d = dev;
  cl_int err =
      clEnqueueWriteBuffer(d->queue, AS_MEM(buf), CL_FALSE, off_bytes, bytes, src, 0, NULL, NULL);
  return err == CL_SUCCESS ? CLPAR_OK : cl_fail(err, "clEnqueueWriteBuffer", NULL);
}

static clpar_status ocl_write(void *dev, void *buf, size_t off_bytes, const void *src,
                              size_t bytes) {
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
  return err == CL_SUCCESS ? CLPAR_OK : cl_fail(err, "clEnqueueReadBuffer", NULL);
}

static clpar_status ocl_read(void *dev, const void *buf, size_t off_bytes, void *dst,
                             size_t bytes) {
  clpar_ocl_device *d_ = dev;
  pthread_mutex_lock(&d_->lock);
  clpar_status s_ = ocl_read_locked(dev, buf, off_bytes, dst, bytes);
  pthread_mutex_unlock(&d_->lock);
  return s_;
}

/* OpenCL refuses overlapping copies within one buffer: those go through a temporary. */
static clpar_status copy_overlapping(clpar_ocl_device *d, cl_mem m, size_t dst_off, size_t src_off,
                                     size_t bytes) {
  cl_int err;
  cl_mem tmp = clCreateBuffer(d->context, d->buffer_flags, bytes, NULL, &err); /* see ocl_alloc */
  if (err != CL_SUCCESS) return cl_fail(err, "clCreateBuffer", "copy");
  err = clEnqueueCopyBuffer(d->queue, m, tmp, src_off, 0, bytes, 0, NULL, NULL);
  if (err == CL_SUCCESS)
    err = clEnqueueCopyBuffer(d->queue, tmp, m, 0, dst_off, bytes, 0, NULL, NULL);
  clReleaseMemObject(tmp); /* freed by the driver once the copies are done */
  return err == CL_SUCCESS ? CLPAR_OK : cl_fail(err, "clEnqueueCopyBuffer", NULL);
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
                                   dst_off_bytes, bytes, 0, NULL, profile_slot(d, &ev));
  if (err == CL_SUCCESS) profile_keep(d, ev);
  return err == CL_SUCCESS ? CLPAR_OK : cl_fail(err, "clEnqueueCopyBuffer", NULL);
}

static clpar_status ocl_copy(void *dev, void *dst, size_t dst_off_bytes, const void *src,
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
  return err == CL_SUCCESS ? CLPAR_OK : cl_fail(err, "clFinish", NULL);
}

static clpar_status ocl_finish(void *dev) {
  clpar_ocl_device *d_ = dev;
  pthread_mutex_lock(&d_->lock);
  clpar_status s_ = ocl_finish_locked(dev);
  pthread_mutex_unlock(&d_->lock);
  return s_;
}

/* ---- ops ---- */

static clpar_status ocl_fill(void *dev, clpar_bref out, size_t n, float value) {
  cl_mem m = AS_MEM(out.buf);
  cl_ulong off = out.off, count = n;
  karg args[] = {KARG(m), KARG(off), KARG(count), KARG(value)};
  return launch_1d(dev, "fill.cl", "fill_f32", args, 4, n);
}

static clpar_status ocl_binary(void *dev, clpar_binary_kind kind, size_t rows, size_t cols,
                               clpar_bref a, clpar_bref b, size_t b_rows, clpar_bref out) {
  static const char *full[] = {"binary_add", "binary_sub", "binary_mul", "binary_div"};
  static const char *row[] = {"binary_add_row", "binary_sub_row", "binary_mul_row",
                              "binary_div_row"};
  if ((int)kind < 0 || kind > CLPAR_BINARY_DIV)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl binary: kind %d", (int)kind);
  cl_mem am = AS_MEM(a.buf), bm = AS_MEM(b.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, boff = b.off, ooff = out.off, r = rows, c = cols, n = rows * cols;
  if (b_rows == rows) { /* also when rows == 1: the plain kernel is cheaper */
    karg args[] = {KARG(am), KARG(aoff), KARG(bm), KARG(boff), KARG(om), KARG(ooff), KARG(n)};
    return launch_1d(dev, "elementwise.cl", full[kind], args, 7, rows * cols);
  }
  size_t global[2], local[2];
  shape_2d(dev, cols, rows, global, local);
  karg args[] = {KARG(am), KARG(aoff), KARG(bm), KARG(boff),
                 KARG(om), KARG(ooff), KARG(r),  KARG(c)};
  return launch(dev, "elementwise.cl", row[kind], args, 8, 2, global, local);
}

static clpar_status ocl_scale(void *dev, size_t n, float alpha, clpar_bref a, clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, count = n;
  karg args[] = {KARG(am), KARG(aoff), KARG(om), KARG(ooff), KARG(count), KARG(alpha)};
  return launch_1d(dev, "elementwise.cl", "scale_f32", args, 6, n);
}

/* One pass of sum_rows_f32: chunks of `chunk` rows, one partial row per chunk; d->lock held. */
static clpar_status sum_pass(clpar_ocl_device *d, cl_mem a, cl_ulong a_off, size_t rows,
                             size_t cols, size_t chunk, cl_mem out, cl_ulong out_off) {
  size_t nchunks = (rows + chunk - 1) / chunk, global[2], local[2];
  cl_ulong r = rows, c = cols, ch = chunk;
  shape_2d(d, cols, 1, global, local);
  global[1] = nchunks;
  karg args[] = {KARG(a), KARG(a_off), KARG(r), KARG(c), KARG(ch), KARG(out), KARG(out_off)};
  return launch_locked(d, "reduce.cl", "sum_rows_f32", args, 7, 2, global, local);
}

/* The scratch buffer for partial sums; an old one in use by queued work stays alive until
 * that work is done (OpenCL reference counting). d->lock held. */
static clpar_status ensure_scratch(clpar_ocl_device *d, size_t bytes) {
  if (d->scratch_bytes >= bytes) return CLPAR_OK;
  cl_int err;
  cl_mem m = clCreateBuffer(d->context, d->buffer_flags, bytes, NULL, &err); /* see ocl_alloc */
  if (err != CL_SUCCESS) return cl_fail(err, "clCreateBuffer", "sum_rows scratch");
  if (d->scratch) clReleaseMemObject(d->scratch);
  d->scratch = m;
  d->scratch_bytes = bytes;
  return CLPAR_OK;
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

static clpar_status ocl_sum_rows(void *dev, size_t rows, size_t cols, clpar_bref a,
                                 clpar_bref out) {
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

/* CLBlast honours beta == 0 as BLAS does: its kernels never read C then, so NaN in C does not
 * leak (checked for the direct and the indirect kernels, and by test_opencl_program). */
static clpar_status ocl_gemm_locked(void *dev, int trans_a, int trans_b, size_t m, size_t n,
                                    size_t k, float alpha, clpar_bref a, size_t lda, clpar_bref b,
                                    size_t ldb, float beta, clpar_bref c, size_t ldc) {
  clpar_ocl_device *d = dev;
  cl_event ev, marker = NULL;
  /* CLBlast's event is its last kernel's: time the GEMM from a marker just before it. */
  if (profile_slot(d, &ev) && clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &marker) != CL_SUCCESS)
    marker = NULL;
  int warm = atomic_load(&d->gemm_warm);
  if (!warm) pthread_mutex_lock(&clpar_ocl_gemm_warmup_lock);
  CLBlastStatusCode st = CLBlastSgemm(
      CLBlastLayoutRowMajor, trans_a ? CLBlastTransposeYes : CLBlastTransposeNo,
      trans_b ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, alpha, AS_MEM(a.buf), a.off, lda,
      AS_MEM(b.buf), b.off, ldb, beta, AS_MEM(c.buf), c.off, ldc, &d->queue, profile_slot(d, &ev));
  if (st == CLBlastSuccess && ev)
    profile_keep_span(d, marker, ev);
  else if (marker)
    clReleaseEvent(marker);
  if (!warm) {
    if (st == CLBlastSuccess) atomic_store(&d->gemm_warm, 1);
    pthread_mutex_unlock(&clpar_ocl_gemm_warmup_lock);
  }
  if (st == CLBlastSuccess) return CLPAR_OK;
  return clpar_set_error(clpar_ocl_status(st), "CLBlastSgemm(%zux%zux%zu): %s", m, n, k,
                         clpar_ocl_clblast_status_name(st));
}

/* A GEMM of at most this many multiply-adds runs gemm_small.cl on a CPU device (when its
 * shape suits: n a multiple of 8 where B is not transposed, k where it is and A is not).
 * Measured on PoCL 5.0 (basic device, one Xeon core), CLBlast 1.5.3 with its own parameters
 * against gemm_small, nn / nt / tn: 32 x 64 x 64 62 / 56 / 63 us against 23 / 25 / 23;
 * 64 x 128 x 128 294 / 261 / 264 against 267 / 168 / 212; 128 x 128 x 128 556 / 662 / 533
 * against 382 / 310 / 505. CLBlast pads a 16-row product to its tile (66 us against 90-106
 * for 32 rows), gemm_small does not (9 us against 15). Above the threshold a tuned CLBlast
 * (clpar_device_tune_gemm) is the better choice. */
#define SMALL_GEMM_MACS ((size_t)1 << 20)
/* With B transposed and A not (nt: a Linear's forward, a convolution's weight gradient),
 * gemm_small's dot products (A's row and B's row both read along k) beat CLBlast on CPU
 * devices at any size while B stays within this many floats (16 MiB). Measured on PoCL, best
 * of 5: one basic device, against CLBlast's own parameters, 2.3-7x on 14 shapes (m 15 to 2048,
 * n 256 to 4608, k 16 to 2304; 1024^3 21.8 against 9.5 GFLOP/s, 256 x 2304 x 64 34 against
 * 4.9); the pthread device (2 cores) 1.7-4x untuned, and 0.85-2.8x against a clpar-tune entry.
 * With B of 64 MiB (32 x 4096 x 4096) it lost (9.7 against 14.4 tuned). The other transposes
 * keep the size rule: there the kernel lost to CLBlast on large shapes (tn with k >= 120, nn
 * with n >= 1024). DESIGN.md, "Fused Linear, gradients into their slots, small GEMMs";
 * `bench_gemm 0 512x4608x16:nt` shows it against CLBlast. */
#define SMALL_NT_B_FLOATS ((size_t)1 << 22)

static clpar_status gemm_small(clpar_ocl_device *d, int trans_a, int trans_b, size_t m, size_t n,
                               size_t k, float alpha, clpar_bref a, size_t lda, clpar_bref b,
                               size_t ldb, float beta, clpar_bref c, size_t ldc) {
  cl_mem am = AS_MEM(a.buf), bm = AS_MEM(b.buf), cm = AS_MEM(c.buf);
  cl_ulong m_ = m, n_ = n, k_ = k, aoff = a.off, boff = b.off, coff = c.off, la = lda, lb = ldb,
           lc = ldc;
  size_t global[2], local[2];
  shape_2d(d, trans_b ? n : n / 8, m, global, local);
  karg args[] = {KARG(m_), KARG(n_),   KARG(k_), KARG(alpha), KARG(am), KARG(aoff), KARG(la),
                 KARG(bm), KARG(boff), KARG(lb), KARG(beta),  KARG(cm), KARG(coff), KARG(lc)};
  return launch(d, "gemm_small.cl",
                trans_b   ? "gemm_small_nt"
                : trans_a ? "gemm_small_tn"
                          : "gemm_small_nn",
                args, 14, 2, global, local);
}

int clpar_ocl_gemm_takes_small(const clpar_ocl_device *d, int trans_a, int trans_b, size_t m,
                               size_t n, size_t k) {
  int fits = trans_b ? !trans_a && k % 8 == 0 : n % 8 == 0;
  int small = k > 0 && (m * n <= SMALL_GEMM_MACS / k || (trans_b && n <= SMALL_NT_B_FLOATS / k));
  return d->cpu && fits && small;
}

static clpar_status ocl_gemm(void *dev, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                             float alpha, clpar_bref a, size_t lda, clpar_bref b, size_t ldb,
                             float beta, clpar_bref c, size_t ldc) {
  clpar_ocl_device *d_ = dev;
  if (clpar_ocl_gemm_takes_small(d_, trans_a, trans_b, m, n, k))
    return gemm_small(d_, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  pthread_mutex_lock(&d_->lock);
  clpar_status s_ =
      ocl_gemm_locked(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  pthread_mutex_unlock(&d_->lock);
  return s_;
}

static clpar_status ocl_gemm_batched(void *dev, int trans_a, int trans_b, size_t m, size_t n,
                                     size_t k, float alpha, clpar_bref a, size_t lda,
                                     size_t stride_a, clpar_bref b, size_t ldb, size_t stride_b,
                                     float beta, clpar_bref c, size_t ldc, size_t stride_c,
                                     size_t batch) {
  clpar_ocl_device *d = dev;
  if (batch == 1)
    return ocl_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  pthread_mutex_lock(&d->lock);
  cl_event ev, marker = NULL;
  if (profile_slot(d, &ev) && clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &marker) != CL_SUCCESS)
    marker = NULL;
  int warm = atomic_load(&d->gemm_warm);
  if (!warm) pthread_mutex_lock(&clpar_ocl_gemm_warmup_lock);
  CLBlastStatusCode st = CLBlastSgemmStridedBatched(
      CLBlastLayoutRowMajor, trans_a ? CLBlastTransposeYes : CLBlastTransposeNo,
      trans_b ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, alpha, AS_MEM(a.buf), a.off, lda,
      stride_a, AS_MEM(b.buf), b.off, ldb, stride_b, beta, AS_MEM(c.buf), c.off, ldc, stride_c,
      batch, &d->queue, profile_slot(d, &ev));
  if (st == CLBlastSuccess && ev)
    profile_keep_span(d, marker, ev);
  else if (marker)
    clReleaseEvent(marker);
  if (!warm) pthread_mutex_unlock(&clpar_ocl_gemm_warmup_lock);
  pthread_mutex_unlock(&d->lock);
  if (st == CLBlastSuccess) return CLPAR_OK;
  return clpar_set_error(clpar_ocl_status(st), "CLBlastSgemmStridedBatched(%zu x %zux%zux%zu): %s",
                         batch, m, n, k, clpar_ocl_clblast_status_name(st));
}

/* ---- training ops (ABI 2) ---- */

static clpar_status ocl_broadcast_rows(void *dev, size_t rows, size_t cols, clpar_bref a,
                                       clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, r = rows, c = cols;
  size_t global[2], local[2];
  shape_2d(dev, cols, rows, global, local);
  karg args[] = {KARG(am), KARG(aoff), KARG(om), KARG(ooff), KARG(r), KARG(c)};
  return launch(dev, "elementwise.cl", "broadcast_rows_f32", args, 6, 2, global, local);
}

/* Reductions along dimensions (kernels/opencl/reduce_dims.cl). A narrow inner with a long
 * red takes a work-group per output; outer == 1 with a wide inner is sum_rows' shape (its
 * chunked two-pass path); everything else a work-item per output. */
#define REDUCE_NARROW 16 /* inner below this is narrow */
#define REDUCE_LONG 64   /* red from this on is long */

static clpar_status ocl_reduce_sum(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
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
    return launch(d, "reduce_dims.cl", "reduce_sum_group_f32", args, 6, 1, &global, &local);
  }
  size_t global[2], local[2];
  shape_2d(d, inner, outer, global, local);
  karg args[] = {KARG(am), KARG(aoff), KARG(o), KARG(r), KARG(in), KARG(om), KARG(ooff)};
  return launch(d, "reduce_dims.cl", "reduce_sum_items_f32", args, 7, 2, global, local);
}

static clpar_status ocl_expand(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                               clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, r = red, in = inner, n = outer * red * inner;
  karg args[] = {KARG(am), KARG(aoff), KARG(r), KARG(in), KARG(om), KARG(ooff), KARG(n)};
  return launch_1d(dev, "reduce_dims.cl", "expand_f32", args, 7, (size_t)n);
}

static clpar_status ocl_unary(void *dev, clpar_unary_kind kind, size_t n, clpar_bref a,
                              clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, count = n;
  cl_int k = (cl_int)kind;
  karg args[] = {KARG(am), KARG(aoff), KARG(om), KARG(ooff), KARG(count), KARG(k)};
  return launch_1d(dev, "activation.cl", "unary_f32", args, 6, n);
}

static clpar_status ocl_unary_backward(void *dev, clpar_unary_kind kind, size_t n, clpar_bref g,
                                       clpar_bref saved, clpar_bref out) {
  cl_mem gm = AS_MEM(g.buf), sm = AS_MEM(saved.buf), om = AS_MEM(out.buf);
  cl_ulong goff = g.off, soff = saved.off, ooff = out.off, count = n;
  cl_int k = (cl_int)kind;
  karg args[] = {KARG(gm), KARG(goff), KARG(sm),    KARG(soff),
                 KARG(om), KARG(ooff), KARG(count), KARG(k)};
  return launch_1d(dev, "activation.cl", "unary_backward_f32", args, 8, n);
}

/* ---- the fused Linear epilogues ---- */

static clpar_status ocl_bias_act(void *dev, clpar_act_kind act, size_t rows, size_t cols,
                                 clpar_bref a, clpar_bref bias, clpar_bref out) {
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl bias_act: activation %d",
                           (int)act);
  cl_mem am = AS_MEM(a.buf), bm = AS_MEM(bias.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, boff = bias.off, ooff = out.off, r = rows, c = cols;
  cl_int k = (cl_int)act;
  size_t global[2], local[2];
  shape_2d(dev, cols, rows, global, local);
  karg args[] = {KARG(am),   KARG(aoff), KARG(bm), KARG(boff), KARG(om),
                 KARG(ooff), KARG(r),    KARG(c),  KARG(k)};
  return launch(dev, "activation.cl", "bias_act_f32", args, 9, 2, global, local);
}

/* One pass of bias_act_backward_f32 over chunks of `chunk` rows; d->lock held. */
static clpar_status act_pass(clpar_ocl_device *d, clpar_act_kind act, cl_mem g, cl_ulong g_off,
                             cl_mem y, cl_ulong y_off, cl_mem out, cl_ulong out_off, size_t rows,
                             size_t cols, size_t chunk, cl_mem db, cl_ulong db_off,
                             int accumulate) {
  size_t global[2], local[2];
  shape_2d(d, cols, 1, global, local);
  global[1] = (rows + chunk - 1) / chunk;
  cl_int has_out = out != NULL, k = (cl_int)act, acc = accumulate != 0;
  cl_ulong r = rows, c = cols, ch = chunk;
  karg args[] = {KARG(g),       KARG(g_off),   KARG(y),      KARG(y_off), KARG(out),
                 KARG(out_off), KARG(has_out), KARG(r),      KARG(c),     KARG(ch),
                 KARG(k),       KARG(db),      KARG(db_off), KARG(acc)};
  return launch_locked(d, "activation.cl", "bias_act_backward_f32", args, 14, 2, global, local);
}

/* Chunked like ocl_sum_rows: one pass for up to SUM_ROWS_ONE_PASS rows, else partial sums in
 * the scratch buffer and a second pass (act none) that adds them into db. */
static clpar_status ocl_bias_act_backward(void *dev, clpar_act_kind act, size_t rows, size_t cols,
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
  size_t wg = d->max_wg_size < WG_2D ? d->max_wg_size : WG_2D, local = 1;
  while (local * 2 <= wg && local < cols) local *= 2;
  size_t global = rows * local;
  args[nargs - 1].size = local * sizeof(float); /* the __local scratch, value NULL */
  return launch(d, "softmax.cl", name, args, nargs, 1, &global, &local);
}

static clpar_status ocl_softmax(void *dev, int log, size_t rows, size_t cols, clpar_bref a,
                                clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, ooff = out.off, c = cols;
  cl_int take_log = log != 0;
  karg args[] = {KARG(am), KARG(aoff), KARG(om), KARG(ooff), KARG(c), KARG(take_log), {0, NULL}};
  return launch_rows(dev, "softmax_f32", args, 7, rows, cols);
}

static clpar_status ocl_softmax_backward(void *dev, int log, size_t rows, size_t cols, clpar_bref y,
                                         clpar_bref g, clpar_bref out) {
  cl_mem ym = AS_MEM(y.buf), gm = AS_MEM(g.buf), om = AS_MEM(out.buf);
  cl_ulong yoff = y.off, goff = g.off, ooff = out.off, c = cols;
  cl_int take_log = log != 0;
  karg args[] = {KARG(ym),   KARG(yoff), KARG(gm),       KARG(goff), KARG(om),
                 KARG(ooff), KARG(c),    KARG(take_log), {0, NULL}};
  return launch_rows(dev, "softmax_backward_f32", args, 9, rows, cols);
}

static clpar_status ocl_pick(void *dev, int scatter, size_t rows, size_t cols, clpar_bref idx,
                             clpar_bref a, clpar_bref out) {
  cl_mem im = AS_MEM(idx.buf), am = AS_MEM(a.buf), om = AS_MEM(out.buf);
  cl_ulong ioff = idx.off, aoff = a.off, ooff = out.off, r = rows, c = cols;
  karg args[] = {KARG(im), KARG(ioff), KARG(am), KARG(aoff),
                 KARG(om), KARG(ooff), KARG(r),  KARG(c)};
  return launch_1d(dev, "index.cl", scatter ? "pick_scatter_f32" : "pick_gather_f32", args, 8,
                   rows);
}

static clpar_status ocl_nll(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref labels,
                            clpar_bref out) {
  cl_mem am = AS_MEM(a.buf), lm = AS_MEM(labels.buf), om = AS_MEM(out.buf);
  cl_ulong aoff = a.off, loff = labels.off, ooff = out.off, r = rows, c = cols;
  karg args[] = {KARG(am), KARG(aoff), KARG(lm), KARG(loff),
                 KARG(om), KARG(ooff), KARG(r),  KARG(c)};
  return launch_1d(dev, "softmax.cl", "nll_f32", args, 8, rows);
}

static clpar_status ocl_nll_backward(void *dev, size_t rows, size_t cols, clpar_bref labels,
                                     clpar_bref g, clpar_bref out) {
  cl_mem lm = AS_MEM(labels.buf), gm = AS_MEM(g.buf), om = AS_MEM(out.buf);
  cl_ulong loff = labels.off, goff = g.off, ooff = out.off, r = rows, c = cols;
  size_t global[2], local[2];
  shape_2d(dev, cols, rows, global, local);
  karg args[] = {KARG(lm), KARG(loff), KARG(gm), KARG(goff),
                 KARG(om), KARG(ooff), KARG(r),  KARG(c)};
  return launch(dev, "softmax.cl", "nll_backward_f32", args, 8, 2, global, local);
}

static clpar_status ocl_sgd_step(void *dev, size_t n, clpar_bref param, clpar_bref grad,
                                 clpar_bref buf, clpar_sgd_args sgd) {
  const clpar_sgd_args *o = &sgd;
  cl_mem pm = AS_MEM(param.buf), gm = AS_MEM(grad.buf), bm = AS_MEM(buf.buf);
  cl_ulong poff = param.off, goff = grad.off, boff = buf.off, count = n;
  float lr = o->lr, mom = o->momentum, damp = o->dampening, wd = o->weight_decay;
  cl_int nesterov = o->nesterov != 0, first = o->first != 0;
  if (mom == 0.0f) { /* no buffer then: buf may be NULL */
    karg args[] = {KARG(pm), KARG(poff), KARG(gm), KARG(goff), KARG(count), KARG(lr), KARG(wd)};
    return launch_1d(dev, "optim.cl", "sgd_f32", args, 7, n);
  }
  karg args[] = {KARG(pm),   KARG(poff),     KARG(gm),   KARG(goff), KARG(bm),
                 KARG(boff), KARG(count),    KARG(lr),   KARG(mom),  KARG(damp),
                 KARG(wd),   KARG(nesterov), KARG(first)};
  return launch_1d(dev, "optim.cl", "sgd_momentum_f32", args, 13, n);
}

static clpar_status ocl_adam_step(void *dev, size_t n, clpar_bref param, clpar_bref grad,
                                  clpar_bref m, clpar_bref v, clpar_adam_args adam) {
  const clpar_adam_args *o = &adam;
  cl_mem pm = AS_MEM(param.buf), gm = AS_MEM(grad.buf), mm = AS_MEM(m.buf), vm = AS_MEM(v.buf);
  cl_ulong poff = param.off, goff = grad.off, moff = m.off, voff = v.off, count = n;
  float lr = o->lr, b1 = o->beta1, b2 = o->beta2, eps = o->eps, wd = o->weight_decay;
  float step = o->lr / o->bias1, root2 = sqrtf(o->bias2); /* as the host backend rounds them */
  cl_int decoupled = o->decoupled != 0;
  karg args[] = {KARG(pm),  KARG(poff), KARG(gm),    KARG(goff),  KARG(mm),       KARG(moff),
                 KARG(vm),  KARG(voff), KARG(count), KARG(lr),    KARG(b1),       KARG(b2),
                 KARG(eps), KARG(wd),   KARG(step),  KARG(root2), KARG(decoupled)};
  return launch_1d(dev, "optim.cl", "adam_f32", args, 17, n);
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

static clpar_status ocl_profile(void *dev, int enable) {
  clpar_ocl_device *d = dev;
  pthread_mutex_lock(&d->prof_lock);
  if (d->n_spans) clpar_backend_waited(); /* profile_harvest waits for them */
  profile_harvest(d);
  d->prof_seconds = 0;
  d->prof_ops = 0;
  __atomic_store_n(&d->profiling, enable != 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&d->prof_lock);
  return CLPAR_OK;
}

static clpar_status ocl_profile_read(void *dev, double *seconds, uint64_t *ops) {
  clpar_ocl_device *d = dev;
  clpar_status s = ocl_finish(dev);
  pthread_mutex_lock(&d->prof_lock);
  profile_harvest(d);
  *seconds = d->prof_seconds;
  *ops = d->prof_ops;
  pthread_mutex_unlock(&d->prof_lock);
  return s;
}

/* ---- the device ---- */

static clpar_status ocl_destroy(void *dev) {
  clpar_ocl_device *d = dev;
  if (!d) return CLPAR_OK;
  if (d->queue) {
    clFinish(d->queue);
    clpar_backend_waited();
  }
  clpar_ocl_program_cache_clear(d);
  ocl_profile(d, 0);
  free(d->spans);
  pthread_mutex_destroy(&d->prof_lock);
  if (d->scratch) clReleaseMemObject(d->scratch);
  if (d->queue) clReleaseCommandQueue(d->queue);
  if (d->context) clReleaseContext(d->context); /* a shared one: this device's reference */
  pthread_mutex_destroy(&d->lock);
  pthread_mutex_destroy(&d->prog_lock);
  free(d);
  /* CLBlast's program cache holds the contexts; the last device takes it down. */
  if (atomic_fetch_sub(&live_devices, 1) == 1) CLBlastClearCache();
  return CLPAR_OK;
}

#define CLPAR_BE_PREFIX_ ocl
static const clpar_backend_iface ocl_iface = CLPAR_BACKEND_TABLE("opencl");

/* ---- probing ---- */

/* A device string, trailing blanks removed (some drivers pad names). */
static void device_string(cl_device_id dev, cl_device_info what, char *buf, size_t size) {
  buf[0] = '\0';
  if (clGetDeviceInfo(dev, what, size, buf, NULL) != CL_SUCCESS) buf[0] = '\0';
  buf[size - 1] = '\0';
  for (size_t n = strlen(buf); n > 0 && (buf[n - 1] == ' ' || buf[n - 1] == '\n'); n--)
    buf[n - 1] = '\0';
}

static void platform_string(cl_platform_id p, cl_platform_info what, char *buf, size_t size) {
  buf[0] = '\0';
  if (clGetPlatformInfo(p, what, size, buf, NULL) != CL_SUCCESS) buf[0] = '\0';
  buf[size - 1] = '\0';
}

/* Copies src into dst, cut to fit: driver strings may be longer than the public fields. */
static void copy_str(char *dst, size_t size, const char *src) {
  size_t n = strlen(src);
  if (n >= size) n = size - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

static void fill_info(clpar_ocl_device *d, clpar_device_info *info) {
  cl_device_type type = 0;
  cl_ulong mem = 0, max_alloc = 0;
  cl_uint cu = 0;
  clGetDeviceInfo(d->device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
  clGetDeviceInfo(d->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
  clGetDeviceInfo(d->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
  clGetDeviceInfo(d->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
  memset(info, 0, sizeof *info);
  copy_str(info->backend, sizeof info->backend, "opencl");
  copy_str(info->name, sizeof info->name, d->dev_name);
  device_string(d->device, CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
  copy_str(info->platform, sizeof info->platform, d->platform_name);
  copy_str(info->driver_version, sizeof info->driver_version, d->driver_version);
  info->type = (type & CL_DEVICE_TYPE_GPU)           ? CLPAR_DEVICE_GPU
               : (type & CL_DEVICE_TYPE_CPU)         ? CLPAR_DEVICE_CPU
               : (type & CL_DEVICE_TYPE_ACCELERATOR) ? CLPAR_DEVICE_ACCELERATOR
                                                     : CLPAR_DEVICE_OTHER;
  info->global_mem_bytes = mem;
  info->max_alloc_bytes = max_alloc;
  info->compute_units = (int)cu;
  d->max_alloc = max_alloc;
}

/* A device that is switched off or cannot compile kernels (some custom devices) is of no
 * use: every op builds its kernels from source. */
static int usable(cl_device_id device) {
  cl_bool available = CL_FALSE, compiler = CL_FALSE;
  clGetDeviceInfo(device, CL_DEVICE_AVAILABLE, sizeof available, &available, NULL);
  clGetDeviceInfo(device, CL_DEVICE_COMPILER_AVAILABLE, sizeof compiler, &compiler, NULL);
  return available && compiler;
}

/* Opens device in shared (a context of several devices of the platform; the device keeps a
 * reference to it) or, when shared is NULL, in a context of its own. NULL (error set) on
 * failure. */
static clpar_ocl_device *open_device(cl_platform_id platform, cl_device_id device,
                                     cl_context shared) {
  clpar_ocl_device *d = calloc(1, sizeof *d);
  if (!d) {
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: device context");
    return NULL;
  }
  cl_int err = CL_SUCCESS;
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
  d->platform = platform;
  d->device = device;
  if (shared) {
    err = clRetainContext(shared);
    d->context = shared;
    d->shared_context = 1;
  } else {
    d->context = clCreateContext(props, 1, &device, NULL, NULL, &err);
  }
  if (err != CL_SUCCESS) {
    cl_fail(err, shared ? "clRetainContext" : "clCreateContext", NULL);
    free(d);
    return NULL;
  }
  /* Profiling costs nothing until an event is asked for (clpar_device_profile_start). */
  d->queue = clCreateCommandQueue(d->context, device, CL_QUEUE_PROFILING_ENABLE, &err);
  if (err != CL_SUCCESS) d->queue = clCreateCommandQueue(d->context, device, 0, &err);
  if (err != CL_SUCCESS) {
    cl_fail(err, "clCreateCommandQueue", NULL);
    clReleaseContext(d->context);
    free(d);
    return NULL;
  }
  cl_device_type type = 0;
  clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
  d->buffer_flags = CL_MEM_READ_WRITE | ((type & CL_DEVICE_TYPE_CPU) ? CL_MEM_ALLOC_HOST_PTR : 0);
  d->cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
  pthread_mutex_init(&d->lock, NULL);
  pthread_mutex_init(&d->prog_lock, NULL);
  pthread_mutex_init(&d->prof_lock, NULL);
  atomic_init(&d->gemm_warm, 0);
  if (clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof d->max_wg_size, &d->max_wg_size,
                      NULL) != CL_SUCCESS ||
      d->max_wg_size == 0)
    d->max_wg_size = 1;
  device_string(device, CL_DEVICE_NAME, d->dev_name, sizeof d->dev_name);
  device_string(device, CL_DEVICE_VERSION, d->dev_version, sizeof d->dev_version);
  device_string(device, CL_DRIVER_VERSION, d->driver_version, sizeof d->driver_version);
  platform_string(platform, CL_PLATFORM_NAME, d->platform_name, sizeof d->platform_name);
  platform_string(platform, CL_PLATFORM_VERSION, d->platform_version, sizeof d->platform_version);
  clpar_ocl_tune_apply(d); /* a saved GEMM tuning entry (ocl_tune.c); never fails the open */
  atomic_fetch_add(&live_devices, 1);
  return d;
}

/* CLPAR_OPENCL_CONTEXT: "device" (unset or empty too) gives every device a context of its
 * own; "platform" gives the usable devices of each platform one shared context, so that they
 * copy between each other directly (ocl_copy_peer). Anything else is the user's error. */
typedef enum { CONTEXT_PER_DEVICE, CONTEXT_PER_PLATFORM } context_mode;

static clpar_status read_context_mode(context_mode *mode) {
  const char *v = getenv("CLPAR_OPENCL_CONTEXT");
  *mode = CONTEXT_PER_DEVICE;
  if (!v || !*v || strcmp(v, "device") == 0) return CLPAR_OK;
  if (strcmp(v, "platform") == 0) {
    *mode = CONTEXT_PER_PLATFORM;
    return CLPAR_OK;
  }
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "CLPAR_OPENCL_CONTEXT=\"%.64s\": give \"device\" (a context per "
                         "OpenCL device, the default) or \"platform\" (one context per platform)",
                         v);
}

/* One context for the n devices of a platform (n >= 2); NULL, with a warning, when the driver
 * refuses: the devices then get contexts of their own. */
static cl_context shared_context(cl_platform_id platform, const cl_device_id *ids, cl_uint n) {
  cl_int err;
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
  cl_context c = clCreateContext(props, n, ids, NULL, NULL, &err);
  if (err == CL_SUCCESS) return c;
  clpar_log(CLPAR_LOG_WARN,
            "opencl: clCreateContext for %u devices of a platform: %s; CLPAR_OPENCL_CONTEXT="
            "platform ignored there, each device gets a context of its own",
            (unsigned)n, clpar_ocl_error_name(err));
  return NULL;
}

/* Adds the devices of one platform. A device that cannot be opened is skipped with a
 * warning, so one broken driver does not hide the others; running out of memory is fatal. */
static clpar_status probe_platform(cl_platform_id platform, context_mode mode,
                                   clpar_backend_device **devs, int *count) {
  cl_uint n = 0;
  cl_int err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, NULL, &n);
  if (err == CL_DEVICE_NOT_FOUND || n == 0) return CLPAR_OK;
  if (err != CL_SUCCESS) {
    clpar_log(CLPAR_LOG_WARN, "opencl: clGetDeviceIDs: %s; skipping a platform",
              clpar_ocl_error_name(err));
    return CLPAR_OK;
  }
  cl_device_id *ids = malloc(n * sizeof *ids);
  if (!ids) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: probing devices");
  err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, n, ids, NULL);
  if (err != CL_SUCCESS) {
    clpar_log(CLPAR_LOG_WARN, "opencl: clGetDeviceIDs: %s; skipping a platform",
              clpar_ocl_error_name(err));
    free(ids);
    return CLPAR_OK;
  }
  cl_uint nu = 0; /* the usable devices, in order, at the front of ids */
  for (cl_uint i = 0; i < n; i++) {
    if (usable(ids[i]))
      ids[nu++] = ids[i];
    else
      clpar_log(CLPAR_LOG_WARN,
                "opencl: skipping a device: opencl: device unavailable or without a compiler");
  }
  /* The probe's reference to the shared context is dropped below: each device holds one,
   * and the context goes when the last of them is destroyed (ocl_destroy). */
  cl_context shared =
      mode == CONTEXT_PER_PLATFORM && nu >= 2 ? shared_context(platform, ids, nu) : NULL;
  clpar_status s = CLPAR_OK;
  for (cl_uint i = 0; i < nu && s == CLPAR_OK; i++) {
    clpar_ocl_device *d = open_device(platform, ids[i], shared);
    if (!d) {
      clpar_log(CLPAR_LOG_WARN, "opencl: skipping a device: %s", clpar_last_error());
      continue;
    }
    clpar_backend_device *slot = clpar_backend_device_append(devs, count);
    if (!slot) {
      ocl_destroy(d);
      s = CLPAR_ERROR_OUT_OF_MEMORY;
      break;
    }
    slot->iface = &ocl_iface;
    slot->ctx = d;
    fill_info(d, &slot->info);
  }
  if (shared) clReleaseContext(shared);
  free(ids);
  return s;
}

clpar_status clpar_opencl_probe(clpar_backend_device **devs, int *count) {
  context_mode mode;
  clpar_status bad = read_context_mode(&mode);
  if (bad != CLPAR_OK) return bad; /* the user's error: clpar_init fails with it */
  cl_uint n = 0;
  cl_int err = clGetPlatformIDs(0, NULL, &n);
  /* No ICD loader configuration or no platform: a machine without OpenCL, not an error. */
  if (err == -1001 /* CL_PLATFORM_NOT_FOUND_KHR */ || (err == CL_SUCCESS && n == 0))
    return CLPAR_OK;
  if (err != CL_SUCCESS) return cl_fail(err, "clGetPlatformIDs", NULL);
  cl_platform_id *ids = malloc(n * sizeof *ids);
  if (!ids) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: probing platforms");
  err = clGetPlatformIDs(n, ids, NULL);
  clpar_status s = err == CL_SUCCESS ? CLPAR_OK : cl_fail(err, "clGetPlatformIDs", NULL);
  for (cl_uint i = 0; s == CLPAR_OK && i < n; i++) s = probe_platform(ids[i], mode, devs, count);
  free(ids);
  return s;
}
