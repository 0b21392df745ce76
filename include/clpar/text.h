/* text.h — a text corpus for character-level language models, as nanoGPT's shakespeare_char:
 * the corpus read from a file (plain or gzip-compressed), a vocabulary of the distinct bytes it
 * holds, sorted (for ASCII text, Python's sorted(set(text))), encode and decode, the corpus cut
 * into a train part (its first 90%) and a validation part (the rest), and a loader of batches of
 * random windows of block_size + 1 tokens from one part: x = window[:-1], y = window[1:], as
 * int32 [batch, block_size] tensors on a device. The windows come from a seeded counter-based
 * generator, so a loader's batches are the same on every run and every machine.
 *
 * The repository ships a corpus: data/shakespeare.txt.gz (eight of Shakespeare's tragedies from
 * Project Gutenberg, public domain; data/README.md says where it came from). */
#ifndef CLPAR_TEXT_H
#define CLPAR_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "export.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clpar_text clpar_text;

/* The most bytes of text clpar_text_load reads (after decompression) unless told: 1 GiB. */
#define CLPAR_TEXT_MAX_BYTES_DEFAULT ((int64_t)1 << 30)

/* Reads path (a regular file; a file that starts with gzip's magic is decompressed) whole;
 * max_bytes 0 means CLPAR_TEXT_MAX_BYTES_DEFAULT, and longer text is CLPAR_ERROR_TOO_LARGE.
 * Text with fewer than 2 bytes is CLPAR_ERROR_EMPTY. */
CLPAR_API clpar_status clpar_text_load(const char *path, int64_t max_bytes, clpar_text **out);
/* The same from len bytes in memory (copied). */
CLPAR_API clpar_status clpar_text_from_memory(const char *data, size_t len, clpar_text **out);
CLPAR_API void clpar_text_free(clpar_text *t);

/* The number of distinct bytes (the vocabulary's size, 1 to 256), and the corpus' length. */
CLPAR_API int clpar_text_vocab_size(const clpar_text *t);
CLPAR_API int64_t clpar_text_length(const clpar_text *t);
/* The whole corpus encoded (clpar_text_length ids), owned by t. */
CLPAR_API const int32_t *clpar_text_tokens(const clpar_text *t);
/* ids[i] = the id of byte s[i], i < len; a byte outside the vocabulary is
 * CLPAR_ERROR_INVALID_ARGUMENT naming its position (nothing written after it). */
CLPAR_API clpar_status clpar_text_encode(const clpar_text *t, const char *s, size_t len,
                                         int32_t *ids);
/* out[i] = the byte of ids[i], i < n, then a NUL (out holds n + 1 bytes); an id outside
 * 0 .. vocab_size - 1 is CLPAR_ERROR_INVALID_ARGUMENT naming its position. */
CLPAR_API clpar_status clpar_text_decode(const clpar_text *t, const int32_t *ids, size_t n,
                                         char *out);

/* The two parts: train is tokens [0, split), validation [split, length), with split =
 * floor(length * train_fraction), nanoGPT's int(n * 0.9). */
typedef enum clpar_text_split { CLPAR_TEXT_TRAIN = 0, CLPAR_TEXT_VAL = 1 } clpar_text_split;

/* A field left 0 takes its default (status.h's convention). */
typedef struct clpar_text_loader_options {
  int64_t block_size;    /* 0: 64 (nanoGPT's shakespeare_char on a CPU); else >= 1 */
  int64_t batch_size;    /* 0: 12; else >= 1 */
  uint64_t seed;         /* 0 is a seed like any other */
  double train_fraction; /* 0: 0.9; else in (0, 1) */
} clpar_text_loader_options;

typedef struct clpar_text_loader clpar_text_loader;

/* A loader of batches from one part of t (which must outlive it), on dev. A part shorter than
 * block_size + 1 tokens is CLPAR_ERROR_EMPTY naming the part. */
CLPAR_API clpar_status clpar_text_loader_create(const clpar_text *t, clpar_text_split split,
                                                clpar_device *dev,
                                                const clpar_text_loader_options *opt,
                                                clpar_text_loader **out);
/* The next batch: *x and *y new int32 [batch_size, block_size] tensors on the loader's device
 * (the caller frees them). Window b of batch k starts at a position drawn from (seed, k, b),
 * uniform over the part's length - block_size starts (nanoGPT's torch.randint(len(data) -
 * block_size)); starts (may be NULL) receives the batch_size starts, as indices into the whole
 * corpus (clpar_text_tokens). */
CLPAR_API clpar_status clpar_text_loader_next(clpar_text_loader *l, clpar_tensor **x,
                                              clpar_tensor **y, int64_t *starts);
/* The index of the next batch (0 at the start), and setting it, for a resumed run. */
CLPAR_API int64_t clpar_text_loader_position(const clpar_text_loader *l);
CLPAR_API clpar_status clpar_text_loader_set_position(clpar_text_loader *l, int64_t batch);
/* The part's first token and length, as indices into the whole corpus. */
CLPAR_API int64_t clpar_text_loader_part_start(const clpar_text_loader *l);
CLPAR_API int64_t clpar_text_loader_part_length(const clpar_text_loader *l);
CLPAR_API void clpar_text_loader_free(clpar_text_loader *l);

#ifdef __cplusplus
}
#endif

#endif /* CLPAR_TEXT_H */
