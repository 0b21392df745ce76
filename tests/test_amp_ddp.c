/* test_amp_ddp.c — the loss scaler under DistributedDataParallel, run by ctest through mpirun
 * on 2 ranks (tests/CMakeLists.txt): an inf/NaN finding is agreed across ranks, so a NaN
 * written into one rank's gradient after the reduction (where DDP's all-reduce cannot spread
 * it) makes every rank skip that step and back off, and the weights stay equal on every rank.
 * Also clpar_dist_all_reduce_max itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/amp.h"
#include "test_util.h"

enum { IN = 8, HIDDEN = 16, OUT = 4, ROWS = 6, MAX_PARAMS = 512 };

static clpar_module *make_mlp(clpar_device *dev) {
  clpar_module *layers[3], *mlp;
  clpar_manual_seed(5);
  tu_ok(clpar_linear_create(IN, HIDDEN, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(HIDDEN, OUT, 1, dev, &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &mlp));
  return mlp;
}

static int read_all(clpar_module *m, float *out) {
  int at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, out + at, (size_t)(MAX_PARAMS - at)));
    at += (int)clpar_tensor_numel(p);
  }
  return at;
}

/* Every rank's n floats equal rank 0's: the sum over ranks is world times one's own. */
static void expect_same_on_every_rank(const float *v, int n, const char *what) {
  float sum[MAX_PARAMS], neg[MAX_PARAMS];
  memcpy(sum, v, (size_t)n * sizeof *v);
  for (int i = 0; i < n; i++) neg[i] = -v[i];
  tu_ok(clpar_dist_all_reduce_max(sum, n)); /* max == own == -max(-own) on every rank */
  tu_ok(clpar_dist_all_reduce_max(neg, n));
  for (int i = 0; i < n; i++)
    if (sum[i] != v[i] || -neg[i] != v[i])
      fail_msg("rank %d, %s, element %d: %g here, max %g, min %g over ranks", clpar_dist_rank(),
               what, i, (double)v[i], (double)sum[i], (double)-neg[i]);
}

static void test_all_reduce_max(void **state) {
  (void)state;
  float v[3] = {(float)clpar_dist_rank(), -(float)clpar_dist_rank(), 0.5f};
  tu_ok(clpar_dist_all_reduce_max(v, 3));
  assert_true(v[0] == (float)(clpar_dist_world_size() - 1));
  assert_true(v[1] == 0.0f && v[2] == 0.5f);
}

/* 5 steps; at step 2 rank 0 alone writes a NaN into a reduced gradient, at step 3 the last
 * rank an inf: every rank skips both and the scale backs off twice. */
static void test_one_rank_nan_skips_every_rank(void **state) {
  (void)state;
  clpar_device *dev = clpar_dist_device();
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(make_mlp(dev), NULL, &ddp));
  clpar_optimizer *o;
  tu_ok(clpar_sgd_create_for(ddp, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &o));
  clpar_grad_scaler *s;
  tu_ok(clpar_grad_scaler_create(NULL, &s));
  int rank = clpar_dist_rank(), last = clpar_dist_world_size() - 1;
  const int expect_skip[5] = {0, 0, 1, 1, 0};
  for (int t = 0; t < 5; t++) {
    clpar_scope *sc = clpar_scope_begin();
    float xv[ROWS * IN], yv[ROWS * OUT];
    for (int i = 0; i < ROWS * IN; i++) xv[i] = tu_parity_value(i + 1, 7 + rank, 13 + t);
    for (int i = 0; i < ROWS * OUT; i++) yv[i] = tu_parity_value(i + 1, 3 + rank, 11);
    clpar_tensor *x, *y, *out, *loss, *p;
    tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){ROWS, IN}, xv, &x));
    tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){ROWS, OUT}, yv, &y));
    tu_ok(clpar_optimizer_zero_grad(o));
    tu_ok(clpar_module_forward(ddp, x, &out));
    tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_grad_scaler_scale(s, loss, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_ddp_synchronize(ddp));
    if ((t == 2 && rank == 0) || (t == 3 && rank == last)) {
      tu_ok(clpar_module_parameter_at(ddp, 1, NULL, &p));
      float *g = tu_read(clpar_tensor_grad(p));
      g[0] = t == 2 ? NAN : INFINITY;
      tu_ok(clpar_tensor_write(clpar_tensor_grad(p), g, (size_t)clpar_tensor_numel(p)));
      free(g);
    }
    float before[MAX_PARAMS], after[MAX_PARAMS];
    int n = read_all(ddp, before), skipped = -1;
    tu_ok(clpar_grad_scaler_step(s, o, &skipped));
    if (skipped != expect_skip[t])
      fail_msg("rank %d, step %d: skipped %d, expected %d", rank, t, skipped, expect_skip[t]);
    read_all(ddp, after);
    if (skipped) assert_memory_equal(before, after, (size_t)n * sizeof *before);
    tu_ok(clpar_grad_scaler_update(s));
    expect_same_on_every_rank(after, n, "parameters");
    clpar_scope_end(sc);
  }
  assert_true(clpar_grad_scaler_get_scale(s) == 16384.0f);
  clpar_grad_scaler_free(s);
  clpar_optimizer_free(o);
  clpar_module_free(ddp);
}

static int setup(void **state) {
  (void)state;
  clpar_status s = clpar_dist_init();
  if (s != CLPAR_OK) {
    fprintf(stderr, "clpar_dist_init: %s: %s\n", clpar_status_name(s), clpar_last_error());
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  clpar_dist_finalize();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_reduce_max),
      cmocka_unit_test(test_one_rank_nan_skips_every_rank),
  };
  return cmocka_run_group_tests_name("amp_ddp", tests, setup, teardown);
}
