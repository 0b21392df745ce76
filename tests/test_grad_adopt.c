/* test_grad_adopt.c — a leaf's first gradient: the leaf keeps the tensor backward made for it
 * when nothing else holds that memory (as PyTorch's AccumulateGrad does), so the gradient is
 * not held twice while backward runs; a gradient that shares memory with another (one tensor
 * handed to two inputs, the same leaf twice) is copied, and later backwards add into each
 * leaf's own memory. On every selected device. */
#include <stdlib.h>

#include "internal.h"
#include "test_util.h"

enum { N = 512 }; /* W is N x N: 1 MiB, far over the activations' gradients */

static void expect_all(const clpar_tensor *t, float want) {
  float *v = tu_read(t);
  for (int64_t i = 0; i < clpar_tensor_numel(t); i++) assert_float_equal(v[i], want, 1e-6);
  free(v);
}

/* loss = sum(ones(1, N) @ W): dW is all ones, and backward's peak above what was in use is one
 * gradient of W, not two. A second backward adds into the same memory. */
static void check_peak(clpar_device *dev) {
  int64_t shape[2] = {N, N}, xs[2] = {1, N};
  clpar_tensor *w = tu_make(dev, 2, shape, 5);
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  uint64_t bytes = (uint64_t)N * N * 4;
  float ones[N];
  for (int i = 0; i < N; i++) ones[i] = 1.0f;
  for (int pass = 1; pass <= 2; pass++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x, *y, *loss;
    tu_ok(clpar_tensor_from_host(dev, 2, xs, ones, &x));
    tu_ok(clpar_matmul(x, w, 0, 0, &y));
    tu_ok(clpar_sum(y, &loss));
    uint64_t peak = tu_backward_peak(dev, loss);
    clpar_scope_end(scope);
    assert_true(peak < bytes + bytes / 2);
    expect_all(clpar_tensor_grad(w), (float)pass);
  }
  /* the kept gradient is counted as a gradient */
  assert_true(clpar_memory_in_use(dev, CLPAR_MEM_GRADIENTS) >= bytes);
  clpar_tensor_free(w);
}

/* z = a + b hands one gradient to both leaves; z = c + c hands it to one leaf twice. */
static void check_shared(clpar_device *dev) {
  int64_t shape[1] = {300};
  clpar_tensor *a = tu_make(dev, 1, shape, 1), *b = tu_make(dev, 1, shape, 2);
  clpar_tensor *c = tu_make(dev, 1, shape, 3);
  tu_ok(clpar_tensor_set_requires_grad(a, 1));
  tu_ok(clpar_tensor_set_requires_grad(b, 1));
  tu_ok(clpar_tensor_set_requires_grad(c, 1));
  for (int pass = 1; pass <= 2; pass++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *z, *zz, *l1, *l2, *loss;
    tu_ok(clpar_add(a, b, &z));
    tu_ok(clpar_add(c, c, &zz));
    tu_ok(clpar_sum(z, &l1));
    tu_ok(clpar_sum(zz, &l2));
    tu_ok(clpar_add(l1, l2, &loss));
    tu_ok(clpar_backward(loss));
    clpar_scope_end(scope);
    assert_ptr_not_equal(clpar_tensor_grad(a)->storage, clpar_tensor_grad(b)->storage);
    expect_all(clpar_tensor_grad(a), (float)pass);
    expect_all(clpar_tensor_grad(b), (float)pass);
    expect_all(clpar_tensor_grad(c), 2.0f * (float)pass);
  }
  clpar_tensor_free(a);
  clpar_tensor_free(b);
  clpar_tensor_free(c);
}

static void test_first_gradient_is_kept_not_copied(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) check_peak(clpar_device_get(d));
}

static void test_shared_gradient_is_copied(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) check_shared(clpar_device_get(d));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_gradient_is_kept_not_copied),
      cmocka_unit_test(test_shared_gradient_is_copied),
  };
  return cmocka_run_group_tests_name("grad_adopt", tests, tu_setup, tu_teardown);
}
