/* cuda_tensor_ops.c — the CUDA backend's tensor-op entries for transformers (backend.h):
 * each one launcher of kernels/cuda/tensor_ops.cu run as a profiled op of the device's
 * stream. */
#include "cuda/cuda_internal.h"

/* Runs one launcher as a profiled op of the device's stream. */
#define CUDA_OP(d, what, call)                                                \
  do {                                                                        \
    prof_pair prof_;                                                          \
    clpar_status s_ = clpar_cuda_op_begin((d), &prof_);                       \
    if (s_ == CLPAR_OK) s_ = clpar_cuda_check((call), what " kernel launch"); \
    return clpar_cuda_op_end((d), &prof_, s_);                                \
  } while (0)

/* A word pointer: offsets count 4-byte words whatever the dtype. */
static uint32_t *words(clpar_bref r) {
  return (uint32_t *)r.buf + r.off;
}

clpar_status cuda_strided_copy(void *dev, clpar_strided_geom g, clpar_bref in, clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "strided_copy", clpar_cuda_strided_copy(d->stream, g, words(in), words(out)));
}

clpar_status cuda_pointwise(void *dev, clpar_pointwise_kind kind, size_t n, float p, clpar_bref x,
                            clpar_bref g, clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "pointwise",
          clpar_cuda_pointwise(d->stream, (int)kind, n, p, at(x), g.buf ? at(g) : NULL, at(out)));
}

clpar_status cuda_mask_upper(void *dev, size_t batch, size_t rows, size_t cols, int64_t diagonal,
                             float value, clpar_bref a, clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "mask_upper",
          clpar_cuda_mask_upper(d->stream, batch, rows, cols, diagonal, value, at(a), at(out)));
}

clpar_status cuda_argmax(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "argmax",
          clpar_cuda_argmax(d->stream, rows, cols, at(a), (int64_t *)(void *)words(out)));
}

clpar_status cuda_nll_ignore(void *dev, size_t rows, size_t cols, int idx64, int64_t ignore,
                             clpar_bref a, clpar_bref idx, clpar_bref loss, clpar_bref weight) {
  cuda_dev *d = dev;
  CUDA_OP(d, "nll_ignore",
          clpar_cuda_nll_ignore(d->stream, rows, cols, idx64, ignore, at(a), words(idx), at(loss),
                                at(weight)));
}

clpar_status cuda_xent(void *dev, size_t rows, size_t cols, int idx64, int64_t ignore, clpar_bref a,
                       clpar_bref idx, clpar_bref loss, clpar_bref weight) {
  cuda_dev *d = dev;
  CUDA_OP(d, "xent",
          clpar_cuda_xent(d->stream, rows, cols, idx64, ignore, at(a), words(idx), at(loss),
                          at(weight)));
}

clpar_status cuda_xent_backward(void *dev, size_t rows, size_t cols, int idx64, int64_t ignore,
                                clpar_bref a, clpar_bref idx, clpar_bref g, clpar_bref count,
                                float alpha, clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "xent_backward",
          clpar_cuda_xent_backward(d->stream, rows, cols, idx64, ignore, at(a), words(idx), at(g),
                                   count.buf ? at(count) : NULL, alpha, at(out)));
}

clpar_status cuda_nll_ignore_backward(void *dev, size_t rows, size_t cols, int idx64,
                                      int64_t ignore, clpar_bref idx, clpar_bref scale,
                                      clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "nll_ignore_backward",
          clpar_cuda_nll_ignore_backward(d->stream, rows, cols, idx64, ignore, words(idx),
                                         at(scale), at(out)));
}
