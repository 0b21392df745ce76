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

#endif
