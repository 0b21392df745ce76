/* test_status.c — the status list (names, messages), the thread-local error message, and
 * logging: levels, the callback, and never a byte on stdout. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_and_strings),
      cmocka_unit_test(test_message_is_thread_local),
      cmocka_unit_test(test_log_callback_and_levels),
      cmocka_unit_test(test_log_callback_may_call_clpar),
      cmocka_unit_test(test_nothing_on_stdout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
