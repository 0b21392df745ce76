/* ocl_tune_internal.h — private to the GEMM tuner's files: ocl_tune.c (timing and the
 * search), ocl_tune_entry.c (the saved entry: its format, checks and trusted file I/O) and
 * ocl_tune_candidates.c (the parameter sets tried). */
#ifndef CLPAR_OCL_TUNE_INTERNAL_H
#define CLPAR_OCL_TUNE_INTERNAL_H

#include <stdint.h>

#include "ocl_tune.h"

#ifndef CLPAR_CLBLAST_VERSION
#define CLPAR_CLBLAST_VERSION "unknown"
#endif
#define TUNE_FORMAT "clpar-tune 2"
#define TUNE_MAX_FILE 16384
#define TUNE_MAX_VALUE ((size_t)1 << 20)
#define SAMPLES 48
/* Candidates per kernel when the caller does not say: Xgemm, XgemmDirect, and each of the
 * indirect path's pad and transpose kernels. Each costs a compilation of CLBlast's GEMM
 * program (on PoCL 10-20 s for Xgemm's and the helpers', 20-40 s for XgemmDirect's, which
 * has four kernels), so a default run on the MLP of bench/train_step takes about 10 minutes
 * on 2 busy cores. */
#define DEFAULT_XGEMM_CANDIDATES 16
#define DEFAULT_DIRECT_CANDIDATES 8
#define DEFAULT_HELPER_CANDIDATES 4

/* CLBlast's names (its database's) for the kernels its GEMM runs: the indirect kernel, the
 * direct one, the switch-over size between them, and the indirect path's helpers that pad
 * (CopyPadMatrix, and CopyMatrix when C is copied back), transpose whole tiles
 * (TransposeMatrixFast) and transpose with padding (TransposePadMatrix, TransposeMatrix).
 * "Copy" (CopyMatrixFast) is not here: a real-valued GEMM never runs it (it is chosen only
 * where the source needs neither padding nor transposing, and then the GEMM copies nothing),
 * so it keeps CLBlast's parameters. */
static const char *const kernels[] = {"Xgemm", "XgemmDirect", "GemmRoutine",
                                      "Pad",   "Transpose",   "Padtranspose"};
enum { K_XGEMM, K_DIRECT, K_ROUTINE, K_PAD, K_TRA, K_PADTRA, K_COUNT };
/* A parameter each kernel must have in this CLBlast, or the tuner refuses to run. */
static const char *const kernel_key[] = {"MWG",      "WGD",     "XGEMM_MIN_INDIRECT_SIZE",
                                         "PAD_DIMX", "TRA_DIM", "PADTRA_TILE"};

/* A 64-bit linear congruential generator: the tuner's random choices repeat run to run. */
static inline uint64_t lcg(uint64_t *state) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return *state >> 11;
}

/* ---- ocl_tune_entry.c ---- */

/* Overrides CLBlast's parameters of kernels[kernel] on dev with p; 0 on success. */
int clpar_ocl_params_apply(cl_device_id dev, int kernel, const clpar_ocl_params *p);
/* The value of name in p; NULL if p has no such parameter. */
size_t *clpar_ocl_param(clpar_ocl_params *p, const char *name);
/* 0 and out filled when CLBlast's defaults for dev are known (taken now if first asked). */
int clpar_ocl_tune_defaults(cl_device_id dev, clpar_ocl_params out[K_COUNT]);
/* CL_DEVICE_LOCAL_MEM_SIZE of dev; 0 when unknown. */
size_t clpar_ocl_local_mem(cl_device_id dev);
/* Writes p as d's entry in the cache directory; its path into path. */
clpar_status clpar_ocl_tune_save(clpar_ocl_device *d, const clpar_ocl_params p[K_COUNT], char *path,
                                 size_t path_size);

/* ---- ocl_tune_candidates.c: up to count candidates each, into out; returns how many ---- */

/* Sets name=value in p; 0 if p has that parameter. */
int clpar_ocl_param_set(clpar_ocl_params *p, const char *name, size_t value);
int clpar_ocl_xgemm_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
                               int count);
int clpar_ocl_direct_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
                                int count);
int clpar_ocl_pad_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
                             int count);
int clpar_ocl_transpose_candidates(const clpar_ocl_params *base, size_t max_wg, size_t local_mem,
                                   clpar_ocl_params *out, int count);
int clpar_ocl_padtranspose_candidates(const clpar_ocl_params *base, size_t max_wg, size_t local_mem,
                                      clpar_ocl_params *out, int count);

#endif
