/* pipeline.h — pipeline parallel (GPipe, and 1F1B as in PipeDream-Flush): a model cut into
 * stages, stage s on device s, the batch split into micro-batches that flow through the
 * stages so that stage s runs micro-batch i while stage s+1 runs micro-batch i-1.
 *
 * Model parallel needs nothing of this: put a module's children on different devices
 * (clpar_module_to) and move activations in its forward with clpar_tensor_to, which is
 * differentiable across devices and returns without waiting (samples/model_parallel.c).
 *
 * Two ways to train a pipeline:
 *   - clpar_module_forward on the whole batch, a loss on the output, clpar_backward (GPipe:
 *     every micro-batch's forward, then every backward; all activations held until backward);
 *   - clpar_pipeline_train_step with a loss callback: forward and backward per micro-batch in
 *     the pipeline's schedule, GPipe or 1F1B (at most n_stages micro-batches' activations
 *     alive at once).
 * Either way the gradients accumulated into the parameters are those of the whole batch:
 * a step equals the one-device step (except where a stage's result depends on the other rows
 * of its micro-batch: BatchNorm in training mode sees micro-batch statistics, as in PyTorch). */
#ifndef CLPAR_PIPELINE_H
#define CLPAR_PIPELINE_H

#include <stdint.h>

#include "device.h"
#include "export.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum clpar_pipeline_schedule {
  CLPAR_PIPELINE_GPIPE = 0, /* all forwards, then all backwards */
  CLPAR_PIPELINE_1F1B = 1   /* stage s: n_stages - s forwards ahead, then one forward, one
                             * backward (PipeDream-Flush): at most n_stages in flight */
} clpar_pipeline_schedule;

typedef struct clpar_pipeline_options {
  /* Rows per micro-batch (the last one may have fewer, as torch.split); 0: use chunks. */
  int64_t split_size;
  /* With split_size 0: the number of micro-batches, torch.chunk sizes (ceil(N / chunks)
   * rows each, so possibly fewer); 0 means 1, PyTorch's Pipe default (no pipelining). */
  int chunks;
  /* The order of clpar_pipeline_train_step; clpar_module_forward is always GPipe. */
  clpar_pipeline_schedule schedule;
  /* What train_step's loss callback returns: the MEAN over its micro-batch's rows (the
   * pipeline weighs it by rows / N, so the step's loss is the batch's mean), or the SUM. */
  clpar_reduction loss_reduction;
  /* n_stages names of the stages (children of the pipeline: parameters "<name>.weight");
   * NULL names them "0", "1", ... as nn.Sequential. Fixed at creation. */
  const char *const *stage_names;
} clpar_pipeline_options;

/* A module of type "Pipeline" whose children are the stages, in order, taking ownership of
 * them (also on error: each module is freed once). A module given as two stages is refused
 * (CLPAR_ERROR_INVALID_ARGUMENT). Stage s is moved to devices[s] (devices NULL: selected device
 * s % clpar_device_count()); several stages may share a device. Its forward splits the batch
 * (dim 0) into micro-batches, runs them through the stages, copying each activation to the
 * next stage's device, and concatenates the outputs on the last stage's device; an input on
 * another device is copied to the first stage's. Nothing waits for a device: the calling
 * thread posts each micro-batch's stages in order, and each device's worker runs its queue.
 * The stages' devices are fixed: clpar_module_to refuses the pipeline. options may be NULL
 * (one micro-batch, GPipe, mean losses). */
CLPAR_API clpar_status clpar_pipeline_create(clpar_module *const *stages,
                                             clpar_device *const *devices, int n_stages,
                                             const clpar_pipeline_options *options,
                                             clpar_module **out);

/* Changes the micro-batches, the schedule and the loss reduction (stage_names is ignored). */
CLPAR_API clpar_status clpar_pipeline_set_options(clpar_module *pipe,
                                                  const clpar_pipeline_options *options);

/* Row counts of the micro-batches of a batch of rows (at most max of them written). Returns
 * their number, or a negative status. */
CLPAR_API int clpar_pipeline_split(const clpar_module *pipe, int64_t rows, int64_t *sizes, int max);

CLPAR_API int clpar_pipeline_stage_count(const clpar_module *pipe);
/* Stage s (borrowed), and its device; NULL when s is out of range or pipe is no pipeline. */
CLPAR_API clpar_module *clpar_pipeline_stage(const clpar_module *pipe, int s);
CLPAR_API clpar_device *clpar_pipeline_device(const clpar_module *pipe, int s);

/* The loss of one micro-batch: output (its rows of the pipeline's output, on the last
 * stage's device), target (the same rows of train_step's target, on that device too, or NULL
 * when train_step got none), first_row (where the micro-batch starts in the batch: for labels
 * in host memory). *loss: a one-element tensor, the MEAN or SUM over the micro-batch's rows
 * as the options say (clpar_mse_loss, clpar_cross_entropy with that reduction). */
typedef clpar_status (*clpar_pipeline_loss_fn)(clpar_tensor *output, clpar_tensor *target,
                                               int64_t first_row, void *user, clpar_tensor **loss);

/* One training step's forward and backward in the pipeline's schedule: each micro-batch's
 * forward through the stages, its loss, and its backward, which adds its share into the
 * parameters' gradients (zero them before, step the optimizer after, as for any backward).
 * target may be NULL; when given, its dim 0 must equal input's. *loss (may be NULL): the
 * whole batch's loss on the last stage's device, no gradient (the mean over all rows when
 * losses are MEAN). Nothing waits for a device. An error from a stage names the stage, its
 * device and the micro-batch. The first micro-batch is forwarded through every stage and its
 * loss taken before any backward is posted, so an error there (a shape mismatch) leaves
 * everything unchanged; an error only a later micro-batch meets (out of memory; a stage that
 * refuses the last, shorter micro-batch) returns after earlier micro-batches' gradients were
 * added: zero the gradients before the next step. */
CLPAR_API clpar_status clpar_pipeline_train_step(clpar_module *pipe, clpar_tensor *input,
                                                 clpar_tensor *target,
                                                 clpar_pipeline_loss_fn loss_fn, void *user,
                                                 clpar_tensor **loss);

typedef struct clpar_pipeline_stats {
  uint64_t forwards;      /* clpar_module_forward calls */
  uint64_t train_steps;   /* clpar_pipeline_train_step calls that succeeded */
  uint64_t micro_batches; /* micro-batches run by both */
  int max_in_flight;      /* the most micro-batches whose activations a train step held at
                           * once: the micro-batch count under GPipe, at most n_stages under
                           * 1F1B */
  double issue_seconds;   /* host time spent posting forwards and backwards */
} clpar_pipeline_stats;

CLPAR_API clpar_status clpar_pipeline_stats_get(const clpar_module *pipe,
                                                clpar_pipeline_stats *out);
CLPAR_API clpar_status clpar_pipeline_stats_reset(clpar_module *pipe);

#ifdef __cplusplus
}
#endif
#endif
