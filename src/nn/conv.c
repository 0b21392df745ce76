/* conv.c — 2-D convolution (F.conv2d) forward and backward, and nn.Conv2d.
 *
 * A convolution is GEMMs over columns (im2col): for a chunk of nb images and a group g,
 *   col  [K, nb P] = im2col(x chunk, g)          K = C/groups * kh * kw, P = oh * ow
 *   tmp  [O/groups rows of O, nb P] = W_g [O/groups, K] @ col
 * and one swap01 takes tmp [O, nb, P] (plus the bias) to y [nb, O, P]. Backward swaps the
 * chunk's gradient to gperm [O, nb P] and runs, per group,
 *   dW_g += gperm_g @ col^T,  dcol = W_g^T @ gperm_g -> col2im (adds) into dx,  db += gperm @ 1.
 * Chunks bound the column buffer (and tmp / gperm) at CONV_CHUNK_FLOATS floats, 64 MiB, or one
 * image's when that is more. The chunk's columns are side by side so that one GEMM covers
 * every image of the chunk (a GEMM per image would be tiny in the deep layers: P = 49 at
 * ResNet's layer4).
 *
 * 1x1 convolutions with stride 1 and no padding need no columns: x[n] is already [C, P], so
 * each image and group is one GEMM straight between x, W and y (DIRECT_MIN_P and up; below
 * that the per-image GEMMs are too small and the chunked path, whose im2col is then a plain
 * layout change, is used).
 *
 * A backend with whole-convolution entries (conv2d and its backward entries: oneDNN on the
 * host; OpenCL's, which choose their algorithm per shape and pass) gets each pass as one call
 * instead. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SHAPE(t, buf) clpar_tensor_shape_str((t), (buf), sizeof(buf))
#define CONV_CHUNK_FLOATS ((int64_t)16 * 1024 * 1024) /* 64 MiB of columns */

int64_t clpar_conv_chunk_floats = CONV_CHUNK_FLOATS;
#define DIRECT_MIN_P 256

typedef struct conv_plan {
  int64_t n, c, h, w, o, groups, cg, og, kh, kw, oh, ow, P, K;
  int64_t sh, sw, ph, pw, dh, dw;
  int direct;    /* 1x1, stride 1, no padding, P >= DIRECT_MIN_P: GEMMs on x itself */
  int64_t chunk; /* images per chunk on the im2col path */
} conv_plan;

static clpar_status check_alive(const char *fn, const char *name, const clpar_tensor *t) {
  if (!t) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
  clpar_status s = clpar_check_alive(fn, t);
  return s == CLPAR_OK ? clpar_check_float(fn, name, t) : s;
}

/* nn.Conv2d's defaults in the fields left 0 (stride, dilation and groups 1; padding 0 is
 * literal); NULL: all of them. */
static clpar_conv2d_options conv_resolved(const clpar_conv2d_options *opt) {
  clpar_conv2d_options o = opt ? *opt : (clpar_conv2d_options){{0, 0}, {0, 0}, {0, 0}, 0};
  for (int i = 0; i < 2; i++) {
    if (o.stride[i] == 0) o.stride[i] = 1;
    if (o.dilation[i] == 0) o.dilation[i] = 1;
  }
  if (o.groups == 0) o.groups = 1;
  return o;
}

/* Checks options and shapes and fills the plan; every message names the shapes. */
static clpar_status plan_conv(const clpar_tensor *x, const clpar_tensor *wt,
                              const clpar_tensor *bias, const clpar_conv2d_options *opt,
                              conv_plan *p) {
  const char *fn = "clpar_conv2d";
  char a[128], b[128];
  clpar_conv2d_options d = conv_resolved(opt);
  opt = &d;
  for (int i = 0; i < 2; i++)
    if (opt->stride[i] < 1 || opt->dilation[i] < 1 || opt->padding[i] < 0)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: stride (%lld, %lld) and dilation (%lld, %lld) must be >= 1 and "
                             "padding (%lld, %lld) >= 0",
                             fn, (long long)opt->stride[0], (long long)opt->stride[1],
                             (long long)opt->dilation[0], (long long)opt->dilation[1],
                             (long long)opt->padding[0], (long long)opt->padding[1]);
  if (opt->groups < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: groups is %lld; must be >= 1", fn,
                           (long long)opt->groups);
  if (x->ndim != 4 || wt->ndim != 4)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: input is %s and weight is %s; need [N, C, H, W] and "
                           "[O, C/groups, kh, kw]",
                           fn, SHAPE(x, a), SHAPE(wt, b));
  if (x->storage->dev != wt->storage->dev || (bias && bias->storage->dev != x->storage->dev))
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH,
                           "%s: input on %s, weight on %s, bias on %s; move them to one device", fn,
                           x->storage->dev->bd.info.id, wt->storage->dev->bd.info.id,
                           bias ? bias->storage->dev->bd.info.id : "-");
  p->n = x->shape[0], p->c = x->shape[1], p->h = x->shape[2], p->w = x->shape[3];
  p->o = wt->shape[0], p->kh = wt->shape[2], p->kw = wt->shape[3], p->groups = opt->groups;
  if (p->c % p->groups || p->o % p->groups || wt->shape[1] * p->groups != p->c)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: input is %s, weight is %s with groups %lld; need C and O "
                           "divisible by groups and weight [O, C/groups, kh, kw]",
                           fn, SHAPE(x, a), SHAPE(wt, b), (long long)p->groups);
  if (bias && (bias->ndim != 1 || bias->shape[0] != p->o))
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s: bias is %s for weight %s; need [%lld]",
                           fn, SHAPE(bias, a), SHAPE(wt, b), (long long)p->o);
  p->sh = opt->stride[0], p->sw = opt->stride[1], p->ph = opt->padding[0];
  p->pw = opt->padding[1], p->dh = opt->dilation[0], p->dw = opt->dilation[1];
  int64_t ekh = p->dh * (p->kh - 1) + 1, ekw = p->dw * (p->kw - 1) + 1;
  if (ekh > p->h + 2 * p->ph || ekw > p->w + 2 * p->pw)
    return clpar_set_error(
        CLPAR_ERROR_SHAPE_MISMATCH,
        "%s: input is %s and weight %s: the (dilated) kernel %lldx%lld is larger "
        "than the padded input %lldx%lld",
        fn, SHAPE(x, a), SHAPE(wt, b), (long long)ekh, (long long)ekw,
        (long long)(p->h + 2 * p->ph), (long long)(p->w + 2 * p->pw));
  p->oh = (p->h + 2 * p->ph - ekh) / p->sh + 1;
  p->ow = (p->w + 2 * p->pw - ekw) / p->sw + 1;
  p->cg = p->c / p->groups, p->og = p->o / p->groups;
  p->P = p->oh * p->ow, p->K = p->cg * p->kh * p->kw;
  p->direct = p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 && p->ph == 0 && p->pw == 0 &&
              p->P >= DIRECT_MIN_P;
  int64_t rows = p->K > p->o ? p->K : p->o;
  p->chunk = __atomic_load_n(&clpar_conv_chunk_floats, __ATOMIC_RELAXED) / (rows * p->P);
  if (p->chunk < 1) p->chunk = 1;
  if (p->chunk > p->n) p->chunk = p->n;
  return CLPAR_OK;
}

static clpar_conv_geom geom_of(const conv_plan *p, int64_t nb) {
  clpar_conv_geom g = {nb,    p->cg, p->h,  p->w,  p->c * p->h * p->w,
                       p->kh, p->kw, p->sh, p->sw, p->ph,
                       p->pw, p->dh, p->dw, p->oh, p->ow};
  return g;
}

static clpar_bref at(const clpar_tensor *t, int64_t off) {
  clpar_bref r = {t->storage->buf, t->offset + (size_t)off};
  return r;
}

static clpar_bref none(void) {
  clpar_bref r = {NULL, 0};
  return r;
}

static clpar_status gemm(clpar_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k,
                         clpar_bref a, int64_t lda, clpar_bref b, int64_t ldb, float beta,
                         clpar_bref c, int64_t ldc) {
  return clpar_dev_gemm(dev, ta, tb, (size_t)m, (size_t)n, (size_t)k, 1.0f, a, (size_t)lda, b,
                        (size_t)ldb, beta, c, (size_t)ldc);
}

/* One strided batched GEMM (backend.h's gemm_batched), alpha 1. */
static clpar_status gemm_batched(clpar_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k,
                                 clpar_bref a, int64_t lda, int64_t sa, clpar_bref b, int64_t ldb,
                                 int64_t sb, float beta, clpar_bref c, int64_t ldc, int64_t sc,
                                 int64_t batch) {
  return clpar_dev_gemm_batched(dev, ta, tb, (size_t)m, (size_t)n, (size_t)k, 1.0f, a, (size_t)lda,
                                (size_t)sa, b, (size_t)ldb, (size_t)sb, beta, c, (size_t)ldc,
                                (size_t)sc, (size_t)batch);
}

/* A vector of n ones (the GEMM operand that sums rows). */
static clpar_status ones(clpar_device *dev, int64_t n, clpar_tensor **out) {
  clpar_status s = clpar_tensor_empty(dev, 1, &n, out);
  if (s == CLPAR_OK) s = clpar_dev_fill(dev, clpar_tensor_bref(*out), (size_t)n, 1.0f);
  return s;
}

/* y [N, O, P] = bias broadcast over images and pixels (two rank-1 GEMMs), for GEMMs that add
 * onto it with beta = 1. */
static clpar_status bias_fill(clpar_device *dev, const conv_plan *p, const clpar_tensor *bias,
                              clpar_tensor *y) {
  clpar_tensor *one = NULL, *bo = NULL;
  int64_t op = p->o * p->P, big = p->n > p->P ? p->n : p->P;
  clpar_status s = ones(dev, big, &one);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &op, &bo);
  if (s == CLPAR_OK) /* bo [O, P] = bias [O, 1] @ 1 [1, P] */
    s = gemm(dev, 0, 0, p->o, p->P, 1, clpar_tensor_bref(bias), 1, at(one, 0), p->P, 0.0f,
             at(bo, 0), p->P);
  if (s == CLPAR_OK) /* y [N, O P] = 1 [N, 1] @ bo [1, O P] */
    s = gemm(dev, 0, 0, p->n, op, 1, at(one, 0), 1, at(bo, 0), op, 0.0f, at(y, 0), op);
  clpar_tensor_free(one);
  clpar_tensor_free(bo);
  return s;
}

/* y = conv(x) on the chunked im2col path. */
static clpar_status forward_im2col(clpar_device *dev, const conv_plan *p, const clpar_tensor *x,
                                   const clpar_tensor *wt, const clpar_tensor *bias,
                                   clpar_tensor *y) {
  int64_t cols = p->K * p->chunk * p->P, tmps = p->o * p->chunk * p->P;
  int nchw = p->P >= DIRECT_MIN_P; /* per-image GEMMs into y: no [O, nb P] buffer, no swap */
  clpar_tensor *col = NULL, *tmp = NULL;
  clpar_status s = clpar_tensor_empty(dev, 1, &cols, &col);
  if (s == CLPAR_OK && !nchw) s = clpar_tensor_empty(dev, 1, &tmps, &tmp);
  if (s == CLPAR_OK && nchw && bias) s = bias_fill(dev, p, bias, y);
  for (int64_t n0 = 0; s == CLPAR_OK && n0 < p->n; n0 += p->chunk) {
    int64_t nb = p->n - n0 < p->chunk ? p->n - n0 : p->chunk, L = nb * p->P;
    for (int64_t g = 0; s == CLPAR_OK && g < p->groups; g++) {
      s = clpar_dev_im2col(dev, geom_of(p, nb), at(x, (n0 * p->c + g * p->cg) * p->h * p->w),
                           at(col, 0));
      if (s == CLPAR_OK && nchw) /* y[n, g] [og, P] = W_g @ col[:, n P ...] */
        s = gemm_batched(dev, 0, 0, p->og, p->P, p->K, at(wt, g * p->og * p->K), p->K, 0,
                         at(col, 0), L, p->P, bias ? 1.0f : 0.0f,
                         at(y, (n0 * p->o + g * p->og) * p->P), p->P, p->o * p->P, nb);
      else if (s == CLPAR_OK)
        s = gemm(dev, 0, 0, p->og, L, p->K, at(wt, g * p->og * p->K), p->K, at(col, 0), L, 0.0f,
                 at(tmp, g * p->og * L), L);
    }
    if (s == CLPAR_OK && !nchw)
      s = clpar_dev_swap01(dev, (size_t)p->o, (size_t)nb, (size_t)p->P, at(tmp, 0),
                           bias ? clpar_tensor_bref(bias) : none(), at(y, n0 * p->o * p->P));
  }
  clpar_tensor_free(col);
  clpar_tensor_free(tmp);
  return s;
}

/* y = conv(x) for a 1x1 convolution: per group, y[n, g] = W_g @ x[n, g] for every image n in
 * one batched GEMM, added onto the bias. */
static clpar_status forward_direct(clpar_device *dev, const conv_plan *p, const clpar_tensor *x,
                                   const clpar_tensor *wt, const clpar_tensor *bias,
                                   clpar_tensor *y) {
  clpar_status s = bias ? bias_fill(dev, p, bias, y) : CLPAR_OK;
  for (int64_t g = 0; s == CLPAR_OK && g < p->groups; g++)
    s = gemm_batched(dev, 0, 0, p->og, p->P, p->cg, at(wt, g * p->og * p->cg), p->cg, 0,
                     at(x, g * p->cg * p->P), p->P, p->c * p->P, bias ? 1.0f : 0.0f,
                     at(y, g * p->og * p->P), p->P, p->o * p->P, p->n);
  return s;
}

/* The backend runs whole convolutions (backend.h's conv2d entries): the forward, the
 * backward, each on its own. */
static int has_library(const clpar_device *dev, int backward) {
  const clpar_backend_iface *f = dev->bd.iface;
  return backward ? f->conv2d_backward != NULL : f->conv2d != NULL;
}

static clpar_conv2d_shape shape_of(const conv_plan *p) {
  clpar_conv2d_shape s = {p->n,  p->c,  p->h,  p->w,  p->o,  p->groups, p->kh, p->kw,
                          p->sh, p->sw, p->ph, p->pw, p->dh, p->dw,     p->oh, p->ow};
  return s;
}

/* The gradients the inputs asked for: dx (zeroed here), dw, db, NULL where not wanted. */
typedef struct {
  clpar_tensor *dx, *dw, *db;
} conv_grads;

static clpar_status backward_im2col(clpar_device *dev, const conv_plan *p, const clpar_tensor *x,
                                    const clpar_tensor *wt, const clpar_tensor *gy, conv_grads *d) {
  int64_t cols = p->K * p->chunk * p->P, gsz = p->o * p->chunk * p->P, L1 = p->chunk * p->P;
  clpar_tensor *col = NULL, *gp = NULL, *one = NULL;
  clpar_status s = clpar_tensor_empty(dev, 1, &cols, &col);
  if (s == CLPAR_OK) s = clpar_tensor_empty(dev, 1, &gsz, &gp);
  if (s == CLPAR_OK && d->db) s = ones(dev, L1, &one);
  for (int64_t n0 = 0; s == CLPAR_OK && n0 < p->n; n0 += p->chunk) {
    int64_t nb = p->n - n0 < p->chunk ? p->n - n0 : p->chunk, L = nb * p->P;
    float beta = n0 ? 1.0f : 0.0f;
    s = clpar_dev_swap01(dev, (size_t)nb, (size_t)p->o, (size_t)p->P, at(gy, n0 * p->o * p->P),
                         none(), at(gp, 0)); /* gp [O, nb P] */
    if (s == CLPAR_OK && d->db)
      s = gemm(dev, 0, 0, p->o, 1, L, at(gp, 0), L, at(one, 0), 1, beta, at(d->db, 0), 1);
    for (int64_t g = 0; s == CLPAR_OK && g < p->groups; g++) {
      clpar_conv_geom geom = geom_of(p, nb);
      int64_t xoff = (n0 * p->c + g * p->cg) * p->h * p->w;
      if (d->dw) {
        s = clpar_dev_im2col(dev, geom, at(x, xoff), at(col, 0));
        if (s == CLPAR_OK)
          s = gemm(dev, 0, 1, p->og, p->K, L, at(gp, g * p->og * L), L, at(col, 0), L, beta,
                   at(d->dw, g * p->og * p->K), p->K);
      }
      if (s == CLPAR_OK && d->dx) {
        s = gemm(dev, 1, 0, p->K, L, p->og, at(wt, g * p->og * p->K), p->K, at(gp, g * p->og * L),
                 L, 0.0f, at(col, 0), L);
        if (s == CLPAR_OK) s = clpar_dev_col2im(dev, geom, at(col, 0), at(d->dx, xoff));
      }
    }
  }
  clpar_tensor_free(col);
  clpar_tensor_free(gp);
  clpar_tensor_free(one);
  return s;
}

/* 1x1: dx[n, g] = W_g^T gy[n, g] in one batched GEMM per group; dW_g = sum over n of
 * gy[n, g] x[n, g]^T as a batched GEMM into per-image products [nb, og, cg] (chunks of nb
 * images bound them) summed by a GEMM with ones, accumulated over chunks. */
static clpar_status backward_direct(clpar_device *dev, const conv_plan *p, const clpar_tensor *x,
                                    const clpar_tensor *wt, const clpar_tensor *gy, conv_grads *d) {
  clpar_status s = CLPAR_OK;
  clpar_tensor *one = NULL, *rows = NULL, *prod = NULL;
  int64_t wg = p->og * p->cg;
  int64_t nb = __atomic_load_n(&clpar_conv_chunk_floats, __ATOMIC_RELAXED) / wg;
  if (nb < 1) nb = 1;
  if (nb > p->n) nb = p->n;
  int64_t big = p->P > nb ? p->P : nb, prods = nb * wg;
  if ((d->db || d->dw) && (s = ones(dev, big, &one)) != CLPAR_OK) return s;
  if (d->db) { /* db = (sum over images of gy) [O, P] @ 1 [P] */
    int64_t op = p->o * p->P;
    s = clpar_tensor_empty(dev, 1, &op, &rows);
    if (s == CLPAR_OK)
      s = clpar_dev_sum_rows(dev, (size_t)p->n, (size_t)op, at(gy, 0), at(rows, 0));
    if (s == CLPAR_OK)
      s = gemm(dev, 0, 0, p->o, 1, p->P, at(rows, 0), p->P, at(one, 0), 1, 0.0f, at(d->db, 0), 1);
  }
  if (s == CLPAR_OK && d->dw) s = clpar_tensor_empty(dev, 1, &prods, &prod);
  for (int64_t g = 0; s == CLPAR_OK && g < p->groups; g++) {
    clpar_bref wgt = at(wt, g * wg);
    if (d->dx)
      s = gemm_batched(dev, 1, 0, p->cg, p->P, p->og, wgt, p->cg, 0, at(gy, g * p->og * p->P), p->P,
                       p->o * p->P, 0.0f, at(d->dx, g * p->cg * p->P), p->P, p->c * p->P, p->n);
    for (int64_t n0 = 0; s == CLPAR_OK && d->dw && n0 < p->n; n0 += nb) {
      int64_t m = p->n - n0 < nb ? p->n - n0 : nb;
      s = gemm_batched(dev, 0, 1, p->og, p->cg, p->P, at(gy, (n0 * p->o + g * p->og) * p->P), p->P,
                       p->o * p->P, at(x, (n0 * p->c + g * p->cg) * p->P), p->P, p->c * p->P, 0.0f,
                       at(prod, 0), p->cg, wg, m);
      if (s == CLPAR_OK) /* dW_g [1, og cg] (+)= 1 [1, m] @ prod [m, og cg] */
        s = gemm(dev, 0, 0, 1, wg, m, at(one, 0), m, at(prod, 0), wg, n0 ? 1.0f : 0.0f,
                 at(d->dw, g * wg), wg);
    }
  }
  clpar_tensor_free(one);
  clpar_tensor_free(rows);
  clpar_tensor_free(prod);
  return s;
}

/* Backward through the backend's entry; dw is computed (into a scratch tensor) when only db
 * is wanted, since the entry gives db with dw. */
static clpar_status backward_library(clpar_device *dev, const conv_plan *p, const clpar_tensor *x,
                                     const clpar_tensor *wt, const clpar_tensor *gy,
                                     conv_grads *d) {
  clpar_tensor *dw = d->dw;
  clpar_status s = CLPAR_OK;
  if (!dw && d->db) s = clpar_tensor_empty(dev, 4, wt->shape, &dw);
  if (s == CLPAR_OK)
    s = clpar_dev_conv2d_backward(dev, shape_of(p), clpar_tensor_bref(x), clpar_tensor_bref(wt),
                                  clpar_tensor_bref(gy), d->dx ? clpar_tensor_bref(d->dx) : none(),
                                  dw ? clpar_tensor_bref(dw) : none(),
                                  d->db ? clpar_tensor_bref(d->db) : none());
  if (dw != d->dw) clpar_tensor_free(dw);
  return s;
}

/* The gradients want[] asks for (dx, dw, db) into gin[0..2], float32 throughout. */
static clpar_status run_backward(clpar_device *dev, const conv_plan *p, const clpar_tensor *x,
                                 const clpar_tensor *wt, const clpar_tensor *gy, const int want[3],
                                 clpar_tensor **gin) {
  conv_grads d = {NULL, NULL, NULL};
  clpar_status s = CLPAR_OK;
  int library = has_library(dev, 1);
  if (want[0]) {
    s = clpar_tensor_empty(dev, 4, x->shape, &d.dx);
    if (s == CLPAR_OK && !p->direct && !library)
      s = clpar_dev_fill(dev, clpar_tensor_bref(d.dx), (size_t)d.dx->numel, 0.0f);
  }
  if (s == CLPAR_OK && want[1]) s = clpar_tensor_empty(dev, 4, wt->shape, &d.dw);
  if (s == CLPAR_OK && want[2]) s = clpar_tensor_empty(dev, 1, &p->o, &d.db);
  if (s == CLPAR_OK && library)
    s = backward_library(dev, p, x, wt, gy, &d);
  else if (s == CLPAR_OK)
    s = p->direct ? backward_direct(dev, p, x, wt, gy, &d) : backward_im2col(dev, p, x, wt, gy, &d);
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_free(d.dx);
    clpar_tensor_free(d.dw);
    clpar_tensor_free(d.db);
    return s;
  }
  gin[0] = d.dx;
  gin[1] = d.dw;
  gin[2] = d.db;
  return CLPAR_OK;
}

static clpar_status conv_backward(clpar_node *node, clpar_tensor *gy, clpar_tensor **gin) {
  clpar_tensor *x = node->inputs[0], *wt = node->inputs[1], *g[3];
  clpar_tensor *bias = node->n_inputs > 2 ? node->inputs[2] : NULL;
  int want[3] = {x->requires_grad, wt->requires_grad, bias && bias->requires_grad};
  clpar_status s = run_backward(node->dev, node->ctx, x, wt, gy, want, g);
  if (s != CLPAR_OK) return s;
  gin[0] = g[0], gin[1] = g[1];
  if (bias) gin[2] = g[2];
  return CLPAR_OK;
}

clpar_status clpar_conv2d_grads(const clpar_tensor *x, const clpar_tensor *weight,
                                const clpar_conv2d_options *options, const clpar_tensor *gy,
                                const int want[3], clpar_tensor **gin) {
  conv_plan p;
  clpar_status s = plan_conv(x, weight, NULL, options, &p);
  return s == CLPAR_OK ? run_backward(x->storage->dev, &p, x, weight, gy, want, gin) : s;
}

clpar_status clpar_conv2d(const clpar_tensor *x, const clpar_tensor *weight,
                          const clpar_tensor *bias, const clpar_conv2d_options *options,
                          clpar_tensor **out) {
  const char *fn = "clpar_conv2d";
  if (x && weight && out && clpar_autocast_dtype() != CLPAR_FLOAT32 &&
      clpar_check_alive(fn, x) == CLPAR_OK && clpar_check_alive(fn, weight) == CLPAR_OK &&
      (!bias || clpar_check_alive(fn, bias) == CLPAR_OK))
    return clpar_autocast_conv2d(x, weight, bias, options, out);
  clpar_status s = check_alive(fn, "input", x);
  if (s == CLPAR_OK) s = check_alive(fn, "weight", weight);
  if (s == CLPAR_OK && bias) s = check_alive(fn, "bias", bias);
  if (s == CLPAR_OK && !out)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  conv_plan plan;
  if (s == CLPAR_OK) s = plan_conv(x, weight, bias, options, &plan);
  if (s != CLPAR_OK) return s;
  conv_plan *ctx = NULL;
  clpar_tensor *in[3] = {(clpar_tensor *)x, (clpar_tensor *)weight, (clpar_tensor *)bias};
  int n_in = bias ? 3 : 2;
  if (clpar_needs_grad(in, n_in) && !(ctx = malloc(sizeof *ctx)))
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  clpar_device *dev = x->storage->dev;
  int64_t shape[4] = {plan.n, plan.o, plan.oh, plan.ow};
  clpar_tensor *y = NULL;
  s = clpar_tensor_empty(dev, 4, shape, &y);
  if (s == CLPAR_OK && has_library(dev, 0))
    s = clpar_dev_conv2d(dev, shape_of(&plan), clpar_tensor_bref(x), clpar_tensor_bref(weight),
                         bias ? clpar_tensor_bref(bias) : none(), clpar_tensor_bref(y));
  else if (s == CLPAR_OK)
    s = plan.direct ? forward_direct(dev, &plan, x, weight, bias, y)
                    : forward_im2col(dev, &plan, x, weight, bias, y);
  if (s != CLPAR_OK) {
    if (y) clpar_device_fail(dev, s);
    clpar_tensor_free(y);
    free(ctx);
    return s;
  }
  if (ctx) *ctx = plan;
  return clpar_record_op_keep(y, fn, conv_backward, in, n_in, ctx, NULL, 0, NULL, out);
}

/* ---- nn.Conv2d ---- */

static clpar_status conv_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                 void *user) {
  return clpar_conv2d(x, clpar_module_parameter(self, "weight"),
                      clpar_module_parameter(self, "bias"), user, y);
}

clpar_status clpar_conv2d_create(int64_t in_ch, int64_t out_ch, int64_t kh, int64_t kw,
                                 const clpar_conv2d_options *options, int bias, clpar_device *dev,
                                 clpar_module **out) {
  const char *fn = "clpar_conv2d_create";
  clpar_conv2d_options o = conv_resolved(options);
  if (in_ch < 1 || out_ch < 1 || kh < 1 || kw < 1 || !out || !dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: channels %lld -> %lld and kernel %lldx%lld must be >= 1, device "
                           "and out non-NULL",
                           fn, (long long)in_ch, (long long)out_ch, (long long)kh, (long long)kw);
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_init first", fn);
  int bad = o.groups < 1 || in_ch % o.groups || out_ch % o.groups;
  for (int i = 0; i < 2; i++) bad |= o.stride[i] < 1 || o.dilation[i] < 1 || o.padding[i] < 0;
  if (bad)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: %lld -> %lld channels with groups %lld, stride (%lld, %lld), "
                           "padding (%lld, %lld), dilation (%lld, %lld): channels must divide by "
                           "groups, strides and dilations be >= 1, padding >= 0",
                           fn, (long long)in_ch, (long long)out_ch, (long long)o.groups,
                           (long long)o.stride[0], (long long)o.stride[1], (long long)o.padding[0],
                           (long long)o.padding[1], (long long)o.dilation[0],
                           (long long)o.dilation[1]);
  int64_t ws[4] = {out_ch, in_ch / o.groups, kh, kw}, numel;
  clpar_status s = clpar_check_size(fn, dev, 4, ws, &numel);
  if (s != CLPAR_OK) return s;
  clpar_conv2d_options *user = malloc(sizeof *user);
  if (!user) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  *user = o;
  clpar_module *m;
  s = clpar_module_create("Conv2d", conv_forward, user, free, &m);
  if (s != CLPAR_OK) {
    free(user);
    return s;
  }
  float bound = 1.0f / sqrtf((float)(ws[1] * kh * kw));
  s = clpar_module_add_uniform_params(m, dev, 4, ws, bias, bound);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}
