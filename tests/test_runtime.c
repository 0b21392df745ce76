/* test_runtime.c — the runtime under the ops: device workers, asynchronous errors, transfers
 * between devices that do not block the caller, the allocator across queues, gradient hooks
 * and the claim that keeps two backward passes off one graph. Every test runs on two devices
 * at least: the first two selected, or the first one and the host device, or (host is the one
 * selected) host and an unselected device. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

/* Two different devices: the first two selected, else the first and the host, else (host is
 * the one selected) host and an unselected device. */
static int two_devices(clpar_device **a, clpar_device **b) {
  *a = clpar_device_get(0);
  *b = tu_second_device(*a);
  return *b != NULL;
}

/* A command that fails on the worker comes back from the next call on that device, naming
 * the entry; the call after that is clean again. */
static void test_async_error_surfaces_at_next_call(void **state) {
  (void)state;
  clpar_device *host = tu_host();
  /* The host backend records no profile: the posted entry fails on the worker. */
  assert_int_equal(clpar_dev_profile(host, 1), CLPAR_OK); /* posted: nothing known yet */
  clpar_tensor *t;
  clpar_status s = clpar_tensor_zeros(host, 1, (int64_t[]){4}, &t);
  if (s == CLPAR_OK) { /* the worker had not run it yet: the next call finds it */
    float v[4];
    s = clpar_tensor_read(t, v, 4);
    clpar_tensor_free(t);
  }
  assert_int_equal(s, CLPAR_ERROR_UNSUPPORTED);
  assert_non_null(strstr(clpar_last_error(), "host: profile failed on the device's queue"));
  tu_ok(clpar_tensor_zeros(host, 1, (int64_t[]){4}, &t));
  float v[4] = {1, 1, 1, 1};
  tu_ok(clpar_tensor_read(t, v, 4));
  assert_true(v[0] == 0.0f && v[3] == 0.0f);
  clpar_tensor_free(t);
}

/* The worker takes commands from its queue in chunks: a failure among many commands is still
 * the one reported (the first), by the wait that follows it, and the commands after it ran. */
static void test_async_error_among_many(void **state) {
  (void)state;
  clpar_device *host = tu_host();
  clpar_tensor *t;
  tu_ok(clpar_tensor_zeros(host, 1, (int64_t[]){4}, &t));
  tu_ok(clpar_device_synchronize(host));
  for (int i = 0; i < 100; i++) tu_ok(clpar_fill(t, (float)i));
  assert_int_equal(clpar_dev_profile(host, 1), CLPAR_OK); /* fails on the worker */
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < 100; i++) s = clpar_fill(t, 100.0f + (float)i);
  if (s == CLPAR_OK) s = clpar_device_synchronize(host);
  assert_int_equal(s, CLPAR_ERROR_UNSUPPORTED);
  assert_non_null(strstr(clpar_last_error(), "host: profile failed on the device's queue"));
  tu_ok(clpar_fill(t, 7.0f));
  float v[4] = {0};
  tu_ok(clpar_tensor_read(t, v, 4));
  assert_true(v[0] == 7.0f && v[3] == 7.0f);
  clpar_tensor_free(t);
}

/* A copy between two devices is posted to both workers: the caller does not wait, and the
 * values arrive, also behind work already queued on the destination. */
static void test_copy_between_devices_does_not_block(void **state) {
  (void)state;
  clpar_device *a, *b;
  if (!two_devices(&a, &b)) skip();
  enum { N = 300000 }; /* above the staging chunk: two blocks take turns */
  int64_t shape[] = {N};
  clpar_tensor *src = tu_make(a, 1, shape, 7), *busy_a, *busy_b, *prod;
  int64_t sq[] = {256, 256};
  busy_a = tu_make(b, 2, sq, 8);
  busy_b = tu_make(b, 2, sq, 9);
  { /* the first transfer of a size allocates pinned staging memory (the worker's wait) */
    clpar_tensor *warm, *warm_back;
    tu_ok(clpar_tensor_to(src, b, &warm));
    tu_ok(clpar_tensor_to(warm, a, &warm_back));
    clpar_tensor_free(warm_back);
    clpar_tensor_free(warm);
  }
  tu_ok(clpar_device_synchronize(a));
  tu_ok(clpar_device_synchronize(b));
  uint64_t waits_a = clpar_device_host_waits(a), waits_b = clpar_device_host_waits(b);
  clpar_device_counters before;
  tu_ok(clpar_device_counters_get(b, &before));
  tu_ok(clpar_matmul(busy_a, busy_b, 0, 0, &prod)); /* the destination's queue is busy */
  clpar_tensor *dst, *back;
  tu_ok(clpar_tensor_to(src, b, &dst));
  tu_ok(clpar_tensor_to(dst, a, &back));
  assert_int_equal(clpar_device_host_waits(a), waits_a);
  assert_int_equal(clpar_device_host_waits(b), waits_b);
  clpar_device_counters after;
  tu_ok(clpar_device_counters_get(b, &after));
  assert_int_equal(after.transfers_in - before.transfers_in, 1);
  assert_int_equal(after.transfers_out - before.transfers_out, 1);
  float *want = tu_rand(N, 7), *got = tu_read(back), *mid = tu_read(dst);
  tu_assert_close(got, want, N, 0, 0, "a round trip between two devices");
  tu_assert_close(mid, want, N, 0, 0, "a copy to another device");
  free(want);
  free(got);
  free(mid);
  clpar_tensor *list[] = {src, busy_a, busy_b, prod, dst, back};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) clpar_tensor_free(list[i]);
}

/* A copy posted in two halves (the pipeline's copies between stages): finish, posted after
 * other work on the destination, gives the source's values, with one node whose backward
 * brings the gradient back; an unfinished half is cancelled without a leak. Where the copy
 * goes through staging, begin posts the source's read at once: a later write to the source on
 * its own queue does not reach the copy (which shows the read was posted early). Sizes: plain
 * staging (under 16 KiB), one pinned block, and one above the staging chunk. Both directions,
 * and to the host device (posted whole at finish). */
static void test_copy_in_two_halves(void **state) {
  (void)state;
  clpar_device *a, *b;
  if (!two_devices(&a, &b)) skip();
  const int64_t sizes[] = {1000, 70000, 1200007};
  clpar_device *pairs[][2] = {{a, b}, {b, a}, {a, tu_host()}};
  for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
    clpar_device *from = pairs[p][0], *to = pairs[p][1];
    if (from == to) continue;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      int64_t n = sizes[k];
      clpar_tensor *src = tu_make(from, 1, &n, 40 + k), *dst = NULL, *unfinished_src;
      tu_ok(clpar_tensor_set_requires_grad(src, 1));
      clpar_tensor_transit *moving = NULL, *dropped = NULL;
      tu_ok(clpar_tensor_to_begin(src, to, &moving));
      unfinished_src = tu_make(from, 1, &n, 60 + k);
      tu_ok(clpar_tensor_to_begin(unfinished_src, to, &dropped));
      /* through staging, the source changes on its queue after begin: the copy has read it
       * already (a peer copy or a copy to the host device is posted whole at finish) */
      const char *ctx = getenv("CLPAR_OPENCL_CONTEXT");
      int staged = from != tu_host() && to != tu_host() && !(ctx && !strcmp(ctx, "platform"));
      if (staged) {
        clpar_scope *sc = clpar_scope_begin();
        clpar_tensor *twice;
        int was = clpar_set_grad_enabled(0);
        tu_ok(clpar_scale(src, 2.0f, &twice));
        tu_ok(clpar_copy(src, twice));
        clpar_set_grad_enabled(was);
        clpar_scope_end(sc);
      }
      clpar_tensor *busy = tu_make(to, 1, &n, 80 + k); /* the destination's queue has work */
      tu_ok(clpar_tensor_to_finish(moving, &dst));
      clpar_tensor_to_cancel(dropped);
      assert_ptr_equal(clpar_tensor_device(dst), to);
      float *want = tu_rand((size_t)n, 40 + k), *got = tu_read(dst);
      tu_assert_close(got, want, (size_t)n, 0, 0, "a copy in two halves");
      /* the gradient of sum(dst) comes back to src's device: all ones */
      clpar_tensor *loss;
      tu_ok(clpar_sum(dst, &loss));
      tu_ok(clpar_backward(loss));
      clpar_tensor *g = clpar_tensor_grad(src);
      assert_non_null(g);
      assert_ptr_equal(clpar_tensor_device(g), from);
      float *gv = tu_read(g);
      for (int64_t i = 0; i < n; i++) assert_true(gv[i] == 1.0f);
      free(want);
      free(got);
      free(gv);
      clpar_tensor *list[] = {src, dst, unfinished_src, busy, loss};
      for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) clpar_tensor_free(list[i]);
    }
  }
}

/* Many small ops and transfers across two queues, with every intermediate freed at once:
 * a buffer handed out again while queued work still used it would change the results. */
static void test_allocator_across_queues(void **state) {
  (void)state;
  clpar_device *a, *b, *host = tu_host();
  if (!two_devices(&a, &b)) skip();
  enum { N = 257, STEPS = 200 };
  int64_t shape[] = {N};
  clpar_tensor *x = tu_make(a, 1, shape, 11), *ref = tu_make(host, 1, shape, 11);
  for (int i = 0; i < STEPS; i++) {
    clpar_device *to = i % 2 ? a : b;
    float alpha = i % 3 ? 1.5f : -0.5f;
    clpar_tensor *y, *z, *hy;
    tu_ok(clpar_scale(x, alpha, &y));
    tu_ok(clpar_tensor_to(y, to, &z)); /* y freed right after: its buffer goes back */
    clpar_tensor_free(y);
    clpar_tensor_free(x);
    tu_ok(clpar_add(z, z, &x)); /* x = 2 * alpha * x */
    clpar_tensor_free(z);
    tu_ok(clpar_scale(ref, 2.0f * alpha, &hy));
    clpar_tensor_free(ref);
    ref = hy;
    if (i % 40 == 39) { /* keep the values in range */
      float *v = tu_read(ref);
      float m = 0;
      for (int k = 0; k < N; k++) m = fabsf(v[k]) > m ? fabsf(v[k]) : m;
      free(v);
      clpar_tensor *xs, *rs;
      tu_ok(clpar_scale(x, 1.0f / m, &xs));
      tu_ok(clpar_scale(ref, 1.0f / m, &rs));
      clpar_tensor_free(x);
      clpar_tensor_free(ref);
      x = xs;
      ref = rs;
    }
  }
  tu_expect_equal(x, ref, 1e-4f, 1e-6f, "200 steps across two queues");
  clpar_tensor_free(x);
  clpar_tensor_free(ref);
}

typedef struct {
  int calls;
  clpar_tensor *seen;
  int grad_ready;
} hook_log;

static void on_grad(clpar_tensor *t, void *user) {
  hook_log *log = user;
  log->calls++;
  log->seen = t;
  log->grad_ready = clpar_tensor_grad(t) != NULL;
}

/* A leaf used by three ops gets its hook once per backward, after its last share. */
static void test_grad_hook_runs_once_when_final(void **state) {
  (void)state;
  clpar_device *a, *b;
  two_devices(&a, &b);
  clpar_tensor *w = tu_make(a, 2, (int64_t[]){3, 4}, 21), *x = tu_make(a, 2, (int64_t[]){4, 2}, 22);
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  hook_log log = {0, NULL, 0};
  tu_ok(clpar_tensor_add_grad_hook(w, on_grad, &log));
  assert_int_equal(clpar_tensor_add_grad_hook(x, on_grad, &log), CLPAR_ERROR_INVALID_ARGUMENT);
  for (int pass = 1; pass <= 2; pass++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *y, *wb, *y2, *sum, *s, *ww;
    tu_ok(clpar_matmul(w, x, 0, 0, &y)); /* w used here, */
    tu_ok(clpar_tensor_to(w, b, &wb));   /* here, on the other device, */
    tu_ok(clpar_mul(w, w, &ww));         /* and twice here */
    tu_ok(clpar_sum(y, &y2));
    tu_ok(clpar_sum(wb, &s));
    tu_ok(clpar_tensor_to(s, a, &sum));
    tu_ok(clpar_add(y2, sum, &s));
    tu_ok(clpar_sum(ww, &y));
    tu_ok(clpar_add(s, y, &sum));
    tu_ok(clpar_backward(sum));
    assert_int_equal(log.calls, pass);
    assert_ptr_equal(log.seen, w);
    assert_true(log.grad_ready);
    clpar_scope_end(sc);
  }
  tu_ok(clpar_tensor_remove_grad_hook(w, on_grad, &log));
  assert_int_equal(clpar_tensor_remove_grad_hook(w, on_grad, &log), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_tensor_free(w);
  clpar_tensor_free(x);
}

/* A second backward through a graph that one is running through is refused, not raced. */
static void test_backward_claims_its_graph(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *w = tu_make(dev, 1, (int64_t[]){8}, 31), *y, *l;
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  tu_ok(clpar_scale(w, 2.0f, &y));
  tu_ok(clpar_sum(y, &l));
  /* What another thread's backward leaves behind while it runs: the node claimed. */
  __atomic_store_n(&y->node->claimed, -7, __ATOMIC_RELEASE);
  assert_int_equal(clpar_backward(l), CLPAR_ERROR_BUSY);
  assert_non_null(strstr(clpar_last_error(), "another thread is running backward"));
  assert_int_equal(l->node->claimed, 0); /* what it claimed is given back */
  __atomic_store_n(&y->node->claimed, 0, __ATOMIC_RELEASE);
  tu_ok(clpar_backward(l));
  float g[8];
  tu_ok(clpar_tensor_read(clpar_tensor_grad(w), g, 8));
  assert_true(g[0] == 2.0f && g[7] == 2.0f);
  clpar_tensor_free(l);
  clpar_tensor_free(y);
  clpar_tensor_free(w);
}

/* Releasing a chain of 200,000 ops does not recurse through it. */
static void test_deep_graph_release(void **state) {
  (void)state;
  clpar_device *host = tu_host();
  clpar_tensor *x = tu_make(host, 1, (int64_t[]){1}, 41), *y;
  tu_ok(clpar_tensor_set_requires_grad(x, 1));
  clpar_tensor *cur = clpar_tensor_retain(x);
  for (int i = 0; i < 200000; i++) {
    tu_ok(clpar_scale(cur, 1.0f, &y));
    clpar_tensor_free(cur);
    cur = y;
  }
  clpar_tensor_free(cur); /* the whole chain goes here */
  clpar_tensor_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_error_surfaces_at_next_call),
      cmocka_unit_test(test_async_error_among_many),
      cmocka_unit_test(test_copy_between_devices_does_not_block),
      cmocka_unit_test(test_copy_in_two_halves),
      cmocka_unit_test(test_allocator_across_queues),
      cmocka_unit_test(test_grad_hook_runs_once_when_final),
      cmocka_unit_test(test_backward_claims_its_graph),
      cmocka_unit_test(test_deep_graph_release),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
