/* zero_internal.h — what zero.c (the sharded optimizer of ZeRO stages 1 and 2) and
 * zero_graph.c (its step inside a captured step) share: the optimizer's state. */
#ifndef CLPAR_ZERO_INTERNAL_H
#define CLPAR_ZERO_INTERNAL_H

#include "clpar/zero.h"
#include "dist/ddp_internal.h"

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
  float *host;   /* world * shard floats: the gathered parameters */
  float *mine;   /* shard floats: this rank's parameters */
  int abandoned; /* a collective timed out: MPI may still write host and mine */
};

/* Every rank's shard of the parameters (mine) into host, with the job's deadline (collective on
 * the module's communicator). */
clpar_status clpar_zero_all_gather(clpar_zero_optimizer *z, const char *what);
/* Stage 1: the shard's gradient gshard, the view of the flat gradient there is now (which the
 * inner optimizer finds as the shard's grad). */
clpar_status clpar_zero_bind_grad_shard(clpar_zero_optimizer *z);

/* ---- inside a captured step (zero_graph.c) ---- */

/* 1 when z's device is capturing (stages 1 and 2). */
int clpar_zero_graph_capturing(const clpar_zero_optimizer *z);
/* The step's commands (after the captured backward's gate): the averaged shard written into
 * gshard, the inner optimizer's step, the shard read into mine, a host call and a gate (the
 * thread all-gathered), the parameters written back. */
clpar_status clpar_zero_graph_step(clpar_zero_optimizer *z);
/* zero_grad as the eager one where it is device work; refused where it forgets the averaged
 * shard on the host. */
clpar_status clpar_zero_graph_zero_grad(clpar_zero_optimizer *z);
/* An eager step or zero_grad (after a capture): waits until the device ran the replays posted
 * before it (their thread work reads and writes the host shard), and what captured backwards
 * reduced there is spent. */
void clpar_zero_graph_eager(clpar_zero_optimizer *z);
/* Before z is freed: every graph goes stale, the replays in flight run, z's records go. */
void clpar_zero_graph_forget(clpar_zero_optimizer *z);

#endif
