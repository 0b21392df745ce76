/* zero_graph.c — ZeRO stages 1 and 2 (zero.h) inside a captured step (clpar/graph.h), over MPI,
 * on DistributedDataParallel's captured bucket hand-offs (ddp_graph.c).
 *
 * Backward in a capture hands each bucket to the communication thread as plain DDP's does (the
 * reads into the bucket's host memory, laid out as its range of the flat gradient, then a host
 * call; stage 2's reads are those its hook posts as each gradient is final); the thread
 * reduce-scatters the bucket into the rank's averaged shard on the host (zero_comm.c) instead of
 * all-reducing it, and nothing is written back; after the last bucket, a host call and a gate:
 * the thread, which takes the call once it has reduced every bucket handed over before it (the
 * host calls reach it in the order the device ran them), opens the gate, so that the device's
 * queue goes on once the rank's averaged shard is whole (as an eager backward waits for its
 * reductions). The optimizer's step in a capture posts:
 *   - the write of the averaged shard into the shard's gradient (stage 1: the view of the flat
 *     gradient; stage 2: its own);
 *   - the inner optimizer's step, captured as any optimizer's (its learning rate and step count
 *     patched at each replay);
 *   - the read of the rank's shard of the parameters into mine;
 *   - a host call and a gate: the thread (stage 2: first resets the averaged shard, which the
 *     write above consumed) all-gathers the shards, with the job's deadline and its "where are
 *     you?" questions, then opens the gate;
 *   - the write of the gathered parameters into the flat parameters.
 * Every rank replays the same graph, so the collectives come in the same order on every rank.
 *
 * An error on the thread (a failed read, a collective that timed out naming the rank that did
 * not come) opens the gates with it: the device's queue goes on, and the next call on the device
 * returns it (an eager step agrees on every rank's status with collectives of its own; a replay
 * has none). The host calls and gates are records made at capture and kept until the optimizer
 * or the module is freed, either of which makes every graph stale: a replay allocates nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef CLPAR_HAVE_MPI

#include "dist/zero_internal.h"

enum { QUEUE = 8 };

typedef struct zjob { /* a host call of a captured step, and the gate the thread opens for it */
  ddp_state *st;
  clpar_zero_optimizer *z; /* NULL: after a backward, every bucket is reduced; else all-gather */
  clpar_host_call call;
  clpar_gate *gate;
  clpar_status status; /* the device's work before the call (set by the call) */
  struct zjob *next;
} zjob;

typedef struct {
  zjob *all; /* every capture's records */
  /* buckets captured backwards handed over since the last step (captured or eager) or eager
   * zero_grad: their reductions are on the host, not yet spent (st->lock) */
  int pending;
  zjob *queue[QUEUE]; /* host calls come, not yet run, in order (a ring; st->lock) */
  int head, count;
} zero_graph;

static clpar_device *device_of(const clpar_zero_optimizer *z) {
  return z->flat ? z->flat->storage->dev : NULL;
}

int clpar_zero_graph_capturing(const clpar_zero_optimizer *z) {
  clpar_device *dev = device_of(z);
  return z->stage != 3 && dev && clpar_capture_active(dev);
}

/* The module's records, made on first use; NULL when out of memory. */
static zero_graph *graph_of(ddp_state *st) {
  if (st->zgraph) return st->zgraph;
  zero_graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  pthread_mutex_lock(&st->lock);
  st->zgraph = g;
  pthread_mutex_unlock(&st->lock);
  return g;
}

/* ---- the capture's side ---- */

static void arrived(void *user, clpar_status s);

/* A new host call and gate for the thread (z: the step's all-gather; NULL: a backward's end),
 * kept with the module's records, or NULL when out of memory. */
static zjob *new_job(ddp_state *st, clpar_zero_optimizer *z) {
  zero_graph *g = graph_of(st);
  zjob *j = g ? calloc(1, sizeof *j) : NULL;
  if (!j) return NULL;
  *j = (zjob){st, z, {arrived, j}, clpar_gate_new(), CLPAR_OK, NULL};
  if (!j->gate) {
    free(j);
    return NULL;
  }
  pthread_mutex_lock(&st->lock);
  j->next = g->all;
  g->all = j;
  pthread_mutex_unlock(&st->lock);
  return j;
}

/* Posts a copy between t's memory and host[0 .. n): write (host to t) or read. */
static clpar_status post_copy(clpar_device *dev, clpar_tensor *t, float *host, int64_t n,
                              int write) {
  size_t at = t->offset * CLPAR_WORD_BYTES, bytes = (size_t)n * sizeof(float);
  clpar_capture_allow(1);
  clpar_status s = write ? clpar_dev_write(dev, t->storage->buf, at, host, bytes)
                         : clpar_dev_read(dev, t->storage->buf, at, host, bytes);
  clpar_capture_allow(0);
  if (write) clpar_tensor_touch(t);
  return s;
}

/* A new job's host call and its gate on dev. */
static clpar_status post_job(clpar_device *dev, ddp_state *st, clpar_zero_optimizer *z,
                             const char *fn) {
  zjob *j = new_job(st, z);
  if (!j) return clpar_capture_refuse(dev, fn, "ZeRO's records of the step (out of host memory)");
  clpar_status s = clpar_dev_host_call(dev, &j->call);
  return s == CLPAR_OK ? clpar_dev_gate_wait(dev, j->gate) : s;
}

clpar_status clpar_zero_graph_backward(ddp_state *st) {
  clpar_status s = post_job(st->buckets[0].dev, st, NULL, "DistributedDataParallel's backward");
  if (s == CLPAR_OK) {
    pthread_mutex_lock(&st->lock);
    ((zero_graph *)st->zgraph)->pending += st->n_buckets;
    pthread_mutex_unlock(&st->lock);
  }
  return s;
}

/* The rank's step between the gates: averaged shard in, inner step, shard out. */
static clpar_status post_shard_step(clpar_zero_optimizer *z, clpar_device *dev) {
  const char *fn = "clpar_zero_optimizer_step";
  if (z->len == 0) return CLPAR_OK;
  if (z->stage == 1 && !z->flat->grad)
    return clpar_capture_refuse(dev, fn, "a step of a module without a gradient");
  clpar_status s = z->stage == 1 ? clpar_zero_bind_grad_shard(z) : CLPAR_OK;
  if (s == CLPAR_OK)
    s = post_copy(dev, z->gshard, clpar_zero_comm_shard(z->st, &(int){0}), z->len, 1);
  if (s == CLPAR_OK) s = clpar_optimizer_step(z->inner);
  /* mine's padding past len stays the zeros it was made with */
  if (s == CLPAR_OK) s = post_copy(dev, z->pshard, z->mine, z->len, 0);
  return s;
}

clpar_status clpar_zero_graph_step(clpar_zero_optimizer *z) {
  const char *fn = "clpar_zero_optimizer_step";
  ddp_state *st = z->st;
  clpar_device *dev = device_of(z);
  pthread_mutex_lock(&st->lock);
  zero_graph *g = st->zgraph;
  int pending = g ? g->pending : 0;
  if (g) g->pending = 0;
  pthread_mutex_unlock(&st->lock);
  if (pending == 0)
    return clpar_capture_refuse(dev, fn,
                                "a step without a backward of the module in the same capture "
                                "(the averaged shard it would step is the eager backward's, on "
                                "the host)");
  clpar_status s = post_shard_step(z, dev); /* after the backward's gate */
  if (s == CLPAR_OK) s = post_job(dev, st, z, fn);
  if (s == CLPAR_OK) s = post_copy(dev, z->flat, z->host, z->numel, 1);
  return s;
}

clpar_status clpar_zero_graph_zero_grad(clpar_zero_optimizer *z) {
  ddp_state *st = z->st;
  int have = 0;
  clpar_zero_comm_shard(st, &have);
  pthread_mutex_lock(&st->lock);
  zero_graph *g = st->zgraph;
  int pending = g ? g->pending : 0;
  pthread_mutex_unlock(&st->lock);
  /* stage 1's next backward replaces the averaged shard; stage 2's adds to it */
  if (pending || (z->stage == 2 && have))
    return clpar_capture_refuse(device_of(z), "clpar_zero_optimizer_zero_grad",
                                "forgetting the averaged shard that a backward reduce-scattered "
                                "into host memory, host work a replay cannot hold (zero the "
                                "gradients before the step's backward, or eagerly after a "
                                "capture that ended without the step)");
  if (z->stage == 1) return z->flat->grad ? clpar_fill(z->flat->grad, 0.0f) : CLPAR_OK;
  clpar_zero_release_grads(st); /* any a backward without sync left on the device */
  return CLPAR_OK;
}

void clpar_zero_graph_eager(clpar_zero_optimizer *z) {
  ddp_state *st = z->st;
  pthread_mutex_lock(&st->lock);
  zero_graph *g = st->zgraph;
  if (g) g->pending = 0;
  pthread_mutex_unlock(&st->lock);
  /* the replays in flight end after their thread work (their last gate opens after it) */
  if (g && device_of(z)) clpar_replays_wait(device_of(z));
}

/* ---- the communication thread's side ---- */

/* A host call of a step: the work before it ran; to the communication thread. */
static void arrived(void *user, clpar_status s) {
  zjob *j = user;
  ddp_state *st = j->st;
  zero_graph *g = st->zgraph;
  pthread_mutex_lock(&st->lock);
  j->status = s;
  if (g->count < QUEUE) {
    g->queue[(g->head + g->count++) % QUEUE] = j;
    pthread_cond_broadcast(&st->cv);
  } else { /* cannot be: a device's queue runs one step's host calls at a time */
    clpar_gate_open(j->gate, CLPAR_ERROR_INTERNAL, "clpar_zero_optimizer_step: too many steps");
  }
  pthread_mutex_unlock(&st->lock);
}

void *clpar_zero_graph_take(ddp_state *st) {
  zero_graph *g = st->zgraph;
  if (!g || g->count == 0) return NULL;
  zjob *j = g->queue[g->head];
  g->head = (g->head + 1) % QUEUE;
  g->count--;
  return j;
}

void clpar_zero_graph_bucket(ddp_state *st, ddp_bucket *b, clpar_status read_status) {
  double t[4];
  t[0] = clpar_clock_seconds();
  if (read_status != CLPAR_OK) { /* takes part with zeros, so that no rank waits */
    clpar_set_error(read_status, "%s: the read of a bucket's gradients failed", b->dev->bd.info.id);
    clpar_ddp_record_error(st, read_status, "copying a bucket's gradients to host memory");
    memset(b->buf, 0, (size_t)b->numel * sizeof(float));
  }
  t[1] = clpar_clock_seconds();
  clpar_zero_scatter_bucket(st, b, t); /* an error is kept in st->error */
  if (b == &st->buckets[st->n_buckets - 1]) {
    pthread_mutex_lock(&st->lock);
    st->stats.reductions++;
    pthread_mutex_unlock(&st->lock);
  }
}

void clpar_zero_graph_run(ddp_state *st, void *job) {
  zjob *j = job;
  clpar_zero_optimizer *z = j->z;
  clpar_status s = j->status;
  char message[MESSAGE_SIZE] = "";
  if (s != CLPAR_OK) {
    snprintf(message, sizeof message, "clpar_zero_optimizer_step: %s: %s",
             z ? "reading the rank's shard of the parameters" : "the device's work before the step",
             clpar_last_error());
    clpar_ddp_record_error(st, s, message);
  }
  if (!z) { /* the buckets before it are reduced: their first error, if any */
    pthread_mutex_lock(&st->lock);
    if (s == CLPAR_OK && st->error != CLPAR_OK) {
      s = st->error;
      snprintf(message, sizeof message, "%s", st->message);
    }
    pthread_mutex_unlock(&st->lock);
  } else {
    if (z->stage == 2) clpar_zero_comm_reset(st); /* the write of the shard ran before */
    clpar_status a = clpar_zero_all_gather(z, "ZeRO's all-gather of the parameters (a replay)");
    if (a != CLPAR_OK) {
      clpar_ddp_record_error(st, a, "all-gathering the parameters");
      if (s == CLPAR_OK) {
        s = a;
        snprintf(message, sizeof message, "DistributedDataParallel: %s", clpar_last_error());
      }
    }
  }
  clpar_gate_open(j->gate, s, message);
}

/* ---- freeing ---- */

static int queued(const zero_graph *g, const clpar_zero_optimizer *z) {
  for (int k = 0; k < g->count; k++)
    if (g->queue[(g->head + k) % QUEUE]->z == z) return 1;
  return 0;
}

static void free_jobs(zjob *j) {
  for (zjob *next; j; j = next) {
    next = j->next;
    clpar_gate_free(j->gate);
    free(j);
  }
}

void clpar_zero_graph_forget(clpar_zero_optimizer *z) {
  ddp_state *st = z->st;
  zero_graph *g = st ? st->zgraph : NULL;
  int has = 0;
  for (zjob *j = g ? g->all : NULL; j && !has; j = j->next) has = j->z == z;
  if (!has) return;
  clpar_graph_invalidate_all("the freeing of a ZeRO optimizer");
  if (clpar_is_initialized()) clpar_worker_drain(device_of(z)); /* the replays in flight run */
  pthread_mutex_lock(&st->lock);
  while (st->busy || queued(g, z)) pthread_cond_wait(&st->cv, &st->lock);
  zjob **at = &g->all, *mine = NULL;
  while (*at) {
    zjob *j = *at;
    if (j->z == z) {
      *at = j->next;
      j->next = mine;
      mine = j;
    } else {
      at = &j->next;
    }
  }
  pthread_mutex_unlock(&st->lock);
  free_jobs(mine);
}

void clpar_zero_graph_free(ddp_state *st) {
  zero_graph *g = st->zgraph;
  if (!g) return;
  free_jobs(g->all);
  free(g);
  st->zgraph = NULL;
}

#endif
