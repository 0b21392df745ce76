/* host_optim.c — the host backend's optimizer steps (sgd_step, adam_step), one pass over a
 * flat group, parallel above CLPAR_HOST_PAR elements. */
#include <math.h>
#include <stddef.h>

#include "backend.h"
#include "host/host_tensor_ops.h"

/* Below this many elements a step runs on the worker thread alone (host_backend.c's rule). */
#define CLPAR_HOST_PAR 65536

static float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

/* SGD over [0, n) with fmaf wherever PyTorch's CPU kernels add a multiple (add_(x, alpha)
 * rounds once) and the OpenCL kernel (optim.cl) fuses: the same bits on either backend, and
 * for an element wherever it sits in the buffer. */
static inline __attribute__((always_inline)) void sgd_body(size_t n, float *p, float *b,
                                                           const float *gr,
                                                           const clpar_sgd_args *o) {
  const float lr = o->lr, wd = o->weight_decay, mom = o->momentum, damp = 1.0f - o->dampening;
  const int first = o->first, nesterov = o->nesterov;
  if (!b) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) p[i] = fmaf(-lr, fmaf(wd, p[i], gr[i]), p[i]);
    return;
  }
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    float g = fmaf(wd, p[i], gr[i]);
    float bi = first ? g : fmaf(mom, b[i], damp * g);
    b[i] = bi;
    g = nesterov ? fmaf(mom, bi, g) : bi;
    p[i] = fmaf(-lr, g, p[i]);
  }
}

static void sgd_plain(size_t n, float *p, float *b, const float *gr, const clpar_sgd_args *o) {
  sgd_body(n, p, b, gr, o);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* With FMA instructions, fmaf vectorizes; the bits are sgd_plain's (fmaf is exact). */
__attribute__((target("avx2,fma"))) static void sgd_fma(size_t n, float *p, float *b,
                                                        const float *gr, const clpar_sgd_args *o) {
  sgd_body(n, p, b, gr, o);
}
#define FMA_OK (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#else
#define sgd_fma sgd_plain
#define FMA_OK 0
#endif

enum { CHUNK = 16384 }; /* the elements one call steps: OpenMP's threads share the chunks */

clpar_status clpar_host_sgd_step(void *dev, size_t n, clpar_bref param, clpar_bref grad,
                                 clpar_bref buf, clpar_sgd_args args) {
  (void)dev;
  float *p = at(param), *b = args.momentum != 0.0f ? at(buf) : NULL;
  const float *gr = at(grad);
  int fma = FMA_OK;
#pragma omp parallel for if (n > CLPAR_HOST_PAR) schedule(static)
  for (size_t c0 = 0; c0 < n; c0 += CHUNK) {
    size_t w = n - c0 < CHUNK ? n - c0 : CHUNK;
    (fma ? sgd_fma : sgd_plain)(w, p + c0, b ? b + c0 : NULL, gr + c0, &args);
  }
  return CLPAR_OK;
}

/* Adam over [0, n): fmaf where PyTorch rounds once (clpar_adam_args); a loop for each kind of
 * weight decay, so that each vectorizes. */
static inline __attribute__((always_inline)) void adam_body(size_t n, float *p, float *pm,
                                                            float *pv, const float *gr,
                                                            const clpar_adam_args *o) {
  const float keep = o->keep, wd = o->weight_decay, b1 = o->beta1, b2 = o->beta2;
  const float omb1 = o->one_minus_beta1, omb2 = o->one_minus_beta2, step = o->step;
  const float root2 = o->root2, eps = o->eps;
  if (o->decoupled) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
      float g = gr[i], pi = p[i] * keep;
      float mi = fmaf(omb1, g, b1 * pm[i]), vi = fmaf(omb2 * g, g, b2 * pv[i]);
      pm[i] = mi, pv[i] = vi;
      p[i] = pi - step * mi / (sqrtf(vi) / root2 + eps);
    }
  } else {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
      float pi = p[i], g = fmaf(wd, pi, gr[i]);
      float mi = fmaf(omb1, g, b1 * pm[i]), vi = fmaf(omb2 * g, g, b2 * pv[i]);
      pm[i] = mi, pv[i] = vi;
      p[i] = pi - step * mi / (sqrtf(vi) / root2 + eps);
    }
  }
}

static void adam_plain(size_t n, float *p, float *pm, float *pv, const float *gr,
                       const clpar_adam_args *o) {
  adam_body(n, p, pm, pv, gr, o);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The same operations with FMA and AVX2 instructions: fmaf, sqrtf and division are exactly
 * rounded, so the bits are adam_plain's. */
__attribute__((target("avx2,fma"))) static void adam_fma(size_t n, float *p, float *pm, float *pv,
                                                         const float *gr,
                                                         const clpar_adam_args *o) {
  adam_body(n, p, pm, pv, gr, o);
}
#else
#define adam_fma adam_plain
#endif

clpar_status clpar_host_adam_step(void *dev, size_t n, clpar_bref param, clpar_bref grad,
                                  clpar_bref m, clpar_bref v, clpar_adam_args args) {
  (void)dev;
  float *p = at(param), *pm = at(m), *pv = at(v);
  const float *gr = at(grad);
  int fma = FMA_OK;
#pragma omp parallel for if (n > CLPAR_HOST_PAR) schedule(static)
  for (size_t c0 = 0; c0 < n; c0 += CHUNK) {
    size_t w = n - c0 < CHUNK ? n - c0 : CHUNK;
    (fma ? adam_fma : adam_plain)(w, p + c0, pm + c0, pv + c0, gr + c0, &args);
  }
  return CLPAR_OK;
}
