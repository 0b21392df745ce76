/* test_train_tools.c — the pieces of a training loop around the optimizer, against PyTorch
 * (tests/reference/train_ref.h; regenerate with python3 tests/reference/make_train_ref.py):
 * parameter groups (nanoGPT's configure_optimizers with AdamW, SGD with two groups),
 * clip_grad_norm (on one device, across devices, on flat groups and under DataParallel), the
 * learning-rate schedules, and gradient accumulation over micro-steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "reference/train_ref.h"

static void read_params(clpar_module *m, float *out, int n) {
  int at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, out + at, (size_t)(n - at)));
    at += (int)clpar_tensor_numel(p);
  }
  assert_int_equal(at, n);
}

static void assert_near(double got, double want, double rtol, const char *what, int i) {
  if (fabs(got - want) > 1e-9 + rtol * fabs(want))
    fail_msg("%s[%d]: got %.9g, PyTorch %.9g", what, i, got, want);
}

/* ---- learning-rate schedules ---- */

static clpar_optimizer *two_groups(clpar_tensor **p) {
  int64_t one = 1;
  tu_ok(clpar_tensor_zeros(tu_host(), 1, &one, &p[0]));
  tu_ok(clpar_tensor_zeros(tu_host(), 1, &one, &p[1]));
  clpar_sgd_group g[2] = {{&p[0], 1, {.lr = 0.1f}}, {&p[1], 1, {.lr = 0.01f}}};
  clpar_optimizer *o;
  tu_ok(clpar_sgd_create_groups(g, 2, &o));
  assert_int_equal(clpar_optimizer_group_count(o), 2);
  return o;
}

/* Steps s through epochs epochs, comparing both groups' rates with want (2 per epoch). */
static void check_schedule(clpar_optimizer *o, clpar_lr_scheduler *s, const double *want,
                           int epochs, const char *what) {
  for (int e = 0; e < epochs; e++) {
    for (int g = 0; g < 2; g++) {
      assert_near(clpar_optimizer_lr(o, g), want[2 * e + g], 1e-6, what, 2 * e + g);
      assert_near(clpar_lr_scheduler_lr(s, g), want[2 * e + g], 1e-6, what, 2 * e + g);
    }
    tu_ok(clpar_lr_scheduler_step(s));
  }
  assert_int_equal(clpar_lr_scheduler_epoch(s), epochs);
  clpar_lr_scheduler_free(s);
}

static void test_schedules(void **state) {
  (void)state;
  clpar_tensor *p[2];
  clpar_optimizer *o = two_groups(p);
  clpar_lr_scheduler *s;
  tu_ok(clpar_step_lr_create(o, 3, 0.5f, &s));
  check_schedule(o, s, sched_step, 12, "StepLR(3, 0.5)");
  tu_ok(clpar_optimizer_set_lr(o, 0, 0.1f));
  tu_ok(clpar_optimizer_set_lr(o, 1, 0.01f));
  tu_ok(clpar_step_lr_create(o, 2, 0.0f, &s)); /* gamma 0: PyTorch's 0.1 */
  check_schedule(o, s, sched_step_default, 7, "StepLR(2)");
  tu_ok(clpar_optimizer_set_lr(o, 0, 0.1f));
  tu_ok(clpar_optimizer_set_lr(o, 1, 0.01f));
  tu_ok(clpar_linear_lr_create(o, 0.25f, 1.0f, 4, &s));
  check_schedule(o, s, sched_linear, 8, "LinearLR(0.25, 1, 4)");
  tu_ok(clpar_optimizer_set_lr(o, 0, 0.1f));
  tu_ok(clpar_optimizer_set_lr(o, 1, 0.01f));
  tu_ok(clpar_linear_lr_create(o, 0.0f, 0.0f, 5, &s)); /* 1/3, 1, as PyTorch */
  check_schedule(o, s, sched_linear_default, 8, "LinearLR()");
  tu_ok(clpar_optimizer_set_lr(o, 0, 0.1f));
  tu_ok(clpar_optimizer_set_lr(o, 1, 0.01f));
  tu_ok(clpar_cosine_lr_create(o, 5, 0.001f, &s));
  check_schedule(o, s, sched_cosine, 13, "CosineAnnealingLR(5, 0.001)");
  /* refused arguments name what is wrong and leave the rates alone */
  assert_int_equal(clpar_step_lr_create(o, 0, 0.5f, &s), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "step_size"));
  assert_int_equal(clpar_linear_lr_create(o, 2.0f, 1.0f, 4, &s), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_warmup_cosine_lr_create(o, 5, 5, 0.0f, &s), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_optimizer_set_lr(o, 2, 0.1f), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_optimizer_set_lr(o, -1, NAN), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_optimizer_free(o);
  clpar_tensor_free(p[0]);
  clpar_tensor_free(p[1]);
}

static void test_warmup_cosine(void **state) {
  (void)state;
  int64_t one = 1;
  clpar_tensor *p;
  tu_ok(clpar_tensor_zeros(tu_host(), 1, &one, &p));
  clpar_optimizer *o;
  tu_ok(clpar_adamw_create(&p, 1, &(clpar_adam_options){.lr = 1e-3f}, &o));
  clpar_lr_scheduler *s;
  tu_ok(clpar_warmup_cosine_lr_create(o, 3, 10, 1e-4f, &s));
  for (int it = 0; it < 15; it++) {
    assert_near(clpar_optimizer_lr(o, 0), sched_nanogpt[it], 1e-6, "nanoGPT get_lr", it);
    tu_ok(clpar_lr_scheduler_step(s));
  }
  tu_ok(clpar_lr_scheduler_set_epoch(s, 5)); /* a resumed run */
  assert_near(clpar_optimizer_lr(o, 0), sched_nanogpt[5], 1e-6, "nanoGPT get_lr resumed", 5);
  clpar_lr_scheduler_free(s);
  clpar_optimizer_free(o);
  clpar_tensor_free(p);
}

/* ---- clip_grad_norm ---- */

static const int64_t clip_shapes[3][2] = {{3, 4}, {4, 0}, {2, 3}};

/* The fixture's three tensors, tensor k on devs[k], with its gradient set by a backward. */
static void make_clip_params(clpar_device **devs, clpar_tensor **p) {
  int at = 0;
  for (int k = 0; k < 3; k++) {
    int nd = clip_shapes[k][1] ? 2 : 1;
    int64_t n = clip_shapes[k][0] * (nd == 2 ? clip_shapes[k][1] : 1);
    float g[12];
    for (int i = 0; i < n; i++) g[i] = (float)(((i * 7 + k * 5) % 11) / 11.0 - 0.4);
    clpar_tensor *gt, *prod, *sum;
    tu_ok(clpar_tensor_zeros(devs[k], nd, clip_shapes[k], &p[k]));
    tu_ok(clpar_tensor_set_requires_grad(p[k], 1));
    tu_ok(clpar_tensor_from_host(devs[k], nd, clip_shapes[k], g, &gt));
    tu_ok(clpar_mul(p[k], gt, &prod));
    tu_ok(clpar_sum_dims(prod, NULL, 0, 0, &sum));
    tu_ok(clpar_backward(sum));
    clpar_tensor_free(gt);
    clpar_tensor_free(prod);
    clpar_tensor_free(sum);
    at += (int)n;
  }
  assert_int_equal(at, 22);
}

static void check_clip(clpar_device **devs, float max_norm, double norm_want,
                       const double *grads_want, const char *what) {
  clpar_tensor *p[3], *norm;
  make_clip_params(devs, p);
  tu_ok(clpar_clip_grad_norm(p, 3, max_norm, &norm));
  assert_int_equal(clpar_tensor_numel(norm), 1);
  assert_ptr_equal(clpar_tensor_device(norm), devs[0]);
  float got;
  tu_ok(clpar_tensor_read(norm, &got, 1));
  assert_near(got, norm_want, 1e-6, what, 0);
  float g[22], want[22];
  int at = 0;
  for (int k = 0; k < 3; k++) {
    tu_ok(clpar_tensor_read(clpar_tensor_grad(p[k]), g + at, (size_t)(22 - at)));
    at += (int)clpar_tensor_numel(p[k]);
  }
  for (int i = 0; i < 22; i++) want[i] = (float)grads_want[i];
  tu_assert_close(g, want, 22, 1e-6f, 1e-8f, what);
  clpar_tensor_free(norm);
  for (int k = 0; k < 3; k++) clpar_tensor_free(p[k]);
}

static void test_clip_grad_norm(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    clpar_device *devs[3] = {dev, dev, dev};
    check_clip(devs, 0.5f, clip_norm[0], clip_grads, "clip_grad_norm_(0.5)");
    check_clip(devs, 50.0f, noclip_norm[0], noclip_grads, "clip_grad_norm_(50)");
    clpar_device *other = tu_second_device(dev);
    if (!other) continue;
    clpar_device *spread[3] = {dev, other, dev}; /* partial sums and the coefficient travel */
    check_clip(spread, 0.5f, clip_norm[0], clip_grads, "clip_grad_norm_ over two devices");
  }
  /* no gradient: norm 0, as PyTorch; bad arguments are refused */
  int64_t one = 1;
  clpar_tensor *p, *norm;
  tu_ok(clpar_tensor_zeros(tu_host(), 1, &one, &p));
  tu_ok(clpar_clip_grad_norm(&p, 1, 1.0f, &norm));
  float z = -1;
  tu_ok(clpar_tensor_read(norm, &z, 1));
  assert_true(z == 0.0f);
  assert_int_equal(clpar_clip_grad_norm(&p, 1, NAN, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "max_norm"));
  assert_int_equal(clpar_clip_grad_norm(&p, 1, -1.0f, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_tensor_free(norm);
  clpar_tensor_free(p);
}

/* ---- training with groups, clipping and a schedule ---- */

static void mlp_batch(clpar_device *dev, clpar_tensor **x, clpar_tensor **y) {
  float xv[20], yv[10];
  for (int i = 0; i < 20; i++) xv[i] = 2 * tu_parity_value(i + 1, 9, 17);
  for (int i = 0; i < 10; i++) yv[i] = tu_parity_value(i + 1, 5, 19);
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){5, 4}, xv, x));
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){5, 2}, yv, y));
}

/* nanoGPT's loop on the MLP (m on dev, wrapped or not): lr from the schedule, forward,
 * backward, clip to 0.5, AdamW step with decay groups; losses and norms out. */
static void train_nanogpt_style(clpar_module *m, clpar_device *dev, int steps, float *losses,
                                float *norms) {
  clpar_optimizer *o;
  clpar_adam_options ad = {.lr = 0.01f, .beta2 = 0.99f, .weight_decay = 0.1f};
  tu_ok(clpar_adamw_create_decay_groups(m, &ad, &o));
  assert_int_equal(clpar_optimizer_group_size(o, 0), 2); /* the two weights */
  assert_int_equal(clpar_optimizer_group_size(o, 1), 2); /* the two biases */
  clpar_lr_scheduler *s;
  tu_ok(clpar_warmup_cosine_lr_create(o, 2, 6, 0.001f, &s));
  clpar_tensor *x, *y;
  mlp_batch(dev, &x, &y);
  for (int t = 0; t < steps; t++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *out, *loss, *norm;
    tu_ok(clpar_optimizer_zero_grad(o));
    tu_ok(clpar_module_forward(m, x, &out));
    tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_clip_grad_norm_module(m, 0.5f, &norm));
    tu_ok(clpar_optimizer_step(o));
    tu_ok(clpar_lr_scheduler_step(s));
    tu_ok(clpar_tensor_read(loss, &losses[t], 1));
    tu_ok(clpar_tensor_read(norm, &norms[t], 1));
    clpar_scope_end(sc);
  }
  clpar_tensor_free(x);
  clpar_tensor_free(y);
  clpar_lr_scheduler_free(s);
  clpar_optimizer_free(o);
}

static void check_nanogpt_run(clpar_module *m, const char *what) {
  float losses[5], norms[5], params[23], want[23];
  clpar_tensor *p;
  tu_ok(clpar_module_parameter_at(m, 0, NULL, &p));
  train_nanogpt_style(m, clpar_tensor_device(p), 5, losses, norms);
  for (int t = 0; t < 5; t++) {
    assert_near(losses[t], adamw_groups_losses[t], 1e-5, what, t);
    assert_near(norms[t], adamw_groups_norms[t], 1e-5, what, t);
  }
  read_params(m, params, 23);
  for (int i = 0; i < 23; i++) want[i] = (float)adamw_groups_params[i];
  tu_assert_close(params, want, 23, 1e-4f, 2e-6f, what);
}

static void test_adamw_decay_groups(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    clpar_module *m = tu_parity_mlp(dev);
    check_nanogpt_run(m, clpar_device_id(dev));
    clpar_module_free(m);
    m = tu_parity_mlp(dev); /* flat: clip reduces the flat gradient in one piece */
    tu_ok(clpar_module_flatten(m));
    check_nanogpt_run(m, "flattened");
    clpar_module_free(m);
  }
}

static void test_sgd_groups(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    clpar_module *m = tu_parity_mlp(dev);
    clpar_tensor *p[4];
    for (int i = 0; i < 4; i++) tu_ok(clpar_module_parameter_at(m, i, NULL, &p[i]));
    clpar_tensor *weights[2] = {p[0], p[2]}, *biases[2] = {p[1], p[3]};
    clpar_sgd_group g[2] = {{weights, 2, {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f}},
                            {biases, 2, {.lr = 0.05f, .momentum = 0.9f, .nesterov = 1}}};
    clpar_optimizer *o;
    tu_ok(clpar_sgd_create_groups(g, 2, &o));
    clpar_tensor *x, *y;
    mlp_batch(dev, &x, &y);
    for (int t = 0; t < 4; t++) {
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *out, *loss;
      tu_ok(clpar_optimizer_zero_grad(o));
      tu_ok(clpar_module_forward(m, x, &out));
      tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
      tu_ok(clpar_backward(loss));
      tu_ok(clpar_optimizer_step(o));
      float l;
      tu_ok(clpar_tensor_read(loss, &l, 1));
      assert_near(l, sgd_groups_losses[t], 1e-5, "SGD groups loss", t);
      clpar_scope_end(sc);
    }
    float params[23], want[23];
    read_params(m, params, 23);
    for (int i = 0; i < 23; i++) want[i] = (float)sgd_groups_params[i];
    tu_assert_close(params, want, 23, 1e-4f, 2e-6f, "SGD with two groups");
    /* a tensor in two groups is refused */
    g[1].params = weights;
    clpar_optimizer *bad;
    assert_int_equal(clpar_sgd_create_groups(g, 2, &bad), CLPAR_ERROR_INVALID_ARGUMENT);
    clpar_tensor_free(x);
    clpar_tensor_free(y);
    clpar_optimizer_free(o);
    clpar_module_free(m);
  }
}

/* ---- under DataParallel: the norm of the reduced gradient ---- */

static void test_clip_data_parallel(void **state) {
  (void)state;
  clpar_device *devs[2] = {clpar_device_get(0), NULL};
  devs[1] = clpar_device_count() > 1 ? clpar_device_get(1) : tu_second_device(devs[0]);
  if (!devs[1]) {
    fprintf(stderr, "skipped: this machine has no second device\n");
    skip();
  }
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = 2};
  tu_ok(clpar_data_parallel_create(tu_parity_mlp(devs[0]), &o, &dp));
  check_nanogpt_run(dp, "DataParallel over 2 devices");
  clpar_module_free(dp);
}

/* ---- gradient accumulation ---- */

/* Gradients of the MLP's parameters (23 floats) after the batch of 6 rows as one backward
 * (micro 1) or as micro backwards of 6 / micro rows each, the loss scaled by 1 / micro, without
 * zeroing in between; then one SGD step, and the parameters after it. */
static void accumulate(clpar_device *dev, clpar_device *dev2, int micro, float *grads,
                       float *params) {
  clpar_module *m = tu_parity_mlp(dev);
  if (dev2) { /* under DataParallel: the reduced gradients accumulate in the flat gradient */
    clpar_device *devs[2] = {dev, dev2};
    clpar_data_parallel_options dpo = {.devices = devs, .n_devices = 2};
    tu_ok(clpar_data_parallel_create(m, &dpo, &m));
  }
  clpar_optimizer *o;
  tu_ok(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.1f}, &o));
  float xv[24], yv[12];
  for (int i = 0; i < 24; i++) xv[i] = 2 * tu_parity_value(i + 1, 9, 17);
  for (int i = 0; i < 12; i++) yv[i] = tu_parity_value(i + 1, 5, 19);
  int64_t rows = 6 / micro;
  tu_ok(clpar_optimizer_zero_grad(o));
  for (int k = 0; k < micro; k++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *y, *out, *loss, *scaled;
    tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){rows, 4}, xv + k * rows * 4, &x));
    tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){rows, 2}, yv + k * rows * 2, &y));
    tu_ok(clpar_module_forward(m, x, &out));
    tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_scale(loss, 1.0f / (float)micro, &scaled));
    tu_ok(clpar_backward(scaled));
    clpar_scope_end(sc);
  }
  int at = 0;
  for (int i = 0; i < 4; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(clpar_tensor_grad(p), grads + at, (size_t)(23 - at)));
    at += (int)clpar_tensor_numel(p);
  }
  tu_ok(clpar_optimizer_step(o));
  read_params(m, params, 23);
  clpar_optimizer_free(o);
  clpar_module_free(m);
}

static void test_gradient_accumulation(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    float g1[23], p1[23], g2[23], p2[23], g3[23], p3[23];
    accumulate(dev, NULL, 1, g1, p1);
    accumulate(dev, NULL, 2, g2, p2);
    accumulate(dev, NULL, 3, g3, p3);
    tu_assert_close(g2, g1, 23, 1e-5f, 1e-7f, "2 micro-steps' gradients vs one batch");
    tu_assert_close(p2, p1, 23, 1e-5f, 1e-7f, "2 micro-steps then a step vs one batch");
    tu_assert_close(g3, g1, 23, 1e-5f, 1e-7f, "3 micro-steps' gradients vs one batch");
    tu_assert_close(p3, p1, 23, 1e-5f, 1e-7f, "3 micro-steps then a step vs one batch");
    clpar_device *other = tu_second_device(dev);
    if (!other) continue;
    accumulate(dev, other, 2, g2, p2);
    tu_assert_close(g2, g1, 23, 1e-5f, 1e-7f, "2 micro-steps under DataParallel vs one batch");
    tu_assert_close(p2, p1, 23, 1e-5f, 1e-7f, "2 micro-steps under DataParallel, then a step");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedules),
      cmocka_unit_test(test_warmup_cosine),
      cmocka_unit_test(test_clip_grad_norm),
      cmocka_unit_test(test_adamw_decay_groups),
      cmocka_unit_test(test_sgd_groups),
      cmocka_unit_test(test_clip_data_parallel),
      cmocka_unit_test(test_gradient_accumulation),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
