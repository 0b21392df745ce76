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
#include "ocl_conv_algo.h"
#include "ocl_tune.h"

/* Devices alive; CLBlast's caches (which keep contexts alive) are cleared with the last. */
static atomic_int live_devices;

/* ---- the device ---- */

static clpar_status ocl_destroy(void *dev) {
  clpar_ocl_device *d = dev;
  if (!d) return CLPAR_OK;
  if (d->queue) {
    clFinish(d->queue);
    clpar_backend_waited();
  }
  clpar_ocl_conv_state_free(d);
  clpar_ocl_dnnl_free(d); /* before the queue and the context it was made from */
  clpar_ocl_program_cache_clear(d);
  ocl_profile(d, 0);
  free(d->spans);
  pthread_mutex_destroy(&d->prof_lock);
  clpar_ocl_workspace_free(d); /* and d->scratch */
  if (d->plain_queue) clReleaseCommandQueue(d->plain_queue);
  if (d->prof_queue) clReleaseCommandQueue(d->prof_queue);
  if (d->context) clReleaseContext(d->context); /* a shared one: this device's reference */
  pthread_mutex_destroy(&d->lock);
  pthread_mutex_destroy(&d->prog_lock);
  free(d);
  /* CLBlast's program cache holds the contexts; the last device takes it down. */
  if (atomic_fetch_sub(&live_devices, 1) == 1) CLBlastClearCache();
  return CLPAR_OK;
}

#define ocl_supports_op NULL
/* No 16-bit GEMM: the core widens autocast's operands and calls gemm (CLBlast's SGEMM).
 * CLBlast's HGEMM (16-bit sums) is not gemm_half's float32 accumulation; a device with
 * cl_khr_fp16 could run a mixed-precision kernel here. */
#define ocl_gemm_half NULL
/* No OpenCL all-reduce library exists: DistributedDataParallel reduces OpenCL devices'
 * gradients in host memory over MPI. */
#define ocl_comm_id NULL
#define ocl_comm_init NULL
#define ocl_comm_query NULL
#define ocl_comm_abort NULL
#define ocl_comm_free NULL
#define ocl_comm_allreduce NULL
/* The forward convolution and each backward pass pick im2col + GEMM, an implicit GEMM or
 * Winograd per shape (ocl_conv_algo.c, ocl_conv_bwd.c). */
#define ocl_conv2d clpar_ocl_conv2d
#define ocl_conv2d_backward clpar_ocl_conv2d_backward
/* The convolutions' workspace and d->scratch (ocl_workspace.c). */
#define ocl_workspace_bytes clpar_ocl_workspace_bytes
#define ocl_workspace_trim clpar_ocl_workspace_trim

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
    clpar_ocl_fail(err, shared ? "clRetainContext" : "clCreateContext", NULL);
    free(d);
    return NULL;
  }
  /* Without profiling: a queue with it is made when a profile starts (ocl_profile). */
  d->queue = d->plain_queue = clCreateCommandQueue(d->context, device, 0, &err);
  if (err != CL_SUCCESS) {
    clpar_ocl_fail(err, "clCreateCommandQueue", NULL);
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
  atomic_init(&d->convgemm_warm, 0);
  atomic_init(&d->buffers_created, 0);
  clpar_ocl_workspace_init(d);
  if (clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof d->max_wg_size, &d->max_wg_size,
                      NULL) != CL_SUCCESS ||
      d->max_wg_size == 0)
    d->max_wg_size = 1;
  device_string(device, CL_DEVICE_NAME, d->dev_name, sizeof d->dev_name);
  device_string(device, CL_DEVICE_VERSION, d->dev_version, sizeof d->dev_version);
  device_string(device, CL_DRIVER_VERSION, d->driver_version, sizeof d->driver_version);
  platform_string(platform, CL_PLATFORM_NAME, d->platform_name, sizeof d->platform_name);
  platform_string(platform, CL_PLATFORM_VERSION, d->platform_version, sizeof d->platform_version);
  d->clblast_serial = clpar_ocl_pocl_shares_kernels(d);
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
  if (err != CL_SUCCESS) return clpar_ocl_fail(err, "clGetPlatformIDs", NULL);
  cl_platform_id *ids = malloc(n * sizeof *ids);
  if (!ids) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: probing platforms");
  err = clGetPlatformIDs(n, ids, NULL);
  clpar_status s = err == CL_SUCCESS ? CLPAR_OK : clpar_ocl_fail(err, "clGetPlatformIDs", NULL);
  for (cl_uint i = 0; s == CLPAR_OK && i < n; i++) s = probe_platform(ids[i], mode, devs, count);
  free(ids);
  return s;
}
