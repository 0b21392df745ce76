/* checkpoint_zero3.c — sharded checkpoints of ZeRO stage 3 (checkpoint_zero.h) in the files
 * of the plain optimizer, as those of stages 1 and 2 (checkpoint_zero.c).
 *
 * Each unit's parameters are one flat vector cut into world shards; rank r holds shard r of
 * each, and the inner optimizer's state of unit k is one tensor of that shard. Saving, the
 * parameters are all-gathered (clpar_zero_gather_parameters) and written as the model's
 * tensors, dealt out by size as clpar_checkpoint_save_sharded deals them; each state kind of
 * each unit is all-gathered (MPI_Allgather, with the job's deadline), and parameter i's state,
 * of its shape, is written by rank i mod world. Loading (each rank alone, at any world size):
 * every parameter gets its shape over zeros, the model loads into them as into a plain
 * module, each unit's shard is taken from them, and each state tensor is read from the file
 * for the rank's shard only; the parameters then give their memory back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef CLPAR_HAVE_MPI

#include "io/checkpoint_zero_internal.h"

/* The module's parameters in the plain optimizer's order, each with its unit and its first
 * float in the unit's flat vector. */
typedef struct {
  int *unit;
  int64_t *at;
} z3map;

static void map_free(z3map *m) {
  free(m->unit);
  free(m->at);
}

static clpar_status map_make(const clpar_module *ddp, ddp_state *st, const char *fn, layout *L,
                             z3map *m) {
  clpar_module *mod = (clpar_module *)ddp;
  L->n = clpar_module_parameter_count(mod);
  L->p = calloc((size_t)L->n + 1, sizeof *L->p);
  L->off = calloc((size_t)L->n + 1, sizeof *L->off);
  m->unit = calloc((size_t)L->n + 1, sizeof *m->unit);
  m->at = calloc((size_t)L->n + 1, sizeof *m->at);
  if (!L->p || !L->off || !m->unit || !m->at)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  for (int i = 0; i < L->n; i++) {
    clpar_status s = clpar_module_parameter_at(mod, i, NULL, &L->p[i]);
    if (s != CLPAR_OK) return s;
    m->unit[i] = clpar_zero3_locate(st, L->p[i], &m->at[i]);
    if (m->unit[i] < 0)
      return clpar_set_error(CLPAR_ERROR_INTERNAL, "%s: parameter %d belongs to no unit", fn, i);
  }
  return CLPAR_OK;
}

/* Whether opt's shard is as long as ddp's units' shards together (a stage-3 optimizer of
 * another module holds other units). */
static int shards_match(ddp_state *st, const clpar_zero_optimizer *opt) {
  int64_t lo = 0, len = 0, total = 0, shard = 0;
  for (int k = 0; k < clpar_zero3_shards(st, NULL); k++) {
    clpar_zero3_unit_size(st, k, &shard);
    total += shard;
  }
  clpar_zero_optimizer_shard(opt, &lo, &len);
  return len == total && clpar_zero_optimizer_inner((clpar_zero_optimizer *)opt) != NULL;
}

/* ---- save ---- */

/* State `kind` of unit k from every rank's shard into host memory all (world shards). A rank
 * without it takes part with zeros. */
static clpar_status gather_unit(zsave *c, int k, int kind, int64_t shard, float *all) {
  float *mine = calloc((size_t)shard + 1, sizeof *mine);
  if (!mine) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of host memory");
  clpar_optimizer *inner = clpar_zero_optimizer_inner((clpar_zero_optimizer *)c->z);
  clpar_tensor *t = inner ? clpar_optimizer_state_at(inner, k, kind) : NULL;
  clpar_status s = t ? clpar_tensor_read(t, mine, (size_t)shard)
                     : clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                                       SAVE
                                       ": this rank's optimizer has no state %d of unit %d "
                                       "where rank 0's has",
                                       kind, k);
  if (s != CLPAR_OK) memset(mine, 0, (size_t)shard * sizeof *mine);
  const char *what = SAVE ": gathering a unit's optimizer state";
  clpar_status mpi = clpar_dist_debug_check(c->st->comm, what, c->st->seq + 1, shard * 4);
  if (mpi == CLPAR_OK) {
    MPI_Request req = MPI_REQUEST_NULL;
    clpar_mpi_lock();
    int rc =
        MPI_Iallgather(mine, (int)shard, MPI_FLOAT, all, (int)shard, MPI_FLOAT, c->st->comm, &req);
    clpar_mpi_unlock();
    mpi = rc == MPI_SUCCESS ? clpar_dist_wait(&req, what, ++c->st->seq) : clpar_mpi_error(rc, what);
  }
  if (mpi == CLPAR_ERROR_TIMEOUT) {
    c->abandoned = c->st->abandoned = 1; /* MPI may still read mine: left allocated */
    return mpi;
  }
  free(mine);
  return mpi != CLPAR_OK ? mpi : s;
}

/* The state of the parameters this rank writes (i mod world), whole, on their devices. Every
 * rank takes part in each gather, whatever failed before (mine). */
static clpar_status gather_state3(zsave *c, const z3map *m, int n_units, clpar_status mine) {
  for (int k = 0; k < n_units && !c->abandoned; k++) {
    int64_t shard = 0;
    clpar_zero3_unit_size(c->st, k, &shard);
    float *all = calloc((size_t)(shard * c->world) + 1, sizeof *all);
    if (!all) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of host memory");
    for (int kind = 0; kind < 2 && !c->abandoned; kind++) {
      if (!c->d.has[kind]) continue;
      clpar_status s = gather_unit(c, k, kind, shard, all);
      if (s == CLPAR_ERROR_TIMEOUT) return s; /* all stays allocated: MPI may still write it */
      if (mine == CLPAR_OK) mine = s;
      for (int i = 0; mine == CLPAR_OK && i < c->L.n; i++) {
        clpar_tensor *p = c->L.p[i];
        if (m->unit[i] != k || c->owner_of[i] != c->rank) continue;
        int64_t shape[CLPAR_MAX_DIMS];
        for (int d = 0; d < clpar_tensor_ndim(p); d++) shape[d] = clpar_tensor_dim(p, d);
        mine = clpar_tensor_from_host(clpar_tensor_device(p), clpar_tensor_ndim(p), shape,
                                      all + m->at[i], &c->state[i][kind]);
        if (mine == CLPAR_OK) clpar_tensor_unscope(c->state[i][kind]);
      }
    }
    free(all);
  }
  return mine;
}

/* Parameter i's state is written by rank i mod world. */
static clpar_status plan3(zsave *c) {
  c->owner_of = calloc((size_t)c->L.n + 1, sizeof *c->owner_of);
  c->state = calloc((size_t)c->L.n + 1, sizeof *c->state);
  if (!c->owner_of || !c->state)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of host memory");
  for (int i = 0; i < c->L.n; i++) c->owner_of[i] = i % c->world;
  return CLPAR_OK;
}

/* The files, once the parameters hold their values and the state is gathered. */
static clpar_status write3(const char *dir, const clpar_module *ddp, zsave *c, clpar_status mine,
                           int64_t step, int64_t epoch) {
  clpar_ckpt_set w = {0};
  int *owner = NULL;
  if (mine == CLPAR_OK) mine = clpar_ckpt_collect(&w, ddp, NULL, step, epoch);
  if (mine == CLPAR_OK) mine = clpar_zck_add_optimizer(c, &w, &owner);
  if (!owner) owner = calloc((size_t)w.n + 1, sizeof *owner);
  if (!owner && mine == CLPAR_OK)
    mine = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of host memory");
  clpar_status s = clpar_ckpt_save_sharded_set(dir, &w, owner, mine);
  free(owner);
  clpar_ckpt_set_free(&w);
  return s;
}

clpar_status clpar_zck3_save(const char *dir, const clpar_module *ddp,
                             const clpar_zero_optimizer *opt, ddp_state *st, int64_t step,
                             int64_t epoch) {
  zsave c = {.z = opt, .st = st, .rank = clpar_dist_rank(), .world = st->world};
  z3map m = {0};
  int gathered = clpar_zero3_gathered(st);
  int n_units = clpar_zero3_shards(st, NULL);
  clpar_status mine = shards_match(st, opt) ? CLPAR_OK
                                            : clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, SAVE
                                                              ": opt is not the ZeRO "
                                                              "optimizer of ddp");
  /* collective; every rank alike, so that none goes on to collectives the others skip */
  clpar_status s = clpar_zero_gather_parameters((clpar_module *)ddp);
  if (mine == CLPAR_OK) mine = s;
  if (mine == CLPAR_OK) mine = map_make(ddp, st, SAVE, &c.L, &m);
  if (mine == CLPAR_OK) mine = plan3(&c);
  if (s != CLPAR_ERROR_TIMEOUT) s = clpar_ddp_agree(st, mine, SAVE);
  if (s == CLPAR_OK) s = clpar_zck_share_desc(&c);
  if (s == CLPAR_OK) s = gather_state3(&c, &m, n_units, CLPAR_OK);
  if (s != CLPAR_ERROR_TIMEOUT && !c.abandoned) s = write3(dir, ddp, &c, s, step, epoch);
  if (!gathered) clpar_zero3_release(st);
  map_free(&m);
  clpar_zck_save_free(&c);
  return s;
}

/* ---- load ---- */

/* State `kind` of unit k, this rank's shard, from f into a new tensor on dev (zeros where no
 * parameter is: the padding). */
static clpar_status read_unit(const clpar_st_file *f, const layout *L, const z3map *m,
                              const zplan *q, ddp_state *st, int k, int kind, clpar_device *dev,
                              clpar_tensor **out) {
  int64_t shard = 0;
  clpar_zero3_unit_size(st, k, &shard);
  int64_t lo = clpar_dist_rank() * shard;
  float *b = calloc((size_t)shard + 1, sizeof *b);
  if (!b) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, LOAD ": out of host memory");
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < L->n; i++) {
    int64_t at;
    int n = m->unit[i] != k ? 0
                            : clpar_zck_overlap(lo, lo + shard, m->at[i],
                                                m->at[i] + clpar_tensor_numel(L->p[i]), &at);
    if (n > 0)
      s = clpar_st_tensor_read_part(f, q->idx[kind][i], (uint64_t)(at - m->at[i]) * 4,
                                    b + (at - lo), (size_t)n * 4);
  }
  if (s == CLPAR_OK) s = clpar_tensor_from_host(dev, 1, &shard, b, out);
  if (s == CLPAR_OK) clpar_tensor_unscope(*out);
  free(b);
  return s;
}

/* Every unit's shard of each state the file holds, into t[2 k + kind]. */
static clpar_status read_state3(const clpar_st_file *f, const layout *L, const z3map *m,
                                const zplan *q, ddp_state *st, clpar_optimizer *inner,
                                clpar_tensor **t) {
  clpar_status s = CLPAR_OK;
  int n_units = clpar_zero3_shards(st, NULL);
  for (int k = 0; s == CLPAR_OK && k < n_units; k++)
    for (int kind = 0; s == CLPAR_OK && kind < 2; kind++)
      if (q->idx[kind] && q->idx[kind][0] >= 0)
        s = read_unit(f, L, m, q, st, k, kind,
                      clpar_tensor_device(clpar_optimizer_param_at(inner, k)), &t[2 * k + kind]);
  return s;
}

clpar_status clpar_zck3_load(const clpar_st_file *f, const char *path, clpar_module *ddp,
                             clpar_zero_optimizer *z, ddp_state *st, int64_t *step,
                             int64_t *epoch) {
  layout L = {0};
  z3map m = {0};
  zplan q = {0};
  int n_units = clpar_zero3_shards(st, NULL), gathered = clpar_zero3_gathered(st);
  clpar_optimizer *inner = clpar_zero_optimizer_inner(z);
  clpar_tensor **t = calloc(2 * (size_t)n_units + 1, sizeof *t);
  clpar_status s = t && inner ? CLPAR_OK
                   : t        ? clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                                                LOAD ": opt has no shard (not ddp's optimizer?)")
                              : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, LOAD ": out of memory");
  if (s == CLPAR_OK && !shards_match(st, z))
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        LOAD ": opt is not the ZeRO optimizer of ddp");
  /* the parameters' shapes, to check the file's model against them and load it into them */
  if (s == CLPAR_OK) s = clpar_zero3_materialize(st, LOAD);
  if (s == CLPAR_OK) s = map_make(ddp, st, LOAD, &L, &m);
  if (s == CLPAR_OK) s = clpar_zck_check_meta(f, path, &L, inner, &q);
  if (s == CLPAR_OK) s = clpar_zck_check_state(f, path, &L, &q);
  if (s == CLPAR_OK) s = read_state3(f, &L, &m, &q, st, inner, t);
  if (s == CLPAR_OK) s = clpar_ckpt_load_file(f, path, ddp, NULL, step, epoch);
  if (s == CLPAR_OK) s = clpar_zero3_store_shards(st, LOAD);
  if (s == CLPAR_OK) s = clpar_optimizer_set_options(inner, &q.sgd, &q.adam, 1);
  for (int k = 0; s == CLPAR_OK && k < n_units; k++) {
    clpar_optimizer_restore(inner, k, t[2 * k], t[2 * k + 1], q.steps);
    t[2 * k] = t[2 * k + 1] = NULL;
  }
  if (!gathered) clpar_zero3_release(st);
  for (int k = 0; t && k < 2 * n_units; k++) clpar_tensor_free(t[k]);
  free(t);
  clpar_zck_plan_free(&q);
  map_free(&m);
  clpar_zck_layout_free(&L);
  return s;
}

#endif
