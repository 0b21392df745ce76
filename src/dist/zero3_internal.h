/* zero3_internal.h — what the files of ZeRO stage 3 share: zero3.c (the units, their forward
 * and backward) and zero3_state.c (what the optimizer, the user and the checkpoints see). */
#ifndef CLPAR_ZERO3_INTERNAL_H
#define CLPAR_ZERO3_INTERNAL_H

#include "dist/ddp_internal.h"

#define UNIT_TYPE "FSDPUnit"

typedef struct {
  clpar_tensor *param; /* the module's tensor, retained */
  int ndim;            /* its shape while it held its values */
  int64_t shape[CLPAR_MAX_DIMS];
  int64_t at; /* its first float in the unit's flat vector */
} z3_param;

typedef struct zero3 zero3;

/* A device command posted for the communication thread to wait on: its event calls back
 * (zero3_comm.c), so that waiting counts as no host wait of the program. */
typedef struct {
  clpar_event *ev;
  int posted; /* ev is recorded and watched */
  int seen;   /* its callback came (under zero3_comm.c's lock) */
} z3_watch;

/* Host memory of one collective of the communication thread: a gather slot all-gathers a unit's
 * shards (mine, read from the device, into host), a scatter slot reduce-scatters a unit's
 * gradient (buf, padded to world shards). state and the ring are under the DDP state's lock. */
enum { Z3_FREE, Z3_QUEUED, Z3_DONE };
typedef struct {
  int state;
  int gather;              /* 1: a gather slot; 0: a scatter slot */
  void *u;                 /* the unit (z3_unit) */
  uint64_t version, epoch; /* gather: its shard's storage version and zero3's epoch when posted */
  uint64_t order;          /* when it was posted (the oldest is dropped first) */
  float *mine, *host, *buf;
  void *pin[2];
  z3_watch read;       /* the device's read into mine or buf */
  z3_watch write;      /* gather: the device's write from host into the unit's full buffer */
  clpar_status status; /* the posting's error, then the job's */
  void *job;           /* a captured step's host call it runs (zero3_graph.c), or NULL */
  char what[96];
  char msg[MESSAGE_SIZE];
} z3_slot;

enum { Z3_SLOTS = 2, Z3_RING = 8 };

typedef struct {
  zero3 *z;
  clpar_module *inner; /* the unit, one reference: its forward runs with self = the wrapper */
  clpar_module *wrapper;
  int n_params;
  z3_param *params;
  int64_t numel, shard;
  clpar_tensor *pshard; /* [shard] on the device, a leaf that requires a gradient */
  float *acc;           /* [shard]: the averaged gradient backward reduced (the comm thread's) */
  int fresh;            /* the next reduction replaces acc (zero_grad since); under st->lock */
  int unflushed;        /* acc holds what pshard's grad does not yet; under st->lock */
  /* held by the wrapper and by zero3 (zero3.c's unit_put): the wrapper goes with the module's
   * tree before the DDP module stops the communication thread, whose slots may still name u */
  int refs;
} z3_unit;

struct zero3 {
  ddp_state *st;
  clpar_device *dev;
  int world, rank;
  int n_units;
  z3_unit **units;
  clpar_tensor *placeholder; /* [1] holding NaN: what a released parameter shows */
  int64_t max_shard;
  int gathered; /* clpar_zero_gather_parameters gave the parameters their values */
  int root;     /* the root unit's index (the last), or -1 */
  /* the collectives, on DDP's communication thread (zero3_comm.c): gathers on gcomm,
   * reduce-scatters on rcomm, duplicates of the module's communicator of their own */
  MPI_Comm gcomm, rcomm;
  uint64_t gseq, rseq, epoch, posted;
  int abandoned; /* a collective timed out: MPI may still use the slots' memory */
  /* gathers, then scatters, then the one of captured steps (zero3_graph.c) */
  z3_slot slots[2 * Z3_SLOTS + 1];
  int next_scatter;
  int ring[Z3_RING]; /* queued slots; head: the one the thread runs (or next) */
  unsigned head, tail;
  float *part; /* [max shard]: the thread's reduce-scatter result */
  /* the reduce-scatter's own (clpar_zero_reduce_scatter): counts [world], receive slots
   * [2 max shard], requests [world + 1] */
  int *rs_counts;
  float *rs_scratch;
  MPI_Request *rs_reqs;
  void *graph; /* captured steps' records (zero3_graph.c); NULL until a capture */
};

/* The unit's full parameters in a new device buffer [numel] (counted as parameters), all-gathered
 * with what as the collective's name (or taken from the prefetch that gathered them already).
 * A rank that cannot read its shard still takes part (with zeros) and fails after the
 * collective. No host wait: the program waits for the communication thread only. */
clpar_status clpar_z3_gather_full(z3_unit *u, const char *what, clpar_tensor **full);
/* Starts the all-gather of u's parameters (named what) on the communication thread when a slot
 * is free and none holds them; nothing else (a later clpar_z3_gather_full takes them). */
void clpar_z3_prefetch(z3_unit *u, const char *what);
/* Posts the read of grad ([numel], released here; NULL: zeros) into host memory and hands its
 * reduce-scatter to the communication thread, which adds this rank's averaged shard into the
 * unit's acc. Errors come back through the DDP state (clpar_zero3_flush). */
void clpar_z3_post_scatter(z3_unit *u, clpar_tensor *grad);
/* Setup and teardown of the above: the communicators (collective, first), then the slots' host
 * memory and the units' accs; the teardown after the communication thread has ended. */
clpar_status clpar_z3_comm_dup(zero3 *z);
clpar_status clpar_z3_comm_setup(zero3 *z);
void clpar_z3_comm_free(zero3 *z);
/* Every parameter of every unit gives up its memory: a [1] view of the placeholder. */
void clpar_z3_release_all(zero3 *z);
/* The unit's values from its parameters, in a new host vector of world shards (zero-padded). */
clpar_status clpar_z3_unit_values(z3_unit *u, const char *fn, float **out);

/* ---- zero3_comm.c's queue, for zero3_graph.c ---- */

/* Queues slot x for the communication thread; st->lock held. */
void clpar_z3_enqueue(zero3 *z, z3_slot *x);
/* On the communication thread: x's collective (gather or reduce-scatter) with its status. */
void clpar_z3_run_slot(zero3 *z, z3_slot *x);

/* ---- inside a captured step (zero3_graph.c) ---- */

/* The gather's commands: the shard read into host memory, a host call that hands the
 * all-gather to the communication thread, a gate, the write into a new buffer *full (the
 * graph's). */
clpar_status clpar_z3_graph_gather(z3_unit *u, const char *what, clpar_tensor **full);
/* The reduce-scatter's commands: grad ([numel], released here) read into host memory, a host
 * call, a gate (the thread added the averaged shard into acc). */
void clpar_z3_graph_scatter(z3_unit *u, clpar_tensor *grad);
/* The step's: acc written into the shard's gradient of every unit reduce-scattered since the
 * last captured zero_grad or step. */
clpar_status clpar_z3_graph_flush(zero3 *z);
/* zero_grad's: a host call and a gate, the thread marks every unit's acc to be replaced. */
void clpar_z3_graph_zero_grad(zero3 *z);
/* On the communication thread: a captured job in slot x; opens its gate last. */
void clpar_z3_graph_run(zero3 *z, z3_slot *x);
/* Eager work after a capture: waits until the device ran the replays posted before, and drops
 * what gathers the eager path holds (a replay changed the shards). */
void clpar_z3_graph_eager(zero3 *z);
/* After the communication thread ended: the records and their host memory. */
void clpar_z3_graph_free(zero3 *z);

#endif
