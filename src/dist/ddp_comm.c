/* ddp_comm.c — DistributedDataParallel's communication thread and the gradient hooks that
 * feed it: the hook that completes a bucket posts its reads into the bucket's host memory,
 * the thread all-reduces the buckets over MPI in order on every rank and posts the averages
 * back (see ddp.c for the whole design). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/ddp_internal.h"

/* Keeps the first error of the communication thread (or a hook) for the program to see. */
void clpar_ddp_record_error(ddp_state *st, clpar_status s, const char *what) {
  pthread_mutex_lock(&st->lock);
  if (st->error == CLPAR_OK) {
    st->error = s;
    snprintf(st->message, sizeof st->message, "DistributedDataParallel: %s: %s", what,
             clpar_last_error());
  }
  pthread_mutex_unlock(&st->lock);
}

/* ---- the communication thread ---- */

/* The reads of the buckets of every module complete under this lock; each bucket's
 * communication thread waits on the condition for its own flag. The device's worker sets the
 * flag (clpar_event_then), so that waiting counts as no host wait of the program. */
static pthread_mutex_t read_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t read_cv = PTHREAD_COND_INITIALIZER;

static void read_complete(void *user) {
  ddp_bucket *b = user;
  pthread_mutex_lock(&read_lock);
  b->read_seen = 1;
  pthread_cond_broadcast(&read_cv);
  pthread_mutex_unlock(&read_lock);
}

/* On the backward thread, when the bucket's last gradient is final: posts its reads into the
 * bucket's (pinned) host memory on the device's queue, right after the work that computes
 * those gradients and before the rest of backward, and an event the communication thread
 * waits for. Nothing here waits for the device. */
void clpar_ddp_post_reads(ddp_state *st, ddp_bucket *b) {
  clpar_ddp_make_runs(st, b);
  clpar_status s = CLPAR_OK;
  size_t bytes = 0;
  for (int k = 0; s == CLPAR_OK && k < b->n_runs; k++) {
    ddp_run *r = &b->runs[k];
    s = clpar_dev_read(b->dev, r->storage->buf, r->word * CLPAR_WORD_BYTES, b->buf + r->host,
                       (size_t)r->numel * sizeof(float));
    bytes += (size_t)r->numel * sizeof(float);
  }
  if (s == CLPAR_OK) s = clpar_event_record(b->dev, &b->read_done);
  b->read_seen = 0;
  b->watched = s == CLPAR_OK && clpar_event_then(b->read_done, read_complete, b) == CLPAR_OK;
  if (s != CLPAR_OK) {
    clpar_ddp_record_error(st, s, "posting the copy of a bucket's gradients to host memory");
    clpar_worker_drain(b->dev); /* no read posted may write b->buf after this */
    b->read_failed = 1;
  }
  __atomic_add_fetch(&b->dev->transfers_out, (uint64_t)b->n_runs, __ATOMIC_RELAXED);
  __atomic_add_fetch(&b->dev->bytes_out, (uint64_t)bytes, __ATOMIC_RELAXED);
}

/* The bucket's gradients (read into its buffer by post_reads), summed over the ranks,
 * averaged, and posted back, one write per run straight from the buffer: the device's queue
 * runs them before the next backward's reads into the same memory. A rank whose copy failed
 * still takes part in the all-reduce (with zeros), so that no rank waits. */
clpar_status clpar_ddp_take_reads(ddp_state *st, ddp_bucket *b) {
  if (!b->read_failed && b->watched) {
    pthread_mutex_lock(&read_lock);
    while (!b->read_seen) pthread_cond_wait(&read_cv, &read_lock);
    pthread_mutex_unlock(&read_lock);
  }
  clpar_status s = b->read_failed ? CLPAR_ERROR_BACKEND : clpar_event_sync(b->read_done);
  if (s == CLPAR_OK) s = clpar_worker_take_error(b->dev);
  clpar_event_release(b->read_done);
  b->read_done = NULL;
  if (s != CLPAR_OK) {
    if (!b->read_failed)
      clpar_ddp_record_error(st, s, "copying a bucket's gradients to host memory");
    memset(b->buf, 0, (size_t)b->numel * sizeof(float));
  }
  for (int i = b->first; i < b->first + b->count; i++) {
    ddp_param *p = &st->params[i];
    int none = st->zero_stage == 2 ? !p->posted : !p->param->grad;
    if (p->unused || none) memset(b->buf + p->offset, 0, (size_t)p->numel * sizeof(float));
  }
  return s;
}

void clpar_ddp_add_times(ddp_state *st, ddp_bucket *b, const double t[4]) {
  pthread_mutex_lock(&st->lock);
  st->stats.read_seconds += t[1] - t[0];
  st->stats.allreduce_seconds += t[2] - t[1];
  st->stats.write_seconds += t[3] - t[2];
  if (b == &st->buckets[st->n_buckets - 1]) st->stats.exposed_seconds += t[3] - t[1];
  pthread_mutex_unlock(&st->lock);
}

clpar_status clpar_ddp_allreduce(ddp_state *st, ddp_bucket *b) {
  char what[120];
  snprintf(what, sizeof what, "DistributedDataParallel's all-reduce of bucket %d (%lld floats)",
           (int)(b - st->buckets), (long long)b->numel);
  uint64_t seq = ++st->seq;
  clpar_status s;
  if (clpar_dist_check_broken()) {
    s = CLPAR_ERROR_TIMEOUT;
  } else if ((s = clpar_dist_debug_check(st->comm, what, seq, b->numel * 4)) != CLPAR_OK) {
    if (s == CLPAR_ERROR_TIMEOUT) st->abandoned = 1;
  } else {
    MPI_Request req = MPI_REQUEST_NULL;
    clpar_mpi_lock();
    int rc =
        MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)b->numel, MPI_FLOAT, MPI_SUM, st->comm, &req);
    clpar_mpi_unlock();
    s = rc == MPI_SUCCESS ? clpar_dist_wait(&req, what, seq) : clpar_mpi_error(rc, what);
    if (s == CLPAR_ERROR_TIMEOUT) st->abandoned = 1; /* MPI may still write b->buf */
  }
  if (s != CLPAR_OK) {
    clpar_ddp_record_error(st, s, "all-reducing a bucket");
    return s;
  }
  float scale = 1.0f / (float)st->world;
  for (int64_t k = 0; k < b->numel; k++) b->buf[k] *= scale;
  return CLPAR_OK;
}

static void reduce_bucket(ddp_state *st, ddp_bucket *b) {
  double t0 = clpar_clock_seconds();
  clpar_ddp_take_reads(st, b); /* a failed read takes part with zeros (its error is kept) */
  double t1 = clpar_clock_seconds();
  clpar_status s = clpar_ddp_allreduce(st, b);
  double t2 = clpar_clock_seconds();
  if (s == CLPAR_OK) {
    for (int k = 0; s == CLPAR_OK && k < b->n_runs; k++) {
      ddp_run *r = &b->runs[k];
      s = clpar_dev_write(b->dev, r->storage->buf, r->word * CLPAR_WORD_BYTES, b->buf + r->host,
                          (size_t)r->numel * sizeof(float));
      __atomic_add_fetch(&r->storage->version, 1, __ATOMIC_RELAXED);
      __atomic_add_fetch(&b->dev->transfers_in, 1, __ATOMIC_RELAXED);
      __atomic_add_fetch(&b->dev->bytes_in, (uint64_t)r->numel * sizeof(float), __ATOMIC_RELAXED);
    }
    if (s != CLPAR_OK) {
      clpar_ddp_record_error(st, s, "writing averaged gradients back");
      clpar_worker_drain(b->dev);
    }
    /* a parameter this rank did not use has the others' gradient now */
    for (int i = b->first; i < b->first + b->count; i++)
      if (st->params[i].unused && st->params[i].param->grad) st->params[i].param->grad_defined = 1;
  }
  double t[4] = {t0, t1, t2, clpar_clock_seconds()};
  clpar_ddp_add_times(st, b, t);
}

void *clpar_ddp_comm_thread(void *arg) {
  ddp_state *st = arg;
  if (st->nccl) { /* the device reduces: the thread only watches (ddp_nccl.c) */
    clpar_ddp_nccl_watch(st);
    return NULL;
  }
  pthread_mutex_lock(&st->lock);
  for (;;) {
    void *handoff = NULL, *zjob = NULL; /* a captured step's bucket (ddp_graph.c), ZeRO step */
    while (!st->stop && !(st->next < st->n_buckets && st->buckets[st->next].ready) &&
           !clpar_zero3_job_ready(st) && !(handoff = clpar_ddp_graph_take(st)) &&
           !(zjob = clpar_zero_graph_take(st)))
      pthread_cond_wait(&st->cv, &st->lock);
    if (clpar_zero3_job_ready(st)) { /* ZeRO-3's (zero3_comm.c), every one run before a stop */
      clpar_zero3_run_job(st);
      continue;
    }
    if (st->stop) break;
    st->busy = 1;
    pthread_mutex_unlock(&st->lock);
    if (handoff || zjob) {
      if (handoff)
        clpar_ddp_graph_reduce(st, handoff);
      else
        clpar_zero_graph_run(st, zjob); /* zero_graph.c */
      pthread_mutex_lock(&st->lock);
      st->busy = 0;
      pthread_cond_broadcast(&st->cv);
      continue;
    }
    ddp_bucket *b = &st->buckets[st->next];
    if (st->zero_stage)
      clpar_zero_reduce_bucket(st, b); /* a reduce-scatter (zero_comm.c) */
    else
      reduce_bucket(st, b);
    pthread_mutex_lock(&st->lock);
    st->busy = 0;
    st->next++;
    pthread_cond_broadcast(&st->cv);
  }
  pthread_mutex_unlock(&st->lock);
  return NULL;
}

/* Back to "no gradient ready" for the next backward; st->lock held, the thread idle. */
void clpar_ddp_reset_step(ddp_state *st) {
  for (int i = 0; i < st->n_params; i++) st->params[i].ready = st->params[i].posted = 0;
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    b->ready = b->complete = b->read_failed = b->watched = 0;
    b->pending = b->count;
    clpar_event_release(b->read_done);
    b->read_done = NULL;
  }
  st->next = 0;
  st->n_ready = 0;
  st->nccl_posted = 0;
  st->unused_armed = 0;
}

/* p's gradient is final (or p is unused); st->lock held. */
static void mark_ready(ddp_state *st, ddp_param *p) {
  p->ready = 1;
  ddp_bucket *b = &st->buckets[p->bucket];
  if (--b->pending == 0) b->complete = 1;
}

/* Runs on the backward thread when p's gradient is final. The first hook of a backward also
 * marks the parameters the forward did not reach (find_unused_parameters), as PyTorch's
 * Reducer does when backward starts. */
void clpar_ddp_grad_ready(clpar_tensor *t, void *user) {
  (void)t;
  ddp_param *p = user;
  ddp_state *st = p->st;
  if (st->zero_stage == 3) return; /* its units reduce-scatter in their backward */
  pthread_mutex_lock(&st->lock);
  if (p->ready || st->no_sync) {
    pthread_mutex_unlock(&st->lock);
    return;
  }
  if (st->zero_stage == 2) { /* its gradient to the bucket's memory and off the device */
    pthread_mutex_unlock(&st->lock);
    clpar_zero_take_grad(st, p);
    pthread_mutex_lock(&st->lock);
  }
  if (st->unused_armed) {
    st->unused_armed = 0;
    for (int i = 0; i < st->n_params; i++)
      if (st->params[i].unused && !st->params[i].ready) mark_ready(st, &st->params[i]);
  }
  mark_ready(st, p);
  if (clpar_ddp_graph_hook(st, p)) { /* a captured step: its hand-offs are commands */
    pthread_mutex_unlock(&st->lock);
    return;
  }
  if (st->nccl) { /* all-reduced on the device, in order; backward does not wait */
    if (clpar_ddp_nccl_post(st)) clpar_ddp_reset_step(st); /* the last bucket is posted */
    pthread_mutex_unlock(&st->lock);
    return;
  }
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    if (!b->complete || b->ready) continue;
    pthread_mutex_unlock(&st->lock); /* posting takes no lock of ours; the thread goes on */
    clpar_ddp_post_reads(st, b);
    pthread_mutex_lock(&st->lock);
    b->ready = 1;
    st->n_ready++;
    pthread_cond_broadcast(&st->cv);
  }
  if (st->n_ready == st->n_buckets) { /* the last bucket: wait for every reduction */
    double t0 = clpar_clock_seconds();
    while (st->next < st->n_buckets) pthread_cond_wait(&st->cv, &st->lock);
    st->stats.wait_seconds += clpar_clock_seconds() - t0;
    st->stats.reductions++;
    clpar_ddp_reset_step(st);
  }
  pthread_mutex_unlock(&st->lock);
}
