/* checkpoint_internal.h — what src/io/checkpoint.c shares with the sharded checkpoints
 * (src/io/checkpoint_sharded.c): the set of tensors and metadata a training checkpoint
 * writes, and the load of a training checkpoint from a file already opened and validated.
 * Not installed. */
#ifndef CLPAR_IO_CHECKPOINT_INTERNAL_H
#define CLPAR_IO_CHECKPOINT_INTERNAL_H

#include "clpar/checkpoint.h"
#include "io/safetensors.h"

/* Tensors (entries whose values are read from their devices as the file is written) and
 * string metadata, in the order they were added. */
typedef struct clpar_ckpt_set {
  clpar_st_entry *e;
  int64_t (*shapes)[CLPAR_MAX_DIMS];
  int n, cap;
  char **keys, **values;
  int n_meta, cap_meta;
} clpar_ckpt_set;

void clpar_ckpt_set_free(clpar_ckpt_set *w);
/* What clpar_checkpoint_save writes, less the checksums: the metadata (format, step, epoch,
 * generator state, optimizer kind, options and step counts) and the tensors (the model's as
 * "model.<name>" in state_dict order, then the optimizer's state in parameter order). */
clpar_status clpar_ckpt_collect(clpar_ckpt_set *w, const clpar_module *m,
                                const clpar_optimizer *opt, int64_t step, int64_t epoch);
clpar_status clpar_ckpt_meta_add(clpar_ckpt_set *w, const char *key, const char *value);
/* "checksums" and a "crc32.<name>" per tensor of w, in w's order. */
clpar_status clpar_ckpt_add_checksums(clpar_ckpt_set *w);
clpar_status clpar_ckpt_write(clpar_ckpt_set *w, const char *path);
/* clpar_checkpoint_load from f (path names it in messages); f stays the caller's. */
clpar_status clpar_ckpt_load_file(const clpar_st_file *f, const char *path, clpar_module *m,
                                  clpar_optimizer *opt, int64_t *step, int64_t *epoch);

/* The names of a sharded checkpoint's files (src/io/checkpoint_sharded.c): the index, and
 * rank's shard of world, "model-00001-of-00002.safetensors" as Hugging Face numbers them. */
#define INDEX_NAME "model.safetensors.index.json"
void clpar_ckpt_shard_name(char *buf, size_t size, int rank, int world);
/* The collective save of clpar_checkpoint_save_sharded from w (the whole set, the same names,
 * dtypes and shapes on every rank): owner[i] >= 0 makes that rank write entry i, the others
 * are dealt out by size. mine: this rank's status so far (a failure is named on every rank
 * and nothing is written). The caller checks that dir/INDEX_NAME fits in 4096 bytes. w keeps
 * only the rank's own entries after. */
clpar_status clpar_ckpt_save_sharded_set(const char *dir, clpar_ckpt_set *w, int *owner,
                                         clpar_status mine);
/* Adds tensor t to w as name (its values read from its device as the file is written). */
clpar_status clpar_ckpt_add(clpar_ckpt_set *w, const char *name, const clpar_tensor *t);
/* The optimizer metadata of a training checkpoint, checked as clpar_checkpoint_load checks
 * it: the options of kind ("SGD", "Adam", "AdamW"), and integer key's value (>= lo). */
clpar_status clpar_ckpt_read_options(const clpar_st_file *f, const char *path, const char *kind,
                                     clpar_sgd_options *sgd, clpar_adam_options *adam);
clpar_status clpar_ckpt_meta_i64(const clpar_st_file *f, const char *path, const char *key,
                                 int64_t lo, int64_t *out);
clpar_status clpar_ckpt_meta_u64(const clpar_st_file *f, const char *path, const char *key,
                                 uint64_t *out);
clpar_status clpar_ckpt_meta_float(const clpar_st_file *f, const char *path, const char *key,
                                   float *out);
/* Metadata value key as text: NULL when absent, "" when it holds a NUL byte; shown gets the
 * value escaped for a message, in quotes, or "missing". */
const char *clpar_ckpt_meta_text(const clpar_st_file *f, const char *key, char *shown, size_t size);
/* Every tensor of f against the crc32 its metadata gives (when it has "checksums"). */
clpar_status clpar_ckpt_verify(const clpar_st_file *f, const char *path);
/* The sharded checkpoint in dir, checked whole (src/io/shard_index.c), as one file: *view
 * holds what clpar_checkpoint_save would have written, metadata included, each tensor read
 * from its shard when asked (clpar_st_tensor_read). Valid until clpar_ckpt_close_sharded. */
typedef struct clpar_ckpt_sharded clpar_ckpt_sharded;
clpar_status clpar_ckpt_open_sharded(const char *dir, clpar_ckpt_sharded **h,
                                     const clpar_st_file **view);
void clpar_ckpt_close_sharded(clpar_ckpt_sharded *h);

#endif
