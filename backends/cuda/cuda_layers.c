/* cuda_layers.c — the CUDA backend's entries of the transformer layers (backend.h): each
 * one launcher of kernels/cuda/layers.cu run as a profiled op of the device's stream. */
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
static const uint32_t *words(clpar_bref r) {
  return (const uint32_t *)r.buf + r.off;
}

static float *opt(clpar_bref r) {
  return r.buf ? at(r) : NULL;
}

clpar_status cuda_embedding(void *dev, size_t n, size_t num, size_t dim, int idx64, clpar_bref idx,
                            clpar_bref w, clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "embedding",
          clpar_cuda_embedding(d->stream, n, num, dim, idx64, words(idx), at(w), at(out)));
}

clpar_status cuda_embedding_backward(void *dev, size_t n, size_t num, size_t dim, int idx64,
                                     clpar_bref idx, clpar_bref g, clpar_bref dw) {
  cuda_dev *d = dev;
  CUDA_OP(d, "embedding_backward",
          clpar_cuda_embedding_backward(d->stream, n, num, dim, idx64, words(idx), at(g), at(dw)));
}

clpar_status cuda_layernorm(void *dev, size_t rows, size_t cols, float eps, clpar_bref x,
                            clpar_bref w, clpar_bref b, clpar_bref y, clpar_bref mean,
                            clpar_bref rstd) {
  cuda_dev *d = dev;
  CUDA_OP(d, "layernorm",
          clpar_cuda_layernorm(d->stream, rows, cols, eps, at(x), opt(w), opt(b), at(y), at(mean),
                               at(rstd)));
}

clpar_status cuda_layernorm_backward(void *dev, size_t rows, size_t cols, clpar_bref x,
                                     clpar_bref g, clpar_bref mean, clpar_bref rstd, clpar_bref w,
                                     clpar_bref dx, clpar_bref dw, clpar_bref db) {
  cuda_dev *d = dev;
  CUDA_OP(d, "layernorm_backward",
          clpar_cuda_layernorm_backward(d->stream, rows, cols, at(x), at(g), at(mean), at(rstd),
                                        opt(w), opt(dx), opt(dw), opt(db)));
}

clpar_status cuda_dropout_mask(void *dev, size_t n, uint64_t seed, uint64_t offset, float p,
                               float scale, clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "dropout_mask",
          clpar_cuda_dropout_mask(d->stream, n, seed, offset, p, scale, at(out)));
}
