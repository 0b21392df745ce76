/* test_backward_seed.c — the gradient backward starts from, as PyTorch's:
 * - clpar_backward(root) seeds ones of root's dtype (torch's ones_like(loss)): the gradient a
 *   float32, bfloat16 or float16 root's node receives is of its dtype and 1; a 16-bit leaf
 *   root (a master-weights parameter) gets a 1 of its dtype as its gradient;
 * - clpar_backward_grad(root, grad) converts grad to root's dtype (float32, the 16-bit types,
 *   int32 and int64 alike), as torch's engine does: the gradient reaching a float32 leaf w
 *   through root = w.to(dtype) is PyTorch's (reference/backward_seed_ref.h); a grad of another
 *   shape (even of root's numel) is refused with torch's "mismatch in shape" message, one on
 *   another device (with two devices), and backward from a root that needs no gradient.
 * Every selected device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "reference/backward_seed_ref.h"
#include "test_util.h"

enum { N = 8 };
static const clpar_dtype dtypes[3] = {CLPAR_FLOAT32, CLPAR_BFLOAT16, CLPAR_FLOAT16};

/* What the probe node's backward saw. */
static clpar_dtype seen_dtype;
static int seen_ndim;
static float seen_value;

/* Records the incoming gradient and hands it on converted to the input's dtype. */
static clpar_status probe_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  seen_dtype = g->dtype;
  seen_ndim = g->ndim;
  clpar_status s = clpar_tensor_read_floats(g, &seen_value, 1);
  return s == CLPAR_OK ? clpar_to_dtype(g, n->inputs[0]->dtype, &gin[0]) : s;
}

static void expect_floats(const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
      fail_msg("%s: element %zu is %.9g, PyTorch's is %.9g", what, i, (double)got[i],
               (double)want[i]);
}

/* clpar_backward from a [1, 1] root of each dtype, made by a probe op from a float32 leaf. */
static void test_seed_dtype(void **state) {
  (void)state;
  int64_t shape[2] = {1, 1};
  for (int d = 0; d < clpar_device_count(); d++)
    for (int k = 0; k < 3; k++) {
      clpar_device *dev = clpar_device_get(d);
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *w, *root;
      float zero = 0.0f, got;
      tu_ok(clpar_tensor_from_host(dev, 2, shape, &zero, &w));
      tu_ok(clpar_tensor_set_requires_grad(w, 1));
      tu_ok(clpar_tensor_zeros_dtype(dev, dtypes[k], 2, shape, &root));
      assert_non_null(clpar_record(root, "probe", probe_backward, &w, 1));
      seen_dtype = (clpar_dtype)-1;
      tu_ok(clpar_backward(root));
      if (seen_dtype != dtypes[k])
        fail_msg("%s: the seed of a %s root is %s", clpar_device_id(dev),
                 clpar_dtype_name(dtypes[k]), clpar_dtype_name(seen_dtype));
      assert_int_equal(seen_ndim, 2);
      assert_true(seen_value == 1.0f);
      tu_ok(clpar_tensor_read(clpar_tensor_grad(w), &got, 1));
      assert_true(got == 1.0f);
      clpar_scope_end(sc);
    }
}

/* A 16-bit leaf root (as clpar_master_weights' parameters are) gets a 1 of its dtype. */
static void test_seed_half_leaf(void **state) {
  (void)state;
  int64_t shape[1] = {1};
  float one = 1.0f, got = 0.0f;
  for (int d = 0; d < clpar_device_count(); d++)
    for (int k = 1; k < 3; k++) {
      clpar_device *dev = clpar_device_get(d);
      clpar_tensor *leaf;
      tu_ok(clpar_tensor_from_floats(dev, dtypes[k], 1, shape, &one, &leaf));
      leaf->requires_grad = 1; /* only clpar_master_weights makes 16-bit leaves so */
      tu_ok(clpar_backward(leaf));
      const clpar_tensor *g = clpar_tensor_grad(leaf);
      assert_non_null(g);
      assert_int_equal(g->dtype, dtypes[k]);
      tu_ok(clpar_tensor_read_floats(g, &got, 1));
      assert_true(got == 1.0f);
      clpar_tensor_free(leaf);
    }
}

/* w (float32 zeros [N]) -> root = w.to(root_dtype) -> backward from g; w's gradient into out. */
static void leaf_grad(clpar_device *dev, clpar_dtype root_dtype, clpar_tensor *g, float *out) {
  int64_t shape[1] = {N};
  clpar_tensor *w, *root;
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_FLOAT32, 1, shape, &w));
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  tu_ok(clpar_to_dtype(w, root_dtype, &root));
  tu_ok(clpar_backward_grad(root, g));
  tu_ok(clpar_tensor_read(clpar_tensor_grad(w), out, N));
}

static void test_grad_converted(void **state) {
  (void)state;
  const float *from_f32[3] = {seed_ref_from_f32_to_F32, seed_ref_from_f32_to_BF16,
                              seed_ref_from_f32_to_F16};
  const float *from_i64[3] = {seed_ref_from_i64_to_F32, seed_ref_from_i64_to_BF16,
                              seed_ref_from_i64_to_F16};
  const float *from_i32[3] = {seed_ref_from_i32_to_F32, seed_ref_from_i32_to_BF16,
                              seed_ref_from_i32_to_F16};
  int64_t shape[1] = {N}, n32[1] = {seed_ref_gi32_count};
  int32_t gi32[N];
  for (int i = 0; i < seed_ref_gi32_count; i++) gi32[i] = (int32_t)seed_ref_gi[i];
  char what[160];
  for (int d = 0; d < clpar_device_count(); d++)
    for (int k = 0; k < 3; k++) {
      clpar_device *dev = clpar_device_get(d);
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *g32, *g64, *gi, *w, *root;
      float got[N];
      tu_ok(clpar_tensor_from_host(dev, 1, shape, seed_ref_g, &g32));
      tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 1, shape, seed_ref_gi, &g64));
      tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 1, n32, gi32, &gi));
      snprintf(what, sizeof what, "%s: float32 gradient, %s root", clpar_device_id(dev),
               clpar_dtype_name(dtypes[k]));
      leaf_grad(dev, dtypes[k], g32, got);
      expect_floats(what, got, from_f32[k], N);
      snprintf(what, sizeof what, "%s: int64 gradient, %s root", clpar_device_id(dev),
               clpar_dtype_name(dtypes[k]));
      leaf_grad(dev, dtypes[k], g64, got);
      expect_floats(what, got, from_i64[k], N);
      snprintf(what, sizeof what, "%s: int32 gradient, %s root", clpar_device_id(dev),
               clpar_dtype_name(dtypes[k]));
      tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_FLOAT32, 1, n32, &w));
      tu_ok(clpar_tensor_set_requires_grad(w, 1));
      tu_ok(clpar_to_dtype(w, dtypes[k], &root));
      tu_ok(clpar_backward_grad(root, gi));
      tu_ok(clpar_tensor_read(clpar_tensor_grad(w), got, (size_t)seed_ref_gi32_count));
      expect_floats(what, got, from_i32[k], (size_t)seed_ref_gi32_count);
      if (k > 0) { /* the other 16-bit type's gradient */
        clpar_tensor *gh;
        tu_ok(clpar_tensor_from_floats(dev, dtypes[3 - k], 1, shape, seed_ref_g, &gh));
        snprintf(what, sizeof what, "%s: %s gradient, %s root", clpar_device_id(dev),
                 clpar_dtype_name(dtypes[3 - k]), clpar_dtype_name(dtypes[k]));
        leaf_grad(dev, dtypes[k], gh, got);
        expect_floats(what, got, k == 1 ? seed_ref_from_F16_to_BF16 : seed_ref_from_BF16_to_F16, N);
      }
      clpar_scope_end(sc);
    }
}

/* A leaf root takes grad converted too (torch: w.backward(int tensor) gives a float grad). */
static void test_grad_leaf_root(void **state) {
  (void)state;
  int64_t shape[1] = {N};
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *w, *g;
  float got[N];
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_FLOAT32, 1, shape, &w));
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 1, shape, seed_ref_gi, &g));
  tu_ok(clpar_backward_grad(w, g));
  tu_ok(clpar_tensor_read(clpar_tensor_grad(w), got, N));
  expect_floats("int64 gradient of a float32 leaf", got, seed_ref_from_i64_to_F32, N);
  clpar_scope_end(sc);
}

/* Backward from root with grad fails with status, its message containing want, and leaves w
 * without a gradient. */
static void expect_refused(clpar_tensor *w, clpar_tensor *root, clpar_tensor *grad,
                           clpar_status status, const char *want) {
  clpar_status s = clpar_backward_grad(root, grad);
  if (s != status || !strstr(clpar_last_error(), want))
    fail_msg("clpar_backward_grad returned %s (\"%s\"); %s with \"%s\" wanted",
             clpar_status_name(s), clpar_last_error(), clpar_status_name(status), want);
  assert_false(clpar_tensor_has_grad(w));
}

static void test_grad_refused(void **state) {
  (void)state;
  int64_t s8[1] = {N}, s18[2] = {1, N}, s42[2] = {4, 2}, s9[1] = {N + 1};
  clpar_device *dev = clpar_device_get(0);
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *w, *root, *plain;
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_FLOAT32, 1, s8, &w));
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  tu_ok(clpar_to_dtype(w, CLPAR_BFLOAT16, &root));
  expect_refused(w, root, tu_make(dev, 2, s18, 1), CLPAR_ERROR_SHAPE_MISMATCH,
                 "clpar_backward_grad: mismatch in shape: grad has a shape of [1, 8] and root "
                 "has a shape of [8]");
  expect_refused(w, root, tu_make(dev, 2, s42, 2), CLPAR_ERROR_SHAPE_MISMATCH,
                 "grad has a shape of [4, 2] and root has a shape of [8]");
  expect_refused(w, root, tu_make(dev, 1, s9, 3), CLPAR_ERROR_SHAPE_MISMATCH,
                 "grad has a shape of [9] and root has a shape of [8]");
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_FLOAT32, 1, s8, &plain));
  expect_refused(w, plain, tu_make(dev, 1, s8, 4), CLPAR_ERROR_NO_GRADIENT,
                 "clpar_backward_grad: the tensor does not require a gradient");
  clpar_device *other = tu_second_device(dev);
  if (other) {
    char want[200];
    snprintf(want, sizeof want, "clpar_backward_grad: grad is on %s and root on %s",
             clpar_device_id(other), clpar_device_id(dev));
    expect_refused(w, root, tu_make(other, 1, s8, 5), CLPAR_ERROR_DEVICE_MISMATCH, want);
  } else {
    printf("# one device: a gradient on another device is not tried\n");
  }
  clpar_scope_end(sc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_seed_dtype),     cmocka_unit_test(test_seed_half_leaf),
      cmocka_unit_test(test_grad_converted), cmocka_unit_test(test_grad_leaf_root),
      cmocka_unit_test(test_grad_refused),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
