/* test_zero_order.c — ZeRO stages 1, 2 and 3 sum each element of the gradient over the ranks in
 * rank order (rank 0's + rank 1's + ...: src/dist/zero_scatter.c), whatever the MPI library
 * would choose: the parameters after one SGD step (lr 1) are the same bits as that sum, averaged
 * and subtracted on the host. The gradients are picked so that the order shows: 1 + 1e8 - 1e8 + 1
 * is 1 in rank order, 0 when the pairs are summed first, as a reduction tree to rank 0 does.
 * Run by ctest through mpirun on 3 and 4 ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

enum { K = 11 }; /* Linear(1, K): 2 K parameters, which 4 ranks split unevenly */

/* Rank r's gradient for element k of the weight and of the bias. */
static float grad_of(int r, int k) {
  static const float pattern[4] = {1.0f, 1e8f, -1e8f, 1.0f};
  return pattern[(r + k) % 4];
}

/* The module's 2 K parameters (stage 3 keeps shards: gathered for the read, then released). */
static float *read_full(clpar_module *ddp, int stage) {
  if (stage == 3) tu_ok(clpar_zero_gather_parameters(ddp));
  float *p = tu_read_params(ddp, 2 * K);
  if (stage == 3) tu_ok(clpar_zero_release_parameters(ddp));
  return p;
}

/* One step of SGD (lr 1) under ZeRO stage; the gradient of weight[k] and bias[k] on rank r is
 * grad_of(r, k) (the loss is sum(Linear(1) * grads) on an input of 1). */
static void step_once(int stage) {
  clpar_device *dev = clpar_dist_device();
  int rank = clpar_dist_rank(), world = clpar_dist_world_size();
  clpar_module *lin, *ddp;
  clpar_manual_seed(9);
  tu_ok(clpar_linear_create(1, K, 1, dev, &lin));
  clpar_ddp_options o = {.zero_stage = stage};
  tu_ok(clpar_ddp_create(lin, &o, &ddp));
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_sgd_create(ddp, &(clpar_sgd_options){.lr = 1.0f}, &opt));
  float *before = read_full(ddp, stage), g[K], one = 1.0f;
  for (int k = 0; k < K; k++) g[k] = grad_of(rank, k);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *c, *y, *prod, *loss;
  tu_ok(clpar_zero_optimizer_zero_grad(opt));
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){1, 1}, &one, &x));
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){1, K}, g, &c));
  tu_ok(clpar_module_forward(ddp, x, &y));
  tu_ok(clpar_mul(y, c, &prod));
  tu_ok(clpar_sum(prod, &loss));
  tu_ok(clpar_backward(loss));
  clpar_scope_end(scope);
  tu_ok(clpar_zero_optimizer_step(opt));
  float *after = read_full(ddp, stage), inv = 1.0f / (float)world;
  for (int i = 0; i < 2 * K; i++) {
    int k = i % K; /* the weight [K, 1], then the bias [K] */
    float sum = grad_of(0, k);
    for (int q = 1; q < world; q++) sum += grad_of(q, k);
    float want = before[i] - sum * inv;
    if (memcmp(&after[i], &want, sizeof want)) {
      print_error("stage %d, rank %d: parameter element %d is %.9g, want %.9g (sum %g)\n", stage,
                  rank, i, (double)after[i], (double)want, (double)sum);
      fail();
    }
  }
  free(before);
  free(after);
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
}

static void test_stage1_sums_in_rank_order(void **state) {
  (void)state;
  step_once(1);
}

static void test_stage2_sums_in_rank_order(void **state) {
  (void)state;
  step_once(2);
}

static void test_stage3_sums_in_rank_order(void **state) {
  (void)state;
  step_once(3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stage1_sums_in_rank_order),
      cmocka_unit_test(test_stage2_sums_in_rank_order),
      cmocka_unit_test(test_stage3_sums_in_rank_order),
  };
  return cmocka_run_group_tests_name("zero_order", tests, tu_dist_setup, tu_dist_teardown);
}
