/* zero3_state.c — ZeRO stage 3 (zero3.c) as the optimizer (zero.c), the user
 * (clpar_zero_gather_parameters) and the sharded checkpoints (src/io/checkpoint_zero3.c) see
 * it: the shards, the parameters given their values or their shapes, and the units' layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/zero.h"
#include "internal.h"

#ifndef CLPAR_HAVE_MPI

clpar_status clpar_zero_gather_parameters(clpar_module *ddp) {
  (void)ddp;
  return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                         "clpar_zero_gather_parameters: clpar was "
                         "built without MPI (CMake option CLPAR_MPI)");
}
clpar_status clpar_zero_release_parameters(clpar_module *ddp) {
  (void)ddp;
  return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                         "clpar_zero_release_parameters: clpar was "
                         "built without MPI (CMake option CLPAR_MPI)");
}

#else

#include "dist/zero3_internal.h"

/* ---- what the optimizer and the user see ---- */

int clpar_zero3_shards(ddp_state *st, clpar_tensor **out) {
  zero3 *z = st->zero3;
  for (int k = 0; z && out && k < z->n_units; k++) out[k] = z->units[k]->pshard;
  return z ? z->n_units : 0;
}

int clpar_zero3_has_grad(ddp_state *st) {
  zero3 *z = st->zero3;
  for (int k = 0; z && k < z->n_units; k++)
    if (clpar_tensor_has_grad(z->units[k]->pshard)) return 1;
  return 0;
}

void clpar_zero3_release(ddp_state *st) {
  if (st->zero3 && ((zero3 *)st->zero3)->gathered) clpar_z3_release_all(st->zero3);
}

/* u's parameters view full (the unit's [numel] values), each with its shape. */
static void point_at(z3_unit *u, clpar_tensor *full) {
  for (int i = 0; i < u->n_params; i++) {
    z3_param *p = &u->params[i];
    clpar_tensor_repoint(p->param, full->storage, full->offset + (size_t)p->at);
    p->param->ndim = p->ndim;
    memcpy(p->param->shape, p->shape, sizeof p->shape);
    p->param->numel = 1;
    for (int d = 0; d < p->ndim; d++) p->param->numel *= p->shape[d];
    clpar_tensor_touch(p->param);
  }
}

/* ---- checkpoints (src/io/checkpoint_zero3.c) ---- */

int clpar_zero3_locate(ddp_state *st, const clpar_tensor *t, int64_t *at) {
  zero3 *z = st->zero3;
  for (int k = 0; z && k < z->n_units; k++)
    for (int i = 0; i < z->units[k]->n_params; i++)
      if (z->units[k]->params[i].param == t) {
        *at = z->units[k]->params[i].at;
        return k;
      }
  return -1;
}

int64_t clpar_zero3_unit_size(ddp_state *st, int k, int64_t *shard) {
  z3_unit *u = ((zero3 *)st->zero3)->units[k];
  *shard = u->shard;
  return u->numel;
}

int clpar_zero3_gathered(ddp_state *st) {
  return st->zero3 && ((zero3 *)st->zero3)->gathered;
}

clpar_status clpar_zero3_materialize(ddp_state *st, const char *fn) {
  zero3 *z = st->zero3;
  clpar_status s = CLPAR_OK;
  for (int k = 0; s == CLPAR_OK && k < z->n_units; k++) {
    clpar_tensor *full = NULL;
    int was = clpar_memory_category_set(CLPAR_MEM_PARAMETERS);
    s = clpar_tensor_zeros(z->dev, 1, &z->units[k]->numel, &full);
    clpar_memory_category_set(was);
    if (s == CLPAR_OK) {
      clpar_tensor_unscope(full);
      point_at(z->units[k], full);
      z->gathered = 1;
    }
    clpar_tensor_release(full);
  }
  if (s != CLPAR_OK) {
    clpar_z3_release_all(z);
    clpar_prefix_error("%s: ", fn);
  }
  return s;
}

clpar_status clpar_zero3_store_shards(ddp_state *st, const char *fn) {
  zero3 *z = st->zero3;
  clpar_status s = CLPAR_OK;
  for (int k = 0; s == CLPAR_OK && k < z->n_units; k++) {
    z3_unit *u = z->units[k];
    float *all = NULL;
    s = clpar_z3_unit_values(u, fn, &all);
    if (s == CLPAR_OK)
      s = clpar_tensor_write(u->pshard, all + z->rank * u->shard, (size_t)u->shard);
    free(all);
    z->epoch++; /* a gather posted before holds other values */
  }
  return s;
}

clpar_status clpar_zero_gather_parameters(clpar_module *ddp) {
  const char *fn = "clpar_zero_gather_parameters";
  ddp_state *st = clpar_ddp_state_of(ddp);
  zero3 *z = st ? st->zero3 : NULL;
  if (!z)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: ddp is not a DistributedDataParallel module made with "
                           "clpar_ddp_options.zero_stage 3",
                           fn);
  clpar_zero3_graph_eager(st); /* after the replays posted before */
  clpar_status s = CLPAR_OK, first = CLPAR_OK;
  char msg[512] = "";
  /* every unit on every rank, so that the collectives stay matched; the first error kept */
  for (int k = 0; first != CLPAR_ERROR_TIMEOUT && k < z->n_units; k++) {
    z3_unit *u = z->units[k];
    clpar_tensor *full = NULL;
    const char *what = "clpar_zero_gather_parameters: all-gather of the parameters";
    s = clpar_z3_gather_full(u, what, &full);
    if (s == CLPAR_OK && k + 1 < z->n_units) clpar_z3_prefetch(z->units[k + 1], what);
    if (s != CLPAR_OK && (first == CLPAR_OK || s == CLPAR_ERROR_TIMEOUT)) {
      first = s;
      snprintf(msg, sizeof msg, "%s", clpar_last_error());
    }
    if (s == CLPAR_OK) point_at(u, full);
    clpar_tensor_release(full);
    z->gathered = 1;
  }
  if (first == CLPAR_OK) return CLPAR_OK;
  clpar_z3_release_all(z); /* all or nothing */
  return clpar_set_error(first, "%s: %s", fn, msg);
}

clpar_status clpar_zero_release_parameters(clpar_module *ddp) {
  ddp_state *st = clpar_ddp_state_of(ddp);
  if (!st || !st->zero3)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_zero_release_parameters: ddp is not a DistributedDataParallel "
                           "module made with clpar_ddp_options.zero_stage 3");
  clpar_z3_release_all(st->zero3);
  return CLPAR_OK;
}

#endif
