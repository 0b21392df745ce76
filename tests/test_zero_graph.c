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
 * the argument "timeout" (run by tests/zero_graph_timeout.sh, CLPAR_DIST_TIMEOUT=3): rank 1 stops
 * replaying, and every other rank's replay must end in CLPAR_ERROR_TIMEOUT naming rank 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clpar/zero.h"
#include "internal.h" /* clpar_tensor_unscope */
#include "test_graph_util.h"

/* Linear(8, 16) ReLU Linear(16, 5): 144 + 85 = 229 parameters */
enum { STEPS = 22, LR_CHANGE = 12, ROWS = 6, IN = 8, HID = 16, OUT = 5, NUMEL = 229 };

typedef enum { OPT_SGD, OPT_ADAM } opt_kind;

typedef struct {
  clpar_module *m;
  clpar_zero_optimizer *opt;
  clpar_tensor *x, *y, *loss;
  int zero_grad_late; /* the step calls zero_grad between backward and the optimizer's step */
} zg_train;

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

static void make_train(zg_train *t, int stage, opt_kind ok) {
  memset(t, 0, sizeof *t);
  t->m = make_ddp(stage);
  if (ok == OPT_SGD)
    tu_ok(
        clpar_zero_sgd_create(t->m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &t->opt));
  else
    tu_ok(clpar_zero_adam_create(t->m, &(clpar_adam_options){.lr = 0.01f}, &t->opt));
  clpar_device *dev = clpar_dist_device();
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){ROWS, IN}, &t->x));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){ROWS, OUT}, &t->y));
}

static void train_free(zg_train *t) {
  clpar_tensor_free(t->loss);
  clpar_tensor_free(t->x);
  clpar_tensor_free(t->y);
  clpar_zero_optimizer_free(t->opt);
  clpar_module_free(t->m);
}

static clpar_status step(void *ctx) {
  zg_train *t = ctx;
  clpar_tensor_free(t->loss);
  t->loss = NULL;
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *out = NULL;
  clpar_status s = t->zero_grad_late ? CLPAR_OK : clpar_zero_optimizer_zero_grad(t->opt);
  if (s == CLPAR_OK) s = clpar_module_forward(t->m, t->x, &out);
  if (s == CLPAR_OK) s = clpar_mse_loss(out, t->y, CLPAR_REDUCTION_MEAN, &t->loss);
  if (s == CLPAR_OK) s = clpar_backward(t->loss);
  if (s == CLPAR_OK && t->zero_grad_late) s = clpar_zero_optimizer_zero_grad(t->opt);
  if (s == CLPAR_OK) s = clpar_zero_optimizer_step(t->opt);
  if (t->loss) clpar_tensor_unscope(t->loss);
  clpar_scope_end(scope);
  return s;
}

/* Step i's inputs on this rank (each rank its own). */
static void write_inputs(zg_train *t, int i) {
  uint64_t seed = 1000 * (uint64_t)(clpar_dist_rank() + 1) + (uint64_t)i;
  float *x = tu_rand(ROWS * IN, seed), *y = tu_rand(ROWS * OUT, seed + 500);
  tu_ok(clpar_tensor_write(t->x, x, ROWS * IN));
  tu_ok(clpar_tensor_write(t->y, y, ROWS * OUT));
  free(x);
  free(y);
}

/* STEPS steps, eagerly or compiled (eager warm-up, capture, replays); the losses into losses. */
static void train(zg_train *t, int compiled, float *losses) {
  clpar_device *dev = clpar_dist_device();
  clpar_step *st = NULL;
  if (compiled) tu_ok(clpar_step_compile(step, t, &dev, 1, &st));
  for (int i = 0; i < STEPS; i++) {
    if (i == LR_CHANGE) {
      clpar_optimizer *inner = clpar_zero_optimizer_inner(t->opt);
      assert_non_null(inner);
      tu_ok(clpar_optimizer_set_lr(inner, 0, 0.3f * clpar_optimizer_lr(inner, 0)));
    }
    write_inputs(t, i);
    tu_ok(compiled ? clpar_step_run(st) : step(t));
    tu_ok(clpar_tensor_read(t->loss, &losses[i], 1));
  }
  if (compiled) {
    assert_non_null(clpar_step_graph(st)); /* the last 20 steps were replays */
    clpar_step_free(st);
  }
}

/* Every rank holds the same p[0 .. n): the maximum over the ranks of p and of -p is p. */
static void expect_same_on_every_rank(const float *p, size_t n) {
  float *hi = malloc(2 * n * sizeof *hi);
  assert_non_null(hi);
  for (size_t i = 0; i < n; i++) hi[i] = p[i], hi[n + i] = -p[i];
  tu_ok(clpar_dist_all_reduce_max(hi, (int64_t)(2 * n)));
  for (size_t i = 0; i < n; i++)
    if (hi[i] != p[i] || hi[n + i] != -p[i])
      fail_msg("parameter %zu differs across the ranks: %.9g here, in [%.9g, %.9g]", i,
               (double)p[i], (double)-hi[n + i], (double)hi[i]);
  free(hi);
}

static void check_replay_equals_eager(int stage, opt_kind ok) {
  zg_train eager, replayed;
  float le[STEPS], lr[STEPS];
  make_train(&eager, stage, ok);
  train(&eager, 0, le);
  make_train(&replayed, stage, ok);
  train(&replayed, 1, lr);
  tgu_expect_bits("loss at step", le, lr, STEPS);
  size_t ne, nr;
  float *pe = tgu_floats_of(eager.m, 0, &ne), *pr = tgu_floats_of(replayed.m, 0, &nr);
  assert_int_equal(ne, NUMEL);
  assert_int_equal(nr, NUMEL);
  tgu_expect_bits("parameter element", pe, pr, ne);
  assert_true(le[STEPS - 1] != le[0]); /* it trained */
  expect_same_on_every_rank(pr, nr);   /* every rank's shard was gathered */
  free(pe);
  free(pr);
  train_free(&eager);
  train_free(&replayed);
}

static void test_stage1_sgd_momentum(void **state) {
  (void)state;
  check_replay_equals_eager(1, OPT_SGD);
}

static void test_stage1_adam(void **state) {
  (void)state;
  check_replay_equals_eager(1, OPT_ADAM);
}

static void test_stage2_sgd_momentum(void **state) {
  (void)state;
  check_replay_equals_eager(2, OPT_SGD);
}

static void test_stage2_adam(void **state) {
  (void)state;
  check_replay_equals_eager(2, OPT_ADAM);
}

/* An eager step right after replays were posted (nothing waited for) equals an eager step
 * there, and freeing the ZeRO optimizer makes the graph stale (its records go with it). */
static void test_eager_after_replays_then_stale(void **state) {
  (void)state;
  for (int stage = 1; stage <= 2; stage++) {
    zg_train eager, mixed;
    clpar_device *dev = clpar_dist_device();
    make_train(&eager, stage, OPT_ADAM);
    make_train(&mixed, stage, OPT_ADAM);
    write_inputs(&eager, 0);
    write_inputs(&mixed, 0);
    for (int i = 0; i < 6; i++) tu_ok(step(&eager));
    tu_ok(step(&mixed)); /* the warm-up: Adam's state */
    clpar_graph *g = NULL;
    tu_ok(clpar_graph_capture_begin(&dev, 1));
    clpar_status s = step(&mixed);
    tu_ok(clpar_graph_capture_end(&g));
    tu_ok(s);
    for (int i = 0; i < 3; i++) tu_ok(clpar_graph_replay(g));
    tu_ok(step(&mixed));
    size_t ne, nm;
    float *pe = tgu_floats_of(eager.m, 0, &ne), *pm = tgu_floats_of(mixed.m, 0, &nm);
    assert_int_equal(ne, nm);
    tgu_expect_bits("parameter element", pe, pm, ne);
    free(pe);
    free(pm);
    clpar_zero_optimizer_free(mixed.opt);
    mixed.opt = NULL;
    assert_int_not_equal(clpar_graph_replay(g), CLPAR_OK);
    if (!strstr(clpar_last_error(), "ZeRO optimizer"))
      fail_msg("expected the freeing of the ZeRO optimizer in \"%s\"", clpar_last_error());
    clpar_graph_destroy(g);
    train_free(&eager);
    train_free(&mixed);
  }
}

/* The capture of t's step (after an eager warm-up step; late: the captured step calls zero_grad
 * after backward) fails with CLPAR_ERROR_INVALID_ARGUMENT and a message holding want and
 * want2. */
static void expect_capture_refused(zg_train *t, int late, const char *want, const char *want2) {
  clpar_device *dev = clpar_dist_device();
  write_inputs(t, 0);
  tu_ok(step(t));
  t->zero_grad_late = late;
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  clpar_status s = step(t);
  clpar_graph *g = NULL;
  clpar_status e = clpar_graph_capture_end(&g);
  assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(e, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(g);
  const char *msg = clpar_last_error();
  if (!strstr(msg, want) || !strstr(msg, want2))
    fail_msg("expected \"%s\" and \"%s\" in \"%s\"", want, want2, msg);
}

/* zero_grad after the captured backward would forget the averaged shard on the host: the
 * replay could not, so the capture refuses it (both stages). */
static void test_zero_grad_after_backward_refused(void **state) {
  (void)state;
  for (int stage = 1; stage <= 2; stage++) {
    zg_train t;
    make_train(&t, stage, OPT_SGD);
    expect_capture_refused(&t, 1, "clpar_zero_optimizer_zero_grad", "averaged shard");
    train_free(&t);
  }
}

/* ---- the timeout scenario ---- */

static void timeout_die(const char *what) {
  fprintf(stderr, "FAIL rank %d: %s: %s\n", clpar_dist_rank(), what, clpar_last_error());
  _exit(2);
}

static int timeout_scenario(int stage) {
  if (clpar_dist_init() != CLPAR_OK) timeout_die("clpar_dist_init");
  zg_train t;
  make_train(&t, stage, OPT_SGD);
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
  /* rank 0 ends the job once every other replaying rank printed (they message it) */
  int world = clpar_dist_world_size(), one = 1;
  if (clpar_dist_rank() != 0) {
    MPI_Send(&one, 1, MPI_INT, 0, 77, MPI_COMM_WORLD);
    for (int i = 0; i < 600; i++) nanosleep(&(struct timespec){0, 100000000}, NULL);
    _exit(6);
  }
  for (int r = 2; r < world; r++)
    MPI_Recv(&one, 1, MPI_INT, r, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  clpar_dist_abort(3);
  return 4; /* only if MPI could not abort */
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "timeout")) return timeout_scenario(atoi(argv[2]));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stage1_sgd_momentum),
      cmocka_unit_test(test_stage1_adam),
      cmocka_unit_test(test_stage2_sgd_momentum),
      cmocka_unit_test(test_stage2_adam),
      cmocka_unit_test(test_eager_after_replays_then_stale),
      cmocka_unit_test(test_zero_grad_after_backward_refused),
  };
  return cmocka_run_group_tests_name("zero_graph", tests, tu_dist_setup, tu_dist_teardown);
}
