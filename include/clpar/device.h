/* device.h — the library's lifetime and its devices.
 *
 * clpar_init() finds the devices: every OpenCL device (and CUDA device when the CUDA module
 * is built), GPUs first; the host backend joins when CLPAR_DEVICES names it or when there is
 * no other device. CLPAR_DEVICES="opencl:1,opencl:0" selects and orders them; an entry that
 * matches no device makes clpar_init fail with a message listing the devices there are.
 * Devices are then addressed by their index in that list (0 .. clpar_device_count()-1). */
#ifndef CLPAR_DEVICE_H
#define CLPAR_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clpar_device clpar_device;

typedef enum clpar_device_type {
  CLPAR_DEVICE_GPU = 0,
  CLPAR_DEVICE_CPU = 1,
  CLPAR_DEVICE_ACCELERATOR = 2,
  CLPAR_DEVICE_OTHER = 3
} clpar_device_type;

typedef struct clpar_device_info {
  char id[32];      /* "opencl:0", "cuda:1", "host" */
  char backend[16]; /* "opencl", "cuda", "host" */
  char name[256];   /* the driver's device name */
  char vendor[128];
  char platform[128]; /* OpenCL platform name; "" elsewhere */
  char driver_version[64];
  clpar_device_type type;
  uint64_t global_mem_bytes;
  uint64_t max_alloc_bytes; /* the largest single buffer the device allows */
  int compute_units;
} clpar_device_info;

/* Safe to call more than once; each successful call needs one clpar_shutdown(). */
CLPAR_API clpar_status clpar_init(void);
/* The last of the paired calls waits for every queue, then releases every device and cached
 * buffer. Free tensors, modules and optimizers before it. A program that does not (one that
 * leaves on an error path) gets defined behaviour, not a crash: the device memory of every
 * tensor still alive is released with its device, one warning is logged with their count
 * ("clpar_shutdown: N tensors were still alive ..."), and those tensors (and the modules and
 * optimizers holding them) can afterwards only be freed, which is safe and frees their host
 * memory; any other use returns CLPAR_ERROR_NOT_INITIALIZED where it is checked (reads,
 * writes, copies, ops, clpar_module_forward, clpar_backward, clpar_optimizer_step) and is not
 * supported otherwise. A later clpar_init starts afresh. */
CLPAR_API void clpar_shutdown(void);

CLPAR_API int clpar_device_count(void);
/* index in 0 .. count-1; NULL (and an error message) otherwise. */
CLPAR_API clpar_device *clpar_device_get(int index);
/* By id ("opencl:1", "host"), among the selected devices. */
CLPAR_API clpar_status clpar_device_find(const char *id, clpar_device **out);
CLPAR_API clpar_status clpar_device_get_info(const clpar_device *dev, clpar_device_info *info);
CLPAR_API const char *clpar_device_id(const clpar_device *dev);
/* The host backend's device, whether it is in the selected list or not: the reference to
 * check another device's results against. NULL before clpar_init. */
CLPAR_API clpar_device *clpar_device_host(void);
/* Position of the device in the selected list. */
CLPAR_API int clpar_device_index(const clpar_device *dev);
/* Waits until every operation posted to the device has finished; returns the error of one
 * that failed since the last call on the device, naming it. */
CLPAR_API clpar_status clpar_device_synchronize(clpar_device *dev);

/* Device-time profiling: between start and stop, the device records how long its kernels,
 * GEMMs and device-local copies ran (host transfers are not counted). read waits for the
 * device and gives the totals since start; comparing them with wall time shows how much of a
 * step the library spends outside kernels. CLPAR_ERROR_UNSUPPORTED where a backend cannot
 * (OpenCL and CUDA record; the host backend does not). */
typedef struct clpar_profile {
  double device_seconds;
  uint64_t ops;
} clpar_profile;

CLPAR_API clpar_status clpar_device_profile_start(clpar_device *dev);
CLPAR_API clpar_status clpar_device_profile_read(clpar_device *dev, clpar_profile *out);
CLPAR_API clpar_status clpar_device_profile_stop(clpar_device *dev);

/* The per-device caching allocator. After the first step of a loop, a steady-state loop
 * takes every buffer from the cache: driver_allocs stops growing. */
typedef struct clpar_memory_stats {
  uint64_t driver_allocs; /* buffers obtained from the driver */
  uint64_t driver_frees;  /* buffers given back to the driver */
  uint64_t cache_hits;    /* requests served from the cache */
  uint64_t bytes_in_use;  /* held by live tensors */
  uint64_t bytes_cached;  /* free in the cache */
  uint64_t peak_bytes_in_use;
} clpar_memory_stats;

CLPAR_API clpar_status clpar_device_memory_stats(const clpar_device *dev, clpar_memory_stats *out);
/* Sets peak_bytes_in_use to bytes_in_use (torch.cuda.reset_peak_memory_stats): the peak read
 * later is the peak since this call. */
CLPAR_API clpar_status clpar_device_memory_reset_peak(clpar_device *dev);

/* How often a thread, the program's or the library's, has blocked on the device: every read
 * of a tensor back to the host, every clpar_device_synchronize, the library's own waits
 * (allocating a device's first pinned staging blocks at clpar_init; emptying its cache) and the
 * waits inside the backend (counted apart in clpar_device_counters.backend_waits). A training
 * step (forward, loss, backward, optimizer step) adds none, on one device or with
 * DataParallel over several; with DistributedDataParallel, backward reads each gradient back
 * for MPI and so does wait (include/clpar/dist.h). */
CLPAR_API uint64_t clpar_device_host_waits(const clpar_device *dev);
/* What the device's queue did besides computing, since clpar_init. */
typedef struct clpar_device_counters {
  uint64_t host_waits;    /* as clpar_device_host_waits */
  uint64_t queue_waits;   /* the device's worker waited for another device's work */
  uint64_t transfers_in;  /* copies from another device or from host memory */
  uint64_t transfers_out; /* copies to another device or to host memory */
  uint64_t bytes_in, bytes_out;
  uint64_t backend_waits; /* of host_waits, the waits inside the backend (a clFinish, a blocking
                           * map, a cudaStreamSynchronize before cudaFree, ...) */
  uint64_t peer_copies;   /* of transfers_in and transfers_out, those the driver copied straight
                           * between the two devices' memories (CUDA peer copies; OpenCL devices
                           * sharing a context), without host staging */
} clpar_device_counters;
CLPAR_API clpar_status clpar_device_counters_get(const clpar_device *dev,
                                                 clpar_device_counters *out);
/* Gives every cached (unused) buffer back to the driver, and releases the backend's workspaces
 * (memory.h's CLPAR_MEM_WORKSPACE: the next op that needs one grows it again). */
CLPAR_API clpar_status clpar_device_empty_cache(clpar_device *dev);

/* ---- GEMM tuning (OpenCL devices: CLBlast's parameters for this device) ---- */

/* One GEMM a model runs, row-major: C (m x n) = op(A) (m x k) op(B) (k x n). */
typedef struct clpar_gemm_shape {
  int64_t m, n, k;
  int trans_a, trans_b;
} clpar_gemm_shape;

/* Called on the device's worker thread after each candidate: done of total, and what was
 * just timed ("Xgemm 3/24"). It must not call into clpar. */
typedef void (*clpar_tune_progress_fn)(void *user, int done, int total, const char *what);

typedef struct clpar_tune_options {
  int quick; /* a small grid (a few candidates per kernel): for CI */
  /* candidates per kernel; 0 picks 16 for Xgemm, 8 for XgemmDirect, 4 for each pad/transpose
   * kernel (quick: 2, 2 and 1) */
  int candidates;
  clpar_tune_progress_fn progress; /* may be NULL */
  void *user;
} clpar_tune_options;

typedef struct clpar_tune_result {
  double default_seconds; /* the shapes' GEMMs once each with CLBlast's own parameters */
  double tuned_seconds;   /* the same with the parameters kept (never more than default) */
  int candidates_tried, candidates_failed; /* failed: build error or wrong results */
  char path[512];                          /* the tuning entry written under CLPAR_CACHE_DIR */
} clpar_tune_result;

/* Tunes CLBlast's GEMM kernels (Xgemm, the pad and transpose kernels of its indirect path,
 * XgemmDirect, and the size where it switches between them) for dev on the given shapes: times
 * whole GEMMs with each candidate, checking every candidate's results against double-precision
 * sums, keeps the fastest (CLBlast's defaults when nothing beats them), applies it at once and
 * saves it under CLPAR_CACHE_DIR, keyed by device, driver and CLBlast version; every later
 * clpar_init applies it when it opens the device (CLPAR_TUNE=off ignores saved entries). CLBlast
 * keeps parameters per device for the whole process. Takes seconds per candidate.
 * On a CPU device the shapes that run clpar's own small-GEMM kernel instead of CLBlast (B
 * transposed with B of at most 2^22 floats, or at most 2^20 multiply-adds) are left out, and
 * CLPAR_ERROR_INVALID_ARGUMENT comes back when no shape is left.
 * CLPAR_ERROR_UNSUPPORTED on a device that is not OpenCL. options and result may be NULL. */
CLPAR_API clpar_status clpar_device_tune_gemm(clpar_device *dev, const clpar_gemm_shape *shapes,
                                              int n_shapes, const clpar_tune_options *options,
                                              clpar_tune_result *result);

#ifdef __cplusplus
}
#endif
#endif
