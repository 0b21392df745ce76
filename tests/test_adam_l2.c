/* test_adam_l2.c — Adam with L2 weight decay (torch.optim.Adam's weight_decay, not AdamW)
 * against PyTorch 1.13 (reference/make_adam_l2_ref.py writes the numbers), on every selected
 * device and the host backend:
 * - the optimizer alone, fed the same gradients for 20 steps, gives PyTorch's float32 bits on
 *   a CPU (same order of operations, same roundings), and elsewhere lands no farther from the
 *   float64 run than twice PyTorch's float32;
 * - an MLP trained 20 steps from PyTorch's initial parameters ends no farther from PyTorch's
 *   float64 run than twice PyTorch's own float32 run. Adam divides the first moment by the root
 *   of the second, so a rounding difference in a small gradient moves a parameter by up to lr:
 *   the bound is relative to PyTorch's own float32 distance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "reference/adam_l2_ref.h"
#include "test_util.h"

static clpar_module *make_mlp(clpar_device *dev) {
  clpar_module *layers[3], *mlp;
  tu_ok(clpar_linear_create(ADAM_L2_IN, ADAM_L2_HIDDEN, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(ADAM_L2_HIDDEN, ADAM_L2_OUT, 1, dev, &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &mlp));
  size_t at = 0;
  for (int i = 0; i < clpar_module_parameter_count(mlp); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(mlp, i, NULL, &p));
    size_t n = (size_t)clpar_tensor_numel(p);
    tu_ok(clpar_tensor_write(p, adam_l2_init + at, n));
    at += n;
  }
  assert_int_equal(at, ADAM_L2_PARAMS);
  return mlp;
}

/* The largest distance of the parameters from float64's after training on dev. */
static double train(clpar_device *dev) {
  clpar_module *mlp = make_mlp(dev);
  clpar_optimizer *opt;
  clpar_adam_options o = {.lr = adam_l2_lr,
                          .beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .eps = 1e-8f,
                          .weight_decay = adam_l2_weight_decay};
  tu_ok(clpar_adam_create_for(mlp, &o, &opt));
  clpar_tensor *x, *y;
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){ADAM_L2_BATCH, ADAM_L2_IN}, adam_l2_x, &x));
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){ADAM_L2_BATCH, ADAM_L2_OUT}, adam_l2_y, &y));
  for (int t = 0; t < ADAM_L2_STEPS; t++) {
    clpar_scope *step = clpar_scope_begin();
    clpar_tensor *out, *loss;
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(mlp, x, &out));
    tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_scope_end(step);
  }
  double worst = 0;
  size_t at = 0;
  for (int i = 0; i < clpar_module_parameter_count(mlp); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(mlp, i, NULL, &p));
    float *v = tu_read(p);
    for (int64_t j = 0; j < clpar_tensor_numel(p); j++, at++)
      worst = fmax(worst, fabs((double)v[j] - adam_l2_f64[at]));
    free(v);
  }
  clpar_optimizer_free(opt);
  clpar_tensor_free(x);
  clpar_tensor_free(y);
  clpar_module_free(mlp);
  return worst;
}

static void check(clpar_device *dev, double torch_f32) {
  double got = train(dev);
  fprintf(stderr, "%s: %.3g from float64 (PyTorch's float32: %.3g, %.2fx)\n", clpar_device_id(dev),
          got, torch_f32, got / torch_f32);
  if (got > 2 * torch_f32)
    fail_msg(
        "Adam with L2 weight decay on %s ends %.3g from PyTorch's float64 result, %.1fx "
        "PyTorch's own float32 run (%.3g)",
        clpar_device_id(dev), got, got / torch_f32, torch_f32);
}

static void test_adam_l2_against_pytorch(void **state) {
  (void)state;
  double torch_f32 = 0;
  for (int i = 0; i < ADAM_L2_PARAMS; i++)
    torch_f32 = fmax(torch_f32, fabs(adam_l2_torch_f32[i] - adam_l2_f64[i]));
  for (int d = 0; d < clpar_device_count(); d++) check(clpar_device_get(d), torch_f32);
  if (clpar_device_index(tu_host()) < 0) check(tu_host(), torch_f32);
}

/* The optimizer alone: the given gradients through loss = sum(p * g), whose gradient with
 * respect to p is g exactly. Counts the parameters that differ from PyTorch's float32 run
 * and returns the largest distance from float64's. */
static double optimize(clpar_device *dev, int *differ) {
  clpar_tensor *p, *loss = NULL;
  tu_ok(clpar_tensor_from_host(dev, 1, (int64_t[]){ADAM_L2_GRAD_N}, adam_l2_grad_init, &p));
  tu_ok(clpar_tensor_set_requires_grad(p, 1));
  clpar_optimizer *opt;
  clpar_adam_options o = {.lr = adam_l2_lr,
                          .beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .eps = 1e-8f,
                          .weight_decay = adam_l2_weight_decay};
  tu_ok(clpar_adam_create(&p, 1, &o, &opt));
  for (int t = 0; t < ADAM_L2_STEPS; t++) {
    clpar_scope *step = clpar_scope_begin();
    clpar_tensor *g, *pg;
    tu_ok(clpar_tensor_from_host(dev, 1, (int64_t[]){ADAM_L2_GRAD_N},
                                 adam_l2_grads + (size_t)t * ADAM_L2_GRAD_N, &g));
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_mul(p, g, &pg));
    tu_ok(clpar_sum(pg, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_scope_end(step);
  }
  float *v = tu_read(p);
  double worst = 0;
  *differ = 0;
  for (int i = 0; i < ADAM_L2_GRAD_N; i++) {
    worst = fmax(worst, fabs((double)v[i] - adam_l2_grad_f64[i]));
    *differ += v[i] != (float)adam_l2_grad_torch_f32[i];
  }
  free(v);
  clpar_optimizer_free(opt);
  clpar_tensor_free(p);
  return worst;
}

/* On a CPU (the host backend, PoCL) every operation rounds as IEEE 754 says, as PyTorch's CPU
 * kernels do, so the same order of operations gives the same bits; other devices may round a
 * division or a square root differently (OpenCL allows 2.5 and 3 ulp) and are held to the
 * distance only. */
static void check_update(clpar_device *dev, double torch_f32) {
  int differ;
  double got = optimize(dev, &differ);
  clpar_device_info info;
  tu_ok(clpar_device_get_info(dev, &info));
  fprintf(stderr,
          "%s, optimizer alone: %.3g from float64 (PyTorch's float32: %.3g), %d of %d differ "
          "from PyTorch's float32\n",
          clpar_device_id(dev), got, torch_f32, differ, ADAM_L2_GRAD_N);
  if (info.type == CLPAR_DEVICE_CPU && differ > 0)
    fail_msg(
        "Adam with L2 weight decay on %s: %d of %d parameters differ from PyTorch's float32 "
        "after the same updates",
        clpar_device_id(dev), differ, ADAM_L2_GRAD_N);
  if (got > 2 * torch_f32)
    fail_msg(
        "Adam with L2 weight decay on %s, optimizer alone: %.3g from float64, PyTorch's "
        "float32 %.3g",
        clpar_device_id(dev), got, torch_f32);
}

static void test_adam_l2_update_against_pytorch(void **state) {
  (void)state;
  double torch_f32 = 0;
  for (int i = 0; i < ADAM_L2_GRAD_N; i++)
    torch_f32 = fmax(torch_f32, fabs(adam_l2_grad_torch_f32[i] - adam_l2_grad_f64[i]));
  for (int d = 0; d < clpar_device_count(); d++) check_update(clpar_device_get(d), torch_f32);
  if (clpar_device_index(tu_host()) < 0) check_update(tu_host(), torch_f32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adam_l2_against_pytorch),
      cmocka_unit_test(test_adam_l2_update_against_pytorch),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
