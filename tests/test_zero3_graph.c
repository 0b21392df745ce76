/* test_zero3_graph.c — a ZeRO stage 3 (FSDP units) training step (clpar/zero.h) captured and
 * replayed (clpar/graph.h) over MPI, run by ctest through mpirun on 2 and 3 ranks, one PoCL
 * device each (tests/CMakeLists.txt): the step compiled (an eager warm-up, the capture, 20
 * replays, the inner optimizer's learning rate changed midway) gives the losses and parameters
 * of the same steps run eagerly on a second copy of the model, bit for bit, with SGD (momentum)
 * and Adam; the ranks end with the same parameters. Three units (the Linear layers: 77, 96 and
 * 45 parameters, 77 and 45 dividing by neither 2 nor 3 or not by 2: padded shards). An eager
 * step right after replays equals the eager run, and freeing the ZeRO optimizer makes the graph
 * stale. A GPT (blocks as units inside the root unit, Dropout 0.1, Adam): 8 compiled steps
 * equal eager ones bit for bit. Refused at capture: a backward whose forward ran eagerly (a
 * module with buffers: test_zero3_graph_bn.c). With the argument "timeout" (run by
 * tests/graph_timeout.sh, CLPAR_DIST_TIMEOUT=3): rank 1 stops replaying, and every other rank's
 * replay must end in CLPAR_ERROR_TIMEOUT naming rank 1. */
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* clpar_tensor_unscope */
#include "test_ddp_graph_util.h"

/* Linear(6, 11) ReLU Linear(11, 8) ReLU Linear(8, 5): 77 + 96 + 45 = 218 parameters */
enum { STEPS = 22, LR_CHANGE = 12, ROWS = 6, IN = 6, H1 = 11, H2 = 8, OUT = 5, NUMEL = 218 };

static clpar_module *make_ddp(void) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *c[5], *m, *ddp;
  clpar_manual_seed(11);
  tu_ok(clpar_linear_create(IN, H1, 1, dev, &c[0]));
  tu_ok(clpar_relu_create(&c[1]));
  tu_ok(clpar_linear_create(H1, H2, 1, dev, &c[2]));
  tu_ok(clpar_relu_create(&c[3]));
  tu_ok(clpar_linear_create(H2, OUT, 1, dev, &c[4]));
  tu_ok(clpar_sequential_create(c, 5, &m));
  tu_ok(clpar_ddp_create(m, &(clpar_ddp_options){.zero_stage = 3}, &ddp));
  return ddp;
}

/* the model under ZeRO stage 3 */
static clpar_module *make_plain(int stage) {
  assert_int_equal(stage, 3);
  return make_ddp();
}

static const tdg_zero_model MODEL = {.make_ddp = make_plain,
                                     .rows = ROWS,
                                     .in = IN,
                                     .out = OUT,
                                     .steps = STEPS,
                                     .lr_change = LR_CHANGE,
                                     .numel = NUMEL};

/* An eager step right after replays were posted (nothing waited for) equals an eager step
 * there, the parameters gathered after it too, and freeing the ZeRO optimizer makes the graph
 * stale. */
static void test_eager_after_replays_then_stale(void **state) {
  (void)state;
  float le = 0, lm = 0;
  tdg_zero_eager_after_replays_then_stale(&MODEL, 3, "optimizer", &le, &lm);
  tgu_expect_bits("loss of step 6", &le, &lm, 1);
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
  tdg_expect_same_on_every_rank("parameter", pr, nr);
  free(pe);
  free(pr);
  gpt_free(&eager);
  gpt_free(&replayed);
}

/* A backward under capture whose forward ran eagerly before it: refused, naming it. */
static void test_backward_of_eager_forward_refused(void **state) {
  (void)state;
  clpar_device *dev = clpar_dist_device();
  tdg_zero_train t;
  tdg_zero_make(&t, &MODEL, 3, TDG_SGD);
  tdg_write_inputs(t.x, t.y, 0, 0);
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
  tdg_zero_free(&t);
}

/* ---- the timeout scenario ---- */

static int timeout_scenario(void) {
  tdg_timeout_init();
  tdg_zero_train t;
  tdg_zero_make(&t, &MODEL, 3, TDG_SGD);
  return tdg_timeout_run(tdg_zero_step, &t, &t.loss, 1); /* rank 1 stops */
}

/* a case of tdg_zero_test_replay_equals_eager on MODEL */
#define ZERO_CASE(name, ...) \
  TGU_CASE(name, tdg_zero_test_replay_equals_eager, tdg_zero_case, &MODEL, __VA_ARGS__)

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "timeout")) return timeout_scenario();
  const struct CMUnitTest tests[] = {
      ZERO_CASE(test_sgd_momentum, 3, TDG_SGD),
      ZERO_CASE(test_adam, 3, TDG_ADAM),
      cmocka_unit_test(test_eager_after_replays_then_stale),
      cmocka_unit_test(test_gpt_root_unit_dropout),
      cmocka_unit_test(test_backward_of_eager_forward_refused),
  };
  return cmocka_run_group_tests_name("zero3_graph", tests, tu_dist_setup, tu_dist_teardown);
}
