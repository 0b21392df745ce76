/* test_host_kernels.c — the host backend's fast paths against plain formulas: strided copies
 * (permutes whose innermost dimension is strided on either side, narrows), softmax over rows
 * short enough to keep their exps and rows too long to (the same bits either way), and GELU's
 * erf form over lengths that are not a multiple of the vector width, against double
 * precision; LayerNorm's weight and bias gradients against columns summed alone; the Adam
 * entry against its update written out. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

static int grad_on(void **state) {
  (void)state;
  clpar_set_grad_enabled(1);
  return 0;
}

/* A [2, 3, 5, 7] tensor of its own flat indices, permuted; each element checked. */
static void check_permute(const int *perm) {
  clpar_scope *scope = clpar_scope_begin();
  const int64_t shape[4] = {2, 3, 5, 7};
  float h[210];
  for (int i = 0; i < 210; i++) h[i] = (float)i;
  clpar_tensor *x, *p;
  tu_ok(clpar_tensor_from_host(tu_host(), 4, shape, h, &x));
  tu_ok(clpar_permute(x, perm, 4, &p));
  float *got = tu_read(p);
  int64_t st[4] = {105, 35, 7, 1}, ps[4];
  for (int d = 0; d < 4; d++) ps[d] = shape[perm[d]];
  int k = 0;
  for (int64_t a = 0; a < ps[0]; a++)
    for (int64_t b = 0; b < ps[1]; b++)
      for (int64_t c = 0; c < ps[2]; c++)
        for (int64_t e = 0; e < ps[3]; e++, k++) {
          int64_t src = a * st[perm[0]] + b * st[perm[1]] + c * st[perm[2]] + e * st[perm[3]];
          if (got[k] != (float)src)
            fail_msg("permute (%d %d %d %d): element %d is %g, want %lld", perm[0], perm[1],
                     perm[2], perm[3], k, got[k], (long long)src);
        }
  free(got);
  clpar_scope_end(scope);
}

static void test_strided_copies(void **state) {
  (void)state;
  check_permute((int[]){0, 1, 3, 2}); /* innermost strided when read */
  check_permute((int[]){3, 2, 1, 0}); /* every dimension moves */
  check_permute((int[]){1, 0, 2, 3}); /* contiguous rows of 35 */
  check_permute((int[]){0, 2, 1, 3}); /* contiguous rows of 7 */
  clpar_scope *scope = clpar_scope_begin();
  float h[40];
  for (int i = 0; i < 40; i++) h[i] = (float)i;
  clpar_tensor *x, *n;
  tu_ok(clpar_tensor_from_host(tu_host(), 2, (int64_t[]){4, 10}, h, &x));
  tu_ok(clpar_narrow(x, 1, 3, 4, &n)); /* rows of 4 out of rows of 10: a copy */
  float *got = tu_read(n);
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 4; c++) assert_true(got[r * 4 + c] == (float)(r * 10 + 3 + c));
  free(got);
  clpar_scope_end(scope);
}

/* softmax of rows of cols against exp(x - max) / sum in double, summed in the row's order:
 * equal bits. causal: row r's columns after r % cols are -inf (a causal mask's rows). */
static void check_softmax(int64_t rows, int64_t cols, int causal) {
  clpar_scope *scope = clpar_scope_begin();
  size_t n = (size_t)(rows * cols);
  float *h = tu_rand(n, 7);
  for (size_t i = 0; i < n; i++)
    h[i] = causal && (int64_t)(i % (size_t)cols) > (int64_t)(i / (size_t)cols) % cols
               ? -INFINITY
               : h[i] * 20.0f;
  clpar_tensor *x, *y;
  tu_ok(clpar_tensor_from_host(tu_host(), 2, (int64_t[]){rows, cols}, h, &x));
  tu_ok(clpar_softmax(x, &y));
  float *got = tu_read(y);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = h + r * cols;
    float max = xr[0];
    for (int64_t c = 1; c < cols; c++) max = xr[c] > max ? xr[c] : max;
    double sum = 0.0;
    for (int64_t c = 0; c < cols; c++) sum += exp((double)xr[c] - max);
    for (int64_t c = 0; c < cols; c++) {
      float want = (float)(exp((double)xr[c] - max) / sum);
      if (got[r * cols + c] != want)
        fail_msg("softmax of rows of %lld: [%lld, %lld] is %.9g, want %.9g", (long long)cols,
                 (long long)r, (long long)c, got[r * cols + c], want);
    }
  }
  free(h), free(got);
  clpar_scope_end(scope);
}

static void test_softmax_rows(void **state) {
  (void)state;
  check_softmax(5, 64, 0);
  check_softmax(3, 1024, 0);
  check_softmax(2, 1500, 0);
  check_softmax(4, 67, 0); /* groups of four and a tail */
  check_softmax(2, 3, 0);  /* shorter than a group */
  check_softmax(64, 64, 1);
  check_softmax(70, 35, 1);
}

/* GELU (erf form) and its derivative over n elements from -8 to 8 (some exact values among
 * them) against double precision: within a few float ulp of the result's scale. */
static void check_gelu(size_t n) {
  clpar_scope *scope = clpar_scope_begin();
  float *h = malloc(n * sizeof *h);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) h[i] = -8.0f + 16.0f * (float)i / (float)(n - 1);
  h[n / 2] = 0.0f, h[n / 3] = -0.0f, h[n / 5] = 40.0f, h[n / 7] = -40.0f;
  clpar_tensor *x, *y, *s;
  tu_ok(clpar_tensor_from_host(tu_host(), 1, (int64_t[]){(int64_t)n}, h, &x));
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_gelu(x, CLPAR_GELU_NONE, &y));
  tu_ok(clpar_sum(y, &s));
  tu_ok(clpar_backward(s));
  float *got = tu_read(y), *dx = tu_read(clpar_tensor_grad(x));
  for (size_t i = 0; i < n; i++) {
    double v = h[i], cdf = 0.5 * (1.0 + erf(v / sqrt(2.0)));
    double want = v * cdf, dwant = cdf + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
    double tol = 4e-7 * (1.0 + fabs(v));
    if (fabs(got[i] - want) > tol || fabs(dx[i] - dwant) > tol)
      fail_msg("gelu of %zu elements at %zu (x = %.9g): %.9g and %.9g, want %.9g and %.9g", n, i, v,
               got[i], dx[i], want, dwant);
  }
  free(h), free(got), free(dx);
  clpar_scope_end(scope);
}

static void test_gelu_erf(void **state) {
  (void)state;
  check_gelu(7); /* shorter than a vector */
  check_gelu(1003);
  check_gelu(4096 * 3 + 5); /* several chunks and a tail */
}

/* LayerNorm's weight and bias gradients against each column summed down the rows in float,
 * with the mean and 1/std as the host's forward computes them: equal bits. */
static void test_layernorm_param_grads(void **state) {
  (void)state;
  enum { R = 70, C = 300 }; /* two column blocks, the second partial */
  clpar_scope *scope = clpar_scope_begin();
  float *h = tu_rand(R * C, 11), *gh = tu_rand(R * C, 12);
  clpar_module *ln;
  clpar_tensor *x, *g, *y, *yg, *s;
  tu_ok(clpar_layernorm_create(C, 1e-5f, 1, tu_host(), &ln));
  tu_ok(clpar_tensor_from_host(tu_host(), 2, (int64_t[]){R, C}, h, &x));
  tu_ok(clpar_tensor_from_host(tu_host(), 2, (int64_t[]){R, C}, gh, &g));
  tu_ok(clpar_module_forward(ln, x, &y));
  tu_ok(clpar_mul(y, g, &yg)); /* d(sum(y g))/dy = g */
  tu_ok(clpar_sum(yg, &s));
  tu_ok(clpar_backward(s));
  float *dw = tu_read(clpar_tensor_grad(clpar_module_parameter(ln, "weight")));
  float *db = tu_read(clpar_tensor_grad(clpar_module_parameter(ln, "bias")));
  float m[R], rs[R]; /* the row statistics in double, rounded (the kernel sums in lanes) */
  for (int r = 0; r < R; r++) {
    double sum = 0.0, v = 0.0;
    for (int c = 0; c < C; c++) sum += h[r * C + c];
    m[r] = (float)(sum / C);
    for (int c = 0; c < C; c++) v += ((double)h[r * C + c] - m[r]) * ((double)h[r * C + c] - m[r]);
    rs[r] = (float)(1.0 / sqrt(v / C + 1e-5));
  }
  for (int c = 0; c < C; c++) { /* db: equal bits; dw within the statistics' rounding */
    float sw = 0.0f, sb = 0.0f, size = 0.0f;
    for (int r = 0; r < R; r++) {
      sw += gh[r * C + c] * ((h[r * C + c] - m[r]) * rs[r]);
      size += fabsf(gh[r * C + c] * ((h[r * C + c] - m[r]) * rs[r]));
      sb += gh[r * C + c];
    }
    if (fabsf(dw[c] - sw) > 1e-5f * size || db[c] != sb)
      fail_msg("layernorm column %d: dw %.9g db %.9g, want %.9g and %.9g", c, dw[c], db[c], sw, sb);
  }
  free(h), free(gh), free(dw), free(db);
  clpar_module_free(ln);
  clpar_scope_end(scope);
}

/* LayerNorm over rows of cols (mean far from 0) against the formulas in double: y and the
 * input's gradient within a few float roundings. */
static void check_layernorm(int64_t rows, int64_t cols) {
  clpar_scope *scope = clpar_scope_begin();
  size_t n = (size_t)(rows * cols);
  float *h = tu_rand(n, 13), *gh = tu_rand(n, 14);
  for (size_t i = 0; i < n; i++) h[i] = 3.0f * h[i] + 5.0f;
  clpar_module *ln;
  clpar_tensor *x, *g, *y, *yg, *s;
  tu_ok(clpar_layernorm_create(cols, 1e-5f, 0, tu_host(), &ln));
  tu_ok(clpar_tensor_from_host(tu_host(), 2, (int64_t[]){rows, cols}, h, &x));
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_tensor_from_host(tu_host(), 2, (int64_t[]){rows, cols}, gh, &g));
  tu_ok(clpar_module_forward(ln, x, &y));
  tu_ok(clpar_mul(y, g, &yg)); /* d(sum(y g))/dy = g */
  tu_ok(clpar_sum(yg, &s));
  tu_ok(clpar_backward(s));
  float *got = tu_read(y), *dx = tu_read(clpar_tensor_grad(x));
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = h + r * cols, *gr = gh + r * cols;
    double m = 0, v = 0, sg = 0, sgx = 0;
    for (int64_t c = 0; c < cols; c++) m += xr[c];
    m /= (double)cols;
    for (int64_t c = 0; c < cols; c++) v += (xr[c] - m) * (xr[c] - m);
    double rs = 1.0 / sqrt(v / (double)cols + 1e-5);
    for (int64_t c = 0; c < cols; c++) sg += gr[c], sgx += gr[c] * (xr[c] - m) * rs;
    for (int64_t c = 0; c < cols; c++) {
      double xh = (xr[c] - m) * rs, want_dx = rs * (gr[c] - sg / cols - xh * sgx / cols);
      if (fabs(got[r * cols + c] - xh) > 1e-5 || fabs(dx[r * cols + c] - want_dx) > 1e-5 * rs)
        fail_msg("layernorm of rows of %lld at [%lld, %lld]: y %.9g dx %.9g, want %.9g and %.9g",
                 (long long)cols, (long long)r, (long long)c, got[r * cols + c], dx[r * cols + c],
                 xh, want_dx);
    }
  }
  free(h), free(gh), free(got), free(dx);
  clpar_module_free(ln);
  clpar_scope_end(scope);
}

static void test_layernorm_rows(void **state) {
  (void)state;
  check_layernorm(9, 128); /* the GPT's width */
  check_layernorm(5, 67);  /* lanes and a tail */
  check_layernorm(3, 3);   /* shorter than a lane group */
}

/* The host's Adam entry, both kinds of weight decay, two steps over a length with a vector
 * tail, against the update written out with fmaf here: equal bits. */
static void check_adam(int decoupled) {
  enum { N = 1003 };
  clpar_scope *scope = clpar_scope_begin();
  float *p0 = tu_rand(N, 21), *g = tu_rand(N, 22), *p = malloc(N * sizeof *p);
  float m[N] = {0}, v[N] = {0};
  assert_non_null(p);
  clpar_tensor *tp, *tg, *tm, *tv;
  tu_ok(clpar_tensor_from_host(tu_host(), 1, (int64_t[]){N}, p0, &tp));
  tu_ok(clpar_tensor_from_host(tu_host(), 1, (int64_t[]){N}, g, &tg));
  tu_ok(clpar_tensor_zeros(tu_host(), 1, (int64_t[]){N}, &tm));
  tu_ok(clpar_tensor_zeros(tu_host(), 1, (int64_t[]){N}, &tv));
  memcpy(p, p0, N * sizeof *p);
  for (int t = 1; t <= 2; t++) {
    clpar_adam_args a = {1e-3f,
                         0.9f,
                         0.99f,
                         1e-8f,
                         0.1f,
                         0.1f,
                         0.01f,
                         1e-3f / (1.0f - powf(0.9f, (float)t)),
                         sqrtf(1.0f - powf(0.99f, (float)t)),
                         1.0f - 1e-4f,
                         decoupled};
    tu_ok(clpar_dev_adam_step(tu_host(), N, clpar_tensor_bref(tp), clpar_tensor_bref(tg),
                              clpar_tensor_bref(tm), clpar_tensor_bref(tv), a));
    for (int i = 0; i < N; i++) {
      float gi = g[i];
      if (decoupled)
        p[i] *= a.keep;
      else
        gi = fmaf(a.weight_decay, p[i], gi);
      m[i] = fmaf(a.one_minus_beta1, gi, a.beta1 * m[i]);
      v[i] = fmaf(a.one_minus_beta2 * gi, gi, a.beta2 * v[i]);
      p[i] -= a.step * m[i] / (sqrtf(v[i]) / a.root2 + a.eps);
    }
  }
  float *got = tu_read(tp), *gm = tu_read(tm), *gv = tu_read(tv);
  for (int i = 0; i < N; i++)
    if (got[i] != p[i] || gm[i] != m[i] || gv[i] != v[i])
      fail_msg("adam (decoupled %d) at %d: %.9g %.9g %.9g, want %.9g %.9g %.9g", decoupled, i,
               got[i], gm[i], gv[i], p[i], m[i], v[i]);
  free(p0), free(g), free(p), free(got), free(gm), free(gv);
  clpar_scope_end(scope);
}

static void test_adam_step(void **state) {
  (void)state;
  check_adam(1);
  check_adam(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_strided_copies, grad_on),
      cmocka_unit_test_setup(test_softmax_rows, grad_on),
      cmocka_unit_test_setup(test_gelu_erf, grad_on),
      cmocka_unit_test_setup(test_layernorm_param_grads, grad_on),
      cmocka_unit_test_setup(test_layernorm_rows, grad_on),
      cmocka_unit_test_setup(test_adam_step, grad_on),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
