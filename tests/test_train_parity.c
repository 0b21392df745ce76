/* test_train_parity.c — training matches PyTorch's update rules: a small MLP
 * (Linear(4, 3), ReLU, Linear(3, 2)) starts from given weights and takes SGD-with-momentum,
 * Adam and AdamW steps on a fixed batch; the losses and the final weights are compared with
 * numbers from torch.optim itself, in float64 (tests/reference/train_parity.h; regenerate with:
 * python3 tests/reference/train_parity.py). Runs on every selected
 * device and on host. Also: module parameter names, and a user-defined module. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* PyTorch's numbers: torch.optim in float64 (tests/reference/train_parity.py) */
#include "reference/train_parity.h"

static const int32_t labels[5] = {0, 1, 1, 0, 1};

typedef enum { RUN_SGD, RUN_SGD_NESTEROV, RUN_SGD_DAMPENING, RUN_ADAM, RUN_ADAMW } run_kind;

static void run(clpar_device *dev, run_kind kind, int steps, const double *losses,
                const double *params) {
  clpar_module *mlp = tu_parity_mlp(dev);
  clpar_optimizer *opt;
  clpar_sgd_options sgd = {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.01f};
  clpar_adam_options adam = {
      .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f};
  if (kind == RUN_SGD) tu_ok(clpar_sgd_create_for(mlp, &sgd, &opt));
  clpar_sgd_options nesterov = {.lr = 0.05f, .momentum = 0.8f, .nesterov = 1};
  if (kind == RUN_SGD_NESTEROV) tu_ok(clpar_sgd_create_for(mlp, &nesterov, &opt));
  clpar_sgd_options damp = {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.5f};
  if (kind == RUN_SGD_DAMPENING) tu_ok(clpar_sgd_create_for(mlp, &damp, &opt));
  if (kind == RUN_ADAM) tu_ok(clpar_adam_create_for(mlp, &adam, &opt));
  adam.weight_decay = 0.1f;
  if (kind == RUN_ADAMW) tu_ok(clpar_adamw_create_for(mlp, &adam, &opt));
  float xv[20], yv[10];
  for (int i = 0; i < 20; i++) xv[i] = 2 * tu_parity_value(i + 1, 9, 17);
  for (int i = 0; i < 10; i++) yv[i] = tu_parity_value(i + 1, 5, 19);
  clpar_tensor *x, *y;
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){5, 4}, xv, &x));
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){5, 2}, yv, &y));
  for (int t = 0; t < steps; t++) {
    clpar_scope *step = clpar_scope_begin();
    clpar_tensor *out, *loss;
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(mlp, x, &out));
    if (kind == RUN_ADAM || kind == RUN_SGD_DAMPENING)
      tu_ok(clpar_cross_entropy(out, labels, 5, CLPAR_REDUCTION_MEAN, &loss));
    else
      tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    float l;
    tu_ok(clpar_tensor_read(loss, &l, 1));
    assert_float_equal(l, losses[t], 1e-5 + 1e-4 * fabs(losses[t]));
    clpar_scope_end(step);
  }
  float got[23], want[23];
  int at = 0;
  for (int i = 0; i < 4; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(mlp, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, got + at, (size_t)(23 - at)));
    at += (int)clpar_tensor_numel(p);
  }
  for (int i = 0; i < 23; i++) want[i] = (float)params[i];
  tu_assert_close(got, want, 23, 1e-4f, 2e-6f, clpar_device_id(dev));
  clpar_tensor_free(x);
  clpar_tensor_free(y);
  clpar_optimizer_free(opt);
  clpar_module_free(mlp);
}

static void each_device(run_kind kind, int steps, const double *losses, const double *params) {
  run(tu_host(), kind, steps, losses, params);
  for (int d = 0; d < clpar_device_count(); d++)
    if (clpar_device_get(d) != tu_host()) run(clpar_device_get(d), kind, steps, losses, params);
}

static void test_sgd_momentum(void **state) {
  (void)state;
  each_device(RUN_SGD, 4, sgd_losses, sgd_params);
}

static void test_sgd_nesterov(void **state) {
  (void)state;
  each_device(RUN_SGD_NESTEROV, 4, sgd_nesterov_losses, sgd_nesterov_params);
}

static void test_sgd_dampening_cross_entropy(void **state) {
  (void)state;
  each_device(RUN_SGD_DAMPENING, 4, sgd_dampening_losses, sgd_dampening_params);
}

static void test_adam_cross_entropy(void **state) {
  (void)state;
  each_device(RUN_ADAM, 4, adam_losses, adam_params);
}

static void test_adamw(void **state) {
  (void)state;
  each_device(RUN_ADAMW, 3, adamw_losses, adamw_params);
}

/* Split over the first selected device and a second one (tu_second_device), so that the
 * activation and its gradient always cross devices. */
static void test_model_parallel_matches_one_device(void **state) {
  (void)state;
  tu_toy_devices one = {tu_host(), tu_host()};
  tu_toy_devices split = {clpar_device_get(0), tu_second_device(clpar_device_get(0))};
  if (!split.dev1) {
    print_message("no second device on this machine to split over\n");
    skip();
  }
  assert_ptr_not_equal(split.dev0, split.dev1);
  float ref[165], got[165];
  tu_toy_train(&one, 7, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.5f}, 3, NULL, ref);
  tu_toy_train(&split, 7, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.5f}, 3, NULL, got);
  tu_assert_close(got, ref, 165, 1e-4f, 1e-5f, "ToyModel split over two devices");
}

/* module_to moves parameters in place: pointers held by an optimizer stay valid. */
static void test_module_to_and_errors(void **state) {
  (void)state;
  clpar_module *lin, *other;
  tu_ok(clpar_linear_create(3, 2, 1, tu_host(), &lin));
  clpar_tensor *w = clpar_module_parameter(lin, "weight");
  float before[6], after[6];
  tu_ok(clpar_tensor_read(w, before, 6));
  tu_ok(clpar_module_to(lin, clpar_device_get(0)));
  assert_ptr_equal(clpar_module_parameter(lin, "weight"), w);
  assert_ptr_equal(clpar_tensor_device(w), clpar_device_get(0));
  tu_ok(clpar_tensor_read(w, after, 6));
  assert_memory_equal(before, after, sizeof before);
  assert_true(clpar_tensor_requires_grad(w));
  assert_string_equal(clpar_module_type(lin), "Linear");
  tu_ok(clpar_relu_create(&other));
  assert_int_equal(clpar_module_add_child(lin, "weight.x", other), CLPAR_ERROR_INVALID_ARGUMENT);
  tu_ok(clpar_relu_create(&other));
  tu_ok(clpar_module_add_child(lin, "act", other));
  tu_ok(clpar_relu_create(&other));
  assert_int_equal(clpar_module_add_child(lin, "act", other), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "already registered"));
  clpar_optimizer *opt = NULL;
  clpar_sgd_options bad = {.lr = 0.1f, .momentum = 0.0f, .nesterov = 1};
  assert_int_equal(clpar_sgd_create_for(lin, &bad, &opt), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_adam_options badb = {.lr = 0.1f, .beta1 = 1.0f, .beta2 = 0.9f};
  assert_int_equal(clpar_adam_create_for(lin, &badb, &opt), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(opt);
  assert_int_equal(clpar_sgd_create_for(other = NULL, &bad, &opt), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_linear_create(0, 2, 1, tu_host(), &other), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_module_free(lin);
  clpar_module_free(NULL);
  clpar_optimizer_free(NULL);
}

/* A training step enqueues and returns: the host waits for the device only when it reads a
 * value back. */
static void test_training_step_does_not_wait(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_module *mlp = tu_parity_mlp(dev);
    clpar_optimizer *sgd, *adam;
    clpar_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
    clpar_adam_options ao = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    tu_ok(clpar_sgd_create_for(mlp, &so, &sgd));
    tu_ok(clpar_adam_create_for(mlp, &ao, &adam));
    clpar_tensor *x;
    tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){5, 4}, 1, 0, 1, &x));
    uint64_t before = clpar_device_host_waits(dev);
    clpar_tensor *loss = NULL;
    for (int step = 0; step < 3; step++) {
      clpar_optimizer *opt = step == 1 ? adam : sgd;
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *out, *l;
      tu_ok(clpar_optimizer_zero_grad(opt));
      tu_ok(clpar_module_forward(mlp, x, &out));
      tu_ok(clpar_cross_entropy(out, labels, 5, CLPAR_REDUCTION_MEAN, &l));
      tu_ok(clpar_backward(l));
      tu_ok(clpar_optimizer_step(opt));
      clpar_tensor_free(loss);
      loss = clpar_tensor_retain(l);
      clpar_scope_end(sc);
    }
    assert_int_equal(clpar_device_host_waits(dev), before);
    float v;
    tu_ok(clpar_tensor_read(loss, &v, 1)); /* the one wait, unless the device already finished */
    uint64_t waits = clpar_device_host_waits(dev);
    assert_true(waits == before || waits == before + 1);
    clpar_tensor_free(loss);
    clpar_tensor_free(x);
    clpar_optimizer_free(sgd);
    clpar_optimizer_free(adam);
    clpar_module_free(mlp);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_momentum),
      cmocka_unit_test(test_sgd_nesterov),
      cmocka_unit_test(test_sgd_dampening_cross_entropy),
      cmocka_unit_test(test_adam_cross_entropy),
      cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_model_parallel_matches_one_device),
      cmocka_unit_test(test_module_to_and_errors),
      cmocka_unit_test(test_training_step_does_not_wait),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
