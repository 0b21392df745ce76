/* test_messages.c — mistakes that explain themselves: an error inside a Sequential names the
 * Sequential (by its name in the module that ran it) and the child's index and type; float
 * labels given as int32 labels are recognized as float bits; a 4-D input to Linear suggests
 * Flatten. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static void expect_in_message(const char *want) {
  const char *msg = clpar_last_error();
  if (!strstr(msg, want)) fail_msg("message \"%s\" lacks \"%s\"", msg, want);
}

/* Sequential(Linear(4, 8), ReLU, Linear(16, 2)): the third layer's input is [N, 8]. */
static clpar_module *bad_stack(clpar_device *dev) {
  clpar_module *layers[3], *seq;
  tu_ok(clpar_linear_create(4, 8, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(16, 2, 1, dev, &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &seq));
  return seq;
}

static clpar_status net_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *u) {
  (void)u;
  return clpar_module_forward(clpar_module_child(self, "features"), x, y);
}

static void test_sequential_names_the_child(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *seq = bad_stack(dev), *net;
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){5, 4}, 1), *y = NULL;
  assert_int_equal(clpar_module_forward(seq, x, &y), CLPAR_ERROR_SHAPE_MISMATCH);
  expect_in_message("Sequential child 2 (Linear): clpar_linear: input is [5, 8]");
  /* as the child "features" of a user module */
  tu_ok(clpar_module_create("Net", net_forward, NULL, NULL, &net));
  tu_ok(clpar_module_add_child(net, "features", seq));
  assert_int_equal(clpar_module_forward(net, x, &y), CLPAR_ERROR_SHAPE_MISMATCH);
  expect_in_message("Sequential \"features\" child 2 (Linear): clpar_linear: input is [5, 8]");
  assert_null(y);
  clpar_tensor_free(x);
  clpar_module_free(net);
}

/* Linear then ReLU run fused inside a Sequential: an error there names the Linear too. */
static void test_sequential_names_a_fused_child(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *layers[4], *seq;
  tu_ok(clpar_linear_create(4, 8, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(16, 2, 1, dev, &layers[2]));
  tu_ok(clpar_relu_create(&layers[3]));
  tu_ok(clpar_sequential_create(layers, 4, &seq));
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){5, 4}, 1), *y = NULL;
  assert_int_equal(clpar_module_forward(seq, x, &y), CLPAR_ERROR_SHAPE_MISMATCH);
  expect_in_message("Sequential child 2 (Linear): clpar_linear");
  clpar_tensor_free(x);
  clpar_module_free(seq);
}

static void test_float_labels_hint(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *logits = tu_make(dev, 2, (int64_t[]){2, 10}, 3), *loss = NULL;
  float as_float[2] = {1.0f, 3.0f};
  int32_t labels[2];
  memcpy(labels, as_float, sizeof labels); /* float labels handed over as int32 */
  assert_int_equal(clpar_cross_entropy(logits, labels, 2, CLPAR_REDUCTION_MEAN, &loss),
                   CLPAR_ERROR_INDEX);
  expect_in_message("label 1065353216 of row 0 is outside 0..9");
  expect_in_message("float 1");
  /* a plain out-of-range label gets no such hint */
  int32_t big[2] = {12, 0};
  assert_int_equal(clpar_cross_entropy(logits, big, 2, CLPAR_REDUCTION_MEAN, &loss),
                   CLPAR_ERROR_INDEX);
  assert_null(strstr(clpar_last_error(), "float"));
  assert_null(loss);
  clpar_tensor_free(logits);
}

static void test_linear_4d_input_suggests_flatten(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *fc;
  tu_ok(clpar_linear_create(48, 2, 1, dev, &fc));
  clpar_tensor *x = tu_make(dev, 4, (int64_t[]){2, 3, 4, 4}, 4), *y = NULL;
  assert_int_equal(clpar_module_forward(fc, x, &y), CLPAR_ERROR_SHAPE_MISMATCH);
  expect_in_message("clpar_linear: input is [2, 3, 4, 4]");
  expect_in_message("clpar_flatten_create(1, -1");
  assert_null(y);
  clpar_tensor_free(x);
  clpar_module_free(fc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sequential_names_the_child),
      cmocka_unit_test(test_sequential_names_a_fused_child),
      cmocka_unit_test(test_float_labels_hint),
      cmocka_unit_test(test_linear_4d_input_suggests_flatten),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
