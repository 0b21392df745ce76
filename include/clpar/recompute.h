/* recompute.h — activation checkpointing (torch.utils.checkpoint with use_reentrant=False):
 * a module wrapper whose forward runs the module without recording the graph, keeping only
 * its input, and whose backward runs that forward again, this time recording, and
 * backpropagates through it. Memory for the activations inside the module is traded for one
 * more forward. (Saving a model to a file is include/clpar/checkpoint.h.) */
#ifndef CLPAR_RECOMPUTE_H
#define CLPAR_RECOMPUTE_H

#include "export.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A module of type "ActivationCheckpoint" that runs module's forward, taking ownership of
 * module as clpar_module_add_child does (also on error: a module no parent holds is freed).
 * It holds module's children, parameters and buffers under their own names (no prefix: the
 * parameter list and state_dict are module's), so it can replace module anywhere: in a
 * Sequential, under DataParallel, as a pipeline stage or inside DDP; use the wrapper from
 * then on (train/eval, clpar_module_to), not module.
 *
 * Forward with recording on and an input or parameter requiring a gradient: module's forward
 * runs with recording off (its intermediate tensors are freed as it goes); the output gets one
 * node that keeps the input and the parameters. Its backward runs the forward again, recording,
 * on the same input and parameters, and backpropagates the output's gradient through that
 * graph, which is then freed; the input's and the parameters' gradients are those of the
 * module run without the wrapper, bit for bit (when the output's gradient is). Dropout
 * modules inside replay the (seed, offset) they drew in the forward, so the masks are the
 * same. Otherwise (recording off, nothing requires a gradient) it is module's forward.
 *
 * The module's forward must be a function of its input, parameters and buffers that reaches
 * them through self (as DataParallel requires): a module that changes its buffers in the
 * forward (BatchNorm's running statistics in training mode) changes them again in the
 * recompute, as in PyTorch. A module whose training mode changed between forward and backward
 * fails the backward (CLPAR_ERROR_INVALID_ARGUMENT) when its random draws differ. A module
 * containing a DataParallel, Pipeline or DistributedDataParallel wrapper is refused
 * (CLPAR_ERROR_INVALID_ARGUMENT): checkpoint the modules inside it instead. */
CLPAR_API clpar_status clpar_activation_checkpoint_create(clpar_module *module, clpar_module **out);

/* Wraps every child of m (a Sequential's layers) in place, each in a wrapper of its own
 * (children already wrapped are left as they are); names and parameters stay the same. Call it
 * before wrapping m in DataParallel, a pipeline or DDP. On error nothing is changed. */
CLPAR_API clpar_status clpar_activation_checkpoint_children(clpar_module *m);

/* Checkpoints every block of a GPT (clpar_gpt_create): transformer.h's children, in place. */
CLPAR_API clpar_status clpar_gpt_checkpoint_blocks(clpar_module *gpt);

#ifdef __cplusplus
}
#endif
#endif
