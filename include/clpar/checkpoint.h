/* checkpoint.h — a module's weights in the safetensors format (the file PyTorch users pass
 * around: safetensors.torch.save_file / load_file), under PyTorch's state_dict names
 * ("0.weight", "fc.bias"); and resumable training checkpoints (model, optimizer state,
 * generator state, step and epoch). Every file is written crash-safe: to a temporary file in
 * the same directory, synced, renamed over the old one, and the directory synced, so a process
 * killed in the middle of a save leaves the previous file intact. A save over an existing file
 * keeps its permission bits (a 0600 file stays 0600); a save to a path that is a symbolic link
 * replaces the link with the new file and leaves the link's target unchanged. A file's header
 * is bounded in cost before it is parsed: more JSON than 262,144 tokens plus one per 16 bytes
 * of tensor data is CLPAR_ERROR_TOO_LARGE. */
#ifndef CLPAR_CHECKPOINT_H
#define CLPAR_CHECKPOINT_H

#include <stdint.h>

#include "export.h"
#include "nn.h"
#include "optim.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a load did not take, for a non-strict load (and for the message of a strict one). Each
 * list is the names, comma separated ("" when none); owned by the report. */
typedef struct clpar_load_report {
  int loaded;       /* tensors copied into the module */
  char *missing;    /* the module's names that the file lacks */
  char *unexpected; /* the file's names that the module lacks */
  char *mismatched; /* in both, with another shape or dtype: "0.weight (F32 [4, 3] in the file,
                       F32 [4, 2] in the module)" */
} clpar_load_report;

/* Frees the lists (the struct itself is the caller's); accepts NULL. */
CLPAR_API void clpar_load_report_free(clpar_load_report *report);

/* Writes m's state_dict, every parameter and buffer (clpar_module_state_at's names and order,
 * each tensor once), to path as safetensors. metadata: NULL, or n_metadata key/value pairs
 * (keys[i], values[i]) written as the header's "__metadata__" strings. */
CLPAR_API clpar_status clpar_safetensors_save(const clpar_module *m, const char *path,
                                              const char *const *keys, const char *const *values,
                                              int n_metadata);

/* Loads path into m's parameters and buffers. strict (as PyTorch's load_state_dict(strict=True)): a
 * name missing from the file, a name the module lacks, or an entry of another shape or dtype is
 * CLPAR_ERROR_SHAPE_MISMATCH whose message lists the names, and nothing is changed; not
 * strict: the entries that match are loaded and report (may be NULL) lists the rest. The
 * "module." prefix of a DataParallel wrapper is matched either way: a file saved from a
 * wrapper loads into the bare module and the other way round. A file that breaks the format
 * is CLPAR_ERROR_CORRUPT naming what is wrong, and nothing is changed. The whole header is
 * checked first and the data then read one tensor at a time (no copy of the file in memory):
 * a file that another program truncates during the load gives CLPAR_ERROR_IO, and the
 * parameters read before that keep their new values. */
CLPAR_API clpar_status clpar_safetensors_load(clpar_module *m, const char *path, int strict,
                                              clpar_load_report *report);

/* A resumable training checkpoint, itself a safetensors file: the model's parameters and
 * buffers as "model.<name>", the optimizer's state under PyTorch's names
 * ("optimizer.state.<i>.momentum_buffer", ".exp_avg", ".exp_avg_sq"), and in the metadata
 * the optimizer's kind, each parameter group's options and size (group 0's as "optimizer.lr",
 * ..., group g's as "optimizer.group.<g>.lr", ...) and per-parameter step counts, the parameter
 * generator's
 * state (clpar_manual_seed), the caller's step and epoch, and each tensor's zlib crc32 (as
 * "crc32.<name>": 8 hex digits, and "checksums": "crc32"; strings, so PyTorch's safetensors
 * reads the file as any other). opt may be NULL. The tensors are read from their devices
 * twice, once for the checksums and once for the file. */
CLPAR_API clpar_status clpar_checkpoint_save(const char *path, const clpar_module *m,
                                             const clpar_optimizer *opt, int64_t step,
                                             int64_t epoch);
/* Restores a checkpoint into a model and optimizer built as those that were saved (same
 * architecture, same optimizer kind over the same parameters in the same groups): strict, all
 * or nothing. Every group's options (lr, ...) are restored too, as PyTorch's
 * optimizer.load_state_dict does (a file written before groups were saved restores group 0's).
 * Every tensor is checked against its checksum before anything is loaded: a mismatch is
 * CLPAR_ERROR_CORRUPT naming the tensor. A file without checksums (from a clpar before they
 * were written, or rewritten by PyTorch) loads unchecked. step and epoch may be NULL. */
CLPAR_API clpar_status clpar_checkpoint_load(const char *path, clpar_module *m,
                                             clpar_optimizer *opt, int64_t *step, int64_t *epoch);

/* A sharded training checkpoint (docs/checkpoints.md): a directory holding one safetensors
 * file per rank, "model-00001-of-00002.safetensors" ..., and "model.safetensors.index.json" in
 * Hugging Face's layout ({"metadata": {"total_size": bytes, ...}, "weight_map": {tensor:
 * file}}). The tensors are those of clpar_checkpoint_save under the same names, each whole in
 * one file; each rank writes those assigned to it (largest first, each to the rank with the
 * fewest bytes so far: the same on every rank, from the names and sizes alone). Every rank of
 * the job calls it (a collective; a process without clpar_dist_init is a job of one), with
 * the same module and optimizer layout; dir must be one directory that every rank sees, and
 * is made if missing. The checkpoint exists once rank 0 renames the index into place, after
 * every rank's shard is synced; the old index is removed first, so a crash during the save
 * leaves no checkpoint in dir (never a mix of two saves); shards of an older save that the
 * new index does not name are left in place. The generator state saved is rank 0's. Every
 * rank returns the same status: a rank's failure is named on every rank. */
CLPAR_API clpar_status clpar_checkpoint_save_sharded(const char *dir, const clpar_module *m,
                                                     const clpar_optimizer *opt, int64_t step,
                                                     int64_t epoch);
/* clpar_checkpoint_load from a sharded checkpoint, at any world size (not a collective: each
 * process reads the index and every file it names). Everything read is checked before
 * anything is loaded: the index's layout, file names that are plain names inside dir, each
 * file a valid safetensors file of the same save (metadata "shard.id") with the index's
 * metadata, every tensor in the file the index names and no other, total_size, the checksums,
 * then names, shapes and dtypes against m and opt; a fault is CLPAR_ERROR_CORRUPT (or _IO for
 * a file that cannot be read) naming the file and what is wrong, and nothing is changed. The
 * data is read one tensor at a time (no copy of the whole checkpoint in memory), as
 * clpar_checkpoint_load reads it. */
CLPAR_API clpar_status clpar_checkpoint_load_sharded(const char *dir, clpar_module *m,
                                                     clpar_optimizer *opt, int64_t *step,
                                                     int64_t *epoch);
/* Writes the sharded checkpoint in dir as one training checkpoint at path (crash-safe), the
 * file clpar_checkpoint_save would have written of the same model and optimizer, byte for
 * byte; checked as clpar_checkpoint_load_sharded checks it, checksums included, and copied
 * one tensor at a time. The tool
 * clpar-checkpoint calls it ("clpar-checkpoint consolidate DIR OUT.safetensors"). */
CLPAR_API clpar_status clpar_checkpoint_consolidate(const char *dir, const char *path);

#ifdef __cplusplus
}
#endif
#endif
