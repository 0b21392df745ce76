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
 * one under clpar_set_grad_enabled(0) or clpar_ddp_set_sync(0) keeps each rank's own buffers.
 *
 * This file makes the module (creation, forward, free, the public calls); the communication
 * thread and the hooks are in ddp_comm.c, the buckets in ddp_buckets.c, find_unused_parameters
 * in ddp_unused.c and the uneven-inputs check (what clpar_ddp_join agrees on) in ddp_uneven.c. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/ddp_internal.h"

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
  clpar_ddp_reset_step(st);
  return s;
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
  if (s == CLPAR_OK && (st->uneven_inputs || !has_inputs))
    s = clpar_ddp_inputs_check(st, has_inputs);
  return s;
}

static clpar_status ddp_forward(clpar_module *self, clpar_tensor *input, clpar_tensor **output,
                                void *user) {
  ddp_state *st = user;
  int sync = 0;
  clpar_status s = clpar_ddp_graph_forward(st); /* a captured step's refusals (ddp_graph.c) */
  if (s == CLPAR_OK) s = begin_step(st, 1, &sync);
  if (s == CLPAR_OK && sync)
    s = broadcast_buffers(st, "DistributedDataParallel: broadcasting buffers from rank 0");
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "module"), input, output);
  if (s == CLPAR_OK && st->find_unused && clpar_is_grad_enabled() && !st->no_sync) {
    s = clpar_ddp_find_unused(st, *output);
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
  clpar_ddp_graph_quiesce(st); /* replays in flight need the thread */
  if (st->thread_started) {
    pthread_mutex_lock(&st->lock);
    st->stop = 1;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->lock);
    pthread_join(st->thread, NULL); /* with NCCL, after the last all-reduce completed */
  }
  if (st->nccl) clpar_ddp_nccl_free(st);
  clpar_ddp_graph_free(st);
  clpar_zero3_free(st);
  clpar_zero_comm_free(st);
  for (int i = 0; i < st->n_params; i++) {
    ddp_param *p = &st->params[i];
    if (p->param) {
      if (st->thread_started) clpar_tensor_remove_grad_hook(p->param, clpar_ddp_grad_ready, p);
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
    if (b->read_done && clpar_is_initialized()) clpar_event_sync(b->read_done); /* calls back */
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
      /* malloc'd memory the queue may still write the averages from */
      if (b->buf && clpar_is_initialized()) clpar_worker_drain(b->dev);
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
  clpar_status s = clpar_ddp_agree(st, mine ? CLPAR_OK : clpar_ddp_oom(), "clpar_ddp_create");
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
    s = clpar_ddp_agree(st, root ? CLPAR_OK : clpar_ddp_oom(), "clpar_ddp_create");
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
  clpar_status s = clpar_ddp_agree(st, buf ? CLPAR_OK : clpar_ddp_oom(), "clpar_ddp_create");
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

/* The buffers, each with a reference and its "module." name, and the host block that carries
 * them (each buffer's bytes 8-aligned after the header). */
static clpar_status take_buffers(ddp_state *st, clpar_module *module) {
  int n = clpar_module_buffer_count(module);
  size_t slots = n > 0 ? (size_t)n : 1;
  st->buffers = calloc(slots, sizeof *st->buffers);
  st->buffer_names = calloc(slots, sizeof *st->buffer_names);
  st->buffer_at = calloc(slots, sizeof *st->buffer_at);
  if (!st->buffers || !st->buffer_names || !st->buffer_at) return clpar_ddp_oom();
  size_t at = BUFFER_HEADER;
  for (int i = 0; i < n; i++) {
    const char *name;
    clpar_tensor *t;
    clpar_status s = clpar_module_buffer_at(module, i, &name, &t);
    if (s != CLPAR_OK) return s;
    st->buffers[i] = clpar_tensor_retain(t);
    st->n_buffers = i + 1;
    if (!(st->buffer_names[i] = malloc(strlen(name) + 8))) return clpar_ddp_oom();
    sprintf(st->buffer_names[i], "module.%s", name);
    st->buffer_at[i] = at;
    at += (clpar_tensor_nbytes(t) + 7) / 8 * 8;
  }
  st->block_bytes = at;
  if (n > 0 && !(st->block = malloc(at))) return clpar_ddp_oom();
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
 * device), one broadcast (clpar_ddp_bcast_block, whose header carries rank 0's status, so a
 * failed read fails every rank alike), the others write them. Inside a capture, its commands
 * (ddp_buffers.c). */
static clpar_status broadcast_buffers(ddp_state *st, const char *what) {
  if (st->n_buffers == 0) return CLPAR_OK;
  if (st->n_buckets && clpar_capture_active(st->buckets[0].dev)) return clpar_ddp_graph_buffers(st);
  clpar_status status = CLPAR_OK;
  for (int i = 0; clpar_dist_rank() == 0 && status == CLPAR_OK && i < st->n_buffers; i++)
    status = buffer_read(st->buffers[i], st->block + st->buffer_at[i]);
  clpar_status s = clpar_ddp_bcast_block(st, status, what);
  for (int i = 0; s == CLPAR_OK && clpar_dist_rank() != 0 && i < st->n_buffers; i++)
    s = buffer_write(st->buffers[i], st->block + st->buffer_at[i]);
  return s;
}

/* The parameters, reversed, each with a reference and its "module." name. */
static clpar_status take_parameters(ddp_state *st, clpar_module *module) {
  int n = clpar_module_parameter_count(module);
  st->params = calloc(n > 0 ? (size_t)n : 1, sizeof *st->params);
  if (!st->params) return clpar_ddp_oom();
  st->n_params = n;
  for (int i = 0; i < n; i++) {
    const char *name;
    clpar_tensor *t;
    clpar_status s = clpar_module_parameter_at(module, i, &name, &t);
    if (s != CLPAR_OK) return s;
    ddp_param *p = &st->params[n - 1 - i];
    p->st = st;
    p->param = clpar_tensor_retain(t);
    if (!(p->name = malloc(strlen(name) + 8))) return clpar_ddp_oom();
    sprintf(p->name, "module.%s", name);
  }
  return CLPAR_OK;
}

static clpar_status make_state(clpar_module *module, const clpar_ddp_options *o, ddp_state **out) {
  ddp_state *st = calloc(1, sizeof *st);
  if (!st) return clpar_ddp_oom();
  pthread_mutex_init(&st->lock, NULL);
  pthread_cond_init(&st->cv, NULL);
  st->comm = MPI_COMM_NULL;
  st->world = clpar_dist_world_size();
  double cap_mb = o && o->bucket_cap_mb > 0 ? o->bucket_cap_mb : 25.0;
  st->find_unused = o && o->find_unused_parameters;
  st->uneven_inputs = o && o->uneven_inputs;
  st->zero_stage = o ? o->zero_stage : 0;
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
  /* flat gradients: a bucket's gradients are then one copy each way (clpar_ddp_make_buckets) */
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
  if (s == CLPAR_OK)
    s = clpar_ddp_agree(st, clpar_ddp_make_buckets(st, cap_mb), "clpar_ddp_create");
  if (s == CLPAR_OK && st->zero_stage) /* the reduce-scatters run over MPI */
    snprintf(st->backend_why, sizeof st->backend_why, "ZeRO reduces over MPI (zero_stage %d)",
             st->zero_stage);
  else if (s == CLPAR_OK)
    s = clpar_ddp_choose_backend(st); /* collective: every rank alike */
  if (s == CLPAR_OK && (st->zero_stage == 1 || st->zero_stage == 2))
    s = clpar_ddp_agree(st, clpar_zero_comm_setup(st), "clpar_ddp_create");
  if (s == CLPAR_OK && st->zero_stage == 2) clpar_zero_release_grads(st);
  if (s == CLPAR_OK && !st->nccl && !st->zero_stage)
    s = clpar_ddp_agree(st, clpar_ddp_alloc_host_buffers(st), "clpar_ddp_create");
  if (s == CLPAR_OK && !(st->by_address = malloc((size_t)st->n_params * sizeof *st->by_address)))
    s = clpar_ddp_oom();
  if (s == CLPAR_OK) {
    for (int i = 0; i < st->n_params; i++) st->by_address[i] = &st->params[i];
    qsort(st->by_address, (size_t)st->n_params, sizeof *st->by_address, clpar_ddp_cmp_address);
  }
  for (int i = 0; s == CLPAR_OK && i < st->n_params; i++) {
    s = clpar_tensor_add_grad_hook(st->params[i].param, clpar_ddp_grad_ready, &st->params[i]);
    for (int j = 0; s != CLPAR_OK && j < i; j++)
      clpar_tensor_remove_grad_hook(st->params[j].param, clpar_ddp_grad_ready, &st->params[j]);
  }
  if (s == CLPAR_OK) {
    if (pthread_create(&st->thread, NULL, clpar_ddp_comm_thread, st) == 0)
      st->thread_started = 1;
    else
      s = clpar_set_error(CLPAR_ERROR_INTERNAL,
                          "clpar_ddp_create: could not start the communication thread");
    if (s != CLPAR_OK)
      for (int j = 0; j < st->n_params; j++)
        clpar_tensor_remove_grad_hook(st->params[j].param, clpar_ddp_grad_ready, &st->params[j]);
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
  if (options && (options->zero_stage < 0 || options->zero_stage > 3)) {
    clpar_module_free(module);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_create: zero_stage is %d; it is 0 (plain DDP), 1, 2 or 3",
                           options->zero_stage);
  }
  if (options && options->zero_stage == 3 && options->find_unused_parameters) {
    clpar_module_free(module);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_create: zero_stage is 3 with find_unused_parameters, which "
                           "ZeRO-3 cannot serve: each unit's gradient is reduce-scattered in "
                           "that unit's backward, so a unit one rank's forward skipped would "
                           "leave the ranks' collectives unmatched (every unit must take part "
                           "in the loss; stages 1 and 2 take find_unused_parameters)");
  }
  if (options && !(options->bucket_cap_mb >= 0)) {
    clpar_module_free(module);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_create: bucket_cap_mb is %g; it must be >= 0 (0: 25 MiB)",
                           options->bucket_cap_mb);
  }
  ddp_state *st = NULL;
  clpar_status s = make_state(module, options, &st);
  if (s == CLPAR_OK && st->zero_stage == 3) /* module may become its unit's wrapper */
    s = clpar_ddp_agree(st, clpar_zero3_setup(st, &module, options->zero_units),
                        "clpar_ddp_create");
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

ddp_state *clpar_ddp_state_of(const clpar_module *m) {
  return m && m->forward == ddp_forward ? m->user : NULL;
}

clpar_status clpar_ddp_synchronize(clpar_module *ddp) {
  ddp_state *st = clpar_ddp_state_of(ddp);
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
  ddp_state *st = clpar_ddp_state_of(ddp);
  if (why) *why = st ? st->backend_why : "not a DistributedDataParallel module";
  if (!st) return NULL;
  return st->nccl ? "nccl" : "mpi";
}

clpar_status clpar_ddp_join(clpar_module *ddp) {
  ddp_state *st = clpar_ddp_state_of(ddp);
  if (!st)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_join: not a DistributedDataParallel module");
  if (!st->uneven_inputs)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_join: the module was made without the uneven_inputs option, "
                           "so the other ranks' forwards would not see that this rank joined");
  if (clpar_capture_active(st->buckets[0].dev)) /* a host collective: no replay holds it */
    return clpar_capture_refuse(st->buckets[0].dev, "clpar_ddp_join",
                                "an all-reduce of the ranks' input flags on the host");
  int sync;
  return begin_step(st, 0, &sync);
}

clpar_status clpar_ddp_set_sync(clpar_module *ddp, int sync) {
  ddp_state *st = clpar_ddp_state_of(ddp);
  if (!st)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_ddp_set_sync: not a DistributedDataParallel module");
  pthread_mutex_lock(&st->lock);
  st->no_sync = !sync;
  pthread_mutex_unlock(&st->lock);
  return CLPAR_OK;
}

clpar_status clpar_ddp_stats_get(const clpar_module *ddp, clpar_ddp_stats *out) {
  ddp_state *st = clpar_ddp_state_of(ddp);
  if (!st || !out)
    return clpar_set_error(
        CLPAR_ERROR_INVALID_ARGUMENT,
        "clpar_ddp_stats_get: not a DistributedDataParallel module, or NULL out");
  pthread_mutex_lock(&st->lock);
  *out = st->stats;
  pthread_mutex_unlock(&st->lock);
  return CLPAR_OK;
}
