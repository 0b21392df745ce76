/* ddp.c — DistributedDataParallel over MPI, one process per device, after PyTorch's Reducer.
 * (On CUDA devices with NCCL the buckets are reduced on the device instead: ddp_nccl.c; the
 * hooks and the module below serve both.)
 *
 * The module is flattened (clpar_module_flatten), so its gradients are one flat buffer per
 * device. Parameters are taken in reverse order (backward produces the last layers' gradients
 * first) and grouped into buckets: the first up to min(1 MiB, cap), the others up to the cap
 * (a bucket closes once it reaches its limit, so one parameter may overflow it, and where the
 * next parameter is on another device). Each bucket has a float buffer in host memory (pinned
 * on a GPU): no OpenCL all-reduce exists, so MPI reduces there. A bucket of a flat module is one
 * range of the flat gradient, laid out in its buffer as on the device: one copy each way.
 *
 * A gradient hook on every parameter (autograd.h) runs on the backward thread when that
 * parameter's gradient is final (its computation posted). The hook that completes a bucket
 * posts, on the device's queue right there, the read of the bucket's gradients into its
 * buffer and an event, then hands the bucket to the communication thread, which takes
 * buckets strictly in order 0, 1, ... on every rank (MPI collectives must match across
 * ranks), waits for the read's event, sums the buffer over the ranks with MPI_Iallreduce
 * polled against the job's deadline (clpar_dist_wait), divides by the world size and posts
 * the write of the averages back. Open MPI makes no progress in the background, hence a
 * thread of our own that polls the request while backward goes on posting work. The hook that
 * makes the last bucket ready waits for the thread to finish every bucket: clpar_backward
 * returns with reduced gradients, so the optimizer step needs no extra call, and the writes
 * are posted to the devices' queues before anything the program posts next.
 *
 * find_unused_parameters: a walk of the forward's output graph finds the parameters it does not
 * reach; the first hook of the next backward counts them ready, with zeros. uneven_inputs: a
 * flag per rank all-reduced before every forward and by clpar_ddp_join (see inputs_check).
 *
 * Creation checks that all ranks hold the same parameters and buffers (each rank compares its
 * lists with rank 0's; the lowest rank that differs broadcasts its message, so that every rank
 * fails with the same error and none waits for a collective the others will not make), then
 * broadcasts rank 0's values.
 *
 * Buffers (BatchNorm's running statistics) are broadcast from rank 0 at creation and before a
 * forward, as PyTorch's broadcast_buffers=True: all of them in one host block, one broadcast,
 * whose header carries rank 0's status (a rank 0 that could not read its buffers fails every
 * rank with its message). As in PyTorch (require_forward_param_sync), a forward broadcasts
 * only when the previous forward ran with gradients enabled and synchronized: the forward after
 * one under clpar_set_grad_enabled(0) or clpar_ddp_set_sync(0) keeps each rank's own buffers. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/ddp_internal.h"

int clpar_ddp_pin_cpu = 0;

double clpar_ddp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void) {
  return clpar_ddp_now();
}

static clpar_status oom(void) {
  return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DistributedDataParallel: out of host memory");
}

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

/* a's gradient lies right below b's in one device buffer, and right below it in the bucket's
 * buffer too (host offsets given at creation; a follows b in bucket order) */
static int adjacent(const ddp_param *b, const ddp_param *a) {
  const clpar_tensor *ga = a->param->grad, *gb = b->param->grad;
  return ga && gb && ga->storage == gb->storage && ga->offset + (size_t)a->numel == gb->offset &&
         a->offset + a->numel == b->offset;
}

/* The bucket's runs, from its parameters' gradients as they are now; a parameter with no
 * gradient memory (never reached, find_unused_parameters) is in none, and gets zeros. */
void clpar_ddp_make_runs(ddp_state *st, ddp_bucket *b) {
  b->n_runs = 0;
  ddp_run *r = NULL;
  for (int i = b->first; i < b->first + b->count; i++) {
    ddp_param *p = &st->params[i];
    clpar_tensor *g = p->param->grad;
    if (!g) {
      r = NULL;
      continue;
    }
    if (r && i > b->first && adjacent(&st->params[i - 1], p)) {
      r->word = g->offset;
      r->host = p->offset;
      r->numel += p->numel;
    } else {
      r = &b->runs[b->n_runs++];
      r->storage = g->storage;
      r->word = g->offset;
      r->host = p->offset;
      r->numel = p->numel;
    }
  }
}

/* On the backward thread, when the bucket's last gradient is final: posts its reads into the
 * bucket's (pinned) host memory on the device's queue, right after the work that computes
 * those gradients and before the rest of backward, and an event the communication thread
 * waits for. Nothing here waits for the device. */
static void post_reads(ddp_state *st, ddp_bucket *b) {
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
static void reduce_bucket(ddp_state *st, ddp_bucket *b) {
  double t0 = now();
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
    if (p->unused || !p->param->grad)
      memset(b->buf + p->offset, 0, (size_t)p->numel * sizeof(float));
  }
  double t1 = now();
  char what[120];
  snprintf(what, sizeof what, "DistributedDataParallel's all-reduce of bucket %d (%lld floats)",
           (int)(b - st->buckets), (long long)b->numel);
  uint64_t seq = ++st->seq;
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
  double t2 = now();
  if (s != CLPAR_OK) {
    clpar_ddp_record_error(st, s, "all-reducing a bucket");
  } else {
    float scale = 1.0f / (float)st->world;
    for (int64_t k = 0; k < b->numel; k++) b->buf[k] *= scale;
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
  double t3 = now();
  pthread_mutex_lock(&st->lock);
  st->stats.read_seconds += t1 - t0;
  st->stats.allreduce_seconds += t2 - t1;
  st->stats.write_seconds += t3 - t2;
  if (b == &st->buckets[st->n_buckets - 1]) st->stats.exposed_seconds += t3 - t1;
  pthread_mutex_unlock(&st->lock);
}

static void *comm_thread(void *arg) {
  ddp_state *st = arg;
  if (st->nccl) { /* the device reduces: the thread only watches (ddp_nccl.c) */
    clpar_ddp_nccl_watch(st);
    return NULL;
  }
  pthread_mutex_lock(&st->lock);
  for (;;) {
    while (!st->stop && !(st->next < st->n_buckets && st->buckets[st->next].ready))
      pthread_cond_wait(&st->cv, &st->lock);
    if (st->stop) break;
    ddp_bucket *b = &st->buckets[st->next];
    st->busy = 1;
    pthread_mutex_unlock(&st->lock);
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
static void reset_step(ddp_state *st) {
  for (int i = 0; i < st->n_params; i++) st->params[i].ready = 0;
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    b->ready = b->complete = b->read_failed = 0;
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
static void grad_ready(clpar_tensor *t, void *user) {
  (void)t;
  ddp_param *p = user;
  ddp_state *st = p->st;
  pthread_mutex_lock(&st->lock);
  if (p->ready || st->no_sync) {
    pthread_mutex_unlock(&st->lock);
    return;
  }
  if (st->unused_armed) {
    st->unused_armed = 0;
    for (int i = 0; i < st->n_params; i++)
      if (st->params[i].unused && !st->params[i].ready) mark_ready(st, &st->params[i]);
  }
  mark_ready(st, p);
  if (st->nccl) { /* all-reduced on the device, in order; backward does not wait */
    if (clpar_ddp_nccl_post(st)) reset_step(st); /* the last bucket is posted */
    pthread_mutex_unlock(&st->lock);
    return;
  }
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    if (!b->complete || b->ready) continue;
    pthread_mutex_unlock(&st->lock); /* posting takes no lock of ours; the thread goes on */
    post_reads(st, b);
    pthread_mutex_lock(&st->lock);
    b->ready = 1;
    st->n_ready++;
    pthread_cond_broadcast(&st->cv);
  }
  if (st->n_ready == st->n_buckets) { /* the last bucket: wait for every reduction */
    double t0 = now();
    while (st->next < st->n_buckets) pthread_cond_wait(&st->cv, &st->lock);
    st->stats.wait_seconds += now() - t0;
    st->stats.reductions++;
    reset_step(st);
  }
  pthread_mutex_unlock(&st->lock);
}

/* ---- the module ---- */

static clpar_status take_error(ddp_state *st) {
  clpar_status s = st->error;
  if (s != CLPAR_OK) {
    clpar_set_error(s, "%s", st->message);
    st->error = CLPAR_OK;
  }
  return s;
}

/* A backward that left a bucket waiting: some parameter got no gradient. The thread has
 * reduced the buckets before it (as every rank with the same graph has); start afresh. */
static clpar_status check_finished_step(ddp_state *st) {
  while (st->busy || (st->next < st->n_buckets && st->buckets[st->next].ready))
    pthread_cond_wait(&st->cv, &st->lock);
  int any = 0;
  for (int i = 0; i < st->n_params; i++) any |= st->params[i].ready;
  if (!any) return CLPAR_OK;
  const char *missing = "?";
  for (int i = 0; i < st->n_params; i++)
    if (!st->params[i].ready) {
      missing = st->params[i].name;
      break;
    }
  clpar_status s = clpar_set_error(
      CLPAR_ERROR_NO_GRADIENT,
      "DistributedDataParallel: the last backward gave no gradient to parameter %s, so its "
      "bucket was never reduced (every parameter must take part in the loss)",
      missing);
  reset_step(st);
  return s;
}

/* ---- parameters the forward did not reach (find_unused_parameters) ---- */

static int cmp_address(const void *a, const void *b) {
  const clpar_tensor *x = (*(ddp_param *const *)a)->param, *y = (*(ddp_param *const *)b)->param;
  return x < y ? -1 : x > y;
}

/* A set of nodes seen (open addressing on the pointer). */
typedef struct {
  const void **slots;
  size_t cap, count;
} ptr_set;

static size_t ptr_hash(const void *p, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 20) & (cap - 1);
}

/* 1 when p was added, 0 when it was there, -1 when out of memory. */
static int ptr_set_add(ptr_set *set, const void *p) {
  if (2 * (set->count + 1) > set->cap) {
    size_t cap = set->cap ? 2 * set->cap : 256;
    const void **slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < set->cap; i++)
      if (set->slots[i]) {
        size_t j = ptr_hash(set->slots[i], cap);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = set->slots[i];
      }
    free(set->slots);
    set->slots = slots;
    set->cap = cap;
  }
  size_t j = ptr_hash(p, set->cap);
  while (set->slots[j]) {
    if (set->slots[j] == p) return 0;
    j = (j + 1) & (set->cap - 1);
  }
  set->slots[j] = p;
  set->count++;
  return 1;
}

static void reached(ddp_state *st, clpar_tensor *leaf) {
  ddp_param key = {.param = leaf}, *k = &key;
  ddp_param **hit = bsearch(&k, st->by_address, (size_t)st->n_params, sizeof k, cmp_address);
  if (hit) (*hit)->unused = 0;
}

/* Marks unused every parameter that the graph of out does not reach (PyTorch walks the
 * output's graph the same way at the end of forward), and arms the first hook of the coming
 * backward to mark them ready. */
static clpar_status find_unused(ddp_state *st, clpar_tensor *out) {
  for (int i = 0; i < st->n_params; i++) st->params[i].unused = 1;
  ptr_set seen = {0};
  size_t n = 0, cap = 64;
  clpar_node **stack = malloc(cap * sizeof *stack);
  clpar_status s = stack ? CLPAR_OK : oom();
  if (s == CLPAR_OK && out->node) {
    if (ptr_set_add(&seen, out->node) < 0) s = oom();
    stack[n++] = out->node;
  } else if (s == CLPAR_OK) {
    reached(st, out);
  }
  while (s == CLPAR_OK && n > 0) {
    clpar_node *node = stack[--n];
    for (int i = 0; s == CLPAR_OK && i < node->n_inputs; i++) {
      clpar_tensor *in = node->inputs[i];
      if (!in) continue;
      if (!in->node) {
        if (in->requires_grad) reached(st, in);
        continue;
      }
      int added = ptr_set_add(&seen, in->node);
      if (added < 0) {
        s = oom();
      } else if (added) {
        if (n == cap) {
          clpar_node **bigger = realloc(stack, 2 * cap * sizeof *stack);
          if (!bigger) {
            s = oom();
            break;
          }
          stack = bigger;
          cap *= 2;
        }
        stack[n++] = in->node;
      }
    }
  }
  free(stack);
  free(seen.slots);
  int any = 0;
  for (int i = 0; i < st->n_params; i++) {
    if (s != CLPAR_OK) st->params[i].unused = 0;
    any |= st->params[i].unused;
  }
  pthread_mutex_lock(&st->lock);
  st->unused_armed = any;
  pthread_mutex_unlock(&st->lock);
  return s;
}

/* ---- uneven inputs ---- */

/* "1, 3 and 4" for the ranks whose flag is (has != 0) equal to has; at most 16 named. */
static void list_ranks(const int *flags, int world, int has, char *out, size_t size) {
  size_t len = 0;
  int total = 0;
  for (int r = 0; r < world; r++) total += (flags[r] != 0) == has;
  out[0] = '\0';
  for (int r = 0, k = 0; r < world && len < size; r++) {
    if ((flags[r] != 0) != has) continue;
    k++;
    if (k > 16) {
      snprintf(out + len, size - len, " ... (%d ranks in all)", total);
      break;
    }
    const char *sep = k == 1 ? "" : k == total ? " and " : ", ";
    len += (size_t)snprintf(out + len, size - len, "%s%d", sep, r);
  }
}

/* With uneven_inputs, the first collective of every forward (has = 1) and of clpar_ddp_join
 * (has = 0): every rank learns which ranks still have inputs. When one has not, every rank
 * fails alike naming them (a join on every rank at once is the even end: CLPAR_OK), and every
 * later forward fails at once, without a collective. */
static clpar_status inputs_check(ddp_state *st, int has) {
  if (st->ended) return clpar_set_error(st->ended_status, "%s", st->ended_msg);
  uint64_t step = ++st->forwards;
  int rank = clpar_dist_rank();
  int *flags = calloc((size_t)st->world, sizeof *flags);
  if (!flags) return oom(); /* the others then time out naming this rank: nothing better */
  flags[rank] = has;
  clpar_status s = clpar_dist_allreduce(
      flags, st->world, MPI_INT, MPI_SUM, st->comm,
      "DistributedDataParallel: the uneven-inputs check (does every rank still have inputs?)",
      ++st->seq);
  int out = 0;
  for (int r = 0; s == CLPAR_OK && r < st->world; r++) out += flags[r] == 0;
  if (s != CLPAR_OK || out == 0) {
    free(flags);
    return s;
  }
  char done[160], going[160];
  list_ranks(flags, st->world, 0, done, sizeof done);
  list_ranks(flags, st->world, 1, going, sizeof going);
  free(flags);
  st->ended = 1;
  if (out == st->world) {
    st->ended_status = CLPAR_ERROR_INVALID_ARGUMENT;
    snprintf(st->ended_msg, sizeof st->ended_msg,
             "DistributedDataParallel: every rank has joined (clpar_ddp_join, step %llu); the "
             "module takes no more forwards",
             (unsigned long long)step);
    return CLPAR_OK;
  }
  st->ended_status = CLPAR_ERROR_UNEVEN_INPUTS;
  snprintf(st->ended_msg, sizeof st->ended_msg,
           "DistributedDataParallel: uneven inputs: rank%s %s ran out of inputs (clpar_ddp_join) "
           "at step %llu while rank%s %s still had some; every rank stops here",
           out > 1 ? "s" : "", done, (unsigned long long)step, st->world - out > 1 ? "s" : "",
           going);
  return clpar_set_error(st->ended_status, "%s", st->ended_msg);
}

static clpar_status broadcast_buffers(ddp_state *st, const char *what);

/* What a forward and a join do first: the communication thread's error, the previous
 * backward finished, then (uneven_inputs) the flag. *sync: whether buffers go out now. */
static clpar_status begin_step(ddp_state *st, int has_inputs, int *sync) {
  if (clpar_dist_comm() == MPI_COMM_NULL) /* no rank, and MPI may be finalized */
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                           "DistributedDataParallel: clpar_dist_finalize has ended the job "
                           "this module was made in; free the module before it");
  pthread_mutex_lock(&st->lock);
  clpar_status s = take_error(st);
  if (s == CLPAR_OK && st->nccl_dead) s = clpar_set_error(CLPAR_ERROR_TIMEOUT, "%s", st->dead_msg);
  if (s == CLPAR_OK) s = check_finished_step(st);
  *sync = st->sync_buffers; /* the communication thread is idle now: no bucket is pending */
  if (has_inputs) st->sync_buffers = clpar_is_grad_enabled() && !st->no_sync;
  pthread_mutex_unlock(&st->lock);
  if (s == CLPAR_OK && (st->uneven_inputs || !has_inputs)) s = inputs_check(st, has_inputs);
  return s;
}

static clpar_status ddp_forward(clpar_module *self, clpar_tensor *input, clpar_tensor **output,
                                void *user) {
  ddp_state *st = user;
  int sync;
  clpar_status s = begin_step(st, 1, &sync);
  if (s == CLPAR_OK && sync)
    s = broadcast_buffers(st, "DistributedDataParallel: broadcasting buffers from rank 0");
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "module"), input, output);
  if (s == CLPAR_OK && st->find_unused && clpar_is_grad_enabled() && !st->no_sync) {
    s = find_unused(st, *output);
    if (s != CLPAR_OK) {
      clpar_tensor_free(*output);
      *output = NULL;
    }
  }
  return s;
}

static void ddp_free(void *user) {
  ddp_state *st = user;
  if (!st) return;
  if (st->thread_started) {
    pthread_mutex_lock(&st->lock);
    st->stop = 1;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->lock);
    pthread_join(st->thread, NULL); /* with NCCL, after the last all-reduce completed */
  }
  if (st->nccl) clpar_ddp_nccl_free(st);
  for (int i = 0; i < st->n_params; i++) {
    ddp_param *p = &st->params[i];
    if (p->param) {
      if (st->thread_started) clpar_tensor_remove_grad_hook(p->param, grad_ready, p);
      clpar_tensor_free(p->param);
    }
    free(p->name);
  }
  for (int i = 0; i < st->n_buffers; i++) {
    clpar_tensor_free(st->buffers[i]);
    free(st->buffer_names[i]);
  }
  free(st->buffers);
  free(st->buffer_names);
  free(st->buffer_at);
  free(st->by_address);
  st->n_buffers = 0;
  /* after a timeout, a pending collective may still write the buffers (and st->comm, for
   * MPI_Comm_idup): they stay allocated, as MPI cannot cancel a collective */
  if (st->abandoned) return;
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    clpar_event_release(b->read_done);
    clpar_tensor_release(b->grad_ref);
    if (b->pin) {
      /* the queue may still write the averages from it; after clpar_shutdown (a program that
       * frees the module too late) the device is gone, and the block is left to the process */
      if (clpar_is_initialized()) {
        clpar_worker_drain(b->dev);
        clpar_dev_host_free_sync(b->dev, b->pin);
      }
    } else {
      free(b->buf);
    }
    free(b->runs);
  }
  free(st->block);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && st->comm != MPI_COMM_NULL && !clpar_dist_is_broken()) {
    clpar_mpi_lock();
    MPI_Comm_free(&st->comm);
    clpar_mpi_unlock();
  }
  pthread_cond_destroy(&st->cv);
  pthread_mutex_destroy(&st->lock);
  free(st->params);
  free(st->buckets);
  free(st);
}

/* ---- creation ---- */

/* Whether every rank's ok is set; the message of the lowest rank that failed becomes every
 * rank's error (so all fail together, with the same words). */
clpar_status clpar_ddp_agree(ddp_state *st, clpar_status mine, const char *what) {
  char msg[MESSAGE_SIZE] = "";
  if (mine != CLPAR_OK) snprintf(msg, sizeof msg, "%s", clpar_last_error());
  int bad = mine != CLPAR_OK ? clpar_dist_rank() : INT_MAX, first_bad = INT_MAX;
  int code = mine;
  clpar_status s =
      clpar_dist_allreduce(&bad, 1, MPI_INT, MPI_MIN, st->comm,
                           "clpar_ddp_create: checking every rank succeeded", ++st->seq);
  if (s != CLPAR_OK) return s;
  first_bad = bad;
  if (first_bad == INT_MAX) return CLPAR_OK;
  s = clpar_dist_bcast(msg, sizeof msg, MPI_CHAR, first_bad, st->comm,
                       "clpar_ddp_create: broadcasting a rank's error", ++st->seq);
  if (s == CLPAR_OK)
    s = clpar_dist_bcast(&code, 1, MPI_INT, first_bad, st->comm,
                         "clpar_ddp_create: broadcasting a rank's error", ++st->seq);
  if (s != CLPAR_OK) return s;
  msg[sizeof msg - 1] = '\0';
  return clpar_set_error((clpar_status)code, "%s: %s", what, msg);
}

/* "module.0.weight [64, 20]\n" for each parameter (buffers: 0) or buffer (1), in the module's
 * order. */
static char *signature(const ddp_state *st, int buffers) {
  size_t cap = 64, len = 0;
  char *text = malloc(cap);
  int n = buffers ? st->n_buffers : st->n_params;
  for (int k = 0; text && k < n; k++) {
    int i = buffers ? k : st->n_params - 1 - k; /* parameters are held reversed */
    const char *name = buffers ? st->buffer_names[i] : st->params[i].name;
    char shape[128];
    clpar_tensor_shape_str(buffers ? st->buffers[i] : st->params[i].param, shape, sizeof shape);
    size_t need = strlen(name) + strlen(shape) + 3;
    if (len + need + 1 > cap) {
      while (len + need + 1 > cap) cap *= 2;
      char *bigger = realloc(text, cap);
      if (!bigger) free(text);
      text = bigger;
      if (!text) break;
    }
    len += (size_t)snprintf(text + len, cap - len, "%s %s\n", name, shape);
  }
  if (text) text[len] = '\0';
  return text;
}

static int count_lines(const char *text) {
  int n = 0;
  for (; *text; text++) n += *text == '\n';
  return n;
}

/* Whether mine differs from rank 0's list of nouns ("parameter"); msg then names the first
 * difference. */
static int compare_signatures(const char *mine, const char *root, int rank, const char *noun,
                              char *msg, size_t size) {
  for (int line = 0;; line++) {
    const char *a_end = strchr(mine, '\n'), *b_end = strchr(root, '\n');
    if (!a_end && !b_end) return 0;
    if (!a_end || !b_end) {
      snprintf(msg, size, "rank %d has %d %ss where rank 0 has %d (the first %d agree)", rank,
               line + count_lines(mine), noun, line + count_lines(root), line);
      return 1;
    }
    size_t a_len = (size_t)(a_end - mine), b_len = (size_t)(b_end - root);
    if (a_len != b_len || memcmp(mine, root, a_len) != 0) {
      snprintf(msg, size, "%s %d is \"%.*s\" on rank %d but \"%.*s\" on rank 0", noun, line,
               (int)(a_len > 300 ? 300 : a_len), mine, rank, (int)(b_len > 300 ? 300 : b_len),
               root);
      return 1;
    }
    mine = a_end + 1;
    root = b_end + 1;
  }
}

/* Every rank holds the same parameters (buffers: 0) or buffers (1) as rank 0, or every rank
 * fails naming the first difference and the rank. */
static clpar_status check_same_list(ddp_state *st, int buffers) {
  const char *what = "clpar_ddp_create: the ranks' models differ";
  const char *noun = buffers ? "buffer" : "parameter";
  char *mine = signature(st, buffers), *root = NULL;
  unsigned long long len = mine ? strlen(mine) + 1 : 0;
  clpar_status s = clpar_ddp_agree(st, mine ? CLPAR_OK : oom(), "clpar_ddp_create");
  if (s == CLPAR_OK)
    s = clpar_dist_bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, 0, st->comm,
                         buffers ? "clpar_ddp_create: broadcasting the size of rank 0's buffer list"
                                 : "clpar_ddp_create: broadcasting the size of rank 0's parameter "
                                   "list",
                         ++st->seq);
  /* every rank got the same len: all refuse alike, before allocating it */
  if (s == CLPAR_OK && (len == 0 || len > INT_MAX))
    s = clpar_set_error(len ? CLPAR_ERROR_TOO_LARGE : CLPAR_ERROR_CORRUPT,
                        "clpar_ddp_create: rank 0's %s list is %llu bytes long; it is at least "
                        "1 and at most %d",
                        noun, len, INT_MAX);
  if (s == CLPAR_OK) {
    root = clpar_dist_rank() == 0 ? mine : malloc(len);
    s = clpar_ddp_agree(st, root ? CLPAR_OK : oom(), "clpar_ddp_create");
  }
  if (s == CLPAR_OK)
    s = clpar_dist_bcast(root, (int)len, MPI_CHAR, 0, st->comm,
                         buffers ? "clpar_ddp_create: broadcasting rank 0's buffer list"
                                 : "clpar_ddp_create: broadcasting rank 0's parameter list",
                         ++st->seq);
  if (s == CLPAR_OK) {
    char msg[MESSAGE_SIZE];
    root[len - 1] = '\0';
    clpar_status mine_s = compare_signatures(mine, root, clpar_dist_rank(), noun, msg, sizeof msg)
                              ? clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s", msg)
                              : CLPAR_OK;
    s = clpar_ddp_agree(st, mine_s, what);
  }
  if (root != mine) free(root);
  free(mine);
  return s;
}

/* Rank 0's values to every rank, one parameter at a time through host memory. */
static clpar_status broadcast_parameters(ddp_state *st) {
  int64_t most = 0;
  for (int i = 0; i < st->n_params; i++) {
    int64_t n = clpar_tensor_numel(st->params[i].param);
    most = n > most ? n : most;
  }
  float *buf = malloc((size_t)most * sizeof(float));
  clpar_status s = clpar_ddp_agree(st, buf ? CLPAR_OK : oom(), "clpar_ddp_create");
  for (int i = 0; s == CLPAR_OK && i < st->n_params; i++) {
    clpar_tensor *p = st->params[i].param;
    int64_t n = clpar_tensor_numel(p);
    clpar_status mine = clpar_dist_rank() == 0 ? clpar_tensor_read(p, buf, (size_t)n) : CLPAR_OK;
    s = clpar_ddp_agree(st, mine, "clpar_ddp_create: reading a parameter on rank 0");
    if (s == CLPAR_OK)
      s = clpar_dist_bcast(buf, (int)n, MPI_FLOAT, 0, st->comm,
                           "clpar_ddp_create: broadcasting parameters from rank 0", ++st->seq);
    if (s == CLPAR_OK && clpar_dist_rank() != 0) s = clpar_tensor_write(p, buf, (size_t)n);
  }
  free(buf);
  return s;
}

/* Buckets over the parameters in reverse order: the first up to min(1 MiB, cap), the
 * others up to cap; a bucket closes once it has reached its limit, and where the next
 * parameter lives on another device. In a bucket's buffer, parameters whose gradients lie one
 * below the other in a flat gradient (clpar_module_flatten: the module's order, so reversed
 * here) keep that layout, so that each such run is one copy each way. Each buffer is pinned
 * host memory from the device's backend when it gives some. */
static clpar_status make_buckets(ddp_state *st, double cap_mb) {
  double cap = cap_mb * 1024.0 * 1024.0, limit = cap < 1048576.0 ? cap : 1048576.0;
  st->buckets = calloc((size_t)st->n_params, sizeof *st->buckets);
  if (!st->buckets) return oom();
  ddp_bucket *b = NULL;
  for (int i = 0; i < st->n_params; i++) {
    ddp_param *p = &st->params[i];
    clpar_device *dev = p->param->storage->dev;
    if (b && b->dev != dev) {
      b = NULL;
      limit = cap;
    }
    if (!b) {
      b = &st->buckets[st->n_buckets++];
      b->first = i;
      b->dev = dev;
    }
    p->bucket = (int)(b - st->buckets);
    p->numel = clpar_tensor_numel(p->param);
    b->numel += p->numel;
    b->count++;
    if (b->numel > INT_MAX)
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                             "clpar_ddp_create: a bucket of %lld floats is more than MPI takes "
                             "in one call; lower bucket_cap_mb",
                             (long long)b->numel);
    if ((double)b->numel * sizeof(float) >= limit) {
      b = NULL;
      limit = cap;
    }
  }
  for (int k = 0; k < st->n_buckets; k++) {
    b = &st->buckets[k];
    /* runs of gradients adjacent (in reverse) in one device buffer, each laid out as there */
    int64_t host = 0;
    for (int i = b->first; i < b->first + b->count;) {
      int j = i + 1;
      int64_t run = st->params[i].numel;
      for (; j < b->first + b->count; j++) {
        const clpar_tensor *ga = st->params[j].param->grad, *gb = st->params[j - 1].param->grad;
        if (!ga || !gb || ga->storage != gb->storage ||
            ga->offset + (size_t)st->params[j].numel != gb->offset)
          break;
        run += st->params[j].numel;
      }
      for (int q = i; q < j; q++) {
        const clpar_tensor *g = st->params[q].param->grad;
        st->params[q].offset =
            j - i > 1 ? host + (int64_t)(g->offset - st->params[j - 1].param->grad->offset) : host;
      }
      host += run;
      i = j;
    }
    b->pending = b->count;
    if (!(b->runs = calloc((size_t)b->count, sizeof *b->runs))) return oom();
  }
  st->stats.buckets = st->n_buckets;
  return CLPAR_OK;
}

/* MPI: each bucket's host memory, pinned from the device's backend when it gives some. */
static clpar_status alloc_host_buffers(ddp_state *st) {
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    size_t bytes = (size_t)b->numel * sizeof(float);
    void *ptr = NULL;
    /* pinned memory where the device copies by DMA; on a CPU device (PoCL's CPU driver, the
     * host backend) it buys nothing, and PoCL's made MPI_Allreduce several times slower than
     * malloc'd memory (bench/ddp: 43-79 against 8-16 ms per step) */
    int pin = b->dev->bd.info.type != CLPAR_DEVICE_CPU || clpar_ddp_pin_cpu;
    if (pin && clpar_dev_host_alloc_sync(b->dev, bytes, &b->pin, &ptr) == CLPAR_OK && ptr) {
      b->buf = ptr;
    } else {
      clpar_clear_error();
      b->pin = NULL;
      if (!(b->buf = malloc(bytes))) return oom();
    }
  }
  return CLPAR_OK;
}

/* The buffers, each with a reference and its "module." name, and the host block that carries
 * them (each buffer's bytes 8-aligned after the header). */
static clpar_status take_buffers(ddp_state *st, clpar_module *module) {
  int n = clpar_module_buffer_count(module);
  size_t slots = n > 0 ? (size_t)n : 1;
  st->buffers = calloc(slots, sizeof *st->buffers);
  st->buffer_names = calloc(slots, sizeof *st->buffer_names);
  st->buffer_at = calloc(slots, sizeof *st->buffer_at);
  if (!st->buffers || !st->buffer_names || !st->buffer_at) return oom();
  size_t at = BUFFER_HEADER;
  for (int i = 0; i < n; i++) {
    const char *name;
    clpar_tensor *t;
    clpar_status s = clpar_module_buffer_at(module, i, &name, &t);
    if (s != CLPAR_OK) return s;
    st->buffers[i] = clpar_tensor_retain(t);
    st->n_buffers = i + 1;
    if (!(st->buffer_names[i] = malloc(strlen(name) + 8))) return oom();
    sprintf(st->buffer_names[i], "module.%s", name);
    st->buffer_at[i] = at;
    at += (clpar_tensor_nbytes(t) + 7) / 8 * 8;
  }
  st->block_bytes = at;
  if (n > 0 && !(st->block = malloc(at))) return oom();
  return CLPAR_OK;
}

/* A buffer's bytes (any dtype) to and from host memory. */
static clpar_status buffer_read(const clpar_tensor *t, void *dst) {
  return clpar_tensor_read_raw(t, dst, clpar_tensor_nbytes(t));
}
static clpar_status buffer_write(clpar_tensor *t, const void *src) {
  return clpar_tensor_write_raw(t, src, clpar_tensor_nbytes(t));
}

/* Rank 0's buffers to every rank: rank 0 reads them all into the block (waiting for its
 * device), one broadcast (in pieces of at most INT_MAX bytes), the others write them. The
 * header carries rank 0's status and message, so a failed read fails every rank alike. */
static clpar_status broadcast_buffers(ddp_state *st, const char *what) {
  if (st->n_buffers == 0) return CLPAR_OK;
  unsigned char *block = st->block;
  int32_t status = CLPAR_OK;
  memset(block, 0, BUFFER_HEADER);
  if (clpar_dist_rank() == 0) {
    for (int i = 0; status == CLPAR_OK && i < st->n_buffers; i++)
      status = buffer_read(st->buffers[i], block + st->buffer_at[i]);
    if (status != CLPAR_OK) snprintf((char *)block + 8, MESSAGE_SIZE, "%s", clpar_last_error());
    memcpy(block, &status, sizeof status);
  }
  clpar_status s = CLPAR_OK;
  for (size_t at = 0; s == CLPAR_OK && at < st->block_bytes;) {
    size_t piece = st->block_bytes - at < (size_t)INT_MAX ? st->block_bytes - at : INT_MAX;
    s = clpar_dist_bcast(block + at, (int)piece, MPI_BYTE, 0, st->comm, what, ++st->seq);
    at += piece;
  }
  if (s != CLPAR_OK) return s;
  memcpy(&status, block, sizeof status);
  if (status != CLPAR_OK) {
    block[8 + MESSAGE_SIZE - 1] = '\0';
    return clpar_set_error((clpar_status)status, "%s: rank 0 could not read its buffers: %s", what,
                           (const char *)block + 8);
  }
  for (int i = 0; s == CLPAR_OK && clpar_dist_rank() != 0 && i < st->n_buffers; i++)
    s = buffer_write(st->buffers[i], block + st->buffer_at[i]);
  return s;
}

/* The parameters, reversed, each with a reference and its "module." name. */
static clpar_status take_parameters(ddp_state *st, clpar_module *module) {
  int n = clpar_module_parameter_count(module);
  st->params = calloc(n > 0 ? (size_t)n : 1, sizeof *st->params);
  if (!st->params) return oom();
  st->n_params = n;
  for (int i = 0; i < n; i++) {
    const char *name;
    clpar_tensor *t;
    clpar_status s = clpar_module_parameter_at(module, i, &name, &t);
    if (s != CLPAR_OK) return s;
    ddp_param *p = &st->params[n - 1 - i];
    p->st = st;
    p->param = clpar_tensor_retain(t);
    if (!(p->name = malloc(strlen(name) + 8))) return oom();
    sprintf(p->name, "module.%s", name);
  }
  return CLPAR_OK;
}

static clpar_status make_state(clpar_module *module, const clpar_ddp_options *o, ddp_state **out) {
  ddp_state *st = calloc(1, sizeof *st);
  if (!st) return oom();
  pthread_mutex_init(&st->lock, NULL);
  pthread_cond_init(&st->cv, NULL);
  st->comm = MPI_COMM_NULL;
  st->world = clpar_dist_world_size();
  double cap_mb = o && o->bucket_cap_mb > 0 ? o->bucket_cap_mb : 25.0;
  st->find_unused = o && o->find_unused_parameters;
  st->uneven_inputs = o && o->uneven_inputs;
  /* MPI_Comm_idup is a collective too: with the deadline, as the others */
  const char *dup = "clpar_ddp_create: duplicating the communicator";
  clpar_status s = clpar_dist_check_broken() ? CLPAR_ERROR_TIMEOUT : CLPAR_OK;
  if (s == CLPAR_OK) s = clpar_dist_debug_check(clpar_dist_comm(), dup, 0, 0);
  MPI_Request req = MPI_REQUEST_NULL;
  clpar_mpi_lock();
  int rc = s == CLPAR_OK ? MPI_Comm_idup(clpar_dist_comm(), &st->comm, &req) : MPI_SUCCESS;
  clpar_mpi_unlock();
  if (s == CLPAR_OK)
    s = rc == MPI_SUCCESS ? clpar_dist_wait(&req, dup, ++st->seq) : clpar_mpi_error(rc, dup);
  if (s == CLPAR_ERROR_TIMEOUT) st->abandoned = 1;
  if (s == CLPAR_OK) {
    clpar_mpi_lock();
    rc = MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
    clpar_mpi_unlock();
    if (rc != MPI_SUCCESS) s = clpar_mpi_error(rc, dup);
  }
  /* flat gradients: a bucket's gradients are then one copy each way (make_buckets) */
  if (s == CLPAR_OK) s = clpar_ddp_agree(st, clpar_module_flatten(module), "clpar_ddp_create");
  if (s == CLPAR_OK) s = clpar_ddp_agree(st, take_parameters(st, module), "clpar_ddp_create");
  if (s == CLPAR_OK) s = clpar_ddp_agree(st, take_buffers(st, module), "clpar_ddp_create");
  if (s == CLPAR_OK) s = check_same_list(st, 0);
  if (s == CLPAR_OK) s = check_same_list(st, 1);
  if (s == CLPAR_OK && st->n_params == 0)
    s = clpar_set_error(CLPAR_ERROR_EMPTY, "clpar_ddp_create: the module has no parameters");
  if (s == CLPAR_OK) s = broadcast_parameters(st);
  if (s == CLPAR_OK)
    s = broadcast_buffers(st, "clpar_ddp_create: broadcasting buffers from rank 0");
  st->sync_buffers = 1;
  if (s == CLPAR_OK) s = clpar_ddp_agree(st, make_buckets(st, cap_mb), "clpar_ddp_create");
  if (s == CLPAR_OK) s = clpar_ddp_choose_backend(st); /* collective: every rank alike */
  if (s == CLPAR_OK && !st->nccl)
    s = clpar_ddp_agree(st, alloc_host_buffers(st), "clpar_ddp_create");
  if (s == CLPAR_OK && !(st->by_address = malloc((size_t)st->n_params * sizeof *st->by_address)))
    s = oom();
  if (s == CLPAR_OK) {
    for (int i = 0; i < st->n_params; i++) st->by_address[i] = &st->params[i];
    qsort(st->by_address, (size_t)st->n_params, sizeof *st->by_address, cmp_address);
  }
  for (int i = 0; s == CLPAR_OK && i < st->n_params; i++) {
    s = clpar_tensor_add_grad_hook(st->params[i].param, grad_ready, &st->params[i]);
    for (int j = 0; s != CLPAR_OK && j < i; j++)
      clpar_tensor_remove_grad_hook(st->params[j].param, grad_ready, &st->params[j]);
  }
  if (s == CLPAR_OK) {
    if (pthread_create(&st->thread, NULL, comm_thread, st) == 0)
      st->thread_started = 1;
    else
      s = clpar_set_error(CLPAR_ERROR_INTERNAL,
                          "clpar_ddp_create: could not start the communication thread");
    if (s != CLPAR_OK)
      for (int j = 0; j < st->n_params; j++)
        clpar_tensor_remove_grad_hook(st->params[j].param, grad_ready, &st->params[j]);
  }
  if (s != CLPAR_OK) {
    ddp_free(st);
    return s;
  }
  *out = st;
  return CLPAR_OK;
}

clpar_status clpar_ddp_create(clpar_module *module, const clpar_ddp_options *options,
                              clpar_module **out) {
  if (!module || !out) {
    clpar_module_free(module);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_ddp_create: NULL module or out");
  }
  if (clpar_dist_comm() == MPI_COMM_NULL) {
    clpar_module_free(module);
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                           "clpar_ddp_create: call clpar_dist_init first");
  }
  if (options && !(options->bucket_cap_mb >= 0)) {
    clpar_module_free(module);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_create: bucket_cap_mb is %g; it must be >= 0 (0: 25 MiB)",
                           options->bucket_cap_mb);
  }
  ddp_state *st = NULL;
  clpar_status s = make_state(module, options, &st);
  clpar_module *ddp = NULL;
  if (s == CLPAR_OK)
    s = clpar_module_create("DistributedDataParallel", ddp_forward, st, ddp_free, &ddp);
  if (s != CLPAR_OK) {
    if (st) ddp_free(st);
    clpar_module_free(module);
    return s;
  }
  s = clpar_module_add_child(ddp, "module", module); /* frees module on error */
  if (s != CLPAR_OK) {
    clpar_module_free(ddp);
    return s;
  }
  *out = ddp;
  return CLPAR_OK;
}

static ddp_state *state_of(const clpar_module *m) {
  return m && m->forward == ddp_forward ? m->user : NULL;
}

clpar_status clpar_ddp_synchronize(clpar_module *ddp) {
  ddp_state *st = state_of(ddp);
  if (!st)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_synchronize: not a DistributedDataParallel module");
  pthread_mutex_lock(&st->lock);
  while (st->busy) pthread_cond_wait(&st->cv, &st->lock);
  if (st->nccl) clpar_ddp_nccl_wait_idle(st); /* the device's all-reduces posted so far */
  clpar_status s = take_error(st);
  pthread_mutex_unlock(&st->lock);
  return s;
}

const char *clpar_ddp_backend(const clpar_module *ddp, const char **why) {
  ddp_state *st = state_of(ddp);
  if (why) *why = st ? st->backend_why : "not a DistributedDataParallel module";
  if (!st) return NULL;
  return st->nccl ? "nccl" : "mpi";
}

clpar_status clpar_ddp_join(clpar_module *ddp) {
  ddp_state *st = state_of(ddp);
  if (!st)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_join: not a DistributedDataParallel module");
  if (!st->uneven_inputs)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_join: the module was made without the uneven_inputs option, "
                           "so the other ranks' forwards would not see that this rank joined");
  int sync;
  return begin_step(st, 0, &sync);
}

clpar_status clpar_ddp_set_sync(clpar_module *ddp, int sync) {
  ddp_state *st = state_of(ddp);
  if (!st)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_set_sync: not a DistributedDataParallel module");
  pthread_mutex_lock(&st->lock);
  st->no_sync = !sync;
  pthread_mutex_unlock(&st->lock);
  return CLPAR_OK;
}

clpar_status clpar_ddp_stats_get(const clpar_module *ddp, clpar_ddp_stats *out) {
  ddp_state *st = state_of(ddp);
  if (!st || !out)
    return clpar_set_error(
        CLPAR_ERROR_INVALID_ARGUMENT,
        "clpar_ddp_stats_get: not a DistributedDataParallel module, or NULL out");
  pthread_mutex_lock(&st->lock);
  *out = st->stats;
  pthread_mutex_unlock(&st->lock);
  return CLPAR_OK;
}
