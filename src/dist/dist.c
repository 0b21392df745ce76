/* dist.c — joining an MPI job: rank, world size, local rank and the process's default
 * device, and a few collectives on host memory. Built without MPI (CLPAR_MPI=OFF, or no MPI
 * found), every function reports CLPAR_ERROR_UNSUPPORTED so that programs still link.
 *
 * The library talks over its own duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN: a
 * failed call becomes a clpar_status, never an abort, and the program's own collectives on
 * MPI_COMM_WORLD cannot interleave with the library's.
 *
 * Every collective is non-blocking MPI polled against CLPAR_DIST_TIMEOUT (clpar_dist_wait);
 * a second duplicate carries "where are you?" questions and answers between waiting ranks,
 * so that a timeout names the ranks that did not arrive. CLPAR_DIST_DEBUG all-gathers what
 * each rank is about to run before each collective. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

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
clpar_status clpar_dist_all_reduce_max(float *data, int64_t n) {
  (void)data, (void)n;
  return no_mpi("clpar_dist_all_reduce_max");
}
clpar_status clpar_dist_barrier(void) {
  return no_mpi("clpar_dist_barrier");
}
clpar_status clpar_dist_abort(int code) {
  (void)code;
  return no_mpi("clpar_dist_abort");
}
double clpar_dist_timeout(void) {
  return -1;
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
const char *clpar_ddp_backend(const clpar_module *ddp, const char **why) {
  (void)ddp;
  if (why) *why = "clpar was built without MPI (CMake option CLPAR_MPI)";
  return NULL;
}

#else

#include "dist/dist_internal.h"

enum { WHAT_SIZE = 120, BROKEN_SIZE = 1024, TAG_ASK = 1, TAG_ANSWER = 2 };

static struct {
  pthread_mutex_t lock; /* guards the fields below (init and finalize) */
  int refs;
  int we_initialized_mpi;
  int thread_multiple;
  MPI_Comm world, local;
  MPI_Comm ask; /* "where are you?" messages between waiting ranks (clpar_dist_wait) */
  int rank, size, local_rank, local_size;
  clpar_device *device;
  double timeout; /* CLPAR_DIST_TIMEOUT, seconds */
  int debug;      /* CLPAR_DIST_DEBUG */
  int backend;    /* CLPAR_DIST_BACKEND: CLPAR_DIST_BACKEND_AUTO, _MPI or _NCCL */
  uint64_t seq;   /* collectives on world so far */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER,
       .world = MPI_COMM_NULL,
       .local = MPI_COMM_NULL,
       .ask = MPI_COMM_NULL,
       .rank = -1,
       .size = -1,
       .local_rank = -1,
       .local_size = -1,
       .timeout = 600};

/* Set by the first timeout, with its message: the job's collectives are out of step. */
static atomic_int broken;
static char broken_message[BROKEN_SIZE];

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
  if (!finalized && !atomic_load(&broken)) { /* after a timeout, requests are left pending */
    if (g.local != MPI_COMM_NULL) MPI_Comm_free(&g.local);
    if (g.ask != MPI_COMM_NULL) MPI_Comm_free(&g.ask);
    if (g.world != MPI_COMM_NULL) MPI_Comm_free(&g.world);
  }
  g.local = g.ask = g.world = MPI_COMM_NULL;
}

/* MPI up with enough thread support, and the library's communicators made. */
static clpar_status join_job(void) {
  int inited = 0, finalized = 0, provided = MPI_THREAD_SINGLE, rc;
  /* any MPI call after MPI_Finalize (but these two) ends the process */
  MPI_Finalized(&finalized);
  if (finalized)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                           "clpar_dist_init: MPI was finalized in this process (by the last "
                           "clpar_dist_finalize, or by the program) and cannot start again; "
                           "call clpar_dist_finalize once, at the end of the job");
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
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(g.world, &g.ask);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(g.ask, MPI_ERRORS_RETURN);
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
    /* MPI_Finalize synchronizes with every process: after a timeout it could wait forever */
    if (!finalized && !atomic_load(&broken)) MPI_Finalize();
    if (atomic_load(&broken))
      clpar_log(CLPAR_LOG_WARN,
                "clpar_dist_finalize: not finalizing MPI after a timeout (%s); end the job with "
                "clpar_dist_abort",
                broken_message);
  }
  g.we_initialized_mpi = 0;
  g.rank = g.size = g.local_rank = g.local_size = -1;
  g.device = NULL;
}

/* CLPAR_DIST_TIMEOUT: a positive number of seconds, at most a year; 600 when unset. */
static clpar_status read_timeout(double *out) {
  const char *v = getenv("CLPAR_DIST_TIMEOUT");
  *out = 600;
  if (!v || !*v) return CLPAR_OK;
  char *end = NULL;
  double t = strtod(v, &end);
  if (end == v || *end || !isfinite(t) || t <= 0 || t > 31536000.0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_dist_init: CLPAR_DIST_TIMEOUT=\"%.64s\" is not a timeout: give "
                           "a positive number of seconds (at most 31536000)",
                           v);
  *out = t;
  return CLPAR_OK;
}

/* CLPAR_DIST_DEBUG: 0 or 1; 0 when unset. */
static clpar_status read_debug(int *out) {
  const char *v = getenv("CLPAR_DIST_DEBUG");
  *out = 0;
  if (!v || !*v) return CLPAR_OK;
  if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_dist_init: CLPAR_DIST_DEBUG=\"%.64s\": give 0 or 1", v);
  *out = v[0] == '1';
  return CLPAR_OK;
}

clpar_status clpar_dist_parse_backend(const char *v, int *mode) {
  *mode = CLPAR_DIST_BACKEND_AUTO;
  if (!v || !*v || !strcasecmp(v, "auto")) return CLPAR_OK;
  if (!strcasecmp(v, "mpi")) {
    *mode = CLPAR_DIST_BACKEND_MPI;
    return CLPAR_OK;
  }
  if (!strcasecmp(v, "nccl")) {
    *mode = CLPAR_DIST_BACKEND_NCCL;
    return CLPAR_OK;
  }
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "CLPAR_DIST_BACKEND=\"%.64s\": give auto (NCCL on CUDA devices when "
                         "clpar has it, else MPI), mpi or nccl",
                         v);
}

int clpar_dist_backend_mode(void) {
  return g.backend;
}

clpar_status clpar_dist_set_backend(const char *value) {
  int mode;
  clpar_status s = clpar_dist_parse_backend(value, &mode);
  if (s == CLPAR_OK) g.backend = mode;
  return s;
}

double clpar_dist_timeout(void) {
  return g.refs > 0 ? g.timeout : -1;
}

clpar_status clpar_dist_init(void) {
  pthread_mutex_lock(&g.lock);
  clpar_status s = CLPAR_OK;
  if (g.refs == 0) {
    double timeout;
    s = read_timeout(&timeout);
    if (s == CLPAR_OK) g.timeout = timeout;
    int debug;
    if (s == CLPAR_OK) s = read_debug(&debug);
    if (s == CLPAR_OK) g.debug = debug;
    int backend;
    if (s == CLPAR_OK && clpar_dist_parse_backend(getenv("CLPAR_DIST_BACKEND"), &backend)) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s", clpar_last_error());
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_dist_init: %s", msg);
    }
    if (s == CLPAR_OK) g.backend = backend;
    if (s == CLPAR_OK) s = join_job();
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

/* mean: 0 sum, 1 mean, 2 max. */
static clpar_status all_reduce(const char *fn, float *data, int64_t n, int mean) {
  if (g.world == MPI_COMM_NULL)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_dist_init first", fn);
  if (!data || n < 0 || n > INT_MAX)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %lld floats at %p", fn, (long long)n,
                           (void *)data);
  char what[WHAT_SIZE];
  snprintf(what, sizeof what, "%s (%lld floats)", fn, (long long)n);
  clpar_status s = clpar_dist_allreduce(data, (int)n, MPI_FLOAT, mean == 2 ? MPI_MAX : MPI_SUM,
                                        g.world, what, ++g.seq);
  if (s != CLPAR_OK) return s;
  if (mean == 1)
    for (int64_t i = 0; i < n; i++) data[i] /= (float)g.size;
  return CLPAR_OK;
}

clpar_status clpar_dist_all_reduce_sum(float *data, int64_t n) {
  return all_reduce("clpar_dist_all_reduce_sum", data, n, 0);
}
clpar_status clpar_dist_all_reduce_mean(float *data, int64_t n) {
  return all_reduce("clpar_dist_all_reduce_mean", data, n, 1);
}
clpar_status clpar_dist_all_reduce_max(float *data, int64_t n) {
  return all_reduce("clpar_dist_all_reduce_max", data, n, 2);
}

clpar_status clpar_dist_barrier(void) {
  if (g.world == MPI_COMM_NULL)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                           "clpar_dist_barrier: call clpar_dist_init first");
  if (clpar_dist_check_broken()) return CLPAR_ERROR_TIMEOUT;
  uint64_t seq = ++g.seq;
  clpar_status s = clpar_dist_debug_check(g.world, "clpar_dist_barrier", seq, 0);
  if (s != CLPAR_OK) return s;
  MPI_Request req = MPI_REQUEST_NULL;
  clpar_mpi_lock();
  int rc = MPI_Ibarrier(g.world, &req);
  clpar_mpi_unlock();
  if (rc != MPI_SUCCESS) return clpar_mpi_error(rc, "clpar_dist_barrier");
  return clpar_dist_wait(&req, "clpar_dist_barrier", seq);
}

clpar_status clpar_dist_abort(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                           "clpar_dist_abort: MPI is not running, there is no job to abort");
  int rc = MPI_Abort(MPI_COMM_WORLD, code); /* returns only if MPI could not abort */
  return clpar_mpi_error(rc, "clpar_dist_abort: MPI_Abort");
}

/* ---- collectives with a deadline ---- */

int clpar_dist_is_broken(void) {
  return atomic_load(&broken);
}

int clpar_dist_check_broken(void) {
  if (!atomic_load(&broken)) return 0;
  clpar_set_error(CLPAR_ERROR_TIMEOUT,
                  "an earlier collective timed out (%s); clpar makes no more collectives in this "
                  "job: end it with clpar_dist_abort",
                  broken_message);
  return 1;
}

/* Where a waiting rank is: its collective and sequence number. */
typedef struct {
  uint64_t seq;
  char what[WHAT_SIZE];
} where_msg;

/* Answers the "where are you?" questions that have come in, at most one per rank of the
 * job: a rank that keeps asking cannot hold this one away from its own collective and its
 * deadline (the rest wait for the next poll). The mpi lock held. */
static void answer_questions(const char *what, uint64_t seq) {
  for (int k = 0; k < g.size; k++) {
    /* matched probes: two threads waiting at once cannot take each other's message */
    int flag = 0, dummy;
    MPI_Status st;
    MPI_Message msg;
    if (MPI_Improbe(MPI_ANY_SOURCE, TAG_ASK, g.ask, &flag, &msg, &st) != MPI_SUCCESS || !flag)
      return;
    if (MPI_Mrecv(&dummy, 1, MPI_INT, &msg, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    where_msg m = {seq, ""};
    snprintf(m.what, sizeof m.what, "%s", what);
    /* a few bytes: sent eagerly, so this does not wait for the asker */
    MPI_Send(&m, (int)sizeof m, MPI_BYTE, st.MPI_SOURCE, TAG_ANSWER, g.ask);
  }
}

/* Takes the answers that have come in, at most one per rank as answer_questions (drops them
 * with answers NULL); the mpi lock held. */
static void take_answers(where_msg *answers, int *answered) {
  for (int k = 0; k < g.size; k++) {
    int flag = 0;
    MPI_Status st;
    MPI_Message msg;
    if (MPI_Improbe(MPI_ANY_SOURCE, TAG_ANSWER, g.ask, &flag, &msg, &st) != MPI_SUCCESS || !flag)
      return;
    where_msg m;
    if (MPI_Mrecv(&m, (int)sizeof m, MPI_BYTE, &msg, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    if (answers && st.MPI_SOURCE >= 0 && st.MPI_SOURCE < g.size) {
      m.what[WHAT_SIZE - 1] = '\0';
      answers[st.MPI_SOURCE] = m;
      answered[st.MPI_SOURCE] = 1;
    }
  }
}

/* Asks every other rank where it is (answers come while we poll); the mpi lock held. */
static void ask_everyone(void) {
  static const int question = 0; /* never changes: the sends may stay pending */
  take_answers(NULL, NULL);      /* stale answers to an earlier question */
  for (int r = 0; r < g.size; r++) {
    if (r == g.rank) continue;
    MPI_Request req;
    if (MPI_Isend(&question, 1, MPI_INT, r, TAG_ASK, g.ask, &req) == MPI_SUCCESS)
      MPI_Request_free(&req);
  }
}

/* The timeout's message: what each rank said, and who did not answer. */
static clpar_status timed_out(const char *what, uint64_t seq, double waited,
                              const where_msg *answers, const int *answered) {
  char text[BROKEN_SIZE];
  size_t len = 0;
#define ADD(...)                                                                                \
  do {                                                                                          \
    if (len < sizeof text) len += (size_t)snprintf(text + len, sizeof text - len, __VA_ARGS__); \
  } while (0)
  ADD("rank %d: %s, collective #%llu, did not complete within %g s (CLPAR_DIST_TIMEOUT)", g.rank,
      what, (unsigned long long)seq, waited);
  if (answers) {
    int missing = 0;
    for (int r = 0; r < g.size; r++) missing += r != g.rank && !answered[r];
    if (missing) {
      ADD("; not arrived (no answer: dead, hung, or not in a clpar collective): rank%s",
          missing > 1 ? "s" : "");
      for (int r = 0, k = 0; r < g.size; r++)
        if (r != g.rank && !answered[r]) ADD("%s %d", k++ ? "," : "", r);
    }
    for (int r = 0; r < g.size; r++)
      if (r != g.rank && answered[r]) {
        if (answers[r].seq == seq && !strcmp(answers[r].what, what))
          ADD("; rank %d waits in it too", r);
        else
          ADD("; rank %d waits in %s, collective #%llu", r, answers[r].what,
              (unsigned long long)answers[r].seq);
      }
  } else {
    ADD("; out of memory to ask the other ranks where they are");
  }
  ADD(". The job cannot go on: end it with clpar_dist_abort");
#undef ADD
  if (!atomic_load(&broken)) {
    snprintf(broken_message, sizeof broken_message, "%s", text);
    atomic_store(&broken, 1);
  }
  return clpar_set_error(CLPAR_ERROR_TIMEOUT, "%s", text);
}

/* clpar_dist_wait's poll: MPI_Test under the lock. */
static int test_request(void *user, clpar_status *status, const char *what) {
  int done = 0;
  clpar_mpi_lock();
  int rc = MPI_Test((MPI_Request *)user, &done, MPI_STATUS_IGNORE);
  clpar_mpi_unlock();
  if (rc != MPI_SUCCESS) {
    *status = clpar_mpi_error(rc, what);
    return 1;
  }
  *status = CLPAR_OK;
  return done;
}

clpar_status clpar_dist_wait(MPI_Request *req, const char *what, uint64_t seq) {
  return clpar_dist_wait_for(test_request, req, what, seq);
}

clpar_status clpar_dist_wait_for(clpar_dist_poll_fn poll, void *user, const char *what,
                                 uint64_t seq) {
  double start = clpar_clock_seconds(), timeout = g.timeout;
  double warn_after = timeout / 2 < 60 ? timeout / 2 : 60;
  double grace = timeout / 4 < 1 ? timeout / 4 : 1; /* for answers after the deadline */
  double asked_at = -1;
  int warned = 0;
  long nap_ns = 10000; /* 10 us, doubling to 160 us: a completion is seen within 0.2 ms */
  where_msg *answers = NULL;
  int *answered = NULL;
  for (;;) {
    clpar_status status = CLPAR_OK;
    if (poll(user, &status, what)) {
      free(answers);
      free(answered);
      return status;
    }
    clpar_mpi_lock();
    answer_questions(what, seq);
    if (answers) take_answers(answers, answered);
    clpar_mpi_unlock();
    double t = clpar_clock_seconds() - start;
    if (!warned && t >= warn_after) {
      warned = 1;
      clpar_log(CLPAR_LOG_WARN,
                "rank %d: still waiting after %.0f s in %s, collective #%llu: a rank has not "
                "arrived (CLPAR_DIST_TIMEOUT is %g s)",
                g.rank, t, what, (unsigned long long)seq, timeout);
      answers = calloc((size_t)g.size, sizeof *answers);
      answered = calloc((size_t)g.size, sizeof *answered);
      if (answers && answered) {
        clpar_mpi_lock();
        ask_everyone();
        clpar_mpi_unlock();
        asked_at = t;
      } else {
        free(answers);
        free(answered);
        answers = NULL;
        answered = NULL;
      }
    }
    if (t >= timeout) {
      int all = 1;
      for (int r = 0; answers && r < g.size; r++) all &= r == g.rank || answered[r];
      /* answers asked for just now may still be on their way */
      if (all || !answers || t - asked_at >= grace) {
        clpar_status s = timed_out(what, seq, timeout, answers, answered);
        free(answers);
        free(answered);
        return s;
      }
    }
    struct timespec nap = {0, nap_ns};
    nanosleep(&nap, NULL);
    if (nap_ns < 160000) nap_ns *= 2;
  }
}

/* What a rank is about to run, for CLPAR_DIST_DEBUG. */
typedef struct {
  uint64_t seq;
  int64_t bytes;
  char what[WHAT_SIZE];
} call_msg;

clpar_status clpar_dist_debug_check(MPI_Comm comm, const char *what, uint64_t seq, int64_t bytes) {
  if (!g.debug) return CLPAR_OK;
  if (clpar_dist_check_broken()) return CLPAR_ERROR_TIMEOUT;
  int n = 0;
  MPI_Comm_size(comm, &n);
  call_msg mine = {seq, bytes, ""};
  snprintf(mine.what, sizeof mine.what, "%s", what);
  call_msg *all = calloc((size_t)n, sizeof *all);
  if (!all) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
  char check[WHAT_SIZE + 40];
  snprintf(check, sizeof check, "CLPAR_DIST_DEBUG's check before %s", what);
  MPI_Request req = MPI_REQUEST_NULL;
  clpar_mpi_lock();
  int rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, comm,
                          &req);
  clpar_mpi_unlock();
  clpar_status s =
      rc == MPI_SUCCESS ? clpar_dist_wait(&req, check, seq) : clpar_mpi_error(rc, check);
  if (s != CLPAR_OK) {
    if (s != CLPAR_ERROR_TIMEOUT) free(all); /* else MPI may still write it */
    return s;
  }
  /* every rank sees the same table, so every rank reports the same first difference */
  for (int r = 1; r < n; r++) {
    all[r].what[WHAT_SIZE - 1] = all[0].what[WHAT_SIZE - 1] = '\0';
    if (all[r].seq != all[0].seq || all[r].bytes != all[0].bytes ||
        strcmp(all[r].what, all[0].what) != 0) {
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                          "CLPAR_DIST_DEBUG: the ranks are not running the same collective: rank "
                          "0 runs %s (collective #%llu, %lld bytes) but rank %d runs %s "
                          "(collective #%llu, %lld bytes); none of them ran it",
                          all[0].what, (unsigned long long)all[0].seq, (long long)all[0].bytes, r,
                          all[r].what, (unsigned long long)all[r].seq, (long long)all[r].bytes);
      break;
    }
  }
  free(all);
  return s;
}

/* op "allreduce" (MPI_Iallreduce with op) or "bcast" (MPI_Ibcast from root). */
static clpar_status staged(int bcast, void *buf, int count, MPI_Datatype type, MPI_Op op, int root,
                           MPI_Comm comm, const char *what, uint64_t seq) {
  if (clpar_dist_check_broken()) return CLPAR_ERROR_TIMEOUT;
  int size = 0;
  MPI_Type_size(type, &size);
  size_t bytes = (size_t)count * (size_t)size;
  clpar_status s = clpar_dist_debug_check(comm, what, seq, (int64_t)bytes);
  if (s != CLPAR_OK) return s;
  void *stage = malloc(bytes ? bytes : 1);
  if (!stage) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
  memcpy(stage, buf, bytes);
  MPI_Request req = MPI_REQUEST_NULL;
  clpar_mpi_lock();
  int rc = bcast ? MPI_Ibcast(stage, count, type, root, comm, &req)
                 : MPI_Iallreduce(MPI_IN_PLACE, stage, count, type, op, comm, &req);
  clpar_mpi_unlock();
  s = rc == MPI_SUCCESS ? clpar_dist_wait(&req, what, seq) : clpar_mpi_error(rc, what);
  if (s == CLPAR_OK) memcpy(buf, stage, bytes);
  if (s != CLPAR_ERROR_TIMEOUT) free(stage); /* else MPI may still write it: left allocated */
  return s;
}

clpar_status clpar_dist_allreduce(void *buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                                  const char *what, uint64_t seq) {
  return staged(0, buf, count, type, op, 0, comm, what, seq);
}

clpar_status clpar_dist_bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
                              const char *what, uint64_t seq) {
  return staged(1, buf, count, type, MPI_OP_NULL, root, comm, what, seq);
}

#endif
