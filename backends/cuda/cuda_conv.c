/* cuda_conv.c — the CUDA backend's convolution (im2col, col2im), pooling and batch-norm
 * entries: each one launcher of kernels/cuda/ run as a profiled op of the device's stream. */
#include "cuda/cuda_internal.h"

/* ---- convolution, pooling, batch norm ---- */

/* An optional input: NULL when absent. */
static float *opt(clpar_bref r) {
  return r.buf ? at(r) : NULL;
}

/* Runs one launcher as a profiled op of the device's stream. */
#define CUDA_OP(d, what, call)                                                \
  do {                                                                        \
    prof_pair prof_;                                                          \
    clpar_status s_ = clpar_cuda_op_begin((d), &prof_);                       \
    if (s_ == CLPAR_OK) s_ = clpar_cuda_check((call), what " kernel launch"); \
    return clpar_cuda_op_end((d), &prof_, s_);                                \
  } while (0)

clpar_status cuda_im2col(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref col) {
  cuda_dev *d = dev;
  CUDA_OP(d, "im2col", clpar_cuda_im2col(d->stream, g, at(x), at(col)));
}

clpar_status cuda_col2im(void *dev, clpar_conv_geom g, clpar_bref col, clpar_bref x) {
  cuda_dev *d = dev;
  CUDA_OP(d, "col2im", clpar_cuda_col2im(d->stream, g, at(col), at(x)));
}

clpar_status cuda_swap01(void *dev, size_t a, size_t b, size_t p, clpar_bref in, clpar_bref bias,
                         clpar_bref out) {
  cuda_dev *d = dev;
  CUDA_OP(d, "swap01", clpar_cuda_swap01(d->stream, a, b, p, at(in), opt(bias), at(out)));
}

static int32_t *at_i32w(clpar_bref r) {
  return (int32_t *)r.buf + r.off;
}

clpar_status cuda_maxpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y,
                          clpar_bref idx) {
  cuda_dev *d = dev;
  CUDA_OP(d, "maxpool", clpar_cuda_maxpool(d->stream, g, at(x), at(y), at_i32w(idx)));
}

clpar_status cuda_maxpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy, clpar_bref idx,
                                   clpar_bref dx) {
  cuda_dev *d = dev;
  CUDA_OP(d, "maxpool_backward",
          clpar_cuda_maxpool_backward(d->stream, g, at(dy), at_i32(idx), at(dx)));
}

clpar_status cuda_avgpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y) {
  cuda_dev *d = dev;
  CUDA_OP(d, "avgpool", clpar_cuda_avgpool(d->stream, g, at(x), at(y)));
}

clpar_status cuda_avgpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy, clpar_bref dx) {
  cuda_dev *d = dev;
  CUDA_OP(d, "avgpool_backward", clpar_cuda_avgpool_backward(d->stream, g, at(dy), at(dx)));
}

clpar_status cuda_bn_stats(void *dev, size_t n, size_t c, size_t p, clpar_bref x, clpar_bref mean,
                           clpar_bref var, clpar_bref running_mean, clpar_bref running_var,
                           float momentum) {
  cuda_dev *d = dev;
  CUDA_OP(d, "bn_stats",
          clpar_cuda_bn_stats(d->stream, n, c, p, at(x), at(mean), at(var), opt(running_mean),
                              opt(running_var), momentum));
}

clpar_status cuda_bn_apply(void *dev, size_t n, size_t c, size_t p, clpar_bref x, clpar_bref mean,
                           clpar_bref var, clpar_bref weight, clpar_bref bias, float eps,
                           clpar_bref y) {
  cuda_dev *d = dev;
  CUDA_OP(d, "bn_apply",
          clpar_cuda_bn_apply(d->stream, n, c, p, at(x), at(mean), at(var), opt(weight), opt(bias),
                              eps, at(y)));
}

clpar_status cuda_bn_backward_sums(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                   clpar_bref g, clpar_bref mean, clpar_bref var, float eps,
                                   clpar_bref sum_g, clpar_bref sum_gxhat) {
  cuda_dev *d = dev;
  CUDA_OP(d, "bn_backward_sums",
          clpar_cuda_bn_backward_sums(d->stream, n, c, p, at(x), at(g), at(mean), at(var), eps,
                                      at(sum_g), at(sum_gxhat)));
}

clpar_status cuda_bn_backward(void *dev, size_t n, size_t c, size_t p, clpar_bref x, clpar_bref g,
                              clpar_bref mean, clpar_bref var, clpar_bref weight, float eps,
                              clpar_bref sum_g, clpar_bref sum_gxhat, int training, clpar_bref dx) {
  cuda_dev *d = dev;
  CUDA_OP(d, "bn_backward",
          clpar_cuda_bn_backward(d->stream, n, c, p, at(x), at(g), at(mean), at(var), opt(weight),
                                 eps, opt(sum_g), opt(sum_gxhat), training, at(dx)));
}
