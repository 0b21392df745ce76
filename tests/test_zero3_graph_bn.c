/* test_zero3_graph_bn.c — a ZeRO stage 3 (FSDP units) step of a module with buffers
 * (BatchNorm2d's running statistics and its int64 num_batches_tracked) captured and replayed
 * over MPI, run by ctest through mpirun on 2 and 3 ranks, one PoCL device each
 * (tests/CMakeLists.txt). Each rank trains on batches of its own, so the ranks' running
 * statistics differ until the forward broadcasts rank 0's (broadcast_buffers, a job of
 * stage 3's queue before the first gather): the compiled steps (an eager warm-up, the
 * capture, replays, the learning rate changed midway) must give the losses, the gathered
 * parameters and the buffers of the same steps run eagerly on a second copy, bit for bit, and
 * every rank the same values after an evaluation forward (which broadcasts once more). */
#include <stdlib.h>
#include <string.h>

#include "test_ddp_graph_util.h"

enum { STEPS = 22, LR_CHANGE = 12, B = 6, C = TDG_BN_C, HW = TDG_BN_HW, OUT = TDG_BN_OUT };

/* tdg_bn_net under stage 3, the Sequential's layers with parameters as units */
static void make_train(tdg_zero_train *t, tdg_opt ok) {
  clpar_device *dev = clpar_dist_device();
  memset(t, 0, sizeof *t);
  t->stage = 3;
  tu_ok(clpar_ddp_create(tdg_bn_net(), &(clpar_ddp_options){.zero_stage = 3}, &t->m));
  if (ok == TDG_SGD)
    tu_ok(
        clpar_zero_sgd_create(t->m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &t->opt));
  else
    tu_ok(clpar_zero_adam_create(t->m, &(clpar_adam_options){.lr = 0.01f}, &t->opt));
  tu_ok(clpar_tensor_zeros(dev, 4, (int64_t[]){B, C, HW, HW}, &t->x));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){B, OUT}, &t->y));
}

/* STEPS steps on t, eagerly or compiled; each rank's inputs spread apart. */
static void train(tdg_zero_train *t, int compiled, float *losses) {
  tdg_zero_train_run(t, STEPS, LR_CHANGE, 1, compiled, losses);
}

/* The parameters (gathered, then released) and float buffers of t, *n floats, malloc'ed. */
static float *values_of(tdg_zero_train *t, size_t *n) {
  tu_ok(clpar_zero_gather_parameters(t->m));
  float *v = tgu_floats_of(t->m, 1, n);
  tu_ok(clpar_zero_release_parameters(t->m));
  return v;
}

/* An evaluation forward without gradients: it broadcasts rank 0's buffers and changes none. */
static void eval_forward(tdg_zero_train *t) {
  clpar_tensor *out = NULL;
  tu_ok(clpar_module_eval(t->m));
  clpar_set_grad_enabled(0);
  tu_ok(clpar_module_forward(t->m, t->x, &out));
  clpar_set_grad_enabled(1);
  clpar_tensor_free(out);
}

static void test_replay_equals_eager(void **state) {
  const tdg_opt *ok = *state;
  tdg_zero_train eager, replayed;
  float le[STEPS], lr[STEPS];
  make_train(&eager, *ok);
  train(&eager, 0, le);
  make_train(&replayed, *ok);
  train(&replayed, 1, lr);
  tgu_expect_bits("loss at step", le, lr, STEPS);
  assert_true(le[STEPS - 1] != le[0]); /* it trained */
  size_t ne, nr;
  float *pe = values_of(&eager, &ne), *pr = values_of(&replayed, &nr);
  assert_int_equal(ne, nr);
  tgu_expect_bits("parameter or running-statistic element", pe, pr, ne);
  free(pe);
  free(pr);
  assert_true(tdg_bn_counters_alike(eager.m, replayed.m) >= STEPS);
  eval_forward(&eager);
  eval_forward(&replayed);
  pe = values_of(&eager, &ne);
  pr = values_of(&replayed, &nr);
  assert_int_equal(ne, nr);
  tgu_expect_bits("element after an evaluation forward", pe, pr, ne);
  tdg_expect_same_on_every_rank("element", pr, nr);
  free(pe);
  free(pr);
  tdg_zero_free(&eager);
  tdg_zero_free(&replayed);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TGU_CASE(test_sgd_momentum, test_replay_equals_eager, tdg_opt, TDG_SGD),
      TGU_CASE(test_adam, test_replay_equals_eager, tdg_opt, TDG_ADAM),
  };
  return cmocka_run_group_tests_name("zero3_graph_bn", tests, tu_dist_setup, tu_dist_teardown);
}
