/* cuda_nccl.c — NCCL for the CUDA backend's comm_ entries (backend.h): the all-reduce
 * of DistributedDataParallel's gradient buckets on the device, between processes, without the
 * host (src/dist/ddp_nccl.c). Built only with NCCL (CMake option CLPAR_NCCL,
 * cmake/ClparNCCL.cmake).
 *
 * Every communicator is non-blocking (ncclConfig_t.blocking = 0, NCCL 2.14+): no NCCL call
 * waits for another process. Init returns at once and finishes in the background; an
 * all-reduce that NCCL cannot enqueue at once (it connects to its peers the first time)
 * returns ncclInProgress, and we poll ncclCommGetAsyncError until it is on the stream, with a
 * deadline. So a process that never comes costs a timeout and an abort, never a hang.
 *
 * NCCL's calls on one communicator are not thread-safe, and the core polls (comm_query) and
 * aborts from its communication thread while the device's worker enqueues the all-reduces: a
 * mutex per communicator is held around every NCCL call on it. None of those calls waits for
 * other processes (non-blocking), so the lock is held briefly.
 *
 * Like the rest of the CUDA module, this was compiled and linked here but never run: the
 * development machine has no GPU. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "cuda/cuda_nccl.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "clpar needs NCCL 2.14 or newer (non-blocking communicators; ncclAvg since 2.10)"
#endif

_Static_assert(sizeof(ncclUniqueId) == CLPAR_COMM_ID_BYTES,
               "backend.h's CLPAR_COMM_ID_BYTES is NCCL's NCCL_UNIQUE_ID_BYTES");

typedef struct nccl_comm {
  pthread_mutex_t lock; /* around every NCCL call on comm */
  ncclComm_t comm;      /* NULL once aborted or destroyed */
  int aborted;
  int ordinal, rank, nranks; /* for messages */
} nccl_comm;

static void nap(long *ns) {
  struct timespec t = {0, *ns};
  nanosleep(&t, NULL);
  if (*ns < 1000000) *ns *= 2;
}

/* The error of a failed NCCL call, with NCCL's last message for comm (NULL: the process's). */
static clpar_status nccl_fail(const nccl_comm *c, const char *what, ncclResult_t r) {
  const char *last = ncclGetLastError(c ? c->comm : NULL);
  if (!last) last = "";
  if (c)
    return clpar_set_error(CLPAR_ERROR_BACKEND, "%s (NCCL rank %d of %d, CUDA device %d): %s%s%s",
                           what, c->rank, c->nranks, c->ordinal, ncclGetErrorString(r),
                           *last ? ": " : "", last);
  return clpar_set_error(CLPAR_ERROR_BACKEND, "%s: %s%s%s", what, ncclGetErrorString(r),
                         *last ? ": " : "", last);
}

static clpar_status aborted_error(const nccl_comm *c, const char *what) {
  return clpar_set_error(
      CLPAR_ERROR_BACKEND,
      "%s: the NCCL communicator (rank %d of %d) was aborted after an error or a "
      "timeout",
      what, c->rank, c->nranks);
}

clpar_status clpar_nccl_id(void *id, size_t bytes) {
  if (!id || bytes != sizeof(ncclUniqueId))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "ncclGetUniqueId: the id takes %zu bytes, not %zu", sizeof(ncclUniqueId),
                           bytes);
  int version = 0;
  if (ncclGetVersion(&version) == ncclSuccess)
    clpar_log(CLPAR_LOG_DEBUG, "NCCL %d.%d.%d (built against %d.%d.%d)", version / 10000,
              version / 100 % 100, version % 100, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return nccl_fail(NULL, "ncclGetUniqueId", r);
  memcpy(id, &u, sizeof u);
  return CLPAR_OK;
}

clpar_status clpar_nccl_init(int ordinal, const void *id, size_t bytes, int nranks, int rank,
                             void **out) {
  if (!id || bytes != sizeof(ncclUniqueId) || nranks < 1 || rank < 0 || rank >= nranks || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "ncclCommInitRankConfig: rank %d of %d, an id of %zu bytes", rank,
                           nranks, bytes);
  nccl_comm *c = calloc(1, sizeof *c);
  if (!c) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  pthread_mutex_init(&c->lock, NULL);
  c->ordinal = ordinal;
  c->rank = rank;
  c->nranks = nranks;
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0; /* init and every later call return at once; we poll with a deadline */
  ncclResult_t r = ncclCommInitRankConfig(&c->comm, nranks, u, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    clpar_status s = nccl_fail(c, "ncclCommInitRankConfig", r);
    if (c->comm) (void)ncclCommAbort(c->comm);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return s;
  }
  *out = c;
  return CLPAR_OK;
}

/* c->lock held. */
static clpar_status query_locked(nccl_comm *c, const char *what, int *pending) {
  *pending = 0;
  if (c->aborted || !c->comm) return aborted_error(c, what);
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(c->comm, &state);
  if (r != ncclSuccess) return nccl_fail(c, "ncclCommGetAsyncError", r);
  if (state == ncclInProgress) {
    *pending = 1;
    return CLPAR_OK;
  }
  return state == ncclSuccess ? CLPAR_OK : nccl_fail(c, what, state);
}

clpar_status clpar_nccl_query(void *comm, int *pending) {
  nccl_comm *c = comm;
  pthread_mutex_lock(&c->lock);
  clpar_status s = query_locked(c, "the NCCL communicator", pending);
  pthread_mutex_unlock(&c->lock);
  return s;
}

/* c->lock held. */
static void abort_locked(nccl_comm *c) {
  if (c->comm && !c->aborted) {
    ncclResult_t r = ncclCommAbort(c->comm);
    if (r != ncclSuccess)
      clpar_log(CLPAR_LOG_WARN, "ncclCommAbort (NCCL rank %d of %d): %s", c->rank, c->nranks,
                ncclGetErrorString(r));
  }
  c->comm = NULL;
  c->aborted = 1;
}

clpar_status clpar_nccl_abort(void *comm) {
  nccl_comm *c = comm;
  pthread_mutex_lock(&c->lock);
  abort_locked(c);
  pthread_mutex_unlock(&c->lock);
  return CLPAR_OK;
}

clpar_status clpar_nccl_free(void *comm, double timeout_s) {
  nccl_comm *c = comm;
  if (!c) return CLPAR_OK;
  clpar_status s = CLPAR_OK;
  pthread_mutex_lock(&c->lock);
  if (c->comm && !c->aborted) {
    /* flush (non-blocking: ncclInProgress until done), then destroy without waiting */
    ncclResult_t r = ncclCommFinalize(c->comm);
    int pending = r == ncclInProgress;
    if (r != ncclSuccess && r != ncclInProgress) s = nccl_fail(c, "ncclCommFinalize", r);
    double deadline = clpar_clock_seconds() + timeout_s;
    long ns = 10000;
    while (s == CLPAR_OK && pending) {
      pthread_mutex_unlock(&c->lock);
      nap(&ns);
      pthread_mutex_lock(&c->lock);
      s = query_locked(c, "ncclCommFinalize", &pending);
      if (s == CLPAR_OK && pending && clpar_clock_seconds() > deadline)
        s = clpar_set_error(CLPAR_ERROR_TIMEOUT,
                            "ncclCommFinalize (NCCL rank %d of %d) did not complete within %g s",
                            c->rank, c->nranks, timeout_s);
    }
    if (s == CLPAR_OK) {
      r = ncclCommDestroy(c->comm);
      if (r != ncclSuccess) s = nccl_fail(c, "ncclCommDestroy", r);
      c->comm = NULL;
    }
    if (s != CLPAR_OK) abort_locked(c); /* frees what is left, waiting for nobody */
  }
  pthread_mutex_unlock(&c->lock);
  pthread_mutex_destroy(&c->lock);
  free(c);
  return s;
}

clpar_status clpar_nccl_allreduce(void *comm, float *data, size_t n, cudaStream_t stream,
                                  double timeout_s) {
  nccl_comm *c = comm;
  const char *what = "ncclAllReduce(ncclFloat, ncclAvg)";
  pthread_mutex_lock(&c->lock);
  int pending = 0;
  /* the communicator must be idle (init done, the previous call enqueued) before a new call */
  clpar_status s = query_locked(c, what, &pending);
  double deadline = clpar_clock_seconds() + timeout_s;
  long ns = 10000;
  int enqueued = 0;
  while (s == CLPAR_OK) {
    if (!pending && !enqueued) {
      ncclResult_t r = ncclAllReduce(data, data, n, ncclFloat, ncclAvg, c->comm, stream);
      enqueued = 1;
      if (r == ncclInProgress)
        pending = 1;
      else if (r != ncclSuccess)
        s = nccl_fail(c, what, r);
    }
    if (s != CLPAR_OK || !pending) break;
    if (clpar_clock_seconds() > deadline) {
      s = clpar_set_error(CLPAR_ERROR_TIMEOUT,
                          "%s (NCCL rank %d of %d, %zu floats): NCCL could not %s within %g s (a "
                          "rank has not joined?)",
                          what, c->rank, c->nranks, n,
                          enqueued ? "enqueue it" : "finish setting the communicator up",
                          timeout_s);
      break;
    }
    pthread_mutex_unlock(&c->lock); /* comm_query and comm_abort may come in meanwhile */
    nap(&ns);
    pthread_mutex_lock(&c->lock);
    s = query_locked(c, what, &pending);
  }
  pthread_mutex_unlock(&c->lock);
  if (ns > 10000) clpar_backend_waited(); /* the worker napped: NCCL was connecting */
  return s;
}
