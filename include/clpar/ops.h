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
/* In place: dst takes src's values; src has dst's shape (or dst's less leading 1s: a
 * broadcast that repeats no element) and dtype, any two devices. Another shape of the same
 * numel is refused (CLPAR_ERROR_SHAPE_MISMATCH), as torch.Tensor.copy_ does. */
CLPAR_API clpar_status clpar_copy(clpar_tensor *dst, const clpar_tensor *src);

/* out = a (op) b. b has a's shape, or is one row (shape [cols] or [1, cols]) that is
 * broadcast over every row of a (a seen as [rows, cols] with cols its last dimension). */
CLPAR_API clpar_status clpar_add(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out);
CLPAR_API clpar_status clpar_sub(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out);
CLPAR_API clpar_status clpar_mul(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out);
/* torch.div (true division, IEEE: x / 0 is inf or NaN); the same shapes as add. */
CLPAR_API clpar_status clpar_div(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out);
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

/* ---- tensor ops for transformers ----
 * Tensors are contiguous: an op below returns a view of x's memory where its result keeps the
 * elements' order (noted per op), and otherwise a new tensor written by one strided copy.
 * Either way the result is differentiable and behaves as the PyTorch expression named, made
 * .contiguous(). dim arguments may be negative (from the end). */

/* torch.permute(x, dims).contiguous(): out's dimension i is x's dims[i]; ndim == x's. A view
 * when only dimensions of size 1 move. Any dtype. */
CLPAR_API clpar_status clpar_permute(const clpar_tensor *x, const int *dims, int ndim,
                                     clpar_tensor **out);
/* torch.transpose(x, dim0, dim1).contiguous(): a permute that swaps two dimensions. */
CLPAR_API clpar_status clpar_transpose(const clpar_tensor *x, int dim0, int dim1,
                                       clpar_tensor **out);
/* torch.narrow(x, dim, start, length): length >= 1 elements from start along dim (within it,
 * else CLPAR_ERROR_INDEX). A view when every dimension before dim has size 1 (dim 0
 * always); otherwise a copy. Any dtype. */
CLPAR_API clpar_status clpar_narrow(const clpar_tensor *x, int dim, int64_t start, int64_t length,
                                    clpar_tensor **out);
/* torch.cat(parts, dim): n >= 1 tensors of one dtype and device, equal in every dimension but
 * dim, into a new tensor. Any dtype. */
CLPAR_API clpar_status clpar_cat(clpar_tensor *const *parts, int n, int dim, clpar_tensor **out);
/* torch.split(t, sizes, dim): n parts of sizes[i] >= 1 along dim (the sizes add up to t's
 * dimension), each a clpar_narrow (views when narrow gives views). */
CLPAR_API clpar_status clpar_split_dim(const clpar_tensor *t, int dim, const int64_t *sizes, int n,
                                       clpar_tensor **outs);
/* torch.matmul for batches: a [B..., m, k] (trans_a: [B..., k, m], used transposed) and b
 * [B..., k, n] (trans_b: [B..., n, k]) with the same leading dimensions B... give
 * [B..., m, n]; one of them may be 2-D instead, shared by every batch (x [B, T, C] @ W
 * [C, N]; its gradient is summed over the batches). One strided batched GEMM (CLBlast,
 * cuBLAS, OpenBLAS per matrix on the host). A permuted operand (say k of attention's
 * [B, T, H, D] as [B, H, T, D]) is first made with clpar_permute; trans_b then gives
 * q @ k^T without another copy. */
CLPAR_API clpar_status clpar_bmm(const clpar_tensor *a, const clpar_tensor *b, int trans_a,
                                 int trans_b, clpar_tensor **out);
/* x.masked_fill(torch.ones(R, C).triu(diagonal).bool(), value) over the last two dimensions
 * [R, C] of x (ndim >= 2): elements with column - row >= diagonal become value. The masked
 * elements get no gradient. */
CLPAR_API clpar_status clpar_masked_fill_upper(const clpar_tensor *x, int64_t diagonal, float value,
                                               clpar_tensor **out);
/* The causal mask of attention scores [..., T, T]: clpar_masked_fill_upper(scores, 1, -inf):
 * a query at row i sees keys 0 .. i. */
CLPAR_API clpar_status clpar_causal_mask(const clpar_tensor *scores, clpar_tensor **out);

/* Element-wise, float32, differentiable: torch.exp, torch.log (clpar_ln: clpar_log is the
 * logger of log.h), torch.sqrt and torch.pow(x, exponent) with a scalar exponent (x^0 is 1 with
 * gradient 0; a negative x to a non-integer power is NaN, as in torch). */
CLPAR_API clpar_status clpar_exp(const clpar_tensor *x, clpar_tensor **out);
CLPAR_API clpar_status clpar_ln(const clpar_tensor *x, clpar_tensor **out);
CLPAR_API clpar_status clpar_sqrt(const clpar_tensor *x, clpar_tensor **out);
CLPAR_API clpar_status clpar_pow(const clpar_tensor *x, float exponent, clpar_tensor **out);

/* torch.argmax(x, dim=-1): the index (int64 tensor of x's shape without its last dimension;
 * [1] for 1-D x) of the first largest element of each last-dimension row; NaN counts as the
 * largest. Not differentiable. */
CLPAR_API clpar_status clpar_argmax(const clpar_tensor *x, clpar_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
