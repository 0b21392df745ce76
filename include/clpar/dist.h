/* dist.h — distributed training over MPI: one process per device, on one machine or several,
 * started with mpirun (README, "DistributedDataParallel"). Nothing here needs mpi.h: a
 * program compiles the same whether the library was built with MPI or not, and where it was
 * not (CMake option CLPAR_MPI), every call returns CLPAR_ERROR_UNSUPPORTED. */
#ifndef CLPAR_DIST_H
#define CLPAR_DIST_H

#include <stdint.h>

#include "device.h"
#include "export.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the library was built with MPI, 0 otherwise. */
CLPAR_API int clpar_dist_available(void);

/* Joins the job: initializes MPI when the program has not (asking for MPI_THREAD_MULTIPLE;
 * a program that initialized MPI itself must have asked for at least MPI_THREAD_SERIALIZED,
 * and with less than MULTIPLE must not call MPI while a backward runs), finds this process's
 * rank, the world size and its local rank (its index among the ranks on the same host), then
 * calls clpar_init. Safe to call more than once; each successful call needs one
 * clpar_dist_finalize, the last of which calls clpar_shutdown and finalizes MPI if
 * clpar_dist_init initialized it. Free DistributedDataParallel modules before it (their
 * forward fails with CLPAR_ERROR_NOT_INITIALIZED after it). MPI cannot start again in a
 * process: once MPI is finalized, clpar_dist_init fails with CLPAR_ERROR_NOT_INITIALIZED. */
CLPAR_API clpar_status clpar_dist_init(void);
CLPAR_API void clpar_dist_finalize(void);

/* CLPAR_DIST_BACKEND (auto, mpi or nccl; see clpar_ddp_backend) is checked here too: another
 * value makes clpar_dist_init fail. */

/* -1 before clpar_dist_init. */
CLPAR_API int clpar_dist_rank(void);
CLPAR_API int clpar_dist_world_size(void);
/* Index among the ranks on this host, and how many there are (MPI_COMM_TYPE_SHARED). */
CLPAR_API int clpar_dist_local_rank(void);
CLPAR_API int clpar_dist_local_size(void);
/* This process's device: entry (local rank mod count) of the selected devices. Without
 * CLPAR_DEVICES that spreads the ranks of a host over its devices; CLPAR_DEVICES chooses the
 * list it picks from (CLPAR_DEVICES=opencl:1 puts every rank on opencl:1). NULL before
 * clpar_dist_init. */
CLPAR_API clpar_device *clpar_dist_device(void);

/* In-place sum or mean of n floats (host memory) over every rank; every rank must call it,
 * in the same order as its other collectives. For logging a loss, counting samples, ... */
CLPAR_API clpar_status clpar_dist_all_reduce_sum(float *data, int64_t n);
CLPAR_API clpar_status clpar_dist_all_reduce_mean(float *data, int64_t n);
/* The element-wise maximum, in place (a flag any rank raised, as the loss scaler's inf/NaN
 * finding: amp.h). */
CLPAR_API clpar_status clpar_dist_all_reduce_max(float *data, int64_t n);
CLPAR_API clpar_status clpar_dist_barrier(void);

/* Timeouts. Every collective clpar makes (these helpers, and DistributedDataParallel's checks,
 * broadcasts and bucket all-reduces) is non-blocking MPI polled against a deadline,
 * CLPAR_DIST_TIMEOUT seconds (default 600; a value that is not a positive number makes
 * clpar_dist_init fail). After min(60 s, half the deadline) a waiting rank logs a warning
 * naming the collective and asks every rank where it is; at the deadline it returns
 * CLPAR_ERROR_TIMEOUT naming the collective, its sequence number, the ranks that did not
 * answer (dead, hung, or not in a clpar collective) and where the others wait. MPI cannot
 * cancel a collective, so after a timeout every later collective of clpar fails at once,
 * clpar_dist_finalize leaves MPI unfinalized, and the program should end the job with
 * clpar_dist_abort. The deadline in seconds; -1 before clpar_dist_init. */
CLPAR_API double clpar_dist_timeout(void);
/* MPI_Abort on MPI_COMM_WORLD with code: ends every process of the job. Returns only if MPI
 * is not running or could not abort. */
CLPAR_API clpar_status clpar_dist_abort(int code);

/* ---- DistributedDataParallel ---- */

typedef struct clpar_ddp_options {
  /* Size of the gradient buckets after the first, in MiB; 0 means PyTorch's 25. The first
   * bucket holds min(1 MiB, bucket_cap_mb), as PyTorch's does, so that the first all-reduce
   * starts early in backward. */
  double bucket_cap_mb;
  /* PyTorch's find_unused_parameters: each forward (with gradients, synchronized) walks its
   * output's graph, and the parameters it does not reach are counted ready, with zeros, when
   * backward starts, so every bucket is reduced and every rank gets the same averages (a
   * parameter that only some ranks used gets their gradients averaged over all ranks; one
   * that no rank used gets zeros, and an optimizer steps it, as in DataParallel). Without it,
   * a parameter that gets no gradient is an error at the next forward (below). */
  int find_unused_parameters;
  /* Uneven inputs (what PyTorch's Join is for): every forward first all-reduces a flag per
   * rank (one small collective per step); a rank that has run out of inputs calls
   * clpar_ddp_join instead of its next forward. See clpar_ddp_join. */
  int uneven_inputs;
  /* Sharded data parallel (include/clpar/zero.h): 0 plain DDP; 1 (ZeRO-1: optimizer state
   * sharded) or 2 (ZeRO-2: gradients too, taken off the device during backward): backward
   * then reduces nothing, and the step of a clpar_zero_optimizer reduce-scatters the
   * gradients, steps the rank's shard and all-gathers the parameters. 3 (ZeRO-3, FSDP): the
   * parameters too, gathered per unit in forward and backward (zero.h). MPI only. */
  int zero_stage;
  /* Stage 3: the module (a dotted name, "transformer.h" for a GPT's blocks) whose children
   * are the units; NULL: the wrapped module's. Parameters outside them (a GPT's embeddings,
   * final LayerNorm and tied head) make one more unit, the root, around the whole forward. */
  const char *zero_units;
} clpar_ddp_options;

/* Wraps module (taking ownership of it, also on error) into a module of type
 * "DistributedDataParallel" whose only child is "module": its parameters are named
 * "module.<name>" and are the wrapped module's own. Every rank must call it, after
 * clpar_dist_init, with the same model. It first checks that every rank has the same
 * parameters (count, names, shapes); if one differs, it fails on every rank with
 * CLPAR_ERROR_SHAPE_MISMATCH and a message naming the first difference and the rank. Then
 * it broadcasts the parameters from rank 0, so every rank starts from rank 0's weights.
 *
 * Training: forward as usual (each rank on its own share of the batch), clpar_backward on
 * the rank's loss, then any optimizer's step. Backward copies the gradients into buckets
 * (parameters in reverse order, as PyTorch's Reducer) and all-reduces each bucket on a
 * communication thread as soon as its last gradient is ready, while backward goes on; it
 * returns once every bucket is reduced, with the gradients averaged over the ranks in the
 * parameters' grad. So a step needs no extra call. A failure of the communication thread
 * (MPI, a copy) is returned by clpar_ddp_synchronize and by the next forward.
 *
 * The module is flattened (clpar_module_flatten), so that the gradients of a bucket are one
 * range of a flat gradient buffer: backward posts one read of it into host memory (pinned on a GPU)
 * on the device's queue as soon as its last gradient is computed (the copy overlaps the rest of
 * backward), and the averages go back in one write. A bucket never spans two devices, so a
 * module split over several devices (model parallel) works: each gradient is reduced from
 * the device it lives on.
 *
 * Every backward must reach every parameter unless find_unused_parameters is set: a
 * parameter that got no gradient leaves its bucket waiting, and the next forward fails
 * (CLPAR_ERROR_NO_GRADIENT) naming it. A bucket's all-reduce that times out (clpar_dist_timeout)
 * makes clpar_ddp_synchronize and the next forward return CLPAR_ERROR_TIMEOUT; backward
 * itself returns after the deadline.
 *
 * On CUDA devices with NCCL (clpar_ddp_backend), each bucket is instead averaged in place on
 * the device by NCCL, ordered with the device's other work, and backward returns without
 * waiting; a NCCL all-reduce that does not complete within the deadline is aborted. */
CLPAR_API clpar_status clpar_ddp_create(clpar_module *module, const clpar_ddp_options *options,
                                        clpar_module **out);
/* Returns the first error of the communication thread since the last call (CLPAR_OK when
 * there was none). The gradients are reduced when backward returns; call this before the
 * optimizer step to be sure that no reduction failed. */
CLPAR_API clpar_status clpar_ddp_synchronize(clpar_module *ddp);

/* Uneven inputs, for a module made with the uneven_inputs option: a rank that has no more
 * inputs calls this instead of its next forward. Each forward and join all-reduces which
 * ranks still have inputs, so the ranks learn it at the same step; we chose to stop there
 * rather than have the finished ranks shadow the others' collectives (PyTorch's Join): when
 * some ranks joined and others did not, the forward on every rank that still had inputs and
 * the join on every rank that had none fail alike with CLPAR_ERROR_UNEVEN_INPUTS, naming the
 * ranks that ran out, the step, and the ranks that still had inputs; no gradient is reduced
 * in that step. When every rank joins at the same step (even inputs) this returns CLPAR_OK.
 * Either way the module takes no more forwards (each fails at once, with no collective); the
 * program ends training there, e.g. by giving every rank the same number of steps, the
 * smallest share, as PyTorch's DistributedSampler with drop_last does.
 * CLPAR_ERROR_INVALID_ARGUMENT without the option. */
CLPAR_API clpar_status clpar_ddp_join(clpar_module *ddp);

/* PyTorch's no_sync: with sync 0, backward only accumulates the gradients on each rank; the
 * first backward after sync is set back to 1 all-reduces the accumulated gradients (so
 * micro-steps of a gradient accumulation communicate once). Every rank must do the same. */
CLPAR_API clpar_status clpar_ddp_set_sync(clpar_module *ddp, int sync);

typedef struct clpar_ddp_stats {
  int buckets;         /* how the parameters were bucketed */
  uint64_t reductions; /* backward passes fully reduced */
  /* the communication thread's time: waiting for a bucket's copy to host memory (posted when
   * its last gradient was; the wait is mostly the device computing backward), in
   * MPI_Allreduce (which waits for the slowest rank too), and averaging and posting the copy
   * back (which does not wait for the device) */
  double read_seconds, allreduce_seconds, write_seconds;
  /* of allreduce + write, the part after the last bucket's gradients were read, when the
   * device had no backward work left: the communication not hidden behind backward */
  double exposed_seconds;
  /* the backward thread blocked in the last hook until every bucket was reduced (backward
   * only posts work, so this includes waiting for the device to compute) */
  double wait_seconds;
} clpar_ddp_stats;
CLPAR_API clpar_status clpar_ddp_stats_get(const clpar_module *ddp, clpar_ddp_stats *out);

/* How ddp reduces its gradients, chosen at creation identically on every rank: "nccl" (NCCL
 * all-reduces each bucket in place on the rank's CUDA device, ordered with the device's other
 * work; backward returns without waiting) or "mpi" (through host memory, as described above).
 * NCCL is used when clpar was built with it (CMake option CLPAR_NCCL), every rank's module
 * lives on one CUDA device, and CLPAR_DIST_BACKEND (auto, mpi or nccl; read by
 * clpar_dist_init) allows it; with nccl, a rank that cannot use it makes creation fail on every
 * rank. *why (when why is not NULL) gets a sentence saying why, valid while ddp lives. NULL for
 * a module that is not a DistributedDataParallel. With NCCL, the stats count all-reduce time as
 * the communication thread sees it (from when the device could start it to its completion;
 * read and write 0, wait 0), and clpar_ddp_synchronize waits for the all-reduces posted so far. */
CLPAR_API const char *clpar_ddp_backend(const clpar_module *ddp, const char **why);

#ifdef __cplusplus
}
#endif
#endif
