/* ddp_nccl.c — DistributedDataParallel's buckets all-reduced by NCCL on CUDA devices, in place
 * in the flat gradient, on the device's own stream (the backend's comm_ entries, backend.h;
 * backends/cuda/cuda_nccl.c), instead of through host memory over MPI (ddp.c).
 *
 * Choice (clpar_ddp_choose_backend, at creation): each rank encodes its CLPAR_DIST_BACKEND
 * and whether NCCL can serve it (every parameter on one device that has the comm_ entries,
 * each bucket one range of a flat gradient); one all-reduce gives every rank every code, so
 * every rank takes the same decision and names the same rank when NCCL cannot be used. Then
 * rank 0 makes the NCCL id, MPI broadcasts it (as llm.c does), and each rank joins the
 * communicator, polled against CLPAR_DIST_TIMEOUT; in auto mode, a communicator that fails on
 * any rank (two ranks on one GPU, say) makes every rank fall back to MPI.
 *
 * Backward: the hook that completes a bucket posts, on the backward thread, the all-reduce
 * (ncclAvg) of every complete bucket not yet posted, strictly in bucket order (NCCL's
 * collectives must match across ranks), each followed by an event. The device runs it right
 * after the kernels that computed the gradients and before whatever the program posts next
 * (the optimizer step reads the averages): no copy, no host wait, and backward returns at once.
 * The communication thread only watches: for each all-reduce, in order, it polls the event and
 * NCCL's asynchronous error through clpar_dist_wait_for (the deadline, the stall warning and
 * the "where are you?" answers of every other collective of clpar); an error or the deadline
 * aborts the communicator, which ends the kernels waiting for a missing rank, and every later
 * step fails with CLPAR_ERROR_TIMEOUT (or NCCL's error) naming the collective. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/ddp_internal.h"

/* Why NCCL cannot serve a rank; shared between the ranks as numbers. */
enum { NCCL_OK = 0, NCCL_DEVICES, NCCL_NOT_CUDA, NCCL_NOT_BUILT, NCCL_NOT_FLAT, NCCL_REASONS };

static const char *const reason_text[NCCL_REASONS] = {
    "",
    "its module's parameters live on several devices (DDP with model parallel reduces over "
    "MPI)",
    "its device is not a CUDA device (no all-reduce library exists for OpenCL or the host)",
    "its CUDA device has no NCCL: clpar was built without it (CMake option CLPAR_NCCL)",
    "its gradients are not one flat buffer per bucket (clpar_module_flatten)"};

static int has_comm_entries(const clpar_device *dev) {
  const clpar_backend_iface *f = dev->bd.iface;
  return f->comm_id && f->comm_init && f->comm_query && f->comm_abort && f->comm_free &&
         f->comm_allreduce;
}

/* Whether NCCL can reduce this rank's buckets; detail says why not, with device ids. */
static int local_reason(ddp_state *st, char *detail, size_t size) {
  clpar_device *dev = st->buckets[0].dev;
  detail[0] = '\0';
  for (int k = 1; k < st->n_buckets; k++)
    if (st->buckets[k].dev != dev) {
      snprintf(detail, size, " (%s and %s)", dev->bd.info.id, st->buckets[k].dev->bd.info.id);
      return NCCL_DEVICES;
    }
  if (!has_comm_entries(dev)) {
    snprintf(detail, size, " (%s, %s backend)", dev->bd.info.id, dev->bd.info.backend);
    return strcmp(dev->bd.info.backend, "cuda") == 0 ? NCCL_NOT_BUILT : NCCL_NOT_CUDA;
  }
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    clpar_ddp_make_runs(st, b);
    if (b->n_runs != 1 || b->runs[0].numel != b->numel) {
      snprintf(detail, size, " (bucket %d)", k);
      return NCCL_NOT_FLAT;
    }
  }
  return NCCL_OK;
}

/* ---- the communicator ---- */

static int comm_ready(void *user, clpar_status *status, const char *what) {
  (void)what;
  ddp_state *st = user;
  int pending = 0;
  *status = clpar_dev_comm_query(st->nccl_dev, st->nccl_comm, &pending);
  return *status != CLPAR_OK || !pending;
}

static void drop_comm(ddp_state *st) {
  if (!st->nccl_comm) return;
  clpar_dev_comm_abort(st->nccl_dev, st->nccl_comm);
  clpar_dev_comm_free(st->nccl_dev, st->nccl_comm, 0);
  st->nccl_comm = NULL;
}

/* Rank 0's id to every rank over MPI, then each joins, polled with the job's deadline. Every
 * rank returns the same status (clpar_ddp_agree). */
static clpar_status make_comm(ddp_state *st) {
  unsigned char id[CLPAR_COMM_ID_BYTES] = {0};
  int rank = clpar_dist_rank();
  clpar_status mine = rank == 0 ? clpar_dev_comm_id(st->nccl_dev, id, sizeof id) : CLPAR_OK;
  clpar_status s = clpar_ddp_agree(st, mine, "clpar_ddp_create: making NCCL's id on rank 0");
  if (s == CLPAR_OK)
    s = clpar_dist_bcast(id, (int)sizeof id, MPI_BYTE, 0, st->comm,
                         "clpar_ddp_create: broadcasting rank 0's NCCL id", ++st->seq);
  if (s != CLPAR_OK) return s;
  mine = clpar_dev_comm_init(st->nccl_dev, id, sizeof id, st->world, rank, &st->nccl_comm);
  if (mine != CLPAR_OK) st->nccl_comm = NULL;
  if (mine == CLPAR_OK)
    mine = clpar_dist_wait_for(comm_ready, st, "clpar_ddp_create: joining the NCCL communicator",
                               ++st->seq);
  if (mine == CLPAR_ERROR_TIMEOUT) {
    drop_comm(st);
    return mine; /* the job is broken: no agreement can be reached any more */
  }
  s = clpar_ddp_agree(st, mine, "clpar_ddp_create: NCCL's communicator");
  if (s != CLPAR_OK) drop_comm(st);
  return s;
}

/* Every rank's code (reason * 4 + mode) from one all-reduce; then the same decision on all. */
clpar_status clpar_ddp_choose_backend(ddp_state *st) {
  char detail[160];
  int mode = clpar_dist_backend_mode(), reason = local_reason(st, detail, sizeof detail);
  int rank = clpar_dist_rank(), world = st->world;
  int *codes = calloc((size_t)world, sizeof *codes);
  clpar_status s = clpar_ddp_agree(
      st, codes ? CLPAR_OK : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory"),
      "clpar_ddp_create");
  if (s != CLPAR_OK) {
    free(codes);
    return s;
  }
  codes[rank] = reason * 4 + mode;
  s = clpar_dist_allreduce(codes, world, MPI_INT, MPI_SUM, st->comm,
                           "clpar_ddp_create: choosing NCCL or MPI", ++st->seq);
  int forced_mpi = -1, forced_nccl = -1, cannot = -1, why = NCCL_OK, bad = -1;
  for (int r = 0; s == CLPAR_OK && bad < 0 && r < world; r++)
    if (codes[r] < 0 || codes[r] / 4 >= NCCL_REASONS || codes[r] % 4 > CLPAR_DIST_BACKEND_NCCL)
      bad = r; /* not a code this clpar makes: every rank saw it, every rank refuses */
  if (bad >= 0)
    s = clpar_set_error(CLPAR_ERROR_CORRUPT,
                        "clpar_ddp_create: choosing NCCL or MPI: rank %d sent code %d, which is "
                        "no code clpar makes (0 to %d): is it running another clpar?",
                        bad, codes[bad], (NCCL_REASONS - 1) * 4 + CLPAR_DIST_BACKEND_NCCL);
  for (int r = 0; s == CLPAR_OK && r < world; r++) {
    int m = codes[r] % 4, q = codes[r] / 4;
    if (m == CLPAR_DIST_BACKEND_MPI && forced_mpi < 0) forced_mpi = r;
    if (m == CLPAR_DIST_BACKEND_NCCL && forced_nccl < 0) forced_nccl = r;
    if (q != NCCL_OK && cannot < 0 && q < NCCL_REASONS) cannot = r, why = q;
  }
  free(codes);
  if (s != CLPAR_OK) return s;
  st->nccl = 0;
  st->nccl_dev = st->buckets[0].dev;
  if (forced_mpi >= 0 && forced_nccl >= 0)
    return clpar_set_error(
        CLPAR_ERROR_INVALID_ARGUMENT,
        "clpar_ddp_create: CLPAR_DIST_BACKEND is mpi on rank %d but nccl on rank "
        "%d; give every rank the same",
        forced_mpi, forced_nccl);
  if (forced_mpi >= 0) {
    snprintf(st->backend_why, sizeof st->backend_why,
             "MPI through host memory: CLPAR_DIST_BACKEND=mpi on rank %d", forced_mpi);
  } else if (cannot >= 0) {
    snprintf(st->backend_why, sizeof st->backend_why,
             "MPI through host memory: NCCL cannot serve rank %d: %s", cannot, reason_text[why]);
    if (cannot == rank) {
      size_t len = strlen(st->backend_why);
      snprintf(st->backend_why + len, sizeof st->backend_why - len, "%s", detail);
    }
    if (forced_nccl >= 0)
      return clpar_set_error(
          CLPAR_ERROR_UNSUPPORTED,
          "clpar_ddp_create: CLPAR_DIST_BACKEND=nccl on rank %d, but NCCL cannot "
          "serve rank %d: %s",
          forced_nccl, cannot, reason_text[why]);
  } else {
    s = make_comm(st);
    if (s == CLPAR_OK) {
      st->nccl = 1;
      snprintf(st->backend_why, sizeof st->backend_why,
               "NCCL on each rank's CUDA device (%d ranks, %d bucket%s)", world, st->n_buckets,
               st->n_buckets > 1 ? "s" : "");
    } else if (s == CLPAR_ERROR_TIMEOUT || forced_nccl >= 0) {
      return s;
    } else { /* the same error on every rank: every rank falls back */
      snprintf(st->backend_why, sizeof st->backend_why,
               "MPI through host memory: NCCL's communicator could not be made: %s",
               clpar_last_error());
      clpar_log(CLPAR_LOG_WARN, "rank %d: DistributedDataParallel reduces over %s", rank,
                st->backend_why);
      clpar_clear_error();
      s = CLPAR_OK;
    }
  }
  if (st->nccl) {
    for (int k = 0; k < st->n_buckets; k++) { /* the range each all-reduce works on */
      ddp_bucket *b = &st->buckets[k];
      const ddp_param *p = &st->params[b->first];
      b->grad_ref = clpar_tensor_retain(p->param->grad);
      b->grad_word = b->runs[0].word;
    }
  }
  clpar_log(CLPAR_LOG_INFO, "rank %d: DistributedDataParallel reduces with %s", rank,
            st->backend_why);
  return s;
}

/* ---- backward: posting ---- */

/* Posts bucket b's all-reduce (seq) and an event after it; the watch entry, or NULL when
 * nothing could be posted (the error recorded). */
static ddp_watch *post_bucket(ddp_state *st, ddp_bucket *b, uint64_t seq) {
  int k = (int)(b - st->buckets);
  char what[160];
  snprintf(what, sizeof what,
           "DistributedDataParallel's NCCL all-reduce of bucket %d (%lld floats)", k,
           (long long)b->numel);
  clpar_status s = clpar_dist_debug_check(st->comm, what, seq, b->numel * 4);
  if (s != CLPAR_OK) { /* every rank sees the same mismatch: none posts, none waits */
    clpar_ddp_record_error(st, s, "checking the ranks run the same collective");
    return NULL;
  }
  clpar_ddp_make_runs(st, b);
  const clpar_storage *storage = b->grad_ref->storage;
  if (b->n_runs != 1 || b->runs[0].storage != storage || b->runs[0].word != b->grad_word)
    clpar_ddp_record_error(
        st,
        clpar_set_error(CLPAR_ERROR_INTERNAL,
                        "bucket %d's gradients are no longer where they were when the module "
                        "was made (was it moved or flattened again?); the old place is reduced",
                        k),
        "NCCL all-reduce");
  clpar_device *dev = b->dev;
  /* a parameter the forward did not reach (find_unused_parameters) takes part with zeros */
  for (int i = b->first; s == CLPAR_OK && i < b->first + b->count; i++) {
    ddp_param *p = &st->params[i];
    if (p->unused)
      s = clpar_dev_fill(dev, (clpar_bref){storage->buf, b->grad_word + (size_t)p->offset},
                         (size_t)p->numel, 0.0f);
  }
  clpar_bref range = {storage->buf, b->grad_word};
  double timeout = clpar_dist_timeout();
  if (s != CLPAR_OK) /* an earlier error of the device, now taken: post the collective anyway */
    clpar_ddp_record_error(st, s, "zeroing the gradients of unused parameters");
  s = clpar_dev_comm_allreduce(dev, st->nccl_comm, range, (size_t)b->numel, timeout);
  if (s != CLPAR_OK) { /* the same: the device's earlier error came back instead */
    clpar_ddp_record_error(st, s, "an operation on the device before the NCCL all-reduce");
    s = clpar_dev_comm_allreduce(dev, st->nccl_comm, range, (size_t)b->numel, timeout);
  }
  ddp_watch *w = calloc(1, sizeof *w);
  if (s == CLPAR_OK && !w) s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  if (s == CLPAR_OK) s = clpar_event_record(dev, &w->done);
  if (s != CLPAR_OK) {
    clpar_ddp_record_error(st, s, what);
    if (w) w->done = NULL; /* the watcher aborts the communicator: nobody waits for it */
  }
  if (!w) return NULL;
  __atomic_add_fetch(&b->grad_ref->storage->version, 1, __ATOMIC_RELAXED);
  for (int i = b->first; i < b->first + b->count; i++) /* the others' average, in order */
    if (st->params[i].unused && st->params[i].param->grad) st->params[i].param->grad_defined = 1;
  w->bucket = k;
  w->seq = seq;
  w->posted = clpar_clock_seconds();
  return w;
}

int clpar_ddp_nccl_post(ddp_state *st) {
  while (st->nccl_posted < st->n_buckets && st->buckets[st->nccl_posted].complete) {
    ddp_bucket *b = &st->buckets[st->nccl_posted++];
    int dead = st->nccl_dead;
    uint64_t seq = ++st->seq;
    pthread_mutex_unlock(&st->lock); /* posting takes no lock of ours */
    ddp_watch *w = dead ? NULL : post_bucket(st, b, seq);
    pthread_mutex_lock(&st->lock);
    if (w) {
      if (st->watch_tail)
        st->watch_tail->next = w;
      else
        st->watch_head = w;
      st->watch_tail = w;
      pthread_cond_broadcast(&st->cv);
    }
  }
  return st->nccl_posted == st->n_buckets;
}

/* ---- the communication thread: watching ---- */

typedef struct {
  ddp_state *st;
  ddp_watch *w;
} watch_poll;

/* Done when the event after the all-reduce has completed; NCCL's asynchronous error (a peer's
 * connection broken, the communicator aborted) ends the wait with that error. */
static int collective_done(void *user, clpar_status *status, const char *what) {
  watch_poll *wp = user;
  *status = CLPAR_OK;
  if (!wp->w->done) {
    *status = clpar_set_error(CLPAR_ERROR_BACKEND, "%s could not be posted or followed", what);
    return 1;
  }
  int pending = 0;
  clpar_status s = clpar_dev_comm_query(wp->st->nccl_dev, wp->st->nccl_comm, &pending);
  if (s != CLPAR_OK) {
    *status = s;
    return 1;
  }
  if (!clpar_event_done(wp->w->done)) return 0;
  *status = clpar_event_sync(wp->w->done); /* complete: its status, without waiting */
  return 1;
}

static void watch_one(ddp_state *st, ddp_watch *w) {
  char what[160];
  snprintf(what, sizeof what,
           "DistributedDataParallel's NCCL all-reduce of bucket %d (%lld floats)", w->bucket,
           (long long)st->buckets[w->bucket].numel);
  pthread_mutex_lock(&st->lock);
  int dead = st->nccl_dead;
  pthread_mutex_unlock(&st->lock);
  double t0 = clpar_clock_seconds();
  watch_poll wp = {st, w};
  clpar_status s = dead ? CLPAR_ERROR_TIMEOUT
                   : clpar_dist_check_broken()
                       ? CLPAR_ERROR_TIMEOUT
                       : clpar_dist_wait_for(collective_done, &wp, what, w->seq);
  double t1 = clpar_clock_seconds();
  if (s != CLPAR_OK && !dead) {
    /* a missing rank's peers spin in the kernel until the communicator is aborted */
    char msg[MESSAGE_SIZE];
    snprintf(msg, sizeof msg, "%s", clpar_last_error());
    clpar_dev_comm_abort(st->nccl_dev, st->nccl_comm);
    clpar_ddp_record_error(st, clpar_set_error(s, "%s", msg), "NCCL");
    pthread_mutex_lock(&st->lock);
    st->nccl_dead = 1;
    snprintf(st->dead_msg, sizeof st->dead_msg,
             "DistributedDataParallel: NCCL's communicator was aborted: %.600s; the module's "
             "gradients can no longer be reduced (end the job with clpar_dist_abort)",
             msg);
    pthread_mutex_unlock(&st->lock);
  }
  pthread_mutex_lock(&st->lock);
  st->stats.allreduce_seconds += t1 - (w->posted > t0 ? w->posted : t0);
  if (w->bucket == st->n_buckets - 1) {
    st->stats.exposed_seconds += t1 - (w->posted > st->watch_done ? w->posted : st->watch_done);
    if (s == CLPAR_OK) st->stats.reductions++;
  }
  st->watch_done = t1;
  pthread_mutex_unlock(&st->lock);
}

void clpar_ddp_nccl_watch(ddp_state *st) {
  pthread_mutex_lock(&st->lock);
  for (;;) {
    while (!st->stop && !st->watch_head) pthread_cond_wait(&st->cv, &st->lock);
    ddp_watch *w = st->watch_head;
    if (!w) break; /* stopped, and every all-reduce watched to its end */
    pthread_mutex_unlock(&st->lock);
    watch_one(st, w);
    pthread_mutex_lock(&st->lock);
    st->watch_head = w->next;
    if (!st->watch_head) st->watch_tail = NULL;
    clpar_event_release(w->done);
    free(w);
    pthread_cond_broadcast(&st->cv);
  }
  pthread_mutex_unlock(&st->lock);
}

void clpar_ddp_nccl_wait_idle(ddp_state *st) {
  while (st->watch_head) pthread_cond_wait(&st->cv, &st->lock);
}

void clpar_ddp_nccl_free(ddp_state *st) {
  while (st->watch_head) { /* the thread never ran */
    ddp_watch *w = st->watch_head;
    st->watch_head = w->next;
    clpar_event_release(w->done);
    free(w);
  }
  st->watch_tail = NULL;
  if (!st->nccl_comm || !clpar_is_initialized()) return; /* after clpar_shutdown: left */
  /* every all-reduce was seen complete or the communicator was aborted; nothing of it is
   * queued any more once the device has drained */
  if (!st->nccl_dead) clpar_worker_drain(st->nccl_dev);
  clpar_status s = clpar_dev_comm_free(st->nccl_dev, st->nccl_comm, clpar_dist_timeout());
  if (s != CLPAR_OK)
    clpar_log(CLPAR_LOG_WARN, "DistributedDataParallel: freeing NCCL's communicator: %s",
              clpar_last_error());
  st->nccl_comm = NULL;
}
