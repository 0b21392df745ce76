/* test_capture_host.c — host calls and gates (src/runtime/capture_host.c): a host call runs
 * once the work posted before it completed, in eager mode and in each replay of a graph that
 * recorded it; a gate holds the device's queue until a host thread opens it, once per pass;
 * a gate opened with an error fails the queue with that error's message (how a captured
 * DistributedDataParallel step reports a peer that never arrived); a replay of a graph with
 * a gate counts as in flight until the device completed it, and clpar_replays_wait drains
 * only while one is. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* the runtime: clpar_dev_host_call, clpar_gate_* */
#include "test_util.h"

typedef struct {
  clpar_gate *gate; /* opened by each call, when set */
  int calls;        /* atomic */
  clpar_status last;
} counter;

static void count_call(void *user, clpar_status s) {
  counter *c = user;
  c->last = s;
  __atomic_add_fetch(&c->calls, 1, __ATOMIC_SEQ_CST);
  if (c->gate) clpar_gate_open(c->gate, CLPAR_OK, NULL);
}

/* Eagerly: the call runs once, after the fill before it; a gate the call opens lets the fill
 * after it run. */
static void test_host_call_and_gate_eager(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *t;
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){64}, &t));
  counter c = {clpar_gate_new(), 0, CLPAR_ERROR_INTERNAL};
  assert_non_null(c.gate);
  clpar_host_call call = {count_call, &c};
  tu_ok(clpar_fill(t, 1.0f));
  tu_ok(clpar_dev_host_call(dev, &call));
  tu_ok(clpar_dev_gate_wait(dev, c.gate));
  tu_ok(clpar_fill(t, 2.0f));
  float v[64];
  tu_ok(clpar_tensor_read(t, v, 64));
  assert_int_equal(c.calls, 1);
  assert_int_equal(c.last, CLPAR_OK);
  assert_true(v[0] == 2.0f && v[63] == 2.0f);
  assert_int_equal(clpar_dev_host_call(dev, &(clpar_host_call){NULL, NULL}),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_gate_free(c.gate);
  clpar_tensor_free(t);
}

/* Captured: the call and the gate are commands of the graph; each replay calls again and
 * passes the gate once more, allocating nothing for them. */
static void test_host_call_and_gate_replayed(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *t, *u;
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){64}, &t));
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){64}, &u));
  counter c = {clpar_gate_new(), 0, CLPAR_ERROR_INTERNAL};
  clpar_host_call call = {count_call, &c};
  clpar_graph *g = NULL;
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  tu_ok(clpar_fill(t, 3.0f));
  tu_ok(clpar_dev_host_call(dev, &call));
  tu_ok(clpar_dev_gate_wait(dev, c.gate));
  tu_ok(clpar_copy(u, t));
  tu_ok(clpar_graph_capture_end(&g));
  float v[64] = {0};
  tu_ok(clpar_tensor_write(u, v, 64));
  for (int i = 0; i < 5; i++) tu_ok(clpar_graph_replay(g));
  tu_ok(clpar_tensor_read(u, v, 64));
  assert_int_equal(c.calls, 6); /* the capture run and 5 replays */
  assert_int_equal(c.last, CLPAR_OK);
  assert_true(v[0] == 3.0f && v[63] == 3.0f);
  clpar_graph_destroy(g);
  clpar_gate_free(c.gate);
  clpar_tensor_free(u);
  clpar_tensor_free(t);
}

/* A gate opened with an error: the pass fails the queue, and the next call on the device
 * returns the error with the opening's message (and every later pass fails alike). */
static void test_gate_opened_with_error(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_gate *g = clpar_gate_new();
  clpar_gate_open(g, CLPAR_ERROR_TIMEOUT, "the peer rank 1 did not arrive");
  tu_ok(clpar_dev_gate_wait(dev, g));
  assert_int_equal(clpar_device_synchronize(dev), CLPAR_ERROR_TIMEOUT);
  assert_non_null(strstr(clpar_last_error(), "the peer rank 1 did not arrive"));
  clpar_gate_open(g, CLPAR_OK, NULL);
  tu_ok(clpar_dev_gate_wait(dev, g));
  assert_int_equal(clpar_device_synchronize(dev), CLPAR_ERROR_TIMEOUT);
  tu_ok(clpar_device_synchronize(dev)); /* taken: the device goes on */
  clpar_gate_free(g);
}

static uint64_t load(const uint64_t *v) {
  return __atomic_load_n(v, __ATOMIC_ACQUIRE);
}

typedef struct {
  clpar_device *dev;
  clpar_gate *gate;
  uint64_t drains; /* the device's drains before the wait */
  int returned;    /* atomic: the wait returned */
} opener;

/* Opens the gate once the main thread drains in clpar_replays_wait (or its wait returned
 * without, which the test then reports). */
static void *open_when_draining(void *user) {
  opener *o = user;
  while (load(&o->dev->replay_drains) == o->drains &&
         !__atomic_load_n(&o->returned, __ATOMIC_ACQUIRE))
    sched_yield();
  clpar_gate_open(o->gate, CLPAR_OK, NULL);
  return NULL;
}

/* Held at its gate, a replay is in flight: clpar_replays_wait drains (counted) until a thread
 * opens the gate, and the replay ends. With none in flight the wait drains nothing, and a
 * graph without host calls or gates is never counted. */
static void test_replays_in_flight(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *t, *u;
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){64}, &t));
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){64}, &u));
  opener o = {dev, clpar_gate_new(), 0, 0};
  assert_non_null(o.gate);
  clpar_gate_open(o.gate, CLPAR_OK, NULL); /* for the capture run */
  clpar_graph *g = NULL, *plain = NULL;
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  tu_ok(clpar_fill(t, 3.0f));
  tu_ok(clpar_dev_gate_wait(dev, o.gate));
  tu_ok(clpar_copy(u, t));
  tu_ok(clpar_graph_capture_end(&g));
  assert_int_equal(load(&dev->replays), 0); /* the capture run is not a replay */
  uint64_t drains = o.drains = load(&dev->replay_drains);
  tu_ok(clpar_graph_replay(g));
  assert_int_equal(load(&dev->replays), 1); /* held at the gate */
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, open_when_draining, &o), 0);
  tu_ok(clpar_replays_wait(dev));
  __atomic_store_n(&o.returned, 1, __ATOMIC_RELEASE);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(load(&dev->replay_drains), drains + 1);
  while (load(&dev->replays) != 0) sched_yield(); /* its end call runs */
  tu_ok(clpar_replays_wait(dev));
  assert_int_equal(load(&dev->replay_drains), drains + 1); /* none in flight: no drain */
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  tu_ok(clpar_fill(t, 4.0f));
  tu_ok(clpar_graph_capture_end(&plain));
  tu_ok(clpar_graph_replay(plain));
  assert_int_equal(load(&dev->replays), 0);
  tu_ok(clpar_replays_wait(dev));
  assert_int_equal(load(&dev->replay_drains), drains + 1);
  float v[64];
  tu_ok(clpar_tensor_read(u, v, 64));
  assert_true(v[0] == 3.0f && v[63] == 3.0f);
  clpar_graph_destroy(plain);
  clpar_graph_destroy(g);
  clpar_gate_free(o.gate);
  clpar_tensor_free(u);
  clpar_tensor_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_call_and_gate_eager),
      cmocka_unit_test(test_host_call_and_gate_replayed),
      cmocka_unit_test(test_gate_opened_with_error),
      cmocka_unit_test(test_replays_in_flight),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
