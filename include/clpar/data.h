/* data.h — training data from host arrays, NumPy .npy files and CSV files (optionally
 * gzip-compressed), and a loader that cuts a dataset into batches (shuffled with a seed, a new
 * permutation each epoch, reproducible) and gathers the next batch on a background thread
 * while the caller's step runs. Nothing read from a file is trusted: a bad file is
 * CLPAR_ERROR_CORRUPT (or CLPAR_ERROR_IO) naming the file and the byte offset or line. */
#ifndef CLPAR_DATA_H
#define CLPAR_DATA_H

#include <stdint.h>

#include "device.h"
#include "export.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- NumPy .npy (format versions 1.0, 2.0 and 3.0, little-endian, C order) ---- */

typedef enum clpar_npy_dtype {
  CLPAR_NPY_F32 = 0, /* '<f4' */
  CLPAR_NPY_I32 = 1, /* '<i4' */
  CLPAR_NPY_I64 = 2  /* '<i8' */
} clpar_npy_dtype;

#define CLPAR_NPY_MAX_DIMS 8

/* An array read from a .npy file; data holds numel elements of dtype (owned by the array). */
typedef struct clpar_npy_array {
  clpar_npy_dtype dtype;
  int ndim; /* 0 for a scalar */
  int64_t shape[CLPAR_NPY_MAX_DIMS];
  int64_t numel;
  void *data;
} clpar_npy_array;

/* Reads path, which must be a regular file (or a link to one: a FIFO or a device is
 * CLPAR_ERROR_IO, refused without blocking). Another dtype, Fortran order, a header longer
 * than 65,535 bytes (any version), a shape whose product overflows, or data that does not fill
 * the rest of the file exactly is CLPAR_ERROR_CORRUPT naming the file and byte offset; on
 * error *out is left zeroed. */
CLPAR_API clpar_status clpar_npy_read(const char *path, clpar_npy_array *out);
/* Frees data (the struct is the caller's); accepts NULL. */
CLPAR_API void clpar_npy_array_free(clpar_npy_array *a);

/* ---- datasets ---- */

/* N samples of one shape (float32) with an int32 label each. Immutable once made, so several
 * loaders (on several threads) may read one dataset. */
typedef struct clpar_dataset clpar_dataset;

/* Copies n samples of sample_shape (sample_ndim dims, each >= 1) from features (n * the
 * sample's numel floats, row-major) and n labels (labels may be NULL: every label 0). */
CLPAR_API clpar_status clpar_dataset_from_arrays(int64_t n, int sample_ndim,
                                                 const int64_t *sample_shape, const float *features,
                                                 const int32_t *labels, clpar_dataset **out);
/* Features from a .npy of shape (N, ...) of float32 (int32 and int64 are converted to float);
 * labels (labels_path may be NULL) from a .npy of shape (N,) of int32 or int64, an int64 label
 * outside int32's range being CLPAR_ERROR_CORRUPT. */
CLPAR_API clpar_status clpar_dataset_from_npy(const char *features_path, const char *labels_path,
                                              clpar_dataset **out);
/* One sample per line of comma-separated numbers (a file whose first two bytes are gzip's magic
 * is read through zlib); label_column (0-based; negative counts from the end, -1 the last) is
 * the label, an integer, and the other columns are the features (1-D samples). skip_header:
 * the first line is column names and is skipped. A bad number (an empty field, or one of only
 * blanks, included) or a line with another count of columns is CLPAR_ERROR_CORRUPT naming the
 * file, line and column. The text is capped at CLPAR_CSV_MAX_TEXT_DEFAULT bytes. */
CLPAR_API clpar_status clpar_dataset_from_csv(const char *path, int label_column, int skip_header,
                                              clpar_dataset **out);

/* The default cap on a CSV file's text (after decompression): 1 GiB. */
#define CLPAR_CSV_MAX_TEXT_DEFAULT ((int64_t)1 << 30)

/* Limits for clpar_dataset_from_csv_opts; a zero field takes its default. */
typedef struct clpar_csv_options {
  /* The most bytes of text read (after decompression, all gzip streams of the file together):
   * a longer file is CLPAR_ERROR_TOO_LARGE, found before much more than this is held in
   * memory. 0: CLPAR_CSV_MAX_TEXT_DEFAULT. */
  int64_t max_text_bytes;
} clpar_csv_options;

/* clpar_dataset_from_csv with limits (opt NULL: every default; clpar_dataset_from_csv is this
 * with NULL). Only a regular file is read (or a link to one): a FIFO, a device or a directory
 * is CLPAR_ERROR_IO before anything is read. */
CLPAR_API clpar_status clpar_dataset_from_csv_opts(const char *path, int label_column,
                                                   int skip_header, const clpar_csv_options *opt,
                                                   clpar_dataset **out);
CLPAR_API int64_t clpar_dataset_size(const clpar_dataset *ds);
/* One sample's shape (without the batch dimension); dim i of 0..ndim-1, else 0. */
CLPAR_API int clpar_dataset_sample_ndim(const clpar_dataset *ds);
CLPAR_API int64_t clpar_dataset_sample_dim(const clpar_dataset *ds, int i);
/* Sample i's features (the sample's numel floats) and label, straight from the dataset; NULL
 * and 0 for i out of range. */
CLPAR_API const float *clpar_dataset_features(const clpar_dataset *ds, int64_t i);
CLPAR_API int32_t clpar_dataset_label(const clpar_dataset *ds, int64_t i);
CLPAR_API void clpar_dataset_free(clpar_dataset *ds);

/* ---- the loader ---- */

/* torch.utils.data.DataLoader's arguments; every field's default is 0 but batch_size's, 1,
 * which 0 stands for (status.h's convention). */
typedef struct clpar_loader_options {
  int64_t batch_size; /* 0: 1; else >= 1 */
  int shuffle;        /* 0: in order; else a permutation per epoch from (seed, epoch) */
  uint64_t seed;
  int drop_last; /* 0: the last batch of an epoch may be smaller; else it is dropped */
} clpar_loader_options;

typedef struct clpar_loader clpar_loader;

/* A loader over ds (which must outlive it) making batches on dev; opt NULL means the defaults
 * (batch_size 1, in order, the last batch kept). A batch_size above the dataset's size (up to
 * INT64_MAX) gives one batch of every sample, as PyTorch's DataLoader. Fails with
 * CLPAR_ERROR_EMPTY when an epoch would have no batch (an empty dataset, or fewer samples than
 * batch_size with drop_last). The background thread starts at the first clpar_loader_next. */
CLPAR_API clpar_status clpar_loader_create(const clpar_dataset *ds, clpar_device *dev,
                                           const clpar_loader_options *opt, clpar_loader **out);
/* The next batch of the current epoch: *features a new tensor (batch, sample...) on the
 * loader's device (the caller frees it), *labels its batch int32 labels, valid until the next
 * call on the loader, *batch its row count. At the end of an epoch it returns CLPAR_OK with
 * *features NULL, *labels NULL, *batch 0, and the following call starts the next epoch.
 * features, labels or batch may be NULL when not wanted (a NULL features skips the upload). */
CLPAR_API clpar_status clpar_loader_next(clpar_loader *l, clpar_tensor **features,
                                         const int32_t **labels, int64_t *batch);
/* Batches per epoch. */
CLPAR_API int64_t clpar_loader_batches(const clpar_loader *l);
/* The order in which epoch (>= 0) visits the samples: clpar_dataset_size(ds) indices written to
 * order (the loader's own permutation; for tests and a caller's bookkeeping). */
CLPAR_API clpar_status clpar_loader_order(const clpar_loader *l, int64_t epoch, int64_t *order);
/* The epoch the next batch comes from (0 at the start). */
CLPAR_API int64_t clpar_loader_epoch(const clpar_loader *l);
/* Restarts at the first batch of epoch (>= 0), for a resumed run: the batches are those an
 * uninterrupted run would have had in that epoch. */
CLPAR_API clpar_status clpar_loader_set_epoch(clpar_loader *l, int64_t epoch);
/* Stops and joins the background thread and frees everything; accepts NULL. */
CLPAR_API void clpar_loader_free(clpar_loader *l);

#ifdef __cplusplus
}
#endif

#endif /* CLPAR_DATA_H */
