/* zero.c — the sharded optimizer of ZeRO stages 1 and 2 (include/clpar/zero.h) on a
 * DistributedDataParallel module made with zero_stage 1 or 2, whose gradient hooks then leave
 * the gradients on the device (ddp_comm.c). The flat parameters (one flat leaf: the module on
 * one device, float32) are cut into world shards of ceil(numel / world) floats; the gradient
 * is read into a host buffer of world shards (the tail zero-padded), reduce-scattered and
 * averaged, the rank's shard stepped in place by an inner optimizer over a view of the flat
 * parameters, and the shards all-gathered back into the flat parameters. */
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
  clpar_tensor *gshard; /* a view of flat's grad at lo, len (NULL while it has none) */
  clpar_optimizer *inner;
  float *host;   /* world * shard floats: the gradient, then the gathered parameters */
  float *mine;   /* shard floats: the averaged shard, then this rank's parameters */
  int abandoned; /* a collective timed out: MPI may still write host and mine */
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
  if (s == CLPAR_OK) z->pshard->requires_grad = 1;
  return s;
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

static clpar_status create(clpar_module *ddp, int kind, const void *options, const char *fn,
                           clpar_zero_optimizer **out) {
  if (!out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  ddp_state *st = clpar_ddp_state_of(ddp);
  if (!st || st->zero_stage < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: ddp is not a DistributedDataParallel module made with "
                           "clpar_ddp_options.zero_stage 1 or 2",
                           fn);
  clpar_zero_optimizer *z = calloc(1, sizeof *z);
  if (!z) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  z->st = st;
  z->stage = st->zero_stage;
  z->world = st->world;
  z->rank = clpar_dist_rank();
  clpar_tensor *flat = NULL;
  clpar_status s = find_flat(st, fn, &flat);
  if (s == CLPAR_OK) {
    z->flat = clpar_tensor_retain(flat);
    z->numel = flat->numel;
    s = make_shard(z, fn);
  }
  if (s == CLPAR_OK && z->len > 0) {
    if (kind == ZERO_SGD)
      s = clpar_sgd_create(&z->pshard, 1, options, &z->inner);
    else if (kind == ZERO_ADAM)
      s = clpar_adam_create(&z->pshard, 1, options, &z->inner);
    else
      s = clpar_adamw_create(&z->pshard, 1, options, &z->inner);
  }
  /* every rank alike: a rank with a bad option or no memory fails them all */
  s = clpar_ddp_agree(st, s, fn);
  if (s != CLPAR_OK) {
    clpar_zero_optimizer_free(z);
    return s;
  }
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

/* Stage 2, after the reduction: the full gradient goes (the flat leaf's and its members'
 * views of it); clpar_zero_regrow sets it aside again before the next backward. */
static void drop_full_gradient(clpar_zero_optimizer *z) {
  ddp_state *st = z->st;
  unbind_grad_shard(z);
  for (int i = 0; i < st->n_params; i++) {
    clpar_tensor *p = st->params[i].param;
    clpar_tensor_release(p->grad);
    p->grad = NULL;
    p->grad_defined = 0;
  }
  clpar_tensor_release(z->flat->grad);
  z->flat->grad = NULL;
  z->flat->grad_defined = 0;
}

clpar_status clpar_zero_regrow(ddp_state *st) {
  clpar_tensor *flat = st->params[0].param->flat;
  if (!flat || flat->grad) return CLPAR_OK;
  clpar_tensor *grad = NULL;
  int was = clpar_memory_category_set(CLPAR_MEM_GRADIENTS);
  clpar_status s = clpar_tensor_zeros(flat->storage->dev, 1, &flat->numel, &grad);
  clpar_memory_category_set(was);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(grad);
  for (int i = 0; s == CLPAR_OK && i < st->n_params; i++) {
    clpar_tensor *p = st->params[i].param;
    clpar_tensor *view = NULL;
    s = clpar_tensor_view_at(grad, p->offset - flat->offset, p->ndim, p->shape, &view);
    if (s == CLPAR_OK) {
      clpar_tensor_release(p->grad);
      p->grad = view;
      p->grad_defined = 0;
    }
  }
  flat->grad = grad;
  flat->grad_defined = 0;
  return s;
}

/* The flat gradient's average of this rank's shard into gshard. */
static clpar_status reduce_gradient(clpar_zero_optimizer *z) {
  const char *fn = "clpar_zero_optimizer_step";
  clpar_tensor *g = z->flat->grad;
  clpar_status s = g ? CLPAR_OK
                     : clpar_set_error(CLPAR_ERROR_NO_GRADIENT,
                                       "%s: the module's parameters have no gradient (run a "
                                       "forward through the DDP module and a backward first)",
                                       fn);
  if (s == CLPAR_OK) s = clpar_tensor_read(g, z->host, (size_t)z->numel);
  /* a rank whose gradient could not be read takes part with zeros (the collectives stay in
   * step) and fails every rank at the agreement before the all-gather */
  if (s != CLPAR_OK) memset(z->host, 0, (size_t)z->numel * sizeof(float));
  clpar_status mpi = zero_mpi(z, 0, "clpar_zero_optimizer_step: reduce-scatter of the gradients");
  if (mpi != CLPAR_OK) return mpi;
  if (s != CLPAR_OK) return s;
  float inv = 1.0f / (float)z->world;
  for (int64_t i = 0; i < z->len; i++) z->mine[i] *= inv;
  if (z->len > 0) s = bind_grad_shard(z);
  if (s == CLPAR_OK && z->len > 0) s = clpar_tensor_write(z->gshard, z->mine, (size_t)z->len);
  return s;
}

clpar_status clpar_zero_optimizer_step(clpar_zero_optimizer *z) {
  if (!z)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_zero_optimizer_step: opt is NULL");
  clpar_status s = reduce_gradient(z);
  if (s == CLPAR_ERROR_TIMEOUT || z->abandoned) return s;
  if (s == CLPAR_OK && z->len > 0) s = clpar_optimizer_step(z->inner);
  if (z->stage == 2 && z->flat->grad) drop_full_gradient(z); /* once the step has read it */
  memset(z->mine, 0, (size_t)z->shard * sizeof(float));
  if (s == CLPAR_OK && z->len > 0) s = clpar_tensor_read(z->pshard, z->mine, (size_t)z->len);
  s = clpar_ddp_agree(z->st, s, "clpar_zero_optimizer_step");
  if (s == CLPAR_OK) s = zero_mpi(z, 1, "clpar_zero_optimizer_step: all-gather of the parameters");
  if (s == CLPAR_OK) s = clpar_tensor_write(z->flat, z->host, (size_t)z->numel);
  return s;
}

clpar_status clpar_zero_optimizer_zero_grad(clpar_zero_optimizer *z) {
  if (!z)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_zero_optimizer_zero_grad: opt is NULL");
  return z->flat->grad ? clpar_fill(z->flat->grad, 0.0f) : CLPAR_OK;
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
