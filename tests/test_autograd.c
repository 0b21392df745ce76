/* test_autograd.c — every differentiable op and loss checked against central finite
 * differences, on every selected device and on host; accumulation across backward calls;
 * and the errors of backward and of the losses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* clpar_linear_act */
#include "test_util.h"

#define MAX_IN 3

/* f(inputs) -> out; ctx carries per-case settings. */
typedef clpar_status (*op_fn)(clpar_tensor **in, clpar_tensor **out, const void *ctx);

typedef struct {
  const char *name;
  op_fn fn;
  const void *ctx;
  int n_in;
  int ndim[MAX_IN];
  int64_t shape[MAX_IN][3];
  int away_from_zero; /* inputs kept away from kinks (relu) */
} grad_case;

static int64_t numel_of(const grad_case *c, int i) {
  int64_t n = 1;
  for (int d = 0; d < c->ndim[i]; d++) n *= c->shape[i][d];
  return n;
}

/* loss = sum(f(inputs) * R) for a fixed random R: every output element matters. */
static float eval_loss(const grad_case *c, clpar_tensor **in, clpar_tensor **keep_loss) {
  clpar_tensor *out, *r, *prod, *loss;
  tu_ok(c->fn(in, &out, c->ctx));
  float *rv = tu_rand((size_t)clpar_tensor_numel(out), 99);
  int64_t shape[CLPAR_MAX_DIMS];
  for (int d = 0; d < clpar_tensor_ndim(out); d++) shape[d] = clpar_tensor_dim(out, d);
  tu_ok(clpar_tensor_from_host(clpar_tensor_device(out), clpar_tensor_ndim(out), shape, rv, &r));
  tu_ok(clpar_mul(out, r, &prod));
  tu_ok(clpar_sum(prod, &loss));
  float v;
  tu_ok(clpar_tensor_read(loss, &v, 1));
  free(rv);
  clpar_tensor_free(out);
  clpar_tensor_free(r);
  clpar_tensor_free(prod);
  if (keep_loss)
    *keep_loss = loss;
  else
    clpar_tensor_free(loss);
  return v;
}

static void check_case(clpar_device *dev, const grad_case *c) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *in[MAX_IN];
  float *host[MAX_IN];
  for (int i = 0; i < c->n_in; i++) {
    host[i] = tu_rand((size_t)numel_of(c, i), 10 + (uint64_t)i);
    if (c->away_from_zero)
      for (int64_t j = 0; j < numel_of(c, i); j++) host[i][j] += host[i][j] < 0 ? -0.2f : 0.2f;
    tu_ok(clpar_tensor_from_host(dev, c->ndim[i], c->shape[i], host[i], &in[i]));
    tu_ok(clpar_tensor_set_requires_grad(in[i], 1));
  }
  clpar_tensor *loss;
  eval_loss(c, in, &loss);
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
      float up = eval_loss(c, in, NULL);
      host[i][j] = x - eps;
      tu_ok(clpar_tensor_write(in[i], host[i], (size_t)n));
      float down = eval_loss(c, in, NULL);
      host[i][j] = x;
      tu_ok(clpar_tensor_write(in[i], host[i], (size_t)n));
      fd[j] = (up - down) / (2 * eps);
    }
    char what[128];
    snprintf(what, sizeof what, "%s on %s: d/d input %d", c->name, clpar_device_id(dev), i);
    tu_assert_close(g, fd, (size_t)n, 2e-2f, 3e-3f, what);
    free(g);
    free(fd);
    free(host[i]);
  }
  clpar_set_grad_enabled(was);
  clpar_scope_end(scope);
}

static clpar_status f_add(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_add(in[0], in[1], out);
}
static clpar_status f_sub(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_sub(in[0], in[1], out);
}
static clpar_status f_mul(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_mul(in[0], in[1], out);
}
static clpar_status f_scale(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_scale(in[0], -1.5f, out);
}
static clpar_status f_relu(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_relu(in[0], out);
}
static clpar_status f_sigmoid(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_sigmoid(in[0], out);
}
static clpar_status f_tanh(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_tanh(in[0], out);
}
static clpar_status f_softmax(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_softmax(in[0], out);
}
static clpar_status f_log_softmax(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_log_softmax(in[0], out);
}
static clpar_status f_sum(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_sum(in[0], out);
}
static clpar_status f_mean(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_mean(in[0], out);
}
static clpar_status f_sum_rows(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_sum_rows(in[0], out);
}
static clpar_status f_linear(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c;
  return clpar_linear(in[0], in[1], in[2], out);
}

static clpar_status f_matmul(clpar_tensor **in, clpar_tensor **out, const void *c) {
  const int *t = c;
  return clpar_matmul(in[0], in[1], t[0], t[1], out);
}

static clpar_status f_twice(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c; /* x used twice: x * x + x */
  clpar_tensor *sq;
  clpar_status s = clpar_mul(in[0], in[0], &sq);
  if (s == CLPAR_OK) s = clpar_add(sq, in[0], out);
  clpar_tensor_free(sq);
  return s;
}

static clpar_status f_concat_rows(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c; /* concat then a view of rows 1..4 then reshape */
  clpar_tensor *cat, *rows;
  clpar_status s = clpar_concat(in, 2, &cat);
  if (s == CLPAR_OK) s = clpar_tensor_rows(cat, 1, 4, &rows);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(rows, 1, (int64_t[]){12}, out);
  clpar_tensor_free(cat);
  clpar_tensor_free(rows);
  return s;
}

static clpar_status f_split(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c; /* split into 2 + 3 rows, combine the parts differently */
  clpar_tensor *parts[2], *a, *b;
  clpar_status s = clpar_split(in[0], (int64_t[]){2, 3}, 2, parts);
  if (s != CLPAR_OK) return s;
  s = clpar_sum_rows(parts[0], &a);
  if (s == CLPAR_OK) s = clpar_sum_rows(parts[1], &b);
  if (s == CLPAR_OK) s = clpar_mul(a, b, out);
  clpar_tensor_free(parts[0]);
  clpar_tensor_free(parts[1]);
  clpar_tensor_free(a);
  clpar_tensor_free(b);
  return s;
}

static clpar_status f_to_host_and_back(clpar_tensor **in, clpar_tensor **out, const void *c) {
  (void)c; /* a differentiable copy to the host and back */
  clpar_tensor *h, *sq;
  clpar_status s = clpar_tensor_to(in[0], clpar_device_host(), &h);
  if (s == CLPAR_OK) s = clpar_mul(h, h, &sq);
  if (s == CLPAR_OK) s = clpar_tensor_to(sq, clpar_tensor_device(in[0]), out);
  clpar_tensor_free(h);
  clpar_tensor_free(sq);
  return s;
}

static clpar_status f_mse(clpar_tensor **in, clpar_tensor **out, const void *c) {
  return clpar_mse_loss(in[0], in[1], *(const clpar_reduction *)c, out);
}

static const int32_t labels[5] = {2, 0, 3, 3, 1};
static clpar_status f_ce(clpar_tensor **in, clpar_tensor **out, const void *c) {
  return clpar_cross_entropy(in[0], labels, 5, *(const clpar_reduction *)c, out);
}

static const int tt[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
static const clpar_reduction red_mean = CLPAR_REDUCTION_MEAN, red_sum = CLPAR_REDUCTION_SUM;

#define S2(a, b) \
  { a, b, 0 }
static const grad_case cases[] = {
    {"add", f_add, NULL, 2, {2, 2}, {S2(3, 4), S2(3, 4)}, 0},
    {"add row broadcast", f_add, NULL, 2, {2, 1}, {S2(3, 4), {4, 0, 0}}, 0},
    {"sub row broadcast", f_sub, NULL, 2, {2, 2}, {S2(3, 4), S2(1, 4)}, 0},
    {"mul", f_mul, NULL, 2, {2, 2}, {S2(3, 4), S2(3, 4)}, 0},
    {"mul row broadcast", f_mul, NULL, 2, {3, 1}, {{2, 3, 4}, {4, 0, 0}}, 0},
    {"scale", f_scale, NULL, 1, {2}, {S2(3, 4)}, 0},
    {"matmul", f_matmul, tt[0], 2, {2, 2}, {S2(3, 4), S2(4, 5)}, 0},
    {"matmul b^T", f_matmul, tt[1], 2, {2, 2}, {S2(3, 4), S2(5, 4)}, 0},
    {"matmul a^T", f_matmul, tt[2], 2, {2, 2}, {S2(4, 3), S2(4, 5)}, 0},
    {"matmul a^T b^T", f_matmul, tt[3], 2, {2, 2}, {S2(4, 3), S2(5, 4)}, 0},
    {"linear", f_linear, NULL, 3, {2, 2, 1}, {S2(3, 4), S2(2, 4), {2, 0, 0}}, 0},
    {"relu", f_relu, NULL, 1, {2}, {S2(3, 4)}, 1},
    {"sigmoid", f_sigmoid, NULL, 1, {2}, {S2(3, 4)}, 0},
    {"tanh", f_tanh, NULL, 1, {2}, {S2(3, 4)}, 0},
    {"softmax", f_softmax, NULL, 1, {2}, {S2(3, 5)}, 0},
    {"log_softmax", f_log_softmax, NULL, 1, {2}, {S2(3, 5)}, 0},
    {"sum", f_sum, NULL, 1, {3}, {{2, 3, 2}}, 0},
    {"mean", f_mean, NULL, 1, {2}, {S2(3, 4)}, 0},
    {"sum_rows", f_sum_rows, NULL, 1, {2}, {S2(5, 3)}, 0},
    {"x used twice", f_twice, NULL, 1, {2}, {S2(2, 3)}, 0},
    {"concat, rows, reshape", f_concat_rows, NULL, 2, {2, 2}, {S2(2, 3), S2(3, 3)}, 0},
    {"split", f_split, NULL, 1, {2}, {S2(5, 3)}, 0},
    {"copy to host and back", f_to_host_and_back, NULL, 1, {2}, {S2(2, 3)}, 0},
    {"mse mean", f_mse, &red_mean, 2, {2, 2}, {S2(3, 4), S2(3, 4)}, 0},
    {"mse sum", f_mse, &red_sum, 2, {2, 2}, {S2(3, 4), S2(3, 4)}, 0},
    {"cross_entropy mean", f_ce, &red_mean, 1, {2}, {S2(5, 4)}, 0},
    {"cross_entropy sum", f_ce, &red_sum, 1, {2}, {S2(5, 4)}, 0},
};

static void run_all_cases(clpar_device *dev) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(dev, &cases[i]);
}

static void test_finite_differences_host(void **state) {
  (void)state;
  run_all_cases(tu_host());
}

/* Every selected device but the host (checked above); says so and skips when the host is the
 * only device selected, rather than passing having checked nothing. */
static void test_finite_differences_devices(void **state) {
  (void)state;
  if (!tu_non_host()) {
    print_message("only the host device is selected: no other device to check\n");
    skip();
  }
  for (int d = 0; d < clpar_device_count(); d++)
    if (clpar_device_get(d) != tu_host()) run_all_cases(clpar_device_get(d));
}

/* A class index above 2^24 (16777217 rounds to 16777216 as a float) picks
 * its own class in the loss and the gradient, on every selected device and on the host.
 * One row of 2^24 + 2 logits, all 0 but 20 at the label: the loss is log(e^20 + 2^24 + 1) - 20
 * = 0.0340; the rounded label reads class 2^24 instead and gives 20.03. Checked against that
 * closed form in double (not against the host backend, which had the same bug). */
static void check_large_label(clpar_device *dev) {
  const int64_t cols = ((int64_t)1 << 24) + 2;
  const int32_t label = (1 << 24) + 1;
  clpar_scope *scope = clpar_scope_begin();
  float *h = calloc((size_t)cols, sizeof *h);
  assert_non_null(h);
  h[label] = 20.0f;
  clpar_tensor *x, *loss;
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){1, cols}, h, &x));
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_cross_entropy(x, &label, 1, CLPAR_REDUCTION_MEAN, &loss));
  double z = exp(20.0) + (double)(cols - 1); /* sum of exp(logits) */
  float got;
  tu_ok(clpar_tensor_read(loss, &got, 1));
  if (fabs(got - (log(z) - 20.0)) > 2e-3)
    fail_msg("%s: loss %.6g for label %d, expected %.6g", clpar_device_id(dev), (double)got, label,
             log(z) - 20.0);
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_tensor_read(clpar_tensor_grad(x), h, (size_t)cols)); /* softmax - onehot */
  if (fabs(h[label] - (exp(20.0) / z - 1.0)) > 2e-3 || fabs(h[label - 1] - 1.0 / z) > 1e-3)
    fail_msg("%s: gradient %.6g at the label, %.6g before it; expected %.6g, %.3g",
             clpar_device_id(dev), (double)h[label], (double)h[label - 1], exp(20.0) / z - 1.0,
             1.0 / z);
  free(h);
  clpar_scope_end(scope);
}

static void test_cross_entropy_label_above_2_24(void **state) {
  (void)state;
  check_large_label(tu_host());
  for (int d = 0; d < clpar_device_count(); d++)
    if (clpar_device_get(d) != tu_host()) check_large_label(clpar_device_get(d));
}

/* Gradients add up over backward calls until zeroed; a graph can be run backward twice. */
static void test_accumulation_and_zero_grad(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_scope *scope = clpar_scope_begin();
    float xv[3] = {1, -2, 3};
    clpar_tensor *x, *y, *loss;
    tu_ok(clpar_tensor_from_host(dev, 1, (int64_t[]){3}, xv, &x));
    tu_ok(clpar_tensor_set_requires_grad(x, 1));
    assert_null(clpar_tensor_grad(x));
    tu_ok(clpar_mul(x, x, &y));
    tu_ok(clpar_sum(y, &loss)); /* d/dx = 2x */
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_backward(loss));
    float g[3];
    tu_ok(clpar_tensor_read(clpar_tensor_grad(x), g, 3));
    for (int i = 0; i < 3; i++) assert_float_equal(g[i], 4 * xv[i], 1e-5);
    tu_ok(clpar_tensor_zero_grad(x));
    tu_ok(clpar_tensor_read(clpar_tensor_grad(x), g, 3));
    for (int i = 0; i < 3; i++) assert_float_equal(g[i], 0, 0);
    /* no recording while disabled */
    int was = clpar_set_grad_enabled(0);
    clpar_tensor *z;
    tu_ok(clpar_mul(x, x, &z));
    assert_false(clpar_tensor_requires_grad(z));
    clpar_set_grad_enabled(was);
    assert_true(clpar_is_grad_enabled());
    clpar_scope_end(scope);
  }
}

static void test_backward_errors(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *y, *s;
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){2, 3}, 1, -1, 1, &x));
  tu_ok(clpar_sum(x, &s));
  assert_int_equal(clpar_backward(s), CLPAR_ERROR_NO_GRADIENT);
  assert_non_null(strstr(clpar_last_error(), "does not require a gradient"));
  assert_int_equal(clpar_backward(NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  tu_ok(clpar_relu(x, &y));
  assert_int_equal(clpar_backward(y), CLPAR_ERROR_SHAPE_MISMATCH); /* not one element */
  assert_non_null(strstr(clpar_last_error(), "[2, 3]"));
  assert_null(clpar_tensor_grad(x));
  assert_int_equal(clpar_tensor_set_requires_grad(y, 0), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_scope_end(scope);
}

/* Every op and loss refuses mismatched shapes, out-of-range labels and bad reductions with a
 * clear error, and leaves out (and the graph) alone. */
static void test_loss_and_op_errors(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *a, *b, *w, *sentinel = (clpar_tensor *)(uintptr_t)0x77, *out = sentinel;
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){4, 3}, 1, -1, 1, &a));
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){4, 2}, 2, -1, 1, &b));
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){5, 2}, 3, -1, 1, &w));
  tu_ok(clpar_tensor_set_requires_grad(a, 1));
  clpar_memory_stats before, after;
  tu_ok(clpar_device_memory_stats(dev, &before));
  assert_int_equal(clpar_mse_loss(a, b, CLPAR_REDUCTION_MEAN, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_non_null(strstr(clpar_last_error(), "[4, 3]"));
  assert_int_equal(clpar_mse_loss(a, a, (clpar_reduction)7, &out), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_linear(a, w, NULL, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  int32_t bad[4] = {0, 1, 3, 2}, neg[4] = {0, -1, 0, 0};
  assert_int_equal(clpar_cross_entropy(a, bad, 4, CLPAR_REDUCTION_MEAN, &out), CLPAR_ERROR_INDEX);
  assert_non_null(strstr(clpar_last_error(), "label 3 of row 2"));
  assert_int_equal(clpar_cross_entropy(a, neg, 4, CLPAR_REDUCTION_SUM, &out), CLPAR_ERROR_INDEX);
  assert_int_equal(clpar_cross_entropy(a, bad, 3, CLPAR_REDUCTION_SUM, &out),
                   CLPAR_ERROR_SHAPE_MISMATCH);
  assert_int_equal(clpar_add(a, b, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_int_equal(clpar_matmul(a, w, 0, 0, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_int_equal(clpar_relu(NULL, &out), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_ptr_equal(out, sentinel);
  tu_ok(clpar_device_memory_stats(dev, &after));
  assert_int_equal(after.bytes_in_use, before.bytes_in_use);
  assert_null(clpar_tensor_grad(a));
  clpar_scope_end(scope);
}

/* relu's gradient on the host is PyTorch's threshold_backward: g where x > 0, else 0, so a
 * NaN or infinite gradient reaching a negative input stops there. */
/* PyTorch's relu backward is a select (threshold_backward: g where x > 0, else 0), so an inf
 * or NaN gradient does not pass where x <= 0; on every device, through clpar_relu and through
 * the fused Linear + ReLU (clpar_linear_act, bias_act_backward). */
static void check_relu_stops_nan(clpar_device *dev, int fused) {
  clpar_scope *scope = clpar_scope_begin();
  int64_t n = 4, xs[2] = {1, 4}, ws[2] = {4, 4};
  float xv[4] = {-1.0f, 2.0f, -3.0f, 4.0f}, rv[4] = {NAN, 1.0f, INFINITY, 2.0f};
  float eye[16] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  clpar_tensor *x, *r, *y, *p, *s, *w, *b;
  tu_ok(clpar_tensor_from_host(dev, fused ? 2 : 1, fused ? xs : &n, xv, &x));
  tu_ok(clpar_tensor_from_host(dev, fused ? 2 : 1, fused ? xs : &n, rv, &r));
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  if (fused) {
    tu_ok(clpar_tensor_from_host(dev, 2, ws, eye, &w));
    tu_ok(clpar_tensor_zeros(dev, 1, &n, &b));
    tu_ok(clpar_linear_act(x, w, b, CLPAR_ACT_RELU, &y));
  } else {
    tu_ok(clpar_relu(x, &y));
  }
  tu_ok(clpar_mul(y, r, &p));
  tu_ok(clpar_sum(p, &s));
  tu_ok(clpar_backward(s));
  float *g = tu_read(clpar_tensor_grad(x)), want[4] = {0.0f, 1.0f, 0.0f, 2.0f};
  for (int i = 0; i < 4; i++)
    if (g[i] != want[i])
      fail_msg("%s: d relu%s [%d] is %g; PyTorch gives %g", clpar_device_id(dev),
               fused ? " (Linear + ReLU)" : "", i, g[i], want[i]);
  free(g);
  clpar_scope_end(scope);
}

static void test_relu_backward_stops_nan(void **state) {
  (void)state;
  check_relu_stops_nan(tu_host(), 0);
  for (int d = 0; d < clpar_device_count(); d++)
    for (int fused = 0; fused < 2; fused++) check_relu_stops_nan(clpar_device_get(d), fused);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_finite_differences_host),
      cmocka_unit_test(test_finite_differences_devices),
      cmocka_unit_test(test_accumulation_and_zero_grad),
      cmocka_unit_test(test_cross_entropy_label_above_2_24),
      cmocka_unit_test(test_backward_errors),
      cmocka_unit_test(test_loss_and_op_errors),
      cmocka_unit_test(test_relu_backward_stops_nan),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
