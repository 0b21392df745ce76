/* conv_cudnn.h — cuDNN called directly on one convolution shape, as the reference bench/conv.c
 * puts beside clpar's layers on a CUDA device (bench/conv_cudnn.c). */
#ifndef CLPAR_BENCH_CONV_CUDNN_H
#define CLPAR_BENCH_CONV_CUDNN_H

#include <stdint.h>

/* One 2-D convolution: x [n, c, side, side], weight [o, c, k, k], square stride and padding,
 * dilation 1, one group. */
typedef struct {
  int n, c, side, o, k, stride, pad;
} cudnn_shape;

/* Best-of-rounds seconds of each pass with the algorithm cudnnFind chose (PyTorch's benchmark
 * mode), and the algorithms' numbers. */
typedef struct {
  double fwd, bwd_data, bwd_filter;
  int algo_fwd, algo_data, algo_filter;
} cudnn_times;

/* cuDNN on CUDA device `ordinal` (the N of clpar's "cuda:N"): forward, backward data and
 * backward filter of s, each timed alone on buffers of its own (random data), full fp32 math
 * unless tf32 (as CLPAR_CUDA_TF32=1 asks of clpar's cuDNN path). Returns 1 and fills *t, or
 * 0 with the reason on stderr. */
int cudnn_ref_time(int ordinal, const cudnn_shape *s, int tf32, cudnn_times *t);

#endif
