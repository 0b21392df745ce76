/* cuda_nccl.h — NCCL communicators behind the CUDA backend's comm_ entries (backend.h),
 * implemented in cuda_nccl.c, which is built only with NCCL (CMake option CLPAR_NCCL). The
 * backend's entries make their device current and pass its stream; NCCL's own types stay in
 * cuda_nccl.c, and the core sees a communicator as an opaque handle. */
#ifndef CLPAR_CUDA_NCCL_H
#define CLPAR_CUDA_NCCL_H

#include <cuda_runtime_api.h>

#include "backend.h"

/* A new ncclUniqueId into id (bytes == CLPAR_COMM_ID_BYTES). */
clpar_status clpar_nccl_id(void *id, size_t bytes);
/* Starts ncclCommInitRankConfig as a non-blocking communicator on the current device
 * (ordinal, for messages); *comm at once, ready when clpar_nccl_query says so. */
clpar_status clpar_nccl_init(int ordinal, const void *id, size_t bytes, int nranks, int rank,
                             void **comm);
/* ncclCommGetAsyncError: *pending while NCCL still works in the background; an error names it. */
clpar_status clpar_nccl_query(void *comm, int *pending);
/* ncclCommAbort, once; the handle stays valid (later calls fail) until clpar_nccl_free. */
clpar_status clpar_nccl_abort(void *comm);
/* ncclCommFinalize, then ncclCommDestroy once NCCL has flushed (waiting at most timeout_s
 * seconds, else ncclCommAbort); frees the handle. */
clpar_status clpar_nccl_free(void *comm, double timeout_s);
/* ncclAllReduce(ncclAvg) of data[0 .. n) in place, enqueued on stream; waits at most
 * timeout_s seconds while NCCL is still enqueueing it (ncclInProgress). */
clpar_status clpar_nccl_allreduce(void *comm, float *data, size_t n, cudaStream_t stream,
                                  double timeout_s);

#endif
