/* test_reduce.c — clpar_sum_dims, mean_dims, var_dims and clpar_expand on every selected
 * device against the host backend and a float64 reference, over shapes that take every
 * kernel path (a narrow inner with a long run, sum_rows' shape, a work-item per output,
 * three separate runs of dimensions); backward against finite differences of the float64
 * reference; and bad dims giving a clear error with nothing allocated. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

enum { OP_SUM, OP_MEAN, OP_VAR_UNBIASED, OP_VAR_BIASED, OP_COUNT };
static const char *op_names[] = {"sum", "mean", "var unbiased", "var biased"};

typedef struct {
  int ndim;
  int64_t shape[CLPAR_MAX_DIMS];
  int n_dims; /* 0: every dimension (dims NULL) */
  int dims[CLPAR_MAX_DIMS];
} red_case;

static const red_case cases[] = {
    {4, {4, 3, 17, 19}, 3, {0, 2, 3}}, /* BatchNorm2d's statistics: H, W then N */
    {2, {300, 20}, 1, {0}},            /* sum_rows' shape, chunked */
    {3, {5, 7, 9}, 1, {1}},            /* a work-item per output */
    {3, {5, 7, 9}, 1, {-1}},
    {3, {3, 100, 40}, 1, {1}},          /* wide inner, long run */
    {5, {2, 3, 4, 5, 6}, 3, {4, 0, 2}}, /* three runs, unsorted */
    {2, {6, 1000}, 1, {-1}},            /* a work-group per output */
    {1, {7}, 0, {0}},                   /* everything */
    {3, {2, 3, 4}, 3, {0, 1, 2}},
};

static int64_t numel_of(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static unsigned mask_of(const red_case *c) {
  if (c->n_dims == 0) return (1u << c->ndim) - 1;
  unsigned m = 0;
  for (int k = 0; k < c->n_dims; k++)
    m |= 1u << (c->dims[k] < 0 ? c->dims[k] + c->ndim : c->dims[k]);
  return m;
}

/* Output index (kept dims, row-major) of each input element. */
static void out_index(const int64_t *shape, int ndim, unsigned mask, int64_t *idx) {
  int64_t n = numel_of(shape, ndim);
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, o = 0, stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
      int64_t c = rem % shape[d];
      rem /= shape[d];
      if (!(mask & (1u << d))) {
        o += c * stride;
        stride *= shape[d];
      }
    }
    idx[i] = o;
  }
}

/* The float64 reference: out[o] for each output o (count *n_out), two-pass variance. */
static double *ref_reduce(const double *x, const int64_t *shape, int ndim, unsigned mask, int op,
                          int64_t *n_out) {
  int64_t n = numel_of(shape, ndim), outs = 1, count = 1;
  for (int d = 0; d < ndim; d++) {
    if (mask & (1u << d))
      count *= shape[d];
    else
      outs *= shape[d];
  }
  int64_t *idx = malloc((size_t)n * sizeof *idx);
  double *sum = calloc((size_t)outs, sizeof *sum), *out = calloc((size_t)outs, sizeof *out);
  out_index(shape, ndim, mask, idx);
  for (int64_t i = 0; i < n; i++) sum[idx[i]] += x[i];
  for (int64_t o = 0; o < outs; o++) out[o] = op == OP_SUM ? sum[o] : sum[o] / (double)count;
  if (op >= OP_VAR_UNBIASED) {
    memset(out, 0, (size_t)outs * sizeof *out);
    for (int64_t i = 0; i < n; i++) {
      double dev = x[i] - sum[idx[i]] / (double)count;
      out[idx[i]] += dev * dev;
    }
    for (int64_t o = 0; o < outs; o++)
      out[o] /= op == OP_VAR_UNBIASED ? (double)(count - 1) : (double)count;
  }
  free(idx);
  free(sum);
  *n_out = outs;
  return out;
}

static clpar_status run_op(int op, const clpar_tensor *x, const red_case *c, int keepdim,
                           clpar_tensor **out) {
  const int *dims = c->n_dims ? c->dims : NULL;
  switch (op) {
    case OP_SUM:
      return clpar_sum_dims(x, dims, c->n_dims, keepdim, out);
    case OP_MEAN:
      return clpar_mean_dims(x, dims, c->n_dims, keepdim, out);
    default:
      return clpar_var_dims(x, dims, c->n_dims, op == OP_VAR_UNBIASED, keepdim, out);
  }
}

/* The shape torch gives: dims kept as 1 or dropped ([1] when none is left). */
static int expected_shape(const red_case *c, int keepdim, int64_t *shape) {
  unsigned m = mask_of(c);
  int n = 0;
  for (int d = 0; d < c->ndim; d++)
    if (!(m & (1u << d)))
      shape[n++] = c->shape[d];
    else if (keepdim)
      shape[n++] = 1;
  if (!n) shape[n++] = 1;
  return n;
}

static void test_forward_every_device(void **state) {
  (void)state;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const red_case *c = &cases[ci];
    int64_t n = numel_of(c->shape, c->ndim), n_out;
    float *xf = tu_rand((size_t)n, 100 + ci);
    double *xd = malloc((size_t)n * sizeof *xd);
    for (int64_t i = 0; i < n; i++) xd[i] = xf[i];
    for (int op = 0; op < OP_COUNT; op++) {
      double *ref = ref_reduce(xd, c->shape, c->ndim, mask_of(c), op, &n_out);
      float *reff = malloc((size_t)n_out * sizeof *reff);
      for (int64_t o = 0; o < n_out; o++) reff[o] = (float)ref[o];
      for (int keepdim = 0; keepdim < 2; keepdim++)
        for (int d = -1; d < clpar_device_count(); d++) {
          clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
          clpar_scope *sc = clpar_scope_begin();
          clpar_tensor *x, *r;
          tu_ok(clpar_tensor_from_host(dev, c->ndim, c->shape, xf, &x));
          tu_ok(run_op(op, x, c, keepdim, &r));
          int64_t want[CLPAR_MAX_DIMS];
          int nd = expected_shape(c, keepdim, want);
          assert_int_equal(clpar_tensor_ndim(r), nd);
          for (int k = 0; k < nd; k++) assert_int_equal(clpar_tensor_dim(r, k), want[k]);
          float *got = tu_read(r);
          char what[160];
          snprintf(what, sizeof what, "case %zu %s keepdim %d on %s", ci, op_names[op], keepdim,
                   clpar_device_id(dev));
          tu_assert_close(got, reff, (size_t)n_out, 1e-5f, 2e-5f, what);
          free(got);
          clpar_scope_end(sc);
        }
      free(ref);
      free(reff);
    }
    free(xf);
    free(xd);
  }
}

/* Values far from zero with a small spread: a one-pass E[x^2] - E[x]^2 in float32 loses every
 * digit here; the two-pass variance keeps them. */
static void test_var_accuracy(void **state) {
  (void)state;
  int64_t shape[] = {3, 5000};
  int64_t n = 15000, n_out;
  float *xf = tu_rand((size_t)n, 7);
  double *xd = malloc((size_t)n * sizeof *xd);
  for (int64_t i = 0; i < n; i++) xd[i] = xf[i] = 1000.0f + 0.01f * xf[i];
  double *ref = ref_reduce(xd, shape, 2, 2u, OP_VAR_UNBIASED, &n_out);
  float reff[3] = {(float)ref[0], (float)ref[1], (float)ref[2]};
  int dims[] = {1};
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *v;
    tu_ok(clpar_tensor_from_host(dev, 2, shape, xf, &x));
    tu_ok(clpar_var_dims(x, dims, 1, 1, 0, &v));
    float *got = tu_read(v);
    tu_assert_close(got, reff, 3, 1e-2f, 0, clpar_device_id(dev));
    free(got);
    clpar_scope_end(sc);
  }
  free(ref);
  free(xf);
  free(xd);
}

static void test_expand_every_device(void **state) {
  (void)state;
  int64_t small[] = {3, 1, 4, 1}, big[] = {3, 5, 4, 6};
  float *a = tu_rand(12, 3), want[360];
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++)
      for (int k = 0; k < 4; k++)
        for (int l = 0; l < 6; l++) want[((i * 5 + j) * 4 + k) * 6 + l] = a[i * 4 + k];
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *r, *same;
    tu_ok(clpar_tensor_from_host(dev, 4, small, a, &x));
    tu_ok(clpar_expand(x, 4, big, &r));
    float *got = tu_read(r);
    tu_assert_close(got, want, 360, 0, 0, clpar_device_id(dev));
    free(got);
    tu_ok(clpar_expand(x, 4, small, &same)); /* nothing to repeat: a view */
    assert_ptr_equal(same->storage, x->storage);
    clpar_scope_end(sc);
  }
  free(a);
}

/* d/dx of sum(w * op(x)) from clpar_backward against central differences of the float64
 * reference (exact up to rounding in double). */
static void check_backward(clpar_device *dev, const red_case *c, int op, int keepdim, int expand) {
  int64_t n = numel_of(c->shape, c->ndim), n_out;
  unsigned mask = mask_of(c);
  float *xf = tu_rand((size_t)n, 31);
  double *xd = malloc((size_t)n * sizeof *xd);
  for (int64_t i = 0; i < n; i++) xd[i] = xf[i];
  double *tmp = ref_reduce(xd, c->shape, c->ndim, mask, op, &n_out);
  free(tmp);
  /* expand: y = expand(x_small) with x_small the keepdim shape */
  int64_t keep[CLPAR_MAX_DIMS];
  int nk = expected_shape(c, 1, keep);
  int64_t wn = expand ? n : n_out;
  float *wf = tu_rand((size_t)wn, 32);
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *w, *y, *p, *loss;
  if (expand) {
    tu_ok(clpar_tensor_from_host(dev, c->ndim, keep, xf, &x)); /* first n_out values */
    tu_ok(clpar_tensor_from_host(dev, c->ndim, c->shape, wf, &w));
    tu_ok(clpar_tensor_set_requires_grad(x, 1));
    tu_ok(clpar_expand(x, c->ndim, c->shape, &y));
  } else {
    tu_ok(clpar_tensor_from_host(dev, c->ndim, c->shape, xf, &x));
    tu_ok(clpar_tensor_set_requires_grad(x, 1));
    tu_ok(run_op(op, x, c, keepdim, &y));
    tu_ok(clpar_tensor_from_host(dev, clpar_tensor_ndim(y), y->shape, wf, &w));
  }
  (void)nk;
  tu_ok(clpar_mul(y, w, &p));
  tu_ok(clpar_sum(p, &loss));
  tu_ok(clpar_backward(loss));
  float *g = tu_read(clpar_tensor_grad(x));
  int64_t nx = expand ? n_out : n;
  float *fd = malloc((size_t)nx * sizeof *fd);
  for (int64_t i = 0; i < nx; i++) {
    double f[2];
    for (int side = 0; side < 2; side++) {
      double h = side ? 1e-4 : -1e-4, total = 0;
      if (expand) { /* sum over the big tensor of w * x_small[its output index] */
        int64_t *idx = malloc((size_t)n * sizeof *idx);
        out_index(c->shape, c->ndim, mask, idx);
        for (int64_t j = 0; j < n; j++) total += wf[j] * (xd[idx[j]] + (idx[j] == i ? h : 0));
        free(idx);
      } else {
        double saved = xd[i];
        xd[i] += h;
        double *r = ref_reduce(xd, c->shape, c->ndim, mask, op, &n_out);
        for (int64_t o = 0; o < n_out; o++) total += wf[o] * r[o];
        free(r);
        xd[i] = saved;
      }
      f[side] = total;
    }
    fd[i] = (float)((f[1] - f[0]) / 2e-4);
  }
  char what[160];
  snprintf(what, sizeof what, "%s backward, %s keepdim %d on %s", expand ? "expand" : op_names[op],
           c->n_dims ? "some dims" : "all dims", keepdim, clpar_device_id(dev));
  tu_assert_close(g, fd, (size_t)nx, 1e-3f, 1e-4f, what);
  free(g);
  free(fd);
  free(wf);
  free(xf);
  free(xd);
  clpar_scope_end(sc);
}

static void test_backward_finite_differences(void **state) {
  (void)state;
  static const red_case small[] = {
      {3, {3, 4, 5}, 2, {0, 2}},
      {4, {2, 3, 2, 3}, 1, {1}},
      {2, {4, 3}, 0, {0}},
  };
  for (int d = 0; d < clpar_device_count(); d++)
    for (size_t ci = 0; ci < sizeof small / sizeof small[0]; ci++) {
      for (int op = 0; op < OP_COUNT; op++)
        for (int keepdim = 0; keepdim < 2; keepdim++)
          check_backward(clpar_device_get(d), &small[ci], op, keepdim, 0);
      check_backward(clpar_device_get(d), &small[ci], 0, 1, 1);
    }
}

static void test_bad_dims(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  int64_t shape[] = {2, 3, 4};
  clpar_tensor *x = tu_make(dev, 3, shape, 1), *out = NULL, *i;
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT64, 3, shape, &i));
  clpar_memory_stats before, after;
  tu_ok(clpar_device_memory_stats(dev, &before));
  int far[] = {3}, below[] = {-4}, twice[] = {0, -3}, ok[] = {1};
  assert_int_equal(clpar_sum_dims(x, far, 1, 0, &out), CLPAR_ERROR_INDEX);
  assert_non_null(strstr(clpar_last_error(), "dim 3"));
  assert_int_equal(clpar_mean_dims(x, below, 1, 1, &out), CLPAR_ERROR_INDEX);
  assert_int_equal(clpar_var_dims(x, twice, 2, 1, 0, &out), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "twice"));
  assert_int_equal(clpar_sum_dims(x, ok, 0, 0, &out), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_sum_dims(x, NULL, 1, 0, &out), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_sum_dims(NULL, ok, 1, 0, &out), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_sum_dims(x, ok, 1, 0, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  int64_t bad[] = {2, 5, 4}, fewer[] = {2, 12};
  assert_int_equal(clpar_expand(x, 3, bad, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_non_null(strstr(clpar_last_error(), "[2, 5, 4]"));
  assert_int_equal(clpar_expand(x, 2, fewer, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_int_equal(clpar_sum_dims(i, ok, 1, 0, &out), CLPAR_ERROR_DTYPE);
  assert_non_null(strstr(clpar_last_error(), "int64"));
  assert_null(out);
  tu_ok(clpar_device_memory_stats(dev, &after)); /* nothing was allocated */
  assert_int_equal(after.bytes_in_use, before.bytes_in_use);
  clpar_scope_end(sc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_every_device),
      cmocka_unit_test(test_var_accuracy),
      cmocka_unit_test(test_expand_every_device),
      cmocka_unit_test(test_backward_finite_differences),
      cmocka_unit_test(test_bad_dims),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
