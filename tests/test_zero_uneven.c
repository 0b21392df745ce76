/* test_zero_uneven.c — uneven inputs (clpar_ddp_options.uneven_inputs, clpar_ddp_join) under
 * ZeRO stages 1, 2 and 3, as under plain DDP: after two steps on every rank, rank 0 has a third
 * batch and the others join; rank 0's forward and the others' joins fail alike with
 * CLPAR_ERROR_UNEVEN_INPUTS naming both sides, no collective is left waiting, and later
 * forwards fail at once. When every rank joins at the same step, the join is CLPAR_OK. Run by
 * ctest through mpirun on 2 and 4 ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

enum { IN = 16, HIDDEN = 24, OUT = 3, ROWS = 4 };

static clpar_module *make_ddp(int stage) {
  clpar_module *layers[3], *mlp, *ddp;
  clpar_device *dev = clpar_dist_device();
  clpar_manual_seed(100 + (uint64_t)clpar_dist_rank()); /* rank 0's weights are broadcast */
  tu_ok(clpar_linear_create(IN, HIDDEN, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(HIDDEN, OUT, 1, dev, &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &mlp));
  clpar_ddp_options o = {.zero_stage = stage, .uneven_inputs = 1};
  tu_ok(clpar_ddp_create(mlp, &o, &ddp));
  return ddp;
}

/* zero_grad, forward, MSE against zeros, backward: the forward's status (the rest only when
 * it succeeded). */
static clpar_status forward_backward(clpar_module *ddp, clpar_zero_optimizer *opt, int k) {
  float *x = tu_rand(ROWS * IN, 7 + (uint64_t)(k * 16 + clpar_dist_rank()));
  clpar_device *dev = clpar_dist_device();
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *out, *loss;
  tu_ok(clpar_zero_optimizer_zero_grad(opt));
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){ROWS, IN}, x, &xt));
  clpar_status s = clpar_module_forward(ddp, xt, &out);
  if (s == CLPAR_OK) {
    tu_ok(clpar_mean(out, &loss));
    tu_ok(clpar_backward(loss));
  }
  clpar_scope_end(scope);
  free(x);
  return s;
}

static void train_then_end(int stage, int even) {
  clpar_module *ddp = make_ddp(stage);
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_adam_create(ddp, NULL, &opt));
  for (int k = 0; k < 2; k++) {
    tu_ok(forward_backward(ddp, opt, k));
    tu_ok(clpar_zero_optimizer_step(opt));
  }
  int rank = clpar_dist_rank();
  clpar_status s = !even && rank == 0 ? forward_backward(ddp, opt, 2) : clpar_ddp_join(ddp);
  if (even) {
    tu_ok(s);
    assert_int_equal(forward_backward(ddp, opt, 3), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "every rank has joined"));
  } else {
    assert_int_equal(s, CLPAR_ERROR_UNEVEN_INPUTS);
    assert_non_null(strstr(clpar_last_error(), "ran out of inputs (clpar_ddp_join) at step 3"));
    assert_non_null(strstr(clpar_last_error(), "rank 0 still had some"));
    /* the module takes no more forwards: each fails at once, with no collective */
    assert_int_equal(forward_backward(ddp, opt, 3), CLPAR_ERROR_UNEVEN_INPUTS);
  }
  tu_ok(clpar_dist_barrier()); /* no rank was left in a collective */
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
}

static void test_uneven_inputs_stop_every_rank(void **state) {
  (void)state;
  for (int stage = 1; stage <= 3; stage++) train_then_end(stage, 0);
}

static void test_every_rank_joining_is_the_even_end(void **state) {
  (void)state;
  for (int stage = 1; stage <= 3; stage++) train_then_end(stage, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uneven_inputs_stop_every_rank),
      cmocka_unit_test(test_every_rank_joining_is_the_even_end),
  };
  return cmocka_run_group_tests_name("zero_uneven", tests, tu_dist_setup, tu_dist_teardown);
}
