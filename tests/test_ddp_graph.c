/* test_ddp_graph.c — a DistributedDataParallel step captured and replayed (clpar/graph.h) over
 * MPI, run by ctest through mpirun on 2 ranks, one PoCL device each (tests/CMakeLists.txt):
 * the replayed step equals the eager DDP step bit for bit over 50 steps (the learning rate
 * changed midway) with SGD (momentum) and Adam, and with gradient accumulation
 * (clpar_ddp_set_sync), its hand-offs make no host wait on the calling
 * thread and each replay all-reduces every bucket on the communication thread; what a replay
 * cannot hold is refused at capture naming it. With the argument "timeout" (run by
 * tests/ddp_graph_timeout.sh, CLPAR_DIST_TIMEOUT=3): rank 1 stops replaying, and rank 0's
 * replay must end in CLPAR_ERROR_TIMEOUT naming rank 1, never hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test_graph_util.h"

enum { STEPS = 50, LR_CHANGE = 25, ROWS = 6, IN = 8, HID = 16, OUT = 4 };

typedef enum { OPT_SGD, OPT_ADAM } opt_kind;

static clpar_module *make_ddp(const clpar_ddp_options *o) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *c[5], *m, *ddp;
  clpar_manual_seed(7);
  tu_ok(clpar_linear_create(IN, HID, 1, dev, &c[0]));
  tu_ok(clpar_relu_create(&c[1]));
  tu_ok(clpar_linear_create(HID, HID, 1, dev, &c[2]));
  tu_ok(clpar_relu_create(&c[3]));
  tu_ok(clpar_linear_create(HID, OUT, 1, dev, &c[4]));
  tu_ok(clpar_sequential_create(c, 5, &m));
  tu_ok(clpar_ddp_create(m, o, &ddp));
  return ddp;
}

/* A DDP MLP in several buckets (0.0002 MiB: about 50 floats each; 4 here), its optimizer and static
 * inputs on this rank's device. */
static void make_train(tgu_train *t, opt_kind ok) {
  memset(t, 0, sizeof *t);
  t->m = make_ddp(&(clpar_ddp_options){.bucket_cap_mb = 0.0002});
  if (ok == OPT_SGD)
    tu_ok(clpar_sgd_create_for(t->m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &t->opt));
  else
    tu_ok(clpar_adam_create_for(t->m, &(clpar_adam_options){.lr = 0.01f}, &t->opt));
  clpar_device *dev = clpar_dist_device();
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){ROWS, IN}, &t->x));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){ROWS, OUT}, &t->y));
}

static clpar_status step(void *ctx) {
  tgu_train *t = ctx;
  clpar_scope *scope = tgu_step_begin(t);
  clpar_status s = tgu_forward_backward(t, tgu_mse);
  if (s == CLPAR_OK) s = clpar_optimizer_step(t->opt);
  tgu_step_end(t, scope);
  return s;
}

/* Gradient accumulation: two forward-backwards on the batch, the first without the
 * all-reduce (clpar_ddp_set_sync(0)), the second with it, then the step. */
static clpar_status accumulating_step(void *ctx) {
  tgu_train *t = ctx;
  clpar_scope *scope = tgu_step_begin(t);
  clpar_tensor *out = NULL, *first = NULL;
  clpar_status s = clpar_optimizer_zero_grad(t->opt);
  for (int k = 0; s == CLPAR_OK && k < 2; k++) {
    clpar_tensor **loss = k ? &t->loss : &first;
    s = clpar_ddp_set_sync(t->m, k == 1);
    if (s == CLPAR_OK) s = clpar_module_forward(t->m, t->x, &out);
    if (s == CLPAR_OK) s = clpar_mse_loss(out, t->y, CLPAR_REDUCTION_MEAN, loss);
    if (s == CLPAR_OK) s = clpar_backward(*loss);
  }
  if (s == CLPAR_OK) s = clpar_optimizer_step(t->opt);
  tgu_step_end(t, scope);
  return s;
}

/* Step i's inputs on this rank (each rank its own). */
static void write_inputs(tgu_train *t, int i) {
  uint64_t seed = 1000 * (uint64_t)(clpar_dist_rank() + 1) + (uint64_t)i;
  float *x = tu_rand(ROWS * IN, seed), *y = tu_rand(ROWS * OUT, seed + 500);
  tu_ok(clpar_tensor_write(t->x, x, ROWS * IN));
  tu_ok(clpar_tensor_write(t->y, y, ROWS * OUT));
  free(x);
  free(y);
}

/* STEPS steps, eagerly or compiled (eager warm-up, capture, replays); the losses into losses.
 * Compiled: the replays' host waits on the calling thread (the loss reads apart) and the
 * reductions they made. */
static void train(tgu_train *t, clpar_step_fn fn, int compiled, float *losses,
                  uint64_t *replay_waits, uint64_t *replay_reductions) {
  clpar_device *dev = clpar_dist_device();
  clpar_step *st = NULL;
  if (compiled) tu_ok(clpar_step_compile(fn, t, &dev, 1, &st));
  clpar_ddp_stats before = {0}, after = {0};
  uint64_t waits = 0;
  for (int i = 0; i < STEPS; i++) {
    if (i == LR_CHANGE)
      tu_ok(clpar_optimizer_set_lr(t->opt, 0, 0.3f * clpar_optimizer_lr(t->opt, 0)));
    write_inputs(t, i);
    if (!compiled) {
      tu_ok(fn(t));
    } else {
      if (i == 2) tu_ok(clpar_ddp_stats_get(t->m, &before));
      uint64_t w0 = clpar_device_host_waits(dev);
      tu_ok(clpar_step_run(st));
      if (i >= 2) waits += clpar_device_host_waits(dev) - w0;
    }
    tu_ok(clpar_tensor_read(t->loss, &losses[i], 1));
  }
  if (compiled) {
    tu_ok(clpar_ddp_synchronize(t->m));
    tu_ok(clpar_ddp_stats_get(t->m, &after));
    assert_non_null(clpar_step_graph(st));
    assert_true(after.buckets >= 3);
    *replay_waits = waits;
    *replay_reductions = after.reductions - before.reductions;
    assert_true(after.wait_seconds == before.wait_seconds); /* backward never waited */
    clpar_step_free(st);
  }
}

static void check_replay_equals_eager(opt_kind ok, clpar_step_fn fn) {
  tgu_train eager, replayed;
  float le[STEPS], lr[STEPS];
  uint64_t waits = 1, reductions = 0;
  make_train(&eager, ok);
  train(&eager, fn, 0, le, NULL, NULL);
  make_train(&replayed, ok);
  train(&replayed, fn, 1, lr, &waits, &reductions);
  tgu_expect_bits("loss at step", le, lr, STEPS);
  size_t ne, nr;
  float *pe = tgu_floats_of(eager.m, 0, &ne), *pr = tgu_floats_of(replayed.m, 0, &nr);
  assert_int_equal(ne, nr);
  tgu_expect_bits("parameter element", pe, pr, ne);
  assert_true(le[STEPS - 1] != le[0]);     /* it trained */
  assert_int_equal(waits, 0);              /* no host wait in the replays */
  assert_int_equal(reductions, STEPS - 2); /* each replay all-reduced its buckets */
  /* the ranks agree: every rank's parameters are the same (the averages were written) */
  float sum = 0;
  for (size_t i = 0; i < nr; i++) sum += pr[i];
  float mean = sum;
  tu_ok(clpar_dist_all_reduce_mean(&mean, 1));
  assert_true(mean == sum);
  free(pe);
  free(pr);
  tgu_train_free(&eager);
  tgu_train_free(&replayed);
}

static void test_sgd_momentum_replay_equals_eager(void **state) {
  (void)state;
  check_replay_equals_eager(OPT_SGD, step);
}

static void test_adam_replay_equals_eager(void **state) {
  (void)state;
  check_replay_equals_eager(OPT_ADAM, step);
}

/* clpar_ddp_set_sync keeps the bucket schedule: the micro-step without sync is captured
 * without hand-offs, as it runs eagerly. */
static void test_no_sync_accumulation_replay_equals_eager(void **state) {
  (void)state;
  check_replay_equals_eager(OPT_SGD, accumulating_step);
}

/* An eager step of a module right after its replays were posted (nothing waited for): its
 * forward first lets the replays run, so its buckets do not meet the communication thread
 * behind theirs; the result equals five eager steps. */
static void test_eager_step_after_replays(void **state) {
  (void)state;
  tgu_train eager, mixed;
  clpar_device *dev = clpar_dist_device();
  make_train(&eager, OPT_SGD);
  make_train(&mixed, OPT_SGD);
  write_inputs(&eager, 0);
  write_inputs(&mixed, 0);
  for (int i = 0; i < 5; i++) tu_ok(step(&eager));
  clpar_step *st;
  tu_ok(clpar_step_compile(step, &mixed, &dev, 1, &st));
  for (int i = 0; i < 4; i++) tu_ok(clpar_step_run(st)); /* warm-up, capture, 2 replays */
  tu_ok(step(&mixed));
  size_t ne, nm;
  float *pe = tgu_floats_of(eager.m, 0, &ne), *pm = tgu_floats_of(mixed.m, 0, &nm);
  assert_int_equal(ne, nm);
  tgu_expect_bits("parameter element", pe, pm, ne);
  free(pe);
  free(pm);
  clpar_step_free(st);
  tgu_train_free(&eager);
  tgu_train_free(&mixed);
}

/* A forward of ddp (freed here) under capture: refused naming want. */
static void check_refused_module(clpar_module *ddp, const char *want) {
  clpar_device *dev = clpar_dist_device();
  clpar_tensor *x, *out = NULL;
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){ROWS, IN}, &x));
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  clpar_status s = clpar_module_forward(ddp, x, &out);
  clpar_graph *g = NULL;
  clpar_status e = clpar_graph_capture_end(&g);
  assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(e, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(g);
  const char *msg = clpar_last_error();
  if (!strstr(msg, "DistributedDataParallel's forward") || !strstr(msg, want))
    fail_msg("expected \"%s\" in \"%s\"", want, msg);
  clpar_tensor_free(out);
  clpar_tensor_free(x);
  clpar_module_free(ddp);
}

/* A forward of a DDP module made with o, under capture: refused naming want. */
static void check_refused(const clpar_ddp_options *o, const char *want) {
  check_refused_module(make_ddp(o), want);
}

static void test_refused_at_capture(void **state) {
  (void)state;
  clpar_module *ddp;
  check_refused(&(clpar_ddp_options){.find_unused_parameters = 1}, "find_unused_parameters");
  check_refused(&(clpar_ddp_options){.uneven_inputs = 1}, "uneven_inputs");
  /* ZeRO stage 3 is captured (test_zero3_graph.c) but keeps the module's refusals */
  check_refused(&(clpar_ddp_options){.zero_stage = 3, .uneven_inputs = 1}, "uneven_inputs");
  /* clpar_ddp_join inside a capture */
  ddp = make_ddp(&(clpar_ddp_options){.uneven_inputs = 1});
  clpar_device *dev = clpar_dist_device();
  clpar_graph *g = NULL;
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  assert_int_equal(clpar_ddp_join(ddp), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_graph_capture_end(&g), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(g);
  if (!strstr(clpar_last_error(), "clpar_ddp_join on"))
    fail_msg("expected clpar_ddp_join's refusal, got \"%s\"", clpar_last_error());
  clpar_module_free(ddp);
}

/* ---- the timeout scenario ---- */

static void timeout_die(const char *what) {
  fprintf(stderr, "FAIL rank %d: %s: %s\n", clpar_dist_rank(), what, clpar_last_error());
  _exit(2);
}

static int timeout_scenario(void) {
  if (clpar_dist_init() != CLPAR_OK) timeout_die("clpar_dist_init");
  tgu_train t;
  make_train(&t, OPT_SGD);
  clpar_device *dev = clpar_dist_device();
  clpar_step *st;
  if (clpar_step_compile(step, &t, &dev, 1, &st) != CLPAR_OK) timeout_die("compile");
  float loss;
  for (int i = 0; i < 4; i++) /* warm-up, capture, two replays on every rank */
    if (clpar_step_run(st) != CLPAR_OK || clpar_tensor_read(t.loss, &loss, 1) != CLPAR_OK)
      timeout_die("a step every rank runs");
  fprintf(stderr, "rank %d: 4 steps done\n", clpar_dist_rank());
  if (clpar_dist_rank() == 1) { /* stops replaying: in no collective until the job ends */
    for (int i = 0; i < 600; i++) nanosleep(&(struct timespec){0, 100000000}, NULL);
    fprintf(stderr, "FAIL rank 1: nobody ended the job\n");
    _exit(5);
  }
  clpar_status s = clpar_step_run(st);
  if (s == CLPAR_OK) s = clpar_tensor_read(t.loss, &loss, 1);
  printf("RESULT rank %d: %s: %s\n", clpar_dist_rank(), clpar_status_name(s),
         s ? clpar_last_error() : "");
  fflush(stdout);
  clpar_dist_abort(3);
  return 4; /* only if MPI could not abort */
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "timeout")) return timeout_scenario();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_momentum_replay_equals_eager),
      cmocka_unit_test(test_adam_replay_equals_eager),
      cmocka_unit_test(test_no_sync_accumulation_replay_equals_eager),
      cmocka_unit_test(test_eager_step_after_replays),
      cmocka_unit_test(test_refused_at_capture),
  };
  return cmocka_run_group_tests_name("ddp_graph", tests, tu_dist_setup, tu_dist_teardown);
}
