/* checkpoint_zero_internal.h — what the sharded checkpoints of ZeRO stages 1 and 2
 * (checkpoint_zero.c) share with those of stage 3 (checkpoint_zero3.c): the optimizer's
 * description every rank writes, its metadata and state entries in the plain optimizer's
 * names, and the checks of a checkpoint's optimizer part. Not installed. */
#ifndef CLPAR_IO_CHECKPOINT_ZERO_INTERNAL_H
#define CLPAR_IO_CHECKPOINT_ZERO_INTERNAL_H

#include "clpar/checkpoint_zero.h"
#include "dist/ddp_internal.h"
#include "internal.h"
#include "io/checkpoint_internal.h"

#define SAVE "clpar_checkpoint_save_sharded_zero"
#define LOAD "clpar_checkpoint_load_sharded_zero"

/* The module's parameters in the plain optimizer's order (clpar_module_parameter_at), each at
 * off[i] in the flat buffer of flat_numel floats. */
typedef struct {
  int n;
  clpar_tensor **p;
  int64_t *off;
  int64_t flat_numel;
} layout;

/* What rank 0's inner optimizer is, which every rank writes (a rank whose shard is all
 * padding has no inner optimizer). */
typedef struct {
  char kind[16];
  clpar_sgd_options sgd;
  clpar_adam_options adam;
  int64_t steps;
  int32_t has[2]; /* state k made (after the first step) */
  int32_t ok;
} zdesc;

typedef struct {
  ddp_state *st;
  const clpar_zero_optimizer *z;
  layout L;
  int rank, world;
  int64_t shard, lo, hi; /* S, and this rank's [lo, hi) */
  int64_t *a, *b;        /* each rank's owned range [a, b) */
  int *owner_of;         /* each parameter's owner */
  zdesc d;
  clpar_tensor *(*state)[2]; /* the owned parameters' state, whole */
  int abandoned;             /* an exchange timed out: its buffers stay allocated */
} zsave;

/* The optimizer's part of a checkpoint for this rank's shard [lo, lo + len), checked whole. */
typedef struct {
  char kind[16];
  clpar_sgd_options sgd;
  clpar_adam_options adam;
  int64_t steps;
  int *idx[2];        /* state k of parameter i: its tensor in the file, or -1 */
  float *buf[2];      /* state k of the shard, read from the file */
  clpar_tensor *t[2]; /* the same on the shard's device */
} zplan;

void clpar_zck_layout_free(layout *L);
void clpar_zck_save_free(zsave *c);
/* The name of state k of optimizer kind ("exp_avg", ...), or NULL. */
const char *clpar_zck_state_name(const char *kind, int k);
/* The part of [x0, x1) in [y0, y1): its start in *at, its length returned (0 when none). */
int clpar_zck_overlap(int64_t x0, int64_t x1, int64_t y0, int64_t y1, int64_t *at);
/* Collective: rank 0 tells every rank the optimizer's kind, options, step count and which
 * state exists (c->d). */
clpar_status clpar_zck_share_desc(zsave *c);
/* The optimizer's metadata and state entries, as clpar_checkpoint_save writes those of the
 * plain optimizer (c->L.n parameters c->L.p; c->state[i][k] where this rank owns parameter i,
 * c->owner_of[i]); *owner: the writing rank of each entry of w (-1: dealt out). */
clpar_status clpar_zck_add_optimizer(zsave *c, clpar_ckpt_set *w, int **owner);
void clpar_zck_plan_free(zplan *q);
/* The kind, the number of parameters, the options and the one step count of f against L and
 * inner (its options set when inner is not NULL). */
clpar_status clpar_zck_check_meta(const clpar_st_file *f, const char *path, const layout *L,
                                  clpar_optimizer *inner, zplan *q);
/* Each state tensor of f: every parameter has it or none does, of the parameter's shape, and
 * no other "optimizer." tensor; q->idx[k][i] its index in f. */
clpar_status clpar_zck_check_state(const clpar_st_file *f, const char *path, const layout *L,
                                   zplan *q);

/* Stage 3 (checkpoint_zero3.c): the save of ddp and opt in dir, and the load from f. */
clpar_status clpar_zck3_save(const char *dir, const clpar_module *ddp,
                             const clpar_zero_optimizer *opt, ddp_state *st, int64_t step,
                             int64_t epoch);
clpar_status clpar_zck3_load(const clpar_st_file *f, const char *path, clpar_module *ddp,
                             clpar_zero_optimizer *opt, ddp_state *st, int64_t *step,
                             int64_t *epoch);

#endif
