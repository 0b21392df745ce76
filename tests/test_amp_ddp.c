/* test_amp_ddp.c — the loss scaler under DistributedDataParallel, run by ctest through mpirun
 * on 2 ranks (tests/CMakeLists.txt): an inf/NaN finding is agreed across ranks, so a NaN
 * written into one rank's gradient after the reduction (where DDP's all-reduce cannot spread
 * it) makes every rank skip that step and back off, and the weights stay equal on every rank.
 * Also clpar_dist_all_reduce_max itself, and the ToyModel and an MLP trained under autocast
 * with DDP against one device and float32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/amp.h"
#include "test_util.h"

enum { IN = 8, HIDDEN = 16, OUT = 4, ROWS = 6, MAX_PARAMS = 2048 };

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

/* The seeds' ToyModel (Linear(10, 10), ReLU, Linear(10, 5)) or an MLP (16, 32, 32, 5) on dev,
 * the same weights on every rank. */
static clpar_module *make_model(int toy, clpar_device *dev) {
  clpar_module *l[5], *m;
  int n = 0;
  clpar_manual_seed(toy ? 3 : 11);
  tu_ok(clpar_linear_create(toy ? 10 : 16, toy ? 10 : 32, 1, dev, &l[n++]));
  tu_ok(clpar_relu_create(&l[n++]));
  if (!toy) {
    tu_ok(clpar_linear_create(32, 32, 1, dev, &l[n++]));
    tu_ok(clpar_relu_create(&l[n++]));
  }
  tu_ok(clpar_linear_create(toy ? 10 : 32, 5, 1, dev, &l[n++]));
  tu_ok(clpar_sequential_create(l, n, &m));
  return m;
}

/* 5 steps of SGD (lr 0.1, momentum 0.9) with a GradScaler on a batch of 24 fixed random rows
 * under dtype's autocast (none for float32): under DDP (ddp) each rank takes its 24 / world
 * rows, else the whole batch on this rank alone. The weights after out; their count back. */
static int train_autocast(int toy, clpar_dtype dtype, int ddp, float *weights) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *m = make_model(toy, dev);
  if (ddp) tu_ok(clpar_ddp_create(m, NULL, &m));
  clpar_optimizer *o;
  tu_ok(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.1f, .momentum = 0.9f}, &o));
  clpar_grad_scaler *gs;
  tu_ok(clpar_grad_scaler_create(NULL, &gs));
  int64_t rows = ddp ? 24 / clpar_dist_world_size() : 24,
          first = ddp ? clpar_dist_rank() * rows : 0;
  for (int t = 0; t < 5; t++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *y, *out, *loss;
    tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){24, toy ? 10 : 16}, 100 + (uint64_t)t, 0, 1,
                                   &x));
    tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){24, 5}, 200 + (uint64_t)t, 0, 1, &y));
    tu_ok(clpar_tensor_rows(x, first, rows, &x));
    tu_ok(clpar_tensor_rows(y, first, rows, &y));
    tu_ok(clpar_optimizer_zero_grad(o));
    if (dtype != CLPAR_FLOAT32) tu_ok(clpar_autocast_begin(dtype));
    tu_ok(clpar_module_forward(m, x, &out));
    assert_int_equal(clpar_tensor_dtype(out), dtype);
    tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
    if (dtype != CLPAR_FLOAT32) clpar_autocast_end();
    tu_ok(clpar_grad_scaler_scale(gs, loss, &loss));
    tu_ok(clpar_backward(loss));
    if (ddp) tu_ok(clpar_ddp_synchronize(m));
    int skipped = -1;
    tu_ok(clpar_grad_scaler_step(gs, o, &skipped));
    assert_int_equal(skipped, 0);
    tu_ok(clpar_grad_scaler_update(gs));
    clpar_scope_end(sc);
  }
  int n = read_all(m, weights);
  clpar_grad_scaler_free(gs);
  clpar_optimizer_free(o);
  clpar_module_free(m);
  return n;
}

static float rel_diff(const float *a, const float *b, int n) {
  float worst = 0.0f, scale = 0.0f;
  for (int i = 0; i < n; i++) {
    worst = fmaxf(worst, fabsf(a[i] - b[i]));
    scale = fmaxf(scale, fabsf(b[i]));
  }
  return worst / scale;
}

/* The ToyModel and the MLP under bfloat16 and float16 autocast with DDP: the weights equal on
 * every rank, within the rounding of the split (each rank's weight gradient rounded to the
 * dtype before the all-reduce; tests/test_amp_parallel.c's split_tol) of the one-device
 * autocast run on the whole batch, and within test_autocast's bounds of the float32 run. */
static void test_autocast_tracks_one_device(void **state) {
  (void)state;
  static const float split_tol[2] = {4e-3f, 5e-4f}, track_tol[2] = {3e-2f, 2e-3f};
  float w32[MAX_PARAMS], w1[MAX_PARAMS], w[MAX_PARAMS];
  for (int toy = 1; toy >= 0; toy--) {
    int n = train_autocast(toy, CLPAR_FLOAT32, 0, w32);
    for (int k = 0; k < 2; k++) {
      clpar_dtype dt = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      assert_int_equal(train_autocast(toy, dt, 0, w1), n);
      assert_int_equal(train_autocast(toy, dt, 1, w), n);
      expect_same_on_every_rank(w, n, "parameters");
      float d1 = rel_diff(w, w1, n), d32 = rel_diff(w, w32, n);
      if (clpar_dist_rank() == 0)
        printf("# %s %s DDP: weights within %.3g of one device's, %.3g of float32's\n",
               toy ? "ToyModel" : "MLP", clpar_dtype_name(dt), (double)d1, (double)d32);
      if (d1 > split_tol[k] || d32 > track_tol[k])
        fail_msg("%s %s DDP: weights differ by %g from one device's, %g from float32's",
                 toy ? "ToyModel" : "MLP", clpar_dtype_name(dt), (double)d1, (double)d32);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_reduce_max),
      cmocka_unit_test(test_one_rank_nan_skips_every_rank),
      cmocka_unit_test(test_autocast_tracks_one_device),
  };
  return cmocka_run_group_tests_name("amp_ddp", tests, tu_dist_setup, tu_dist_teardown);
}
