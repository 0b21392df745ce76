/* test_amp_parallel.c — mixed precision in the parallel modes: the seeds' ToyModel
 * (Linear(10, 10), ReLU, Linear(10, 5)) and an MLP trained 5 steps under bfloat16 and float16
 * autocast with a GradScaler, on one device, under DataParallel on 2 devices and in the
 * pipeline on 2 devices (GPipe through clpar_module_forward, 1F1B through
 * clpar_pipeline_train_step). Each parallel run equals the one-device autocast run within
 * the rounding of its split (below), and every autocast run tracks the float32 run. Also: a
 * 16-bit activation feeding two ops (its gradients summed in float32). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/amp.h"
#include "clpar/master_weights.h"
#include "internal.h"
#include "test_util.h"

enum { BATCH = 24, STEPS = 5, OUT = 5, MAX_PARAMS = 2048 }; /* both models end in 5 outputs */

typedef enum { ONE, DP, GPIPE, ONE_F_ONE_B } mode;
static const char *mode_name[] = {"one device", "DataParallel", "pipeline GPipe", "pipeline 1F1B"};

typedef struct {
  int toy; /* the ToyModel, else the MLP */
  clpar_dtype dtype;
  mode mode;
  clpar_device *devs[2];
  int master; /* 16-bit parameters, float32 masters stepped (clpar_master_weights) */
} run_spec;

static int in_features(int toy) {
  return toy ? 10 : 16;
}

/* The model's layers, made in order under one seed (so every layout starts from the same
 * weights): all but the last on first, the last on last. */
static int make_layers(int toy, clpar_device *first, clpar_device *last, clpar_module **l) {
  clpar_manual_seed(toy ? 3 : 11);
  int n = 0;
  if (toy) {
    tu_ok(clpar_linear_create(10, 10, 1, first, &l[n++]));
    tu_ok(clpar_relu_create(&l[n++]));
    tu_ok(clpar_linear_create(10, 5, 1, last, &l[n++]));
  } else {
    tu_ok(clpar_linear_create(16, 32, 1, first, &l[n++]));
    tu_ok(clpar_relu_create(&l[n++]));
    tu_ok(clpar_linear_create(32, 32, 1, first, &l[n++]));
    tu_ok(clpar_relu_create(&l[n++]));
    tu_ok(clpar_linear_create(32, 5, 1, last, &l[n++]));
  }
  return n;
}

static clpar_module *make_model(const run_spec *r) {
  clpar_module *l[8], *m;
  int pipe = r->mode == GPIPE || r->mode == ONE_F_ONE_B;
  int n = make_layers(r->toy, r->devs[0], pipe ? r->devs[1] : r->devs[0], l);
  if (!pipe) {
    tu_ok(clpar_sequential_create(l, n, &m));
    if (r->mode == ONE) return m;
    clpar_module *dp;
    clpar_data_parallel_options o = {.devices = (clpar_device **)r->devs, .n_devices = 2};
    tu_ok(clpar_data_parallel_create(m, &o, &dp));
    return dp;
  }
  clpar_module *stages[2];
  tu_ok(clpar_sequential_create(l, n - 1, &stages[0]));
  stages[1] = l[n - 1];
  clpar_pipeline_options po = {
      .chunks = 4, .schedule = r->mode == GPIPE ? CLPAR_PIPELINE_GPIPE : CLPAR_PIPELINE_1F1B};
  tu_ok(clpar_pipeline_create(stages, r->devs, 2, &po, &m));
  return m;
}

/* MSE (mean), scaled by the GradScaler given as user. */
static clpar_status scaled_mse(clpar_tensor *out, clpar_tensor *target, int64_t first_row,
                               void *user, clpar_tensor **loss) {
  (void)first_row;
  if (clpar_tensor_dtype(out) != clpar_autocast_dtype()) /* the region reached the stage */
    fail_msg("output in %s inside a %s region", clpar_dtype_name(clpar_tensor_dtype(out)),
             clpar_dtype_name(clpar_autocast_dtype()));
  clpar_status s = clpar_mse_loss(out, target, CLPAR_REDUCTION_MEAN, loss);
  return s == CLPAR_OK ? clpar_grad_scaler_scale(user, *loss, loss) : s;
}

/* One step's forward and backward under r's autocast; the unscaled loss out. */
static void forward_backward(const run_spec *r, clpar_module *m, clpar_grad_scaler *gs,
                             clpar_tensor *x, clpar_tensor *y, float *loss_out) {
  clpar_tensor *out, *loss;
  if (r->dtype != CLPAR_FLOAT32) tu_ok(clpar_autocast_begin(r->dtype));
  if (r->mode == ONE_F_ONE_B) {
    tu_ok(clpar_pipeline_train_step(m, x, y, scaled_mse, gs, &loss));
  } else {
    tu_ok(clpar_module_forward(m, x, &out));
    assert_int_equal(clpar_tensor_dtype(out), r->dtype);
    tu_ok(scaled_mse(out, y, 0, gs, &loss));
  }
  if (r->dtype != CLPAR_FLOAT32) clpar_autocast_end();
  if (r->mode != ONE_F_ONE_B) tu_ok(clpar_backward(loss));
  tu_ok(clpar_tensor_read(loss, loss_out, 1));
  *loss_out /= clpar_grad_scaler_get_scale(gs);
}

/* The optimizer over m's parameters, or over float32 masters of them (r->master: *mw). */
static clpar_optimizer *make_optimizer(const run_spec *r, clpar_module *m,
                                       clpar_master_weights **mw) {
  clpar_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
  clpar_optimizer *o;
  *mw = NULL;
  if (!r->master) {
    tu_ok(clpar_sgd_create_for(m, &so, &o));
    return o;
  }
  tu_ok(clpar_master_weights_create(m, r->dtype, mw));
  clpar_tensor *masters[8];
  int n = clpar_master_weights_count(*mw);
  assert_true(n <= 8);
  for (int i = 0; i < n; i++) masters[i] = clpar_master_weights_at(*mw, i);
  tu_ok(clpar_sgd_create(masters, n, &so, &o));
  return o;
}

/* The float32 weights (the masters with r->master), concatenated; their count back. */
static int read_weights(const run_spec *r, clpar_module *m, clpar_master_weights *mw,
                        float *weights) {
  int at = 0, n = r->master ? clpar_master_weights_count(mw) : clpar_module_parameter_count(m);
  for (int i = 0; i < n; i++) {
    clpar_tensor *p = NULL;
    if (r->master)
      p = clpar_master_weights_at(mw, i);
    else
      tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    assert_int_equal(clpar_tensor_dtype(p), CLPAR_FLOAT32);
    tu_ok(clpar_tensor_read(p, weights + at, (size_t)(MAX_PARAMS - at)));
    at += (int)clpar_tensor_numel(p);
  }
  return at;
}

/* STEPS of SGD (lr 0.1, momentum 0.9) on fixed random batches; the losses and the weights
 * after (concatenated) out; returns the weights' count. */
static int train(const run_spec *r, float *losses, float *weights) {
  clpar_module *m = make_model(r);
  clpar_master_weights *mw;
  clpar_optimizer *o = make_optimizer(r, m, &mw);
  clpar_grad_scaler *gs;
  tu_ok(clpar_grad_scaler_create(NULL, &gs));
  clpar_device *last = r->mode == ONE || r->mode == DP ? r->devs[0] : r->devs[1];
  for (int t = 0; t < STEPS; t++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *y;
    tu_ok(clpar_tensor_rand_normal(r->devs[0], 2, (int64_t[]){BATCH, in_features(r->toy)},
                                   100 + (uint64_t)t, 0, 1, &x));
    tu_ok(clpar_tensor_rand_normal(last, 2, (int64_t[]){BATCH, OUT}, 200 + (uint64_t)t, 0, 1, &y));
    tu_ok(mw ? clpar_master_weights_zero_grad(mw) : clpar_optimizer_zero_grad(o));
    forward_backward(r, m, gs, x, y, &losses[t]);
    if (mw) tu_ok(clpar_master_weights_grads(mw));
    int skipped = -1;
    tu_ok(clpar_grad_scaler_step(gs, o, &skipped));
    assert_int_equal(skipped, 0);
    if (mw) tu_ok(clpar_master_weights_update(mw));
    tu_ok(clpar_grad_scaler_update(gs));
    clpar_scope_end(sc);
  }
  int at = read_weights(r, m, mw, weights);
  clpar_grad_scaler_free(gs);
  clpar_optimizer_free(o);
  clpar_master_weights_free(mw);
  clpar_module_free(m);
  return at;
}

/* The largest difference between a and b over the largest |b|. */
static float rel_diff(const float *a, const float *b, int n) {
  float worst = 0.0f, scale = 0.0f;
  for (int i = 0; i < n; i++) {
    worst = fmaxf(worst, fabsf(a[i] - b[i]));
    scale = fmaxf(scale, fabsf(b[i]));
  }
  return worst / scale;
}

/* The tolerances, relative to the largest weight (or loss). A parallel run differs from the
 * one-device autocast run only in where 16-bit roundings fall: each replica's (or
 * micro-batch's) weight gradient is rounded to the dtype (relative 2^-9 for bfloat16, 2^-12
 * for float16) before the float32 sum, where one device rounds the whole batch's; the rows'
 * forwards are the same. Over 5 SGD steps with momentum 0.9 (a gradient counts up to 4.1
 * times in the weights) that stays below 4 gradient roundings of lr * |g|: split_tol.
 * Against float32, every activation and weight copy is rounded as well: track_tol, the
 * bounds of test_autocast's MLP. With 16-bit parameters (masters) each micro-batch's gradient
 * is added into a 16-bit gradient, rounded after each of the 4 adds: twice split_tol. */
static const float split_tol[2] = {4e-3f, 5e-4f}, track_tol[2] = {3e-2f, 2e-3f};

static void compare(const char *what, const run_spec *r, const float *lw, const float *w,
                    const float *lref, const float *wref, int n, float tol) {
  float dw = rel_diff(w, wref, n), dl = rel_diff(lw, lref, STEPS);
  printf("# %s %s %s%s vs %s: weights within %.3g, losses within %.3g (tolerance %.3g)\n",
         r->toy ? "ToyModel" : "MLP", clpar_dtype_name(r->dtype), mode_name[r->mode],
         r->master ? " masters" : "", what, (double)dw, (double)dl, (double)tol);
  if (dw > tol || dl > tol)
    fail_msg("%s %s %s: weights differ from %s by %g, losses by %g (largest), tolerance %g",
             r->toy ? "ToyModel" : "MLP", clpar_dtype_name(r->dtype), mode_name[r->mode], what,
             (double)dw, (double)dl, (double)tol);
}

static void test_parallel_modes(void **state) {
  (void)state;
  clpar_device *d0 = clpar_device_get(clpar_device_count() - 1), *d1 = tu_second_device(d0);
  if (!d1) skip();
  float *w32 = malloc(MAX_PARAMS * sizeof *w32), *w1 = malloc(MAX_PARAMS * sizeof *w1);
  float *w = malloc(MAX_PARAMS * sizeof *w);
  for (int toy = 1; toy >= 0; toy--) {
    float l32[STEPS], l1[STEPS], l[STEPS];
    run_spec r = {toy, CLPAR_FLOAT32, ONE, {d0, d1}, 0};
    int n = train(&r, l32, w32);
    for (int k = 0; k < 2; k++) {
      r.dtype = k ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      r.mode = ONE;
      assert_int_equal(train(&r, l1, w1), n);
      compare("float32", &r, l1, w1, l32, w32, n, track_tol[k]);
      for (mode md = DP; md <= ONE_F_ONE_B; md++) {
        r.mode = md;
        assert_int_equal(train(&r, l, w), n);
        compare("one device", &r, l, w, l1, w1, n, split_tol[k]);
        compare("float32", &r, l, w, l32, w32, n, track_tol[k]);
        assert_true(l[STEPS - 1] < l[0]);
      }
      r.master = 1; /* the pipeline with 16-bit parameters and float32 masters */
      r.mode = ONE;
      assert_int_equal(train(&r, l1, w1), n);
      compare("float32", &r, l1, w1, l32, w32, n, track_tol[k]);
      for (mode md = GPIPE; md <= ONE_F_ONE_B; md++) {
        r.mode = md;
        assert_int_equal(train(&r, l, w), n);
        compare("one device", &r, l, w, l1, w1, n, 2 * split_tol[k]);
      }
      r.master = 0;
    }
  }
  free(w32), free(w1), free(w);
}

/* h = Linear(x) in the autocast dtype feeds two Linear heads whose losses add: h's node gets
 * two 16-bit gradients, summed in float32 and rounded to the dtype. The first layer's weight
 * gradient tracks the float32 one within 2e-2 of its largest element (two roundings of the
 * dtype on the way: ample for bfloat16's 2^-9). */
static void two_heads(clpar_device *dev, clpar_dtype dtype, float *grad) {
  clpar_module *l[3];
  clpar_manual_seed(5);
  tu_ok(clpar_linear_create(8, 6, 1, dev, &l[0]));
  tu_ok(clpar_linear_create(6, 3, 1, dev, &l[1]));
  tu_ok(clpar_linear_create(6, 4, 1, dev, &l[2]));
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){7, 8}, 1),
               *ya = tu_make(dev, 2, (int64_t[]){7, 3}, 2);
  clpar_tensor *yb = tu_make(dev, 2, (int64_t[]){7, 4}, 3), *h, *a, *b, *la, *lb, *loss, *p;
  if (dtype != CLPAR_FLOAT32) tu_ok(clpar_autocast_begin(dtype));
  tu_ok(clpar_module_forward(l[0], x, &h));
  assert_int_equal(clpar_tensor_dtype(h), dtype);
  tu_ok(clpar_module_forward(l[1], h, &a));
  tu_ok(clpar_module_forward(l[2], h, &b));
  tu_ok(clpar_mse_loss(a, ya, CLPAR_REDUCTION_MEAN, &la));
  tu_ok(clpar_mse_loss(b, yb, CLPAR_REDUCTION_MEAN, &lb));
  if (dtype != CLPAR_FLOAT32) clpar_autocast_end();
  tu_ok(clpar_add(la, lb, &loss));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_module_parameter_at(l[0], 0, NULL, &p));
  tu_ok(clpar_tensor_read(clpar_tensor_grad(p), grad, 48));
  clpar_scope_end(sc);
  for (int i = 0; i < 3; i++) clpar_module_free(l[i]);
}

/* A residual block under autocast: h = Linear(x) feeds both Linear r and the sum h + r (a
 * 16-bit add, computed in float32), which feeds the last Linear. The first layer's weight
 * gradient tracks float32's within 2e-2 of its largest element. */
static void residual(clpar_device *dev, clpar_dtype dtype, float *grad) {
  clpar_module *l[3];
  clpar_manual_seed(6);
  tu_ok(clpar_linear_create(8, 6, 1, dev, &l[0]));
  tu_ok(clpar_linear_create(6, 6, 1, dev, &l[1]));
  tu_ok(clpar_linear_create(6, 4, 1, dev, &l[2]));
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){7, 8}, 1),
               *t = tu_make(dev, 2, (int64_t[]){7, 4}, 2);
  clpar_tensor *h, *r, *y, *out, *loss, *p;
  if (dtype != CLPAR_FLOAT32) tu_ok(clpar_autocast_begin(dtype));
  tu_ok(clpar_module_forward(l[0], x, &h));
  tu_ok(clpar_module_forward(l[1], h, &r));
  tu_ok(clpar_add(h, r, &y));
  assert_int_equal(clpar_tensor_dtype(y), dtype);
  tu_ok(clpar_module_forward(l[2], y, &out));
  tu_ok(clpar_mse_loss(out, t, CLPAR_REDUCTION_MEAN, &loss));
  if (dtype != CLPAR_FLOAT32) clpar_autocast_end();
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_module_parameter_at(l[0], 0, NULL, &p));
  tu_ok(clpar_tensor_read(clpar_tensor_grad(p), grad, 48));
  clpar_scope_end(sc);
  for (int i = 0; i < 3; i++) clpar_module_free(l[i]);
}

static void test_activation_with_two_consumers(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    float g32[48], g[48];
    for (int c = 0; c < 4; c++) {
      void (*run)(clpar_device *, clpar_dtype, float *) = c < 2 ? two_heads : residual;
      run(dev, CLPAR_FLOAT32, g32);
      clpar_dtype dt = c % 2 ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
      run(dev, dt, g);
      float diff = rel_diff(g, g32, 48);
      printf("# %s %s %s: first weight's gradient within %.3g of float32's\n",
             c < 2 ? "two heads" : "residual", clpar_device_id(dev), clpar_dtype_name(dt),
             (double)diff);
      if (diff > 2e-2f)
        fail_msg("%s %s: gradient differs by %g", clpar_device_id(dev), clpar_dtype_name(dt),
                 (double)diff);
    }
  }
}

/* 16-bit parameters (clpar_master_weights) cannot go into flat groups, whose buffers are
 * float32: clpar_module_flatten, and so DataParallel (and DDP, which flattens the same way),
 * refuse them naming the parameter; autocast with float32 parameters is the way there. */
static void test_master_weights_refused_by_flat_groups(void **state) {
  (void)state;
  clpar_device *d0 = clpar_device_get(clpar_device_count() - 1), *d1 = tu_second_device(d0);
  clpar_module *l[8], *m, *dp = NULL;
  int n = make_layers(1, d0, d0, l);
  tu_ok(clpar_sequential_create(l, n, &m));
  clpar_master_weights *mw;
  tu_ok(clpar_master_weights_create(m, CLPAR_BFLOAT16, &mw));
  assert_int_equal(clpar_module_flatten(m), CLPAR_ERROR_DTYPE);
  assert_non_null(
      strstr(clpar_last_error(), "clpar_module_flatten: parameter \"0.weight\" is bfloat16"));
  clpar_tensor *p;
  tu_ok(clpar_module_parameter_at(m, 0, NULL, &p));
  assert_int_equal(clpar_tensor_dtype(p), CLPAR_BFLOAT16); /* left as it was */
  if (d1) {
    clpar_device *devs[2] = {d0, d1};
    clpar_data_parallel_options o = {.devices = devs, .n_devices = 2};
    assert_int_equal(clpar_data_parallel_create(m, &o, &dp), CLPAR_ERROR_DTYPE); /* frees m */
    assert_non_null(strstr(clpar_last_error(), "clpar_autocast_begin"));
  } else {
    clpar_module_free(m);
  }
  clpar_master_weights_free(mw);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_activation_with_two_consumers),
      cmocka_unit_test(test_parallel_modes),
      cmocka_unit_test(test_master_weights_refused_by_flat_groups),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
