/* test_ocl_profile_queue.c — an OpenCL device's commands go to a queue made without
 * CL_QUEUE_PROFILING_ENABLE (PoCL reads the clock per command on a profiling queue) except while
 * a device profile is recorded, when they go to one with it. Checked: the queue in use has no
 * profiling by default and after a profile stops, and has it while one runs; the profile still
 * counts every command; a switch keeps the queue's order (the new queue's next command waits
 * for the old queue's last, both ways), and a graph replays across switches.
 * Skips without an OpenCL device. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "ocl_test_util.h"
#include "test_util.h"

static int queue_profiles(clpar_device *dev) {
  tu_ok(clpar_device_synchronize(dev)); /* the worker switches queues in command order */
  clpar_ocl_device *d = dev->bd.ctx;
  cl_command_queue_properties p = 0;
  assert_int_equal(clGetCommandQueueInfo(d->queue, CL_QUEUE_PROPERTIES, sizeof p, &p, NULL),
                   CL_SUCCESS);
  return (p & CL_QUEUE_PROFILING_ENABLE) != 0;
}

static void test_plain_queue_unless_profiling(void **state) {
  (void)state;
  NEED_DEVICE(d);
  (void)d;
  assert_false(queue_profiles(d_dev));
  for (int round = 0; round < 2; round++) { /* the profiling queue is made once, then reused */
    int64_t n = 100;
    clpar_tensor *a = tu_make(d_dev, 1, &n, 3), *b = NULL;
    tu_ok(clpar_device_profile_start(d_dev));
    assert_true(queue_profiles(d_dev));
    tu_ok(clpar_fill(a, 2.0f));
    tu_ok(clpar_add(a, a, &b));
    clpar_profile p;
    tu_ok(clpar_device_profile_read(d_dev, &p));
    assert_int_equal(p.ops, 2);
    assert_true(p.device_seconds >= 0);
    tu_ok(clpar_device_profile_stop(d_dev));
    assert_false(queue_profiles(d_dev));
    float *h = tu_read(b);
    for (int i = 0; i < n; i++) assert_float_equal(h[i], 4.0f, 0);
    free(h);
    clpar_tensor_free(a);
    clpar_tensor_free(b);
  }
}

/* The queue in use held up by a user event; a profile started or stopped (the backend's entry
 * called directly, as the idle worker would); then a marker on the new queue must wait for the
 * old one: it completes only once the user event does. */
static void check_switch_waits(clpar_ocl_device *d, int start) {
  cl_int err;
  cl_event gate = clCreateUserEvent(d->context, &err), held, after;
  assert_int_equal(err, CL_SUCCESS);
  cl_command_queue old = d->queue;
  assert_int_equal(clEnqueueMarkerWithWaitList(old, 1, &gate, &held), CL_SUCCESS);
  tu_ok(clpar_ocl_profile(d, start));
  assert_true(d->queue != old);
  assert_int_equal(clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &after), CL_SUCCESS);
  assert_int_equal(clFlush(d->queue), CL_SUCCESS);
  cl_int status = CL_QUEUED;
  for (int i = 0; i < 100 && status != CL_COMPLETE; i++) { /* a switch without a wait shows */
    usleep(2000);
    assert_int_equal(
        clGetEventInfo(after, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL),
        CL_SUCCESS);
  }
  assert_int_not_equal(status, CL_COMPLETE);
  assert_int_equal(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  assert_int_equal(clWaitForEvents(1, &after), CL_SUCCESS);
  clReleaseEvent(after);
  clReleaseEvent(held);
  clReleaseEvent(gate);
}

static void test_switch_keeps_order(void **state) {
  (void)state;
  NEED_DEVICE(d);
  if (strncmp(d->dev_name, "basic", 5) == 0) { /* PoCL 3.1 deadlocks in clSetUserEventStatus */
    print_message("a PoCL basic device: skipping (its user events deadlock)\n");
    skip();
  }
  tu_ok(clpar_device_synchronize(d_dev)); /* the worker idle: this thread drives the queue */
  check_switch_waits(d, 1);
  check_switch_waits(d, 0);
}

/* A graph captured on the plain queue replays while a profile records (the profile counts its
 * commands) and after it stops, with the eager result. */
static void test_replay_across_profiles(void **state) {
  (void)state;
  NEED_DEVICE(d);
  (void)d;
  int64_t n = 64;
  clpar_tensor *a = tu_make(d_dev, 1, &n, 5), *b = tu_make(d_dev, 1, &n, 6);
  clpar_graph *g = NULL;
  tu_ok(clpar_graph_capture_begin(&d_dev, 1));
  tu_ok(clpar_fill(a, 1.5f));
  tu_ok(clpar_fill(b, 3.0f));
  tu_ok(clpar_graph_capture_end(&g));
  tu_ok(clpar_fill(b, 0.0f));
  tu_ok(clpar_device_profile_start(d_dev));
  tu_ok(clpar_graph_replay(g));
  clpar_profile p;
  tu_ok(clpar_device_profile_read(d_dev, &p));
  assert_true(p.ops >= 1); /* the two fills may be fused into one kernel */
  tu_ok(clpar_device_profile_stop(d_dev));
  tu_ok(clpar_graph_replay(g));
  float *h = tu_read(b);
  for (int i = 0; i < n; i++) assert_float_equal(h[i], 3.0f, 0);
  free(h);
  clpar_graph_destroy(g);
  clpar_tensor_free(a);
  clpar_tensor_free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain_queue_unless_profiling),
      cmocka_unit_test(test_switch_keeps_order),
      cmocka_unit_test(test_replay_across_profiles),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
