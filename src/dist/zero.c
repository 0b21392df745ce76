/* zero.c — the sharded optimizer of ZeRO stages 1 and 2 (include/clpar/zero.h) on a
 * DistributedDataParallel module made with zero_stage 1 or 2, whose buckets backward
 * reduce-scatters into the rank's averaged shard on the host (zero_comm.c). The flat parameters
 * (one flat leaf: the module on one device, float32) are cut into world shards of
 * ceil(numel / world) floats. The step writes the averaged shard into the shard's gradient
 * (stage 1: a view of the flat gradient; stage 2: memory of its own), steps the rank's shard in
 * place with an inner optimizer over a view of the flat parameters, and all-gathers the shards
 * back into the flat parameters. Stage 3's step (the units reduce-scatter in their backward,
 * zero3.c) is the inner optimizer's alone. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/zero.h"
#include "internal.h"

#ifndef CLPAR_HAVE_MPI

static clpar_status no_mpi(const char *fn) {
  return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                         "%s: clpar was built without MPI (CMake option CLPAR_MPI)", fn);
}
clpar_status clpar_zero_sgd_create(clpar_module *ddp, const clpar_sgd_options *options,
                                   clpar_zero_optimizer **out) {
  (void)ddp, (void)options, (void)out;
  return no_mpi("clpar_zero_sgd_create");
}
clpar_status clpar_zero_adam_create(clpar_module *ddp, const clpar_adam_options *options,
                                    clpar_zero_optimizer **out) {
  (void)ddp, (void)options, (void)out;
  return no_mpi("clpar_zero_adam_create");
}
clpar_status clpar_zero_adamw_create(clpar_module *ddp, const clpar_adam_options *options,
                                     clpar_zero_optimizer **out) {
  (void)ddp, (void)options, (void)out;
  return no_mpi("clpar_zero_adamw_create");
}
clpar_status clpar_zero_optimizer_step(clpar_zero_optimizer *opt) {
  (void)opt;
  return no_mpi("clpar_zero_optimizer_step");
}
clpar_status clpar_zero_optimizer_zero_grad(clpar_zero_optimizer *opt) {
  (void)opt;
  return no_mpi("clpar_zero_optimizer_zero_grad");
}
clpar_optimizer *clpar_zero_optimizer_inner(clpar_zero_optimizer *opt) {
  (void)opt;
  return NULL;
}
void clpar_zero_optimizer_shard(const clpar_zero_optimizer *opt, int64_t *offset, int64_t *len) {
  (void)opt;
  if (offset) *offset = 0;
  if (len) *len = 0;
}
void clpar_zero_optimizer_free(clpar_zero_optimizer *opt) {
  (void)opt;
}

#else

#include "dist/zero_internal.h"

enum { ZERO_SGD, ZERO_ADAM, ZERO_ADAMW };

clpar_status clpar_zero_all_gather(clpar_zero_optimizer *z, const char *what) {
  ddp_state *st = z->st;
  if (clpar_dist_check_broken()) return CLPAR_ERROR_TIMEOUT;
  int count = (int)z->shard;
  clpar_status s = clpar_dist_debug_check(st->comm, what, st->seq + 1, (int64_t)z->shard * 4);
  if (s != CLPAR_OK) return s;
  MPI_Request req = MPI_REQUEST_NULL;
  clpar_mpi_lock();
  int rc = MPI_Iallgather(z->mine, count, MPI_FLOAT, z->host, count, MPI_FLOAT, st->comm, &req);
  clpar_mpi_unlock();
  s = rc == MPI_SUCCESS ? clpar_dist_wait(&req, what, ++st->seq) : clpar_mpi_error(rc, what);
  if (s == CLPAR_ERROR_TIMEOUT) z->abandoned = st->abandoned = 1;
  return s;
}

/* Collective: CLPAR_OK when every rank's mine is; else every rank fails with the error of the
 * lowest rank that failed, naming that rank. */
static clpar_status agree(ddp_state *st, clpar_status mine, const char *fn) {
  char msg[MESSAGE_SIZE] = "", what[96];
  if (mine != CLPAR_OK) snprintf(msg, sizeof msg, "%s", clpar_last_error());
  int bad = mine != CLPAR_OK ? clpar_dist_rank() : INT_MAX, code = mine;
  snprintf(what, sizeof what, "%s: checking every rank succeeded", fn);
  clpar_status s = clpar_dist_allreduce(&bad, 1, MPI_INT, MPI_MIN, st->comm, what, ++st->seq);
  if (s != CLPAR_OK || bad == INT_MAX) return s;
  snprintf(what, sizeof what, "%s: broadcasting rank %d's error", fn, bad);
  s = clpar_dist_bcast(msg, sizeof msg, MPI_CHAR, bad, st->comm, what, ++st->seq);
  if (s == CLPAR_OK) s = clpar_dist_bcast(&code, 1, MPI_INT, bad, st->comm, what, ++st->seq);
  if (s != CLPAR_OK) return s;
  msg[sizeof msg - 1] = '\0';
  return clpar_set_error((clpar_status)code, "rank %d: %s", bad, msg);
}

/* The flat leaf every parameter of the DDP module is a member of, or an error. */
static clpar_status find_flat(ddp_state *st, const char *fn, clpar_tensor **flat) {
  clpar_tensor *f = st->params[0].param->flat;
  for (int i = 0; f && i < st->n_params; i++)
    if (st->params[i].param->flat != f) f = NULL;
  if (!f || f->dtype != CLPAR_FLOAT32)
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "%s: the module's parameters are not one float32 flat buffer on one "
                           "device; ZeRO shards a module that lives on one device",
                           fn);
  *flat = f;
  return CLPAR_OK;
}

static void unbind_grad_shard(clpar_zero_optimizer *z) {
  if (z->pshard) {
    clpar_tensor_release(z->pshard->grad);
    z->pshard->grad = NULL;
    z->pshard->grad_defined = 0;
  }
  clpar_tensor_release(z->gshard);
  z->gshard = NULL;
}

/* The shard's view of the parameters and the host buffers. */
static clpar_status make_shard(clpar_zero_optimizer *z, const char *fn) {
  z->shard = (z->numel + z->world - 1) / z->world;
  if (z->shard > INT32_MAX)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: a shard of %lld floats is over MPI's int",
                           fn, (long long)z->shard);
  z->lo = z->rank * z->shard;
  z->len = z->lo >= z->numel ? 0 : (z->numel - z->lo < z->shard ? z->numel - z->lo : z->shard);
  z->host = calloc((size_t)(z->shard * z->world), sizeof(float));
  z->mine = calloc((size_t)z->shard, sizeof(float));
  if (!z->host || !z->mine)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  if (z->len == 0) return CLPAR_OK;
  clpar_status s = clpar_tensor_view_at(z->flat, (size_t)z->lo, 1, &z->len, &z->pshard);
  if (s != CLPAR_OK) return s;
  z->pshard->requires_grad = 1;
  if (z->stage == 1) return CLPAR_OK; /* bound to the flat gradient at each step */
  int was = clpar_memory_category_set(CLPAR_MEM_GRADIENTS);
  s = clpar_tensor_zeros(z->flat->storage->dev, 1, &z->len, &z->gshard);
  clpar_memory_category_set(was);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(z->gshard);
  z->pshard->grad = clpar_tensor_retain(z->gshard);
  z->pshard->grad_defined = 1;
  return CLPAR_OK;
}

clpar_status clpar_zero_bind_grad_shard(clpar_zero_optimizer *z) {
  clpar_tensor *g = z->flat->grad;
  if (z->len == 0 || (z->gshard && z->gshard->storage == g->storage)) return CLPAR_OK;
  unbind_grad_shard(z);
  clpar_status s = clpar_tensor_view_at(g, (size_t)z->lo, 1, &z->len, &z->gshard);
  if (s != CLPAR_OK) return s;
  z->pshard->grad = clpar_tensor_retain(z->gshard);
  z->pshard->grad_defined = 1;
  return CLPAR_OK;
}

/* Stage 3: the inner optimizer over the units' shards (zero3.c), whose gradients backward
 * reduce-scatters. */
static clpar_status create_stage3(clpar_zero_optimizer *z, int kind, const void *options,
                                  const char *fn) {
  int n = clpar_zero3_shards(z->st, NULL);
  clpar_tensor **shards = calloc((size_t)n + 1, sizeof *shards);
  if (!shards) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  clpar_zero3_shards(z->st, shards);
  clpar_status s;
  if (kind == ZERO_SGD)
    s = clpar_sgd_create(shards, n, options, &z->inner);
  else if (kind == ZERO_ADAM)
    s = clpar_adam_create(shards, n, options, &z->inner);
  else
    s = clpar_adamw_create(shards, n, options, &z->inner);
  for (int i = 0; i < n; i++) z->len += clpar_tensor_numel(shards[i]);
  free(shards);
  return s;
}

/* Stage 3: the shards' gradients (reduced in backward) written; the step is the inner one's. */
static clpar_status step_stage3(clpar_zero_optimizer *z) {
  const char *fn = "clpar_zero_optimizer_step";
  clpar_zero3_release(z->st); /* gathered parameters would be stale after the step */
  /* the shards' gradients, which backward's reduce-scatters left on the host */
  clpar_status s = clpar_zero3_flush(z->st);
  if (s == CLPAR_ERROR_TIMEOUT) return s; /* no more collectives: every rank times out alike */
  if (s == CLPAR_OK)
    s = clpar_zero3_has_grad(z->st)
            ? clpar_optimizer_step(z->inner)
            : clpar_set_error(CLPAR_ERROR_NO_GRADIENT,
                              "%s: no backward gave the module a gradient since the "
                              "last step",
                              fn);
  if (clpar_zero3_capturing(z->st)) return s; /* a replay agrees on nothing */
  return agree(z->st, s, fn);
}

static clpar_status create(clpar_module *ddp, int kind, const void *options, const char *fn,
                           clpar_zero_optimizer **out) {
  if (!out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  ddp_state *st = clpar_ddp_state_of(ddp);
  if (!st || st->zero_stage < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: ddp is not a DistributedDataParallel module made with "
                           "clpar_ddp_options.zero_stage 1, 2 or 3",
                           fn);
  if (st->zero)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: ddp (zero_stage 2) has a ZeRO optimizer already, whose step "
                           "spends the gradients backward reduces",
                           fn);
  clpar_zero_optimizer *z = calloc(1, sizeof *z);
  if (!z) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  z->st = st;
  z->stage = st->zero_stage;
  z->world = st->world;
  z->rank = clpar_dist_rank();
  clpar_tensor *flat = NULL;
  clpar_status s = z->stage == 3 ? CLPAR_OK : find_flat(st, fn, &flat);
  if (s == CLPAR_OK && z->stage == 3) {
    s = create_stage3(z, kind, options, fn);
  } else if (s == CLPAR_OK) {
    z->flat = clpar_tensor_retain(flat);
    z->numel = flat->numel;
    s = make_shard(z, fn);
  }
  if (s == CLPAR_OK && z->stage != 3 && z->len > 0) {
    if (kind == ZERO_SGD)
      s = clpar_sgd_create(&z->pshard, 1, options, &z->inner);
    else if (kind == ZERO_ADAM)
      s = clpar_adam_create(&z->pshard, 1, options, &z->inner);
    else
      s = clpar_adamw_create(&z->pshard, 1, options, &z->inner);
  }
  /* every rank alike: a rank with a bad option or no memory fails them all */
  s = agree(st, s, fn);
  if (s != CLPAR_OK) {
    clpar_zero_optimizer_free(z);
    return s;
  }
  if (z->stage == 2) st->zero = z;
  *out = z;
  return CLPAR_OK;
}

clpar_status clpar_zero_sgd_create(clpar_module *ddp, const clpar_sgd_options *options,
                                   clpar_zero_optimizer **out) {
  return create(ddp, ZERO_SGD, options, "clpar_zero_sgd_create", out);
}
clpar_status clpar_zero_adam_create(clpar_module *ddp, const clpar_adam_options *options,
                                    clpar_zero_optimizer **out) {
  return create(ddp, ZERO_ADAM, options, "clpar_zero_adam_create", out);
}
clpar_status clpar_zero_adamw_create(clpar_module *ddp, const clpar_adam_options *options,
                                     clpar_zero_optimizer **out) {
  return create(ddp, ZERO_ADAMW, options, "clpar_zero_adamw_create", out);
}

void clpar_zero_release_grads(ddp_state *st) {
  for (int i = 0; i < st->n_params; i++) {
    clpar_tensor *p = st->params[i].param;
    if (p->flat) {
      clpar_tensor_release(p->flat->grad);
      p->flat->grad = NULL;
      p->flat->grad_defined = 0;
    }
    clpar_tensor_release(p->grad);
    p->grad = NULL;
    p->grad_defined = 0;
  }
}

/* What backward's reduction left: the communication thread's error, a backward that left a
 * parameter without its gradient, or no gradient at all. */
static clpar_status reduction_status(clpar_zero_optimizer *z, const char *fn) {
  ddp_state *st = z->st;
  clpar_status s = CLPAR_OK;
  pthread_mutex_lock(&st->lock);
  while (st->busy) pthread_cond_wait(&st->cv, &st->lock);
  if (st->error != CLPAR_OK) {
    s = clpar_set_error(st->error, "%s", st->message);
    st->error = CLPAR_OK;
  }
  int any = 0, missing = -1; /* ready flags are reset once the last bucket is reduced */
  for (int i = 0; i < st->n_params; i++) {
    any |= st->params[i].ready;
    if (!st->params[i].ready && missing < 0) missing = i;
  }
  if (s == CLPAR_OK && any)
    s = clpar_set_error(CLPAR_ERROR_NO_GRADIENT,
                        "%s: the last backward gave no gradient to parameter %s, so its bucket "
                        "was never reduced (every parameter must take part in the loss)",
                        fn, st->params[missing].name);
  pthread_mutex_unlock(&st->lock);
  if (s == CLPAR_OK && z->stage == 1 && !z->flat->grad)
    s = clpar_set_error(CLPAR_ERROR_NO_GRADIENT, "%s: the module has no gradient", fn);
  return s;
}

/* The rank's averaged shard, which backward reduce-scattered (zero_comm.c), into gshard. */
static clpar_status reduce_gradient(clpar_zero_optimizer *z) {
  const char *fn = "clpar_zero_optimizer_step";
  clpar_status s = reduction_status(z, fn); /* the communication thread idle after it */
  int have = 0;
  float *acc = clpar_zero_comm_step_shard(z->st, &have);
  if (s == CLPAR_OK && z->stage == 2 && !have)
    s = clpar_set_error(CLPAR_ERROR_NO_GRADIENT,
                        "%s: no backward gave the module a gradient since the last step", fn);
  if (s == CLPAR_OK && z->len > 0 && z->stage == 1) s = clpar_zero_bind_grad_shard(z);
  if (s == CLPAR_OK && z->len > 0) s = clpar_tensor_write(z->gshard, acc, (size_t)z->len);
  return s;
}

clpar_status clpar_zero_optimizer_step(clpar_zero_optimizer *z) {
  if (!z)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_zero_optimizer_step: opt is NULL");
  if (z->stage == 3) return step_stage3(z);
  if (clpar_zero_graph_capturing(z)) return clpar_zero_graph_step(z);
  clpar_zero_graph_eager(z); /* after the replays in flight; spends what they reduced */
  clpar_status s = reduce_gradient(z);
  if (s == CLPAR_ERROR_TIMEOUT || z->abandoned || z->st->abandoned) return s;
  if (s == CLPAR_OK && z->len > 0) s = clpar_optimizer_step(z->inner);
  memset(z->mine, 0, (size_t)z->shard * sizeof(float));
  if (s == CLPAR_OK && z->len > 0) s = clpar_tensor_read(z->pshard, z->mine, (size_t)z->len);
  /* stage 2's gradients are spent (the read above waited for the write of acc) */
  if (z->stage == 2) clpar_zero_comm_reset(z->st);
  s = agree(z->st, s, "clpar_zero_optimizer_step");
  if (s == CLPAR_OK)
    s = clpar_zero_all_gather(z, "clpar_zero_optimizer_step: all-gather of the parameters");
  if (s == CLPAR_OK) s = clpar_tensor_write(z->flat, z->host, (size_t)z->numel);
  return s;
}

/* Stage 1: the flat gradient's memory left as it is (the parameters' gradients stale): the next
 * backward's first gradient for each parameter replaces its part instead of adding, as
 * PyTorch's zero_grad (set_to_none) lets it, which saves filling the whole flat gradient. Where
 * a graph is alive, its replays add into the memory they captured: filled then. */
static clpar_status zero_grad_stage1(clpar_zero_optimizer *z) {
  if (!z->flat->grad) return CLPAR_OK;
  if (clpar_graph_any_live()) return clpar_fill(z->flat->grad, 0.0f);
  for (int i = 0; i < z->st->n_params; i++) clpar_grad_set_stale(z->st->params[i].param);
  z->flat->grad_defined = 0;
  return CLPAR_OK;
}

clpar_status clpar_zero_optimizer_zero_grad(clpar_zero_optimizer *z) {
  if (!z)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_zero_optimizer_zero_grad: opt is NULL");
  if (z->stage == 3) {
    clpar_zero3_zero_grad(z->st);
    return clpar_optimizer_zero_grad(z->inner);
  }
  if (clpar_zero_graph_capturing(z)) return clpar_zero_graph_zero_grad(z);
  clpar_zero_graph_eager(z);
  clpar_zero_comm_reset(z->st); /* the step's read waited for its write from there */
  if (z->stage == 1) return zero_grad_stage1(z);
  clpar_zero_release_grads(z->st); /* any a no_sync backward left on the device */
  return CLPAR_OK;
}

clpar_optimizer *clpar_zero_optimizer_inner(clpar_zero_optimizer *z) {
  return z ? z->inner : NULL;
}

void clpar_zero_optimizer_shard(const clpar_zero_optimizer *z, int64_t *offset, int64_t *len) {
  if (offset) *offset = z ? z->lo : 0;
  if (len) *len = z ? z->len : 0;
}

void clpar_zero_optimizer_free(clpar_zero_optimizer *z) {
  if (!z) return;
  if (z->st && z->st->zero == z) z->st->zero = NULL;
  if (z->stage != 3) clpar_zero_graph_forget(z);
  clpar_optimizer_free(z->inner);
  unbind_grad_shard(z);
  clpar_tensor_release(z->pshard);
  clpar_tensor_release(z->flat);
  if (!z->abandoned) { /* else MPI may still write them: left allocated */
    free(z->host);
    free(z->mine);
  }
  free(z);
}

#endif
