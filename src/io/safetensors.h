/* safetensors.h — the safetensors container (github.com/huggingface/safetensors), read and
 * written byte for byte as the reference implementation does; what the tensors mean (module
 * parameters, optimizer state) is src/io/checkpoint.c's business. Not installed.
 *
 * The reader knows every byte-sized dtype of the format, so that a file is validated whole
 * whatever it holds; clpar's tensors map to F32, I32, I64, BF16 and F16 (clpar_st_dtype_of, in
 * src/io/checkpoint.c), and loading reports any other dtype as a mismatch. */
#ifndef CLPAR_IO_SAFETENSORS_H
#define CLPAR_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* The reference's limit on the JSON header (safetensors' MAX_HEADER_SIZE). */
#define CLPAR_ST_MAX_HEADER 100000000u

typedef enum clpar_st_dtype {
  CLPAR_ST_BOOL,
  CLPAR_ST_U8,
  CLPAR_ST_I8,
  CLPAR_ST_F8_E5M2,
  CLPAR_ST_F8_E4M3,
  CLPAR_ST_I16,
  CLPAR_ST_U16,
  CLPAR_ST_F16,
  CLPAR_ST_BF16,
  CLPAR_ST_I32,
  CLPAR_ST_U32,
  CLPAR_ST_F32,
  CLPAR_ST_F64,
  CLPAR_ST_I64,
  CLPAR_ST_U64,
  CLPAR_ST_DTYPE_COUNT
} clpar_st_dtype;

const char *clpar_st_dtype_name(clpar_st_dtype d);
size_t clpar_st_dtype_size(clpar_st_dtype d);

typedef struct clpar_st_tensor {
  char *name;
  clpar_st_dtype dtype;
  int ndim;
  uint64_t *shape;     /* ndim entries (NULL for a scalar) */
  uint64_t begin, end; /* byte offsets in the data block */
  const uint8_t *data; /* parsed from memory: the bytes at begin (not aligned in general);
                          read from a path: NULL (clpar_st_tensor_read) */
} clpar_st_tensor;

struct clpar_st_source;

typedef struct clpar_st_file {
  uint8_t *buf;             /* the whole file, when parsed from memory */
  int fd;                   /* the open file, when read from a path; else -1 */
  char *path;               /* for messages, when read from a path */
  uint64_t size;            /* of the file */
  uint64_t data_start;      /* 8 + the header's size */
  clpar_st_tensor *tensors; /* in the header's order */
  int n;
  char **meta_keys, **meta_values; /* "__metadata__"; a value may hold NUL bytes */
  size_t *meta_lens;               /* each value's length */
  int n_meta;
  /* a view over other files (a sharded checkpoint): tensor i's bytes are read from
   * sources[i]; not owned. NULL otherwise. */
  const struct clpar_st_source *sources;
} clpar_st_file;

/* Where a tensor of a view is: tensor index of file. */
typedef struct clpar_st_source {
  const clpar_st_file *file;
  int index;
} clpar_st_source;

/* Validates a whole file held in memory, with every check of the reference's
 * SafeTensors::read_metadata and Metadata::validate; what names the file in messages. On
 * success f owns buf; on error (CLPAR_ERROR_CORRUPT naming the fault, or out of memory) f is
 * empty and buf is still the caller's. */
clpar_status clpar_st_parse(const char *what, uint8_t *buf, size_t size, clpar_st_file *f);
/* Opens path and validates it the same way from its header and its size, without reading
 * the data: that is read tensor by tensor (clpar_st_tensor_read), so a load needs no copy of
 * the whole file in memory. A file that changes after this (truncated by another program)
 * gives CLPAR_ERROR_IO at the read. */
clpar_status clpar_st_read(const char *path, clpar_st_file *f);
/* Copies tensor i's end - begin bytes into dst. */
clpar_status clpar_st_tensor_read(const clpar_st_file *f, int i, void *dst);
/* Copies n bytes of tensor i, from its byte at, into dst (the range must lie in the tensor). */
clpar_status clpar_st_tensor_read_part(const clpar_st_file *f, int i, uint64_t at, void *dst,
                                       size_t n);
void clpar_st_free(clpar_st_file *f);
/* The index of the tensor named name, or -1. */
int clpar_st_find(const clpar_st_file *f, const char *name);
/* The metadata value of key (NUL-terminated; a value holding NUL reads as its text up to the
 * first), or NULL. */
const char *clpar_st_meta(const clpar_st_file *f, const char *key);
/* The same, and the value's whole length in *len (len may be NULL). */
const char *clpar_st_meta_len(const clpar_st_file *f, const char *key, size_t *len);

/* One tensor to write: numel * dtype size bytes, little endian, either held in data or, when
 * data is NULL, produced by fill(src, dst, bytes) into a buffer that the writer reuses from
 * one tensor to the next (so a save needs no host copy of the whole model). */
typedef struct clpar_st_entry {
  const char *name;
  clpar_st_dtype dtype;
  int ndim;
  const int64_t *shape;
  const void *data;
  clpar_status (*fill)(const void *src, void *dst, size_t bytes);
  const void *src;
} clpar_st_entry;

/* Writes the entries to path crash-safe (clpar_file_write_atomic), laid out as the reference
 * writer does: tensors sorted by dtype (the reference's Dtype order, last first) then name
 * (so the enum above keeps the reference's order), the header's
 * "__metadata__" first, the JSON padded with spaces to a multiple of 8. */
clpar_status clpar_st_write(const char *path, const clpar_st_entry *entries, int n,
                            const char *const *keys, const char *const *values, int n_meta);

/* src/io/checkpoint.c: the safetensors dtype of a clpar dtype (F32, I32, I64), and an
 * entry's fill for a clpar_tensor (src) of any dtype: its raw bytes, read from its device. */
clpar_st_dtype clpar_st_dtype_of(clpar_dtype d);
clpar_status clpar_st_tensor_fill(const void *tensor, void *dst, size_t bytes);

#endif
