/* cuda_kernels.h — the launchers of clpar's own CUDA kernels (kernels/cuda/, one family per
 * .cu file), declared with C linkage so that the backend (backends/cuda/cuda_backend.c) stays
 * plain C11 and only the .cu files need nvcc.
 *
 * Every launcher enqueues on stream and returns without waiting; the cudaError_t it returns
 * reports a bad launch (configuration, no kernel image for this GPU), not the kernel's
 * outcome, which surfaces at the next synchronizing call. Pointers already include the
 * element offsets. The formulas are backend.h's, whose types (clpar_unary_kind, the
 * optimizer arguments) the launchers take as they are. */
#ifndef CLPAR_CUDA_KERNELS_H
#define CLPAR_CUDA_KERNELS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gather: out[r] = a[r * cols + idx[r]]; scatter: out[r * cols + idx[r]] = a[r]; r < rows
 * (kernels/cuda/index.cu) */
cudaError_t clpar_cuda_pick(cudaStream_t stream, int scatter, size_t rows, size_t cols,
                            const int32_t *idx, const float *a, float *out);
/* out[i] = value, i < n (kernels/cuda/fill.cu) */
cudaError_t clpar_cuda_fill(cudaStream_t stream, float *out, size_t n, float value);

/* cudaSuccess when the current device can run clpar's kernels; cudaErrorNoKernelImageForDevice
 * (or similar) when the build's architectures do not cover it (kernels/cuda/fill.cu). */
cudaError_t clpar_cuda_kernel_image_check(void);

/* out[r,c] = a[r,c] (op) b[b_rows == 1 ? 0 : r, c]; kind is a clpar_binary_kind: add, sub,
 * mul or div (kernels/cuda/binary.cu). out may alias a or b. An unknown kind returns
 * cudaErrorInvalidValue. */
cudaError_t clpar_cuda_binary(cudaStream_t stream, int kind, size_t rows, size_t cols,
                              const float *a, const float *b, size_t b_rows, float *out);

/* out[i] = alpha * a[i] (kernels/cuda/scale.cu); out may alias a. */
cudaError_t clpar_cuda_scale(cudaStream_t stream, size_t n, float alpha, const float *a,
                             float *out);

/* out[c] = sum over r < rows of a[r, c] (kernels/cuda/sum_rows.cu). A tall matrix with few
 * columns is summed in two passes through scratch, a device buffer of at least
 * clpar_cuda_sum_rows_scratch(rows, cols) floats that no other work on the stream may use
 * until both passes have run (stream order gives that to the next op); scratch may be NULL
 * when that count is 0, and a NULL scratch where one is needed is cudaErrorInvalidValue. */
size_t clpar_cuda_sum_rows_scratch(size_t rows, size_t cols);
cudaError_t clpar_cuda_sum_rows(cudaStream_t stream, size_t rows, size_t cols, const float *a,
                                float *out, float *scratch);

/* ---- training ---- */

/* out[r, c] = a[c], r < rows, c < cols (kernels/cuda/broadcast_rows.cu) */
cudaError_t clpar_cuda_broadcast_rows(cudaStream_t stream, size_t rows, size_t cols, const float *a,
                                      float *out);

/* out[i] = f(a[i]) and out[i] = g[i] * f'(saved[i]) (kernels/cuda/activation.cu); out may
 * alias a (forward) or g (backward). An unknown kind returns cudaErrorInvalidValue, and so
 * does a forward-only kind (exp, sqrt, neg) given to the backward. */
cudaError_t clpar_cuda_unary(cudaStream_t stream, clpar_unary_kind kind, size_t n, const float *a,
                             float *out);
cudaError_t clpar_cuda_unary_backward(cudaStream_t stream, clpar_unary_kind kind, size_t n,
                                      const float *g, const float *saved, float *out);

/* The fused Linear epilogues (kernels/cuda/activation.cu), backend.h's bias_act and
 * bias_act_backward: out = f(a + bias[col]); d = g f'(y), out = d (out may be NULL or alias
 * g), db (+)= column sums of d (db may be NULL). One block per 32 columns for the backward: a
 * narrow, tall matrix is slow but correct. An unknown act returns cudaErrorInvalidValue. */
cudaError_t clpar_cuda_bias_act(cudaStream_t stream, clpar_act_kind act, size_t rows, size_t cols,
                                const float *a, const float *bias, float *out);
cudaError_t clpar_cuda_bias_act_backward(cudaStream_t stream, clpar_act_kind act, size_t rows,
                                         size_t cols, const float *g, const float *y, float *out,
                                         float *db, int accumulate);

/* Row-wise softmax (log == 0) or log-softmax and its gradient from the output y
 * (kernels/cuda/softmax.cu); out may alias the input. */
cudaError_t clpar_cuda_softmax(cudaStream_t stream, int log, size_t rows, size_t cols,
                               const float *a, float *out);
cudaError_t clpar_cuda_softmax_backward(cudaStream_t stream, int log, size_t rows, size_t cols,
                                        const float *y, const float *g, float *out);

/* out[r] = -a[r, labels[r]] (kernels/cuda/softmax.cu) */
cudaError_t clpar_cuda_nll(cudaStream_t stream, size_t rows, size_t cols, const float *a,
                           const int32_t *labels, float *out);
/* out[r, labels[r]] = -g[r] and nothing else: the caller zeroes out first
 * (kernels/cuda/softmax.cu). */
cudaError_t clpar_cuda_nll_backward(cudaStream_t stream, size_t rows, size_t cols,
                                    const int32_t *labels, const float *g, float *out);

/* In place, n elements; buf is not touched when args->momentum == 0 (kernels/cuda/optim.cu).
 * args is read before the launcher returns (the kernel gets a copy). */
cudaError_t clpar_cuda_sgd_step(cudaStream_t stream, size_t n, float *param, const float *grad,
                                float *buf, const clpar_sgd_args *args);
cudaError_t clpar_cuda_adam_step(cudaStream_t stream, size_t n, float *param, const float *grad,
                                 float *m, float *v, const clpar_adam_args *args);

/* With a seen as [outer, red, inner]: reduce_sum out[o * inner + i] = sum over r of
 * a[(o * red + r) * inner + i]; expand out[(o * red + r) * inner + i] = a[o * inner + i]
 * (kernels/cuda/reduce_dims.cu). */
cudaError_t clpar_cuda_reduce_sum(cudaStream_t stream, size_t outer, size_t red, size_t inner,
                                  const float *a, float *out);
cudaError_t clpar_cuda_expand(cudaStream_t stream, size_t outer, size_t red, size_t inner,
                              const float *a, float *out);
/* ---- convolution, pooling, batch norm (backend.h's formulas) ---- */

/* kernels/cuda/conv.cu: im2col, col2im (adds into x) and the [a, b, p] -> [b, a, p] swap
 * (bias may be NULL). */
cudaError_t clpar_cuda_im2col(cudaStream_t stream, clpar_conv_geom g, const float *x, float *col);
cudaError_t clpar_cuda_col2im(cudaStream_t stream, clpar_conv_geom g, const float *col, float *x);
cudaError_t clpar_cuda_swap01(cudaStream_t stream, size_t a, size_t b, size_t p, const float *in,
                              const float *bias, float *out);
/* kernels/cuda/pool.cu */
cudaError_t clpar_cuda_maxpool(cudaStream_t stream, clpar_conv_geom g, const float *x, float *y,
                               int32_t *idx);
cudaError_t clpar_cuda_maxpool_backward(cudaStream_t stream, clpar_conv_geom g, const float *dy,
                                        const int32_t *idx, float *dx);
cudaError_t clpar_cuda_avgpool(cudaStream_t stream, clpar_conv_geom g, const float *x, float *y);
cudaError_t clpar_cuda_avgpool_backward(cudaStream_t stream, clpar_conv_geom g, const float *dy,
                                        float *dx);
/* kernels/cuda/batchnorm.cu; weight, bias, running_mean/var may be NULL (running_var is
 * updated when running_mean is given). */
cudaError_t clpar_cuda_bn_stats(cudaStream_t stream, size_t n, size_t c, size_t p, const float *x,
                                float *mean, float *var, float *running_mean, float *running_var,
                                float momentum);
cudaError_t clpar_cuda_bn_apply(cudaStream_t stream, size_t n, size_t c, size_t p, const float *x,
                                const float *mean, const float *var, const float *weight,
                                const float *bias, float eps, float *y);
cudaError_t clpar_cuda_bn_backward_sums(cudaStream_t stream, size_t n, size_t c, size_t p,
                                        const float *x, const float *g, const float *mean,
                                        const float *var, float eps, float *sum_g,
                                        float *sum_gxhat);
cudaError_t clpar_cuda_bn_backward(cudaStream_t stream, size_t n, size_t c, size_t p,
                                   const float *x, const float *g, const float *mean,
                                   const float *var, const float *weight, float eps,
                                   const float *sum_g, const float *sum_gxhat, int training,
                                   float *dx);

/* The tensor ops of transformers, as backend.h's entries of the same names; pointers with
 * their offsets (words for strided_copy and the int targets) (kernels/cuda/tensor_ops.cu). */
cudaError_t clpar_cuda_strided_copy(cudaStream_t stream, clpar_strided_geom g, const uint32_t *in,
                                    uint32_t *out);
/* g NULL: forward; otherwise the backward (kind: clpar_pointwise_kind). */
cudaError_t clpar_cuda_pointwise(cudaStream_t stream, int kind, size_t n, float p, const float *x,
                                 const float *g, float *out);
cudaError_t clpar_cuda_mask_upper(cudaStream_t stream, size_t batch, size_t rows, size_t cols,
                                  int64_t diagonal, float value, const float *a, float *out);
cudaError_t clpar_cuda_argmax(cudaStream_t stream, size_t rows, size_t cols, const float *a,
                              int64_t *out);
/* Softmax cross-entropy and its gradient, backend.h's xent entries (kernels/cuda/softmax.cu);
 * count NULL: s = alpha * g[0]. */
cudaError_t clpar_cuda_xent(cudaStream_t stream, size_t rows, size_t cols, int idx64,
                            int64_t ignore, const float *a, const void *idx, float *loss,
                            float *weight);
cudaError_t clpar_cuda_xent_backward(cudaStream_t stream, size_t rows, size_t cols, int idx64,
                                     int64_t ignore, const float *a, const void *idx,
                                     const float *g, const float *count, float alpha, float *out);
cudaError_t clpar_cuda_nll_ignore(cudaStream_t stream, size_t rows, size_t cols, int idx64,
                                  int64_t ignore, const float *a, const void *idx, float *loss,
                                  float *weight);
cudaError_t clpar_cuda_nll_ignore_backward(cudaStream_t stream, size_t rows, size_t cols, int idx64,
                                           int64_t ignore, const void *idx, const float *scale,
                                           float *out);

/* The transformer layers, as backend.h's entries of the same names; w, b, dx, dw, db may be
 * NULL where the entry's buf may be (kernels/cuda/layers.cu). */
cudaError_t clpar_cuda_embedding(cudaStream_t stream, size_t n, size_t num, size_t dim, int idx64,
                                 const void *idx, const float *w, float *out);
cudaError_t clpar_cuda_embedding_backward(cudaStream_t stream, size_t n, size_t num, size_t dim,
                                          int idx64, const void *idx, const float *g, float *dw);
cudaError_t clpar_cuda_layernorm(cudaStream_t stream, size_t rows, size_t cols, float eps,
                                 const float *x, const float *w, const float *b, float *y,
                                 float *mean, float *rstd);
cudaError_t clpar_cuda_layernorm_backward(cudaStream_t stream, size_t rows, size_t cols,
                                          const float *x, const float *g, const float *mean,
                                          const float *rstd, const float *w, float *dx, float *dw,
                                          float *db);
cudaError_t clpar_cuda_dropout_mask(cudaStream_t stream, size_t n, uint64_t seed, uint64_t offset,
                                    float p, float scale, float *out);
/* half.cu: n elements from float32 to a 16-bit type (to_half) or back; pointers at element 0 */
cudaError_t clpar_cuda_half_convert(cudaStream_t stream, int to_half, int bf16, size_t n, void *x,
                                    void *out);

#ifdef __cplusplus
}
#endif
#endif
