/* ddp_internal.h — what the files of DistributedDataParallel share: ddp.c (the module),
 * ddp_comm.c (the communication thread and the hooks), ddp_buckets.c, ddp_unused.c
 * (find_unused_parameters), ddp_uneven.c (uneven inputs) and ddp_nccl.c (the NCCL path for
 * CUDA devices): the module's state, its buckets and parameters. */
#ifndef CLPAR_DDP_INTERNAL_H
#define CLPAR_DDP_INTERNAL_H

#include <pthread.h>

#include "dist/dist_internal.h"
#include "internal.h"

enum { MESSAGE_SIZE = 768 };

typedef struct ddp_state ddp_state;

typedef struct {
  ddp_state *st;
  clpar_tensor *param; /* a reference of ours */
  char *name;          /* "module.<name>" */
  int bucket;
  int64_t offset; /* in floats, in the bucket's buffer */
  int64_t numel;
  int ready;  /* its gradient is final in the current backward */
  int unused; /* find_unused_parameters: the last forward's graph does not reach it */
  int posted; /* ZeRO-2: its gradient's read into the bucket is posted in this backward */
} ddp_param;

/* Gradients of consecutive parameters of a bucket that lie next to each other in one device
 * buffer (a flat group's gradient, in reverse), and next to each other in the bucket's buffer:
 * one read and one write each. */
typedef struct {
  clpar_storage *storage;
  size_t word; /* where in storage the lowest of them starts */
  int64_t host, numel;
} ddp_run;

typedef struct {
  int first, count; /* params[first .. first+count) */
  int64_t numel;
  clpar_device *dev; /* where its parameters live (a bucket never spans devices) */
  float *buf;        /* host memory: pinned (the device's host_alloc) or, failing that, malloc */
  void *pin;         /* host_free's handle, or NULL for malloc */
  ddp_run *runs;     /* count entries; n_runs used, made when the bucket's reads are posted */
  int n_runs;
  clpar_event *read_done; /* the reads posted into buf completed */
  int read_failed;        /* posting them failed: the bucket takes part with zeros */
  int pending;            /* parameters still to become ready in this backward */
  int complete;           /* pending reached 0 (the backward thread's own flag) */
  int ready;              /* its reads are posted: the communication thread may take it */
  int watched;            /* read_done calls back when complete (else the thread syncs on it) */
  int read_seen;          /* that call came (under ddp_comm.c's read lock) */
  int64_t flat_lo;        /* ZeRO-1/2: buf[0]'s place in the flat gradient (zero_comm.c) */
  /* NCCL (src/dist/ddp_nccl.c): the bucket's range of the flat gradient, fixed at creation,
   * all-reduced there in place; grad_ref keeps that memory alive */
  clpar_tensor *grad_ref;
  size_t grad_word;
} ddp_bucket;

/* NCCL: an all-reduce posted on the device, which the communication thread watches (its
 * completion, NCCL's errors, the deadline), in the order posted. */
typedef struct ddp_watch {
  struct ddp_watch *next;
  clpar_event *done; /* recorded right after the all-reduce; NULL if that failed */
  int bucket;
  uint64_t seq;  /* the collective's number on the module's communicator */
  double posted; /* clpar_clock_seconds() when it was posted */
} ddp_watch;

enum { BUFFER_HEADER = 8 + MESSAGE_SIZE }; /* status, padding, rank 0's message */

struct ddp_state {
  MPI_Comm comm; /* the job's communicator duplicated for this module's collectives */
  uint64_t seq;  /* collectives on comm so far (the timeout's message names the number) */
  int abandoned; /* a collective on comm timed out: its buffers stay allocated */
  int world;
  int n_params;
  ddp_param *params; /* in bucket order: the module's parameters reversed */
  int n_buffers;
  clpar_tensor **buffers; /* references of ours, in the module's buffer order */
  char **buffer_names;    /* "module.<name>" */
  size_t *buffer_at;      /* each buffer's bytes in the block, 8-aligned, after the header */
  size_t block_bytes;
  unsigned char *block; /* the broadcast's host memory */
  int sync_buffers;     /* the next forward broadcasts (the previous one synchronized) */
  int n_buckets;
  ddp_bucket *buckets;
  pthread_t thread;
  int thread_started;
  pthread_mutex_t lock; /* everything below, and the ready flags above */
  pthread_cond_t cv;
  int stop;
  int next;          /* the bucket the communication thread reduces next */
  int busy;          /* it is reducing one now */
  int n_ready;       /* buckets ready in this backward */
  int no_sync;       /* clpar_ddp_set_sync(0): gradients accumulate locally, hooks do nothing */
  int find_unused;   /* clpar_ddp_options.find_unused_parameters */
  int unused_armed;  /* the last forward found unused parameters: the first hook marks them */
  int uneven_inputs; /* clpar_ddp_options.uneven_inputs: each forward all-reduces a flag */
  int zero_stage;    /* clpar_ddp_options.zero_stage: the hooks leave gradients alone (zero.c) */
  void *zero;        /* stage 2: its clpar_zero_optimizer (one per module) */
  void *zero3;       /* stage 3: the units and their shards (zero3.c) */
  void *zred;        /* stages 1 and 2: the buckets' reduce-scatter (zero_comm.c) */
  void *zgraph;      /* stages 1 and 2: captured steps' records (zero_graph.c) */
  uint64_t forwards; /* forwards and joins so far (the uneven-input check's step number) */
  int ended;         /* a rank ran out of inputs: every later forward fails with ended_msg */
  clpar_status ended_status;
  char ended_msg[MESSAGE_SIZE];
  ddp_param **by_address; /* the parameters sorted by tensor address (find_unused) */
  clpar_status error;
  char message[MESSAGE_SIZE];
  clpar_ddp_stats stats;
  /* how the buckets are reduced (ddp_choose_backend): over MPI through host memory (nccl 0),
   * or by NCCL on the one device every parameter lives on (nccl 1), and why */
  int nccl;
  char backend_why[MESSAGE_SIZE];
  clpar_device *nccl_dev;
  void *nccl_comm; /* the backend's communicator (comm_init) */
  int nccl_posted; /* buckets posted in this backward: always 0, 1, ... in order */
  ddp_watch *watch_head, *watch_tail; /* posted, not yet seen complete (under lock) */
  double watch_done; /* clpar_clock_seconds() when the thread last saw one complete */
  int nccl_dead;     /* the communicator was aborted: every later step fails with dead_msg */
  char dead_msg[MESSAGE_SIZE];
  void *graph; /* captured steps' hand-offs (ddp_graph.c); NULL until a capture */
};

/* ---- shared by the files of DistributedDataParallel ---- */

static inline clpar_status clpar_ddp_oom(void) {
  return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DistributedDataParallel: out of host memory");
}

/* Keeps the first error of the communication thread (or a hook) for the program to see:
 * "DistributedDataParallel: <what>: <the thread's error message>". */
void clpar_ddp_record_error(ddp_state *st, clpar_status s, const char *what);
/* Collective: CLPAR_OK when every rank's mine is; else every rank fails with the message of
 * the lowest rank that failed, prefixed by what. */
clpar_status clpar_ddp_agree(ddp_state *st, clpar_status mine, const char *what);
/* On the backward thread: posts the reads of the bucket's gradients into its host memory and
 * the event the communication thread waits for; nothing here waits for the device. */
void clpar_ddp_post_reads(ddp_state *st, ddp_bucket *b);
/* On the communication thread: waits for the bucket's reads (without a counted host wait when
 * the event calls back), zeros what no gradient filled; a failed read zeros the bucket. */
clpar_status clpar_ddp_take_reads(ddp_state *st, ddp_bucket *b);
/* On the communication thread: b->buf summed over the ranks (collective number ++st->seq,
 * against the deadline) and averaged; on failure the error is kept (clpar_ddp_record_error). */
clpar_status clpar_ddp_allreduce(ddp_state *st, ddp_bucket *b);
/* The bucket's seconds reading, reducing and writing back (t[0] .. t[3]) into the stats. */
void clpar_ddp_add_times(ddp_state *st, ddp_bucket *b, const double t[4]);
/* The bucket's runs of adjacent gradients, as its parameters' gradients are now. */
void clpar_ddp_make_runs(ddp_state *st, ddp_bucket *b);

/* The state of a DistributedDataParallel module, or NULL for another module. */
ddp_state *clpar_ddp_state_of(const clpar_module *m);

/* ---- ZeRO (zero.c) ---- */

/* Stage 2: frees the flat gradient and the parameters' views of it (backward then gives each
 * parameter a gradient of its own, which the hook takes off the device). */
void clpar_zero_release_grads(ddp_state *st);

/* Stages 1 and 2 (zero_comm.c), at creation: each bucket's host memory laid out as its range
 * of the flat gradient, and the rank's averaged shard. */
clpar_status clpar_zero_comm_setup(ddp_state *st);
void clpar_zero_comm_free(ddp_state *st);
/* Stage 2, the hook of p (backward thread): posts the read of its gradient into its bucket's
 * memory and frees the gradient (the device's queue runs the read first). */
void clpar_zero_take_grad(ddp_state *st, ddp_param *p);
/* The communication thread: the bucket reduce-scattered over the ranks; this rank's part,
 * averaged, into the rank's shard (stage 1: replacing, stage 2: adding). */
void clpar_zero_reduce_bucket(ddp_state *st, ddp_bucket *b);
/* The same once the bucket's reads are in its memory (t[0], t[1]: the caller's times; t[2],
 * t[3] filled and all four added to the stats); an error is kept (clpar_ddp_record_error). */
clpar_status clpar_zero_scatter_bucket(ddp_state *st, ddp_bucket *b, double t[4]);
/* Collective on comm, with its deadline (zero_scatter.c): buf holds one block per rank, block
 * q of counts[q] floats, back to back; sum gets the sum over the ranks of this rank's block,
 * added in rank order. scratch: 2 counts[rank] floats; reqs: world + 1. On an error MPI may
 * still use buf, sum, scratch and reqs. */
clpar_status clpar_zero_reduce_scatter(MPI_Comm comm, const float *buf, const int *counts,
                                       float *sum, float *scratch, MPI_Request *reqs,
                                       const char *what, uint64_t seq);
/* The rank's averaged shard (shard floats) and whether a backward reduced into it since
 * clpar_zero_comm_reset; the communication thread idle. */
float *clpar_zero_comm_shard(ddp_state *st, int *have);
/* The same for an eager step: stage 1 with no backward since the reset gets zeros. */
float *clpar_zero_comm_step_shard(ddp_state *st, int *have);
void clpar_zero_comm_reset(ddp_state *st);

/* Stage 3, once the parameters are broadcast: wraps the units of *module (the children of the
 * module named units, or of *module; *module is replaced by the root unit's wrapper when
 * parameters are left outside them), keeps the rank's shard of each and releases the
 * parameters' memory. Not collective. */
clpar_status clpar_zero3_setup(ddp_state *st, clpar_module **module, const char *units);
void clpar_zero3_free(ddp_state *st);
/* Stage 3: the shards (one per unit, leaves the optimizer steps) into out (when not NULL);
 * returns their count. */
int clpar_zero3_shards(ddp_state *st, clpar_tensor **out);
/* Stage 3: 1 when a backward gave some shard a gradient. */
int clpar_zero3_has_grad(ddp_state *st);
/* Stage 3's collectives on the communication thread (zero3_comm.c): whether one is queued
 * (st->lock held), and running the next (entered and left with st->lock held); the step's
 * flush: waits for them, returns their first error, posts each unit's averaged shard into the
 * shard's gradient; zero_grad: the next backward's shards replace what the last ones left. */
int clpar_zero3_job_ready(ddp_state *st);
void clpar_zero3_run_job(ddp_state *st);
clpar_status clpar_zero3_flush(ddp_state *st);
void clpar_zero3_zero_grad(ddp_state *st);
/* Stage 3 inside captured steps (zero3_graph.c): 1 while its device captures; an eager forward
 * after a capture waits for the replays posted before; before the module is freed, every graph
 * goes stale and the replays in flight run. */
int clpar_zero3_capturing(ddp_state *st);
void clpar_zero3_graph_eager(ddp_state *st);
void clpar_zero3_graph_quiesce(ddp_state *st);
/* Stage 3 inside a capture: the forward's broadcast of the buffers, a job of its queue. */
clpar_status clpar_zero3_graph_buffers(ddp_state *st);
/* Stage 3: parameters that clpar_zero_gather_parameters gave values give their memory back. */
void clpar_zero3_release(ddp_state *st);
/* Stage 3, for checkpoints (src/io/checkpoint_zero3.c): the unit holding parameter t (-1 for
 * none) and t's first float in the unit's flat vector; unit k's floats and shard; whether the
 * parameters hold values now; every parameter given its shape over zeros (not collective;
 * clpar_zero3_release undoes it); each unit's shard set from its parameters' values. */
int clpar_zero3_locate(ddp_state *st, const clpar_tensor *t, int64_t *at);
int64_t clpar_zero3_unit_size(ddp_state *st, int k, int64_t *shard);
int clpar_zero3_gathered(ddp_state *st);
clpar_status clpar_zero3_materialize(ddp_state *st, const char *fn);
clpar_status clpar_zero3_store_shards(ddp_state *st, const char *fn);

/* ---- the communication thread and the hooks (ddp_comm.c) ---- */

/* The thread's body (arg: the ddp_state): reduces the buckets in order until stop is set. */
void *clpar_ddp_comm_thread(void *arg);
/* Back to "no gradient ready" for the next backward; st->lock held, the thread idle. */
void clpar_ddp_reset_step(ddp_state *st);
/* The gradient hook of every parameter (user: its ddp_param). */
void clpar_ddp_grad_ready(clpar_tensor *t, void *user);

/* ---- buckets (ddp_buckets.c) ---- */

/* Groups the parameters, in reverse order, into buckets of about cap_mb MiB. */
clpar_status clpar_ddp_make_buckets(ddp_state *st, double cap_mb);
/* MPI: each bucket's host memory, pinned from the device's backend when it gives some. */
clpar_status clpar_ddp_alloc_host_buffers(ddp_state *st);

/* ---- find_unused_parameters (ddp_unused.c) ---- */

/* qsort order of st->by_address: by the parameter tensor's address. */
int clpar_ddp_cmp_address(const void *a, const void *b);
/* Marks unused every parameter that the graph of out does not reach, and arms the first hook
 * of the coming backward to mark them ready. */
clpar_status clpar_ddp_find_unused(ddp_state *st, clpar_tensor *out);

/* ---- uneven inputs (ddp_uneven.c) ---- */

/* Collective: all-reduces this rank's flag has (1: it has inputs for a forward; 0: it
 * joined); fails every rank alike once one has run out. */
clpar_status clpar_ddp_inputs_check(ddp_state *st, int has);

/* ---- captured steps (ddp_graph.c) ---- */

/* At the start of a forward: inside a capture, refuses what a replay cannot hold (naming it)
 * and makes the record of this step's hand-offs; outside one, after a capture, waits until
 * the devices ran every replay posted (their hand-offs must not meet an eager step's). */
clpar_status clpar_ddp_graph_forward(ddp_state *st);
/* The hook of p, st->lock held: 0 when p's bucket's device is not capturing; else posts, in
 * bucket order, each complete bucket's reads and a host call, and after the last one every
 * bucket's gate and writes, and returns 1. */
int clpar_ddp_graph_hook(ddp_state *st, ddp_param *p);
/* The communication thread, st->lock held: the next bucket a replay read, or NULL. */
void *clpar_ddp_graph_take(ddp_state *st);
/* The communication thread: that bucket all-reduced, and its gate opened (with the error);
 * ZeRO-1/2: reduce-scattered instead (zero_graph.c). */
void clpar_ddp_graph_reduce(ddp_state *st, void *handoff);
/* At the module's free: before the thread stops, the replays in flight run and every graph
 * goes stale; after it stopped, the records go. */
void clpar_ddp_graph_quiesce(ddp_state *st);
void clpar_ddp_graph_free(ddp_state *st);
/* Inside a capture, the forward's broadcast of the buffers: posted with this step's record's
 * host call and gate (clpar_ddp_buffers_post); stage 3: with a job of its queue. */
clpar_status clpar_ddp_graph_buffers(ddp_state *st);

/* ---- the buffers' broadcast (ddp_buffers.c) ---- */

/* Collective on st->comm, with the deadline: st->block from rank 0 to every rank, its header
 * carrying rank 0's status (with the last error as its message when not CLPAR_OK), which
 * then fails every rank alike. */
clpar_status clpar_ddp_bcast_block(ddp_state *st, clpar_status status, const char *what);
/* What a captured broadcast of the buffers cannot hold, or NULL. */
const char *clpar_ddp_buffers_refusal(const ddp_state *st);
/* Inside a capture: on rank 0 the reads of the buffers into the block, the host call, the
 * gate and, on the other ranks, the writes of the block into the buffers. */
clpar_status clpar_ddp_buffers_post(ddp_state *st, clpar_host_call *call, clpar_gate *gate);
/* The communication thread: the block broadcast (read_status: the host call's), the gate
 * opened with its error. */
void clpar_ddp_buffers_broadcast(ddp_state *st, clpar_status read_status, clpar_gate *gate);

/* ---- ZeRO stages 1 and 2 in captured steps (zero_graph.c) ---- */

/* Capture, once backward handed every bucket over: a host call and a gate, which the thread
 * opens once it reduced them all (the step that follows counts on them). */
clpar_status clpar_zero_graph_backward(ddp_state *st);
/* The communication thread: a replayed bucket (its reads' status) reduce-scattered into the
 * rank's averaged shard; the next host call of a captured step (st->lock held), or NULL; and
 * its run, which opens its gate (with the thread's error). */
void clpar_zero_graph_bucket(ddp_state *st, ddp_bucket *b, clpar_status read_status);
void *clpar_zero_graph_take(ddp_state *st);
void clpar_zero_graph_run(ddp_state *st, void *job);
/* After the thread stopped: every captured step's records go. */
void clpar_zero_graph_free(ddp_state *st);

/* ---- NCCL (src/dist/ddp_nccl.c) ---- */

/* At creation, on every rank (collective): chooses how the buckets are reduced, identically on
 * every rank (CLPAR_DIST_BACKEND, and whether every rank's parameters live on one CUDA device
 * with NCCL, each bucket one range of a flat gradient), sets st->nccl and st->backend_why, and
 * with NCCL makes the communicator (rank 0's id broadcast over MPI). In auto mode a
 * communicator that fails to come up on any rank falls back to MPI on every rank. */
clpar_status clpar_ddp_choose_backend(ddp_state *st);
/* On the backward thread, st->lock held (released while posting): posts the all-reduce of
 * every complete bucket not yet posted, in bucket order, stopping at the first incomplete
 * one; 1 once the last bucket is posted (the caller then starts the next backward afresh).
 * Nothing here waits for the device or the other ranks (but CLPAR_DIST_DEBUG's check). */
int clpar_ddp_nccl_post(ddp_state *st);
/* The communication thread's loop with NCCL: watches the posted all-reduces in order until
 * stop is set and none is left. */
void clpar_ddp_nccl_watch(ddp_state *st);
/* st->lock held: waits until every posted all-reduce was seen complete (or failed). */
void clpar_ddp_nccl_wait_idle(ddp_state *st);
/* After the thread has ended: frees the communicator and what is left of the watch list. */
void clpar_ddp_nccl_free(ddp_state *st);

#endif
