/* test_grad_stale.c — a leaf's gradient marked stale (clpar_grad_set_stale: zero_grad without
 * the fill, as ZeRO stage 1 does) on the host and on the first other selected device: the leaf
 * has no gradient until the next backward, whose first gradient replaces the memory (NaN here)
 * bit for bit, through Linear's GEMMs with beta 0 (a flat MLP wide enough for the devices'
 * large-GEMM paths), through a plain delivery (a copy) and through a slice (the memory zeroed
 * first, then the slice added); a second backward adds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

enum { BATCH = 64, IN = 256, HID = 384, OUT = 128 };

static void mean_backward(clpar_tensor *y) {
  clpar_tensor *loss;
  tu_ok(clpar_mean(y, &loss));
  tu_ok(clpar_backward(loss));
}

static void mlp_backward(clpar_module *m, clpar_tensor *x) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *y;
  tu_ok(clpar_module_forward(m, x, &y));
  mean_backward(y);
  clpar_scope_end(scope);
}

/* Marks every parameter of m stale, its flat gradient's memory NaN first. */
static void stale_nan(clpar_module *m, clpar_tensor *flat) {
  tu_ok(clpar_fill(flat->grad, NAN));
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    const char *name;
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, &name, &p));
    clpar_grad_set_stale(p);
    assert_null(clpar_tensor_grad(p));
  }
}

static void check_mlp(clpar_device *dev) {
  clpar_module *m = tu_mlp(dev, 5, 3, (int64_t[]){IN, HID, OUT});
  tu_ok(clpar_module_flatten(m));
  const char *name;
  clpar_tensor *p, *x = tu_make(dev, 2, (int64_t[]){BATCH, IN}, 7);
  tu_ok(clpar_module_parameter_at(m, 0, &name, &p));
  clpar_tensor *flat = p->flat;
  size_t n = (size_t)clpar_tensor_numel(flat);
  mlp_backward(m, x);
  float *want = tu_read(flat->grad);
  stale_nan(m, flat);
  mlp_backward(m, x);
  assert_non_null(clpar_tensor_grad(p));
  float *got = tu_read(flat->grad);
  assert_memory_equal(got, want, n * sizeof(float));
  free(got);
  mlp_backward(m, x); /* no zero_grad: adds */
  got = tu_read(flat->grad);
  for (size_t i = 0; i < n; i++) want[i] *= 2.0f;
  tu_assert_close(got, want, n, 1e-5f, 1e-7f, "two backwards");
  free(got);
  free(want);
  clpar_tensor_free(x);
  clpar_module_free(m);
}

/* sum(t * t) (gradient 2 t, delivered), or the mean of t's slice [100, 600) (gradient 1/500
 * there, through the slice). */
static void leaf_backward(clpar_tensor *t, int slice) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *y;
  if (slice)
    tu_ok(clpar_narrow(t, 0, 100, 500, &y));
  else
    tu_ok(clpar_mul(t, t, &y));
  mean_backward(y);
  clpar_scope_end(scope);
}

static void check_leaf(clpar_device *dev) {
  enum { N = 1000 };
  clpar_tensor *t = tu_make(dev, 1, (int64_t[]){N}, 3);
  tu_ok(clpar_tensor_set_requires_grad(t, 1));
  for (int slice = 0; slice < 2; slice++) {
    leaf_backward(t, slice); /* t's grad memory, then stale and NaN */
    tu_ok(clpar_fill(t->grad, NAN));
    clpar_grad_set_stale(t);
    assert_null(clpar_tensor_grad(t));
    leaf_backward(t, slice);
    float *g = tu_read(clpar_tensor_grad(t)), *v = tu_read(t);
    for (int i = 0; i < N; i++) {
      float want = slice ? (i >= 100 && i < 600 ? 1.0f / 500 : 0.0f) : 2.0f * v[i] / N;
      tu_assert_close(&g[i], &want, 1, 1e-6f, 0, "the gradient after the stale mark");
    }
    free(g);
    free(v);
  }
  clpar_tensor_free(t);
}

static void test_stale_linear_grads_are_replaced(void **state) {
  (void)state;
  check_mlp(tu_host());
  if (tu_non_host()) check_mlp(tu_non_host());
}

static void test_stale_leaf_delivered_and_sliced(void **state) {
  (void)state;
  check_leaf(tu_host());
  if (tu_non_host()) check_leaf(tu_non_host());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stale_linear_grads_are_replaced),
      cmocka_unit_test(test_stale_leaf_delivered_and_sliced),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
