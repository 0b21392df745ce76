/* dist_internal.h — what dist.c shares with ddp.c: the library's own communicators and the
 * lock that serializes clpar's MPI calls when MPI gives less than MPI_THREAD_MULTIPLE. */
#ifndef CLPAR_DIST_INTERNAL_H
#define CLPAR_DIST_INTERNAL_H

#include <mpi.h>

#include "clpar/dist.h"

/* A duplicate of MPI_COMM_WORLD (errors returned, not fatal), so that the library's
 * collectives never interleave with the program's own; MPI_COMM_NULL before clpar_dist_init. */
MPI_Comm clpar_dist_comm(void);
/* Around every MPI call the library makes: a no-op under MPI_THREAD_MULTIPLE. */
void clpar_mpi_lock(void);
void clpar_mpi_unlock(void);
/* Sets the thread's error from an MPI error code: "what: <MPI's message>". */
clpar_status clpar_mpi_error(int code, const char *what);

/* Waits for a non-blocking collective's request with the job's deadline (CLPAR_DIST_TIMEOUT):
 * polls MPI_Test (taking the lock above for each call) with short sleeps, answers other ranks'
 * "where are you?" questions, logs a warning naming the collective after min(60 s, half the
 * timeout), and at the deadline asks every rank where it is and returns CLPAR_ERROR_TIMEOUT
 * naming `what`, its sequence number seq and the ranks that did not answer. After a timeout
 * the request is left pending (MPI cannot cancel a collective): the caller must not free or
 * reuse the buffers it gave, and every later collective of clpar fails at once. */
clpar_status clpar_dist_wait(MPI_Request *req, const char *what, uint64_t seq);
/* clpar_dist_wait for anything else (NCCL's collectives on a device, src/dist/ddp_nccl.c):
 * poll(user, &status, what) returns 1 when the collective has finished, with status CLPAR_OK
 * or its error (returned as it is), 0 while it has not. The same deadline, warning, "where
 * are you?" answers and timeout message as clpar_dist_wait; poll runs without the MPI lock. */
typedef int (*clpar_dist_poll_fn)(void *user, clpar_status *status, const char *what);
clpar_status clpar_dist_wait_for(clpar_dist_poll_fn poll, void *user, const char *what,
                                 uint64_t seq);
/* Nonzero once a collective has timed out; with the status set naming that collective. */
int clpar_dist_check_broken(void);
/* The same, without setting the status. */
int clpar_dist_is_broken(void);
/* With CLPAR_DIST_DEBUG=1, before a collective on comm: every rank's (what, seq, bytes) is
 * all-gathered and the first rank whose entry differs from rank 0's makes every rank fail
 * with the same message (CLPAR_ERROR_INVALID_ARGUMENT), before any runs the collective, so
 * the ranks stay in step. CLPAR_OK at once without the debug mode. */
clpar_status clpar_dist_debug_check(MPI_Comm comm, const char *what, uint64_t seq, int64_t bytes);
/* MPI_Allreduce / MPI_Bcast with the deadline, through a staging copy that is left allocated
 * when the collective times out, so that buf is free to reuse whatever happens. */
clpar_status clpar_dist_allreduce(void *buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                                  const char *what, uint64_t seq);
clpar_status clpar_dist_bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
                              const char *what, uint64_t seq);

/* How DistributedDataParallel reduces gradients: CLPAR_DIST_BACKEND, read and checked by
 * clpar_dist_init. AUTO: NCCL on the device when every rank's module lives on one CUDA device
 * with NCCL, else MPI through host memory; MPI: always MPI; NCCL: NCCL or an error. */
enum { CLPAR_DIST_BACKEND_AUTO = 0, CLPAR_DIST_BACKEND_MPI = 1, CLPAR_DIST_BACKEND_NCCL = 2 };
/* *mode from a value of CLPAR_DIST_BACKEND: "auto" (or NULL, or empty), "mpi" or "nccl"
 * (any case); CLPAR_ERROR_INVALID_ARGUMENT naming the value otherwise. */
clpar_status clpar_dist_parse_backend(const char *value, int *mode);
int clpar_dist_backend_mode(void);
/* For tests: the mode as CLPAR_DIST_BACKEND=value would set it (checked the same way). */
clpar_status clpar_dist_set_backend(const char *value);

/* For tests: 1 gives DistributedDataParallel's buckets pinned memory (the device's host_alloc)
 * on CPU devices too, so that the path GPUs take runs here (src/dist/ddp.c; default 0). */
extern int clpar_ddp_pin_cpu;

#endif
