/* test_debug.c — misuse that must explain itself: a tensor used after the clpar_scope_end
 * that freed it, or after clpar_tensor_free, is an error naming the op under CLPAR_DEBUG=1
 * (no crash, nothing read from freed memory); CLPAR_DEBUG is parsed strictly; a training
 * loop that keeps every step's tensors is warned about through the log, one that releases
 * them is not. Each test runs its own clpar_init with the environment it needs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static void init_with_debug(const char *value) {
  if (value)
    setenv("CLPAR_DEBUG", value, 1);
  else
    unsetenv("CLPAR_DEBUG");
  tu_ok(clpar_init());
}

static void done(void) {
  clpar_shutdown();
  unsetenv("CLPAR_DEBUG");
}

/* The log's error and warning lines, kept for the test to search. */
static char logged[8192];

static void keep_log(clpar_log_level level, const char *message, void *user) {
  (void)user;
  if (level > CLPAR_LOG_WARN) return;
  size_t used = strlen(logged);
  snprintf(logged + used, sizeof logged - used, "%s\n", message);
}

static void expect_error(clpar_status s, const char *op, const char *cause) {
  assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
  const char *e = clpar_last_error();
  if (strncmp(e, op, strlen(op)) != 0 || !strstr(e, cause))
    fail_msg("expected an error from %s saying \"%s\", got \"%s\"", op, cause, e);
}

static void test_use_after_scope_end(void **state) {
  (void)state;
  init_with_debug("1");
  clpar_device *dev = clpar_device_get(0);
  int64_t shape[] = {2, 3};
  clpar_tensor *kept = tu_make(dev, 2, shape, 1);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *t = tu_make(dev, 2, shape, 2), *sum = NULL;
  tu_ok(clpar_add(t, kept, &sum));
  clpar_scope_end(scope); /* frees t and sum */
  float out[6];
  expect_error(clpar_tensor_read(sum, out, 6), "clpar_tensor_read", "clpar_scope_end");
  clpar_tensor *again = NULL;
  expect_error(clpar_add(kept, t, &again), "clpar_add", "clpar_scope_end");
  assert_null(again);
  expect_error(clpar_matmul(t, kept, 0, 1, &again), "clpar_matmul", "clpar_scope_end");
  /* freeing it once more is refused through the log, and leaves the quarantine alone */
  logged[0] = '\0';
  clpar_log_set_callback(keep_log, NULL);
  clpar_tensor_free(t);
  clpar_log_set_callback(NULL, NULL);
  if (!strstr(logged, "clpar_tensor_free: the tensor was freed"))
    fail_msg("a second free was not reported: \"%s\"", logged);
  clpar_tensor_free(kept);
  done();
}

static void test_use_after_free(void **state) {
  (void)state;
  init_with_debug("1");
  clpar_device *dev = clpar_device_get(0);
  int64_t shape[] = {4};
  clpar_tensor *t = tu_make(dev, 1, shape, 3);
  clpar_tensor_free(t);
  float out[4];
  expect_error(clpar_tensor_read(t, out, 4), "clpar_tensor_read", "clpar_tensor_free");
  expect_error(clpar_fill(t, 1.0f), "clpar_fill", "clpar_tensor_free");
  assert_null(clpar_tensor_retain(t));
  done();
}

static void test_debug_env_is_strict(void **state) {
  (void)state;
  const char *bad[] = {"2", "yes", "1 ", "true"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("CLPAR_DEBUG", bad[i], 1);
    clpar_status s = clpar_init();
    if (s == CLPAR_OK) {
      clpar_shutdown();
      fail_msg("CLPAR_DEBUG=\"%s\" was accepted", bad[i]);
    }
    assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "CLPAR_DEBUG"));
  }
  init_with_debug("0");
  done();
  init_with_debug("");
  done();
}

/* steps (at most 64) SGD steps of loss = sum(w * x) with a fresh x each step; scoped: each
 * step between clpar_scope_begin and clpar_scope_end, else nothing the steps make is freed
 * until the loop has ended. Returns whether the log warned that live tensors grow. */
static int train_warns(int steps, int scoped) {
  clpar_tensor *made[3 * 64] = {NULL};
  init_with_debug(NULL);
  clpar_device *dev = clpar_device_get(0);
  int64_t shape[] = {8};
  clpar_tensor *w = tu_make(dev, 1, shape, 4);
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  clpar_optimizer *opt = NULL;
  tu_ok(clpar_sgd_create(&w, 1, &(clpar_sgd_options){.lr = 0.01f}, &opt));
  logged[0] = '\0';
  clpar_log_set_callback(keep_log, NULL);
  for (int i = 0; i < steps; i++) {
    clpar_scope *scope = scoped ? clpar_scope_begin() : NULL;
    clpar_tensor *x = tu_make(dev, 1, shape, 100 + (uint64_t)i), *y = NULL, *loss = NULL;
    int dim = 0;
    tu_ok(clpar_mul(w, x, &y));
    tu_ok(clpar_sum_dims(y, &dim, 1, 0, &loss));
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    if (scoped) {
      clpar_scope_end(scope);
    } else {
      made[3 * i] = x;
      made[3 * i + 1] = y;
      made[3 * i + 2] = loss;
    }
  }
  clpar_log_set_callback(NULL, NULL);
  for (int i = 0; i < 3 * steps; i++) clpar_tensor_free(made[i]);
  clpar_optimizer_free(opt);
  clpar_tensor_free(w);
  done();
  return strstr(logged, "live tensors grew") != NULL;
}

static void test_leak_warning(void **state) {
  (void)state;
  assert_true(train_warns(30, 0));
  assert_false(train_warns(30, 1));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_use_after_scope_end),
      cmocka_unit_test(test_use_after_free),
      cmocka_unit_test(test_debug_env_is_strict),
      cmocka_unit_test(test_leak_warning),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
