/* checkpoint_zero.h — sharded training checkpoints of a ZeRO job (zero.h), in the layout of
 * clpar_checkpoint_save_sharded (checkpoint.h, docs/checkpoints.md): the files hold the
 * tensors, names and metadata that the plain optimizer of the same kind over the module's
 * parameters would have saved ("optimizer.state.<i>.exp_avg", ".exp_avg_sq",
 * ".momentum_buffer", each of its parameter's shape; one step count per parameter), so a
 * checkpoint saved with ZeRO loads into plain DDP or one process with
 * clpar_checkpoint_load_sharded, consolidates with clpar_checkpoint_consolidate, and loads
 * into a ZeRO job of any world size with the load below. */
#ifndef CLPAR_CHECKPOINT_ZERO_H
#define CLPAR_CHECKPOINT_ZERO_H

#include <stdint.h>

#include "export.h"
#include "nn.h"
#include "status.h"
#include "zero.h"

#ifdef __cplusplus
extern "C" {
#endif

/* clpar_checkpoint_save_sharded of ddp (zero_stage 1, 2 or 3) and its ZeRO optimizer opt; a
 * collective of the job's ranks. Stages 1 and 2: each parameter's state is written whole by
 * the rank whose shard holds its first element: that rank receives the rest of it from the
 * ranks after it in one MPI_Alltoallv per state tensor kind (only the parameters cut by a
 * shard boundary move). Stage 3: the parameters are all-gathered for the save (and released
 * after, unless clpar_zero_gather_parameters had gathered them), and each unit's state is
 * all-gathered per kind; parameter i's state is written by rank i mod world. The model's
 * tensors are dealt out as clpar_checkpoint_save_sharded deals them. Crash safety, the index
 * and the agreement of every rank's status are clpar_checkpoint_save_sharded's. The exchange
 * runs with the job's deadline. */
CLPAR_API clpar_status clpar_checkpoint_save_sharded_zero(const char *dir, const clpar_module *ddp,
                                                          const clpar_zero_optimizer *opt,
                                                          int64_t step, int64_t epoch);
/* Restores a checkpoint into ddp (zero_stage 1, 2 or 3) and its ZeRO optimizer opt at any world
 * size: dir is a sharded checkpoint's directory (saved by either save, at any world size) or
 * a training checkpoint file (clpar_checkpoint_save). Not a collective: each rank reads the
 * model whole and, of each state tensor, only the elements of its own shard. Checked as
 * clpar_checkpoint_load_sharded checks (layout, checksums, names, shapes, dtypes, options)
 * before anything changes; a ZeRO optimizer steps every parameter together, so a checkpoint
 * whose parameters have different step counts, or state for some parameters and not others,
 * is CLPAR_ERROR_INVALID_ARGUMENT naming them. The elements of the flat buffer that no
 * parameter covers take zero state. Stage 3: each parameter is given its shape over zeros for
 * the load (the unit's full size, on the device, for the duration of the call), then each
 * unit's shard is taken from it and the parameters give their memory back. */
CLPAR_API clpar_status clpar_checkpoint_load_sharded_zero(const char *dir, clpar_module *ddp,
                                                          clpar_zero_optimizer *opt, int64_t *step,
                                                          int64_t *epoch);

#ifdef __cplusplus
}
#endif
#endif
