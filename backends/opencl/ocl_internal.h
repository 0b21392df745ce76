/* ocl_internal.h — private to the OpenCL backend: the per-device context, the program cache
 * (ocl_program.c) and error names (ocl_errors.c). Tests include it to reach the program cache
 * and its counters; nothing here is exported from the shared library. */
#ifndef CLPAR_OCL_INTERNAL_H
#define CLPAR_OCL_INTERNAL_H

#include <CL/cl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Same layout as the file cmake/embed_run.cmake generates. */
typedef struct {
  const char *name;
  const char *source;
  size_t size;
} clpar_embedded_source;

/* Terminated by a {NULL, NULL, 0} entry. */
extern const clpar_embedded_source clpar_opencl_sources[];
extern const int clpar_opencl_sources_count;

typedef struct clpar_ocl_program clpar_ocl_program; /* one cached program (ocl_program.c) */

/* A span of device time: from the end of `after` (a marker enqueued just before, for GEMMs
 * that CLBlast runs as several kernels but reports with the last one's event) or from the
 * start of `last`, to the end of `last`. */
typedef struct clpar_ocl_span {
  cl_event after; /* may be NULL */
  cl_event last;
} clpar_ocl_span;

/* One OpenCL device. Each device has its own in-order queue and, by default, its own context:
 * PoCL only runs two devices at once when they live in separate contexts (DESIGN.md). With
 * CLPAR_OPENCL_CONTEXT=platform the devices of a platform share one context (each device
 * holds a reference to it) and copy between each other directly. */
typedef struct clpar_ocl_device {
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  int shared_context; /* context is shared with the platform's other devices */
  cl_command_queue queue;
  /* Held around every command on the queue (kernel arguments are shared state, and PoCL's
   * basic devices deadlocked when two threads drove one queue at once: DataParallel). */
  pthread_mutex_t lock;
  /* Guards the program cache below; taken after lock when both are needed. */
  pthread_mutex_t prog_lock;
  clpar_ocl_program *programs;
  atomic_int gemm_warm; /* CLBlast has compiled its GEMM kernels for this device */
  cl_ulong max_alloc;   /* CL_DEVICE_MAX_MEM_ALLOC_SIZE, enforced by ocl_alloc */
  size_t max_wg_size;
  cl_mem_flags buffer_flags; /* tensors' buffers: see ocl_alloc */
  /* a CPU device: small GEMMs take gemm_small.cl (ocl_gemm) */
  int cpu;
  cl_mem scratch; /* partial sums of sum_rows, grown on demand; guarded by lock */
  /* Profiling (clpar_device_profile_*): while on, every kernel and copy keeps its event, and
   * reading the profile sums their device times. Guarded by prof_lock. */
  pthread_mutex_t prof_lock;
  int profiling;
  struct clpar_ocl_span *spans; /* one per command (or per GEMM) recorded */
  size_t n_spans, cap_spans;
  double prof_seconds;
  uint64_t prof_ops;
  size_t scratch_bytes;
  /* What the disk cache key is made of, besides the source and the options. */
  char dev_name[256];
  char dev_version[128];
  char driver_version[128];
  char platform_name[256];
  char platform_version[256];
} clpar_ocl_device;

/* Whether ocl_gemm runs this GEMM with gemm_small.cl rather than CLBlast (CPU devices only;
 * the tuner leaves such shapes out: CLBlast never runs them). */
int clpar_ocl_gemm_takes_small(const clpar_ocl_device *d, int trans_a, int trans_b, size_t m,
                               size_t n, size_t k);

/* Whether ocl_gemm runs this GEMM with gemm_tile.cl rather than gemm_small or CLBlast (CPU
 * devices only), and that run (ocl_gemm_tile.c); batch 1 is a plain GEMM. */
int clpar_ocl_gemm_takes_tile(const clpar_ocl_device *d, int trans_a, int trans_b, size_t m,
                              size_t n, size_t k, size_t lda, size_t ldb, size_t ldc);
clpar_status clpar_ocl_gemm_tile(clpar_ocl_device *d, int trans_a, int trans_b, size_t m,
                                 size_t n, size_t k, float alpha, clpar_bref a, size_t lda,
                                 size_t stride_a, clpar_bref b, size_t ldb, size_t stride_b,
                                 float beta, clpar_bref c, size_t ldc, size_t stride_c,
                                 size_t batch);

/* ---- kernel launches (ocl_backend.c), for the ops kept in files of their own ---- */

/* One kernel argument: its size and a pointer to its value (NULL value: __local memory). */
typedef struct {
  size_t size;
  const void *value;
} karg;

#define KARG(x) \
  { sizeof(x), &(x) }

/* Takes dev->lock, sets the arguments of kernel name of the embedded file and enqueues it
 * (profiled like every kernel). */
clpar_status clpar_ocl_launch(clpar_ocl_device *d, const char *file, const char *name,
                              const karg *args, int nargs, cl_uint dims, const size_t *global,
                              const size_t *local);
/* n work-items in groups of up to 256 (the kernel checks its index against n). */
clpar_status clpar_ocl_launch_1d(clpar_ocl_device *d, const char *file, const char *name,
                                 const karg *args, int nargs, size_t n);

/* ---- ocl_conv.c: convolution, pooling and batch-norm entries (backend.h) ---- */
#define CLPAR_OCL_CONV_DECL_(name) \
  clpar_status clpar_ocl_##name(void *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
CLPAR_OCL_CONV_DECL_(im2col)
CLPAR_OCL_CONV_DECL_(col2im)
CLPAR_OCL_CONV_DECL_(swap01)
CLPAR_OCL_CONV_DECL_(maxpool)
CLPAR_OCL_CONV_DECL_(maxpool_backward)
CLPAR_OCL_CONV_DECL_(avgpool)
CLPAR_OCL_CONV_DECL_(avgpool_backward)
CLPAR_OCL_CONV_DECL_(bn_stats)
CLPAR_OCL_CONV_DECL_(bn_apply)
CLPAR_OCL_CONV_DECL_(bn_backward_sums)
CLPAR_OCL_CONV_DECL_(bn_backward)
#undef CLPAR_OCL_CONV_DECL_
#define ocl_im2col clpar_ocl_im2col
#define ocl_col2im clpar_ocl_col2im
#define ocl_swap01 clpar_ocl_swap01
#define ocl_maxpool clpar_ocl_maxpool
#define ocl_maxpool_backward clpar_ocl_maxpool_backward
#define ocl_avgpool clpar_ocl_avgpool
#define ocl_avgpool_backward clpar_ocl_avgpool_backward
#define ocl_bn_stats clpar_ocl_bn_stats
#define ocl_bn_apply clpar_ocl_bn_apply
#define ocl_bn_backward_sums clpar_ocl_bn_backward_sums
#define ocl_bn_backward clpar_ocl_bn_backward

/* ---- ocl_errors.c ---- */

/* "CL_OUT_OF_RESOURCES"; "CL_UNKNOWN_ERROR(-1234)" (thread-local buffer) otherwise. */
const char *clpar_ocl_error_name(cl_int err);
/* "CLBlastInsufficientMemoryC"; "CLBlastUnknownStatus(-1234)" otherwise. */
const char *clpar_ocl_clblast_status_name(int status);
/* The clpar status for a driver error: allocation failures are CLPAR_ERROR_OUT_OF_MEMORY,
 * an oversized buffer CLPAR_ERROR_TOO_LARGE, the rest CLPAR_ERROR_BACKEND. */
clpar_status clpar_ocl_status(cl_int err);

/* ---- ocl_program.c ---- */

/* Options every clpar program is built with. */
#define CLPAR_OCL_BUILD_OPTIONS "-cl-std=CL1.2"

/* The program of source (size bytes, name for messages and the in-memory cache) built with
 * options on dev: from memory, else from the disk cache, else compiled (then saved to disk).
 * A compile error returns CLPAR_ERROR_BUILD with the build log in the message. The program
 * stays owned by the cache. */
clpar_status clpar_ocl_program_get(clpar_ocl_device *dev, const char *name, const char *source,
                                   size_t size, const char *options, cl_program *out);
/* The kernel kernel_name of the embedded source file (e.g. "elementwise.cl"), created once
 * and cached with its program. Callers hold dev->lock while they set its arguments. */
clpar_status clpar_ocl_kernel_get(clpar_ocl_device *dev, const char *file, const char *kernel_name,
                                  cl_kernel *out);
/* Drops every program and kernel cached in memory for dev (as a new process would start). */
void clpar_ocl_program_cache_clear(clpar_ocl_device *dev);
/* The disk cache file a program would use; CLPAR_ERROR_IO when there is no usable cache
 * directory. */
clpar_status clpar_ocl_cache_file(clpar_ocl_device *dev, const char *source, size_t size,
                                  const char *options, char *path, size_t path_size);

/* Process-wide counters: which path served clpar_ocl_program_get. */
typedef struct clpar_ocl_program_stats {
  uint64_t source_builds; /* compiled from source */
  uint64_t disk_loads;    /* loaded from the disk cache */
  uint64_t memory_hits;   /* found in the in-memory cache */
  uint64_t disk_rejects;  /* disk entries found but corrupt, truncated or stale */
} clpar_ocl_program_stats;
void clpar_ocl_program_stats_get(clpar_ocl_program_stats *out);

#endif
