/* test_conv.c — convolution, pooling and batch norm (include/clpar/conv.h) on every selected
 * device and on the host: forward against a float64 reference computed here, every backward
 * against central finite differences of that reference (the ops are linear or smooth, so the
 * differences are exact to ~1e-9 in double), PyTorch's own numbers (tests/reference/conv_ref.h,
 * made by make_conv_ref.py) at rtol 1e-4, the chunked im2col path over several chunks, the
 * modules, and bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "reference/conv_ref.h"
#include "test_util.h"

/* ---- a generic op: inputs, a clpar run, a float64 reference ---- */

typedef struct op_case op_case;
struct op_case {
  const char *name;
  int n_in;
  int ndim[3];
  int64_t shape[3][4];
  int grad[3]; /* inputs whose gradient is checked */
  clpar_status (*run)(const op_case *c, clpar_tensor **in, clpar_tensor **out);
  void (*ref)(const op_case *c, double *const *in, double *out);
  int64_t out_numel;
  /* the op's own parameters */
  clpar_conv2d_options opt;
  int64_t k[2], s[2], p[2], oh, ow;
  int training;
};

static int64_t numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

/* sum(ref(in) * r) in double */
static double loss64(const op_case *c, double *const *in, const double *r) {
  double *out = malloc((size_t)c->out_numel * sizeof *out), l = 0;
  c->ref(c, in, out);
  for (int64_t i = 0; i < c->out_numel; i++) l += out[i] * r[i];
  free(out);
  return l;
}

static void check_case(clpar_device *dev, const op_case *c, uint64_t seed) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *in[3] = {NULL, NULL, NULL};
  double *in64[3] = {NULL, NULL, NULL};
  for (int i = 0; i < c->n_in; i++) {
    int64_t n = numel_of(c->ndim[i], c->shape[i]);
    float *v = tu_rand((size_t)n, seed + (uint64_t)i);
    if (c->training && i == 1) /* batch-norm weights away from 0 */
      for (int64_t j = 0; j < n; j++) v[j] += 1.5f;
    tu_ok(clpar_tensor_from_host(dev, c->ndim[i], c->shape[i], v, &in[i]));
    if (c->grad[i]) tu_ok(clpar_tensor_set_requires_grad(in[i], 1));
    in64[i] = malloc((size_t)n * sizeof(double));
    for (int64_t j = 0; j < n; j++) in64[i][j] = v[j];
    free(v);
  }
  clpar_tensor *y, *r, *prod, *loss;
  tu_ok(c->run(c, in, &y));
  assert_int_equal(clpar_tensor_numel(y), c->out_numel);
  float *rv = tu_rand((size_t)c->out_numel, seed + 7);
  double *r64 = malloc((size_t)c->out_numel * sizeof *r64), *y64 = malloc((size_t)c->out_numel * 8);
  float *yref = malloc((size_t)c->out_numel * sizeof *yref);
  for (int64_t j = 0; j < c->out_numel; j++) r64[j] = rv[j];
  c->ref(c, in64, y64);
  for (int64_t j = 0; j < c->out_numel; j++) yref[j] = (float)y64[j];
  float *yv = tu_read(y);
  char what[160];
  snprintf(what, sizeof what, "%s forward on %s", c->name, dev->bd.info.id);
  tu_assert_close(yv, yref, (size_t)c->out_numel, 1e-4f, 1e-4f, what);
  int64_t one = c->out_numel;
  tu_ok(clpar_tensor_from_host(dev, 1, &one, rv, &r));
  int64_t flat = c->out_numel;
  clpar_tensor *yf;
  tu_ok(clpar_tensor_reshape(y, 1, &flat, &yf));
  tu_ok(clpar_mul(yf, r, &prod));
  tu_ok(clpar_sum(prod, &loss));
  tu_ok(clpar_backward(loss));
  for (int i = 0; i < c->n_in; i++) {
    if (!c->grad[i]) continue;
    int64_t n = numel_of(c->ndim[i], c->shape[i]);
    float *g = tu_read(clpar_tensor_grad(in[i]));
    for (int t = 0; t < 16; t++) {
      int64_t j = (n * t) / 16 + (t * 7) % (n / 16 + 1);
      if (j >= n) j = n - 1;
      double keep = in64[i][j], h = 1e-4;
      in64[i][j] = keep + h;
      double lp = loss64(c, in64, r64);
      in64[i][j] = keep - h;
      double lm = loss64(c, in64, r64);
      in64[i][j] = keep;
      double fd = (lp - lm) / (2 * h);
      if (fabs(g[j] - fd) > 2e-3 * (1 + fabs(fd)))
        fail_msg("%s on %s: d/d input %d [%lld] is %.7g, finite differences give %.7g", c->name,
                 dev->bd.info.id, i, (long long)j, g[j], fd);
    }
    free(g);
  }
  for (int i = 0; i < 3; i++) free(in64[i]);
  free(rv), free(r64), free(y64), free(yref), free(yv);
  clpar_scope_end(sc);
}

/* ---- convolution ---- */

static void conv_ref(const op_case *c, double *const *in, double *out) {
  const int64_t *xs = c->shape[0], *ws = c->shape[1];
  int64_t n = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], kh = ws[2], kw = ws[3];
  int64_t g = c->opt.groups, cg = C / g, og = O / g, oh = c->oh, ow = c->ow;
  for (int64_t b = 0; b < n; b++)
    for (int64_t o = 0; o < O; o++)
      for (int64_t y = 0; y < oh; y++)
        for (int64_t x = 0; x < ow; x++) {
          double s = c->n_in > 2 ? in[2][o] : 0;
          for (int64_t ci = 0; ci < cg; ci++)
            for (int64_t i = 0; i < kh; i++)
              for (int64_t j = 0; j < kw; j++) {
                int64_t iy = y * c->opt.stride[0] - c->opt.padding[0] + i * c->opt.dilation[0];
                int64_t ix = x * c->opt.stride[1] - c->opt.padding[1] + j * c->opt.dilation[1];
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                s += in[0][((b * C + o / og * cg + ci) * H + iy) * W + ix] *
                     in[1][((o * cg + ci) * kh + i) * kw + j];
              }
          out[((b * O + o) * oh + y) * ow + x] = s;
        }
}

static clpar_status conv_run(const op_case *c, clpar_tensor **in, clpar_tensor **out) {
  return clpar_conv2d(in[0], in[1], c->n_in > 2 ? in[2] : NULL, &c->opt, out);
}

static op_case conv_case(const char *name, int64_t n, int64_t C, int64_t H, int64_t W, int64_t O,
                         int64_t kh, int64_t kw, clpar_conv2d_options o, int bias) {
  op_case c = {0};
  c.name = name;
  c.n_in = bias ? 3 : 2;
  c.ndim[0] = c.ndim[1] = 4, c.ndim[2] = 1;
  int64_t xs[4] = {n, C, H, W}, ws[4] = {O, C / o.groups, kh, kw};
  memcpy(c.shape[0], xs, sizeof xs);
  memcpy(c.shape[1], ws, sizeof ws);
  c.shape[2][0] = O;
  c.grad[0] = c.grad[1] = c.grad[2] = 1;
  c.run = conv_run, c.ref = conv_ref, c.opt = o;
  c.oh = (H + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  c.ow = (W + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  c.out_numel = n * O * c.oh * c.ow;
  return c;
}

#define OPT(s0, s1, p0, p1, d0, d1, g) \
  (clpar_conv2d_options) {             \
    {s0, s1}, {p0, p1}, {d0, d1}, g    \
  }

#define N_CONV_CASES 9

static void conv_cases(op_case *cs) {
  cs[0] = conv_case("conv 3x3 pad 1", 2, 3, 7, 6, 4, 3, 3, OPT(1, 1, 1, 1, 1, 1, 1), 1);
  cs[1] = conv_case("conv stride (2,1) pad (1,0) dilation (2,1) groups 2", 3, 4, 9, 8, 6, 3, 2,
                    OPT(2, 1, 1, 0, 2, 1, 2), 1);
  cs[2] = conv_case("depthwise 3x3 stride 2", 2, 5, 6, 7, 5, 3, 3, OPT(2, 2, 1, 1, 1, 1, 5), 0);
  cs[3] = conv_case("1x1 direct", 2, 3, 16, 17, 5, 1, 1, OPT(1, 1, 0, 0, 1, 1, 1), 1);
  cs[4] = conv_case("1x1 stride 2", 2, 6, 7, 5, 4, 1, 1, OPT(2, 2, 0, 0, 1, 1, 1), 0);
  cs[5] = conv_case("5x5 stride 3 pad 2", 1, 2, 11, 13, 3, 5, 5, OPT(3, 3, 2, 2, 1, 1, 1), 1);
  cs[6] = conv_case("1x1 direct groups 3", 1, 6, 16, 16, 9, 1, 1, OPT(1, 1, 0, 0, 1, 1, 3), 0);
  cs[7] = conv_case("3x3 dilation 2 pad 3 (whole taps in the padding)", 2, 2, 4, 5, 3, 3, 3,
                    OPT(1, 2, 3, 3, 2, 2, 1), 1);
  cs[8] = conv_case("3x3 pad 1 groups 2, per-image GEMMs into NCHW", 2, 4, 18, 17, 4, 3, 3,
                    OPT(1, 1, 1, 1, 1, 1, 2), 1);
}

static void each_device(void (*fn)(clpar_device *)) {
  for (int d = 0; d < clpar_device_count(); d++) fn(clpar_device_get(d));
  if (clpar_device_count() == 0 || clpar_device_get(0) != tu_host()) {
    int selected = 0;
    for (int d = 0; d < clpar_device_count(); d++) selected |= clpar_device_get(d) == tu_host();
    if (!selected) fn(tu_host());
  }
}

static void conv_on(clpar_device *dev) {
  op_case cs[N_CONV_CASES];
  conv_cases(cs);
  for (int i = 0; i < N_CONV_CASES; i++) check_case(dev, &cs[i], 100 + (uint64_t)i * 10);
}

static void test_conv_against_reference(void **state) {
  (void)state;
  each_device(conv_on);
}

/* Exact layer shapes of ResNet-50 at 64x64 (batch 1) and an odd-sized strided one: products
 * over 2^20 multiply-adds, which a CPU OpenCL device runs with its register-tiled GEMM
 * (gemm_tile.cl) around im2col / col2im. */
static void conv_resnet_on(clpar_device *dev) {
  op_case cs[] = {
      conv_case("ResNet-50 conv1 7x7 stride 2 pad 3", 1, 3, 64, 64, 64, 7, 7,
                OPT(2, 2, 3, 3, 1, 1, 1), 0),
      conv_case("ResNet-50 layer1 1x1 256 -> 64 (direct)", 1, 256, 16, 16, 64, 1, 1,
                OPT(1, 1, 0, 0, 1, 1, 1), 0),
      conv_case("ResNet-50 layer2 3x3 stride 2", 1, 128, 16, 16, 128, 3, 3,
                OPT(2, 2, 1, 1, 1, 1, 1), 0),
      conv_case("ResNet-50 layer3 3x3 at 4x4", 1, 256, 4, 4, 256, 3, 3, OPT(1, 1, 1, 1, 1, 1, 1),
                0),
      conv_case("3x3 stride 2 on 15x13, 40 -> 24, batch 3", 3, 40, 15, 13, 24, 3, 3,
                OPT(2, 2, 1, 1, 1, 1, 1), 1),
  };
  for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) check_case(dev, &cs[i], 500 + i * 10);
}

static void test_conv_resnet_shapes(void **state) {
  (void)state;
  each_device(conv_resnet_on);
}

/* A few floats of columns per chunk: every image (and the last, partial chunk) on its own. */
static void conv_chunked_on(clpar_device *dev) {
  int64_t keep = clpar_conv_chunk_floats;
  op_case cs[N_CONV_CASES];
  conv_cases(cs);
  clpar_conv_chunk_floats = 600;
  for (int i = 0; i < 3; i++) check_case(dev, &cs[i], 200 + (uint64_t)i);
  clpar_conv_chunk_floats = 12; /* one image per chunk on every path, 1x1 weight products too */
  for (int i = 0; i < N_CONV_CASES; i++) check_case(dev, &cs[i], 300 + (uint64_t)i);
  clpar_conv_chunk_floats = keep;
}

static void test_conv_in_chunks(void **state) {
  (void)state;
  each_device(conv_chunked_on);
}

/* ---- the gemm_batched entry ---- */

/* C_i = alpha op(A_i) op(B_i) + beta C_i through the device's entry, against float64: A shared
 * (stride 0) or strided, leading dimensions and strides larger than the matrices. */
static void gemm_batched_mnk(clpar_device *dev, int ta, int tb, int share_a, int64_t batch,
                             float beta, uint64_t seed, int64_t m, int64_t n, int64_t k) {
  int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
  int64_t sa = share_a ? 0 : (ta ? k : m) * lda + 4, sb = (tb ? n : k) * ldb + 1, sc = m * ldc + 5;
  int64_t na = (share_a ? 1 : batch) * ((ta ? k : m) * lda + 4), nb = batch * sb, nc = batch * sc;
  clpar_tensor *a = tu_make(dev, 1, &na, seed), *b = tu_make(dev, 1, &nb, seed + 1);
  clpar_tensor *c = tu_make(dev, 1, &nc, seed + 2);
  float *ha = tu_read(a), *hb = tu_read(b), *hc = tu_read(c);
  float alpha = 0.75f;
  tu_ok(clpar_dev_gemm_batched_sync(dev, ta, tb, (size_t)m, (size_t)n, (size_t)k, alpha,
                                    clpar_tensor_bref(a), (size_t)lda, (size_t)sa,
                                    clpar_tensor_bref(b), (size_t)ldb, (size_t)sb, beta,
                                    clpar_tensor_bref(c), (size_t)ldc, (size_t)sc, (size_t)batch));
  float *got = tu_read(c), *want = malloc((size_t)nc * sizeof *want);
  assert_non_null(want);
  memcpy(want, hc, (size_t)nc * sizeof *want); /* outside the C_i: untouched */
  for (int64_t bi = 0; bi < batch; bi++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double acc = 0.0;
        for (int64_t p = 0; p < k; p++) {
          double av = ha[bi * sa + (ta ? p * lda + i : i * lda + p)];
          double bv = hb[bi * sb + (tb ? j * ldb + p : p * ldb + j)];
          acc += av * bv;
        }
        int64_t e = bi * sc + i * ldc + j;
        want[e] = (float)(alpha * acc + (double)beta * hc[e]);
      }
  tu_assert_close(got, want, (size_t)nc, 1e-5f, 1e-5f, dev->bd.info.id);
  free(ha), free(hb), free(hc), free(got), free(want);
  clpar_tensor_free(a), clpar_tensor_free(b), clpar_tensor_free(c);
}

static void gemm_batched_case(clpar_device *dev, int ta, int tb, int share_a, int64_t batch,
                              float beta, uint64_t seed) {
  gemm_batched_mnk(dev, ta, tb, share_a, batch, beta, seed, 5, 7, 6);
}

static void gemm_batched_on(clpar_device *dev) {
  for (int t = 0; t < 4; t++) {
    gemm_batched_case(dev, t & 1, t >> 1, 0, 3, 0.0f, 400 + (uint64_t)t * 3);
    gemm_batched_case(dev, t & 1, t >> 1, 1, 4, -0.5f, 420 + (uint64_t)t * 3);
    /* over 2^20 multiply-adds: a CPU OpenCL device's register-tiled kernel (gemm_tile.cl),
     * with full tiles and edges in m, n and k */
    gemm_batched_mnk(dev, t & 1, t >> 1, 0, 2, t & 1 ? -0.5f : 0.0f, 450 + (uint64_t)t * 3, 37, 70,
                     433);
  }
  gemm_batched_case(dev, 0, 0, 1, 1, 1.0f, 440);
  gemm_batched_mnk(dev, 0, 1, 1, 1, 1.0f, 470, 64, 96, 256); /* full tiles only */
}

static void test_gemm_batched(void **state) {
  (void)state;
  each_device(gemm_batched_on);
}

/* ---- pooling ---- */

static void maxpool_ref(const op_case *c, double *const *in, double *out) {
  int64_t planes = c->shape[0][0] * c->shape[0][1], H = c->shape[0][2], W = c->shape[0][3];
  for (int64_t b = 0; b < planes; b++)
    for (int64_t y = 0; y < c->oh; y++)
      for (int64_t x = 0; x < c->ow; x++) {
        double m = -INFINITY;
        for (int64_t i = 0; i < c->k[0]; i++)
          for (int64_t j = 0; j < c->k[1]; j++) {
            int64_t iy = y * c->s[0] - c->p[0] + i, ix = x * c->s[1] - c->p[1] + j;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W && in[0][(b * H + iy) * W + ix] > m)
              m = in[0][(b * H + iy) * W + ix];
          }
        out[(b * c->oh + y) * c->ow + x] = m;
      }
}

static clpar_status maxpool_run(const op_case *c, clpar_tensor **in, clpar_tensor **out) {
  return clpar_max_pool2d(in[0], c->k, c->s, c->p, out);
}

static op_case pool_case(const char *name, int64_t n, int64_t C, int64_t H, int64_t W) {
  op_case c = {0};
  c.name = name;
  c.n_in = 1;
  c.ndim[0] = 4;
  int64_t xs[4] = {n, C, H, W};
  memcpy(c.shape[0], xs, sizeof xs);
  c.grad[0] = 1;
  return c;
}

static op_case maxpool_case(int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                            int64_t ph, int64_t pw) {
  op_case c = pool_case("max_pool2d", 2, 3, H, W);
  c.run = maxpool_run, c.ref = maxpool_ref;
  c.k[0] = kh, c.k[1] = kw, c.s[0] = sh, c.s[1] = sw, c.p[0] = ph, c.p[1] = pw;
  c.oh = (H + 2 * ph - kh) / sh + 1, c.ow = (W + 2 * pw - kw) / sw + 1;
  c.out_numel = 6 * c.oh * c.ow;
  return c;
}

static int64_t bin0(int64_t i, int64_t in, int64_t out) {
  return i * in / out;
}
static int64_t bin1(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

static void adaptive_ref(const op_case *c, double *const *in, double *out) {
  int64_t planes = c->shape[0][0] * c->shape[0][1], H = c->shape[0][2], W = c->shape[0][3];
  for (int64_t b = 0; b < planes; b++)
    for (int64_t y = 0; y < c->oh; y++)
      for (int64_t x = 0; x < c->ow; x++) {
        double s = 0;
        int64_t y0 = bin0(y, H, c->oh), y1 = bin1(y, H, c->oh);
        int64_t x0 = bin0(x, W, c->ow), x1 = bin1(x, W, c->ow);
        for (int64_t i = y0; i < y1; i++)
          for (int64_t j = x0; j < x1; j++) s += in[0][(b * H + i) * W + j];
        out[(b * c->oh + y) * c->ow + x] = s / (double)((y1 - y0) * (x1 - x0));
      }
}

static clpar_status adaptive_run(const op_case *c, clpar_tensor **in, clpar_tensor **out) {
  return clpar_adaptive_avg_pool2d(in[0], c->oh, c->ow, out);
}

static op_case adaptive_case(int64_t H, int64_t W, int64_t oh, int64_t ow) {
  op_case c = pool_case("adaptive_avg_pool2d", 2, 3, H, W);
  c.run = adaptive_run, c.ref = adaptive_ref, c.oh = oh, c.ow = ow;
  c.out_numel = 6 * oh * ow;
  return c;
}

static void pool_on(clpar_device *dev) {
  op_case cs[] = {maxpool_case(9, 8, 3, 3, 2, 2, 1, 1),
                  maxpool_case(7, 11, 2, 3, 1, 2, 0, 1),
                  maxpool_case(5, 5, 5, 5, 1, 1, 2, 2),
                  adaptive_case(7, 5, 3, 2),
                  adaptive_case(9, 6, 1, 1),
                  adaptive_case(4, 5, 6, 7)};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) check_case(dev, &cs[i], 300 + i);
}

static void test_pool_against_reference(void **state) {
  (void)state;
  each_device(pool_on);
}

/* ---- batch norm ---- */

static void bn_ref(const op_case *c, double *const *in, double *out) {
  int64_t n = c->shape[0][0], C = c->shape[0][1], P = c->shape[0][2] * c->shape[0][3];
  for (int64_t ch = 0; ch < C; ch++) {
    double mu = 0, var = 0;
    if (c->training) {
      for (int64_t b = 0; b < n; b++)
        for (int64_t q = 0; q < P; q++) mu += in[0][(b * C + ch) * P + q];
      mu /= (double)(n * P);
      for (int64_t b = 0; b < n; b++)
        for (int64_t q = 0; q < P; q++) {
          double d = in[0][(b * C + ch) * P + q] - mu;
          var += d * d;
        }
      var /= (double)(n * P);
    } else { /* the running statistics the run gives clpar */
      mu = 0.25 * (double)ch - 0.3;
      var = 0.5 + 0.4 * (double)ch;
    }
    for (int64_t b = 0; b < n; b++)
      for (int64_t q = 0; q < P; q++) {
        int64_t k = (b * C + ch) * P + q;
        out[k] = (in[0][k] - mu) / sqrt(var + 1e-5) * in[1][ch] + in[2][ch];
      }
  }
}

static clpar_status bn_run(const op_case *c, clpar_tensor **in, clpar_tensor **out) {
  int64_t C = c->shape[0][1];
  float rm[64], rv[64];
  for (int64_t ch = 0; ch < C; ch++)
    rm[ch] = 0.25f * (float)ch - 0.3f, rv[ch] = 0.5f + 0.4f * (float)ch;
  clpar_tensor *m, *v;
  clpar_status s = clpar_tensor_from_host(clpar_tensor_device(in[0]), 1, &C, rm, &m);
  if (s == CLPAR_OK) s = clpar_tensor_from_host(clpar_tensor_device(in[0]), 1, &C, rv, &v);
  if (s == CLPAR_OK) s = clpar_batch_norm(in[0], m, v, in[1], in[2], c->training, 0.1f, 1e-5f, out);
  return s;
}

static op_case bn_case(int training, int64_t n, int64_t C, int64_t H, int64_t W) {
  op_case c = pool_case(training ? "batch_norm training" : "batch_norm eval", n, C, H, W);
  c.n_in = 3;
  c.ndim[1] = c.ndim[2] = 1;
  c.shape[1][0] = c.shape[2][0] = C;
  c.grad[1] = c.grad[2] = 1;
  c.run = bn_run, c.ref = bn_ref, c.training = training;
  c.out_numel = n * C * H * W;
  return c;
}

static void bn_on(clpar_device *dev) {
  op_case cs[] = {bn_case(1, 3, 4, 5, 7), bn_case(0, 3, 4, 5, 7), bn_case(1, 2, 3, 1, 1),
                  bn_case(1, 5, 2, 33, 31)};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) check_case(dev, &cs[i], 400 + i);
}

#ifdef CLPAR_HAVE_OPENCL
/* The OpenCL backend's switch between one work-item per channel (CPU devices) and a
 * work-group tree (other devices) in the batch-norm reductions (ocl_conv.c). */
extern int clpar_ocl_bn_serial;
#endif

static void test_batch_norm_against_reference(void **state) {
  (void)state;
  each_device(bn_on);
#ifdef CLPAR_HAVE_OPENCL
  int keep = clpar_ocl_bn_serial;
  clpar_ocl_bn_serial = 0; /* the work-group path on CPU devices too */
  each_device(bn_on);
  clpar_ocl_bn_serial = keep;
#endif
}

/* The running statistics after one training call: momentum 0.1, unbiased variance. */
static void bn_running_on(clpar_device *dev) {
  clpar_scope *sc = clpar_scope_begin();
  int64_t xs[4] = {3, 2, 4, 5}, C = 2;
  clpar_tensor *x = tu_make(dev, 4, xs, 77), *rm, *rv, *y;
  float m0[2] = {0.5f, -1}, v0[2] = {2, 0.5f};
  tu_ok(clpar_tensor_from_host(dev, 1, &C, m0, &rm));
  tu_ok(clpar_tensor_from_host(dev, 1, &C, v0, &rv));
  tu_ok(clpar_batch_norm(x, rm, rv, NULL, NULL, 1, 0.1f, 1e-5f, &y));
  float *xv = tu_read(x), *mv = tu_read(rm), *vv = tu_read(rv);
  for (int ch = 0; ch < 2; ch++) {
    double mu = 0, sq = 0;
    for (int b = 0; b < 3; b++)
      for (int q = 0; q < 20; q++) mu += xv[(b * 2 + ch) * 20 + q];
    mu /= 60;
    for (int b = 0; b < 3; b++)
      for (int q = 0; q < 20; q++) sq += pow(xv[(b * 2 + ch) * 20 + q] - mu, 2);
    assert_float_equal(mv[ch], 0.9 * m0[ch] + 0.1 * mu, 1e-6);
    assert_float_equal(vv[ch], 0.9 * v0[ch] + 0.1 * sq / 59, 1e-6);
  }
  free(xv), free(mv), free(vv);
  clpar_scope_end(sc);
}

static void test_batch_norm_running_stats(void **state) {
  (void)state;
  each_device(bn_running_on);
}

/* ---- PyTorch's numbers ---- */

static clpar_tensor *up(clpar_device *dev, int ndim, const int64_t *shape, const float *v) {
  clpar_tensor *t;
  tu_ok(clpar_tensor_from_host(dev, ndim, shape, v, &t));
  return t;
}

static void expect(const clpar_tensor *t, const float *ref, size_t n, const char *what) {
  assert_int_equal(clpar_tensor_numel(t), (int64_t)n);
  float *v = tu_read(t);
  tu_assert_close(v, ref, n, 1e-4f, 1e-5f, what);
  free(v);
}

/* loss = sum(y * gy), so every gradient is PyTorch's for that gy. */
static void backward_with(clpar_tensor *y, const float *gy) {
  int64_t n = clpar_tensor_numel(y);
  clpar_tensor *g = up(clpar_tensor_device(y), 1, &n, gy), *yf, *p, *l;
  tu_ok(clpar_tensor_reshape(y, 1, &n, &yf));
  tu_ok(clpar_mul(yf, g, &p));
  tu_ok(clpar_sum(p, &l));
  tu_ok(clpar_backward(l));
}

#define TORCH_CONV(tag, bias_, s0, s1, p0, p1, d0, d1, g)                                \
  do {                                                                                   \
    clpar_scope *sc = clpar_scope_begin();                                               \
    clpar_conv2d_options o = OPT(s0, s1, p0, p1, d0, d1, g);                             \
    clpar_tensor *x = up(dev, 4, tag##_xs, tag##_x), *w = up(dev, 4, tag##_ws, tag##_w), \
                 *b = NULL, *y;                                                          \
    tu_ok(clpar_tensor_set_requires_grad(x, 1));                                         \
    tu_ok(clpar_tensor_set_requires_grad(w, 1));                                         \
    bias_;                                                                               \
    tu_ok(clpar_conv2d(x, w, b, &o, &y));                                                \
    expect(y, tag##_y, sizeof tag##_y / 4, #tag " y");                                   \
    backward_with(y, tag##_gy);                                                          \
    expect(clpar_tensor_grad(x), tag##_dx, sizeof tag##_dx / 4, #tag " dx");             \
    expect(clpar_tensor_grad(w), tag##_dw, sizeof tag##_dw / 4, #tag " dw");             \
    clpar_scope_end(sc);                                                                 \
  } while (0)

#define WITH_BIAS(tag)          \
  int64_t nb = tag##_ws[0];     \
  b = up(dev, 1, &nb, tag##_b); \
  tu_ok(clpar_tensor_set_requires_grad(b, 1))

static void torch_on(clpar_device *dev) {
  TORCH_CONV(c1, WITH_BIAS(c1), 1, 1, 1, 1, 1, 1, 1);
  TORCH_CONV(c2, WITH_BIAS(c2), 2, 1, 1, 0, 2, 1, 2);
  TORCH_CONV(c3, (void)0, 2, 2, 1, 1, 1, 1, 4);
  TORCH_CONV(c4, WITH_BIAS(c4), 1, 1, 0, 0, 1, 1, 1);
  { /* the bias gradients, once more with the bias alone requiring one */
    clpar_scope *sc = clpar_scope_begin();
    int64_t nb = c1_ws[0];
    clpar_tensor *x = up(dev, 4, c1_xs, c1_x), *w = up(dev, 4, c1_ws, c1_w),
                 *b = up(dev, 1, &nb, c1_b), *y;
    clpar_conv2d_options o = OPT(1, 1, 1, 1, 1, 1, 1);
    tu_ok(clpar_tensor_set_requires_grad(b, 1));
    tu_ok(clpar_conv2d(x, w, b, &o, &y));
    backward_with(y, c1_gy);
    expect(clpar_tensor_grad(b), c1_db, 4, "c1 db");
    clpar_scope_end(sc);
  }
  /* batch norm: three training steps, then eval */
  clpar_scope *sc = clpar_scope_begin();
  int64_t C = 3, xs[4] = {2, 3, 4, 5};
  float zeros[3] = {0, 0, 0}, ones[3] = {1, 1, 1};
  clpar_tensor *rm = up(dev, 1, &C, zeros), *rv = up(dev, 1, &C, ones);
  clpar_tensor *w = up(dev, 1, &C, bn_w), *b = up(dev, 1, &C, bn_b), *y = NULL;
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  tu_ok(clpar_tensor_set_requires_grad(b, 1));
  const float *steps[3] = {bn_x0, bn_x1, bn_x2};
  clpar_tensor *x = NULL;
  for (int s = 0; s < 3; s++) {
    x = up(dev, 4, xs, steps[s]);
    tu_ok(clpar_tensor_set_requires_grad(x, 1));
    tu_ok(clpar_batch_norm(x, rm, rv, w, b, 1, 0.1f, 1e-5f, &y));
  }
  expect(y, bn_y, 120, "batch norm y");
  backward_with(y, bn_gy);
  expect(clpar_tensor_grad(x), bn_dx, 120, "batch norm dx");
  expect(clpar_tensor_grad(w), bn_dw, 3, "batch norm dweight");
  expect(clpar_tensor_grad(b), bn_dbias, 3, "batch norm dbias");
  expect(rm, bn_rm, 3, "running_mean after 3 steps");
  expect(rv, bn_rv, 3, "running_var after 3 steps");
  clpar_tensor *we = up(dev, 1, &C, bn_w), *be = up(dev, 1, &C, bn_b);
  tu_ok(clpar_tensor_set_requires_grad(we, 1));
  tu_ok(clpar_tensor_set_requires_grad(be, 1));
  x = up(dev, 4, xs, bne_x);
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_batch_norm(x, rm, rv, we, be, 0, 0.1f, 1e-5f, &y));
  expect(y, bne_y, 120, "batch norm eval y");
  backward_with(y, bn_gy);
  expect(clpar_tensor_grad(x), bne_dx, 120, "batch norm eval dx");
  expect(clpar_tensor_grad(we), bne_dw, 3, "batch norm eval dweight");
  expect(clpar_tensor_grad(be), bne_dbias, 3, "batch norm eval dbias");
  /* pooling */
  int64_t ps[4] = {1, 2, 9, 8}, k1[2] = {3, 3}, s1[2] = {2, 2}, p1[2] = {1, 1};
  int64_t k2[2] = {2, 3}, s2[2] = {1, 2}, p2[2] = {0, 1};
  x = up(dev, 4, ps, mp1_x);
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_max_pool2d(x, k1, s1, p1, &y));
  expect(y, mp1_y, sizeof mp1_y / 4, "max pool 3x3/2 y");
  backward_with(y, mp1_gy);
  expect(clpar_tensor_grad(x), mp1_dx, sizeof mp1_dx / 4, "max pool 3x3/2 dx");
  x = up(dev, 4, ps, mp2_x);
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_max_pool2d(x, k2, s2, p2, &y));
  expect(y, mp2_y, sizeof mp2_y / 4, "max pool 2x3 y");
  backward_with(y, mp2_gy);
  expect(clpar_tensor_grad(x), mp2_dx, sizeof mp2_dx / 4, "max pool 2x3 dx");
  int64_t as[4] = {1, 3, 7, 5};
  x = up(dev, 4, as, ap1_x);
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_adaptive_avg_pool2d(x, 3, 2, &y));
  expect(y, ap1_y, sizeof ap1_y / 4, "adaptive 3x2 y");
  backward_with(y, ap1_gy);
  expect(clpar_tensor_grad(x), ap1_dx, sizeof ap1_dx / 4, "adaptive 3x2 dx");
  x = up(dev, 4, as, ap2_x);
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_adaptive_avg_pool2d(x, 1, 1, &y));
  expect(y, ap2_y, sizeof ap2_y / 4, "adaptive 1x1 y");
  backward_with(y, ap2_gy);
  expect(clpar_tensor_grad(x), ap2_dx, sizeof ap2_dx / 4, "adaptive 1x1 dx");
  clpar_scope_end(sc);
}

static void test_matches_pytorch(void **state) {
  (void)state;
  each_device(torch_on);
}

/* ---- modules ---- */

static void test_modules(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  clpar_conv2d_options o = OPT(2, 2, 1, 1, 1, 1, 1);
  clpar_module *conv, *pool, *avg, *flat, *seq;
  clpar_manual_seed(3);
  tu_ok(clpar_conv2d_create(3, 8, 3, 3, &o, 1, dev, &conv));
  assert_string_equal(clpar_module_type(conv), "Conv2d");
  clpar_tensor *w = clpar_module_parameter(conv, "weight"),
               *b = clpar_module_parameter(conv, "bias");
  assert_int_equal(clpar_tensor_ndim(w), 4);
  assert_int_equal(clpar_tensor_dim(w, 1), 3);
  float *wv = tu_read(w), bound = 1.0f / sqrtf(27.0f), mx = 0;
  for (int i = 0; i < 8 * 27; i++) mx = fmaxf(mx, fabsf(wv[i]));
  assert_true(mx <= bound && mx > 0.8f * bound);
  free(wv);
  assert_int_equal(clpar_tensor_numel(b), 8);
  tu_ok(clpar_max_pool2d_create((int64_t[]){3, 3}, (int64_t[]){2, 2}, (int64_t[]){1, 1}, &pool));
  assert_string_equal(clpar_module_type(pool), "MaxPool2d");
  tu_ok(clpar_adaptive_avg_pool2d_create(1, 1, &avg));
  assert_string_equal(clpar_module_type(avg), "AdaptiveAvgPool2d");
  tu_ok(clpar_flatten_create(1, -1, &flat));
  assert_string_equal(clpar_module_type(flat), "Flatten");
  tu_ok(clpar_sequential_create((clpar_module *[]){conv, pool, avg, flat}, 4, &seq));
  int64_t xs[4] = {2, 3, 17, 15};
  clpar_tensor *x = tu_make(dev, 4, xs, 9), *y, *l;
  tu_ok(clpar_module_forward(seq, x, &y));
  assert_int_equal(clpar_tensor_ndim(y), 2);
  assert_int_equal(clpar_tensor_dim(y, 0), 2);
  assert_int_equal(clpar_tensor_dim(y, 1), 8);
  tu_ok(clpar_sum(y, &l));
  tu_ok(clpar_backward(l));
  assert_non_null(clpar_tensor_grad(w));
  assert_int_equal(clpar_module_parameter_count(seq), 2);
  clpar_module_free(seq);
  clpar_scope_end(sc);
}

/* ---- bad input ---- */

static void test_bad_input(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_scope *sc = clpar_scope_begin();
    int64_t xs[4] = {2, 3, 5, 5}, ws[4] = {4, 3, 3, 3}, w2[4] = {4, 2, 3, 3}, big[4] = {4, 3, 9, 9};
    int64_t x3[3] = {3, 5, 5}, bs[1] = {5};
    clpar_tensor *x = tu_make(dev, 4, xs, 1), *w = tu_make(dev, 4, ws, 2),
                 *wc = tu_make(dev, 4, w2, 3);
    clpar_tensor *wb = tu_make(dev, 4, big, 4), *xx = tu_make(dev, 3, x3, 5),
                 *b5 = tu_make(dev, 1, bs, 6);
    clpar_memory_stats before, after;
    tu_ok(clpar_device_memory_stats(dev, &before));
    clpar_tensor *sentinel = (clpar_tensor *)(uintptr_t)0x1234, *out = sentinel;
    assert_int_equal(clpar_conv2d(xx, w, NULL, NULL, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_non_null(strstr(clpar_last_error(), "[3, 5, 5]"));
    assert_int_equal(clpar_conv2d(x, wc, NULL, NULL, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_non_null(strstr(clpar_last_error(), "[4, 2, 3, 3]"));
    assert_int_equal(clpar_conv2d(x, wb, NULL, NULL, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_non_null(strstr(clpar_last_error(), "larger than the padded input"));
    clpar_conv2d_options bad = OPT(-1, 1, 0, 0, 1, 1, 1); /* 0 would mean 1 */
    assert_int_equal(clpar_conv2d(x, w, NULL, &bad, &out), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "stride"));
    bad = (clpar_conv2d_options)OPT(1, 1, 0, 0, 1, 1, 2);
    assert_int_equal(clpar_conv2d(x, w, NULL, &bad, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_int_equal(clpar_conv2d(x, w, b5, NULL, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_non_null(strstr(clpar_last_error(), "bias"));
    assert_int_equal(clpar_conv2d(NULL, w, NULL, NULL, &out), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_int_equal(clpar_conv2d(x, NULL, NULL, NULL, &out), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_int_equal(clpar_conv2d(x, w, NULL, NULL, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
    int64_t k9[2] = {9, 9}, k3[2] = {3, 3}, s0[2] = {0, 1}, p2[2] = {2, 2};
    assert_int_equal(clpar_max_pool2d(x, k9, NULL, NULL, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_int_equal(clpar_max_pool2d(x, k3, s0, NULL, &out), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_int_equal(clpar_max_pool2d(x, k3, NULL, p2, &out), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_int_equal(clpar_max_pool2d(x, NULL, NULL, NULL, &out), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_int_equal(clpar_adaptive_avg_pool2d(x, 0, 1, &out), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_int_equal(clpar_adaptive_avg_pool2d(b5, 1, 1, &out), CLPAR_ERROR_SHAPE_MISMATCH);
    assert_int_equal(clpar_batch_norm(x, NULL, NULL, NULL, NULL, 0, 0.1f, 1e-5f, &out),
                     CLPAR_ERROR_INVALID_ARGUMENT);
    assert_int_equal(clpar_batch_norm(x, NULL, NULL, b5, NULL, 1, 0.1f, 1e-5f, &out),
                     CLPAR_ERROR_SHAPE_MISMATCH);
    assert_non_null(strstr(clpar_last_error(), "weight"));
    /* an int tensor where floats are needed */
    clpar_tensor *xi = NULL, *wi = NULL;
    tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT32, 4, xs, &xi));
    tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT64, 4, ws, &wi));
    tu_ok(clpar_device_memory_stats(dev, &before));
    assert_int_equal(clpar_conv2d(xi, w, NULL, NULL, &out), CLPAR_ERROR_DTYPE);
    assert_non_null(strstr(clpar_last_error(), "int32"));
    assert_int_equal(clpar_conv2d(x, wi, NULL, NULL, &out), CLPAR_ERROR_DTYPE);
    assert_non_null(strstr(clpar_last_error(), "int64"));
    assert_int_equal(clpar_max_pool2d(xi, k3, NULL, NULL, &out), CLPAR_ERROR_DTYPE);
    assert_int_equal(clpar_adaptive_avg_pool2d(xi, 1, 1, &out), CLPAR_ERROR_DTYPE);
    assert_int_equal(clpar_batch_norm(xi, NULL, NULL, NULL, NULL, 1, 0.1f, 1e-5f, &out),
                     CLPAR_ERROR_DTYPE);
    assert_ptr_equal(out, sentinel);
    tu_ok(clpar_device_memory_stats(dev, &after));
    assert_int_equal(after.bytes_in_use, before.bytes_in_use);
    assert_int_equal(after.driver_allocs, before.driver_allocs);
    clpar_module *m = NULL;
    assert_int_equal(clpar_conv2d_create(3, 4, 3, 3, &bad, 1, dev, &m),
                     CLPAR_ERROR_INVALID_ARGUMENT);
    assert_null(m);
    clpar_scope_end(sc);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_against_reference),
      cmocka_unit_test(test_conv_in_chunks),
      cmocka_unit_test(test_conv_resnet_shapes),
      cmocka_unit_test(test_gemm_batched),
      cmocka_unit_test(test_pool_against_reference),
      cmocka_unit_test(test_batch_norm_against_reference),
      cmocka_unit_test(test_batch_norm_running_stats),
      cmocka_unit_test(test_matches_pytorch),
      cmocka_unit_test(test_modules),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
