/* ocl_internal.h — private to the OpenCL backend: the per-device context, kernel launches
 * (ocl_launch.c), the table's entries kept in files of their own, the program cache
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
/* The slots of a device's workspace (ocl_workspace.c): a call takes each slot it needs at most
 * once at a time. The convolutions' temporaries: columns (im2col), the transformed input
 * (Winograd), backward weights' partial sums or per-image products; the output before its
 * layout (im2col), Winograd's products, backward's swapped gy; Winograd's transformed filter
 * or the ones backward weights sums with; backward data's flipped filter, taken around the
 * forward Winograd that uses the three others. */
enum { CLPAR_OCL_WS_COLS, CLPAR_OCL_WS_OUT, CLPAR_OCL_WS_FILTER, CLPAR_OCL_WS_FLIPPED };
#define CLPAR_OCL_WS_SLOTS 4

typedef struct clpar_ocl_workspace {
  pthread_mutex_t lock; /* recursive; held from a take to its give */
  cl_mem slot[CLPAR_OCL_WS_SLOTS];
  size_t bytes[CLPAR_OCL_WS_SLOTS];
  unsigned held; /* bit i: slot i taken */
  uint64_t grows;
  size_t peak_bytes;
} clpar_ocl_workspace;

typedef struct clpar_ocl_device {
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  int shared_context; /* context is shared with the platform's other devices */
  /* The queue commands go to: plain_queue, made without CL_QUEUE_PROFILING_ENABLE (PoCL reads
   * the clock several times per command on a profiling queue), or prof_queue while a profile
   * is recorded (made by the first clpar_device_profile_start; ocl_profile switches). */
  cl_command_queue queue;
  cl_command_queue plain_queue, prof_queue;
  /* Held around every command on the queue (kernel arguments are shared state, and PoCL's
   * basic devices deadlocked when two threads drove one queue at once: DataParallel). */
  pthread_mutex_t lock;
  /* Guards the program cache below; taken after lock when both are needed. */
  pthread_mutex_t prog_lock;
  clpar_ocl_program *programs;
  atomic_int gemm_warm;     /* CLBlast has compiled its GEMM kernels for this device */
  atomic_int convgemm_warm; /* and its convgemm kernels (a program of their own) */
  /* clpar_ocl_pocl_shares_kernels: this device's CLBlast GEMMs hold
   * clpar_ocl_gemm_warmup_lock throughout, since such devices share CLBlast's programs (its
   * binary cache is keyed by the device's name); clpar's own programs are kept apart instead. */
  int clblast_serial;
  cl_ulong max_alloc; /* CL_DEVICE_MAX_MEM_ALLOC_SIZE, enforced by ocl_alloc */
  size_t max_wg_size;
  cl_mem_flags buffer_flags; /* tensors' buffers: see ocl_alloc */
  /* a CPU device: small GEMMs take gemm_small.cl (ocl_gemm) */
  int cpu;
  /* whether the compiler fuses a multiply of one statement with an add of the next (ocl_fuse.c
   * probes it once): 0 not probed yet, 1 no, 2 yes; guarded by lock */
  int contracts_across;
  /* sum_rows' partial sums and overlapping copies' temporary, grown on demand (clpar_ocl_grow);
   * guarded by lock */
  cl_mem scratch;
  atomic_ullong buffers_created; /* clCreateBuffer calls for device memory (ocl_memory.c) */
  atomic_ullong own_bytes; /* the bytes of ws and scratch now (clpar_ocl_grow; workspace_bytes) */
  clpar_ocl_workspace ws;  /* the convolutions' temporaries (ocl_workspace.c) */
  /* Profiling (clpar_device_profile_*): while on, every kernel and copy keeps its event, and
   * reading the profile sums their device times. Guarded by prof_lock. */
  pthread_mutex_t prof_lock;
  int profiling;
  struct clpar_ocl_span *spans; /* one per command (or per GEMM) recorded */
  size_t n_spans, cap_spans;
  double prof_seconds;
  uint64_t prof_ops;
  size_t scratch_bytes;
  /* The convolution's choices per shape and the implicit GEMM's kernels (ocl_conv_cache.c). */
  struct clpar_ocl_conv_state *conv;
  /* oneDNN's engine, stream and primitives, or why not (ocl_dnnl.c); guarded by lock. */
  struct clpar_ocl_dnnl *dnnl;
  /* The launches of the entry being prepared for a graph (ocl_prepared.c), NULL otherwise;
   * used on the worker's thread only, as the entries are. */
  struct clpar_ocl_recording *recording;
  /* Appended to every program's build options (ocl_program.c); guarded by prog_lock. */
  char options_suffix[64];
  int options_suffix_set;
  /* What the disk cache key is made of, besides the source and the options. */
  char dev_name[256];
  char dev_version[128];
  char driver_version[128];
  char platform_name[256];
  char platform_version[256];
} clpar_ocl_device;

/* ---- kernel launches and profiling (ocl_launch.c) ---- */

/* Work-group sizes: small enough for any device, large enough that a CPU device does not
 * spend its time scheduling groups. */
#define CLPAR_OCL_WG_1D 256
#define CLPAR_OCL_WG_2D 64
/* sum_rows and bias_act_backward sum up to this many rows in one pass (ocl_elementwise.c). */
#define CLPAR_OCL_SUM_ROWS_ONE_PASS 256

/* A buffer handle as the backend's entries receive it (clpar_bref.buf) is a cl_mem. */
#define AS_MEM(buf) ((cl_mem)(buf))

/* One kernel argument: its size and a pointer to its value (NULL value: __local memory). */
typedef struct {
  size_t size;
  const void *value;
} karg;

#define KARG(x) \
  { sizeof(x), &(x) }

static inline size_t clpar_ocl_round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

/* Sets the error for a failed OpenCL call: "call(what): CL_NAME" (what may be NULL). */
clpar_status clpar_ocl_fail(cl_int err, const char *call, const char *what);

/* Where the next enqueue should put its event: NULL unless profiling is on. */
cl_event *clpar_ocl_profile_slot(clpar_ocl_device *d, cl_event *ev);
/* Keeps a recorded span for the profile (dropped when out of memory). */
void clpar_ocl_profile_keep_span(clpar_ocl_device *d, cl_event after, cl_event last);
/* Keeps an enqueued command's event for the profile (ev may be NULL). */
void clpar_ocl_profile_keep(clpar_ocl_device *d, cl_event ev);

/* Sets the arguments of kernel name of the embedded file and enqueues it (profiled like
 * every command); the caller holds d->lock. */
clpar_status clpar_ocl_launch_locked(clpar_ocl_device *d, const char *file, const char *name,
                                     const karg *args, int nargs, cl_uint dims,
                                     const size_t *global, const size_t *local);
/* clpar_ocl_launch_locked under dev->lock. */
clpar_status clpar_ocl_launch(clpar_ocl_device *d, const char *file, const char *name,
                              const karg *args, int nargs, cl_uint dims, const size_t *global,
                              const size_t *local);
/* n work-items in groups of up to CLPAR_OCL_WG_1D (the kernel checks its index against n). */
clpar_status clpar_ocl_launch_1d(clpar_ocl_device *d, const char *file, const char *name,
                                 const karg *args, int nargs, size_t n);
/* (cols, rows) work-items in groups of CLPAR_OCL_WG_2D, shaped to waste little on narrow
 * matrices. */
void clpar_ocl_shape_2d(clpar_ocl_device *d, size_t cols, size_t rows, size_t global[2],
                        size_t local[2]);

/* ---- buffers: the device's counters and its workspace (ocl_workspace.c) ---- */

/* What a device's buffers did, for tests and benches. */
typedef struct clpar_ocl_buffer_stats {
  /* clCreateBuffer calls for device memory: the tensors' (the allocator's driver_allocs) and
   * the backend's own temporaries */
  uint64_t created;
  uint64_t workspace_grows;      /* slots of the workspace made or replaced by a larger one */
  uint64_t workspace_bytes;      /* the workspace's slots now */
  uint64_t workspace_peak_bytes; /* and at most */
  uint64_t scratch_bytes;        /* d->scratch now */
} clpar_ocl_buffer_stats;
void clpar_ocl_buffer_stats_get(clpar_ocl_device *d, clpar_ocl_buffer_stats *out);

/* *m made at least bytes: kept when it is, else released (the queue keeps it until the commands
 * that use it are done) and replaced by a buffer of bytes (ocl_alloc: max_alloc enforced, the
 * creation counted). On failure *m is NULL and *have 0. */
clpar_status clpar_ocl_grow(clpar_ocl_device *d, cl_mem *m, size_t *have, size_t bytes);

void clpar_ocl_workspace_init(clpar_ocl_device *d);
/* Takes slot (a CLPAR_OCL_WS_* of the caller's own) of d's workspace, at least bytes, into
 * *buf: its lock is held until clpar_ocl_ws_give (then nothing else uses the slot until this
 * caller's commands on the queue are done). Growing it after an out-of-memory failure first
 * releases the slots not taken, then tries once more. Call without d->lock held. */
clpar_status clpar_ocl_ws_take(clpar_ocl_device *d, int slot, size_t bytes, void **buf);
/* Gives slot back; buf as the take returned it (NULL, as left by a failed take: nothing). */
void clpar_ocl_ws_give(clpar_ocl_device *d, int slot, void *buf);
/* Releases the slots not taken (tests: the next take makes a buffer of just its size). */
void clpar_ocl_workspace_release(clpar_ocl_device *d);
/* Enqueues a fill of every slot not taken with NaN (tests: what reads a temporary it did not
 * write sees it). */
clpar_status clpar_ocl_workspace_poison(clpar_ocl_device *d);
/* Releases the workspace (device destroy). */
void clpar_ocl_workspace_free(clpar_ocl_device *d);

/* ---- the table's entries defined outside ocl_backend.c (which builds the table) ---- */
#define CLPAR_OCL_ENTRY_DECL_(name) \
  clpar_status clpar_ocl_##name(void *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
/* ocl_workspace.c: the workspace and d->scratch counted and released */
CLPAR_OCL_ENTRY_DECL_(workspace_bytes)
CLPAR_OCL_ENTRY_DECL_(workspace_trim)
/* ocl_prepared.c: the prepared launches of captured graphs */
CLPAR_OCL_ENTRY_DECL_(prepare_begin)
CLPAR_OCL_ENTRY_DECL_(prepare_end)
CLPAR_OCL_ENTRY_DECL_(prepare_run)
CLPAR_OCL_ENTRY_DECL_(prepare_free)
#define ocl_prepare_begin clpar_ocl_prepare_begin
#define ocl_prepare_end clpar_ocl_prepare_end
#define ocl_prepare_run clpar_ocl_prepare_run
#define ocl_prepare_free clpar_ocl_prepare_free
/* Records the launch just enqueued (clpar_ocl_launch_locked) while the thread prepares one. */
void clpar_ocl_prepare_launch(clpar_ocl_device *d, cl_kernel k, const char *name, const karg *args,
                              int nargs, cl_uint dims, const size_t *global, const size_t *local);
/* Marks the recording of d's entry as not preparable (an enqueue it cannot hold: CLBlast). */
void clpar_ocl_prepare_foreign(clpar_ocl_device *d);
/* ocl_launch.c */
CLPAR_OCL_ENTRY_DECL_(profile)
CLPAR_OCL_ENTRY_DECL_(profile_read)
/* ocl_memory.c */
CLPAR_OCL_ENTRY_DECL_(alloc)
CLPAR_OCL_ENTRY_DECL_(release)
CLPAR_OCL_ENTRY_DECL_(host_alloc)
CLPAR_OCL_ENTRY_DECL_(host_free)
CLPAR_OCL_ENTRY_DECL_(event_record)
CLPAR_OCL_ENTRY_DECL_(event_query)
CLPAR_OCL_ENTRY_DECL_(event_then)
CLPAR_OCL_ENTRY_DECL_(event_free)
CLPAR_OCL_ENTRY_DECL_(peer_access)
CLPAR_OCL_ENTRY_DECL_(copy_peer)
CLPAR_OCL_ENTRY_DECL_(write)
CLPAR_OCL_ENTRY_DECL_(read)
CLPAR_OCL_ENTRY_DECL_(copy)
CLPAR_OCL_ENTRY_DECL_(finish)
/* ocl_elementwise.c */
CLPAR_OCL_ENTRY_DECL_(fill)
CLPAR_OCL_ENTRY_DECL_(binary)
CLPAR_OCL_ENTRY_DECL_(scale)
CLPAR_OCL_ENTRY_DECL_(sum_rows)
CLPAR_OCL_ENTRY_DECL_(broadcast_rows)
CLPAR_OCL_ENTRY_DECL_(reduce_sum)
CLPAR_OCL_ENTRY_DECL_(expand)
CLPAR_OCL_ENTRY_DECL_(unary)
CLPAR_OCL_ENTRY_DECL_(unary_backward)
CLPAR_OCL_ENTRY_DECL_(bias_act)
CLPAR_OCL_ENTRY_DECL_(bias_act_backward)
CLPAR_OCL_ENTRY_DECL_(softmax)
CLPAR_OCL_ENTRY_DECL_(softmax_backward)
CLPAR_OCL_ENTRY_DECL_(pick)
CLPAR_OCL_ENTRY_DECL_(nll)
CLPAR_OCL_ENTRY_DECL_(nll_backward)
CLPAR_OCL_ENTRY_DECL_(xent)
CLPAR_OCL_ENTRY_DECL_(xent_backward)
CLPAR_OCL_ENTRY_DECL_(linear_act)
CLPAR_OCL_ENTRY_DECL_(linear_act_backward)
CLPAR_OCL_ENTRY_DECL_(sgd_step)
CLPAR_OCL_ENTRY_DECL_(adam_step)
/* ocl_gemm.c */
CLPAR_OCL_ENTRY_DECL_(gemm)
CLPAR_OCL_ENTRY_DECL_(gemm_batched)
#define ocl_profile clpar_ocl_profile
#define ocl_profile_read clpar_ocl_profile_read
#define ocl_alloc clpar_ocl_alloc
#define ocl_release clpar_ocl_release
#define ocl_host_alloc clpar_ocl_host_alloc
#define ocl_host_free clpar_ocl_host_free
#define ocl_event_record clpar_ocl_event_record
#define ocl_event_query clpar_ocl_event_query
#define ocl_event_then clpar_ocl_event_then
#define ocl_event_free clpar_ocl_event_free
#define ocl_peer_access clpar_ocl_peer_access
#define ocl_copy_peer clpar_ocl_copy_peer
#define ocl_write clpar_ocl_write
#define ocl_read clpar_ocl_read
#define ocl_copy clpar_ocl_copy
#define ocl_finish clpar_ocl_finish
#define ocl_fill clpar_ocl_fill
#define ocl_binary clpar_ocl_binary
#define ocl_scale clpar_ocl_scale
#define ocl_sum_rows clpar_ocl_sum_rows
#define ocl_broadcast_rows clpar_ocl_broadcast_rows
#define ocl_reduce_sum clpar_ocl_reduce_sum
#define ocl_expand clpar_ocl_expand
#define ocl_unary clpar_ocl_unary
#define ocl_unary_backward clpar_ocl_unary_backward
#define ocl_bias_act clpar_ocl_bias_act
#define ocl_bias_act_backward clpar_ocl_bias_act_backward
#define ocl_softmax clpar_ocl_softmax
#define ocl_softmax_backward clpar_ocl_softmax_backward
#define ocl_pick clpar_ocl_pick
#define ocl_nll clpar_ocl_nll
#define ocl_nll_backward clpar_ocl_nll_backward
#define ocl_xent clpar_ocl_xent
#define ocl_xent_backward clpar_ocl_xent_backward
#define ocl_linear_act clpar_ocl_linear_act
#define ocl_linear_act_backward clpar_ocl_linear_act_backward
#define ocl_sgd_step clpar_ocl_sgd_step
#define ocl_adam_step clpar_ocl_adam_step
#define ocl_gemm clpar_ocl_gemm
#define ocl_gemm_batched clpar_ocl_gemm_batched

/* ---- ocl_conv.c: convolution, pooling and batch-norm entries (backend.h) ---- */
CLPAR_OCL_ENTRY_DECL_(im2col)
CLPAR_OCL_ENTRY_DECL_(col2im)
CLPAR_OCL_ENTRY_DECL_(swap01)
CLPAR_OCL_ENTRY_DECL_(maxpool)
CLPAR_OCL_ENTRY_DECL_(maxpool_backward)
CLPAR_OCL_ENTRY_DECL_(avgpool)
CLPAR_OCL_ENTRY_DECL_(avgpool_backward)
CLPAR_OCL_ENTRY_DECL_(bn_stats)
CLPAR_OCL_ENTRY_DECL_(bn_apply)
CLPAR_OCL_ENTRY_DECL_(bn_backward_sums)
CLPAR_OCL_ENTRY_DECL_(bn_backward)
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

/* ---- ocl_tensor_ops.c: the tensor ops of transformers (backend.h) ---- */
CLPAR_OCL_ENTRY_DECL_(strided_copy)
CLPAR_OCL_ENTRY_DECL_(pointwise)
CLPAR_OCL_ENTRY_DECL_(mask_upper)
CLPAR_OCL_ENTRY_DECL_(argmax)
CLPAR_OCL_ENTRY_DECL_(nll_ignore)
CLPAR_OCL_ENTRY_DECL_(nll_ignore_backward)
#define ocl_strided_copy clpar_ocl_strided_copy
#define ocl_pointwise clpar_ocl_pointwise
#define ocl_mask_upper clpar_ocl_mask_upper
#define ocl_argmax clpar_ocl_argmax
#define ocl_nll_ignore clpar_ocl_nll_ignore
#define ocl_nll_ignore_backward clpar_ocl_nll_ignore_backward

/* ---- ocl_layers.c: the transformer layers (backend.h) ---- */
CLPAR_OCL_ENTRY_DECL_(embedding)
CLPAR_OCL_ENTRY_DECL_(embedding_backward)
CLPAR_OCL_ENTRY_DECL_(layernorm)
CLPAR_OCL_ENTRY_DECL_(layernorm_backward)
CLPAR_OCL_ENTRY_DECL_(dropout_mask)
#define ocl_embedding clpar_ocl_embedding
#define ocl_embedding_backward clpar_ocl_embedding_backward
#define ocl_layernorm clpar_ocl_layernorm
#define ocl_layernorm_backward clpar_ocl_layernorm_backward
#define ocl_dropout_mask clpar_ocl_dropout_mask

/* ---- ocl_half.c: float32 to and from the 16-bit floats (backend.h) ---- */
CLPAR_OCL_ENTRY_DECL_(half_convert)
#define ocl_half_convert clpar_ocl_half_convert

/* ---- ocl_errors.c ---- */

/* "CL_OUT_OF_RESOURCES"; "CL_UNKNOWN_ERROR(-1234)" (thread-local buffer) otherwise. */
const char *clpar_ocl_error_name(cl_int err);
/* "CLBlastInsufficientMemoryC"; "CLBlastUnknownStatus(-1234)" otherwise. */
const char *clpar_ocl_clblast_status_name(int status);
/* The clpar status for a driver error: allocation failures are CLPAR_ERROR_OUT_OF_MEMORY,
 * an oversized buffer CLPAR_ERROR_TOO_LARGE, the rest CLPAR_ERROR_BACKEND. */
clpar_status clpar_ocl_status(cl_int err);

/* ---- ocl_program.c ---- */

/* Whether dev is a CPU device of a PoCL before 6.0, whose loaded kernels are shared by every
 * device that builds the same program, and miscounted when two threads run one at once. */
int clpar_ocl_pocl_shares_kernels(const clpar_ocl_device *dev);

/* Options every clpar program is built with (PoCL's CPU devices add a define of their own). */
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
clpar_status clpar_ocl_generated_kernel(clpar_ocl_device *dev, const char *name, const char *source,
                                        size_t size, const char *kernel_name, cl_kernel *out);
clpar_status ocl_ew_chain_prepare(void *dev, clpar_ew_chain *chain);
clpar_status ocl_ew_chain(void *dev, const clpar_ew_chain *chain);
/* The disk cache file a program would use; CLPAR_ERROR_IO when there is no usable cache
 * directory. */
clpar_status clpar_ocl_cache_file(clpar_ocl_device *dev, const char *source, size_t size,
                                  const char *options, char *path, size_t path_size);

/* The saved entries of the tuners (GEMM parameters, convolution choices), ocl_tune_entry.c:
 * the header lines naming d ("device NAME\ndriver VERSION\nplatform NAME VERSION\n", line
 * breaks in the names made spaces); an entry's file name, <prefix>-<FNV-1a of its
 * header>.txt; and that file's path in the cache directory (0, or -1 without one). */
void clpar_ocl_entry_device_lines(clpar_ocl_device *d, char *out, size_t size);
void clpar_ocl_entry_name(const char *prefix, const char *header, char *name, size_t size);
int clpar_ocl_entry_path(const char *name, char *path, size_t size);

/* Process-wide counters: which path served clpar_ocl_program_get. */
typedef struct clpar_ocl_program_stats {
  uint64_t source_builds; /* compiled from source */
  uint64_t disk_loads;    /* loaded from the disk cache */
  uint64_t memory_hits;   /* found in the in-memory cache */
  uint64_t disk_rejects;  /* disk entries found but corrupt, truncated or stale */
} clpar_ocl_program_stats;
void clpar_ocl_program_stats_get(clpar_ocl_program_stats *out);

/* Convolutions through oneDNN on Intel GPUs (ocl_dnnl.c). The switch CLPAR_OCL_DNNL: *on 1
 * for "1", 0 unset or "0", anything else refused naming it. Each entry hands its call to
 * oneDNN where the switch is on and d takes it (*done 1); otherwise, or where oneDNN could not
 * run this call, *done is 0 and clpar's kernels take it. Not OK only for a bad switch. */
clpar_status clpar_ocl_dnnl_setting(int *on);
clpar_status clpar_ocl_dnnl_conv2d(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                   clpar_bref w, clpar_bref b, clpar_bref y, int *done);
clpar_status clpar_ocl_dnnl_conv2d_backward(clpar_ocl_device *d, const clpar_conv2d_shape *s,
                                            clpar_bref x, clpar_bref w, clpar_bref gy,
                                            clpar_bref dx, clpar_bref dw, clpar_bref db, int *done);
/* Why d refuses oneDNN (its state made now if not yet), or NULL where it takes it. */
const char *clpar_ocl_dnnl_why(clpar_ocl_device *d);
/* The calls oneDNN ran on d (the forward and the backward count one each). */
uint64_t clpar_ocl_dnnl_runs(clpar_ocl_device *d);
/* Frees d's oneDNN state (the device's destroy); the next call makes it again. */
void clpar_ocl_dnnl_free(clpar_ocl_device *d);
/* Tests: nonzero skips the vendor check, so that any device tries to make oneDNN's engine. */
extern int clpar_ocl_dnnl_any_vendor;

#endif
