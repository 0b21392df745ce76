/* test_zero_graph.c — a ZeRO stage 1 or 2 training step (clpar/zero.h) captured and replayed
 * (clpar/graph.h) over MPI, run by ctest through mpirun on 2 and 3 ranks, one PoCL device each
 * (tests/CMakeLists.txt): the step compiled (an eager warm-up, the capture, 20 replays, the
 * inner optimizer's learning rate changed midway) gives the parameters and losses of the same
 * steps run eagerly on a second copy of the model, bit for bit, with SGD (momentum) and Adam;
 * the ranks end with the same parameters. The model's 229 parameters divide by neither 2 nor
 * 3 (the last shard is padded). An eager step right after replays equals the eager run, and
 * freeing the optimizer makes the graph stale. Refused at capture, naming what: a zero_grad
 * between the captured backward and the step (the host's averaged shard); stage 3 is
 * test_zero3_graph.c's. With
 * the argument "timeout" (run by tests/graph_timeout.sh, CLPAR_DIST_TIMEOUT=3): rank 1 stops
 * replaying, and every other rank's replay must end in CLPAR_ERROR_TIMEOUT naming rank 1. */
#include <stdlib.h>
#include <string.h>

#include "test_ddp_graph_util.h"

/* Linear(8, 16) ReLU Linear(16, 5): 144 + 85 = 229 parameters */
enum { STEPS = 22, LR_CHANGE = 12, ROWS = 6, IN = 8, HID = 16, OUT = 5, NUMEL = 229 };

static clpar_module *make_ddp(int stage) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *c[3], *m, *ddp;
  clpar_manual_seed(11);
  tu_ok(clpar_linear_create(IN, HID, 1, dev, &c[0]));
  tu_ok(clpar_relu_create(&c[1]));
  tu_ok(clpar_linear_create(HID, OUT, 1, dev, &c[2]));
  tu_ok(clpar_sequential_create(c, 3, &m));
  /* small buckets (about 50 floats): several hand-offs per backward */
  tu_ok(clpar_ddp_create(m, &(clpar_ddp_options){.zero_stage = stage, .bucket_cap_mb = 0.0002},
                         &ddp));
  return ddp;
}

static const tdg_zero_model MODEL = {.make_ddp = make_ddp,
                                     .rows = ROWS,
                                     .in = IN,
                                     .out = OUT,
                                     .steps = STEPS,
                                     .lr_change = LR_CHANGE,
                                     .numel = NUMEL};

/* An eager step right after replays were posted (nothing waited for) equals an eager step
 * there, and freeing the ZeRO optimizer makes the graph stale (its records go with it). */
static void test_eager_after_replays_then_stale(void **state) {
  (void)state;
  float le, lm;
  for (int stage = 1; stage <= 2; stage++)
    tdg_zero_eager_after_replays_then_stale(&MODEL, stage, "ZeRO optimizer", &le, &lm);
}

/* The capture of t's step (after an eager warm-up step; late: the captured step calls zero_grad
 * after backward) fails with CLPAR_ERROR_INVALID_ARGUMENT and a message holding want and
 * want2. */
static void expect_capture_refused(tdg_zero_train *t, int late, const char *want,
                                   const char *want2) {
  clpar_device *dev = clpar_dist_device();
  tdg_write_inputs(t->x, t->y, 0, 0);
  tu_ok(tdg_zero_step(t));
  t->zero_grad_late = late;
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  tdg_expect_refused(tdg_zero_step(t), want, want2);
}

/* zero_grad after the captured backward would forget the averaged shard on the host: the
 * replay could not, so the capture refuses it (both stages). */
static void test_zero_grad_after_backward_refused(void **state) {
  (void)state;
  for (int stage = 1; stage <= 2; stage++) {
    tdg_zero_train t;
    tdg_zero_make(&t, &MODEL, stage, TDG_SGD);
    expect_capture_refused(&t, 1, "clpar_zero_optimizer_zero_grad", "averaged shard");
    tdg_zero_free(&t);
  }
}

/* ---- the timeout scenario ---- */

static int timeout_scenario(int stage) {
  tdg_timeout_init();
  tdg_zero_train t;
  tdg_zero_make(&t, &MODEL, stage, TDG_SGD);
  return tdg_timeout_run(tdg_zero_step, &t, &t.loss, 1); /* rank 1 stops */
}

/* a case of tdg_zero_test_replay_equals_eager on MODEL */
#define ZERO_CASE(name, ...) \
  TGU_CASE(name, tdg_zero_test_replay_equals_eager, tdg_zero_case, &MODEL, __VA_ARGS__)

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "timeout")) return timeout_scenario(atoi(argv[2]));
  const struct CMUnitTest tests[] = {
      ZERO_CASE(test_stage1_sgd_momentum, 1, TDG_SGD),
      ZERO_CASE(test_stage1_adam, 1, TDG_ADAM),
      ZERO_CASE(test_stage2_sgd_momentum, 2, TDG_SGD),
      ZERO_CASE(test_stage2_adam, 2, TDG_ADAM),
      cmocka_unit_test(test_eager_after_replays_then_stale),
      cmocka_unit_test(test_zero_grad_after_backward_refused),
  };
  return cmocka_run_group_tests_name("zero_graph", tests, tu_dist_setup, tu_dist_teardown);
}
