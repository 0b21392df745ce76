/* zero3_graph.c — ZeRO stage 3 (zero3.c) inside a captured step (clpar/graph.h), over MPI.
 *
 * In a capture each collective of a unit is a blocking hand-off to DDP's communication thread,
 * made of plain commands of the device's list:
 *   - a gather (the unit's forward, and again its backward): the read of the rank's shard into
 *     host memory, a host call (the queue calls it once the read is done) that queues the
 *     all-gather for the thread, a gate the queue waits at until the thread opens it, the write
 *     of the gathered parameters into a buffer of the unit's numel floats;
 *   - a reduce-scatter (the unit's backward): the read of the unit's full gradient into host
 *     memory, a host call, a gate (the thread added the rank's averaged shard into the unit's
 *     acc, replacing it after a zero_grad, as eagerly);
 *   - zero_grad: a host call and a gate (the thread marks every acc to be replaced);
 *   - the broadcast of the module's buffers from rank 0 (broadcast_buffers, before the
 *     forward's first gather): ddp_buffers.c's reads (rank 0), host call, gate and writes (the
 *     other ranks), the thread broadcasting the module's block as eagerly;
 *   - the optimizer's step: the write of acc into the shard's gradient of each unit that a
 *     captured backward reduce-scattered, then the inner optimizer's step, captured as any.
 * The thread takes the hand-offs in the order the device ran them (one at a time: each waits
 * at its gate before the next is posted), the same order on every rank, on the same queue and
 * communicators as the eager collectives, so an eager step before or after replays keeps the
 * ranks matched. Unlike the eager path there is no prefetch: the device waits at each gate for
 * its collective (the collectives do not overlap the device's work).
 *
 * The gathered parameters and the gradient are buffers allocated during the capture: the
 * graph's pool, each freed when the unit is done as eagerly (the next unit's allocation reuses
 * it), so a replay allocates nothing and holds at most one unit's full parameters and gradient
 * at a time as the eager step does. The host memory (one slot of the rank's shard and world
 * shards, used by one hand-off at a time) and the host calls and gates are records of the
 * module, made at capture and kept until it is freed, which makes every graph stale.
 *
 * An error on the thread (a collective that timed out naming the rank that did not come)
 * opens the gate with it: the device's queue goes on and the next call on the device returns
 * it. A replay has no collective agreeing on the ranks' statuses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef CLPAR_HAVE_MPI

#include "dist/zero3_internal.h"

enum { JOB_GATHER, JOB_SCATTER, JOB_ZERO_GRAD, JOB_BUFFERS };

typedef struct z3job { /* one hand-off of a captured step */
  zero3 *z;
  int kind;
  z3_unit *u; /* NULL for zero_grad and the buffers */
  const char *what;
  clpar_host_call call;
  clpar_gate *gate;
  struct z3job *next;
} z3job;

typedef struct {
  z3job *all;     /* every capture's */
  float *mine;    /* [max shard]: the rank's shard read for a gather */
  float *host;    /* [world max shard]: a gather's parameters, a reduce-scatter's gradient */
  int *scattered; /* per unit: reduce-scattered in a capture since its last zero_grad or step */
  int abandoned;  /* a collective timed out: MPI may still use mine and host */
} z3graph;

static z3_slot *capture_slot(zero3 *z) {
  return &z->slots[2 * Z3_SLOTS];
}

/* The module's records, made on first use with the host memory; NULL when out of memory. */
static z3graph *graph_of(zero3 *z) {
  if (z->graph) return z->graph;
  z3graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->mine = calloc((size_t)z->max_shard + 1, sizeof(float));
  g->host = calloc((size_t)(z->max_shard * z->world) + 1, sizeof(float));
  g->scattered = calloc((size_t)z->n_units + 1, sizeof(int));
  if (!g->mine || !g->host || !g->scattered) {
    free(g->mine);
    free(g->host);
    free(g->scattered);
    free(g);
    return NULL;
  }
  z3_slot *x = capture_slot(z);
  x->gather = 1;
  x->mine = g->mine;
  x->host = x->buf = g->host; /* one hand-off at a time */
  pthread_mutex_lock(&z->st->lock);
  z->graph = g;
  pthread_mutex_unlock(&z->st->lock);
  return g;
}

static void arrived(void *user, clpar_status s);

static z3job *new_job(zero3 *z, int kind, z3_unit *u, const char *what) {
  z3graph *g = graph_of(z);
  z3job *j = g ? calloc(1, sizeof *j) : NULL;
  if (!j) return NULL;
  *j = (z3job){z, kind, u, what, {arrived, j}, clpar_gate_new(), g->all};
  if (!j->gate) {
    free(j);
    return NULL;
  }
  g->all = j; /* the thread never walks the list */
  return j;
}

/* Posts a copy between t's memory and host[0 .. n): write (host to t) or read. */
static clpar_status post_copy(zero3 *z, clpar_tensor *t, float *host, int64_t n, int write) {
  size_t at = t->offset * CLPAR_WORD_BYTES, bytes = (size_t)n * sizeof(float);
  clpar_capture_allow(1);
  clpar_status s = write ? clpar_dev_write(z->dev, t->storage->buf, at, host, bytes)
                         : clpar_dev_read(z->dev, t->storage->buf, at, host, bytes);
  clpar_capture_allow(0);
  if (s == CLPAR_OK && write) clpar_tensor_touch(t);
  return s;
}

/* A new job's host call and gate on the device (after the reads posted before). */
static clpar_status post_job(zero3 *z, int kind, z3_unit *u, const char *what) {
  z3job *j = new_job(z, kind, u, what);
  if (!j)
    return clpar_capture_refuse(z->dev, what, "ZeRO-3's records of the step (out of host memory)");
  clpar_status s = clpar_dev_host_call(z->dev, &j->call);
  return s == CLPAR_OK ? clpar_dev_gate_wait(z->dev, j->gate) : s;
}

/* ---- the capture's side ---- */

clpar_status clpar_z3_graph_gather(z3_unit *u, const char *what, clpar_tensor **full) {
  zero3 *z = u->z;
  z3graph *g = graph_of(z);
  if (!g) return clpar_capture_refuse(z->dev, what, "ZeRO-3's host memory (out of host memory)");
  clpar_status s = post_copy(z, u->pshard, g->mine, u->shard, 0);
  if (s == CLPAR_OK) s = post_job(z, JOB_GATHER, u, what);
  if (s != CLPAR_OK) return s;
  int was = clpar_memory_category_set(CLPAR_MEM_PARAMETERS);
  s = clpar_tensor_empty(z->dev, 1, &u->numel, full); /* the graph's pool */
  clpar_memory_category_set(was);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(*full);
  s = post_copy(z, *full, g->host, u->numel, 1);
  if (s != CLPAR_OK) {
    clpar_tensor_release(*full);
    *full = NULL;
  }
  return s;
}

static int unit_index(const zero3 *z, const z3_unit *u) {
  int k = 0;
  while (z->units[k] != u) k++;
  return k;
}

void clpar_z3_graph_scatter(z3_unit *u, clpar_tensor *grad) {
  zero3 *z = u->z;
  const char *what = UNIT_TYPE " backward: reduce-scatter of the gradients";
  z3graph *g = graph_of(z);
  clpar_status s = CLPAR_OK;
  if (!grad) /* the backward failed, and the capture with it */
    return;
  if (!g) s = clpar_capture_refuse(z->dev, what, "ZeRO-3's host memory (out of host memory)");
  if (s == CLPAR_OK) s = post_copy(z, grad, g->host, u->numel, 0);
  if (s == CLPAR_OK) s = post_job(z, JOB_SCATTER, u, what);
  clpar_tensor_release(grad); /* back to the graph's pool, after the read on the queue */
  if (s == CLPAR_OK) {
    g->scattered[unit_index(z, u)] = 1;
  } else {
    clpar_ddp_record_error(z->st, s, "posting a captured reduce-scatter");
    clpar_capture_refuse(z->dev, what, "the reduce-scatter could not be posted");
  }
}

clpar_status clpar_z3_graph_flush(zero3 *z) {
  const char *fn = "clpar_zero_optimizer_step";
  z3graph *g = z->graph;
  z->epoch++; /* the step changes the shards */
  clpar_status s = CLPAR_OK;
  for (int k = 0; g && s == CLPAR_OK && k < z->n_units; k++) {
    z3_unit *u = z->units[k];
    if (!g->scattered[k]) continue;
    g->scattered[k] = 0;
    clpar_tensor *grad = u->pshard->grad;
    if (!grad) { /* made in the capture: the graph's */
      int was = clpar_memory_category_set(CLPAR_MEM_GRADIENTS);
      s = clpar_tensor_empty(z->dev, 1, &u->shard, &grad);
      clpar_memory_category_set(was);
      if (s != CLPAR_OK) break;
      clpar_tensor_unscope(grad);
      u->pshard->grad = grad;
    }
    /* acc is the thread's: the device runs this write after the last reduce-scatter's gate
     * and before the next one's read */
    s = post_copy(z, grad, u->acc, u->shard, 1);
    if (s == CLPAR_OK) u->pshard->grad_defined = 1;
  }
  if (s != CLPAR_OK) clpar_prefix_error("%s: ", fn);
  return s;
}

void clpar_z3_graph_zero_grad(zero3 *z) {
  const char *fn = "clpar_zero_optimizer_zero_grad";
  z3graph *g = graph_of(z);
  if (!g) {
    clpar_capture_refuse(z->dev, fn, "ZeRO-3's host memory (out of host memory)");
    return;
  }
  memset(g->scattered, 0, (size_t)z->n_units * sizeof(int));
  if (post_job(z, JOB_ZERO_GRAD, NULL, fn) != CLPAR_OK) /* the capture fails with it */
    clpar_capture_refuse(z->dev, fn, "its hand-off could not be posted");
}

/* The forward's broadcast of the buffers (ddp_buffers.c's posting), a job of the same queue
 * as the gathers: posted before the first, so every rank runs them in the same order. */
clpar_status clpar_zero3_graph_buffers(ddp_state *st) {
  zero3 *z = st->zero3;
  const char *what = "DistributedDataParallel's forward: the broadcast of the buffers";
  z3job *j = new_job(z, JOB_BUFFERS, NULL, what);
  if (!j)
    return clpar_capture_refuse(z->dev, what, "ZeRO-3's records of the step (out of host memory)");
  return clpar_ddp_buffers_post(st, &j->call, j->gate);
}

/* ---- the communication thread's side ---- */

/* A host call of a captured step: the work before it ran; to the communication thread. The
 * job before it opened its gate already (the queue waited there), so the slot is free. */
static void arrived(void *user, clpar_status s) {
  z3job *j = user;
  zero3 *z = j->z;
  z3_slot *x = capture_slot(z);
  pthread_mutex_lock(&z->st->lock);
  x->job = j;
  x->u = j->u;
  x->gather = j->kind == JOB_GATHER;
  x->status = s;
  snprintf(x->what, sizeof x->what, "%s", j->what);
  if (s != CLPAR_OK)
    snprintf(x->msg, sizeof x->msg, "the device's work before it failed (%s)",
             clpar_status_name(s));
  clpar_z3_enqueue(z, x);
  pthread_mutex_unlock(&z->st->lock);
}

static void mark_fresh(zero3 *z) {
  pthread_mutex_lock(&z->st->lock);
  for (int k = 0; k < z->n_units; k++) {
    z->units[k]->fresh = 1;
    z->units[k]->unflushed = 0;
  }
  pthread_mutex_unlock(&z->st->lock);
}

void clpar_z3_graph_run(zero3 *z, z3_slot *x) {
  z3job *j = x->job;
  z3_unit *u = j->u;
  if (j->kind == JOB_BUFFERS) { /* opens the gate, with the broadcast's error */
    clpar_ddp_buffers_broadcast(z->st, x->status, j->gate);
    return;
  }
  if (j->kind == JOB_ZERO_GRAD) {
    mark_fresh(z);
  } else {
    size_t all = (size_t)(u->shard * z->world);
    if (x->status != CLPAR_OK) /* takes part with zeros, so that no rank waits */
      memset(x->gather ? x->mine : x->buf, 0, (x->gather ? (size_t)u->shard : all) * sizeof(float));
    else if (!x->gather) /* the padding past numel (a gather's values were there) */
      memset(x->buf + u->numel, 0, (all - (size_t)u->numel) * sizeof(float));
    clpar_z3_run_slot(z, x);
    if (z->abandoned) ((z3graph *)z->graph)->abandoned = 1;
  }
  char message[MESSAGE_SIZE + 128] = "";
  if (x->status != CLPAR_OK)
    snprintf(message, sizeof message, "ZeRO-3: %s (a replay): %s", j->what, x->msg);
  clpar_gate_open(j->gate, x->status, message); /* last: the next host call may come */
}

/* ---- eager work after a capture, and freeing ---- */

void clpar_z3_graph_eager(zero3 *z) {
  if (!z || !z->graph) return;
  clpar_replays_wait(z->dev); /* they end after their thread work (their last gate opens) */
  z->epoch++;
}

int clpar_zero3_capturing(ddp_state *st) {
  zero3 *z = st->zero3;
  return z && clpar_capture_active(z->dev);
}

void clpar_zero3_graph_eager(ddp_state *st) {
  clpar_z3_graph_eager(st->zero3);
}

void clpar_zero3_graph_quiesce(ddp_state *st) {
  zero3 *z = st->zero3;
  if (!z || !z->graph) return;
  clpar_graph_invalidate_all("the freeing of a DistributedDataParallel module");
  if (clpar_is_initialized()) clpar_worker_drain(z->dev); /* the thread opens their gates */
}

void clpar_z3_graph_free(zero3 *z) {
  z3graph *g = z->graph;
  if (!g) return;
  for (z3job *j = g->all, *next; j; j = next) {
    next = j->next;
    clpar_gate_free(j->gate);
    free(j);
  }
  if (!g->abandoned && !z->abandoned) { /* else MPI may still write them: left allocated */
    free(g->mine);
    free(g->host);
  }
  free(g->scattered);
  free(g);
  z->graph = NULL;
}

#endif
