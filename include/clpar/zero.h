/* zero.h — sharded data parallel (DeepSpeed's ZeRO stages 1, 2 and 3; PyTorch's
 * ZeroRedundancyOptimizer, FSDP) on a DistributedDataParallel module made with
 * clpar_ddp_options.zero_stage 1, 2 or 3. The training loop stays PyTorch's: forward through the
 * DDP module, clpar_backward on the loss, then clpar_zero_optimizer_step instead of
 * clpar_optimizer_step (and clpar_zero_optimizer_zero_grad).
 *
 * The module's parameters are one flat buffer of numel floats (clpar_module_flatten), cut into
 * world_size shards of ceil(numel / world_size) floats (the last ones padded with zeros, so a
 * numel that does not divide is fine). Backward reduce-scatters the gradient as plain DDP
 * all-reduces it: the buckets (bucket_cap_mb), each a range of the flat gradient, are taken by
 * DDP's communication thread as their gradients become final, and reduce-scattered with
 * point-to-point MPI messages through host memory (each rank receives the part of the range in
 * its shard from every rank and sums it, in rank order), overlapped with the rest of backward;
 * the backward thread only posts the copies to host memory and never waits for the device.
 * Each rank keeps the average of its shard on the host. The step (1) writes that average into
 * the shard's gradient; (2) steps the rank's shard of the parameters in place with an inner
 * optimizer (SGD, Adam or AdamW with PyTorch's rules) that keeps state for that shard only,
 * 1/world_size of what plain DDP keeps; (3) all-gathers the shards (MPI_Allgather), so every
 * rank ends with the parameters plain DDP gives.
 *
 * Stage 1 keeps the flat gradient on the device, as plain DDP: backward accumulates into it
 * (each synchronized backward reduces what it holds, so two backwards before a step sum as in
 * DDP), and the step writes the averaged shard into its slice; the rest of the flat gradient
 * holds this rank's own, unreduced gradients. Stage 2 frees the flat gradient when the module
 * is made: backward gives each parameter a gradient of its own, and the module's gradient hook
 * (autograd.h) posts its copy into the bucket's host memory and frees it at once (the device's
 * queue runs the copy first), so the device holds at most the rank's averaged shard and the
 * gradients backward is making, never all of them (DeepSpeed's 4Ψ + 12Ψ/N in fp32, plus
 * activations); a second backward before the step adds into the averaged shard. The
 * parameters' grad is then NULL after backward; read gradients (to clip them, say) with stage
 * 1. clpar_ddp_set_sync(0) makes backward keep the gradients on the device, unreduced, as in
 * plain DDP, and find_unused_parameters works as there.
 *
 * Every collective runs with the job's deadline (clpar_dist_timeout): a rank that dies or hangs
 * makes the others' step fail with CLPAR_ERROR_TIMEOUT naming it and the collective.
 *
 * Stages 1 and 2 capture (clpar/graph.h, docs/zero.md): a replay's buckets are reduce-scattered
 * and its all-gather run on the communication thread, and an error there (a timeout naming the
 * rank) is returned by the next call on the device; zero_grad between the captured backward and
 * the step, and stage 3, are refused at capture.
 *
 * Stage 3 (FSDP; src/dist/zero3.c, docs/zero.md) also shards the parameters. The units are
 * the children that hold parameters of the module clpar_ddp_options.zero_units names
 * ("transformer.h": a GPT's blocks) or of the wrapped module (a Sequential's layers); the
 * parameters left outside them (all of them for a module that holds parameters itself) make
 * the root unit, gathered around the whole forward (in its backward, the other units run
 * nested inside the recompute; a weight tied across the root is fine there). Each
 * unit is replaced in the tree by a wrapper of type "FSDPUnit" (names unchanged) and each rank
 * keeps ceil(numel / world_size) floats of it. A unit's forward all-gathers its parameters into
 * a temporary buffer, runs without recording and frees it; its backward all-gathers again,
 * runs the forward again recording, backpropagates, reduce-scatters the unit's gradient (the
 * rank's averaged shard becomes the shard's grad at the step) and frees the full parameters
 * and gradients. The collectives run on the communication thread: the next unit's all-gather
 * while a unit computes, a unit's reduce-scatter while the units before it compute backward.
 * The step only steps the shards. The module's parameter tensors keep their names but give up
 * their memory: each is a [1] tensor holding NaN, until clpar_zero_gather_parameters.
 *
 * Limits of this version: every stage reduces through host memory over MPI, also on CUDA
 * devices (not NCCL); the module must live on one device, all float32; stage 3 refuses
 * find_unused_parameters and a parameter shared by two units of zero_units.
 * Dropout inside a unit replays in the recompute the draws of the forward (same masks). */
#ifndef CLPAR_ZERO_H
#define CLPAR_ZERO_H

#include <stdint.h>

#include "export.h"
#include "nn.h"
#include "optim.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clpar_zero_optimizer clpar_zero_optimizer;

/* The sharded optimizer of ddp (a DistributedDataParallel module made with zero_stage 1, 2, 3;
 * CLPAR_ERROR_INVALID_ARGUMENT otherwise), with the inner optimizer's options (NULL: every
 * default, as clpar_sgd_create and clpar_adam_create take them). Every rank calls it; ddp must
 * outlive the optimizer. */
CLPAR_API clpar_status clpar_zero_sgd_create(clpar_module *ddp, const clpar_sgd_options *options,
                                             clpar_zero_optimizer **out);
CLPAR_API clpar_status clpar_zero_adam_create(clpar_module *ddp, const clpar_adam_options *options,
                                              clpar_zero_optimizer **out);
CLPAR_API clpar_status clpar_zero_adamw_create(clpar_module *ddp, const clpar_adam_options *options,
                                               clpar_zero_optimizer **out);
/* Collective: the averaged shard from backward into the shard's gradient, the shard's step,
 * all-gather (above). Waits for the device. CLPAR_ERROR_NO_GRADIENT when no backward gave a
 * gradient (stage 2: since the last step) or the last one left a parameter without one. */
CLPAR_API clpar_status clpar_zero_optimizer_step(clpar_zero_optimizer *opt);
/* Stage 1: forgets the averaged shard and leaves the parameters without a gradient (PyTorch's
 * set_to_none: clpar_tensor_grad gives NULL) without filling the flat gradient: the next
 * backward's first gradient of each parameter replaces its part (while a graph is alive, the
 * flat gradient is zeroed instead, as its replays add into it); stage 2: forgets the
 * averaged shard backward made since the last step (and frees any gradient a backward left on
 * the device). */
CLPAR_API clpar_status clpar_zero_optimizer_zero_grad(clpar_zero_optimizer *opt);
/* The inner optimizer over this rank's shard (a [len] tensor viewing the flat parameters at
 * offset; stage 3: one tensor per unit, its shard), for learning-rate schedules and
 * clpar_optimizer_set_lr; NULL when the rank's shard is empty (numel below world_size pieces).
 * Owned by opt. */
CLPAR_API clpar_optimizer *clpar_zero_optimizer_inner(clpar_zero_optimizer *opt);
/* This rank's shard of the flat parameters: its first element and its length (0 for a shard
 * wholly in the padding). Stage 3: 0 and the floats of every unit's shard (padding included). */
CLPAR_API void clpar_zero_optimizer_shard(const clpar_zero_optimizer *opt, int64_t *offset,
                                          int64_t *len);
CLPAR_API void clpar_zero_optimizer_free(clpar_zero_optimizer *opt);

/* Stage 3 (collective): every parameter of ddp gets its full value and shape again, all-gathered
 * (each unit's in one device buffer), to evaluate outside the DDP module, save a state_dict or
 * read them; a snapshot, which the next clpar_zero_optimizer_step (or the call below) releases.
 * CLPAR_ERROR_INVALID_ARGUMENT for a module not made with zero_stage 3. */
CLPAR_API clpar_status clpar_zero_gather_parameters(clpar_module *ddp);
/* Stage 3: the parameters give up their memory again ([1] tensors holding NaN). */
CLPAR_API clpar_status clpar_zero_release_parameters(clpar_module *ddp);

#ifdef __cplusplus
}
#endif
#endif
