/* test_ddp_graph.c — a DistributedDataParallel step captured and replayed (clpar/graph.h) over
 * MPI, run by ctest through mpirun on 2 ranks, one PoCL device each (tests/CMakeLists.txt):
 * the replayed step equals the eager DDP step bit for bit over 50 steps (the learning rate
 * changed midway) with SGD (momentum) and Adam, and with gradient accumulation
 * (clpar_ddp_set_sync), its hand-offs make no host wait on the calling
 * thread and each replay all-reduces every bucket on the communication thread; what a replay
 * cannot hold is refused at capture naming it. With the argument "timeout" (run by
 * tests/graph_timeout.sh, CLPAR_DIST_TIMEOUT=3): rank 1 stops replaying, and rank 0's
 * replay must end in CLPAR_ERROR_TIMEOUT naming rank 1, never hang. */
#include <stdlib.h>
#include <string.h>

#include "test_ddp_graph_util.h"

enum { STEPS = 50, LR_CHANGE = 25, ROWS = 6, IN = 8, HID = 16, OUT = 4 };

static const tdg_ddp_run RUN = {.steps = STEPS, .lr_change = LR_CHANGE};

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
static void make_train(tgu_train *t, tdg_opt ok) {
  memset(t, 0, sizeof *t);
  t->m = make_ddp(&(clpar_ddp_options){.bucket_cap_mb = 0.0002});
  if (ok == TDG_SGD)
    tu_ok(clpar_sgd_create_for(t->m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &t->opt));
  else
    tu_ok(clpar_adam_create_for(t->m, &(clpar_adam_options){.lr = 0.01f}, &t->opt));
  clpar_device *dev = clpar_dist_device();
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){ROWS, IN}, &t->x));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){ROWS, OUT}, &t->y));
}

/* A case's optimizer and step. */
typedef struct {
  tdg_opt opt;
  clpar_step_fn fn;
} ddp_case;

/* STEPS steps of the case's step eagerly and compiled (eager warm-up, capture, replays, the
 * learning rate changed midway): the same losses and parameters, no host wait on the calling
 * thread in the replays, each replay all-reduced its buckets, the backward never waited.
 * With accumulation (clpar_ddp_set_sync) the micro-step without sync is captured without
 * hand-offs, as it runs eagerly. */
static void test_replay_equals_eager(void **state) {
  const ddp_case *c = *state;
  tgu_train eager, replayed;
  tdg_replays r = {.waits = 1};
  make_train(&eager, c->opt);
  make_train(&replayed, c->opt);
  tdg_ddp_expect_equal_runs(&eager, &replayed, c->fn, &RUN, 0, "parameter element", &r);
  assert_false(r.backward_waited);
  assert_int_equal(r.waits, 0);              /* no host wait in the replays */
  assert_int_equal(r.reductions, STEPS - 2); /* each replay all-reduced its buckets */
  /* the ranks agree: every rank's parameters are the same (the averages were written) */
  size_t nr;
  float *pr = tgu_floats_of(replayed.m, 0, &nr);
  float sum = 0;
  for (size_t i = 0; i < nr; i++) sum += pr[i];
  float mean = sum;
  tu_ok(clpar_dist_all_reduce_mean(&mean, 1));
  assert_true(mean == sum);
  free(pr);
  tgu_train_free(&eager);
  tgu_train_free(&replayed);
}

/* An eager step of a module right after its replays were posted (nothing waited for): its
 * forward first lets the replays run, so its buckets do not meet the communication thread
 * behind theirs; one more eager step, with no replay in flight, waits for none; the result
 * equals six eager steps. */
static void test_eager_step_after_replays(void **state) {
  (void)state;
  tgu_train eager, mixed;
  clpar_device *dev = clpar_dist_device();
  make_train(&eager, TDG_SGD);
  make_train(&mixed, TDG_SGD);
  tdg_write_inputs(eager.x, eager.y, 0, 0);
  tdg_write_inputs(mixed.x, mixed.y, 0, 0);
  for (int i = 0; i < 6; i++) tu_ok(tdg_step(&eager));
  clpar_step *st;
  tu_ok(clpar_step_compile(tdg_step, &mixed, &dev, 1, &st));
  for (int i = 0; i < 4; i++) tu_ok(clpar_step_run(st)); /* warm-up, capture, 2 replays */
  tu_ok(tdg_step(&mixed));
  tdg_expect_eager_without_drain(tdg_step, &mixed);
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

/* A forward of a DDP module made with o, under capture: refused naming want. */
static void check_refused(const clpar_ddp_options *o, const char *want) {
  tdg_expect_forward_refused(make_ddp(o), ROWS, IN, want);
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
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  tdg_expect_refused(clpar_ddp_join(ddp), "clpar_ddp_join on", NULL);
  clpar_module_free(ddp);
}

/* ---- the timeout scenario ---- */

static int timeout_scenario(void) {
  tdg_timeout_init();
  tgu_train t;
  make_train(&t, TDG_SGD);
  return tdg_timeout_run(tdg_step, &t, &t.loss, 1); /* rank 1 stops */
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "timeout")) return timeout_scenario();
  const struct CMUnitTest tests[] = {
      TGU_CASE(test_sgd_momentum_replay_equals_eager, test_replay_equals_eager, ddp_case, TDG_SGD,
               tdg_step),
      TGU_CASE(test_adam_replay_equals_eager, test_replay_equals_eager, ddp_case, TDG_ADAM,
               tdg_step),
      TGU_CASE(test_no_sync_accumulation_replay_equals_eager, test_replay_equals_eager, ddp_case,
               TDG_SGD, tdg_accumulating_step),
      cmocka_unit_test(test_eager_step_after_replays),
      cmocka_unit_test(test_refused_at_capture),
  };
  return cmocka_run_group_tests_name("ddp_graph", tests, tu_dist_setup, tu_dist_teardown);
}
