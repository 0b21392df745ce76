/* checkpoint_zero.c — sharded checkpoints of a ZeRO optimizer (include/clpar/checkpoint_zero.h)
 * in the files of the plain optimizer. The module's parameters are views of one flat buffer,
 * cut into world shards of S = ceil(numel / world) floats; the ZeRO optimizer of rank r holds
 * the state of [r S, (r + 1) S) as one tensor per kind. Saving, parameter i belongs to the
 * rank whose shard holds its first element, so rank r owns a contiguous range [A_r, B_r) of
 * the flat buffer (the parameters starting in its shard), which may run into the next shards:
 * one MPI_Alltoallv per state kind sends each rank the parts of its range that others hold.
 * The owner makes each of its parameters' state a tensor of the parameter's shape, and the
 * sharded save writes it under the plain optimizer's name. Loading, each rank reads from each
 * state tensor only the elements in its shard. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clpar/checkpoint_zero.h"
#include "internal.h"
#include "io/checkpoint_internal.h"

#define SAVE "clpar_checkpoint_save_sharded_zero"
#define LOAD "clpar_checkpoint_load_sharded_zero"

#ifndef CLPAR_HAVE_MPI

clpar_status clpar_checkpoint_save_sharded_zero(const char *dir, const clpar_module *ddp,
                                                const clpar_zero_optimizer *opt, int64_t step,
                                                int64_t epoch) {
  (void)dir, (void)ddp, (void)opt, (void)step, (void)epoch;
  return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                         SAVE ": clpar was built without MPI (CMake option CLPAR_MPI)");
}
clpar_status clpar_checkpoint_load_sharded_zero(const char *dir, clpar_module *ddp,
                                                clpar_zero_optimizer *opt, int64_t *step,
                                                int64_t *epoch) {
  (void)dir, (void)ddp, (void)opt, (void)step, (void)epoch;
  return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                         LOAD ": clpar was built without MPI (CMake option CLPAR_MPI)");
}

#else

#include "io/checkpoint_zero_internal.h"

void clpar_zck_layout_free(layout *L) {
  free(L->p);
  free(L->off);
}

static clpar_status layout_make(const clpar_module *ddp, const char *fn, layout *L) {
  clpar_module *m = (clpar_module *)ddp;
  L->n = clpar_module_parameter_count(m);
  L->p = calloc((size_t)L->n + 1, sizeof *L->p);
  L->off = calloc((size_t)L->n + 1, sizeof *L->off);
  if (!L->p || !L->off) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of memory", fn);
  clpar_tensor *flat = NULL;
  for (int i = 0; i < L->n; i++) {
    clpar_status s = clpar_module_parameter_at(m, i, NULL, &L->p[i]);
    if (s != CLPAR_OK) return s;
    if (i == 0) flat = L->p[i]->flat;
    if (!flat || L->p[i]->flat != flat || flat->dtype != CLPAR_FLOAT32)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: ddp's parameters are not one float32 flat buffer, as a ZeRO "
                             "module's are",
                             fn);
    L->off[i] = L->p[i]->offset - flat->offset;
  }
  L->flat_numel = flat ? flat->numel : 0;
  return CLPAR_OK;
}

/* ddp's state, when it is a DistributedDataParallel module with ZeRO. */
static clpar_status zero_state(const clpar_module *ddp, const char *fn, ddp_state **st) {
  *st = ddp ? clpar_ddp_state_of(ddp) : NULL;
  if (!*st || (*st)->zero_stage < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: ddp is not a DistributedDataParallel module made with "
                           "clpar_ddp_options.zero_stage 1, 2 or 3",
                           fn);
  return CLPAR_OK;
}

const char *clpar_zck_state_name(const char *kind, int k) {
  if (strcmp(kind, "SGD") == 0) return k == 0 ? "momentum_buffer" : NULL;
  return k == 0 ? "exp_avg" : "exp_avg_sq";
}

/* ---- save ---- */

void clpar_zck_save_free(zsave *c) {
  for (int i = 0; c->state && i < c->L.n; i++) {
    clpar_tensor_free(c->state[i][0]);
    clpar_tensor_free(c->state[i][1]);
  }
  free(c->state);
  free(c->a);
  free(c->b);
  free(c->owner_of);
  clpar_zck_layout_free(&c->L);
}

/* The owners and owned ranges, from the layout alone (the same on every rank). */
static clpar_status plan_owners(zsave *c) {
  c->shard = (c->L.flat_numel + c->world - 1) / c->world;
  c->lo = c->rank * c->shard;
  c->hi = c->lo + c->shard < c->L.flat_numel ? c->lo + c->shard : c->L.flat_numel;
  if (c->hi < c->lo) c->hi = c->lo;
  c->a = calloc((size_t)c->world, sizeof *c->a);
  c->b = calloc((size_t)c->world, sizeof *c->b);
  c->owner_of = calloc((size_t)c->L.n + 1, sizeof *c->owner_of);
  c->state = calloc((size_t)c->L.n + 1, sizeof *c->state);
  if (!c->a || !c->b || !c->owner_of || !c->state)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of host memory");
  for (int q = 0; q < c->world; q++) c->a[q] = INT64_MAX, c->b[q] = 0;
  for (int i = 0; i < c->L.n; i++) {
    int64_t q = c->shard > 0 ? c->L.off[i] / c->shard : 0;
    int r = q < c->world ? (int)q : c->world - 1;
    c->owner_of[i] = r;
    if (c->L.off[i] < c->a[r]) c->a[r] = c->L.off[i];
    if (c->L.off[i] + c->L.p[i]->numel > c->b[r]) c->b[r] = c->L.off[i] + c->L.p[i]->numel;
  }
  for (int q = 0; q < c->world; q++) {
    if (c->a[q] > c->b[q]) c->a[q] = c->b[q] = 0;
    if (c->b[q] - c->a[q] > INT32_MAX)
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                             SAVE ": rank %d's parameters span %lld floats, over MPI's int", q,
                             (long long)(c->b[q] - c->a[q]));
  }
  int64_t lo = 0, len = 0;
  clpar_zero_optimizer_shard(c->z, &lo, &len);
  if (lo != c->lo || len != c->hi - c->lo)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           SAVE
                           ": opt is not the ZeRO optimizer of ddp (its shard is [%lld, "
                           "+%lld), ddp's is [%lld, +%lld))",
                           (long long)lo, (long long)len, (long long)c->lo,
                           (long long)(c->hi - c->lo));
  return CLPAR_OK;
}

/* Rank 0 tells every rank the optimizer's kind, options, step count and which state exists. */
clpar_status clpar_zck_share_desc(zsave *c) {
  clpar_optimizer *inner = clpar_zero_optimizer_inner((clpar_zero_optimizer *)c->z);
  memset(&c->d, 0, sizeof c->d);
  if (c->rank == 0 && inner) {
    snprintf(c->d.kind, sizeof c->d.kind, "%s", clpar_optimizer_kind(inner));
    clpar_optimizer_options(inner, &c->d.sgd, &c->d.adam);
    c->d.steps = clpar_optimizer_steps_at(inner, 0);
    for (int k = 0; k < 2; k++) c->d.has[k] = clpar_optimizer_state_at(inner, 0, k) != NULL;
    c->d.ok = 1;
  }
  clpar_status s = clpar_dist_bcast(&c->d, (int)sizeof c->d, MPI_BYTE, 0, c->st->comm,
                                    SAVE ": broadcasting rank 0's optimizer options", ++c->st->seq);
  if (s == CLPAR_OK && !c->d.ok)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, SAVE ": rank 0's shard is empty");
  if (s == CLPAR_ERROR_TIMEOUT) c->abandoned = c->st->abandoned = 1;
  return s;
}

/* The part of [x0, x1) in [y0, y1): its start in *at, its length returned (0 when none). */
int clpar_zck_overlap(int64_t x0, int64_t x1, int64_t y0, int64_t y1, int64_t *at) {
  int64_t a = x0 > y0 ? x0 : y0, b = x1 < y1 ? x1 : y1;
  *at = a;
  return b > a ? (int)(b - a) : 0;
}

/* State k of this rank's owned range into out (b - a floats), from every rank's shard. */
static clpar_status exchange(zsave *c, int k, float *out) {
  int w = c->world, *cnt = calloc((size_t)w * 4, sizeof *cnt);
  float *send = calloc((size_t)(c->hi - c->lo) + 1, sizeof *send);
  clpar_status s =
      cnt && send ? CLPAR_OK : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of memory");
  clpar_optimizer *inner = clpar_zero_optimizer_inner((clpar_zero_optimizer *)c->z);
  clpar_tensor *t = inner ? clpar_optimizer_state_at(inner, 0, k) : NULL;
  if (s == CLPAR_OK && c->hi > c->lo && !t)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        SAVE ": this rank's optimizer has no state %d where rank 0's has", k);
  if (s == CLPAR_OK && t) s = clpar_tensor_read(t, send, (size_t)(c->hi - c->lo));
  if (!cnt || !send) {
    free(cnt);
    free(send);
    return s;
  }
  const char *what = SAVE ": gathering each parameter's optimizer state";
  clpar_status mpi = clpar_dist_debug_check(c->st->comm, what, c->st->seq + 1, c->L.flat_numel * 4);
  for (int q = 0; q < w; q++) {
    int64_t at;
    cnt[q] = clpar_zck_overlap(c->lo, c->hi, c->a[q], c->b[q], &at);
    cnt[w + q] = cnt[q] ? (int)(at - c->lo) : 0;
    int64_t qlo = q * c->shard, qhi = qlo + c->shard;
    if (qhi > c->L.flat_numel) qhi = c->L.flat_numel;
    cnt[2 * w + q] = clpar_zck_overlap(qlo, qhi, c->a[c->rank], c->b[c->rank], &at);
    cnt[3 * w + q] = cnt[2 * w + q] ? (int)(at - c->a[c->rank]) : 0;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  if (mpi == CLPAR_OK) {
    clpar_mpi_lock();
    int rc = MPI_Ialltoallv(send, cnt, cnt + w, MPI_FLOAT, out, cnt + 2 * w, cnt + 3 * w, MPI_FLOAT,
                            c->st->comm, &req);
    clpar_mpi_unlock();
    mpi = rc == MPI_SUCCESS ? clpar_dist_wait(&req, what, ++c->st->seq) : clpar_mpi_error(rc, what);
  }
  if (mpi == CLPAR_ERROR_TIMEOUT) {
    c->abandoned = c->st->abandoned = 1; /* MPI may still read send and write out */
    return mpi;
  }
  free(cnt);
  free(send);
  return mpi != CLPAR_OK ? mpi : s;
}

/* The state of the parameters this rank owns, whole, on their devices: one exchange per kind
 * that exists. Every rank takes part in each exchange, whatever failed before (mine). */
static clpar_status gather_state(zsave *c, clpar_status mine) {
  int64_t n = c->b[c->rank] - c->a[c->rank];
  float *own = calloc((size_t)n + 1, sizeof *own);
  if (!own) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of host memory");
  for (int k = 0; k < 2 && !c->abandoned; k++) {
    if (!c->d.has[k]) continue;
    clpar_status s = exchange(c, k, own);
    if (s == CLPAR_ERROR_TIMEOUT) return s; /* own stays allocated: MPI may still write it */
    if (mine == CLPAR_OK) mine = s;
    for (int i = 0; mine == CLPAR_OK && i < c->L.n; i++) {
      clpar_tensor *p = c->L.p[i];
      if (c->owner_of[i] != c->rank) continue;
      int64_t shape[CLPAR_MAX_DIMS];
      for (int d = 0; d < clpar_tensor_ndim(p); d++) shape[d] = clpar_tensor_dim(p, d);
      mine = clpar_tensor_from_host(clpar_tensor_device(p), clpar_tensor_ndim(p), shape,
                                    own + (c->L.off[i] - c->a[c->rank]), &c->state[i][k]);
      if (mine == CLPAR_OK) clpar_tensor_unscope(c->state[i][k]);
    }
  }
  free(own);
  return mine;
}

/* The optimizer's metadata and state entries, as clpar_checkpoint_save writes those of the
 * plain optimizer; owner[j] for each state entry j. A parameter another rank owns stands in
 * for its state (the same shape and dtype), which only its owner writes. */
clpar_status clpar_zck_add_optimizer(zsave *c, clpar_ckpt_set *w, int **owner) {
  char key[96], v[64];
  const clpar_sgd_options *o = &c->d.sgd;
  const clpar_adam_options *a = &c->d.adam;
  int sgd = strcmp(c->d.kind, "SGD") == 0;
  const char *keys[] = {"optimizer.lr", sgd ? "optimizer.momentum" : "optimizer.beta1",
                        sgd ? "optimizer.dampening" : "optimizer.beta2",
                        sgd ? "optimizer.weight_decay" : "optimizer.eps",
                        sgd ? "optimizer.nesterov" : "optimizer.weight_decay"};
  double vals[] = {sgd ? o->lr : a->lr, sgd ? o->momentum : a->beta1, sgd ? o->dampening : a->beta2,
                   sgd ? o->weight_decay : a->eps, sgd ? o->nesterov : a->weight_decay};
  clpar_status s = clpar_ckpt_meta_add(w, "optimizer.kind", c->d.kind);
  snprintf(v, sizeof v, "%d", c->L.n);
  if (s == CLPAR_OK) s = clpar_ckpt_meta_add(w, "optimizer.params", v);
  if (s == CLPAR_OK) s = clpar_ckpt_meta_add(w, "optimizer.groups", "1"); /* one group */
  for (int k = 0; s == CLPAR_OK && k < 5; k++) {
    snprintf(v, sizeof v, sgd && k == 4 ? "%.0f" : "%.9g", vals[k]);
    s = clpar_ckpt_meta_add(w, keys[k], v);
  }
  snprintf(v, sizeof v, "%d", c->L.n);
  if (s == CLPAR_OK) s = clpar_ckpt_meta_add(w, "optimizer.group.0.params", v);
  int first = w->n;
  int *own = calloc((size_t)w->n + 2 * (size_t)c->L.n + 1, sizeof *own);
  if (s == CLPAR_OK && !own) s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of memory");
  for (int j = 0; own && j < first; j++) own[j] = -1;
  for (int i = 0; s == CLPAR_OK && i < c->L.n; i++) {
    snprintf(key, sizeof key, "optimizer.state.%d.step", i);
    snprintf(v, sizeof v, "%lld", (long long)c->d.steps);
    s = clpar_ckpt_meta_add(w, key, v);
    for (int k = 0; s == CLPAR_OK && k < 2; k++) {
      if (!c->d.has[k] || !clpar_zck_state_name(c->d.kind, k)) continue;
      const clpar_tensor *t = c->state[i][k] ? c->state[i][k] : c->L.p[i];
      snprintf(key, sizeof key, "optimizer.state.%d.%s", i, clpar_zck_state_name(c->d.kind, k));
      own[w->n] = c->owner_of[i];
      s = clpar_ckpt_add(w, key, t);
    }
  }
  *owner = own;
  return s;
}

clpar_status clpar_checkpoint_save_sharded_zero(const char *dir, const clpar_module *ddp,
                                                const clpar_zero_optimizer *opt, int64_t step,
                                                int64_t epoch) {
  if (!dir || !*dir || !ddp || !opt)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           SAVE ": NULL or empty dir, or NULL module or optimizer");
  if (strlen(dir) + sizeof "/" INDEX_NAME > 4096)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, SAVE ": dir is too long");
  zsave c = {.z = opt, .rank = clpar_dist_rank()};
  clpar_status s = zero_state(ddp, SAVE, &c.st);
  if (s != CLPAR_OK) return s;
  if (c.st->zero_stage == 3) return clpar_zck3_save(dir, ddp, opt, c.st, step, epoch);
  c.world = c.st->world;
  clpar_status mine = layout_make(ddp, SAVE, &c.L);
  if (mine == CLPAR_OK) mine = plan_owners(&c);
  /* a fault here is the same on every rank (the same module), but for running out of memory
   * or a mismatched opt, which leave the other ranks to their deadline */
  if (mine != CLPAR_OK) {
    clpar_zck_save_free(&c);
    return mine;
  }
  s = clpar_zck_share_desc(&c);
  if (s == CLPAR_OK) s = gather_state(&c, mine);
  if (s == CLPAR_ERROR_TIMEOUT || c.abandoned) {
    clpar_zck_save_free(&c);
    return s;
  }
  clpar_ckpt_set w = {0};
  int *owner = NULL;
  mine = s;
  if (mine == CLPAR_OK) mine = clpar_ckpt_collect(&w, ddp, NULL, step, epoch);
  if (mine == CLPAR_OK) mine = clpar_zck_add_optimizer(&c, &w, &owner);
  if (!owner) owner = calloc((size_t)w.n + 1, sizeof *owner);
  if (!owner && mine == CLPAR_OK)
    mine = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, SAVE ": out of host memory");
  s = clpar_ckpt_save_sharded_set(dir, &w, owner, mine);
  free(owner);
  clpar_ckpt_set_free(&w);
  clpar_zck_save_free(&c);
  return s;
}

/* ---- load ---- */

void clpar_zck_plan_free(zplan *q) {
  for (int k = 0; k < 2; k++) {
    free(q->idx[k]);
    free(q->buf[k]);
    clpar_tensor_free(q->t[k]);
  }
}

/* The kind, the number of parameters, the options and the one step count. */
clpar_status clpar_zck_check_meta(const clpar_st_file *f, const char *path, const layout *L,
                                  clpar_optimizer *inner, zplan *q) {
  size_t len = 0;
  const char *kind = clpar_st_meta_len(f, "optimizer.kind", &len);
  char esc[CLPAR_ESC_SIZE];
  if (!kind)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s holds no optimizer state", path);
  if (strlen(kind) != len || (strcmp(kind, "SGD") && strcmp(kind, "Adam") && strcmp(kind, "AdamW")))
    return clpar_set_error(CLPAR_ERROR_CORRUPT,
                           "%s: metadata \"optimizer.kind\" is \"%s\", not "
                           "SGD, Adam or AdamW",
                           path, clpar_escape(kind, len, esc, sizeof esc));
  if (inner && strcmp(kind, clpar_optimizer_kind(inner)) != 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s holds the state of %s, not of %s",
                           path, kind, clpar_optimizer_kind(inner));
  snprintf(q->kind, sizeof q->kind, "%s", kind);
  int64_t n = 0;
  clpar_status s = clpar_ckpt_meta_i64(f, path, "optimizer.params", 0, &n);
  if (s == CLPAR_OK && n != L->n)
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        "%s holds an optimizer of %lld parameters; this one has %d", path,
                        (long long)n, L->n);
  if (s == CLPAR_OK) s = clpar_ckpt_read_options(f, path, kind, &q->sgd, &q->adam);
  if (s == CLPAR_OK && inner) s = clpar_optimizer_set_options(inner, &q->sgd, &q->adam, 0);
  for (int i = 0; s == CLPAR_OK && i < L->n; i++) {
    char key[96];
    int64_t steps = 0;
    snprintf(key, sizeof key, "optimizer.state.%d.step", i);
    s = clpar_ckpt_meta_i64(f, path, key, 0, &steps);
    if (i == 0) q->steps = steps;
    if (s == CLPAR_OK && steps != q->steps)
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                          "%s: parameter %d took %lld steps and parameter 0 %lld; a ZeRO "
                          "optimizer steps every parameter together",
                          path, i, (long long)steps, (long long)q->steps);
  }
  return s;
}

/* Tensor j of f against parameter p: F32 and p's shape. */
static int same_shape(const clpar_st_tensor *e, const clpar_tensor *p) {
  if (e->dtype != CLPAR_ST_F32 || e->ndim != clpar_tensor_ndim(p)) return 0;
  for (int d = 0; d < e->ndim; d++)
    if (e->shape[d] != (uint64_t)clpar_tensor_dim(p, d)) return 0;
  return 1;
}

/* Each state tensor of the file: every parameter has it or none does, of the parameter's
 * shape, and no other "optimizer." tensor. */
clpar_status clpar_zck_check_state(const clpar_st_file *f, const char *path, const layout *L,
                                   zplan *q) {
  int found = 0;
  char esc[CLPAR_ESC_SIZE];
  for (int k = 0; k < 2 && clpar_zck_state_name(q->kind, k); k++) {
    if (!(q->idx[k] = malloc(((size_t)L->n + 1) * sizeof(int))))
      return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
    for (int i = 0; i < L->n; i++) {
      char key[96];
      snprintf(key, sizeof key, "optimizer.state.%d.%s", i, clpar_zck_state_name(q->kind, k));
      int j = q->idx[k][i] = clpar_st_find(f, key);
      found += j >= 0;
      if ((j >= 0) != (q->idx[k][0] >= 0))
        return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                               "%s: \"%s\" is %s but parameter 0's is %s; a ZeRO optimizer "
                               "makes every parameter's state together",
                               path, key, j >= 0 ? "there" : "missing",
                               j >= 0 ? "missing" : "there");
      if (j >= 0 && !same_shape(&f->tensors[j], L->p[i]))
        return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                               "%s: \"%s\" is not F32 of its parameter's shape (nothing was "
                               "loaded)",
                               path, key);
    }
  }
  for (int j = 0; j < f->n; j++) found -= strncmp(f->tensors[j].name, "optimizer.", 10) == 0;
  for (int j = 0; found != 0 && j < f->n; j++) {
    const char *name = f->tensors[j].name;
    int known = 0;
    for (int k = 0; k < 2 && q->idx[k]; k++)
      for (int i = 0; i < L->n && !known; i++) known = q->idx[k][i] == j;
    if (strncmp(name, "optimizer.", 10) == 0 && !known)
      return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                             "%s: the optimizer's state does not match (nothing was loaded): "
                             "%s (unexpected)",
                             path, CLPAR_ESC(name, esc));
  }
  return CLPAR_OK;
}

/* State k of the shard [lo, lo + len) from the file: the parts of the parameters in it,
 * zeros where no parameter is; then a tensor on dev. */
static clpar_status read_shard(const clpar_st_file *f, const layout *L, int64_t lo, int64_t len,
                               clpar_device *dev, zplan *q, int k) {
  float *b = q->buf[k] = calloc((size_t)len + 1, sizeof *b);
  if (!b) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, LOAD ": out of host memory");
  for (int i = 0; i < L->n; i++) {
    int64_t at;
    int n = clpar_zck_overlap(lo, lo + len, L->off[i], L->off[i] + L->p[i]->numel, &at);
    if (n == 0) continue;
    clpar_status s = clpar_st_tensor_read_part(f, q->idx[k][i], (uint64_t)(at - L->off[i]) * 4,
                                               b + (at - lo), (size_t)n * 4);
    if (s != CLPAR_OK) return s;
  }
  clpar_status s = clpar_tensor_from_host(dev, 1, &len, b, &q->t[k]);
  if (s == CLPAR_OK) clpar_tensor_unscope(q->t[k]);
  return s;
}

static clpar_status load_from(const clpar_st_file *f, const char *path, clpar_module *ddp,
                              clpar_zero_optimizer *z, int64_t *step, int64_t *epoch) {
  ddp_state *st = clpar_ddp_state_of(ddp);
  if (st->zero_stage == 3) return clpar_zck3_load(f, path, ddp, z, st, step, epoch);
  layout L = {0};
  zplan q = {0};
  clpar_optimizer *inner = clpar_zero_optimizer_inner(z);
  int64_t lo = 0, len = 0;
  clpar_zero_optimizer_shard(z, &lo, &len);
  clpar_status s = layout_make(ddp, LOAD, &L);
  if (s == CLPAR_OK && lo + len > L.flat_numel)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        LOAD ": opt is not the ZeRO optimizer of ddp");
  if (s == CLPAR_OK) s = clpar_zck_check_meta(f, path, &L, inner, &q);
  if (s == CLPAR_OK) s = clpar_zck_check_state(f, path, &L, &q);
  for (int k = 0; s == CLPAR_OK && inner && k < 2; k++)
    if (q.idx[k] && q.idx[k][0] >= 0)
      s = read_shard(f, &L, lo, len, clpar_tensor_device(clpar_optimizer_param_at(inner, 0)), &q,
                     k);
  /* the model, the counters and the generator, every checksum checked first */
  if (s == CLPAR_OK) s = clpar_ckpt_load_file(f, path, ddp, NULL, step, epoch);
  if (s == CLPAR_OK && inner) {
    s = clpar_optimizer_set_options(inner, &q.sgd, &q.adam, 1);
    if (s == CLPAR_OK) clpar_optimizer_restore(inner, 0, q.t[0], q.t[1], q.steps);
    if (s == CLPAR_OK) q.t[0] = q.t[1] = NULL;
  }
  clpar_zck_plan_free(&q);
  clpar_zck_layout_free(&L);
  return s;
}

clpar_status clpar_checkpoint_load_sharded_zero(const char *dir, clpar_module *ddp,
                                                clpar_zero_optimizer *opt, int64_t *step,
                                                int64_t *epoch) {
  if (!dir || !*dir || !ddp || !opt)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           LOAD ": NULL or empty dir, or NULL module or optimizer");
  ddp_state *st;
  clpar_status s = zero_state(ddp, LOAD, &st);
  if (s != CLPAR_OK) return s;
  struct stat sb;
  if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) { /* one training checkpoint file */
    clpar_st_file f;
    s = clpar_st_read(dir, &f);
    if (s != CLPAR_OK) return s;
    s = load_from(&f, dir, ddp, opt, step, epoch);
    clpar_st_free(&f);
    return s;
  }
  clpar_ckpt_sharded *h;
  const clpar_st_file *f;
  s = clpar_ckpt_open_sharded(dir, &h, &f);
  if (s == CLPAR_OK) s = load_from(f, dir, ddp, opt, step, epoch);
  clpar_ckpt_close_sharded(h);
  return s;
}

#endif
