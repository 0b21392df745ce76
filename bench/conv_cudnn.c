/* conv_cudnn.c — cuDNN's convolution API called directly, without clpar: the reference that
 * bench/conv.c times beside clpar's layers on a CUDA device (conv_cudnn.h).
 *
 * Each pass runs the algorithm cudnnFind*AlgorithmEx timed fastest on the same buffers (as
 * PyTorch's torch.backends.cudnn.benchmark and clpar's cuDNN path choose), with a workspace
 * of up to 1 GiB, then is timed alone: one warm-up call, then the best of five calls, each
 * followed by cudaDeviceSynchronize, on the host's monotonic clock (as bench/conv.c times
 * clpar's passes). */
#include "conv_cudnn.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../samples/sample_clock.h" /* now_seconds */

#define WS_MAX ((size_t)1 << 30)
#define PERF_MAX 16

typedef struct {
  cudnnHandle_t h;
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  float *x, *w, *y, *dy, *dx, *dw;
  void *ws;
  size_t ws_bytes;
} ref;

static int cudnn_ok(cudnnStatus_t st, const char *what) {
  if (st != CUDNN_STATUS_SUCCESS) fprintf(stderr, "%s: %s\n", what, cudnnGetErrorString(st));
  return st == CUDNN_STATUS_SUCCESS;
}

static int cuda_ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess) fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

/* count floats on the device in [-1, 1), from a fixed pattern. */
static int fill(float **p, size_t count) {
  float *host = malloc(count * sizeof *host);
  if (!host) return 0;
  for (size_t i = 0; i < count; i++) host[i] = (float)((i * 7919) % 2003) / 1001.5f - 1.0f;
  int ok = cuda_ok(cudaMalloc((void **)p, count * sizeof **p), "cudaMalloc") &&
           cuda_ok(cudaMemcpy(*p, host, count * sizeof *host, cudaMemcpyHostToDevice), "copy");
  free(host);
  return ok;
}

static int setup(ref *r, const cudnn_shape *s, int tf32) {
  int n, o, oh, ow;
  int ok =
      cudnn_ok(cudnnCreate(&r->h), "cudnnCreate") &&
      cudnn_ok(cudnnCreateTensorDescriptor(&r->xd), "descriptor") &&
      cudnn_ok(cudnnCreateTensorDescriptor(&r->yd), "descriptor") &&
      cudnn_ok(cudnnCreateFilterDescriptor(&r->wd), "descriptor") &&
      cudnn_ok(cudnnCreateConvolutionDescriptor(&r->cd), "descriptor") &&
      cudnn_ok(cudnnSetTensor4dDescriptor(r->xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s->n, s->c,
                                          s->side, s->side),
               "x descriptor") &&
      cudnn_ok(cudnnSetFilter4dDescriptor(r->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s->o, s->c,
                                          s->k, s->k),
               "w descriptor") &&
      cudnn_ok(cudnnSetConvolution2dDescriptor(r->cd, s->pad, s->pad, s->stride, s->stride, 1, 1,
                                               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
               "convolution descriptor") &&
      cudnn_ok(cudnnSetConvolutionMathType(r->cd, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
               "math type") &&
      cudnn_ok(cudnnGetConvolution2dForwardOutputDim(r->cd, r->xd, r->wd, &n, &o, &oh, &ow),
               "output size") &&
      cudnn_ok(cudnnSetTensor4dDescriptor(r->yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, o, oh, ow),
               "y descriptor");
  size_t xn = (size_t)s->n * s->c * s->side * s->side, wn = (size_t)s->o * s->c * s->k * s->k;
  size_t yn = (size_t)n * o * oh * ow;
  size_t free_bytes = 0, total = 0;
  ok = ok && fill(&r->x, xn) && fill(&r->w, wn) && fill(&r->y, yn) && fill(&r->dy, yn) &&
       fill(&r->dx, xn) && fill(&r->dw, wn) &&
       cuda_ok(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  r->ws_bytes = free_bytes / 2 < WS_MAX ? free_bytes / 2 : WS_MAX;
  return ok && cuda_ok(cudaMalloc(&r->ws, r->ws_bytes), "workspace");
}

static void release(ref *r) {
  float *bufs[] = {r->x, r->w, r->y, r->dy, r->dx, r->dw};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
  cudaFree(r->ws);
  if (r->cd) cudnnDestroyConvolutionDescriptor(r->cd);
  if (r->wd) cudnnDestroyFilterDescriptor(r->wd);
  if (r->yd) cudnnDestroyTensorDescriptor(r->yd);
  if (r->xd) cudnnDestroyTensorDescriptor(r->xd);
  if (r->h) cudnnDestroy(r->h);
}

enum { FWD, DATA, FILTER };

/* The fastest algorithm that succeeded, by cudnnFind, or -1. */
static int find(ref *r, int pass) {
  int count = 0, best = -1;
  cudnnStatus_t st;
  if (pass == FWD) {
    cudnnConvolutionFwdAlgoPerf_t p[PERF_MAX];
    st = cudnnFindConvolutionForwardAlgorithmEx(r->h, r->xd, r->x, r->wd, r->w, r->cd, r->yd, r->y,
                                                PERF_MAX, &count, p, r->ws, r->ws_bytes);
    for (int i = 0; i < count && best < 0; i++) /* sorted fastest first */
      if (p[i].status == CUDNN_STATUS_SUCCESS) best = (int)p[i].algo;
  } else if (pass == DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t p[PERF_MAX];
    st =
        cudnnFindConvolutionBackwardDataAlgorithmEx(r->h, r->wd, r->w, r->yd, r->dy, r->cd, r->xd,
                                                    r->dx, PERF_MAX, &count, p, r->ws, r->ws_bytes);
    for (int i = 0; i < count && best < 0; i++)
      if (p[i].status == CUDNN_STATUS_SUCCESS) best = (int)p[i].algo;
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t p[PERF_MAX];
    st = cudnnFindConvolutionBackwardFilterAlgorithmEx(r->h, r->xd, r->x, r->yd, r->dy, r->cd,
                                                       r->wd, r->dw, PERF_MAX, &count, p, r->ws,
                                                       r->ws_bytes);
    for (int i = 0; i < count && best < 0; i++)
      if (p[i].status == CUDNN_STATUS_SUCCESS) best = (int)p[i].algo;
  }
  if (!cudnn_ok(st, "cudnnFind")) return -1;
  if (best < 0) fprintf(stderr, "cudnnFind: no algorithm succeeded (pass %d)\n", pass);
  return best;
}

static int run(ref *r, int pass, int algo) {
  const float one = 1.0f, zero = 0.0f;
  cudnnStatus_t st;
  if (pass == FWD)
    st = cudnnConvolutionForward(r->h, &one, r->xd, r->x, r->wd, r->w, r->cd,
                                 (cudnnConvolutionFwdAlgo_t)algo, r->ws, r->ws_bytes, &zero, r->yd,
                                 r->y);
  else if (pass == DATA)
    st = cudnnConvolutionBackwardData(r->h, &one, r->wd, r->w, r->yd, r->dy, r->cd,
                                      (cudnnConvolutionBwdDataAlgo_t)algo, r->ws, r->ws_bytes,
                                      &zero, r->xd, r->dx);
  else
    st = cudnnConvolutionBackwardFilter(r->h, &one, r->xd, r->x, r->yd, r->dy, r->cd,
                                        (cudnnConvolutionBwdFilterAlgo_t)algo, r->ws, r->ws_bytes,
                                        &zero, r->wd, r->dw);
  return cudnn_ok(st, "cuDNN convolution") && cuda_ok(cudaDeviceSynchronize(), "synchronize");
}

/* Best of five timed calls after one warm-up; negative on failure. */
static double time_pass(ref *r, int pass, int *algo) {
  *algo = find(r, pass);
  if (*algo < 0 || !run(r, pass, *algo)) return -1;
  double best = INFINITY;
  for (int i = 0; i < 5; i++) {
    double t0 = now_seconds();
    if (!run(r, pass, *algo)) return -1;
    best = fmin(best, now_seconds() - t0);
  }
  return best;
}

int cudnn_ref_time(int ordinal, const cudnn_shape *s, int tf32, cudnn_times *t) {
  ref r = {0};
  int ok = cuda_ok(cudaSetDevice(ordinal), "cudaSetDevice") && setup(&r, s, tf32);
  if (ok) {
    t->fwd = time_pass(&r, FWD, &t->algo_fwd);
    t->bwd_data = time_pass(&r, DATA, &t->algo_data);
    t->bwd_filter = time_pass(&r, FILTER, &t->algo_filter);
    ok = t->fwd >= 0 && t->bwd_data >= 0 && t->bwd_filter >= 0;
  }
  release(&r);
  return ok;
}
