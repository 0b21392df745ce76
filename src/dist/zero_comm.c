/* zero_comm.c — the gradient reduction of ZeRO stages 1 and 2 (zero.h) on
 * DistributedDataParallel's buckets and communication thread (ddp_comm.c), overlapped with
 * backward as plain DDP's all-reduce is.
 *
 * The module's parameters are one flat buffer of numel floats, cut into world shards of
 * S = ceil(numel / world) floats; rank r's is [r S, (r + 1) S). A bucket (ddp_buckets.c: the
 * parameters in reverse order) covers one range [flat_lo, flat_lo + b->numel) of the flat
 * buffer, and its host memory is laid out as that range (elements no parameter covers are
 * zeros). When a bucket's gradients are final, the backward thread posts their reads into that
 * memory on the device's queue (stage 1: one read of the flat gradient's range; stage 2: each
 * parameter's gradient as its hook fires, which is then freed, so the device never holds more
 * than the gradients backward is making), and hands the bucket to the communication thread,
 * which waits for the reads and reduce-scatters the range (zero_scatter.c: rank r receives the
 * part of the range in its shard, summed over the ranks in rank order), polled against the
 * job's deadline. The part, divided by world, goes into the rank's averaged shard acc on the
 * host: stage 1 replaces (the flat gradient keeps accumulating on the device, so each backward
 * reduces everything since the last zero_grad), stage 2 adds (its gradients leave the device
 * in each backward). The optimizer's step (zero.c) writes acc into the shard's gradient. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef CLPAR_HAVE_MPI

#include "dist/ddp_internal.h"

typedef struct {
  int64_t numel, shard; /* the flat buffer's floats, and S */
  int world, rank;
  float *acc;        /* S floats: this rank's shard of the averaged gradient */
  float *part;       /* the largest part of a bucket in this rank's shard */
  float *scratch;    /* 2 parts: the blocks being received (zero_scatter.c) */
  MPI_Request *reqs; /* world + 1: the reduce-scatter's messages */
  int *counts;       /* world: each rank's part of the bucket being reduced */
  int have;          /* a backward reduced into acc since the last reset */
  int written;       /* a bucket wrote into acc since it was last filled with zeros */
} zero_red;

/* Each bucket's range of the flat buffer; each parameter's place in its bucket's memory. */
static clpar_status lay_out(ddp_state *st, const clpar_tensor *flat, int64_t *max_part,
                            const zero_red *z) {
  *max_part = 0;
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = b->first; i < b->first + b->count; i++) {
      int64_t at = (int64_t)(st->params[i].param->offset - flat->offset);
      if (at < lo) lo = at;
      if (at + st->params[i].numel > hi) hi = at + st->params[i].numel;
    }
    if (hi - lo > INT32_MAX)
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                             "clpar_ddp_create: a bucket spans %lld floats, over MPI's int; lower "
                             "bucket_cap_mb",
                             (long long)(hi - lo));
    b->flat_lo = lo;
    b->numel = hi - lo;
    for (int i = b->first; i < b->first + b->count; i++)
      st->params[i].offset = (int64_t)(st->params[i].param->offset - flat->offset) - lo;
    int64_t mine_lo = lo > z->rank * z->shard ? lo : z->rank * z->shard;
    int64_t mine_hi = hi < (z->rank + 1) * z->shard ? hi : (z->rank + 1) * z->shard;
    if (mine_hi - mine_lo > *max_part) *max_part = mine_hi - mine_lo;
  }
  return CLPAR_OK;
}

clpar_status clpar_zero_comm_setup(ddp_state *st) {
  const char *fn = "clpar_ddp_create";
  clpar_tensor *flat = st->params[0].param->flat;
  for (int i = 0; flat && i < st->n_params; i++)
    if (st->params[i].param->flat != flat) flat = NULL;
  if (!flat || flat->dtype != CLPAR_FLOAT32)
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "%s: the module's parameters are not one float32 flat buffer on one "
                           "device; ZeRO shards a module that lives on one device",
                           fn);
  zero_red *z = calloc(1, sizeof *z);
  if (!z) return clpar_ddp_oom();
  st->zred = z;
  z->world = st->world;
  z->rank = clpar_dist_rank();
  z->numel = flat->numel;
  z->shard = (z->numel + z->world - 1) / z->world;
  if (z->shard > INT32_MAX)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: a shard of %lld floats is over MPI's int",
                           fn, (long long)z->shard);
  int64_t max_part = 0;
  clpar_status s = lay_out(st, flat, &max_part, z);
  if (s != CLPAR_OK) return s;
  z->acc = calloc((size_t)z->shard + 1, sizeof(float));
  z->part = calloc((size_t)max_part + 1, sizeof(float));
  z->scratch = calloc(2 * (size_t)max_part + 2, sizeof(float));
  z->reqs = calloc((size_t)z->world + 1, sizeof(MPI_Request));
  z->counts = calloc((size_t)z->world, sizeof(int));
  if (!z->acc || !z->part || !z->scratch || !z->reqs || !z->counts) return clpar_ddp_oom();
  return clpar_ddp_alloc_host_buffers(st);
}

void clpar_zero_comm_free(ddp_state *st) {
  clpar_zero_graph_free(st);
  zero_red *z = st->zred;
  if (!z) return;
  if (!st->abandoned) { /* else MPI may still write them: left allocated */
    free(z->acc);
    free(z->part);
    free(z->scratch);
    free(z->reqs);
    free(z->counts);
    free(z);
  }
  st->zred = NULL;
}

void clpar_zero_take_grad(ddp_state *st, ddp_param *p) {
  clpar_tensor *t = p->param, *g = t->grad;
  ddp_bucket *b = &st->buckets[p->bucket];
  if (!g) return;
  clpar_status s =
      g->dtype == CLPAR_FLOAT32 && g->numel == p->numel && g->storage->dev == b->dev
          ? CLPAR_OK
          : clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                            "%s's gradient is not float32 on its bucket's device", p->name);
  clpar_capture_allow(1); /* inside a capture, the read is the replays' too (zero_graph.c) */
  if (s == CLPAR_OK)
    s = clpar_dev_read(b->dev, g->storage->buf, g->offset * CLPAR_WORD_BYTES, b->buf + p->offset,
                       (size_t)p->numel * sizeof(float));
  clpar_capture_allow(0);
  if (s != CLPAR_OK) {
    clpar_ddp_record_error(st, s, "ZeRO-2: posting the copy of a gradient to host memory");
    return; /* the gradient stays; the bucket takes zeros for it */
  }
  __atomic_add_fetch(&b->dev->transfers_out, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&b->dev->bytes_out, (uint64_t)p->numel * sizeof(float), __ATOMIC_RELAXED);
  p->posted = 1;
  /* the queue runs the read before any later use of this memory */
  clpar_tensor_release(g);
  t->grad = NULL;
  t->grad_defined = 0;
}

/* The reduce-scatter of the bucket's range (zero_scatter.c): each rank's count is the part of
 * the range in its shard; this rank's sum lands in z->part. */
static clpar_status scatter(ddp_state *st, zero_red *z, ddp_bucket *b, int64_t *mine_lo) {
  int64_t lo = b->flat_lo, hi = b->flat_lo + b->numel;
  for (int q = 0; q < z->world; q++) {
    int64_t a = lo > q * z->shard ? lo : q * z->shard;
    int64_t e = hi < (q + 1) * z->shard ? hi : (q + 1) * z->shard;
    z->counts[q] = e > a ? (int)(e - a) : 0;
    if (q == z->rank) *mine_lo = a - q * z->shard;
  }
  char what[128];
  snprintf(what, sizeof what, "ZeRO's reduce-scatter of the gradients, bucket %d (%lld floats)",
           (int)(b - st->buckets), (long long)b->numel);
  uint64_t seq = ++st->seq;
  clpar_status s = clpar_dist_check_broken() ? CLPAR_ERROR_TIMEOUT : CLPAR_OK;
  if (s == CLPAR_OK) s = clpar_dist_debug_check(st->comm, what, seq, b->numel * 4);
  if (s == CLPAR_OK) {
    s = clpar_zero_reduce_scatter(st->comm, b->buf, z->counts, z->part, z->scratch, z->reqs, what,
                                  seq);
    if (s != CLPAR_OK) st->abandoned = 1; /* MPI may still use b->buf, z->part, z->scratch */
  }
  if (s == CLPAR_ERROR_TIMEOUT) st->abandoned = 1;
  return s;
}

void clpar_zero_reduce_bucket(ddp_state *st, ddp_bucket *b) {
  double t[4];
  t[0] = clpar_clock_seconds();
  /* a rank whose copy failed takes part with zeros, so that no rank waits */
  clpar_ddp_take_reads(st, b);
  t[1] = clpar_clock_seconds();
  clpar_zero_scatter_bucket(st, b, t);
}

clpar_status clpar_zero_scatter_bucket(ddp_state *st, ddp_bucket *b, double t[4]) {
  zero_red *z = st->zred;
  int64_t at = 0;
  clpar_status s = scatter(st, z, b, &at);
  t[2] = clpar_clock_seconds();
  if (s != CLPAR_OK) {
    clpar_ddp_record_error(st, s, "reduce-scattering a bucket");
  } else {
    float inv = 1.0f / (float)z->world;
    float *dst = z->acc + at;
    int n = z->counts[z->rank];
    if (st->zero_stage == 1)
      for (int k = 0; k < n; k++) dst[k] = z->part[k] * inv;
    else
      for (int k = 0; k < n; k++) dst[k] += z->part[k] * inv;
    pthread_mutex_lock(&st->lock);
    z->written = 1;
    if (b == &st->buckets[st->n_buckets - 1]) z->have = 1;
    pthread_mutex_unlock(&st->lock);
  }
  t[3] = clpar_clock_seconds();
  clpar_ddp_add_times(st, b, t);
  return s;
}

float *clpar_zero_comm_shard(ddp_state *st, int *have) {
  zero_red *z = st->zred;
  pthread_mutex_lock(&st->lock);
  *have = z->have;
  pthread_mutex_unlock(&st->lock);
  return z->acc;
}

/* acc filled with zeros, unless nothing wrote into it since it last was; st->lock held. */
static void fill(zero_red *z) {
  if (z->written) memset(z->acc, 0, (size_t)z->shard * sizeof(float));
  z->written = 0;
}

float *clpar_zero_comm_step_shard(ddp_state *st, int *have) {
  zero_red *z = st->zred;
  pthread_mutex_lock(&st->lock);
  *have = z->have;
  if (!z->have && st->zero_stage == 1) fill(z);
  pthread_mutex_unlock(&st->lock);
  return z->acc;
}

/* Stage 1 fills nothing here: a backward's buckets write every element of acc that any
 * backward writes (their ranges are fixed; the elements no bucket covers stay the zeros acc
 * was made with), and a step with no backward since fills it (clpar_zero_comm_step_shard). */
void clpar_zero_comm_reset(ddp_state *st) {
  zero_red *z = st->zred;
  pthread_mutex_lock(&st->lock);
  if (st->zero_stage != 1) fill(z);
  z->have = 0;
  pthread_mutex_unlock(&st->lock);
}

#endif
