/* ocl_tune.h — private to the OpenCL backend: CLBlast's GEMM parameters for a device, tuned
 * (ocl_tune.c), saved per device, driver and CLBlast version under CLPAR_CACHE_DIR, and
 * applied when the device is opened. Tests include it to reach the cache file. */
#ifndef CLPAR_OCL_TUNE_H
#define CLPAR_OCL_TUNE_H

#include <CL/cl.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CLPAR_OCL_MAX_PARAMS 24

/* One CLBlast kernel's parameters, sorted by name. */
typedef struct clpar_ocl_params {
  int n;
  char name[CLPAR_OCL_MAX_PARAMS][32];
  size_t value[CLPAR_OCL_MAX_PARAMS];
} clpar_ocl_params;

/* CLBlast's current single-precision parameters of kernel ("Xgemm") on device: its database
 * values, or what an override set. 0 on success, -1 otherwise (ocl_clblast_params.cc). */
int clpar_ocl_clblast_params(cl_device_id device, const char *kernel, clpar_ocl_params *out);

#ifdef __cplusplus
}

#else
#include "ocl_internal.h"

/* Held around a device's first CLBlast GEMM (ocl_backend.c), around every one on a PoCL CPU
 * device (clblast_serial), and by the tuner throughout:
 * CLBlast's compilation races when two devices compile at once. */
extern pthread_mutex_t clpar_ocl_gemm_warmup_lock;

/* What applying a saved entry did. */
typedef enum {
  CLPAR_OCL_TUNE_APPLIED = 0,
  CLPAR_OCL_TUNE_NONE = 1,   /* no entry for this device, driver and CLBlast */
  CLPAR_OCL_TUNE_OFF = 2,    /* CLPAR_TUNE=off */
  CLPAR_OCL_TUNE_IGNORED = 3 /* an entry was there but stale, corrupt or unsafe: warned */
} clpar_ocl_tune_applied;

/* At device open: remembers CLBlast's own parameters for the device, then applies the saved
 * entry, if any and unless CLPAR_TUNE=off. Never fails the open: a bad entry is a warning. */
clpar_ocl_tune_applied clpar_ocl_tune_apply(clpar_ocl_device *d);
/* The entry file for d (whether or not it exists); -1 when there is no usable directory. */
int clpar_ocl_tune_path(clpar_ocl_device *d, char *path, size_t size);
/* The backend's tune_gemm entry (backend.h); runs on the device's worker. */
clpar_status ocl_tune_gemm(void *dev, const clpar_gemm_shape *shapes, int n_shapes,
                           const clpar_tune_options *options, clpar_tune_result *result);
#endif

#endif
