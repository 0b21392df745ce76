/* test_memory_categories.c — device memory by category (include/clpar/memory.h): a module's
 * parameters, the activations of its forward, the gradients of backward and Adam's moments each
 * land in their own category, the peak of a category between two marks follows what it held, and a
 * flattened module's parameters stay parameters. On every selected device. */
#include <string.h>

#include "internal.h"
#include "test_util.h"

enum { IN = 64, OUT = 32, ROWS = 128 };

/* Bytes the allocator counts for a tensor of n floats (its rounding: 512 below 1 MiB). */
static uint64_t rounded(uint64_t n) {
  return (n * 4 + 511) / 512 * 512;
}

static const uint64_t weight = IN * OUT, bias = OUT;

static void check_device(clpar_device *dev) {
  clpar_mem_category P = CLPAR_MEM_PARAMETERS, G = CLPAR_MEM_GRADIENTS, A = CLPAR_MEM_ACTIVATIONS,
                     O = CLPAR_MEM_OPTIMIZER, T = CLPAR_MEM_TOTAL;
  uint64_t p0 = clpar_memory_in_use(dev, P), g0 = clpar_memory_in_use(dev, G);
  uint64_t a0 = clpar_memory_in_use(dev, A), o0 = clpar_memory_in_use(dev, O);
  clpar_module *lin;
  tu_ok(clpar_linear_create(IN, OUT, 1, dev, &lin));
  uint64_t params = rounded(weight) + rounded(bias);
  assert_int_equal(clpar_memory_in_use(dev, P) - p0, params);
  assert_int_equal(clpar_memory_in_use(dev, A), a0);

  tu_ok(clpar_memory_mark(dev));
  assert_int_equal(clpar_memory_peak(dev, A), a0);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){ROWS, IN}, 3), *y, *loss;
  tu_ok(clpar_module_forward(lin, x, &y));
  tu_ok(clpar_mean(y, &loss));
  /* the input and the output at least, while the scope holds them */
  assert_true(clpar_memory_in_use(dev, A) >= a0 + rounded(ROWS * IN) + rounded(ROWS * OUT));
  tu_ok(clpar_backward(loss));
  assert_int_equal(clpar_memory_in_use(dev, G) - g0, params);
  clpar_scope_end(scope);
  tu_ok(clpar_device_synchronize(dev));
  /* the activations went back; their peak stays until the next mark */
  assert_int_equal(clpar_memory_in_use(dev, A), a0);
  assert_true(clpar_memory_peak(dev, A) >= a0 + rounded(ROWS * IN) + rounded(ROWS * OUT));
  assert_true(clpar_memory_peak(dev, T) >= clpar_memory_peak(dev, P) + clpar_memory_peak(dev, G));
  tu_ok(clpar_memory_mark(dev));
  assert_int_equal(clpar_memory_peak(dev, A), a0);

  clpar_optimizer *opt;
  tu_ok(clpar_adam_create_for(lin, NULL, &opt));
  assert_int_equal(clpar_memory_in_use(dev, O), o0);
  tu_ok(clpar_optimizer_step(opt)); /* two moments per parameter */
  assert_int_equal(clpar_memory_in_use(dev, O) - o0, 2 * params);
  clpar_optimizer_free(opt);
  assert_int_equal(clpar_memory_in_use(dev, O), o0);

  /* one flat buffer (and one flat gradient) replaces the parameters' own */
  tu_ok(clpar_module_flatten(lin));
  assert_int_equal(clpar_memory_in_use(dev, P) - p0, rounded(weight + bias));
  assert_int_equal(clpar_memory_in_use(dev, G) - g0, rounded(weight + bias));
  clpar_module_free(lin);
  assert_int_equal(clpar_memory_in_use(dev, P), p0);
  assert_int_equal(clpar_memory_in_use(dev, G), g0);
}

static void test_categories_follow_training(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) check_device(clpar_device_get(d));
}

static void test_names_and_bad_arguments(void **state) {
  (void)state;
  assert_string_equal(clpar_memory_category_name(CLPAR_MEM_OPTIMIZER), "optimizer");
  assert_string_equal(clpar_memory_category_name(CLPAR_MEM_TOTAL), "total");
  assert_null(clpar_memory_category_name(CLPAR_MEM_CATEGORIES));
  assert_int_equal(clpar_memory_mark(NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "clpar_memory_mark"));
  assert_int_equal(clpar_memory_peak(NULL, CLPAR_MEM_TOTAL), 0);
  assert_int_equal(clpar_memory_in_use(clpar_device_get(0), (clpar_mem_category)99), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_categories_follow_training),
      cmocka_unit_test(test_names_and_bad_arguments),
  };
  return cmocka_run_group_tests_name("memory_categories", tests, tu_setup, tu_teardown);
}
