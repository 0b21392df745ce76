/* dist.c — joining an MPI job: rank, world size, local rank and the process's default
 * device, and a few collectives on host memory. Built without MPI (CLPAR_MPI=OFF, or no MPI
 * found), every function reports CLPAR_ERROR_UNSUPPORTED so that programs still link.
 *
 * The library talks over its own duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN: a
 * failed call becomes a clpar_status, never an abort, and the program's own collectives on
 * MPI_COMM_WORLD cannot interleave with the library's. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

#ifndef CLPAR_HAVE_MPI

static clpar_status no_mpi(const char *fn) {
  return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                         "%s: clpar was built without MPI (CMake option CLPAR_MPI)", fn);
}

int clpar_dist_available(void) {
  return 0;
}
clpar_status clpar_dist_init(void) {
  return no_mpi("clpar_dist_init");
}
void clpar_dist_finalize(void) {}
int clpar_dist_rank(void) {
  return -1;
}
int clpar_dist_world_size(void) {
  return -1;
}
int clpar_dist_local_rank(void) {
  return -1;
}
int clpar_dist_local_size(void) {
  return -1;
}
clpar_device *clpar_dist_device(void) {
  return NULL;
}
clpar_status clpar_dist_all_reduce_sum(float *data, int64_t n) {
  (void)data, (void)n;
  return no_mpi("clpar_dist_all_reduce_sum");
}
clpar_status clpar_dist_all_reduce_mean(float *data, int64_t n) {
  (void)data, (void)n;
  return no_mpi("clpar_dist_all_reduce_mean");
}
clpar_status clpar_dist_barrier(void) {
  return no_mpi("clpar_dist_barrier");
}
clpar_status clpar_ddp_create(clpar_module *module, const clpar_ddp_options *options,
                              clpar_module **out) {
  (void)options, (void)out;
  clpar_module_free(module);
  return no_mpi("clpar_ddp_create");
}
clpar_status clpar_ddp_synchronize(clpar_module *ddp) {
  (void)ddp;
  return no_mpi("clpar_ddp_synchronize");
}
clpar_status clpar_ddp_set_sync(clpar_module *ddp, int sync) {
  (void)ddp, (void)sync;
  return no_mpi("clpar_ddp_set_sync");
}
clpar_status clpar_ddp_stats_get(const clpar_module *ddp, clpar_ddp_stats *out) {
  (void)ddp, (void)out;
  return no_mpi("clpar_ddp_stats_get");
}

#else

#include "dist/dist_internal.h"

static struct {
  pthread_mutex_t lock; /* guards the fields below (init and finalize) */
  int refs;
  int we_initialized_mpi;
  int thread_multiple;
  MPI_Comm world, local;
  int rank, size, local_rank, local_size;
  clpar_device *device;
} g = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, MPI_COMM_NULL, MPI_COMM_NULL, -1, -1, -1, -1, NULL};

static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;

void clpar_mpi_lock(void) {
  if (!g.thread_multiple) pthread_mutex_lock(&mpi_lock);
}
void clpar_mpi_unlock(void) {
  if (!g.thread_multiple) pthread_mutex_unlock(&mpi_lock);
}

clpar_status clpar_mpi_error(int code, const char *what) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) msg[0] = '\0';
  return clpar_set_error(CLPAR_ERROR_BACKEND, "%s: MPI failed: %s (error %d)", what, msg, code);
}

MPI_Comm clpar_dist_comm(void) {
  return g.world;
}

int clpar_dist_available(void) {
  return 1;
}

static void free_comms(void) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (g.local != MPI_COMM_NULL) MPI_Comm_free(&g.local);
    if (g.world != MPI_COMM_NULL) MPI_Comm_free(&g.world);
  }
  g.local = g.world = MPI_COMM_NULL;
}

/* MPI up with enough thread support, and the library's communicators made. */
static clpar_status join_job(void) {
  int inited = 0, provided = MPI_THREAD_SINGLE, rc;
  MPI_Initialized(&inited);
  if (!inited) {
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return clpar_mpi_error(rc, "clpar_dist_init: MPI_Init_thread");
    g.we_initialized_mpi = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    if (g.we_initialized_mpi) MPI_Finalize();
    g.we_initialized_mpi = 0;
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "clpar_dist_init: MPI gives thread level %d; DistributedDataParallel "
                           "calls MPI from a communication thread and needs at least "
                           "MPI_THREAD_SERIALIZED (initialize MPI with MPI_Init_thread)",
                           provided);
  }
  g.thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  rc = MPI_Comm_dup(MPI_COMM_WORLD, &g.world);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(g.world, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(g.world, &g.rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(g.world, &g.size);
  /* Ranks that share memory share a host: the local rank picks the device (as llm.c). */
  if (rc == MPI_SUCCESS)
    rc = MPI_Comm_split_type(g.world, MPI_COMM_TYPE_SHARED, g.rank, MPI_INFO_NULL, &g.local);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(g.local, &g.local_rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(g.local, &g.local_size);
  if (rc != MPI_SUCCESS) {
    clpar_status s = clpar_mpi_error(rc, "clpar_dist_init: making the library's communicators");
    free_comms();
    return s;
  }
  return CLPAR_OK;
}

static void leave_job(void) {
  free_comms();
  if (g.we_initialized_mpi) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  g.we_initialized_mpi = 0;
  g.rank = g.size = g.local_rank = g.local_size = -1;
  g.device = NULL;
}

clpar_status clpar_dist_init(void) {
  pthread_mutex_lock(&g.lock);
  clpar_status s = CLPAR_OK;
  if (g.refs == 0) {
    s = join_job();
    if (s == CLPAR_OK) {
      s = clpar_init();
      if (s != CLPAR_OK) leave_job();
    }
    if (s == CLPAR_OK) {
      int count = clpar_device_count();
      g.device = count > 0 ? clpar_device_get(g.local_rank % count) : NULL;
      if (!g.device) {
        s = clpar_set_error(CLPAR_ERROR_DEVICE_NOT_FOUND, "clpar_dist_init: no device");
        clpar_shutdown();
        leave_job();
      }
    }
  }
  if (s == CLPAR_OK) g.refs++;
  pthread_mutex_unlock(&g.lock);
  return s;
}

void clpar_dist_finalize(void) {
  pthread_mutex_lock(&g.lock);
  if (g.refs > 0 && --g.refs == 0) {
    clpar_shutdown();
    leave_job();
  }
  pthread_mutex_unlock(&g.lock);
}

int clpar_dist_rank(void) {
  return g.rank;
}
int clpar_dist_world_size(void) {
  return g.size;
}
int clpar_dist_local_rank(void) {
  return g.local_rank;
}
int clpar_dist_local_size(void) {
  return g.local_size;
}
clpar_device *clpar_dist_device(void) {
  return g.device;
}

static clpar_status all_reduce(const char *fn, float *data, int64_t n, int mean) {
  if (g.world == MPI_COMM_NULL)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_dist_init first", fn);
  if (!data || n < 0 || n > INT_MAX)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %lld floats at %p", fn, (long long)n,
                           (void *)data);
  clpar_mpi_lock();
  int rc = MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, g.world);
  clpar_mpi_unlock();
  if (rc != MPI_SUCCESS) return clpar_mpi_error(rc, fn);
  if (mean)
    for (int64_t i = 0; i < n; i++) data[i] /= (float)g.size;
  return CLPAR_OK;
}

clpar_status clpar_dist_all_reduce_sum(float *data, int64_t n) {
  return all_reduce("clpar_dist_all_reduce_sum", data, n, 0);
}
clpar_status clpar_dist_all_reduce_mean(float *data, int64_t n) {
  return all_reduce("clpar_dist_all_reduce_mean", data, n, 1);
}

clpar_status clpar_dist_barrier(void) {
  if (g.world == MPI_COMM_NULL)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                           "clpar_dist_barrier: call clpar_dist_init first");
  clpar_mpi_lock();
  int rc = MPI_Barrier(g.world);
  clpar_mpi_unlock();
  return rc == MPI_SUCCESS ? CLPAR_OK : clpar_mpi_error(rc, "clpar_dist_barrier");
}

#endif
