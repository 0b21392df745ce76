/* ddp_graph.c — DistributedDataParallel inside a captured step (clpar/graph.h), over MPI.
 *
 * In a captured step the bucket hand-offs are commands of the device's list, so a replay
 * runs them with no hook, no autograd and no host wait on the calling thread: when backward
 * completes a bucket (in bucket order), its hook posts the reads of its gradients into the
 * bucket's host memory and a host call (runtime.h), which the device runs once the reads are
 * done and which hands the bucket to the communication thread; after the last bucket, for each
 * bucket, a gate and the writes of the averages back. The thread all-reduces the buckets in the
 * order their host calls came (one device, buckets posted in order: bucket order, the same on
 * every rank), averages them and opens each bucket's gate; the device's queue waits at the
 * gate, then writes. Backward itself never waits, in the capture run or a replay.
 *
 * A bucket's host memory is the module's (made once at creation, pinned where that pays), and
 * the host calls and gates are records of the module, made at capture, kept until the module
 * is freed (which makes every graph stale): a replay allocates nothing. The all-reduce keeps
 * the job's deadline and its "where are you?" questions (clpar_dist_wait); one that fails
 * (a peer that does not replay: CLPAR_ERROR_TIMEOUT naming it) opens the gate with its error,
 * so the device's queue goes on and the next call on the device returns that error. A forward
 * that broadcasts the module's buffers posts one more hand-off, "the buffers" (ddp_buffers.c),
 * which reaches the thread before the step's buckets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ddp_internal.h"

typedef struct { /* one bucket of one captured step, or its buffers' broadcast */
  ddp_state *st;
  int k; /* the bucket, or -1: the buffers */
  clpar_host_call call;
  clpar_gate *gate;
  clpar_status read_status; /* the reads' (set by the host call) */
} handoff;

typedef struct record { /* one captured step's hand-offs */
  handoff *h;           /* one per bucket, then the buffers' */
  struct record *next;
} record;

typedef struct {
  record *all;     /* every step captured, kept until the module is freed */
  record *current; /* the step being captured, until its writes are posted */
  int posted;      /* buckets of current whose reads are posted */
  handoff **queue; /* read on the device, not yet reduced, in order (a ring) */
  int head, count, cap;
} ddp_graph;

/* The host call of a bucket: its reads are done; to the communication thread. */
static void arrived(void *user, clpar_status s) {
  handoff *h = user;
  ddp_state *st = h->st;
  ddp_graph *g = st->graph;
  pthread_mutex_lock(&st->lock);
  h->read_status = s;
  if (g->count < g->cap) {
    g->queue[(g->head + g->count++) % g->cap] = h;
    pthread_cond_broadcast(&st->cv);
  } else { /* cannot be: a device's queue runs one step's hand-offs at a time */
    clpar_gate_open(h->gate, CLPAR_ERROR_INTERNAL,
                    "DistributedDataParallel: more buckets read than a step has");
  }
  pthread_mutex_unlock(&st->lock);
}

void *clpar_ddp_graph_take(ddp_state *st) {
  ddp_graph *g = st->graph;
  if (!g || g->count == 0) return NULL;
  handoff *h = g->queue[g->head];
  g->head = (g->head + 1) % g->cap;
  g->count--;
  return h;
}

void clpar_ddp_graph_reduce(ddp_state *st, void *handoff_) {
  handoff *h = handoff_;
  if (h->k < 0) { /* the buffers: broadcast from rank 0 */
    clpar_ddp_buffers_broadcast(st, h->read_status, h->gate);
    return;
  }
  ddp_bucket *b = &st->buckets[h->k];
  if (st->zero_stage) { /* ZeRO-1/2: reduce-scattered, no gate (zero_graph.c) */
    clpar_zero_graph_bucket(st, b, h->read_status);
    return;
  }
  double t0 = clpar_clock_seconds();
  if (h->read_status != CLPAR_OK) { /* takes part with zeros, so that no rank waits */
    clpar_set_error(h->read_status, "%s: the read of a bucket's gradients failed",
                    b->dev->bd.info.id);
    clpar_ddp_record_error(st, h->read_status, "copying a bucket's gradients to host memory");
    memset(b->buf, 0, (size_t)b->numel * sizeof(float));
  }
  double t1 = clpar_clock_seconds();
  clpar_status s = clpar_ddp_allreduce(st, b);
  char message[MESSAGE_SIZE] = "";
  if (s != CLPAR_OK)
    snprintf(message, sizeof message, "DistributedDataParallel: all-reducing a bucket: %s",
             clpar_last_error());
  /* The statistics first: once the gate opens, a read on the device may return and the
   * caller may look at them. */
  double t[4] = {t0, t1, clpar_clock_seconds(), clpar_clock_seconds()};
  clpar_ddp_add_times(st, b, t);
  if (h->k == st->n_buckets - 1) {
    pthread_mutex_lock(&st->lock);
    st->stats.reductions++;
    pthread_mutex_unlock(&st->lock);
  }
  clpar_gate_open(h->gate, s, message); /* the queue writes the averages */
}

/* What a replay cannot hold, or NULL. */
static const char *refusal(const ddp_state *st) {
  if (st->nccl)
    return "its buckets' all-reduce over NCCL (clpar_ddp_backend \"nccl\"), which is not "
           "captured: capture over MPI (CLPAR_DIST_BACKEND=mpi)";
  if (st->find_unused)
    return "find_unused_parameters (clpar_ddp_options): which parameters the forward reaches "
           "is decided on the host at each step";
  if (st->uneven_inputs)
    return "uneven_inputs (clpar_ddp_options, clpar_ddp_join): each forward all-reduces a "
           "flag on the host";
  for (int k = 1; k < st->n_buckets; k++)
    if (st->buckets[k].dev != st->buckets[0].dev)
      return "a module over several devices (its buckets' hand-offs would reach the "
             "communication thread in an order the ranks need not share)";
  if (st->sync_buffers && st->n_buffers > 0) return clpar_ddp_buffers_refusal(st);
  return NULL;
}

static clpar_status new_record(ddp_state *st, ddp_graph *g) {
  record *r = calloc(1, sizeof *r);
  handoff *h = r ? calloc((size_t)st->n_buckets + 1, sizeof *h) : NULL;
  if (!h) {
    free(r);
    return clpar_ddp_oom();
  }
  r->h = h;
  r->next = g->all;
  g->all = r;
  for (int k = 0; k <= st->n_buckets; k++) {
    h[k] = (handoff){st, k < st->n_buckets ? k : -1, {arrived, &h[k]}, clpar_gate_new(), CLPAR_OK};
    if (!h[k].gate) return clpar_ddp_oom();
  }
  g->current = r;
  g->posted = 0;
  return CLPAR_OK;
}

/* Inside a capture: the refusals, then this step's record. */
static clpar_status capture_forward(ddp_state *st, clpar_device *dev) {
  const char *what = refusal(st);
  if (what) return clpar_capture_refuse(dev, "DistributedDataParallel's forward", what);
  if (st->zero_stage == 3) return CLPAR_OK; /* its units hand their collectives over */
  ddp_graph *g = st->graph;
  if (!g) {
    g = calloc(1, sizeof *g);
    handoff **q = g ? calloc(2 * ((size_t)st->n_buckets + 1), sizeof *q) : NULL;
    if (!q) {
      free(g);
      return clpar_ddp_oom();
    }
    g->queue = q;
    g->cap = 2 * (st->n_buckets + 1);
    pthread_mutex_lock(&st->lock);
    st->graph = g;
    pthread_mutex_unlock(&st->lock);
  }
  if (g->current && g->posted == 0) return CLPAR_OK; /* a forward whose backward posted none */
  return new_record(st, g);
}

clpar_status clpar_ddp_graph_forward(ddp_state *st) {
  clpar_device *dev = st->n_buckets ? st->buckets[0].dev : NULL;
  if (!dev) return CLPAR_OK;
  if (clpar_capture_active(dev)) return capture_forward(st, dev);
  /* an eager step after a capture: the replays still in flight run first, so that its
   * buckets and its broadcast of the buffers do not meet the thread's (a forward that
   * broadcasts nothing and whose backward hands no bucket over, without gradients or without
   * sync, need not wait); ZeRO-3: its units' gathers (zero3_graph.c) */
  if (st->zero_stage == 3) clpar_zero3_graph_eager(st);
  if (!st->graph) return CLPAR_OK;
  int broadcasts = st->sync_buffers && st->n_buffers > 0;
  if (!broadcasts && (!clpar_is_grad_enabled() || st->no_sync)) return CLPAR_OK;
  return clpar_replays_wait(dev);
}

/* The bucket's reads into its host memory and the host call that hands it over. */
static void post_read(ddp_state *st, handoff *h) {
  ddp_bucket *b = &st->buckets[h->k];
  clpar_ddp_make_runs(st, b);
  clpar_status s = CLPAR_OK;
  for (int i = b->first; s == CLPAR_OK && i < b->first + b->count; i++)
    if (st->zero_stage == 2 ? !st->params[i].posted : !st->params[i].param->grad)
      s = clpar_capture_refuse(b->dev, "DistributedDataParallel's backward",
                               "a parameter without a gradient (its bucket would take zeros, "
                               "decided on the host)");
  clpar_capture_allow(1);
  for (int k = 0; s == CLPAR_OK && k < b->n_runs; k++) {
    ddp_run *r = &b->runs[k];
    s = clpar_dev_read(b->dev, r->storage->buf, r->word * CLPAR_WORD_BYTES, b->buf + r->host,
                       (size_t)r->numel * sizeof(float));
  }
  clpar_capture_allow(0);
  if (s == CLPAR_OK) s = clpar_dev_host_call(b->dev, &h->call);
  if (s != CLPAR_OK) { /* the thread never gets it: its gate opens failed */
    clpar_ddp_record_error(st, s, "posting the copy of a bucket's gradients to host memory");
    clpar_gate_open(h->gate, s, st->message);
  }
}

/* After the last bucket: each bucket's gate, then the writes of its averages. */
static void post_writes(ddp_state *st, record *r) {
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    clpar_status s = clpar_dev_gate_wait(b->dev, r->h[k].gate);
    clpar_capture_allow(1);
    for (int j = 0; s == CLPAR_OK && j < b->n_runs; j++) {
      ddp_run *run = &b->runs[j];
      s = clpar_dev_write(b->dev, run->storage->buf, run->word * CLPAR_WORD_BYTES,
                          b->buf + run->host, (size_t)run->numel * sizeof(float));
      __atomic_add_fetch(&run->storage->version, 1, __ATOMIC_RELAXED);
    }
    clpar_capture_allow(0);
    if (s != CLPAR_OK) clpar_ddp_record_error(st, s, "writing averaged gradients back");
  }
}

int clpar_ddp_graph_hook(ddp_state *st, ddp_param *p) {
  ddp_bucket *pb = &st->buckets[p->bucket];
  if (!clpar_capture_active(pb->dev)) return 0;
  ddp_graph *g = st->graph;
  if (!g || !g->current) {
    clpar_capture_refuse(pb->dev, "DistributedDataParallel's backward",
                         "a backward whose forward ran before the capture");
    return 1;
  }
  record *r = g->current;
  while (g->posted < st->n_buckets && st->buckets[g->posted].complete) {
    handoff *h = &r->h[g->posted++];
    pthread_mutex_unlock(&st->lock); /* posting takes no lock of ours; the thread goes on */
    post_read(st, h);
    pthread_mutex_lock(&st->lock);
  }
  if (g->posted == st->n_buckets) {
    pthread_mutex_unlock(&st->lock);
    if (st->zero_stage) /* ZeRO-1/2: the step waits for the reductions (zero_graph.c) */
      clpar_zero_graph_backward(st);
    else
      post_writes(st, r);
    pthread_mutex_lock(&st->lock);
    g->current = NULL;
    g->posted = 0;
    clpar_ddp_reset_step(st);
  }
  return 1;
}

clpar_status clpar_ddp_graph_buffers(ddp_state *st) {
  if (st->zero_stage == 3) return clpar_zero3_graph_buffers(st); /* a job of its queue */
  ddp_graph *g = st->graph; /* the forward's capture_forward made this step's record */
  handoff *h = &g->current->h[st->n_buckets];
  return clpar_ddp_buffers_post(st, &h->call, h->gate);
}

void clpar_ddp_graph_quiesce(ddp_state *st) {
  clpar_zero3_graph_quiesce(st);
  if (!st->graph) return;
  clpar_graph_invalidate_all("the freeing of a DistributedDataParallel module");
  if (clpar_is_initialized() && st->n_buckets) /* the thread opens the gates of what runs */
    clpar_worker_drain(st->buckets[0].dev);
}

void clpar_ddp_graph_free(ddp_state *st) {
  ddp_graph *g = st->graph;
  if (!g) return;
  for (record *r = g->all, *next; r; r = next) {
    next = r->next;
    for (int k = 0; k <= st->n_buckets; k++) clpar_gate_free(r->h[k].gate);
    free(r->h);
    free(r);
  }
  free(g->queue);
  free(g);
  st->graph = NULL;
}
