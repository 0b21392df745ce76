/* host_tensor_ops.c — the host backend's tensor-op entries (backend.h): strided copies,
 * element-wise math with a parameter, the upper-triangle mask, argmax and the negative
 * log-likelihood with ignored targets, and softmax cross-entropy in one pass per row. Plain
 * loops; the host backend is the reference. */
#include <math.h>
#include <stdint.h>

#include "host/host_tensor_ops.h"

#define HOST_PAR 65536 /* elements above which a loop runs on OpenMP's team */

static float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

/* One row of the innermost dimension: a plain copy when both sides are contiguous. */
static void copy_row(const uint32_t *pi, uint32_t *po, int64_t n, int64_t is, int64_t os) {
  if (is == 1 && os == 1) {
    for (int64_t j = 0; j < n; j++) po[j] = pi[j];
  } else {
    for (int64_t j = 0; j < n; j++) po[j * os] = pi[j * is];
  }
}

/* Rows of the innermost dimension, each row's offsets from its index in the outer ones (a
 * division per outer dimension and row, not per element). */
clpar_status clpar_host_strided_copy(void *dev, clpar_strided_geom g, clpar_bref in,
                                     clpar_bref out) {
  (void)dev;
  const uint32_t *pi = (const uint32_t *)in.buf + in.off;
  uint32_t *po = (uint32_t *)out.buf + out.off;
  int last = g.ndim - 1;
  int64_t rows = 1, n = g.shape[last];
  for (int d = 0; d < last; d++) rows *= g.shape[d];
#pragma omp parallel for if (rows * n > HOST_PAR) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    int64_t rest = r, io = 0, oo = 0;
    for (int d = last - 1; d >= 0; d--) {
      int64_t i = rest % g.shape[d];
      rest /= g.shape[d];
      io += i * g.in_stride[d];
      oo += i * g.out_stride[d];
    }
    copy_row(pi + io, po + oo, n, g.in_stride[last], g.out_stride[last]);
  }
  return CLPAR_OK;
}

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_C 0.044715f

static float pw_forward(clpar_pointwise_kind kind, float x, float p) {
  switch (kind) {
    case CLPAR_PW_LOG:
      return logf(x);
    case CLPAR_PW_POW:
      return powf(x, p);
    case CLPAR_PW_GELU_TANH:
      return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x)));
    default:
      return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
  }
}

static float pw_derivative(clpar_pointwise_kind kind, float x, float p) {
  switch (kind) {
    case CLPAR_PW_LOG:
      return 1.0f / x;
    case CLPAR_PW_POW:
      return p == 0.0f ? 0.0f : p * powf(x, p - 1.0f);
    case CLPAR_PW_GELU_TANH: {
      float t = tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x));
      return 0.5f * (1.0f + t) +
             0.5f * x * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * x * x);
    }
    default:
      return 0.5f * (1.0f + erff(x * (float)M_SQRT1_2)) +
             x * expf(-0.5f * x * x) * 0.3989422804014327f; /* 1 / sqrt(2 pi) */
  }
}

/* GELU's erf form in chunks: each through the vector functions where they run, its tail (or
 * all of it, where they do not) through the scalar expressions. */
static void gelu_erf(const float *px, const float *pg, float *po, size_t n) {
  enum { CHUNK = 4096 };
#pragma omp parallel for if (n > HOST_PAR / 8) schedule(static)
  for (size_t c0 = 0; c0 < n; c0 += CHUNK) {
    size_t w = n - c0 < CHUNK ? n - c0 : CHUNK;
    const float *x = px + c0, *g = pg ? pg + c0 : NULL;
    float *o = po + c0;
    size_t i = clpar_host_gelu_erf_vec(x, g, o, w);
    for (; i < w; i++)
      o[i] = g ? g[i] * pw_derivative(CLPAR_PW_GELU_ERF, x[i], 0.0f)
               : pw_forward(CLPAR_PW_GELU_ERF, x[i], 0.0f);
  }
}

clpar_status clpar_host_pointwise(void *dev, clpar_pointwise_kind kind, size_t n, float p,
                                  clpar_bref x, clpar_bref g, clpar_bref out) {
  (void)dev;
  const float *px = at(x), *pg = g.buf ? at(g) : NULL;
  float *po = at(out);
  if (kind == CLPAR_PW_GELU_ERF) {
    gelu_erf(px, pg, po, n);
    return CLPAR_OK;
  }
  if (pg) {
#pragma omp parallel for if (n > HOST_PAR / 8) schedule(static)
    for (size_t i = 0; i < n; i++) po[i] = pg[i] * pw_derivative(kind, px[i], p);
  } else {
#pragma omp parallel for if (n > HOST_PAR / 8) schedule(static)
    for (size_t i = 0; i < n; i++) po[i] = pw_forward(kind, px[i], p);
  }
  return CLPAR_OK;
}

clpar_status clpar_host_mask_upper(void *dev, size_t batch, size_t rows, size_t cols,
                                   int64_t diagonal, float value, clpar_bref a, clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
  size_t n = batch * rows;
#pragma omp parallel for if (n * cols > HOST_PAR) schedule(static)
  for (size_t br = 0; br < n; br++) {
    int64_t i = (int64_t)(br % rows);
    for (size_t j = 0; j < cols; j++)
      po[br * cols + j] = (int64_t)j - i >= diagonal ? value : pa[br * cols + j];
  }
  return CLPAR_OK;
}

clpar_status clpar_host_argmax(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  int64_t *po = (int64_t *)(void *)((uint32_t *)out.buf + out.off);
#pragma omp parallel for if (rows * cols > HOST_PAR) schedule(static)
  for (size_t r = 0; r < rows; r++) {
    const float *row = pa + r * cols;
    size_t best = 0;
    for (size_t c = 1; c < cols && !isnan(row[best]); c++)
      if (row[c] > row[best] || isnan(row[c])) best = c;
    po[r] = (int64_t)best;
  }
  return CLPAR_OK;
}

static int64_t target(clpar_bref idx, int idx64, size_t r) {
  const uint32_t *w = (const uint32_t *)idx.buf + idx.off;
  return idx64 ? ((const int64_t *)(const void *)w)[r] : (int64_t)((const int32_t *)w)[r];
}

clpar_status clpar_host_nll_ignore(void *dev, size_t rows, size_t cols, int idx64, int64_t ignore,
                                   clpar_bref a, clpar_bref idx, clpar_bref loss,
                                   clpar_bref weight) {
  (void)dev;
  const float *pa = at(a);
  float *pl = at(loss), *pw = at(weight);
  for (size_t r = 0; r < rows; r++) {
    int64_t t = target(idx, idx64, r);
    pw[r] = t == ignore ? 0.0f : 1.0f;
    pl[r] = t == ignore ? 0.0f : t >= 0 && (uint64_t)t < cols ? -pa[r * cols + (size_t)t] : NAN;
  }
  return CLPAR_OK;
}

clpar_status clpar_host_nll_ignore_backward(void *dev, size_t rows, size_t cols, int idx64,
                                            int64_t ignore, clpar_bref idx, clpar_bref scale,
                                            clpar_bref out) {
  (void)dev;
  float *po = at(out), v = -at(scale)[0];
  for (size_t r = 0; r < rows; r++) {
    int64_t t = target(idx, idx64, r);
    for (size_t c = 0; c < cols; c++) po[r * cols + c] = t != ignore && (int64_t)c == t ? v : 0.0f;
  }
  return CLPAR_OK;
}

/* ---- softmax cross-entropy: the softmax entry's log_softmax, computed per row ---- */

/* The row's maximum and the log of its sum of exp(x - max), as host_softmax computes them. */
static void row_lse(const float *x, size_t cols, float *max, double *lse) {
  float m = x[0];
  for (size_t c = 1; c < cols; c++) m = x[c] > m ? x[c] : m;
  double sum = 0.0;
  for (size_t c = 0; c < cols; c++) sum += exp((double)x[c] - m);
  *max = m;
  *lse = log(sum);
}

clpar_status clpar_host_xent(void *dev, size_t rows, size_t cols, int idx64, int64_t ignore,
                             clpar_bref a, clpar_bref idx, clpar_bref loss, clpar_bref weight) {
  (void)dev;
  const float *pa = at(a);
  float *pl = at(loss), *pw = at(weight);
#pragma omp parallel for if (rows * cols > HOST_PAR) schedule(static)
  for (size_t r = 0; r < rows; r++) {
    int64_t t = target(idx, idx64, r);
    const float *x = pa + r * cols;
    pw[r] = t == ignore ? 0.0f : 1.0f;
    if (t == ignore || t < 0 || (uint64_t)t >= cols) {
      pl[r] = t == ignore ? 0.0f : NAN;
      continue;
    }
    float m;
    double lse;
    row_lse(x, cols, &m, &lse);
    pl[r] = -(float)((double)x[t] - m - lse);
  }
  return CLPAR_OK;
}

clpar_status clpar_host_xent_backward(void *dev, size_t rows, size_t cols, int idx64,
                                      int64_t ignore, clpar_bref a, clpar_bref idx, clpar_bref g,
                                      clpar_bref count, float alpha, clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
  float s = count.buf ? at(g)[0] / at(count)[0] : alpha * at(g)[0];
  double dot = -(double)s; /* the row sum of d */
#pragma omp parallel for if (rows * cols > HOST_PAR) schedule(static)
  for (size_t r = 0; r < rows; r++) {
    int64_t t = target(idx, idx64, r);
    const float *x = pa + r * cols;
    float *o = po + r * cols;
    if (t == ignore || t < 0 || (uint64_t)t >= cols) {
      for (size_t c = 0; c < cols; c++) o[c] = 0.0f;
      continue;
    }
    float m;
    double lse;
    row_lse(x, cols, &m, &lse);
    for (size_t c = 0; c < cols; c++) {
      float logp = (float)((double)x[c] - m - lse), d = (int64_t)c == t ? -s : 0.0f;
      o[c] = (float)(d - exp((double)logp) * dot);
    }
  }
  return CLPAR_OK;
}
