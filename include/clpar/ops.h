/* ops.h — operations on tensors. Each one checks its arguments, enqueues its work on the
 * device of its inputs and returns without waiting; only reading a value back waits.
 * On any error nothing is allocated and nothing is changed. All inputs of one op must be on
 * one device (clpar_tensor_to moves a tensor). */
#ifndef CLPAR_OPS_H
#define CLPAR_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* In place: every element of t becomes value (an int tensor: 0 only). */
CLPAR_API clpar_status clpar_fill(clpar_tensor *t, float value);
/* In place: dst takes src's values; same numel and dtype, any two devices. */
CLPAR_API clpar_status clpar_copy(clpar_tensor *dst, const clpar_tensor *src);

/* out = a (op) b. b has a's shape, or is one row (shape [cols] or [1, cols]) that is
 * broadcast over every row of a (a seen as [rows, cols] with cols its last dimension). */
CLPAR_API clpar_status clpar_add(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out);
CLPAR_API clpar_status clpar_sub(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out);
CLPAR_API clpar_status clpar_mul(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out);
/* out = alpha * a */
CLPAR_API clpar_status clpar_scale(const clpar_tensor *a, float alpha, clpar_tensor **out);

/* out = op(a) @ op(b) for 2-D a and b, op = transpose when trans_* is nonzero. */
CLPAR_API clpar_status clpar_matmul(const clpar_tensor *a, const clpar_tensor *b, int trans_a,
                                    int trans_b, clpar_tensor **out);
/* BLAS-style, in place: c = alpha * op(a) @ op(b) + beta * c. c must not share memory with a
 * or b (CLPAR_ERROR_INVALID_ARGUMENT on every backend); views of disjoint rows are fine. */
CLPAR_API clpar_status clpar_gemm(int trans_a, int trans_b, float alpha, const clpar_tensor *a,
                                  const clpar_tensor *b, float beta, clpar_tensor *c);

/* Sum over rows (dim 0): a of shape [rows, cols...] gives [cols...]; 1-D a gives [1]. */
CLPAR_API clpar_status clpar_sum_rows(const clpar_tensor *a, clpar_tensor **out);

/* Reductions along dimensions (torch.sum / mean / var with dim=...): dims lists n_dims
 * distinct dimensions of x (negative: from the end), or dims NULL and n_dims 0 for every
 * dimension. keepdim: the reduced dimensions stay, of size 1; otherwise they are dropped (a
 * result with no dimension left is [1]). var: unbiased divides by the count minus one
 * (Bessel; NaN for one element, as torch), else by the count; computed in two passes (the
 * mean, then the squared deviations from it). Differentiable; float32 only. */
CLPAR_API clpar_status clpar_sum_dims(const clpar_tensor *x, const int *dims, int n_dims,
                                      int keepdim, clpar_tensor **out);
CLPAR_API clpar_status clpar_mean_dims(const clpar_tensor *x, const int *dims, int n_dims,
                                       int keepdim, clpar_tensor **out);
CLPAR_API clpar_status clpar_var_dims(const clpar_tensor *x, const int *dims, int n_dims,
                                      int unbiased, int keepdim, clpar_tensor **out);
/* torch's x.expand(shape).contiguous(): x has ndim dimensions, each equal to shape's or 1,
 * and is repeated along the 1s into a new tensor of shape (x itself, as a view, when nothing
 * is repeated). Differentiable: the gradient is summed back over the repeated dims. */
CLPAR_API clpar_status clpar_expand(const clpar_tensor *x, int ndim, const int64_t *shape,
                                    clpar_tensor **out);

/* Concatenate n tensors along dim 0 (same trailing shape, dtype and device) into a new
 * tensor; any dtype. */
CLPAR_API clpar_status clpar_concat(clpar_tensor *const *parts, int n, clpar_tensor **out);
/* Split along dim 0 into n views with the given row counts, which must add up to dim 0; any
 * dtype. */
CLPAR_API clpar_status clpar_split(clpar_tensor *t, const int64_t *sizes, int n,
                                   clpar_tensor **outs);
/* torch.chunk sizes: chunk = ceil(rows / k); writes up to k sizes and returns how many chunks
 * there are (fewer than k when rows is small), or a negative clpar_status. */
CLPAR_API int clpar_chunk_sizes(int64_t rows, int k, int64_t *sizes);

#ifdef __cplusplus
}
#endif
#endif
