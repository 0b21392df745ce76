/* test_status.c — the status list (names, messages), the thread-local error message, and
 * logging: levels, the callback, and never a byte on stdout. Then messages that must name
 * the right call and cause (sizes checked before any work, the loss and the optimizer named,
 * a DataParallel wrapper not moved), and clpar_shutdown with tensors still alive. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

static void test_names_and_strings(void **state) {
  (void)state;
#define CHECK_(name, value, msg)                       \
  assert_string_equal(clpar_status_name(name), #name); \
  assert_string_equal(clpar_status_string(name), msg);
  CLPAR_STATUS_LIST(CHECK_)
#undef CHECK_
  assert_string_equal(clpar_status_name((clpar_status)-999), "CLPAR_UNKNOWN_STATUS");
  assert_string_equal(clpar_status_string((clpar_status)-999), "unknown status");
}

static void *other_thread(void *arg) {
  *(int *)arg = clpar_last_error()[0] == '\0';
  clpar_set_error(CLPAR_ERROR_INTERNAL, "from the other thread");
  return NULL;
}

static void test_message_is_thread_local(void **state) {
  (void)state;
  assert_int_equal(clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "a is [%d]", 3),
                   CLPAR_ERROR_SHAPE_MISMATCH);
  clpar_append_error("; %s", "more");
  assert_string_equal(clpar_last_error(), "a is [3]; more");
  int empty = 0;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, other_thread, &empty), 0);
  pthread_join(th, NULL);
  assert_true(empty);
  assert_string_equal(clpar_last_error(), "a is [3]; more");
  clpar_clear_error();
  assert_string_equal(clpar_last_error(), "");
}

typedef struct {
  int count;
  clpar_log_level worst;
  char last[256];
} log_capture;

static void capture(clpar_log_level level, const char *msg, void *user) {
  log_capture *c = user;
  c->count++;
  if (c->worst == CLPAR_LOG_OFF || level < c->worst) c->worst = level;
  snprintf(c->last, sizeof c->last, "%s", msg);
}

static void test_log_callback_and_levels(void **state) {
  (void)state;
  log_capture cap = {0};
  clpar_log_level old = clpar_log_get_level();
  clpar_log_set_callback(capture, &cap);
  clpar_log_set_level(CLPAR_LOG_WARN);
  clpar_log(CLPAR_LOG_INFO, "hidden");
  assert_int_equal(cap.count, 0);
  clpar_log(CLPAR_LOG_WARN, "shown %d", 1);
  assert_int_equal(cap.count, 1);
  assert_string_equal(cap.last, "shown 1");
  clpar_log_set_level((clpar_log_level)99);
  assert_int_equal(clpar_log_get_level(), CLPAR_LOG_DEBUG);
  clpar_log_set_callback(NULL, NULL);
  clpar_log_set_level(old);
}

/* A callback that calls into clpar: an error (which logs at debug level), the callback and
 * level setters. It runs in a thread that must finish within seconds: with the log lock held
 * during the callback it deadlocked, and the lock would then block every later test. */
typedef struct {
  int calls;
  int nested_error; /* what clpar_device_get(-1) reported inside the callback */
  int done;         /* atomic: the thread got through */
} reentrant_state;

static void reentrant(clpar_log_level level, const char *msg, void *user) {
  (void)level;
  (void)msg;
  reentrant_state *st = user;
  st->calls++;
  st->nested_error = clpar_device_get(-1) == NULL; /* logs "NOT_INITIALIZED" at debug */
  clpar_log_set_callback(reentrant, user);
  clpar_log_set_level(clpar_log_get_level());
  clpar_log(CLPAR_LOG_WARN, "logged from inside the callback");
}

static void *log_from_thread(void *arg) {
  reentrant_state *st = arg;
  clpar_log_set_callback(reentrant, arg);
  clpar_log(CLPAR_LOG_WARN, "outer message");
  clpar_log_set_callback(NULL, NULL);
  __atomic_store_n(&st->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void test_log_callback_may_call_clpar(void **state) {
  (void)state;
  reentrant_state st = {0};
  clpar_log_level old = clpar_log_get_level();
  clpar_log_set_level(CLPAR_LOG_DEBUG);
  int stderr_saved = dup(STDERR_FILENO);
  FILE *err = tmpfile(); /* the nested messages go to stderr; keep them out of the test log */
  dup2(fileno(err), STDERR_FILENO);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, log_from_thread, &st), 0);
  for (int ms = 0; ms < 20000 && !__atomic_load_n(&st.done, __ATOMIC_ACQUIRE); ms += 10)
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  fflush(stderr);
  dup2(stderr_saved, STDERR_FILENO);
  close(stderr_saved);
  if (!__atomic_load_n(&st.done, __ATOMIC_ACQUIRE)) {
    fprintf(stderr, "a log callback that calls clpar deadlocked\n");
    _exit(1); /* the log lock stays held: later tests would hang too */
  }
  pthread_join(th, NULL);
  clpar_log_set_level(old);
  assert_int_equal(st.calls, 1); /* nested messages did not recurse into the callback */
  assert_true(st.nested_error);
  fseek(err, 0, SEEK_END);
  assert_true(ftell(err) > 0);
  fclose(err);
}

/* Everything a program does with the library, at the most verbose level, with errors:
 * stdout stays empty. */
static void test_nothing_on_stdout(void **state) {
  (void)state;
  fflush(stdout);
  int saved = dup(STDOUT_FILENO);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  dup2(fileno(tmp), STDOUT_FILENO);
  setenv("CLPAR_LOG_LEVEL", "debug", 1);
  int stderr_saved = dup(STDERR_FILENO);
  FILE *err = tmpfile();
  dup2(fileno(err), STDERR_FILENO); /* debug logs go to stderr; keep them out of the test log */
  clpar_status s = clpar_init();
  if (s == CLPAR_OK) {
    clpar_device *dev = clpar_device_get(0);
    clpar_tensor *a = NULL, *b = NULL, *c = NULL;
    clpar_tensor_rand_uniform(dev, 2, (int64_t[]){4, 4}, 1, 0, 1, &a);
    clpar_tensor_zeros(dev, 2, (int64_t[]){3, 4}, &b);
    clpar_add(a, b, &c); /* an error */
    clpar_matmul(a, a, 0, 0, &c);
    clpar_tensor_free(c);
    clpar_tensor_free(a);
    clpar_tensor_free(b);
    clpar_shutdown();
  }
  fflush(stdout);
  fflush(stderr);
  dup2(saved, STDOUT_FILENO);
  dup2(stderr_saved, STDERR_FILENO);
  close(saved);
  close(stderr_saved);
  unsetenv("CLPAR_LOG_LEVEL");
  clpar_log_set_level(CLPAR_LOG_WARN);
  assert_int_equal(s, CLPAR_OK);
  fseek(tmp, 0, SEEK_END);
  assert_int_equal(ftell(tmp), 0);
  fseek(err, 0, SEEK_END);
  assert_true(ftell(err) > 0); /* the debug log did go somewhere: stderr */
  fclose(tmp);
  fclose(err);
}

/* ---- clear errors ---- */

static void expect_message(clpar_status s, clpar_status want, const char *needle) {
  if (s != want)
    fail_msg("got %s, expected %s: %s", clpar_status_name(s), clpar_status_name(want),
             clpar_last_error());
  if (!strstr(clpar_last_error(), needle))
    fail_msg("the message \"%s\" does not say \"%s\"", clpar_last_error(), needle);
}

/* 2^40 floats (4 TiB): before, the host array was filled (or failed to allocate) before any
 * size check, and the error was "out of host memory". */
static void test_oversized_rand_and_linear(void **state) {
  (void)state;
  tu_ok(clpar_init());
  int64_t huge[2] = {(int64_t)1 << 20, (int64_t)1 << 20};
  for (int i = -1; i < clpar_device_count(); i++) {
    clpar_device *dev = i < 0 ? tu_host() : clpar_device_get(i);
    clpar_tensor *t = (clpar_tensor *)(uintptr_t)0x1;
    expect_message(clpar_tensor_rand_uniform(dev, 2, huge, 1, 0, 1, &t), CLPAR_ERROR_TOO_LARGE,
                   "clpar_tensor_rand_uniform: 1099511627776 elements");
    assert_non_null(strstr(clpar_last_error(), clpar_device_id(dev)));
    expect_message(clpar_tensor_rand_normal(dev, 2, huge, 1, 0, 1, &t), CLPAR_ERROR_TOO_LARGE,
                   "clpar_tensor_rand_normal");
    assert_ptr_equal(t, (clpar_tensor *)(uintptr_t)0x1); /* untouched */
    clpar_module *m = NULL;
    expect_message(clpar_linear_create(huge[1], huge[0], 1, dev, &m), CLPAR_ERROR_TOO_LARGE,
                   "clpar_linear_create");
    assert_null(m);
    clpar_memory_stats ms;
    tu_ok(clpar_device_memory_stats(dev, &ms));
    assert_int_equal(ms.bytes_in_use, 0); /* nothing made */
  }
  clpar_shutdown();
}

/* The fill now goes a block (2^20 floats) at a time: values across the block's edge are the
 * generator's, as before. */
static void test_rand_fill_across_blocks(void **state) {
  (void)state;
  tu_ok(clpar_init());
  int64_t n = ((int64_t)1 << 20) + 3;
  clpar_tensor *u, *g;
  tu_ok(clpar_tensor_rand_uniform(tu_host(), 1, &n, 77, -2.0f, 3.0f, &u));
  tu_ok(clpar_tensor_rand_normal(tu_host(), 1, &n, 78, 1.0f, 0.5f, &g));
  float *pu = tu_read(u), *pg = tu_read(g);
  for (int64_t i = 0; i < n; i++) {
    float want = -2.0f + 5.0f * clpar_rng_uniform01(77, (uint64_t)i);
    if (pu[i] != want)
      fail_msg("uniform element %lld is %g, expected %g", (long long)i, pu[i], want);
  }
  for (int64_t i = ((int64_t)1 << 20) - 2; i < n; i++) {
    float u1 = 1.0f - clpar_rng_uniform01(78, 2 * (uint64_t)i);
    float u2 = clpar_rng_uniform01(78, 2 * (uint64_t)i + 1);
    float want = 1.0f + 0.5f * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795865f * u2);
    assert_float_equal(pg[i], want, 0);
  }
  free(pu);
  free(pg);
  clpar_tensor_free(u);
  clpar_tensor_free(g);
  clpar_shutdown();
}

static void test_mse_loss_names_itself(void **state) {
  (void)state;
  tu_ok(clpar_init());
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *a = tu_make(dev, 2, (int64_t[]){2, 3}, 1);
  clpar_tensor *b = tu_make(dev, 2, (int64_t[]){3, 2}, 2); /* as many elements, other shape */
  clpar_tensor *loss = NULL;
  expect_message(clpar_mse_loss(a, b, CLPAR_REDUCTION_MEAN, &loss), CLPAR_ERROR_SHAPE_MISMATCH,
                 "clpar_mse_loss: input is [2, 3] and target is [3, 2]");
  assert_null(strstr(clpar_last_error(), "clpar_sub"));
  assert_null(loss);
  clpar_tensor_free(a);
  clpar_tensor_free(b);
  clpar_shutdown();
}

static void test_optimizer_for_null_module(void **state) {
  (void)state;
  tu_ok(clpar_init());
  clpar_optimizer *o = NULL;
  clpar_sgd_options sgd = {.lr = 0.1f};
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  expect_message(clpar_sgd_create_for(NULL, &sgd, &o), CLPAR_ERROR_INVALID_ARGUMENT,
                 "clpar_sgd_create_for: the module is NULL");
  expect_message(clpar_adam_create_for(NULL, &adam, &o), CLPAR_ERROR_INVALID_ARGUMENT,
                 "clpar_adam_create_for: the module is NULL");
  expect_message(clpar_adamw_create_for(NULL, &adam, &o), CLPAR_ERROR_INVALID_ARGUMENT,
                 "clpar_adamw_create_for: the module is NULL");
  clpar_module *relu;
  tu_ok(clpar_relu_create(&relu));
  expect_message(clpar_sgd_create_for(relu, &sgd, &o), CLPAR_ERROR_INVALID_ARGUMENT,
                 "clpar_sgd_create_for: the module (ReLU) has no parameters");
  assert_null(o);
  clpar_module_free(relu);
  clpar_shutdown();
}

/* Before, the move was accepted and the next forward failed (or read another device's
 * memory): the replicas stay where the wrapper put them. */
static void test_module_to_refuses_data_parallel(void **state) {
  (void)state;
  tu_ok(clpar_init());
  clpar_module *lin, *dp, *seq;
  tu_ok(clpar_linear_create(4, 3, 1, clpar_device_get(0), &lin));
  tu_ok(clpar_data_parallel_create(lin, NULL, &dp));
  /* Refused wherever to, even to where it is (host-only runs have no other device). */
  clpar_device *target = tu_host();
  expect_message(clpar_module_to(dp, target), CLPAR_ERROR_INVALID_ARGUMENT,
                 "clpar_module_to: the module is a DataParallel wrapper");
  tu_ok(clpar_sequential_create(&dp, 1, &seq));
  expect_message(clpar_module_to(seq, target), CLPAR_ERROR_INVALID_ARGUMENT,
                 "clpar_module_to: the module contains a DataParallel wrapper");
  for (int i = 0; i < clpar_module_parameter_count(seq); i++) { /* nothing moved */
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(seq, i, NULL, &p));
    assert_ptr_equal(clpar_tensor_device(p), clpar_device_get(0));
  }
  clpar_tensor *x = tu_make(clpar_device_get(0), 2, (int64_t[]){5, 4}, 3), *y = NULL;
  tu_ok(clpar_module_forward(seq, x, &y)); /* and it still works */
  assert_int_equal(clpar_tensor_dim(y, 1), 3);
  clpar_tensor_free(y);
  clpar_tensor_free(x);
  clpar_module_free(seq);
  clpar_shutdown();
}

/* ---- clpar_shutdown with tensors alive ---- */

typedef struct {
  int warnings;
  char last[1024];
} warn_capture;

static void capture_warnings(clpar_log_level level, const char *msg, void *user) {
  warn_capture *c = user;
  if (level != CLPAR_LOG_WARN) return;
  c->warnings++;
  snprintf(c->last, sizeof c->last, "%s", msg);
}

/* A program that leaves on an error path: three tensors (one a view) on the first device, a
 * trained module with its optimizer and a graph on every device. Shutdown releases their
 * memory with one warning; afterwards they refuse use and can be freed (ASan and LSan check
 * that nothing is touched after it was freed, and nothing leaks). */
static void test_shutdown_with_live_tensors(void **state) {
  (void)state;
  warn_capture cap = {0};
  clpar_log_level old = clpar_log_get_level();
  clpar_log_set_level(CLPAR_LOG_WARN);
  tu_ok(clpar_init());
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){4, 4}, 1), *v, *y, *sum = NULL;
  tu_ok(clpar_tensor_rows(x, 1, 2, &v));
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){3}, &y));
  clpar_log_set_callback(capture_warnings, &cap);
  clpar_shutdown();
  clpar_log_set_callback(NULL, NULL);
  assert_int_equal(cap.warnings, 1);
  if (!strstr(cap.last, "clpar_shutdown: 3 tensors were still alive (2 buffers"))
    fail_msg("the warning says \"%s\"", cap.last);
  float buf[16];
  expect_message(clpar_tensor_read(x, buf, 16), CLPAR_ERROR_NOT_INITIALIZED,
                 "outlived clpar_shutdown");
  expect_message(clpar_tensor_write(y, buf, 3), CLPAR_ERROR_NOT_INITIALIZED,
                 "outlived clpar_shutdown");
  expect_message(clpar_add(x, x, &sum), CLPAR_ERROR_NOT_INITIALIZED, "clpar_add");
  assert_null(sum);
  clpar_tensor_free(v);
  clpar_tensor_free(x);
  clpar_tensor_free(y);

  /* A training step's worth of objects on every device, left alive. */
  tu_ok(clpar_init());
  int n = clpar_device_count();
  clpar_module *m[8] = {0};
  clpar_optimizer *o[8] = {0};
  clpar_tensor *loss[8] = {0};
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  for (int i = 0; i < n && i < 8; i++) {
    clpar_device *d = clpar_device_get(i);
    clpar_tensor *in = tu_make(d, 2, (int64_t[]){6, 5}, 10 + (uint64_t)i), *out;
    tu_ok(clpar_linear_create(5, 2, 1, d, &m[i]));
    tu_ok(clpar_adam_create_for(m[i], &adam, &o[i]));
    tu_ok(clpar_module_forward(m[i], in, &out));
    tu_ok(clpar_sum(out, &loss[i]));
    tu_ok(clpar_backward(loss[i]));
    tu_ok(clpar_optimizer_step(o[i]));
    clpar_tensor_free(out);
    clpar_tensor_free(in);
  }
  cap.warnings = 0;
  clpar_log_set_callback(capture_warnings, &cap);
  clpar_shutdown();
  clpar_log_set_callback(NULL, NULL);
  assert_int_equal(cap.warnings, 1);
  assert_non_null(strstr(cap.last, "tensors were still alive"));
  expect_message(clpar_optimizer_step(o[0]), CLPAR_ERROR_NOT_INITIALIZED, "clpar_optimizer_step");
  expect_message(clpar_backward(loss[0]), CLPAR_ERROR_NOT_INITIALIZED, "clpar_backward");
  clpar_tensor *out = NULL;
  expect_message(clpar_module_forward(m[0], loss[0], &out), CLPAR_ERROR_NOT_INITIALIZED,
                 "outlived clpar_shutdown");
  assert_null(out);
  for (int i = 0; i < n && i < 8; i++) {
    clpar_tensor_free(loss[i]); /* its graph holds the forward's tensors */
    clpar_optimizer_free(o[i]);
    clpar_module_free(m[i]);
  }

  tu_ok(clpar_init()); /* and the library starts afresh, with nothing in use */
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_memory_stats ms;
    tu_ok(clpar_device_memory_stats(clpar_device_get(i), &ms));
    assert_int_equal(ms.bytes_in_use, 0);
  }
  cap.warnings = 0;
  clpar_log_set_callback(capture_warnings, &cap);
  clpar_shutdown();
  clpar_log_set_callback(NULL, NULL);
  assert_int_equal(cap.warnings, 0); /* nothing alive: nothing to say */
  clpar_log_set_level(old);
}

/* CLPAR_CHECK returns the failing status from the enclosing function, after evaluating the
 * expression once; CLPAR_CHECK_GOTO stores it and jumps. */
static int evaluations;
static clpar_status counted(clpar_status s) {
  evaluations++;
  return s;
}
static clpar_status checked(clpar_status first, clpar_status second, int *reached_end) {
  CLPAR_CHECK(counted(first));
  CLPAR_CHECK(counted(second));
  *reached_end = 1;
  return CLPAR_OK;
}
static clpar_status checked_goto(clpar_status first, int *cleaned) {
  clpar_status s;
  CLPAR_CHECK_GOTO(counted(first), s, done);
  s = CLPAR_ERROR_INTERNAL; /* not reached when first fails */
done:
  *cleaned = 1;
  return s;
}

static void test_check_macros(void **state) {
  (void)state;
  int end = 0, cleaned = 0;
  evaluations = 0;
  assert_int_equal(checked(CLPAR_OK, CLPAR_OK, &end), CLPAR_OK);
  assert_int_equal(end, 1);
  assert_int_equal(evaluations, 2);
  end = 0;
  evaluations = 0;
  assert_int_equal(checked(CLPAR_ERROR_SHAPE_MISMATCH, CLPAR_OK, &end), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_int_equal(end, 0);
  assert_int_equal(evaluations, 1);
  assert_int_equal(checked(CLPAR_OK, CLPAR_ERROR_IO, &end), CLPAR_ERROR_IO);
  assert_int_equal(end, 0);
  assert_int_equal(checked_goto(CLPAR_ERROR_DTYPE, &cleaned), CLPAR_ERROR_DTYPE);
  assert_int_equal(cleaned, 1);
  cleaned = 0;
  assert_int_equal(checked_goto(CLPAR_OK, &cleaned), CLPAR_ERROR_INTERNAL);
  assert_int_equal(cleaned, 1);
}

/* The message is the last failure's, errno-like: an OK call leaves it, clpar_clear_error
 * empties it; clpar_last_error is the same message. */
static void test_last_failure_survives_success(void **state) {
  (void)state;
  tu_ok(clpar_init());
  clpar_clear_error();
  assert_string_equal(clpar_last_failure(), "");
  clpar_optimizer *o = NULL;
  assert_int_equal(clpar_sgd_create_for(NULL, NULL, &o), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_string_equal(clpar_last_failure(), "clpar_sgd_create_for: the module is NULL");
  assert_ptr_equal(clpar_last_error(), clpar_last_failure());
  clpar_module *relu;
  tu_ok(clpar_relu_create(&relu));
  assert_string_equal(clpar_last_failure(), "clpar_sgd_create_for: the module is NULL");
  clpar_module_free(relu);
  clpar_clear_error();
  assert_string_equal(clpar_last_failure(), "");
  clpar_shutdown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_and_strings),
      cmocka_unit_test(test_message_is_thread_local),
      cmocka_unit_test(test_log_callback_and_levels),
      cmocka_unit_test(test_log_callback_may_call_clpar),
      cmocka_unit_test(test_nothing_on_stdout),
      cmocka_unit_test(test_oversized_rand_and_linear),
      cmocka_unit_test(test_rand_fill_across_blocks),
      cmocka_unit_test(test_mse_loss_names_itself),
      cmocka_unit_test(test_optimizer_for_null_module),
      cmocka_unit_test(test_module_to_refuses_data_parallel),
      cmocka_unit_test(test_shutdown_with_live_tensors),
      cmocka_unit_test(test_check_macros),
      cmocka_unit_test(test_last_failure_survives_success),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
