/* zero.c — the sharded optimizer of ZeRO stages 1 and 2 (include/clpar/zero.h) on a
 * DistributedDataParallel module made with zero_stage 1 or 2, whose gradient hooks then reduce
 * nothing (ddp_comm.c). The flat parameters (one flat leaf: the module on one device, float32)
 * are cut into world shards of ceil(numel / world) floats. The whole gradient is gathered into
 * a host buffer of world shards (the tail zero-padded): stage 1 reads the flat gradient in the
 * step; stage 2 has no flat gradient, and its hook reads each parameter's gradient into its
 * place as backward makes it and frees it. The buffer is reduce-scattered and averaged, the
 * rank's shard stepped in place by an inner optimizer over a view of the flat parameters, and
 * the shards all-gathered back into the flat parameters. */
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

#include "dist/ddp_internal.h"

enum { ZERO_SGD, ZERO_ADAM, ZERO_ADAMW };

struct clpar_zero_optimizer {
  ddp_state *st; /* the DDP module's: its communicator and collective count */
  int stage, world, rank;
  clpar_tensor *flat;   /* the flat leaf (retained) */
  int64_t numel, shard; /* shard: ceil(numel / world) */
  int64_t lo, len;      /* this rank's part of [0, numel) */
  clpar_tensor *pshard; /* a view of flat at lo, len; its grad is gshard (NULL when len is 0) */
  /* stage 1: a view of flat's grad at lo, len; stage 2: memory of its own */
  clpar_tensor *gshard;
  clpar_optimizer *inner;
  float *host;   /* world * shard floats: the gradient, then the gathered parameters */
  float *mine;   /* shard floats: the averaged shard, then this rank's parameters */
  int abandoned; /* a collective timed out: MPI may still write host and mine */
  /* stage 2: filled[i]: st->params[i]'s gradient is in host since the last step (a second
   * backward adds into it); have: some is; the hook's first error and its message */
  unsigned char *filled;
  int have;
  clpar_status hook_error;
  char hook_message[MESSAGE_SIZE];
};

static clpar_status zero_mpi(clpar_zero_optimizer *z, int gather, const char *what) {
  ddp_state *st = z->st;
  if (clpar_dist_check_broken()) return CLPAR_ERROR_TIMEOUT;
  int count = (int)z->shard;
  clpar_status s = clpar_dist_debug_check(st->comm, what, st->seq + 1,
                                          (int64_t)z->shard * (gather ? 1 : z->world) * 4);
  if (s != CLPAR_OK) return s;
  MPI_Request req = MPI_REQUEST_NULL;
  clpar_mpi_lock();
  int rc =
      gather
          ? MPI_Iallgather(z->mine, count, MPI_FLOAT, z->host, count, MPI_FLOAT, st->comm, &req)
          : MPI_Ireduce_scatter_block(z->host, z->mine, count, MPI_FLOAT, MPI_SUM, st->comm, &req);
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

/* The shard's gradient: the view gshard of the flat gradient there is now (stage 2 makes a new
 * one each step), which the inner optimizer finds as the shard's grad. */
static clpar_status bind_grad_shard(clpar_zero_optimizer *z) {
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

/* Stage 3: the shards' gradients are reduced already; the step is the inner one's. */
static clpar_status step_stage3(clpar_zero_optimizer *z) {
  const char *fn = "clpar_zero_optimizer_step";
  clpar_zero3_release(z->st); /* gathered parameters would be stale after the step */
  clpar_status s = clpar_zero3_has_grad(z->st)
                       ? clpar_optimizer_step(z->inner)
                       : clpar_set_error(CLPAR_ERROR_NO_GRADIENT,
                                         "%s: no backward gave the module a gradient since the "
                                         "last step",
                                         fn);
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
                           "%s: ddp (zero_stage 2) has a ZeRO optimizer already; its backward "
                           "hands the gradients to that one",
                           fn);
  clpar_zero_optimizer *z = calloc(1, sizeof *z);
  if (!z || !(z->filled = calloc((size_t)st->n_params, 1))) {
    free(z);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
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

/* Stage 2: parameter i's gradient into its place in host (added when a backward since the
 * last step put one there already), then off the device. */
static clpar_status take_gradient(clpar_zero_optimizer *z, int i) {
  clpar_tensor *t = z->st->params[i].param, *g = t->grad;
  size_t n = (size_t)t->numel;
  float *dst = z->host + (t->offset - z->flat->offset), *tmp = NULL;
  if (z->filled[i] && !(tmp = malloc(n * sizeof(float))))
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "ZeRO: out of host memory");
  clpar_status s = clpar_tensor_read(g, tmp ? tmp : dst, n);
  for (size_t k = 0; s == CLPAR_OK && tmp && k < n; k++) dst[k] += tmp[k];
  free(tmp);
  if (s != CLPAR_OK) return s;
  z->filled[i] = 1;
  z->have = 1;
  clpar_tensor_release(g);
  t->grad = NULL;
  t->grad_defined = 0;
  return CLPAR_OK;
}

void clpar_zero_grad_ready(ddp_state *st, ddp_param *p) {
  clpar_zero_optimizer *z = st->zero;
  if (!z || !p->param->grad) return;
  clpar_status s = take_gradient(z, (int)(p - st->params));
  if (s != CLPAR_OK && z->hook_error == CLPAR_OK) {
    z->hook_error = s;
    snprintf(z->hook_message, sizeof z->hook_message, "%s", clpar_last_error());
  }
}

/* The whole gradient in host: stage 1 reads the flat gradient; stage 2 takes what backward's
 * hooks left and zeros where no gradient came. */
static clpar_status gather_gradient(clpar_zero_optimizer *z, const char *fn) {
  clpar_tensor *g = z->flat->grad;
  if (z->stage == 1)
    return g ? clpar_tensor_read(g, z->host, (size_t)z->numel)
             : clpar_set_error(CLPAR_ERROR_NO_GRADIENT, "%s: the module has no gradient", fn);
  clpar_status s = CLPAR_OK;
  for (int i = 0; i < z->st->n_params; i++) {
    clpar_tensor *t = z->st->params[i].param;
    if (t->grad && s == CLPAR_OK) s = take_gradient(z, i);
    if (!z->filled[i])
      memset(z->host + (t->offset - z->flat->offset), 0, (size_t)t->numel * sizeof(float));
  }
  if (s == CLPAR_OK && z->hook_error != CLPAR_OK)
    s = clpar_set_error(z->hook_error, "%s", z->hook_message);
  if (s == CLPAR_OK && !z->have)
    s = clpar_set_error(CLPAR_ERROR_NO_GRADIENT,
                        "%s: no backward gave the module a gradient since the last step", fn);
  return s;
}

/* Stage 2: the next backward starts the gradient afresh. */
static void reset_gradient(clpar_zero_optimizer *z) {
  memset(z->filled, 0, (size_t)z->st->n_params);
  z->have = 0;
  z->hook_error = CLPAR_OK;
}

/* The average of this rank's shard of the gradient into gshard. */
static clpar_status reduce_gradient(clpar_zero_optimizer *z) {
  const char *fn = "clpar_zero_optimizer_step";
  clpar_status s = gather_gradient(z, fn);
  /* a rank without its gradient takes part with zeros (the collectives stay in step) and
   * fails every rank at the agreement before the all-gather */
  if (s != CLPAR_OK) memset(z->host, 0, (size_t)z->numel * sizeof(float));
  clpar_status mpi = zero_mpi(z, 0, "clpar_zero_optimizer_step: reduce-scatter of the gradients");
  if (mpi != CLPAR_OK) return mpi;
  if (s != CLPAR_OK) return s;
  float inv = 1.0f / (float)z->world;
  for (int64_t i = 0; i < z->len; i++) z->mine[i] *= inv;
  if (z->len > 0 && z->stage == 1) s = bind_grad_shard(z);
  if (s == CLPAR_OK && z->len > 0) s = clpar_tensor_write(z->gshard, z->mine, (size_t)z->len);
  return s;
}

clpar_status clpar_zero_optimizer_step(clpar_zero_optimizer *z) {
  if (!z)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_zero_optimizer_step: opt is NULL");
  if (z->stage == 3) return step_stage3(z);
  clpar_status s = reduce_gradient(z);
  if (z->stage == 2) reset_gradient(z);
  if (s == CLPAR_ERROR_TIMEOUT || z->abandoned) return s;
  if (s == CLPAR_OK && z->len > 0) s = clpar_optimizer_step(z->inner);
  memset(z->mine, 0, (size_t)z->shard * sizeof(float));
  if (s == CLPAR_OK && z->len > 0) s = clpar_tensor_read(z->pshard, z->mine, (size_t)z->len);
  s = agree(z->st, s, "clpar_zero_optimizer_step");
  if (s == CLPAR_OK) s = zero_mpi(z, 1, "clpar_zero_optimizer_step: all-gather of the parameters");
  if (s == CLPAR_OK) s = clpar_tensor_write(z->flat, z->host, (size_t)z->numel);
  return s;
}

clpar_status clpar_zero_optimizer_zero_grad(clpar_zero_optimizer *z) {
  if (!z)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_zero_optimizer_zero_grad: opt is NULL");
  if (z->stage == 1) return z->flat->grad ? clpar_fill(z->flat->grad, 0.0f) : CLPAR_OK;
  if (z->stage == 3) return clpar_optimizer_zero_grad(z->inner);
  clpar_zero_release_grads(z->st); /* any a backward left before the optimizer took them */
  reset_gradient(z);
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
  clpar_optimizer_free(z->inner);
  unbind_grad_shard(z);
  clpar_tensor_release(z->pshard);
  clpar_tensor_release(z->flat);
  if (!z->abandoned) { /* else MPI may still write them: left allocated */
    free(z->host);
    free(z->mine);
  }
  free(z->filled);
  free(z);
}

#endif
