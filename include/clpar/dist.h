/* dist.h — distributed training over MPI: one process per device, on one machine or several,
 * started with mpirun (README, "DistributedDataParallel"). Nothing here needs mpi.h: a
 * program compiles the same whether the library was built with MPI or not, and where it was
 * not (CMake option CLPAR_MPI), every call returns CLPAR_ERROR_UNSUPPORTED. */
#ifndef CLPAR_DIST_H
#define CLPAR_DIST_H

#include <stdint.h>

#include "device.h"
#include "export.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the library was built with MPI, 0 otherwise. */
CLPAR_API int clpar_dist_available(void);

/* Joins the job: initializes MPI when the program has not (asking for MPI_THREAD_MULTIPLE;
 * a program that initialized MPI itself must have asked for at least MPI_THREAD_SERIALIZED,
 * and with less than MULTIPLE must not call MPI while a backward runs), finds this process's
 * rank, the world size and its local rank (its index among the ranks on the same host), then
 * calls clpar_init. Safe to call more than once; each successful call needs one
 * clpar_dist_finalize, the last of which calls clpar_shutdown and finalizes MPI if
 * clpar_dist_init initialized it. Free DistributedDataParallel modules before it. */
CLPAR_API clpar_status clpar_dist_init(void);
CLPAR_API void clpar_dist_finalize(void);

/* -1 before clpar_dist_init. */
CLPAR_API int clpar_dist_rank(void);
CLPAR_API int clpar_dist_world_size(void);
/* Index among the ranks on this host, and how many there are (MPI_COMM_TYPE_SHARED). */
CLPAR_API int clpar_dist_local_rank(void);
CLPAR_API int clpar_dist_local_size(void);
/* This process's device: entry (local rank mod count) of the selected devices. Without
 * CLPAR_DEVICES that spreads the ranks of a host over its devices; CLPAR_DEVICES chooses the
 * list it picks from (CLPAR_DEVICES=opencl:1 puts every rank on opencl:1). NULL before
 * clpar_dist_init. */
CLPAR_API clpar_device *clpar_dist_device(void);

/* In-place sum or mean of n floats (host memory) over every rank; every rank must call it,
 * in the same order as its other collectives. For logging a loss, counting samples, ... */
CLPAR_API clpar_status clpar_dist_all_reduce_sum(float *data, int64_t n);
CLPAR_API clpar_status clpar_dist_all_reduce_mean(float *data, int64_t n);
CLPAR_API clpar_status clpar_dist_barrier(void);

#ifdef __cplusplus
}
#endif
#endif
