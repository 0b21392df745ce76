/* dataset.h — private: the dataset's layout, shared by src/io/data.c (arrays, .npy, loader)
 * and src/io/csv.c. */
#ifndef CLPAR_IO_DATASET_H
#define CLPAR_IO_DATASET_H

#include <stdio.h>

#include <clpar/data.h>

struct clpar_dataset {
  int64_t n;
  int ndim;
  int64_t shape[CLPAR_NPY_MAX_DIMS];
  int64_t row; /* floats per sample */
  float *x;    /* (n, row) */
  int32_t *y;  /* (n) */
};

/* A dataset owning x and y (both malloc'ed; freed here on error too). */
clpar_status clpar_dataset_adopt(int64_t n, int ndim, const int64_t *shape, float *x, int32_t *y,
                                 clpar_dataset **out);

/* Reads a .npy from f, an open stream of size bytes positioned at its start (path names it in
 * messages); every check of clpar_npy_read. The fuzz target reads from memory through it. */
clpar_status clpar_npy_read_stream(const char *path, FILE *f, int64_t size, clpar_npy_array *out);

#endif /* CLPAR_IO_DATASET_H */
