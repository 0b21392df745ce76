/* test_tensor_ops.c — the tensor ops of transformers (ops.h, nn.h): permute, transpose,
 * narrow, cat, split_dim, bmm (also on permuted operands, as attention uses them), the
 * upper-triangle mask, exp, ln, sqrt, pow, div, GELU, N-d softmax and cross-entropy with
 * device targets and ignore_index. Every op runs on every selected device against the host
 * backend's result, and its backward against central finite differences; GELU and
 * cross-entropy also against PyTorch's numbers (reference/tensor_ops_ref.h from
 * reference/make_tensor_ops_ref.py); views, int dtypes, argmax and the errors on their own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/tensor_ops_ref.h"
#include "test_util.h"

#define MAX_IN 3

typedef clpar_status (*op_fn)(clpar_tensor **in, clpar_tensor **out, const void *ctx);

enum { ANY = 0, POSITIVE = 1, AWAY_FROM_ZERO = 2 };

typedef struct {
  const char *name;
  op_fn fn;
  const void *ctx;
  int n_in;
  int ndim[MAX_IN];
  int64_t shape[MAX_IN][4];
  int domain; /* the inputs' values: ANY, POSITIVE (log, sqrt) or AWAY_FROM_ZERO (div) */
} op_case;

static int64_t numel_of(const op_case *c, int i) {
  int64_t n = 1;
  for (int d = 0; d < c->ndim[i]; d++) n *= c->shape[i][d];
  return n;
}

/* loss = sum(f(inputs) * R) for a fixed random R; the output itself in *keep_out. */
static float eval_loss(const op_case *c, clpar_tensor **in, clpar_tensor **keep_loss,
                       float **keep_out, size_t *n_out) {
  clpar_tensor *out, *r, *prod, *loss;
  tu_ok(c->fn(in, &out, c->ctx));
  size_t n = (size_t)clpar_tensor_numel(out);
  float *rv = tu_rand(n, 99);
  int64_t shape[CLPAR_MAX_DIMS];
  for (int d = 0; d < clpar_tensor_ndim(out); d++) shape[d] = clpar_tensor_dim(out, d);
  tu_ok(clpar_tensor_from_host(clpar_tensor_device(out), clpar_tensor_ndim(out), shape, rv, &r));
  tu_ok(clpar_mul(out, r, &prod));
  tu_ok(clpar_sum(prod, &loss));
  float v;
  tu_ok(clpar_tensor_read(loss, &v, 1));
  if (keep_out) *keep_out = tu_read(out), *n_out = n;
  free(rv);
  clpar_tensor_free(out), clpar_tensor_free(r), clpar_tensor_free(prod);
  if (keep_loss)
    *keep_loss = loss;
  else
    clpar_tensor_free(loss);
  return v;
}

static float *case_input(const op_case *c, int i) {
  float *h = tu_rand((size_t)numel_of(c, i), 10 + (uint64_t)i);
  for (int64_t j = 0; j < numel_of(c, i); j++) {
    if (c->domain == POSITIVE) h[j] = fabsf(h[j]) + 0.5f;
    if (c->domain == AWAY_FROM_ZERO) h[j] += h[j] < 0 ? -0.5f : 0.5f;
  }
  return h;
}

/* The op's output on the host backend, for the other devices to match. */
static float *host_output(const op_case *c, size_t *n) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *in[MAX_IN];
  for (int i = 0; i < c->n_in; i++) {
    float *h = case_input(c, i);
    tu_ok(clpar_tensor_from_host(tu_host(), c->ndim[i], c->shape[i], h, &in[i]));
    free(h);
  }
  float *out;
  eval_loss(c, in, NULL, &out, n);
  clpar_scope_end(scope);
  return out;
}

static void check_case(clpar_device *dev, const op_case *c) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *in[MAX_IN], *loss;
  float *host[MAX_IN], *out;
  size_t n_out, n_ref;
  for (int i = 0; i < c->n_in; i++) {
    host[i] = case_input(c, i);
    tu_ok(clpar_tensor_from_host(dev, c->ndim[i], c->shape[i], host[i], &in[i]));
    tu_ok(clpar_tensor_set_requires_grad(in[i], 1));
  }
  eval_loss(c, in, &loss, &out, &n_out);
  char what[160];
  if (dev != tu_host()) {
    float *ref = host_output(c, &n_ref);
    assert_int_equal(n_out, n_ref);
    snprintf(what, sizeof what, "%s on %s against the host", c->name, clpar_device_id(dev));
    tu_assert_close(out, ref, n_out, 1e-4f, 1e-5f, what);
    free(ref);
  }
  free(out);
  tu_ok(clpar_backward(loss));
  int was = clpar_set_grad_enabled(0);
  const float eps = 1e-2f;
  for (int i = 0; i < c->n_in; i++) {
    int64_t n = numel_of(c, i);
    assert_non_null(clpar_tensor_grad(in[i]));
    float *g = tu_read(clpar_tensor_grad(in[i])), *fd = malloc((size_t)n * sizeof *fd);
    for (int64_t j = 0; j < n; j++) {
      float x = host[i][j];
      host[i][j] = x + eps;
      tu_ok(clpar_tensor_write(in[i], host[i], (size_t)n));
      float up = eval_loss(c, in, NULL, NULL, NULL);
      host[i][j] = x - eps;
      tu_ok(clpar_tensor_write(in[i], host[i], (size_t)n));
      float down = eval_loss(c, in, NULL, NULL, NULL);
      host[i][j] = x;
      tu_ok(clpar_tensor_write(in[i], host[i], (size_t)n));
      fd[j] = (up - down) / (2 * eps);
    }
    snprintf(what, sizeof what, "%s on %s: d/d input %d", c->name, clpar_device_id(dev), i);
    tu_assert_close(g, fd, (size_t)n, 2e-2f, 3e-3f, what);
    free(g), free(fd), free(host[i]);
  }
  clpar_set_grad_enabled(was);
  clpar_scope_end(scope);
}

/* ---- the ops under test ---- */

static clpar_status f_permute(clpar_tensor **in, clpar_tensor **out, const void *c) {
  const int *p = c;
  return clpar_permute(in[0], p, clpar_tensor_ndim(in[0]), out);
}
static clpar_status f_transpose(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_transpose(in[0], -1, -2, out);
}
static clpar_status f_narrow(clpar_tensor **in, clpar_tensor **out, const void *c) {
  const int64_t *a = c; /* dim, start, length */
  return clpar_narrow(in[0], (int)a[0], a[1], a[2], out);
}
static clpar_status f_cat(clpar_tensor **in, clpar_tensor **out, const void *c) {
  return clpar_cat(in, 2, *(const int *)c, out);
}
/* split along dim 2 into 1 + 3, concatenated back the other way round */
static clpar_status f_split_swap(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  clpar_tensor *parts[2];
  clpar_status s = clpar_split_dim(in[0], 2, (int64_t[]){1, 3}, 2, parts);
  if (s != CLPAR_OK) return s;
  clpar_tensor *swapped[2] = {parts[1], parts[0]};
  s = clpar_cat(swapped, 2, 2, out);
  clpar_tensor_free(parts[0]), clpar_tensor_free(parts[1]);
  return s;
}
static clpar_status f_bmm(clpar_tensor **in, clpar_tensor **out, const void *c) {
  const int *t = c;
  return clpar_bmm(in[0], in[1], t[0], t[1], out);
}
/* causal attention over q, k, v [B, T, H, D]: heads by permutes, softmax(q k^T / 2 + mask) v */
static clpar_status f_attention(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  static const int bhtd[4] = {0, 2, 1, 3};
  clpar_tensor *q = NULL, *k = NULL, *v = NULL, *s1 = NULL, *s2 = NULL, *m = NULL, *p = NULL,
               *y = NULL;
  clpar_status s = clpar_permute(in[0], bhtd, 4, &q);
  if (s == CLPAR_OK) s = clpar_permute(in[1], bhtd, 4, &k);
  if (s == CLPAR_OK) s = clpar_permute(in[2], bhtd, 4, &v);
  if (s == CLPAR_OK) s = clpar_bmm(q, k, 0, 1, &s1);
  if (s == CLPAR_OK) s = clpar_scale(s1, 0.5f, &s2);
  if (s == CLPAR_OK) s = clpar_causal_mask(s2, &m);
  if (s == CLPAR_OK) s = clpar_softmax(m, &p);
  if (s == CLPAR_OK) s = clpar_bmm(p, v, 0, 0, &y);
  if (s == CLPAR_OK) s = clpar_permute(y, bhtd, 4, out);
  clpar_tensor *all[] = {q, k, v, s1, s2, m, p, y};
  for (int i = 0; i < 8; i++) clpar_tensor_free(all[i]);
  return s;
}
static clpar_status f_exp(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_exp(in[0], out);
}
static clpar_status f_ln(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_ln(in[0], out);
}
static clpar_status f_sqrt(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_sqrt(in[0], out);
}
static clpar_status f_pow(clpar_tensor **in, clpar_tensor **out, const void *c) {
  return clpar_pow(in[0], *(const float *)c, out);
}
static clpar_status f_div(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_div(in[0], in[1], out);
}
static clpar_status f_gelu(clpar_tensor **in, clpar_tensor **out, const void *c) {
  return clpar_gelu(in[0], *(const clpar_gelu_approx *)c, out);
}
static clpar_status f_mask(clpar_tensor **in, clpar_tensor **out, const void *c) {
  return clpar_masked_fill_upper(in[0], *(const int64_t *)c, -3.0f, out);
}
static clpar_status f_softmax(clpar_tensor **in, clpar_tensor **out, const void *c) {
  return *(const int *)c ? clpar_log_softmax(in[0], out) : clpar_softmax(in[0], out);
}

/* cross-entropy of [2, 3, 4] logits; targets int64 with two ignored (ctx: the reduction) */
static clpar_status f_ce(clpar_tensor **in, clpar_tensor **out, const void *c) {
  static const int64_t t[6] = {1, -100, 3, 0, 2, -100};
  clpar_tensor *targets;
  clpar_status s = clpar_tensor_from_host_dtype(clpar_tensor_device(in[0]), CLPAR_INT64, 2,
                                                (int64_t[]){2, 3}, t, &targets);
  if (s == CLPAR_OK)
    s = clpar_cross_entropy_targets(in[0], targets, CLPAR_IGNORE_INDEX, *(const clpar_reduction *)c,
                                    out);
  clpar_tensor_free(targets);
  return s;
}
/* [4, 5] logits, int32 targets, ignore_index 2 */
static clpar_status f_ce32(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  static const int32_t t[4] = {2, 4, 0, 1};
  clpar_tensor *targets;
  clpar_status s = clpar_tensor_from_host_dtype(clpar_tensor_device(in[0]), CLPAR_INT32, 1,
                                                (int64_t[]){4}, t, &targets);
  if (s == CLPAR_OK) s = clpar_cross_entropy_targets(in[0], targets, 2, CLPAR_REDUCTION_MEAN, out);
  clpar_tensor_free(targets);
  return s;
}

static const int perm3[3] = {2, 0, 1}, perm4[4] = {0, 2, 1, 3}, perm_view[4] = {2, 1, 0, 3};
static const int tt[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
static const int64_t nar_mid[3] = {1, 1, 2}, nar_last[3] = {-1, 2, 3}, nar_first[3] = {0, 1, 2};
static const int64_t nar_lead1[3] = {2, 1, 3};
static const int dim1 = 1, dim_last = -1, plain = 0, logarithm = 1;
static const float cube = 3.0f, half = 0.5f, zero = 0.0f;
static const clpar_gelu_approx g_none = CLPAR_GELU_NONE, g_tanh = CLPAR_GELU_TANH;
static const int64_t diag0 = 0, diag1 = 1;
static const clpar_reduction red_mean = CLPAR_REDUCTION_MEAN, red_sum = CLPAR_REDUCTION_SUM;

#define SH3(a, b, c) \
  { a, b, c, 0 }
static const op_case cases[] = {
    {"permute 3-D", f_permute, perm3, 1, {3}, {SH3(2, 3, 4)}, ANY},
    {"permute heads", f_permute, perm4, 1, {4}, {{2, 3, 2, 4}}, ANY},
    {"permute of size-1 dims (a view)", f_permute, perm_view, 1, {4}, {{1, 3, 1, 4}}, ANY},
    {"transpose", f_transpose, NULL, 1, {3}, {SH3(2, 3, 4)}, ANY},
    {"narrow dim 1", f_narrow, nar_mid, 1, {3}, {SH3(2, 4, 3)}, ANY},
    {"narrow dim -1", f_narrow, nar_last, 1, {2}, {SH3(3, 6, 0)}, ANY},
    {"narrow dim 0 (a view)", f_narrow, nar_first, 1, {2}, {SH3(4, 3, 0)}, ANY},
    {"narrow after size-1 dims (a view)", f_narrow, nar_lead1, 1, {3}, {SH3(1, 1, 5)}, ANY},
    {"cat dim 1", f_cat, &dim1, 2, {3, 3}, {SH3(2, 2, 3), SH3(2, 1, 3)}, ANY},
    {"cat dim -1", f_cat, &dim_last, 2, {2, 2}, {SH3(3, 2, 0), SH3(3, 4, 0)}, ANY},
    {"split_dim then cat", f_split_swap, NULL, 1, {3}, {SH3(2, 3, 4)}, ANY},
    {"bmm", f_bmm, tt[0], 2, {3, 3}, {SH3(2, 3, 4), SH3(2, 4, 5)}, ANY},
    {"bmm b^T", f_bmm, tt[1], 2, {3, 3}, {SH3(2, 3, 4), SH3(2, 5, 4)}, ANY},
    {"bmm a^T", f_bmm, tt[2], 2, {3, 3}, {SH3(2, 4, 3), SH3(2, 4, 5)}, ANY},
    {"bmm a^T b^T", f_bmm, tt[3], 2, {3, 3}, {SH3(2, 4, 3), SH3(2, 5, 4)}, ANY},
    {"bmm 4-D", f_bmm, tt[0], 2, {4, 4}, {{2, 2, 3, 4}, {2, 2, 4, 2}}, ANY},
    {"bmm shared 2-D b^T", f_bmm, tt[1], 2, {3, 2}, {SH3(2, 3, 4), SH3(5, 4, 0)}, ANY},
    {"bmm shared 2-D a^T", f_bmm, tt[2], 2, {2, 4}, {SH3(4, 3, 0), {2, 2, 4, 5}}, ANY},
    {"causal attention (permuted bmm operands)",
     f_attention,
     NULL,
     3,
     {4, 4, 4},
     {{2, 3, 2, 2}, {2, 3, 2, 2}, {2, 3, 2, 2}},
     ANY},
    {"exp", f_exp, NULL, 1, {2}, {SH3(3, 4, 0)}, ANY},
    {"ln", f_ln, NULL, 1, {2}, {SH3(3, 4, 0)}, POSITIVE},
    {"sqrt", f_sqrt, NULL, 1, {2}, {SH3(3, 4, 0)}, POSITIVE},
    {"pow 3", f_pow, &cube, 1, {2}, {SH3(3, 4, 0)}, ANY},
    {"pow 0.5", f_pow, &half, 1, {2}, {SH3(3, 4, 0)}, POSITIVE},
    {"pow 0", f_pow, &zero, 1, {2}, {SH3(3, 4, 0)}, ANY},
    {"div", f_div, NULL, 2, {2, 2}, {SH3(3, 4, 0), SH3(3, 4, 0)}, AWAY_FROM_ZERO},
    {"div row broadcast", f_div, NULL, 2, {3, 1}, {SH3(2, 3, 4), SH3(4, 0, 0)}, AWAY_FROM_ZERO},
    {"gelu", f_gelu, &g_none, 1, {2}, {SH3(4, 5, 0)}, ANY},
    {"gelu tanh", f_gelu, &g_tanh, 1, {2}, {SH3(4, 5, 0)}, ANY},
    {"masked_fill_upper diagonal 0", f_mask, &diag0, 1, {3}, {SH3(2, 3, 4)}, ANY},
    {"masked_fill_upper diagonal 1", f_mask, &diag1, 1, {4}, {{2, 1, 4, 3}}, ANY},
    {"softmax 3-D", f_softmax, &plain, 1, {3}, {SH3(2, 3, 5)}, ANY},
    {"log_softmax 3-D", f_softmax, &logarithm, 1, {3}, {SH3(2, 3, 5)}, ANY},
    {"cross_entropy [N, T, V] mean", f_ce, &red_mean, 1, {3}, {SH3(2, 3, 4)}, ANY},
    {"cross_entropy [N, T, V] sum", f_ce, &red_sum, 1, {3}, {SH3(2, 3, 4)}, ANY},
    {"cross_entropy int32 targets", f_ce32, NULL, 1, {2}, {SH3(4, 5, 0)}, ANY},
};

static void run_cases(clpar_device *dev) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(dev, &cases[i]);
}

static void test_ops_host(void **state) {
  (void)state;
  run_cases(tu_host());
}

static void test_ops_devices(void **state) {
  (void)state;
  if (!tu_non_host()) {
    print_message("only the host device is selected: no other device to check\n");
    skip();
  }
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_device *dev = clpar_device_get(i);
    if (dev != tu_host()) run_cases(dev);
  }
}

/* Every selected device, the host among them. */
#define FOR_EACH_DEVICE(dev)                           \
  for (int di_ = 0; di_ < clpar_device_count(); di_++) \
    for (clpar_device *dev = clpar_device_get(di_); dev; dev = NULL)

/* ---- PyTorch's numbers ---- */

static void check_gelu_ref(clpar_device *dev, clpar_gelu_approx approx, const float *y_ref,
                           const float *dx_ref) {
  clpar_scope *scope = clpar_scope_begin();
  size_t n = sizeof gelu_x / sizeof gelu_x[0];
  clpar_tensor *x, *y, *sum;
  tu_ok(clpar_tensor_from_host(dev, 1, (int64_t[]){(int64_t)n}, gelu_x, &x));
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_gelu(x, approx, &y));
  tu_ok(clpar_sum(y, &sum));
  tu_ok(clpar_backward(sum));
  float *got = tu_read(y), *dx = tu_read(clpar_tensor_grad(x));
  char what[96];
  snprintf(what, sizeof what, "gelu %s on %s", approx ? "tanh" : "none", clpar_device_id(dev));
  /* 3e-6 absolute: the derivative at -5 is 0.5 (1 + tanh) - ..., where a device's tanh
   * (OpenCL allows a few ulp) moves the difference from -1 by that much */
  tu_assert_close(got, y_ref, n, 1e-5f, 3e-6f, what);
  snprintf(what, sizeof what, "gelu %s derivative on %s", approx ? "tanh" : "none",
           clpar_device_id(dev));
  tu_assert_close(dx, dx_ref, n, 1e-5f, 3e-6f, what);
  free(got), free(dx);
  clpar_scope_end(scope);
}

static void test_gelu_pytorch(void **state) {
  (void)state;
  FOR_EACH_DEVICE(dev) {
    check_gelu_ref(dev, CLPAR_GELU_NONE, gelu_none_y, gelu_none_dx);
    check_gelu_ref(dev, CLPAR_GELU_TANH, gelu_tanh_y, gelu_tanh_dx);
  }
}

static void check_ce_ref(clpar_device *dev, clpar_reduction red, const float *loss_ref,
                         const float *d_ref) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *t, *loss;
  tu_ok(clpar_tensor_from_host(dev, 3, (int64_t[]){2, 3, 5}, ce_logits, &x));
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 2, (int64_t[]){2, 3}, ce_targets, &t));
  tu_ok(clpar_cross_entropy_targets(x, t, CLPAR_IGNORE_INDEX, red, &loss));
  tu_ok(clpar_backward(loss));
  float got, *d = tu_read(clpar_tensor_grad(x));
  tu_ok(clpar_tensor_read(loss, &got, 1));
  char what[96];
  snprintf(what, sizeof what, "cross_entropy %s on %s", red ? "sum" : "mean", clpar_device_id(dev));
  tu_assert_close(&got, loss_ref, 1, 1e-5f, 1e-6f, what);
  tu_assert_close(d, d_ref, 30, 1e-5f, 1e-6f, what);
  free(d);
  clpar_scope_end(scope);
}

static void test_cross_entropy_pytorch(void **state) {
  (void)state;
  FOR_EACH_DEVICE(dev) {
    check_ce_ref(dev, CLPAR_REDUCTION_MEAN, ce_mean_loss, ce_mean_dlogits);
    check_ce_ref(dev, CLPAR_REDUCTION_SUM, ce_sum_loss, ce_sum_dlogits);
  }
}

/* Every target ignored: the mean is 0 / 0 = NaN, as torch; a target outside the classes
 * makes the loss NaN instead of reading outside the row. */
static void test_cross_entropy_nan(void **state) {
  (void)state;
  FOR_EACH_DEVICE(dev) {
    clpar_scope *scope = clpar_scope_begin();
    static const int64_t ignored[2] = {-100, -100}, outside[2] = {1, 7};
    clpar_tensor *x = tu_make(dev, 2, (int64_t[]){2, 4}, 3), *t, *loss;
    float v;
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 1, (int64_t[]){2}, ignored, &t));
    tu_ok(clpar_cross_entropy_targets(x, t, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_tensor_read(loss, &v, 1));
    assert_true(isnan(v));
    tu_ok(clpar_cross_entropy_targets(x, t, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_SUM, &loss));
    tu_ok(clpar_tensor_read(loss, &v, 1));
    assert_true(v == 0.0f);
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 1, (int64_t[]){2}, outside, &t));
    tu_ok(clpar_cross_entropy_targets(x, t, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_tensor_read(loss, &v, 1));
    assert_true(isnan(v));
    clpar_scope_end(scope);
  }
}

/* ---- views, int dtypes, argmax ---- */

/* narrow along dim 0 and a permute of size-1 dims share the input's memory. */
static void test_views_share_memory(void **state) {
  (void)state;
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *v, *p;
  tu_ok(clpar_tensor_zeros(tu_host(), 2, (int64_t[]){4, 3}, &x));
  tu_ok(clpar_narrow(x, 0, 1, 2, &v));
  tu_ok(clpar_fill(v, 1.0f));
  float got[12];
  tu_ok(clpar_tensor_read(x, got, 12));
  for (int i = 0; i < 12; i++) assert_true(got[i] == (i >= 3 && i < 9 ? 1.0f : 0.0f));
  tu_ok(clpar_permute(x, (int[]){1, 0}, 2, &p)); /* a real permute: a copy */
  tu_ok(clpar_fill(p, 5.0f));
  tu_ok(clpar_tensor_read(x, got, 12));
  assert_true(got[0] == 0.0f);
  clpar_tensor *one, *pv;
  tu_ok(clpar_tensor_zeros(tu_host(), 3, (int64_t[]){1, 4, 1}, &one));
  tu_ok(clpar_permute(one, (int[]){2, 1, 0}, 3, &pv));
  tu_ok(clpar_fill(pv, 2.0f));
  tu_ok(clpar_tensor_read(one, got, 4));
  assert_true(got[3] == 2.0f);
  clpar_scope_end(scope);
}

/* permute, narrow and cat move int64 and int32 elements unchanged. */
static void test_int_dtypes(void **state) {
  (void)state;
  FOR_EACH_DEVICE(dev) {
    clpar_scope *scope = clpar_scope_begin();
    int64_t v[24], got[24];
    for (int i = 0; i < 24; i++) v[i] = ((int64_t)i << 33) + i; /* both words differ */
    clpar_tensor *x, *p, *n, *c;
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 3, (int64_t[]){2, 3, 4}, v, &x));
    tu_ok(clpar_permute(x, (int[]){2, 0, 1}, 3, &p)); /* [4, 2, 3] */
    tu_ok(clpar_tensor_read_raw(p, got, sizeof got));
    for (int a = 0; a < 4; a++)
      for (int b = 0; b < 2; b++)
        for (int k = 0; k < 3; k++) assert_true(got[(a * 2 + b) * 3 + k] == v[(b * 3 + k) * 4 + a]);
    tu_ok(clpar_narrow(x, 2, 1, 2, &n)); /* [2, 3, 2] */
    tu_ok(clpar_tensor_read_raw(n, got, 12 * sizeof got[0]));
    for (int i = 0; i < 6; i++)
      for (int k = 0; k < 2; k++) assert_true(got[i * 2 + k] == v[i * 4 + 1 + k]);
    int32_t a32[4] = {1, 2, 3, 4}, b32[2] = {-5, -6}, c32[6];
    clpar_tensor *pa, *pb;
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, (int64_t[]){2, 2}, a32, &pa));
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, (int64_t[]){2, 1}, b32, &pb));
    tu_ok(clpar_cat((clpar_tensor *[]){pa, pb}, 2, 1, &c));
    tu_ok(clpar_tensor_read_raw(c, c32, sizeof c32));
    static const int32_t want[6] = {1, 2, -5, 3, 4, -6};
    assert_memory_equal(c32, want, sizeof want);
    clpar_scope_end(scope);
  }
}

static void test_argmax(void **state) {
  (void)state;
  const float x[12] = {1, 3,   3, 0, /* tie: the first */ -1, -2, -0.5f, -3,
                       2, NAN, 5, 1 /* NaN wins */};
  FOR_EACH_DEVICE(dev) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *t, *idx;
    tu_ok(clpar_tensor_from_host(dev, 3, (int64_t[]){3, 1, 4}, x, &t));
    tu_ok(clpar_argmax(t, &idx));
    assert_int_equal(clpar_tensor_dtype(idx), CLPAR_INT64);
    assert_int_equal(clpar_tensor_ndim(idx), 2);
    int64_t got[3];
    tu_ok(clpar_tensor_read_raw(idx, got, sizeof got));
    assert_true(got[0] == 1 && got[1] == 2 && got[2] == 1);
    clpar_scope_end(scope);
  }
}

/* ---- errors: named, nothing made ---- */

static void expect_error(clpar_status s, clpar_status want, const char *fn) {
  assert_int_equal(s, want);
  if (!strstr(clpar_last_error(), fn))
    fail_msg("error does not name %s: %s", fn, clpar_last_error());
}

static void test_errors(void **state) {
  (void)state;
  clpar_scope *scope = clpar_scope_begin();
  clpar_device *h = tu_host();
  clpar_tensor *x = tu_make(h, 3, (int64_t[]){2, 3, 4}, 1),
               *y = tu_make(h, 3, (int64_t[]){2, 5, 4}, 2);
  clpar_tensor *out = NULL, *outs[2], *f;
  expect_error(clpar_permute(x, (int[]){0, 0, 1}, 3, &out), CLPAR_ERROR_INVALID_ARGUMENT,
               "clpar_permute");
  expect_error(clpar_permute(x, (int[]){0, 1}, 2, &out), CLPAR_ERROR_INVALID_ARGUMENT,
               "clpar_permute");
  expect_error(clpar_transpose(x, 0, 3, &out), CLPAR_ERROR_INVALID_ARGUMENT, "clpar_transpose");
  expect_error(clpar_narrow(x, 1, 2, 2, &out), CLPAR_ERROR_INDEX, "clpar_narrow");
  expect_error(clpar_cat((clpar_tensor *[]){x, y}, 2, 2, &out), CLPAR_ERROR_SHAPE_MISMATCH,
               "clpar_cat");
  expect_error(clpar_split_dim(x, 2, (int64_t[]){1, 2}, 2, outs), CLPAR_ERROR_SHAPE_MISMATCH,
               "clpar_split_dim");
  expect_error(clpar_split_dim(x, -1, (int64_t[]){4, 0}, 2, outs), CLPAR_ERROR_EMPTY,
               "clpar_split_dim");
  expect_error(clpar_bmm(x, y, 0, 0, &out), CLPAR_ERROR_SHAPE_MISMATCH, "clpar_bmm");
  expect_error(clpar_masked_fill_upper(tu_make(h, 1, (int64_t[]){4}, 3), 1, 0.0f, &out),
               CLPAR_ERROR_SHAPE_MISMATCH, "clpar_masked_fill_upper");
  expect_error(clpar_gelu(x, (clpar_gelu_approx)7, &out), CLPAR_ERROR_INVALID_ARGUMENT,
               "clpar_gelu");
  tu_ok(clpar_tensor_zeros(h, 2, (int64_t[]){2, 3}, &f)); /* float targets */
  expect_error(clpar_cross_entropy_targets(x, f, -100, CLPAR_REDUCTION_MEAN, &out),
               CLPAR_ERROR_DTYPE, "clpar_cross_entropy_targets");
  clpar_tensor *t;
  tu_ok(clpar_tensor_zeros_dtype(h, CLPAR_INT64, 2, (int64_t[]){3, 2}, &t));
  expect_error(clpar_cross_entropy_targets(x, t, -100, CLPAR_REDUCTION_MEAN, &out),
               CLPAR_ERROR_SHAPE_MISMATCH, "clpar_cross_entropy_targets");
  assert_null(out);
  clpar_scope_end(scope);
}

/* A failed check of an earlier test may have left gradients off (check_case turns them off
 * for its finite differences): each test starts with them on. */
static int grad_on(void **state) {
  (void)state;
  clpar_set_grad_enabled(1);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_ops_host, grad_on),
      cmocka_unit_test_setup(test_ops_devices, grad_on),
      cmocka_unit_test_setup(test_gelu_pytorch, grad_on),
      cmocka_unit_test_setup(test_cross_entropy_pytorch, grad_on),
      cmocka_unit_test_setup(test_cross_entropy_nan, grad_on),
      cmocka_unit_test_setup(test_views_share_memory, grad_on),
      cmocka_unit_test_setup(test_int_dtypes, grad_on),
      cmocka_unit_test_setup(test_argmax, grad_on),
      cmocka_unit_test_setup(test_errors, grad_on),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
