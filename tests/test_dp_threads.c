/* test_dp_threads.c — one DataParallel and two threads (ctest runs it on POCL_DEVICES="basic
 * basic"). One thread at a time may train a DataParallel: a forward from a second thread while
 * a graph of the first thread's forward is alive is CLPAR_ERROR_BUSY, with a message that says
 * so, and works once that graph is freed; two threads training at once end with every step
 * either done or refused that way (the sanitizer build checks that nothing else happens). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { ROWS = 8, IN = 16, OUT = 4 };

typedef struct {
  clpar_module *dp;
  clpar_device *dev;
  int steps; /* training steps to run */
  uint64_t seed;
  int done; /* steps that completed */
  clpar_status status;
  char message[512];
} worker;

/* One SGD step of w->dp on a batch made on w->dev (without opt: the forward and the loss
 * only, the loss into *keep; it belongs to the caller's scope). */
static clpar_status step(worker *w, clpar_optimizer *opt, int t, clpar_tensor **keep) {
  clpar_tensor *x, *target, *y, *loss;
  clpar_status s =
      clpar_tensor_rand_normal(w->dev, 2, (int64_t[]){ROWS, IN}, w->seed + (uint64_t)t, 0, 1, &x);
  if (s == CLPAR_OK)
    s = clpar_tensor_rand_normal(w->dev, 2, (int64_t[]){ROWS, OUT}, w->seed + 500 + (uint64_t)t, 0,
                                 1, &target);
  if (s == CLPAR_OK && opt) s = clpar_optimizer_zero_grad(opt);
  if (s == CLPAR_OK) s = clpar_module_forward(w->dp, x, &y);
  if (s == CLPAR_OK) s = clpar_mse_loss(y, target, CLPAR_REDUCTION_MEAN, &loss);
  if (s == CLPAR_OK && keep) *keep = loss;
  if (s == CLPAR_OK && opt) s = clpar_backward(loss);
  if (s == CLPAR_OK && opt) s = clpar_optimizer_step(opt);
  return s;
}

static void *train(void *arg) {
  worker *w = arg;
  clpar_optimizer *opt;
  w->status = clpar_sgd_create_for(w->dp, &(clpar_sgd_options){.lr = 0.01f}, &opt);
  for (int t = 0; w->status == CLPAR_OK && t < w->steps; t++) {
    clpar_scope *sc = clpar_scope_begin();
    w->status = step(w, opt, t, NULL);
    clpar_scope_end(sc);
    if (w->status == CLPAR_OK) w->done++;
  }
  if (w->status != CLPAR_OK) snprintf(w->message, sizeof w->message, "%s", clpar_last_error());
  clpar_optimizer_free(opt);
  return NULL;
}

static void run_thread(worker *w) {
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, train, w), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
}

/* An MLP in a DataParallel over opencl:0 and opencl:1, or NULL (skip). */
static clpar_module *make_dp(clpar_device **devs) {
  if (clpar_device_find("opencl:0", &devs[0]) != CLPAR_OK ||
      clpar_device_find("opencl:1", &devs[1]) != CLPAR_OK)
    return NULL;
  clpar_module *layers[3], *mlp, *dp;
  clpar_manual_seed(3);
  tu_ok(clpar_linear_create(IN, 32, 1, devs[0], &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(32, OUT, 1, devs[0], &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &mlp));
  clpar_data_parallel_options o = {.devices = devs, .n_devices = 2};
  tu_ok(clpar_data_parallel_create(mlp, &o, &dp));
  return dp;
}

#define NEED_DP(dp, devs)                                        \
  clpar_device *devs[2];                                         \
  clpar_module *dp = make_dp(devs);                              \
  if (!dp) {                                                     \
    fprintf(stderr, "skipped: fewer than two OpenCL devices\n"); \
    skip();                                                      \
  }

static void test_second_thread_refused_while_graph_alive(void **state) {
  (void)state;
  NEED_DP(dp, devs);
  worker main_w = {dp, devs[0], 0, 1, 0, CLPAR_OK, ""};
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *loss = NULL;
  tu_ok(step(&main_w, NULL, 0, &loss)); /* a forward whose graph stays alive */
  worker other = {dp, devs[0], 1, 100, 0, CLPAR_OK, ""};
  run_thread(&other);
  assert_int_equal(other.status, CLPAR_ERROR_BUSY);
  assert_non_null(strstr(other.message, "one thread at a time may train a DataParallel"));
  assert_int_equal(other.done, 0);
  /* the owner goes on */
  tu_ok(clpar_backward(loss));
  clpar_scope_end(sc);
  /* its graph freed, another thread may train, and then this one again */
  worker again = {dp, devs[0], 2, 200, 0, CLPAR_OK, ""};
  run_thread(&again);
  if (again.status != CLPAR_OK) fail_msg("after the graph was freed: %s", again.message);
  assert_int_equal(again.done, 2);
  sc = clpar_scope_begin();
  tu_ok(step(&main_w, NULL, 1, NULL));
  clpar_scope_end(sc);
  clpar_module_free(dp);
}

static void test_two_threads_at_once(void **state) {
  (void)state;
  NEED_DP(dp, devs);
  worker w[2] = {{dp, devs[0], 10, 10, 0, CLPAR_OK, ""}, {dp, devs[0], 10, 1000, 0, CLPAR_OK, ""}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, train, &w[i]), 0);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  for (int i = 0; i < 2; i++)
    if (w[i].status != CLPAR_OK && w[i].status != CLPAR_ERROR_BUSY)
      fail_msg("thread %d after %d steps: %s: %s", i, w[i].done, clpar_status_name(w[i].status),
               w[i].message);
  assert_true(w[0].done == 10 || w[1].done == 10); /* the first to start keeps going */
  clpar_module_free(dp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_thread_refused_while_graph_alive),
      cmocka_unit_test(test_two_threads_at_once),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
