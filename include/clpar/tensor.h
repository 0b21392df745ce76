/* tensor.h — tensors on any device: float32 (the default, and the only dtype the math ops
 * take), int32 and int64 (labels, indices, counters); row-major and contiguous; a view of a
 * range of rows, or of the whole with another shape, shares its parent's memory.
 *
 * Ownership: a function that returns a new tensor gives the caller one reference, to be
 * dropped with clpar_tensor_free (which accepts NULL). While a scope is open on the calling
 * thread (clpar_scope_begin), new tensors belong to the scope instead and are released
 * together by clpar_scope_end; call clpar_tensor_retain on one to keep it past the scope. */
#ifndef CLPAR_TENSOR_H
#define CLPAR_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CLPAR_MAX_DIMS 8

typedef struct clpar_tensor clpar_tensor;
typedef struct clpar_scope clpar_scope;

/* Element types. The functions without a dtype in their name (clpar_tensor_zeros,
 * from_host, read, write) mean float32; every math op (ops.h, nn.h, optimizers) takes float32
 * only and refuses another dtype with CLPAR_ERROR_DTYPE naming it. Int and 16-bit float
 * tensors can be created, read and written (raw), copied (clpar_copy, same dtype), moved
 * between devices, viewed (rows, reshape, flatten, split), concatenated and zero-filled;
 * bfloat16 and float16 also convert to and from float32 (half.h). A view of a 16-bit tensor
 * must start at an even element (rows/split of odd row sizes are CLPAR_ERROR_INVALID_ARGUMENT). */
typedef enum clpar_dtype {
  CLPAR_FLOAT32 = 0,
  CLPAR_INT32 = 1,
  CLPAR_INT64 = 2,
  CLPAR_BFLOAT16 = 3,
  CLPAR_FLOAT16 = 4
} clpar_dtype;
/* Bytes per element (4, 4, 8, 2, 2); 0 for a value that is no clpar_dtype. */
CLPAR_API size_t clpar_dtype_size(clpar_dtype dtype);
/* "float32", "int32", "int64", "bfloat16", "float16"; "unknown" for a value that is no
 * clpar_dtype. */
CLPAR_API const char *clpar_dtype_name(clpar_dtype dtype);

/* 1 to 8 dimensions, every one >= 1. An int tensor (the _dtype functions below) may also
 * have 0 dimensions (ndim 0, shape NULL: one element, PyTorch's shape []), as BatchNorm's
 * num_batches_tracked has. */
CLPAR_API clpar_status clpar_tensor_zeros(clpar_device *dev, int ndim, const int64_t *shape,
                                          clpar_tensor **out);
/* Copies numel floats from data (row-major). */
CLPAR_API clpar_status clpar_tensor_from_host(clpar_device *dev, int ndim, const int64_t *shape,
                                              const float *data, clpar_tensor **out);
/* A tensor of dtype filled with zeros. */
CLPAR_API clpar_status clpar_tensor_zeros_dtype(clpar_device *dev, clpar_dtype dtype, int ndim,
                                                const int64_t *shape, clpar_tensor **out);
/* Copies numel elements of dtype (numel * clpar_dtype_size(dtype) bytes) from data. */
CLPAR_API clpar_status clpar_tensor_from_host_dtype(clpar_device *dev, clpar_dtype dtype, int ndim,
                                                    const int64_t *shape, const void *data,
                                                    clpar_tensor **out);
/* Uniform in [lo, hi) from a counter-based generator: the same seed gives the same values on
 * every device and backend. A shape larger than one buffer of dev allows is
 * CLPAR_ERROR_TOO_LARGE, found before any work; host memory used is at most 4 MiB. */
CLPAR_API clpar_status clpar_tensor_rand_uniform(clpar_device *dev, int ndim, const int64_t *shape,
                                                 uint64_t seed, float lo, float hi,
                                                 clpar_tensor **out);
/* Standard normal (Box-Muller over the same generator), times std plus mean. */
CLPAR_API clpar_status clpar_tensor_rand_normal(clpar_device *dev, int ndim, const int64_t *shape,
                                                uint64_t seed, float mean, float std,
                                                clpar_tensor **out);

/* Waits for the tensor's device and copies numel floats into dst; dst_count is the capacity
 * of dst in floats. A tensor of another dtype is CLPAR_ERROR_DTYPE (use read_raw). */
CLPAR_API clpar_status clpar_tensor_read(const clpar_tensor *t, float *dst, size_t dst_count);
/* Overwrites the tensor's values from host memory (numel floats); float32 tensors only. */
CLPAR_API clpar_status clpar_tensor_write(clpar_tensor *t, const float *src, size_t src_count);
/* Any dtype: the numel * clpar_dtype_size bytes of the tensor's elements, as they are, to or
 * from host memory of dst_bytes / src_bytes (at least that many; CLPAR_ERROR_BUFFER_TOO_SMALL
 * otherwise). read_raw waits for the device, as clpar_tensor_read does. */
CLPAR_API clpar_status clpar_tensor_read_raw(const clpar_tensor *t, void *dst, size_t dst_bytes);
CLPAR_API clpar_status clpar_tensor_write_raw(clpar_tensor *t, const void *src, size_t src_bytes);
/* A new tensor on dev with t's values; works across backends and OpenCL platforms. */
CLPAR_API clpar_status clpar_tensor_to(const clpar_tensor *t, clpar_device *dev,
                                       clpar_tensor **out);
/* Rows [start, start+count) of t as a view sharing t's memory. */
CLPAR_API clpar_status clpar_tensor_rows(clpar_tensor *t, int64_t start, int64_t count,
                                         clpar_tensor **out);
/* The same memory seen with another shape of the same numel (torch's view): one dimension
 * may be -1, inferred from the others. Differentiable, no copy. */
CLPAR_API clpar_status clpar_tensor_reshape(clpar_tensor *t, int ndim, const int64_t *shape,
                                            clpar_tensor **out);
/* torch.flatten: dimensions start_dim..end_dim (negative: from the end) merged into one; a
 * view of the same memory, differentiable. start_dim == end_dim gives t's shape. */
CLPAR_API clpar_status clpar_tensor_flatten(clpar_tensor *t, int start_dim, int end_dim,
                                            clpar_tensor **out);

CLPAR_API clpar_tensor *clpar_tensor_retain(clpar_tensor *t);
CLPAR_API void clpar_tensor_free(clpar_tensor *t);

CLPAR_API int clpar_tensor_ndim(const clpar_tensor *t);
/* Size of dimension i; negative i counts from the end. 0 for an index out of range. */
CLPAR_API int64_t clpar_tensor_dim(const clpar_tensor *t, int i);
CLPAR_API int64_t clpar_tensor_numel(const clpar_tensor *t);
/* The tensor's element type (CLPAR_FLOAT32 for NULL). */
CLPAR_API clpar_dtype clpar_tensor_dtype(const clpar_tensor *t);
CLPAR_API clpar_device *clpar_tensor_device(const clpar_tensor *t);
/* "[15, 5]" into buf (always terminated); returns buf. */
CLPAR_API char *clpar_tensor_shape_str(const clpar_tensor *t, char *buf, size_t size);

/* Scopes: every tensor created on this thread while the scope is the innermost open one
 * belongs to it; clpar_scope_end releases them. Scopes nest: ending a scope also ends the
 * scopes still open inside it (an error path may end an outer scope first), and ending a
 * scope that has already ended does nothing. A scope must be ended on the thread that began
 * it (elsewhere clpar_scope_end logs an error and leaves it open). */
CLPAR_API clpar_scope *clpar_scope_begin(void);
CLPAR_API void clpar_scope_end(clpar_scope *scope);

#ifdef __cplusplus
}
#endif
#endif
