/* graph.h — a training step captured once and replayed (CUDA graphs' and tinygrad TinyJit's
 * semantics; docs/graphs.md).
 *
 * Between clpar_graph_capture_begin and clpar_graph_capture_end every command the step posts to
 * the capturing devices is recorded while it runs as ever (the capture run is an eager step).
 * A replay posts each device's recorded commands to its worker at once: no autograd, no
 * allocation, no per-op host work; on OpenCL the plain kernel launches run prepared (kernel
 * objects of the graph's own, their arguments set at capture). What changes per step is patched at
 * each replay as the eager step would compute it: the optimizers' learning rate (read from their
 * options, so schedulers work), Adam's step count and bias corrections, Dropout modules' RNG
 * offsets, BatchNorm2d's num_batches_tracked. Copies between capturing devices (DataParallel's) go
 * through host memory the graph owns, and their events are made fresh at each replay.
 * DistributedDataParallel over MPI is captured with its bucket hand-offs and its broadcast of the
 * module's buffers (each replay all-reduces and broadcasts on the module's communication thread,
 * every rank replaying the same graph), with ZeRO stages 1 and 2 (the thread reduce-scatters, the
 * step's all-gather is handed to it); what it cannot replay (NCCL, ZeRO stage 3,
 * find_unused_parameters, uneven inputs) is refused (docs/graphs.md).
 *
 * Static inputs: a replay reads the buffers the capture read. Write each step's inputs and
 * labels into tensors made before the capture (clpar_tensor_write, clpar_copy_) before each
 * replay, and read outputs (the loss) from the tensors the capture run returned, after it.
 * Refused at capture, with a message naming what (the capture then fails): a read into host
 * memory (clpar_tensor_read, clpar_tensor_item), an upload from host memory
 * (clpar_tensor_from_host, cross-entropy with host labels), a wait for the device, a copy
 * between a capturing device and another, optimizer state made in the step (an optimizer's
 * first step: run one eagerly before capturing, as clpar_step_compile does). Replay is refused
 * after clpar_module_to, clpar_module_flatten, clpar_optimizer_free, the freeing of a Dropout
 * or BatchNorm2d module, or of a buffer the step uses (parameters, inputs, optimizer state):
 * capture again. One thread captures at a time, and nothing else may post to the capturing
 * devices during the capture. */
#ifndef CLPAR_GRAPH_H
#define CLPAR_GRAPH_H

#include "device.h"
#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clpar_graph clpar_graph;

/* Starts capturing what the calling code posts to devs[0 .. n) (distinct, at most 8: every
 * device the step uses, DataParallel's all). One capture at a time. */
CLPAR_API clpar_status clpar_graph_capture_begin(clpar_device *const *devs, int n);
/* Ends the capture, waits for the capture run, and gives the graph; when a command failed on
 * a device or something was refused during the capture, no graph (*out NULL) and that error.
 * An error the step's own code returned is not seen here: a caller whose step failed ends the
 * capture and destroys the graph (clpar_step_run does). */
CLPAR_API clpar_status clpar_graph_capture_end(clpar_graph **out);
/* Posts the graph's commands again (patched) and returns without waiting for them; with
 * copies between devices, each device's queue runs it after the previous replay's copies
 * (their host memory is written again), the host not waiting. */
CLPAR_API clpar_status clpar_graph_replay(clpar_graph *g);
/* The commands recorded, summed over the devices (a kernel, a GEMM, a copy, a wait or signal
 * between devices each). */
CLPAR_API size_t clpar_graph_command_count(const clpar_graph *g);
/* Waits for the graph's replays, returns its pool to the device's cache and frees it. */
CLPAR_API void clpar_graph_destroy(clpar_graph *g);

/* A step function compiled on first use: the first clpar_step_run calls fn(ctx) eagerly (a
 * warm-up: gradients and optimizer state are made), the second calls it under capture on
 * devs[0 .. n) (the devices the step uses), later ones replay. fn must leave what it returns in ctx
 * (the loss tensor) and read its inputs from tensors made before the capture. */
typedef clpar_status (*clpar_step_fn)(void *ctx);
typedef struct clpar_step clpar_step;
CLPAR_API clpar_status clpar_step_compile(clpar_step_fn fn, void *ctx, clpar_device *const *devs,
                                          int n, clpar_step **out);
CLPAR_API clpar_status clpar_step_run(clpar_step *step);
/* The graph once captured (after the second run), else NULL. */
CLPAR_API clpar_graph *clpar_step_graph(const clpar_step *step);
CLPAR_API void clpar_step_free(clpar_step *step);

#ifdef __cplusplus
}
#endif

#endif
