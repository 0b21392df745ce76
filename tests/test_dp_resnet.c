/* test_dp_resnet.c — DataParallel of a ResNet-18 trained a few SGD steps on two OpenCL
 * devices (ctest runs it on POCL_DEVICES="basic basic"), its losses finite. Two PoCL CPU devices
 * that build the same program share PoCL's cache of loaded kernels, which miscounts its references
 * when two threads run the same kernel at once and aborts the process; clpar builds each PoCL CPU
 * device's programs apart, and this test is the workload that aborted. Small images keep it short.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

enum { BATCH = 4, SIDE = 32, CLASSES = 10, STEPS = 3 };

/* STEPS SGD steps of a seeded ResNet-18 in a DataParallel over the n devs, on batches made
 * on devs[0]; the losses into losses. */
static void train(clpar_device **devs, int n, float *losses) {
  clpar_module *net, *m;
  clpar_manual_seed(5);
  tu_ok(clpar_resnet18(CLASSES, devs[0], &net));
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  tu_ok(clpar_data_parallel_create(net, &o, &m));
  clpar_optimizer *opt;
  tu_ok(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.01f, .momentum = 0.9f}, &opt));
  static const int32_t labels[BATCH] = {3, 7, 1, 5};
  for (int step = 0; step < STEPS; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *y, *loss;
    tu_ok(clpar_tensor_rand_normal(devs[0], 4, (int64_t[]){BATCH, 3, SIDE, SIDE},
                                   70 + (uint64_t)step, 0, 1, &x));
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(m, x, &y));
    tu_ok(clpar_cross_entropy(y, labels, BATCH, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    tu_ok(clpar_tensor_read(loss, &losses[step], 1));
    assert_true(isfinite(losses[step]));
    clpar_scope_end(sc);
  }
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

static void test_resnet18_on_two_devices(void **state) {
  (void)state;
  clpar_device *devs[2];
  if (clpar_device_find("opencl:0", &devs[0]) != CLPAR_OK ||
      clpar_device_find("opencl:1", &devs[1]) != CLPAR_OK) {
    fprintf(stderr, "skipped: fewer than two OpenCL devices\n");
    skip();
  }
  float losses[STEPS];
  train(devs, 2, losses);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resnet18_on_two_devices),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
