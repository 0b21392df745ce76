/* host_conv.c — the host backend's convolution, pooling and batch-norm entries (backend.h):
 * im2col and its adjoint col2im, the [a, b, p] -> [b, a, p] swap that takes a
 * GEMM's [O, n * P] result to NCHW, max and adaptive average pooling with their backward, and
 * batch norm's per-channel statistics, normalization and gradient. Sums over many elements
 * (statistics, gradient reductions) are taken in double (in SIMD-wide partial sums): this is
 * the reference the other backends are compared with. Backward passes gather (each output
 * element sums what reaches it) instead of scattering, so they need no atomics and give the
 * same bits every run. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "host/host_conv.h"

#define PAR_MIN 65536 /* elements below which a loop stays on the worker thread */

static float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

/* The outputs o < out whose input position o * s - pad + k * d falls in [0, in): [*lo, *hi). */
static void valid_range(int64_t in, int64_t out, int64_t s, int64_t pad, int64_t kd, int64_t *lo,
                        int64_t *hi) {
  int64_t first = pad - kd; /* o * s >= first */
  int64_t l = first <= 0 ? 0 : (first + s - 1) / s;
  int64_t last = in - 1 + pad - kd; /* o * s <= last */
  int64_t h = last < 0 ? 0 : last / s + 1;
  *lo = l < out ? l : out;
  *hi = h < out ? h : out;
  if (*hi < *lo) *hi = *lo;
}

/* One row of columns: the kernel tap (ci, i, j) of image b. Runs of valid positions are copied
 * (stride 1: a memcpy), the padding is zero. */
clpar_status clpar_host_im2col(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref col) {
  (void)dev;
  const float *px = at(x);
  float *pc = at(col);
  int64_t P = g.oh * g.ow, L = g.n * P, rows = g.c * g.kh * g.kw;
#pragma omp parallel for collapse(2) if (rows * L > PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < g.n; b++) {
      int64_t ci = r / (g.kh * g.kw), i = r / g.kw % g.kh, j = r % g.kw;
      const float *plane = px + b * g.img_stride + ci * g.h * g.w;
      float *o = pc + r * L + b * P;
      int64_t oy0, oy1, ox0, ox1;
      valid_range(g.h, g.oh, g.sh, g.ph, i * g.dh, &oy0, &oy1);
      valid_range(g.w, g.ow, g.sw, g.pw, j * g.dw, &ox0, &ox1);
      memset(o, 0, (size_t)(oy0 * g.ow) * sizeof *o);
      for (int64_t oy = oy0; oy < oy1; oy++) {
        /* input position of output ox: base + ox * sw (>= 0 for ox >= ox0) */
        int64_t base = (oy * g.sh - g.ph + i * g.dh) * g.w + j * g.dw - g.pw;
        float *orow = o + oy * g.ow;
        for (int64_t ox = 0; ox < ox0; ox++) orow[ox] = 0.0f;
        if (g.sw == 1)
          memcpy(orow + ox0, plane + base + ox0, (size_t)(ox1 - ox0) * sizeof *orow);
        else
          for (int64_t ox = ox0; ox < ox1; ox++) orow[ox] = plane[base + ox * g.sw];
        for (int64_t ox = ox1; ox < g.ow; ox++) orow[ox] = 0.0f;
      }
      memset(o + oy1 * g.ow, 0, (size_t)((g.oh - oy1) * g.ow) * sizeof *o);
    }
  return CLPAR_OK;
}

/* The adjoint: each plane (b, ci) of x is one thread's, and the taps (i, j) add their columns
 * into it in a fixed order (the same bits every run, no atomics). */
clpar_status clpar_host_col2im(void *dev, clpar_conv_geom g, clpar_bref col, clpar_bref x) {
  (void)dev;
  const float *pc = at(col);
  float *px = at(x);
  int64_t P = g.oh * g.ow, L = g.n * P;
#pragma omp parallel for collapse(2) if (g.n * g.c * P * g.kh * g.kw > PAR_MIN) schedule(static)
  for (int64_t b = 0; b < g.n; b++)
    for (int64_t ci = 0; ci < g.c; ci++) {
      float *plane = px + b * g.img_stride + ci * g.h * g.w;
      for (int64_t i = 0; i < g.kh; i++) {
        int64_t oy0, oy1;
        valid_range(g.h, g.oh, g.sh, g.ph, i * g.dh, &oy0, &oy1);
        for (int64_t j = 0; j < g.kw; j++) {
          int64_t ox0, ox1;
          valid_range(g.w, g.ow, g.sw, g.pw, j * g.dw, &ox0, &ox1);
          const float *c = pc + ((ci * g.kh + i) * g.kw + j) * L + b * P;
          for (int64_t oy = oy0; oy < oy1; oy++) {
            int64_t base = (oy * g.sh - g.ph + i * g.dh) * g.w + j * g.dw - g.pw;
            const float *crow = c + oy * g.ow;
            if (g.sw == 1)
              for (int64_t ox = ox0; ox < ox1; ox++) plane[base + ox] += crow[ox];
            else
              for (int64_t ox = ox0; ox < ox1; ox++) plane[base + ox * g.sw] += crow[ox];
          }
        }
      }
    }
  return CLPAR_OK;
}

clpar_status clpar_host_swap01(void *dev, size_t a, size_t b, size_t p, clpar_bref in,
                               clpar_bref bias, clpar_bref out) {
  (void)dev;
  const float *pi = at(in), *pb = bias.buf ? at(bias) : NULL;
  float *po = at(out);
#pragma omp parallel for collapse(2) if (a * b * p > PAR_MIN) schedule(static)
  for (size_t i = 0; i < a; i++)
    for (size_t j = 0; j < b; j++) {
      const float *src = pi + (i * b + j) * p;
      float *dst = po + (j * a + i) * p, add = pb ? pb[i] : 0.0f;
      for (size_t q = 0; q < p; q++) dst[q] = src[q] + add;
    }
  return CLPAR_OK;
}

clpar_status clpar_host_maxpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y,
                                clpar_bref idx) {
  (void)dev;
  const float *px = at(x);
  float *py = at(y);
  int32_t *pi = (int32_t *)idx.buf + idx.off;
  int64_t P = g.oh * g.ow;
#pragma omp parallel for if (g.n * P * g.kh * g.kw > PAR_MIN) schedule(static)
  for (int64_t b = 0; b < g.n; b++) {
    const float *plane = px + b * g.img_stride;
    for (int64_t oy = 0; oy < g.oh; oy++)
      for (int64_t ox = 0; ox < g.ow; ox++) {
        int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw, best = -1;
        float max = -INFINITY;
        for (int64_t yy = y0 < 0 ? 0 : y0; yy < y0 + g.kh && yy < g.h; yy++)
          for (int64_t xx = x0 < 0 ? 0 : x0; xx < x0 + g.kw && xx < g.w; xx++) {
            float v = plane[yy * g.w + xx];
            if (best < 0 || v > max || isnan(v)) {
              max = v;
              best = yy * g.w + xx;
              if (isnan(v)) goto done; /* NaN wins, first one */
            }
          }
      done:
        py[b * P + oy * g.ow + ox] = max;
        pi[b * P + oy * g.ow + ox] = (int32_t)best;
      }
  }
  return CLPAR_OK;
}

/* The outputs o whose window [o * s - pad, o * s - pad + k) holds i: [*lo, *hi). */
static void windows_of(int64_t i, int64_t k, int64_t s, int64_t pad, int64_t out, int64_t *lo,
                       int64_t *hi) {
  int64_t num = i + pad - k + 1; /* o * s >= num */
  int64_t l = num <= 0 ? 0 : (num + s - 1) / s;
  int64_t h = (i + pad) / s + 1; /* o * s <= i + pad */
  *lo = l;
  *hi = h < out ? h : out;
}

clpar_status clpar_host_maxpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy,
                                         clpar_bref idx, clpar_bref dx) {
  (void)dev;
  const float *pg = at(dy);
  const int32_t *pi = (const int32_t *)idx.buf + idx.off;
  float *po = at(dx);
  int64_t P = g.oh * g.ow;
#pragma omp parallel for collapse(2) if (g.n * g.h * g.w > PAR_MIN) schedule(static)
  for (int64_t b = 0; b < g.n; b++)
    for (int64_t y = 0; y < g.h; y++) {
      int64_t oy0, oy1;
      windows_of(y, g.kh, g.sh, g.ph, g.oh, &oy0, &oy1);
      for (int64_t xx = 0; xx < g.w; xx++) {
        int64_t ox0, ox1, q = y * g.w + xx;
        windows_of(xx, g.kw, g.sw, g.pw, g.ow, &ox0, &ox1);
        float sum = 0.0f;
        for (int64_t oy = oy0; oy < oy1; oy++)
          for (int64_t ox = ox0; ox < ox1; ox++)
            if (pi[b * P + oy * g.ow + ox] == q) sum += pg[b * P + oy * g.ow + ox];
        po[b * g.h * g.w + q] = sum;
      }
    }
  return CLPAR_OK;
}

/* PyTorch's bins: [floor(i * in / out), ceil((i + 1) * in / out)). */
static int64_t bin_start(int64_t i, int64_t in, int64_t out) {
  return i * in / out;
}
static int64_t bin_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

clpar_status clpar_host_avgpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y) {
  (void)dev;
  const float *px = at(x);
  float *py = at(y);
#pragma omp parallel for if (g.n * g.h * g.w > PAR_MIN) schedule(static)
  for (int64_t b = 0; b < g.n; b++) {
    const float *plane = px + b * g.h * g.w;
    for (int64_t oy = 0; oy < g.oh; oy++)
      for (int64_t ox = 0; ox < g.ow; ox++) {
        int64_t y0 = bin_start(oy, g.h, g.oh), y1 = bin_end(oy, g.h, g.oh);
        int64_t x0 = bin_start(ox, g.w, g.ow), x1 = bin_end(ox, g.w, g.ow);
        double sum = 0.0;
        for (int64_t yy = y0; yy < y1; yy++)
          for (int64_t xx = x0; xx < x1; xx++) sum += plane[yy * g.w + xx];
        py[(b * g.oh + oy) * g.ow + ox] = (float)(sum / (double)((y1 - y0) * (x1 - x0)));
      }
  }
  return CLPAR_OK;
}

/* The bins [*lo, *hi) that hold index i. */
static void bins_of(int64_t i, int64_t in, int64_t out, int64_t *lo, int64_t *hi) {
  int64_t l = i * out / in; /* bin_start(l) <= i; earlier bins may still reach i */
  while (l > 0 && bin_end(l - 1, in, out) > i) l--;
  int64_t h = l;
  while (h < out && bin_start(h, in, out) <= i) h++;
  *lo = l;
  *hi = h;
}

clpar_status clpar_host_avgpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy,
                                         clpar_bref dx) {
  (void)dev;
  const float *pg = at(dy);
  float *po = at(dx);
#pragma omp parallel for collapse(2) if (g.n * g.h * g.w > PAR_MIN) schedule(static)
  for (int64_t b = 0; b < g.n; b++)
    for (int64_t y = 0; y < g.h; y++) {
      int64_t oy0, oy1;
      bins_of(y, g.h, g.oh, &oy0, &oy1);
      for (int64_t xx = 0; xx < g.w; xx++) {
        int64_t ox0, ox1;
        bins_of(xx, g.w, g.ow, &ox0, &ox1);
        float sum = 0.0f;
        for (int64_t oy = oy0; oy < oy1; oy++)
          for (int64_t ox = ox0; ox < ox1; ox++) {
            int64_t cnt = (bin_end(oy, g.h, g.oh) - bin_start(oy, g.h, g.oh)) *
                          (bin_end(ox, g.w, g.ow) - bin_start(ox, g.w, g.ow));
            sum += pg[(b * g.oh + oy) * g.ow + ox] / (float)cnt;
          }
        po[(b * g.h + y) * g.w + xx] = sum;
      }
    }
  return CLPAR_OK;
}

clpar_status clpar_host_bn_stats(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                 clpar_bref mean, clpar_bref var, clpar_bref running_mean,
                                 clpar_bref running_var, float momentum) {
  (void)dev;
  const float *px = at(x);
  float *pm = at(mean), *pv = at(var);
  double M = (double)n * (double)p;
#pragma omp parallel for if (n * c * p > PAR_MIN) schedule(static)
  for (size_t ch = 0; ch < c; ch++) {
    double sum = 0.0, sq = 0.0;
    for (size_t b = 0; b < n; b++) {
      const float *row = px + (b * c + ch) * p;
#pragma omp simd reduction(+ : sum)
      for (size_t q = 0; q < p; q++) sum += row[q];
    }
    double mu = sum / M;
    for (size_t b = 0; b < n; b++) {
      const float *row = px + (b * c + ch) * p;
#pragma omp simd reduction(+ : sq)
      for (size_t q = 0; q < p; q++) {
        double d = row[q] - mu;
        sq += d * d;
      }
    }
    pm[ch] = (float)mu;
    pv[ch] = (float)(sq / M);
    if (running_mean.buf) {
      float *rm = at(running_mean) + ch, *rv = at(running_var) + ch;
      *rm = (float)((1.0 - momentum) * *rm + momentum * mu);
      *rv = (float)((1.0 - momentum) * *rv + momentum * (sq / (M - 1.0)));
    }
  }
  return CLPAR_OK;
}

static float inv_std(clpar_bref var, size_t ch, float eps) {
  return (float)(1.0 / sqrt((double)at(var)[ch] + eps));
}

clpar_status clpar_host_bn_apply(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                 clpar_bref mean, clpar_bref var, clpar_bref weight,
                                 clpar_bref bias, float eps, clpar_bref y) {
  (void)dev;
  const float *px = at(x), *pm = at(mean);
  float *py = at(y);
#pragma omp parallel for collapse(2) if (n * c * p > PAR_MIN) schedule(static)
  for (size_t b = 0; b < n; b++)
    for (size_t ch = 0; ch < c; ch++) {
      float w = weight.buf ? at(weight)[ch] : 1.0f, add = bias.buf ? at(bias)[ch] : 0.0f;
      float mul = inv_std(var, ch, eps) * w, mu = pm[ch];
      const float *src = px + (b * c + ch) * p;
      float *dst = py + (b * c + ch) * p;
      for (size_t q = 0; q < p; q++) dst[q] = (src[q] - mu) * mul + add;
    }
  return CLPAR_OK;
}

clpar_status clpar_host_bn_backward_sums(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                         clpar_bref g, clpar_bref mean, clpar_bref var, float eps,
                                         clpar_bref sum_g, clpar_bref sum_gxhat) {
  (void)dev;
  const float *px = at(x), *pg = at(g), *pm = at(mean);
#pragma omp parallel for if (n * c * p > PAR_MIN) schedule(static)
  for (size_t ch = 0; ch < c; ch++) {
    double sg = 0.0, sgx = 0.0, mu = pm[ch];
    for (size_t b = 0; b < n; b++) {
      const float *gr = pg + (b * c + ch) * p, *xr = px + (b * c + ch) * p;
#pragma omp simd reduction(+ : sg, sgx)
      for (size_t q = 0; q < p; q++) {
        sg += gr[q];
        sgx += gr[q] * (xr[q] - mu);
      }
    }
    at(sum_g)[ch] = (float)sg;
    at(sum_gxhat)[ch] = (float)(sgx / sqrt((double)at(var)[ch] + eps));
  }
  return CLPAR_OK;
}

clpar_status clpar_host_bn_backward(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                    clpar_bref g, clpar_bref mean, clpar_bref var,
                                    clpar_bref weight, float eps, clpar_bref sum_g,
                                    clpar_bref sum_gxhat, int training, clpar_bref dx) {
  (void)dev;
  const float *px = at(x), *pg = at(g), *pm = at(mean);
  float *po = at(dx);
  double M = (double)n * (double)p;
#pragma omp parallel for collapse(2) if (n * c * p > PAR_MIN) schedule(static)
  for (size_t b = 0; b < n; b++)
    for (size_t ch = 0; ch < c; ch++) {
      float istd = inv_std(var, ch, eps), w = weight.buf ? at(weight)[ch] : 1.0f;
      float mul = w * istd, mu = pm[ch];
      float mg = training ? (float)(at(sum_g)[ch] / M) : 0.0f;
      float mgx = training ? (float)(at(sum_gxhat)[ch] / M) : 0.0f;
      size_t k0 = (b * c + ch) * p;
      for (size_t q = 0; q < p; q++) {
        float xhat = (px[k0 + q] - mu) * istd;
        po[k0 + q] = mul * (pg[k0 + q] - mg - xhat * mgx);
      }
    }
  return CLPAR_OK;
}
