/* test_zero3_graph.c — a ZeRO stage 3 (FSDP units) training step (clpar/zero.h) captured and
 * replayed (clpar/graph.h) over MPI, run by ctest through mpirun on 2 and 3 ranks, one PoCL
 * device each (tests/CMakeLists.txt): the step compiled (an eager warm-up, the capture, 20
 * replays, the inner optimizer's learning rate changed midway) gives the losses and parameters
 * of the same steps run eagerly on a second copy of the model, bit for bit, with SGD (momentum)
 * and Adam; the ranks end with the same parameters. Three units (the Linear layers: 77, 96 and
 * 45 parameters, 77 and 45 dividing by neither 2 nor 3 or not by 2: padded shards). An eager
 * step right after replays equals the eager run, and freeing the ZeRO optimizer makes the graph
 * stale. A GPT (blocks as units inside the root unit, Dropout 0.1, Adam): 8 compiled steps
 * equal eager ones bit for bit. Refused at capture: a module with buffers, a backward whose
 * forward ran eagerly. With the argument "timeout" (run by tests/zero_graph_timeout.sh 3,
 * CLPAR_DIST_TIMEOUT=3): rank 1 stops replaying, and every other rank's replay must end in
 * CLPAR_ERROR_TIMEOUT naming rank 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clpar/zero.h"
#include "internal.h" /* clpar_tensor_unscope */
#include "test_graph_util.h"

/* Linear(6, 11) ReLU Linear(11, 8) ReLU Linear(8, 5): 77 + 96 + 45 = 218 parameters */
enum { STEPS = 22, LR_CHANGE = 12, ROWS = 6, IN = 6, H1 = 11, H2 = 8, OUT = 5, NUMEL = 218 };

typedef enum { OPT_SGD, OPT_ADAM } opt_kind;

typedef struct {
  clpar_module *m;
  clpar_zero_optimizer *opt;
  clpar_tensor *x, *y, *loss;
} zg_train;

static clpar_module *make_ddp(int with_buffer) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *c[5], *m, *ddp;
  clpar_manual_seed(11);
  tu_ok(clpar_linear_create(IN, H1, 1, dev, &c[0]));
  tu_ok(clpar_relu_create(&c[1]));
  tu_ok(clpar_linear_create(H1, H2, 1, dev, &c[2]));
  tu_ok(clpar_relu_create(&c[3]));
  tu_ok(clpar_linear_create(H2, OUT, 1, dev, &c[4]));
  tu_ok(clpar_sequential_create(c, 5, &m));
  if (with_buffer) { /* a [1] buffer of the model's own */
    clpar_tensor *b;
    tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){1}, &b));
    clpar_tensor_unscope(b);
    tu_ok(clpar_module_add_buffer(m, "count", b));
    clpar_tensor_release(b);
  }
  tu_ok(clpar_ddp_create(m, &(clpar_ddp_options){.zero_stage = 3}, &ddp));
  return ddp;
}

static void make_train(zg_train *t, opt_kind ok) {
  memset(t, 0, sizeof *t);
  t->m = make_ddp(0);
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
  clpar_status s = clpar_zero_optimizer_zero_grad(t->opt);
  if (s == CLPAR_OK) s = clpar_module_forward(t->m, t->x, &out);
  if (s == CLPAR_OK) s = clpar_mse_loss(out, t->y, CLPAR_REDUCTION_MEAN, &t->loss);
  if (s == CLPAR_OK) s = clpar_backward(t->loss);
  if (s == CLPAR_OK) s = clpar_zero_optimizer_step(t->opt);
  if (t->loss) clpar_tensor_unscope(t->loss);
  clpar_scope_end(scope);
  return s;
}

/* The module's parameters (gathered, then released again), n of them. */
static float *params_of(zg_train *t, size_t *n) {
  tu_ok(clpar_zero_gather_parameters(t->m));
  float *p = tgu_floats_of(t->m, 0, n);
  tu_ok(clpar_zero_release_parameters(t->m));
  return p;
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

static void check_replay_equals_eager(opt_kind ok) {
  zg_train eager, replayed;
  float le[STEPS], lr[STEPS];
  make_train(&eager, ok);
  train(&eager, 0, le);
  make_train(&replayed, ok);
  train(&replayed, 1, lr);
  tgu_expect_bits("loss at step", le, lr, STEPS);
  size_t ne, nr;
  float *pe = params_of(&eager, &ne), *pr = params_of(&replayed, &nr);
  assert_int_equal(ne, NUMEL);
  assert_int_equal(nr, NUMEL);
  tgu_expect_bits("parameter element", pe, pr, ne);
  assert_true(le[STEPS - 1] != le[0]); /* it trained */
  expect_same_on_every_rank(pr, nr);   /* every rank's shards were gathered */
  free(pe);
  free(pr);
  train_free(&eager);
  train_free(&replayed);
}

static void test_sgd_momentum(void **state) {
  (void)state;
  check_replay_equals_eager(OPT_SGD);
}

static void test_adam(void **state) {
  (void)state;
  check_replay_equals_eager(OPT_ADAM);
}

/* An eager step right after replays were posted (nothing waited for) equals an eager step
 * there, the parameters gathered after it too, and freeing the ZeRO optimizer makes the graph
 * stale. */
static void test_eager_after_replays_then_stale(void **state) {
  (void)state;
  zg_train eager, mixed;
  clpar_device *dev = clpar_dist_device();
  make_train(&eager, OPT_ADAM);
  make_train(&mixed, OPT_ADAM);
  write_inputs(&eager, 0);
  write_inputs(&mixed, 0);
  float le = 0, lm = 0;
  for (int i = 0; i < 6; i++) tu_ok(step(&eager));
  tu_ok(clpar_tensor_read(eager.loss, &le, 1));
  tu_ok(step(&mixed)); /* the warm-up: Adam's state */
  clpar_graph *g = NULL;
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  clpar_status s = step(&mixed);
  tu_ok(clpar_graph_capture_end(&g));
  tu_ok(s);
  for (int i = 0; i < 3; i++) tu_ok(clpar_graph_replay(g));
  tu_ok(step(&mixed));
  tu_ok(clpar_tensor_read(mixed.loss, &lm, 1));
  tgu_expect_bits("loss of step 6", &le, &lm, 1);
  size_t ne, nm;
  float *pe = params_of(&eager, &ne), *pm = params_of(&mixed, &nm);
  assert_int_equal(ne, nm);
  tgu_expect_bits("parameter element", pe, pm, ne);
  free(pe);
  free(pm);
  clpar_zero_optimizer_free(mixed.opt);
  mixed.opt = NULL;
  assert_int_not_equal(clpar_graph_replay(g), CLPAR_OK);
  if (!strstr(clpar_last_error(), "optimizer"))
    fail_msg("expected the freeing of the optimizer in \"%s\"", clpar_last_error());
  clpar_graph_destroy(g);
  train_free(&eager);
  train_free(&mixed);
}

/* Buffers' broadcast is not captured with stage 3: refused at capture, naming it. */
static void test_buffers_refused(void **state) {
  (void)state;
  clpar_device *dev = clpar_dist_device();
  clpar_module *ddp = make_ddp(1);
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
  if (!strstr(msg, "DistributedDataParallel's forward") ||
      !strstr(msg, "buffers under ZeRO stage 3"))
    fail_msg("expected the refusal of buffers under stage 3 in \"%s\"", msg);
  clpar_tensor_free(out);
  clpar_tensor_free(x);
  clpar_module_free(ddp);
}

/* ---- a GPT: blocks as units inside the root unit, Dropout(0.1) ---- */

enum { GB = 2, GT = 6, GV = 11, GPT_STEPS = 8 };

typedef struct {
  clpar_module *m;
  clpar_zero_optimizer *opt;
  clpar_tensor *ids, *next, *loss;
} gpt_train;

/* zero_units "transformer.h": the blocks are units, the embeddings, ln_f and the tied head
 * the root unit around them (its backward runs theirs nested). */
static void make_gpt(gpt_train *t) {
  clpar_gpt_config cfg = {.block_size = 8,
                          .vocab_size = GV,
                          .n_layer = 2,
                          .n_head = 2,
                          .n_embd = 8,
                          .dropout = 0.1f,
                          .bias = 1};
  clpar_device *dev = clpar_dist_device();
  clpar_module *gpt;
  memset(t, 0, sizeof *t);
  clpar_manual_seed(300 + (uint64_t)clpar_dist_rank()); /* each rank its masks, alike per copy */
  tu_ok(clpar_gpt_create(&cfg, dev, &gpt));
  tu_ok(clpar_ddp_create(gpt, &(clpar_ddp_options){.zero_stage = 3, .zero_units = "transformer.h"},
                         &t->m));
  tu_ok(clpar_zero_adam_create(t->m, &(clpar_adam_options){.lr = 0.01f}, &t->opt));
  int64_t shape[2] = {GB, GT}, flat = GB * GT;
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT32, 2, shape, &t->ids));
  tu_ok(clpar_tensor_zeros_dtype(dev, CLPAR_INT32, 1, &flat, &t->next));
}

static clpar_status gpt_step(void *ctx) {
  gpt_train *t = ctx;
  clpar_tensor_free(t->loss);
  t->loss = NULL;
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *logits = NULL, *flat = NULL;
  clpar_status s = clpar_zero_optimizer_zero_grad(t->opt);
  if (s == CLPAR_OK) s = clpar_module_forward(t->m, t->ids, &logits);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(logits, 2, (int64_t[]){GB * GT, GV}, &flat);
  if (s == CLPAR_OK)
    s = clpar_cross_entropy_targets(flat, t->next, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN,
                                    &t->loss);
  if (s == CLPAR_OK) s = clpar_backward(t->loss);
  if (s == CLPAR_OK) s = clpar_zero_optimizer_step(t->opt);
  if (t->loss) clpar_tensor_unscope(t->loss);
  clpar_scope_end(scope);
  return s;
}

static void train_gpt(gpt_train *t, int compiled, float *losses) {
  clpar_device *dev = clpar_dist_device();
  clpar_step *st = NULL;
  if (compiled) tu_ok(clpar_step_compile(gpt_step, t, &dev, 1, &st));
  for (int k = 0; k < GPT_STEPS; k++) {
    int32_t ids[GB * GT], next[GB * GT];
    for (int i = 0; i < GB * GT; i++) {
      ids[i] = (int32_t)((i * 7 + k * 3 + clpar_dist_rank() * 5) % GV);
      next[i] = (int32_t)((ids[i] * 3 + 1) % GV);
    }
    tu_ok(clpar_tensor_write_raw(t->ids, ids, sizeof ids));
    tu_ok(clpar_tensor_write_raw(t->next, next, sizeof next));
    tu_ok(compiled ? clpar_step_run(st) : gpt_step(t));
    tu_ok(clpar_tensor_read(t->loss, &losses[k], 1));
  }
  if (compiled) {
    assert_non_null(clpar_step_graph(st));
    clpar_step_free(st);
  }
}

static void gpt_free(gpt_train *t) {
  clpar_tensor_free(t->loss);
  clpar_tensor_free(t->ids);
  clpar_tensor_free(t->next);
  clpar_zero_optimizer_free(t->opt);
  clpar_module_free(t->m);
}

static void test_gpt_root_unit_dropout(void **state) {
  (void)state;
  gpt_train eager, replayed;
  float le[GPT_STEPS], lr[GPT_STEPS];
  make_gpt(&eager);
  train_gpt(&eager, 0, le);
  make_gpt(&replayed);
  train_gpt(&replayed, 1, lr);
  tgu_expect_bits("GPT loss at step", le, lr, GPT_STEPS);
  assert_true(le[GPT_STEPS - 1] != le[0]); /* it trained */
  size_t ne, nr;
  tu_ok(clpar_zero_gather_parameters(eager.m));
  tu_ok(clpar_zero_gather_parameters(replayed.m));
  float *pe = tgu_floats_of(eager.m, 0, &ne), *pr = tgu_floats_of(replayed.m, 0, &nr);
  assert_int_equal(ne, nr);
  tgu_expect_bits("GPT parameter element", pe, pr, ne);
  expect_same_on_every_rank(pr, nr);
  free(pe);
  free(pr);
  gpt_free(&eager);
  gpt_free(&replayed);
}

/* A backward under capture whose forward ran eagerly before it: refused, naming it. */
static void test_backward_of_eager_forward_refused(void **state) {
  (void)state;
  clpar_device *dev = clpar_dist_device();
  zg_train t;
  make_train(&t, OPT_SGD);
  write_inputs(&t, 0);
  clpar_tensor *out = NULL;
  tu_ok(clpar_module_forward(t.m, t.x, &out));
  tu_ok(clpar_mse_loss(out, t.y, CLPAR_REDUCTION_MEAN, &t.loss));
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  clpar_status s = clpar_backward(t.loss);
  clpar_graph *g = NULL;
  clpar_status e = clpar_graph_capture_end(&g);
  assert_int_not_equal(s, CLPAR_OK);
  assert_int_equal(e, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(g);
  if (!strstr(clpar_last_error(), "a backward whose forward ran before the capture"))
    fail_msg("expected the refusal of the eager forward's backward in \"%s\"", clpar_last_error());
  clpar_tensor_free(out);
  train_free(&t);
}

/* ---- the timeout scenario ---- */

static void timeout_die(const char *what) {
  fprintf(stderr, "FAIL rank %d: %s: %s\n", clpar_dist_rank(), what, clpar_last_error());
  _exit(2);
}

static int timeout_scenario(void) {
  if (clpar_dist_init() != CLPAR_OK) timeout_die("clpar_dist_init");
  zg_train t;
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
  if (argc > 1 && !strcmp(argv[1], "timeout")) return timeout_scenario();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_momentum),
      cmocka_unit_test(test_adam),
      cmocka_unit_test(test_eager_after_replays_then_stale),
      cmocka_unit_test(test_gpt_root_unit_dropout),
      cmocka_unit_test(test_buffers_refused),
      cmocka_unit_test(test_backward_of_eager_forward_refused),
  };
  return cmocka_run_group_tests_name("zero3_graph", tests, tu_dist_setup, tu_dist_teardown);
}
