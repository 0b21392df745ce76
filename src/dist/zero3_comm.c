/* zero3_comm.c — ZeRO stage 3's collectives (zero3.c) on DistributedDataParallel's
 * communication thread (ddp_comm.c), overlapped with the device's work as the buckets of
 * plain DDP and ZeRO-1/2 are.
 *
 * Two gather slots and two scatter slots of host memory (pinned where the device copies by
 * DMA, as DDP's buckets). The program's thread only posts: a gather posts the read of the
 * unit's shard into its slot on the device's queue, with an event that calls back, and queues
 * the slot; a scatter posts the read of the unit's full gradient likewise. The communication
 * thread takes the queued slots in order (the same order on every rank), waits for the read's
 * callback, and runs MPI_Iallgather on gcomm or clpar_zero_reduce_scatter on rcomm (duplicates
 * of the module's communicator made here, so that neither interleaves with the other nor with
 * the module's own collectives), polled against the job's deadline with DDP's "where are you?"
 * answers (clpar_dist_wait). A gathered slot is taken by the program's thread: it allocates the
 * unit's full buffer and posts the write from the slot (the slot's next gather waits for that
 * write's callback). A reduce-scatter's part, divided by world, goes into the unit's acc on the
 * host (replacing after a zero_grad, adding otherwise); clpar_zero3_flush, at the optimizer's
 * step, waits for the thread and posts acc into the shard's gradient. So neither forward nor
 * backward waits for the device; the program's thread waits for the communication thread only
 * where a unit needs parameters whose gather has not finished. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef CLPAR_HAVE_MPI

#include "dist/zero3_internal.h"

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cv = PTHREAD_COND_INITIALIZER;

static void watch_seen(void *user) {
  z3_watch *w = user;
  pthread_mutex_lock(&watch_lock);
  w->seen = 1;
  pthread_cond_broadcast(&watch_cv);
  pthread_mutex_unlock(&watch_lock);
}

/* Records an event after the work posted to dev so far and watches it; on failure, waits for
 * the device (so that nothing posted still runs) and returns the error. */
static clpar_status watch_post(z3_watch *w, clpar_device *dev) {
  w->seen = 0;
  clpar_status s = clpar_event_record(dev, &w->ev);
  if (s == CLPAR_OK) s = clpar_event_then(w->ev, watch_seen, w);
  if (s == CLPAR_OK) {
    w->posted = 1;
    return CLPAR_OK;
  }
  char msg[MESSAGE_SIZE];
  snprintf(msg, sizeof msg, "%s", clpar_last_error());
  if (w->ev) clpar_event_sync(w->ev);
  clpar_event_release(w->ev);
  w->ev = NULL;
  clpar_worker_drain(dev);
  return clpar_set_error(s, "%s", msg);
}

/* Waits for a watched event's callback (no host wait), then its status. */
static clpar_status watch_wait(z3_watch *w) {
  if (!w->posted) return CLPAR_OK;
  pthread_mutex_lock(&watch_lock);
  while (!w->seen) pthread_cond_wait(&watch_cv, &watch_lock);
  pthread_mutex_unlock(&watch_lock);
  clpar_status s = clpar_event_sync(w->ev); /* complete: no wait */
  clpar_event_release(w->ev);
  w->ev = NULL;
  w->posted = 0;
  return s;
}

/* ---- the program's side ---- */

static z3_slot *gather_slot(zero3 *z, int i) {
  return &z->slots[i];
}

void clpar_z3_enqueue(zero3 *z, z3_slot *g) {
  g->state = Z3_QUEUED;
  g->order = ++z->posted;
  z->ring[z->tail++ % Z3_RING] = (int)(g - z->slots);
  pthread_cond_broadcast(&z->st->cv);
}

/* Waits until the thread has run g; st->lock held. */
static void wait_done(zero3 *z, z3_slot *g) {
  while (g->state == Z3_QUEUED) pthread_cond_wait(&z->st->cv, &z->st->lock);
}

/* Posts the read of dev's [numel] floats of t into dst and watches it; the status of posting. */
static clpar_status post_read(zero3 *z, const clpar_tensor *t, int64_t numel, float *dst,
                              z3_watch *w) {
  clpar_status s = clpar_dev_read(z->dev, t->storage->buf, t->offset * CLPAR_WORD_BYTES, dst,
                                  (size_t)numel * sizeof(float));
  if (s == CLPAR_OK) {
    __atomic_add_fetch(&z->dev->transfers_out, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&z->dev->bytes_out, (uint64_t)numel * sizeof(float), __ATOMIC_RELAXED);
    s = watch_post(w, z->dev);
  } else {
    clpar_worker_drain(z->dev); /* nothing posted may write dst after this */
  }
  return s;
}

/* Posts the gather of u into the free slot g; st->lock not held. */
static void post_gather(zero3 *z, z3_slot *g, z3_unit *u, const char *what) {
  g->u = u;
  g->version = __atomic_load_n(&u->pshard->storage->version, __ATOMIC_RELAXED);
  g->epoch = z->epoch;
  snprintf(g->what, sizeof g->what, "%s", what);
  g->status = post_read(z, u->pshard, u->shard, g->mine, &g->read);
  if (g->status != CLPAR_OK) {
    snprintf(g->msg, sizeof g->msg, "%s", clpar_last_error());
    memset(g->mine, 0, (size_t)u->shard * sizeof(float)); /* takes part with zeros */
  }
  pthread_mutex_lock(&z->st->lock);
  clpar_z3_enqueue(z, g);
  pthread_mutex_unlock(&z->st->lock);
}

/* The slot gathering u's current values, or NULL; a slot gathering values the shard no longer
 * holds (a prefetch across a step) is dropped once done. st->lock held. */
static z3_slot *find_gather(zero3 *z, z3_unit *u) {
  for (int i = 0; i < Z3_SLOTS; i++) {
    z3_slot *g = gather_slot(z, i);
    if (g->state == Z3_FREE || g->u != u) continue;
    if (g->version == __atomic_load_n(&u->pshard->storage->version, __ATOMIC_RELAXED) &&
        g->epoch == z->epoch)
      return g;
    wait_done(z, g);
    g->state = Z3_FREE;
  }
  return NULL;
}

/* A free gather slot: with none free, the oldest posted, once done (dropped: every rank drops
 * the same, the call sequences being the same). st->lock held. */
static z3_slot *free_gather(zero3 *z, int drop) {
  z3_slot *old = NULL;
  for (int i = 0; i < Z3_SLOTS; i++) {
    z3_slot *g = gather_slot(z, i);
    if (g->state == Z3_FREE) return g;
    if (!old || g->order < old->order) old = g;
  }
  if (!drop) return NULL;
  wait_done(z, old);
  old->state = Z3_FREE;
  return old;
}

void clpar_z3_prefetch(z3_unit *u, const char *what) {
  zero3 *z = u->z;
  if (clpar_capture_active(z->dev)) return; /* a captured gather is posted where it is used */
  pthread_mutex_lock(&z->st->lock);
  z3_slot *g = find_gather(z, u) ? NULL : free_gather(z, 0);
  pthread_mutex_unlock(&z->st->lock);
  if (g) post_gather(z, g, u, what);
}

/* The gathered values of slot g into a new device buffer of u's (the write posted, watched
 * for the slot's next gather). */
static clpar_status take_values(zero3 *z, z3_slot *g, z3_unit *u, clpar_tensor **full) {
  int was = clpar_memory_category_set(CLPAR_MEM_PARAMETERS);
  clpar_status s = clpar_tensor_empty(z->dev, 1, &u->numel, full);
  clpar_memory_category_set(was);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(*full);
  s = clpar_dev_write(z->dev, (*full)->storage->buf, (*full)->offset * CLPAR_WORD_BYTES, g->host,
                      (size_t)u->numel * sizeof(float));
  if (s == CLPAR_OK) {
    clpar_tensor_touch(*full);
    __atomic_add_fetch(&z->dev->transfers_in, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&z->dev->bytes_in, (uint64_t)u->numel * sizeof(float), __ATOMIC_RELAXED);
    s = watch_post(&g->write, z->dev);
  } else {
    clpar_worker_drain(z->dev); /* no write posted may read g->host after this */
  }
  if (s != CLPAR_OK) {
    clpar_tensor_release(*full);
    *full = NULL;
  }
  return s;
}

clpar_status clpar_z3_gather_full(z3_unit *u, const char *what, clpar_tensor **full) {
  zero3 *z = u->z;
  *full = NULL;
  if (clpar_capture_active(z->dev)) return clpar_z3_graph_gather(u, what, full);
  pthread_mutex_lock(&z->st->lock);
  z3_slot *g = find_gather(z, u), *fresh = g ? NULL : free_gather(z, 1);
  pthread_mutex_unlock(&z->st->lock);
  if (fresh) post_gather(z, g = fresh, u, what);
  pthread_mutex_lock(&z->st->lock);
  wait_done(z, g);
  g->state = Z3_FREE;
  pthread_mutex_unlock(&z->st->lock);
  if (g->status != CLPAR_OK) return clpar_set_error(g->status, "%s", g->msg);
  return take_values(z, g, u, full);
}

void clpar_z3_post_scatter(z3_unit *u, clpar_tensor *grad) {
  zero3 *z = u->z;
  if (clpar_capture_active(z->dev)) {
    clpar_z3_graph_scatter(u, grad);
    return;
  }
  z3_slot *r = &z->slots[Z3_SLOTS + z->next_scatter];
  z->next_scatter = (z->next_scatter + 1) % Z3_SLOTS;
  pthread_mutex_lock(&z->st->lock);
  wait_done(z, r); /* its last reduce-scatter has read the memory */
  pthread_mutex_unlock(&z->st->lock);
  size_t padded = (size_t)(u->shard * z->world), have = grad ? (size_t)u->numel : 0;
  r->u = u;
  snprintf(r->what, sizeof r->what, "%s", UNIT_TYPE " backward: reduce-scatter of the gradients");
  memset(r->buf + have, 0, (padded - have) * sizeof(float));
  r->status = grad ? post_read(z, grad, u->numel, r->buf, &r->read) : CLPAR_OK;
  if (r->status != CLPAR_OK) {
    snprintf(r->msg, sizeof r->msg, "%s", clpar_last_error());
    memset(r->buf, 0, padded * sizeof(float));
  }
  clpar_tensor_release(grad); /* the queue runs the read before any later use of the memory */
  pthread_mutex_lock(&z->st->lock);
  clpar_z3_enqueue(z, r);
  pthread_mutex_unlock(&z->st->lock);
}

/* ---- the communication thread's side ---- */

/* gather: mine (shard floats) from every rank into host; else buf reduce-scattered into
 * z->part. With the job's deadline; a timeout leaves the memory to MPI. */
static clpar_status collective(zero3 *z, z3_slot *x) {
  z3_unit *u = x->u;
  MPI_Comm comm = x->gather ? z->gcomm : z->rcomm;
  uint64_t *seq = x->gather ? &z->gseq : &z->rseq;
  if (clpar_dist_check_broken()) return CLPAR_ERROR_TIMEOUT;
  clpar_status s =
      clpar_dist_debug_check(comm, x->what, *seq + 1, u->shard * (x->gather ? 1 : z->world) * 4);
  if (s != CLPAR_OK) return s;
  int count = (int)u->shard;
  if (!x->gather) { /* point-to-point, summed in rank order (zero_scatter.c) */
    for (int q = 0; q < z->world; q++) z->rs_counts[q] = count;
    s = clpar_zero_reduce_scatter(comm, x->buf, z->rs_counts, z->part, z->rs_scratch, z->rs_reqs,
                                  x->what, ++*seq);
    if (s != CLPAR_OK) z->abandoned = 1; /* MPI may still use buf, part and the scratch */
    return s;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  clpar_mpi_lock();
  int rc = MPI_Iallgather(x->mine, count, MPI_FLOAT, x->host, count, MPI_FLOAT, comm, &req);
  clpar_mpi_unlock();
  s = rc == MPI_SUCCESS ? clpar_dist_wait(&req, x->what, ++*seq) : clpar_mpi_error(rc, x->what);
  if (s == CLPAR_ERROR_TIMEOUT) z->abandoned = 1;
  return s;
}

/* The part reduced into the unit's averaged shard. */
static void accumulate(zero3 *z, z3_unit *u) {
  ddp_state *st = z->st;
  pthread_mutex_lock(&st->lock);
  int fresh = u->fresh;
  u->fresh = 0;
  u->unflushed = 1;
  pthread_mutex_unlock(&st->lock);
  float inv = 1.0f / (float)z->world;
  if (fresh)
    for (int64_t i = 0; i < u->shard; i++) u->acc[i] = z->part[i] * inv;
  else
    for (int64_t i = 0; i < u->shard; i++) u->acc[i] += z->part[i] * inv;
}

void clpar_z3_run_slot(zero3 *z, z3_slot *x) {
  /* the write of the slot's last gather has read host; a failed write is that take's error */
  if (x->gather && watch_wait(&x->write) != CLPAR_OK) clpar_clear_error();
  clpar_status mine = x->status, s = watch_wait(&x->read);
  if (s != CLPAR_OK && mine == CLPAR_OK) {
    mine = s;
    snprintf(x->msg, sizeof x->msg, "%s", clpar_last_error());
  }
  if (s != CLPAR_OK) /* takes part with zeros, so that no rank waits */
    memset(x->gather ? x->mine : x->buf, 0,
           (size_t)(((z3_unit *)x->u)->shard * (x->gather ? 1 : z->world)) * sizeof(float));
  s = collective(z, x);
  if (s != CLPAR_OK) snprintf(x->msg, sizeof x->msg, "%s", clpar_last_error());
  if (s == CLPAR_OK) s = mine;
  if (s == CLPAR_OK && !x->gather) accumulate(z, x->u);
  if (s != CLPAR_OK && !x->gather) {
    clpar_set_error(s, "%s", x->msg);
    clpar_ddp_record_error(z->st, s, "ZeRO-3");
  }
  x->status = s;
}

int clpar_zero3_job_ready(ddp_state *st) {
  zero3 *z = st->zero3;
  return z && z->head != z->tail;
}

void clpar_zero3_run_job(ddp_state *st) {
  zero3 *z = st->zero3;
  z3_slot *x = &z->slots[z->ring[z->head % Z3_RING]];
  void *job = x->job;
  pthread_mutex_unlock(&st->lock);
  if (job) /* opens its gate: the slot may be queued again before the lock below */
    clpar_z3_graph_run(z, x);
  else
    clpar_z3_run_slot(z, x);
  pthread_mutex_lock(&st->lock);
  x->state = Z3_DONE;
  z->head++;
  pthread_cond_broadcast(&st->cv);
}

/* ---- the step's side ---- */

/* Waits until the thread has run every queued slot; st->lock held. */
static void wait_idle(zero3 *z) {
  while (z->head != z->tail) pthread_cond_wait(&z->st->cv, &z->st->lock);
}

clpar_status clpar_zero3_flush(ddp_state *st) {
  zero3 *z = st->zero3;
  if (clpar_capture_active(z->dev)) return clpar_z3_graph_flush(z);
  clpar_z3_graph_eager(z); /* after the replays in flight, whose thread work writes acc */
  z->epoch++; /* the step changes the shards: a gather posted before holds other values */
  pthread_mutex_lock(&st->lock);
  wait_idle(z);
  clpar_status s = st->error;
  if (s != CLPAR_OK) {
    clpar_set_error(s, "%s", st->message);
    st->error = CLPAR_OK;
  }
  pthread_mutex_unlock(&st->lock);
  for (int k = 0; s == CLPAR_OK && k < z->n_units; k++) {
    z3_unit *u = z->units[k];
    if (!u->unflushed) continue;
    clpar_tensor *g = u->pshard->grad;
    if (!g) {
      int was = clpar_memory_category_set(CLPAR_MEM_GRADIENTS);
      s = clpar_tensor_empty(z->dev, 1, &u->shard, &g);
      clpar_memory_category_set(was);
      if (s != CLPAR_OK) break;
      clpar_tensor_unscope(g);
      u->pshard->grad = g;
    }
    /* from acc, which the thread changes only after the next backward's read on this queue */
    s = clpar_dev_write(z->dev, g->storage->buf, g->offset * CLPAR_WORD_BYTES, u->acc,
                        (size_t)u->shard * sizeof(float));
    if (s != CLPAR_OK) break;
    clpar_tensor_touch(g);
    u->pshard->grad_defined = 1;
    u->unflushed = 0;
  }
  return s;
}

void clpar_zero3_zero_grad(ddp_state *st) {
  zero3 *z = st->zero3;
  if (clpar_capture_active(z->dev)) {
    clpar_z3_graph_zero_grad(z);
    return;
  }
  clpar_z3_graph_eager(z);
  pthread_mutex_lock(&st->lock);
  wait_idle(z);
  for (int k = 0; k < z->n_units; k++) {
    z->units[k]->fresh = 1;
    z->units[k]->unflushed = 0;
  }
  pthread_mutex_unlock(&st->lock);
}

/* ---- setup and teardown ---- */

static clpar_status dup_comm(zero3 *z, MPI_Comm *out) {
  ddp_state *st = z->st;
  const char *what = "clpar_ddp_create: duplicating the communicator for ZeRO-3";
  clpar_status s = clpar_dist_check_broken() ? CLPAR_ERROR_TIMEOUT : CLPAR_OK;
  if (s == CLPAR_OK) s = clpar_dist_debug_check(st->comm, what, st->seq + 1, 0);
  if (s != CLPAR_OK) return s;
  MPI_Request req = MPI_REQUEST_NULL;
  clpar_mpi_lock();
  int rc = MPI_Comm_idup(st->comm, out, &req);
  clpar_mpi_unlock();
  s = rc == MPI_SUCCESS ? clpar_dist_wait(&req, what, ++st->seq) : clpar_mpi_error(rc, what);
  if (s == CLPAR_ERROR_TIMEOUT) z->abandoned = st->abandoned = 1;
  if (s != CLPAR_OK) return s;
  clpar_mpi_lock();
  rc = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
  clpar_mpi_unlock();
  return rc == MPI_SUCCESS ? CLPAR_OK : clpar_mpi_error(rc, what);
}

/* Host memory the device reads or writes: pinned where the device copies by DMA (as DDP's
 * buckets, clpar_ddp_alloc_host_buffers), else malloc'd. */
static float *host_alloc(zero3 *z, size_t n, void **pin) {
  void *ptr = NULL;
  size_t bytes = (n + 1) * sizeof(float);
  int want = z->dev->bd.info.type != CLPAR_DEVICE_CPU || clpar_ddp_pin_cpu;
  *pin = NULL;
  if (want && clpar_dev_host_alloc_sync(z->dev, bytes, pin, &ptr) == CLPAR_OK && ptr) return ptr;
  clpar_clear_error();
  *pin = NULL;
  return calloc(n + 1, sizeof(float));
}

static void host_free(zero3 *z, float *p, void *pin) {
  if (pin)
    clpar_dev_host_free_sync(z->dev, pin);
  else
    free(p);
}

clpar_status clpar_z3_comm_dup(zero3 *z) {
  clpar_status s = dup_comm(z, &z->gcomm);
  return s == CLPAR_OK ? dup_comm(z, &z->rcomm) : s;
}

clpar_status clpar_z3_comm_setup(zero3 *z) {
  clpar_status s = CLPAR_OK;
  size_t all = (size_t)(z->max_shard * z->world);
  for (int i = 0; i < 2 * Z3_SLOTS; i++) {
    z3_slot *x = &z->slots[i];
    x->gather = i < Z3_SLOTS;
    if (x->gather) {
      x->mine = host_alloc(z, (size_t)z->max_shard, &x->pin[0]);
      x->host = host_alloc(z, all, &x->pin[1]);
      if (!x->mine || !x->host) s = CLPAR_ERROR_OUT_OF_MEMORY;
    } else if (!(x->buf = host_alloc(z, all, &x->pin[0]))) {
      s = CLPAR_ERROR_OUT_OF_MEMORY;
    }
  }
  if (!(z->part = calloc((size_t)z->max_shard + 1, sizeof(float)))) s = CLPAR_ERROR_OUT_OF_MEMORY;
  z->rs_counts = calloc((size_t)z->world, sizeof(int));
  z->rs_scratch = calloc(2 * (size_t)z->max_shard + 1, sizeof(float));
  z->rs_reqs = calloc((size_t)z->world + 1, sizeof(MPI_Request));
  if (!z->rs_counts || !z->rs_scratch || !z->rs_reqs) s = CLPAR_ERROR_OUT_OF_MEMORY;
  for (int k = 0; k < z->n_units; k++) {
    z->units[k]->fresh = 1;
    if (!(z->units[k]->acc = calloc((size_t)z->units[k]->shard, sizeof(float))))
      s = CLPAR_ERROR_OUT_OF_MEMORY;
  }
  if (s != CLPAR_OK)
    return clpar_set_error(s, "clpar_ddp_create: out of host memory for ZeRO-3's collectives");
  return CLPAR_OK;
}

/* After the communication thread has ended (it runs every queued slot first). */
void clpar_z3_comm_free(zero3 *z) {
  int live = clpar_is_initialized();
  clpar_z3_graph_free(z);
  for (int i = 0; live && i < 2 * Z3_SLOTS; i++) { /* their callbacks write the slots */
    watch_wait(&z->slots[i].read);
    watch_wait(&z->slots[i].write);
  }
  if (z->abandoned || (z->st && z->st->abandoned)) return; /* MPI may still use the memory */
  for (int i = 0; i < 2 * Z3_SLOTS; i++) {
    z3_slot *x = &z->slots[i];
    if (live || !x->pin[0]) host_free(z, x->gather ? x->mine : x->buf, x->pin[0]);
    if (live || !x->pin[1]) host_free(z, x->host, x->pin[1]);
  }
  free(z->part);
  free(z->rs_counts);
  free(z->rs_scratch);
  free(z->rs_reqs);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || clpar_dist_is_broken()) return;
  clpar_mpi_lock();
  if (z->gcomm != MPI_COMM_NULL) MPI_Comm_free(&z->gcomm);
  if (z->rcomm != MPI_COMM_NULL) MPI_Comm_free(&z->rcomm);
  clpar_mpi_unlock();
}

#endif
