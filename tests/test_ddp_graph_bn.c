/* test_ddp_graph_bn.c — a DistributedDataParallel step of a module with buffers (BatchNorm2d's
 * running statistics and its int64 num_batches_tracked) captured and replayed over MPI, run by
 * ctest through mpirun on 2 and 3 ranks, one PoCL device each (tests/CMakeLists.txt). Each
 * rank trains on batches of its own, so the ranks' running statistics differ until the
 * forward broadcasts rank 0's (PyTorch's broadcast_buffers=True): the replayed steps must
 * equal the eager DDP steps bit for bit, parameters and buffers, on every rank (the learning
 * rate changed midway; also with gradient accumulation, whose second micro-step broadcasts
 * nothing), with no host wait on the calling thread; an evaluation forward right after
 * replays (its broadcast on the calling thread) waits for theirs. With the argument "timeout"
 * (run by tests/graph_timeout.sh, CLPAR_DIST_TIMEOUT=3): rank 0 stops replaying, and
 * rank 1's replay must end in CLPAR_ERROR_TIMEOUT naming the buffers' broadcast and rank 0. */
#include <stdlib.h>
#include <string.h>

#include "test_ddp_graph_util.h"

enum { STEPS = 20, LR_CHANGE = 10, B = 6, C = TDG_BN_C, HW = TDG_BN_HW, OUT = TDG_BN_OUT };

/* each rank's inputs spread apart, so its batch statistics differ */
static const tdg_ddp_run RUN = {.steps = STEPS, .lr_change = LR_CHANGE, .spread = 1};

/* tdg_bn_net under DDP in several buckets. */
static clpar_module *make_ddp(void) {
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(tdg_bn_net(), &(clpar_ddp_options){.bucket_cap_mb = 0.0004}, &ddp));
  return ddp;
}

static void make_train(tgu_train *t) {
  memset(t, 0, sizeof *t);
  t->m = make_ddp();
  tu_ok(clpar_sgd_create_for(t->m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &t->opt));
  clpar_device *dev = clpar_dist_device();
  tu_ok(clpar_tensor_zeros(dev, 4, (int64_t[]){B, C, HW, HW}, &t->x));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){B, OUT}, &t->y));
}

/* After the steps: an evaluation forward (broadcasting rank 0's buffers, changing none) on
 * both; the buffers then agree over the ranks, and still equal eager's. */
static void check_after_eval_forward(tgu_train *eager, tgu_train *replayed) {
  tgu_train *both[2] = {eager, replayed};
  for (int k = 0; k < 2; k++) {
    clpar_tensor *out = NULL;
    tu_ok(clpar_module_eval(both[k]->m));
    clpar_set_grad_enabled(0);
    tu_ok(clpar_module_forward(both[k]->m, both[k]->x, &out));
    clpar_set_grad_enabled(1);
    clpar_tensor_free(out);
  }
  size_t ne, nr;
  float *pe = tgu_floats_of(eager->m, 1, &ne), *pr = tgu_floats_of(replayed->m, 1, &nr);
  assert_int_equal(ne, nr);
  tgu_expect_bits("parameter or buffer element after an evaluation forward", pe, pr, ne);
  tdg_expect_same_on_every_rank("element", pr, nr);
  free(pe);
  free(pr);
}

/* A case's step and its forwards per step. */
typedef struct {
  clpar_step_fn fn;
  int forwards;
} bn_case;

/* STEPS steps eagerly and compiled: the same losses, parameters and running statistics bit
 * for bit, no host wait in the replays, each all-reduced its buckets, every rank the same
 * parameters, each BatchNorm counted every forward; then an evaluation forward. */
static void test_replay_equals_eager(void **state) {
  const bn_case *c = *state;
  tgu_train eager, replayed;
  tdg_replays r;
  make_train(&eager);
  make_train(&replayed);
  tdg_ddp_expect_equal_runs(&eager, &replayed, c->fn, &RUN, 1,
                            "parameter or running-statistic element", &r);
  assert_int_equal(r.waits, 0);              /* no host wait in the replays */
  assert_int_equal(r.reductions, STEPS - 2); /* each replay all-reduced its buckets */
  size_t np;
  float *params = tgu_floats_of(replayed.m, 0, &np);
  tdg_expect_same_on_every_rank("element", params, np);
  assert_int_equal(tdg_bn_counters_alike(eager.m, replayed.m), STEPS * c->forwards);
  check_after_eval_forward(&eager, &replayed);
  free(params);
  tgu_train_free(&eager);
  tgu_train_free(&replayed);
}

/* An evaluation forward without gradients (which broadcasts the buffers on the calling
 * thread) right after replays were posted, nothing waited for: it lets them run first, so its
 * broadcast does not meet theirs on the communication thread; the output and the buffers then
 * equal those of the same eager steps. */
static void test_eval_forward_right_after_replays(void **state) {
  (void)state;
  tgu_train eager, replayed;
  clpar_device *dev = clpar_dist_device();
  make_train(&eager);
  make_train(&replayed);
  tdg_write_inputs(eager.x, eager.y, 0, 1);
  tdg_write_inputs(replayed.x, replayed.y, 0, 1);
  for (int i = 0; i < STEPS; i++) tu_ok(tdg_step(&eager));
  clpar_step *st;
  tu_ok(clpar_step_compile(tdg_step, &replayed, &dev, 1, &st));
  for (int i = 0; i < STEPS; i++) tu_ok(clpar_step_run(st)); /* warm-up, capture, replays */
  tgu_train *both[2] = {&replayed, &eager}; /* the replayed first: the eager's would wait */
  float *out[2];
  size_t n[2];
  for (int k = 0; k < 2; k++) {
    clpar_tensor *y = NULL;
    tu_ok(clpar_module_eval(both[k]->m));
    clpar_set_grad_enabled(0);
    tu_ok(clpar_module_forward(both[k]->m, both[k]->x, &y));
    clpar_set_grad_enabled(1);
    out[k] = malloc(B * OUT * sizeof(float));
    assert_non_null(out[k]);
    tu_ok(clpar_tensor_read(y, out[k], B * OUT));
    clpar_tensor_free(y);
  }
  tgu_expect_bits("output element", out[1], out[0], B * OUT);
  float *pe = tgu_floats_of(eager.m, 1, &n[0]), *pr = tgu_floats_of(replayed.m, 1, &n[1]);
  assert_int_equal(n[0], n[1]);
  tgu_expect_bits("parameter or buffer element", pe, pr, n[0]);
  tdg_expect_same_on_every_rank("element", pr, n[1]);
  free(pe);
  free(pr);
  free(out[0]);
  free(out[1]);
  clpar_step_free(st);
  tgu_train_free(&eager);
  tgu_train_free(&replayed);
}

/* ---- the timeout scenario ---- */

static int timeout_scenario(void) {
  tdg_timeout_init();
  tgu_train t;
  make_train(&t);
  return tdg_timeout_run(tdg_step, &t, &t.loss, 0); /* the broadcast's root stops */
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "timeout")) return timeout_scenario();
  const struct CMUnitTest tests[] = {
      TGU_CASE(test_replay_equals_eager, test_replay_equals_eager, bn_case, tdg_step, 1),
      TGU_CASE(test_accumulation_replay_equals_eager, test_replay_equals_eager, bn_case,
               tdg_accumulating_step, 2),
      cmocka_unit_test(test_eval_forward_right_after_replays),
  };
  return cmocka_run_group_tests_name("ddp_graph_bn", tests, tu_dist_setup, tu_dist_teardown);
}
