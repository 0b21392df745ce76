/* test_amp.c — the loss scaler (amp.h) against PyTorch's GradScaler: the scale and growth
 * tracker after sequences of clean and inf/NaN steps (tests/reference/grad_scaler_ref.h), a
 * skipped step leaving parameters and optimizer state untouched, backoff and regrowth,
 * scaled training equal to unscaled training, unscale before clipping, the inf/NaN check over
 * gradients larger than one chunk and over flat groups, and the state in a checkpoint. Every
 * device run is checked on the host backend and on each selected device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clpar/amp.h"
#include "internal.h"
#include "io/safetensors.h"
#include "reference/grad_scaler_ref.h"
#include "test_util.h"

enum { MLP_PARAMS = 23 };

/* The devices to run on: the host reference and every selected device. */
static int device_count(void) {
  return clpar_device_count() + 1;
}
static clpar_device *device_at(int d) {
  return d == 0 ? tu_host() : clpar_device_get(d - 1);
}

static void mlp_batch(clpar_device *dev, clpar_tensor **x, clpar_tensor **y) {
  float xv[20], yv[10];
  for (int i = 0; i < 20; i++) xv[i] = 2 * tu_parity_value(i + 1, 9, 17);
  for (int i = 0; i < 10; i++) yv[i] = tu_parity_value(i + 1, 5, 19);
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){5, 4}, xv, x));
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){5, 2}, yv, y));
}

/* zero_grad, forward, MSE, backward of the loss scaled by s (s NULL: unscaled). */
static void forward_backward(clpar_module *m, clpar_optimizer *o, clpar_grad_scaler *s,
                             clpar_tensor *x, clpar_tensor *y) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *out, *loss;
  tu_ok(clpar_optimizer_zero_grad(o));
  tu_ok(clpar_module_forward(m, x, &out));
  tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
  if (s) tu_ok(clpar_grad_scaler_scale(s, loss, &loss));
  tu_ok(clpar_backward(loss));
  clpar_scope_end(sc);
}

static void read_params(clpar_module *m, float *out) {
  int at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, out + at, (size_t)(MLP_PARAMS - at)));
    at += (int)clpar_tensor_numel(p);
  }
  assert_int_equal(at, MLP_PARAMS);
}

/* Element i of p's gradient set to v (an injected inf or NaN). */
static void poke_grad(clpar_tensor *p, int64_t i, float v) {
  clpar_tensor *g = clpar_tensor_grad(p);
  assert_non_null(g);
  float *h = tu_read(g);
  h[i] = v;
  tu_ok(clpar_tensor_write(g, h, (size_t)clpar_tensor_numel(g)));
  free(h);
}

static void expect_state(const clpar_grad_scaler *s, float scale, int64_t tracker, const char *what,
                         int step) {
  clpar_grad_scaler_state st;
  tu_ok(clpar_grad_scaler_state_get(s, &st));
  if (st.scale != scale || st.growth_tracker != tracker)
    fail_msg("%s, after update %d: scale %.9g tracker %lld; PyTorch: %.9g, %lld", what, step,
             (double)st.scale, (long long)st.growth_tracker, (double)scale, (long long)tracker);
}

static void test_defaults_are_pytorch(void **state) {
  (void)state;
  clpar_grad_scaler *s;
  clpar_grad_scaler_state st;
  tu_ok(clpar_grad_scaler_create(NULL, &s));
  tu_ok(clpar_grad_scaler_state_get(s, &st));
  assert_true(st.scale == 65536.0f && st.growth_factor == 2.0 && st.backoff_factor == 0.5);
  assert_true(st.growth_interval == 2000 && st.growth_tracker == 0);
  assert_true(clpar_grad_scaler_is_enabled(s));
  clpar_grad_scaler_free(s);
  const grad_scaler_case *c = &grad_scaler_cases[0]; /* PyTorch's defaults, from PyTorch */
  tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){0}, &s));
  tu_ok(clpar_grad_scaler_state_get(s, &st));
  assert_true(st.scale == (float)c->init_scale && st.growth_factor == c->growth_factor);
  assert_true(st.backoff_factor == c->backoff_factor && st.growth_interval == c->growth_interval);
  clpar_grad_scaler_free(s);
  struct {
    clpar_grad_scaler_options o;
    const char *field;
  } bad[] = {{{.growth_factor = 1.0}, "growth_factor"},
             {{.growth_factor = 0.5}, "growth_factor"},
             {{.backoff_factor = 1.0}, "backoff_factor"},
             {{.backoff_factor = CLPAR_ZERO}, "backoff_factor"},
             {{.init_scale = -1.0}, "init_scale"},
             {{.init_scale = 1e39}, "init_scale"},
             {{.init_scale = NAN}, "init_scale"},
             {{.growth_interval = -3}, "growth_interval"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    s = (clpar_grad_scaler *)&st;
    assert_int_equal(clpar_grad_scaler_create(&bad[i].o, &s), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_null(s);
    if (!strstr(clpar_last_error(), bad[i].field))
      fail_msg("case %zu: \"%s\" does not name %s", i, clpar_last_error(), bad[i].field);
  }
}

/* One parameter of 3 elements whose gradient is written each step: finite, or with an inf,
 * a -inf or a NaN; the scale and tracker after each update against PyTorch's. */
static void run_case(clpar_device *dev, const grad_scaler_case *c) {
  clpar_tensor *w;
  int64_t three = 3;
  tu_ok(clpar_tensor_zeros(dev, 1, &three, &w));
  tu_ok(clpar_tensor_set_requires_grad(w, 1));
  clpar_optimizer *o;
  tu_ok(clpar_sgd_create(&w, 1, &(clpar_sgd_options){.lr = 0.5f}, &o));
  clpar_grad_scaler *s;
  clpar_grad_scaler_options opt = {c->init_scale, c->growth_factor, c->backoff_factor,
                                   c->growth_interval, 0};
  tu_ok(clpar_grad_scaler_create(&opt, &s));
  const float bad[3] = {INFINITY, -INFINITY, NAN};
  for (int t = 0; t < c->n; t++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *loss, *scaled;
    tu_ok(clpar_optimizer_zero_grad(o));
    tu_ok(clpar_sum_rows(w, &loss));
    tu_ok(clpar_grad_scaler_scale(s, loss, &scaled));
    tu_ok(clpar_backward(scaled)); /* gradient: the scale in every element */
    if (c->found[t]) poke_grad(w, t % 3, bad[t % 3]);
    float before[3], after[3], g[3];
    tu_ok(clpar_tensor_read(w, before, 3));
    int skipped = -1;
    tu_ok(clpar_grad_scaler_step(s, o, &skipped));
    assert_int_equal(skipped, c->found[t]);
    tu_ok(clpar_tensor_read(w, after, 3));
    tu_ok(clpar_tensor_read(clpar_tensor_grad(w), g, 3));
    float used = t ? c->scale[t - 1] : (float)c->init_scale;
    float want = used * (float)(1.0 / (double)used); /* PyTorch's inverse, in double */
    for (int i = 0; i < 3 && !c->found[t]; i++) {
      if (g[i] != want)
        fail_msg("%s %s step %d: gradient %.9g, not %.9g", clpar_device_id(dev), c->name, t,
                 (double)g[i], (double)want);
      float step = before[i] - 0.5f * want;
      tu_assert_close(&after[i], &step, 1, 1e-6f, 0.0f, "SGD step after unscale");
    }
    if (c->found[t]) assert_memory_equal(before, after, sizeof before);
    tu_ok(clpar_grad_scaler_update(s));
    expect_state(s, c->scale[t], c->tracker[t], c->name, t);
    clpar_scope_end(sc);
  }
  clpar_grad_scaler_state st;
  tu_ok(clpar_grad_scaler_state_get(s, &st));
  assert_true(st.scale == c->sd_scale && st.growth_factor == c->sd_growth_factor);
  assert_true(st.backoff_factor == c->sd_backoff_factor);
  assert_true(st.growth_interval == c->sd_growth_interval);
  assert_true(st.growth_tracker == c->sd_growth_tracker);
  clpar_grad_scaler_free(s);
  clpar_optimizer_free(o);
  clpar_tensor_free(w);
}

static void test_scale_sequence_matches_pytorch(void **state) {
  (void)state;
  for (int d = 0; d < device_count(); d++)
    for (int k = 0; k < GRAD_SCALER_CASES; k++) run_case(device_at(d), &grad_scaler_cases[k]);
}

/* The optimizer's parameters and state as host floats (Adam: m and v of each), and the
 * parameters' step counts. */
typedef struct {
  float v[3 * MLP_PARAMS];
  int64_t steps[4];
} snapshot;

static void take(const clpar_optimizer *o, snapshot *sn) {
  memset(sn, 0, sizeof *sn);
  int at = 0;
  for (int i = 0; i < clpar_optimizer_size(o); i++) {
    const clpar_tensor *p = clpar_optimizer_param_at(o, i);
    size_t n = (size_t)clpar_tensor_numel(p);
    tu_ok(clpar_tensor_read(p, sn->v + at, n));
    for (int k = 0; k < 2; k++) {
      const clpar_tensor *st = clpar_optimizer_state_at(o, i, k);
      assert_non_null(st);
      tu_ok(clpar_tensor_read(st, sn->v + MLP_PARAMS * (k + 1) + at, n));
    }
    sn->steps[i] = clpar_optimizer_steps_at(o, i);
    at += (int)n;
  }
}

/* Adam on the MLP (flat or not): two clean steps, then a step with an inf and one with a NaN
 * in a gradient (skipped: parameters, moments and step counts unchanged, scale halved each
 * time), then clean steps regrow the scale after growth_interval (3) of them. */
static void check_skip(clpar_device *dev, int flat, int poke_param) {
  clpar_module *m = tu_parity_mlp(dev);
  if (flat) tu_ok(clpar_module_flatten(m));
  clpar_optimizer *o;
  tu_ok(clpar_adam_create_for(m, &(clpar_adam_options){.lr = 0.01f}, &o));
  clpar_grad_scaler *s;
  tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.growth_interval = 3}, &s));
  clpar_tensor *x, *y, *p;
  mlp_batch(dev, &x, &y);
  tu_ok(clpar_module_parameter_at(m, poke_param, NULL, &p));
  float want_scale[] = {65536, 65536, 32768, 16384, 16384, 16384, 32768, 32768};
  const float poke[] = {0, 0, INFINITY, NAN, 0, 0, 0, 0};
  for (int t = 0; t < 8; t++) {
    forward_backward(m, o, s, x, y);
    if (poke[t] != 0.0f) poke_grad(p, clpar_tensor_numel(p) - 1, poke[t]);
    snapshot before, after;
    if (t >= 2) take(o, &before);
    int skipped = -1;
    tu_ok(clpar_grad_scaler_step(s, o, &skipped));
    assert_int_equal(skipped, poke[t] != 0.0f);
    if (t >= 2) take(o, &after);
    if (skipped) assert_memory_equal(&before, &after, sizeof before);
    if (t >= 2 && !skipped) assert_true(memcmp(before.v, after.v, sizeof before.v) != 0);
    tu_ok(clpar_grad_scaler_update(s));
    if (clpar_grad_scaler_get_scale(s) != want_scale[t])
      fail_msg("%s%s, step %d: scale %g, expected %g", clpar_device_id(dev), flat ? " (flat)" : "",
               t, (double)clpar_grad_scaler_get_scale(s), (double)want_scale[t]);
  }
  clpar_tensor_free(x);
  clpar_tensor_free(y);
  clpar_grad_scaler_free(s);
  clpar_optimizer_free(o);
  clpar_module_free(m);
}

static void test_skipped_step_changes_nothing(void **state) {
  (void)state;
  for (int d = 0; d < device_count(); d++)
    for (int flat = 0; flat < 2; flat++) {
      check_skip(device_at(d), flat, 0);
      check_skip(device_at(d), flat, 3);
    }
}

/* steps of SGD with momentum on the MLP, the loss scaled by s or not; parameters out. */
static void train(clpar_device *dev, clpar_grad_scaler *s, int steps, float *params) {
  clpar_module *m = tu_parity_mlp(dev);
  clpar_optimizer *o;
  tu_ok(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.1f, .momentum = 0.9f}, &o));
  clpar_tensor *x, *y;
  mlp_batch(dev, &x, &y);
  for (int t = 0; t < steps; t++) {
    forward_backward(m, o, s, x, y);
    if (!s) {
      tu_ok(clpar_optimizer_step(o));
      continue;
    }
    int skipped = -1;
    tu_ok(clpar_grad_scaler_step(s, o, &skipped));
    assert_int_equal(skipped, 0);
    tu_ok(clpar_grad_scaler_update(s));
  }
  read_params(m, params);
  clpar_tensor_free(x);
  clpar_tensor_free(y);
  clpar_optimizer_free(o);
  clpar_module_free(m);
}

static void test_scaled_training_matches_unscaled(void **state) {
  (void)state;
  for (int d = 0; d < device_count(); d++) {
    clpar_device *dev = device_at(d);
    float plain[MLP_PARAMS], scaled[MLP_PARAMS];
    train(dev, NULL, 6, plain);
    /* a power of 2 (with growth at steps 2 and 4) scales exactly: the same bits */
    clpar_grad_scaler *s;
    tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.growth_interval = 2}, &s));
    train(dev, s, 6, scaled);
    assert_true(clpar_grad_scaler_get_scale(s) == 524288.0f);
    tu_assert_close(scaled, plain, MLP_PARAMS, 0.0f, 0.0f, "scaled by 2^16..2^19");
    clpar_grad_scaler_free(s);
    /* another scale rounds each gradient: within float rounding */
    tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.init_scale = 1000.0}, &s));
    train(dev, s, 6, scaled);
    tu_assert_close(scaled, plain, MLP_PARAMS, 1e-5f, 1e-6f, "scaled by 1000");
    clpar_grad_scaler_free(s);
  }
}

/* unscale, clip_grad_norm, step gives what clipping the unscaled gradients gives; and the
 * order of the calls is checked as PyTorch does. */
static void test_unscale_then_clip(void **state) {
  (void)state;
  for (int d = 0; d < device_count(); d++) {
    clpar_device *dev = device_at(d);
    float got[2][MLP_PARAMS], norms[2];
    for (int scaled = 0; scaled < 2; scaled++) {
      clpar_module *m = tu_parity_mlp(dev);
      clpar_optimizer *o;
      tu_ok(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.1f}, &o));
      clpar_grad_scaler *s;
      tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.disabled = !scaled}, &s));
      clpar_tensor *x, *y, *norm;
      mlp_batch(dev, &x, &y);
      forward_backward(m, o, s, x, y);
      tu_ok(clpar_grad_scaler_unscale(s, o));
      if (scaled) {
        assert_int_equal(clpar_grad_scaler_unscale(s, o), CLPAR_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(clpar_last_error(), "already called"));
      }
      tu_ok(clpar_clip_grad_norm_module(m, 0.05f, &norm));
      tu_ok(clpar_tensor_read(norm, &norms[scaled], 1));
      tu_ok(clpar_grad_scaler_step(s, o, NULL));
      if (scaled) {
        assert_int_equal(clpar_grad_scaler_step(s, o, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
        assert_int_equal(clpar_grad_scaler_unscale(s, o), CLPAR_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(clpar_last_error(), "after the step"));
      }
      tu_ok(clpar_grad_scaler_update(s));
      if (scaled) {
        assert_int_equal(clpar_grad_scaler_update(s), CLPAR_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(clpar_last_error(), "clpar_grad_scaler_update"));
      }
      read_params(m, got[scaled]);
      clpar_tensor_free(norm);
      clpar_tensor_free(x);
      clpar_tensor_free(y);
      clpar_grad_scaler_free(s);
      clpar_optimizer_free(o);
      clpar_module_free(m);
    }
    assert_true(norms[0] > 0.05f);
    tu_assert_close(&norms[1], &norms[0], 1, 0.0f, 0.0f, "the norm of unscaled gradients");
    tu_assert_close(got[1], got[0], MLP_PARAMS, 0.0f, 0.0f, "clipped after unscale");
  }
}

/* Two optimizers sharing a scaler (PyTorch's several-optimizer loop): an inf in one's
 * gradients skips that one's step only, and the update backs off. */
static void test_two_optimizers(void **state) {
  (void)state;
  for (int d = 0; d < device_count(); d++) {
    clpar_tensor *w[2];
    clpar_optimizer *o[2];
    int64_t four = 4;
    for (int k = 0; k < 2; k++) {
      tu_ok(clpar_tensor_zeros(device_at(d), 1, &four, &w[k]));
      tu_ok(clpar_tensor_set_requires_grad(w[k], 1));
      tu_ok(clpar_sgd_create(&w[k], 1, &(clpar_sgd_options){.lr = 1.0f}, &o[k]));
    }
    clpar_grad_scaler *s;
    tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.growth_interval = 1}, &s));
    for (int t = 0; t < 3; t++) {
      clpar_scope *sc = clpar_scope_begin();
      for (int k = 0; k < 2; k++) {
        clpar_tensor *loss;
        tu_ok(clpar_optimizer_zero_grad(o[k]));
        tu_ok(clpar_sum_rows(w[k], &loss));
        tu_ok(clpar_grad_scaler_scale(s, loss, &loss));
        tu_ok(clpar_backward(loss));
      }
      if (t == 1) poke_grad(w[1], 2, INFINITY);
      for (int k = 0; k < 2; k++) {
        int skipped = -1;
        tu_ok(clpar_grad_scaler_step(s, o[k], &skipped));
        assert_int_equal(skipped, t == 1 && k == 1);
      }
      tu_ok(clpar_grad_scaler_update(s));
      clpar_scope_end(sc);
    }
    /* grown at step 0, backed off at 1, grown at 2 */
    assert_true(clpar_grad_scaler_get_scale(s) == 131072.0f);
    float v[2][4];
    for (int k = 0; k < 2; k++) tu_ok(clpar_tensor_read(w[k], v[k], 4));
    assert_true(v[0][0] == -3.0f && v[1][0] == -2.0f);
    clpar_grad_scaler_free(s);
    for (int k = 0; k < 2; k++) {
      clpar_optimizer_free(o[k]);
      clpar_tensor_free(w[k]);
    }
  }
}

/* One scaler over optimizers of 1, 3 and again 1 parameters (its work arrays grow, then are
 * reused): an inf in the 3-parameter one's last gradient skips that step only. */
static void test_optimizers_of_other_sizes(void **state) {
  (void)state;
  int64_t two = 2;
  clpar_tensor *w[3];
  for (int k = 0; k < 3; k++) {
    tu_ok(clpar_tensor_zeros(device_at(0), 1, &two, &w[k]));
    tu_ok(clpar_tensor_set_requires_grad(w[k], 1));
  }
  clpar_grad_scaler *s;
  tu_ok(clpar_grad_scaler_create(NULL, &s));
  for (int t = 0; t < 3; t++) {
    int n = t == 1 ? 3 : 1, skipped = -1;
    clpar_optimizer *o;
    tu_ok(clpar_sgd_create(w, n, &(clpar_sgd_options){.lr = 1.0f}, &o));
    clpar_scope *sc = clpar_scope_begin();
    tu_ok(clpar_optimizer_zero_grad(o));
    for (int k = 0; k < n; k++) {
      clpar_tensor *loss;
      tu_ok(clpar_sum_rows(w[k], &loss));
      tu_ok(clpar_grad_scaler_scale(s, loss, &loss));
      tu_ok(clpar_backward(loss));
    }
    if (t == 1) poke_grad(w[2], 1, NAN);
    tu_ok(clpar_grad_scaler_step(s, o, &skipped));
    assert_int_equal(skipped, t == 1);
    tu_ok(clpar_grad_scaler_update(s));
    clpar_scope_end(sc);
    clpar_optimizer_free(o);
  }
  float v[3][2];
  for (int k = 0; k < 3; k++) tu_ok(clpar_tensor_read(w[k], v[k], 2));
  assert_true(v[0][0] == -2.0f && v[1][0] == 0.0f && v[2][0] == 0.0f);
  clpar_grad_scaler_free(s);
  for (int k = 0; k < 3; k++) clpar_tensor_free(w[k]);
}

/* One gradient of more than one chunk (2^20 elements are checked at a time): an inf or a NaN
 * in the first chunk, in the last element, or none; finite values near FLT_MAX, whose sum
 * would overflow, are not an inf. */
static void test_check_spans_chunks(void **state) {
  (void)state;
  const int64_t n = ((int64_t)1 << 20) + 5;
  float *g = malloc((size_t)n * sizeof *g), *back = malloc((size_t)n * sizeof *back);
  assert_true(g && back);
  for (int d = 0; d < device_count(); d++) {
    clpar_tensor *w;
    tu_ok(clpar_tensor_zeros(device_at(d), 1, &n, &w));
    tu_ok(clpar_tensor_set_requires_grad(w, 1));
    clpar_optimizer *o;
    tu_ok(clpar_sgd_create(&w, 1, NULL, &o));
    struct {
      int64_t at;
      float v;
      int found;
    } cases[] = {{7, NAN, 1}, {n - 1, INFINITY, 1}, {n - 1, -INFINITY, 1}, {-1, 0, 0}};
    for (int k = 0; k < 4; k++) {
      clpar_grad_scaler *s;
      tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.init_scale = 0.5}, &s));
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *loss;
      tu_ok(clpar_optimizer_zero_grad(o));
      tu_ok(clpar_sum_rows(w, &loss));
      tu_ok(clpar_backward(loss)); /* makes the gradient, then overwritten */
      for (int64_t i = 0; i < n; i++) g[i] = 3e38f;
      if (cases[k].at >= 0) g[cases[k].at] = cases[k].v;
      tu_ok(clpar_tensor_write(clpar_tensor_grad(w), g, (size_t)n));
      int skipped = -1;
      tu_ok(clpar_grad_scaler_unscale(s, o));
      tu_ok(clpar_tensor_read(clpar_tensor_grad(w), back, (size_t)n));
      tu_ok(clpar_grad_scaler_step(s, o, &skipped));
      if (skipped != cases[k].found)
        fail_msg("%s, case %d: skipped %d", clpar_device_id(device_at(d)), k, skipped);
      /* unscaled by 1 / 0.5: the finite ones overflow to inf, as PyTorch's would */
      assert_true(isinf(back[0]) || cases[k].at == 0);
      assert_true(back[n - 2] == INFINITY);
      clpar_scope_end(sc);
      clpar_grad_scaler_free(s);
    }
    clpar_optimizer_free(o);
    clpar_tensor_free(w);
  }
  free(g);
  free(back);
}

/* A disabled scaler is the plain loop: scale 1, the optimizer's step, no state. */
static void test_disabled_is_plain(void **state) {
  (void)state;
  clpar_grad_scaler *s;
  tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.disabled = 1}, &s));
  assert_false(clpar_grad_scaler_is_enabled(s));
  assert_true(clpar_grad_scaler_get_scale(s) == 1.0f);
  clpar_grad_scaler_state st = {0};
  assert_int_equal(clpar_grad_scaler_state_get(s, &st), CLPAR_ERROR_INVALID_ARGUMENT);
  tu_ok(clpar_grad_scaler_state_set(s, &st)); /* a no-op, as PyTorch's */
  float plain[MLP_PARAMS], off[MLP_PARAMS];
  train(tu_host(), NULL, 3, plain);
  train(tu_host(), s, 3, off);
  assert_memory_equal(plain, off, sizeof plain);
  clpar_grad_scaler_free(s);
}

/* DataParallel over two devices: the wrapper's gradients are the reduced ones on the first
 * device; scaled training equals unscaled, and an inf there skips the step. */
static void test_data_parallel(void **state) {
  (void)state;
  clpar_device *devs[2] = {device_at(device_count() - 1), NULL};
  devs[1] = tu_second_device(devs[0]);
  if (!devs[1]) skip();
  float got[2][MLP_PARAMS];
  for (int scaled = 0; scaled < 2; scaled++) {
    clpar_module *dp;
    clpar_data_parallel_options dpo = {.devices = devs, .n_devices = 2};
    tu_ok(clpar_data_parallel_create(tu_parity_mlp(devs[0]), &dpo, &dp));
    clpar_optimizer *o;
    tu_ok(clpar_sgd_create_for(dp, &(clpar_sgd_options){.lr = 0.1f, .momentum = 0.9f}, &o));
    clpar_grad_scaler *s;
    tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.disabled = !scaled}, &s));
    clpar_tensor *x, *y, *p;
    mlp_batch(devs[0], &x, &y);
    tu_ok(clpar_module_parameter_at(dp, 2, NULL, &p));
    for (int t = 0; t < 4; t++) {
      forward_backward(dp, o, s, x, y);
      if (t == 2 && !scaled) continue; /* the plain run leaves out the step the other skips */
      if (t == 2) poke_grad(p, 0, NAN);
      int skipped = -1;
      tu_ok(clpar_grad_scaler_step(s, o, &skipped));
      assert_int_equal(skipped, t == 2 && scaled);
      tu_ok(clpar_grad_scaler_update(s));
    }
    if (scaled) assert_true(clpar_grad_scaler_get_scale(s) == 32768.0f);
    read_params(dp, got[scaled]);
    clpar_tensor_free(x);
    clpar_tensor_free(y);
    clpar_grad_scaler_free(s);
    clpar_optimizer_free(o);
    clpar_module_free(dp);
  }
  tu_assert_close(got[1], got[0], MLP_PARAMS, 0.0f, 0.0f, "DataParallel, scaled by 2^16");
}

/* The ToyModel over two devices (net1 on one, net2 on the other): each device's gradients
 * are checked there. Scaled training equals unscaled; an inf in net2's gradient alone, or a
 * NaN in net1's alone, skips the step. */
static void toy_run(tu_toy_devices *d, clpar_grad_scaler *s, const int *poke, float *weights) {
  clpar_module *m = tu_toy_create(d, 3);
  clpar_optimizer *o;
  tu_ok(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.05f}, &o));
  for (int t = 0; t < 5; t++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *labels, *y, *loss, *p;
    tu_ok(clpar_tensor_rand_normal(d->dev0, 2, (int64_t[]){20, 10}, 100 + (uint64_t)t, 0, 1, &x));
    tu_ok(
        clpar_tensor_rand_normal(d->dev1, 2, (int64_t[]){20, 5}, 200 + (uint64_t)t, 0, 1, &labels));
    tu_ok(clpar_optimizer_zero_grad(o));
    tu_ok(clpar_module_forward(m, x, &y));
    tu_ok(clpar_mse_loss(y, labels, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_grad_scaler_scale(s, loss, &loss));
    tu_ok(clpar_backward(loss));
    if (poke[t]) { /* 1: net1.weight (dev0) gets a NaN, 2: net2.bias (dev1) an inf */
      tu_ok(clpar_module_parameter_at(m, poke[t] == 1 ? 0 : 3, NULL, &p));
      poke_grad(p, 1, poke[t] == 1 ? NAN : INFINITY);
    }
    int skipped = -1;
    tu_ok(clpar_grad_scaler_step(s, o, &skipped));
    assert_int_equal(skipped, clpar_grad_scaler_is_enabled(s) && poke[t] != 0);
    tu_ok(clpar_grad_scaler_update(s));
    clpar_scope_end(sc);
  }
  size_t at = 0;
  for (int i = 0; i < 4; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, weights + at, 165 - at));
    at += (size_t)clpar_tensor_numel(p);
  }
  clpar_optimizer_free(o);
  clpar_module_free(m);
}

static void test_model_parallel(void **state) {
  (void)state;
  tu_toy_devices d = {device_at(device_count() - 1), NULL};
  d.dev1 = tu_second_device(d.dev0);
  if (!d.dev1) skip();
  float plain[165], scaled[165], skipping[165];
  const int none[5] = {0}, pokes[5] = {0, 1, 0, 2, 0};
  clpar_grad_scaler *off, *on, *poked;
  tu_ok(clpar_grad_scaler_create(&(clpar_grad_scaler_options){.disabled = 1}, &off));
  tu_ok(clpar_grad_scaler_create(NULL, &on));
  tu_ok(clpar_grad_scaler_create(NULL, &poked));
  toy_run(&d, off, none, plain);
  toy_run(&d, on, none, scaled);
  tu_assert_close(scaled, plain, 165, 0.0f, 0.0f, "ToyModel over two devices, scaled by 2^16");
  toy_run(&d, poked, pokes, skipping);
  assert_true(clpar_grad_scaler_get_scale(poked) == 16384.0f);
  assert_true(memcmp(skipping, plain, sizeof plain) != 0);
  clpar_grad_scaler_free(off);
  clpar_grad_scaler_free(on);
  clpar_grad_scaler_free(poked);
}

/* The scaler's state through a training checkpoint, with PyTorch's names; a checkpoint
 * without them, or with a bad one, loads nothing. */
static void test_checkpoint_keeps_state(void **state) {
  (void)state;
  char dir[64], path[96], plain_path[96], bad_path[96];
  snprintf(dir, sizeof dir, "/tmp/clpar-amp-XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/scaled.safetensors", dir);
  snprintf(plain_path, sizeof plain_path, "%s/plain.safetensors", dir);
  snprintf(bad_path, sizeof bad_path, "%s/bad.safetensors", dir);
  const grad_scaler_case *c = &grad_scaler_cases[2]; /* odd factors: the digits matter */
  clpar_grad_scaler *s, *t;
  clpar_grad_scaler_options opt = {c->init_scale, c->growth_factor, c->backoff_factor,
                                   c->growth_interval, 0};
  tu_ok(clpar_grad_scaler_create(&opt, &s));
  tu_ok(clpar_grad_scaler_state_set(
      s, &(clpar_grad_scaler_state){c->sd_scale, c->sd_growth_factor, c->sd_backoff_factor,
                                    c->sd_growth_interval, 1}));
  clpar_module *m = tu_parity_mlp(tu_host());
  tu_ok(clpar_checkpoint_save_scaler(path, m, NULL, s, 7, 1));
  tu_ok(clpar_checkpoint_save(plain_path, m, NULL, 7, 1));
  tu_ok(clpar_grad_scaler_create(NULL, &t));
  int64_t step = 0, epoch = 0;
  tu_ok(clpar_checkpoint_load_scaler(path, m, NULL, t, &step, &epoch));
  assert_true(step == 7 && epoch == 1);
  clpar_grad_scaler_state a, b;
  tu_ok(clpar_grad_scaler_state_get(s, &a));
  tu_ok(clpar_grad_scaler_state_get(t, &b));
  assert_true(a.scale == b.scale && a.growth_factor == b.growth_factor);
  assert_true(a.backoff_factor == b.backoff_factor && a.growth_interval == b.growth_interval);
  assert_true(a.growth_tracker == b.growth_tracker && b.growth_tracker == 1);
  clpar_st_file f;
  tu_ok(clpar_st_read(path, &f));
  assert_string_equal(clpar_st_meta(&f, "scaler.scale"), "225.506699");
  assert_string_equal(clpar_st_meta(&f, "scaler.growth_factor"), "1.7");
  assert_string_equal(clpar_st_meta(&f, "scaler._growth_tracker"), "1");
  assert_string_equal(clpar_st_meta(&f, "scaler.growth_interval"), "2");
  clpar_st_free(&f);
  clpar_grad_scaler *fresh;
  tu_ok(clpar_grad_scaler_create(NULL, &fresh));
  assert_int_equal(clpar_checkpoint_load_scaler(plain_path, m, NULL, fresh, NULL, NULL),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "scaler.scale"));
  const char *keys[5] = {"scaler.scale", "scaler.growth_factor", "scaler.backoff_factor",
                         "scaler.growth_interval", "scaler._growth_tracker"};
  const char *bad[][5] = {{"1024", "2", "0.5", "10", "10"},
                          {"1024", "2", "0.5", "10x", "0"},
                          {"-4", "2", "0.5", "10", "0"},
                          {"1e39", "2", "0.5", "10", "0"}};
  for (int k = 0; k < 4; k++) {
    tu_ok(clpar_checkpoint_save_meta(bad_path, m, NULL, 0, 0, keys, bad[k], 5));
    assert_int_equal(clpar_checkpoint_load_scaler(bad_path, m, NULL, fresh, NULL, NULL),
                     CLPAR_ERROR_CORRUPT);
  }
  assert_true(clpar_grad_scaler_get_scale(fresh) == 65536.0f); /* nothing was loaded */
  clpar_grad_scaler_free(fresh);
  clpar_grad_scaler_free(s);
  clpar_grad_scaler_free(t);
  clpar_module_free(m);
  tu_remove_dir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_are_pytorch),
      cmocka_unit_test(test_scale_sequence_matches_pytorch),
      cmocka_unit_test(test_skipped_step_changes_nothing),
      cmocka_unit_test(test_scaled_training_matches_unscaled),
      cmocka_unit_test(test_unscale_then_clip),
      cmocka_unit_test(test_two_optimizers),
      cmocka_unit_test(test_optimizers_of_other_sizes),
      cmocka_unit_test(test_check_spans_chunks),
      cmocka_unit_test(test_disabled_is_plain),
      cmocka_unit_test(test_data_parallel),
      cmocka_unit_test(test_model_parallel),
      cmocka_unit_test(test_checkpoint_keeps_state),
  };
  return cmocka_run_group_tests_name("amp", tests, tu_setup, tu_teardown);
}
