/* model_parallel.c — PyTorch's "Single-Machine Model Parallel" ToyModel in C
 * ("Single-Machine Model Parallel Best Practices"): net1 = Linear(10, 10) on device 0, ReLU,
 * net2 = Linear(10, 5) on the second; forward moves the input to the first device and the
 * activation to the second (clpar_tensor_to: a differentiable copy that does not wait), the
 * labels go to the output's device, and MSE + SGD(lr 0.001) train it on batches of 20 random
 * rows. Backward crosses the copy on its own.
 *
 * The devices are the first two selected; with one selected, the host backend is the second
 * (or the first, when the selected one is the host and nothing else exists):
 *   POCL_DEVICES="pthread pthread" ./model_parallel [steps]
 *   CLPAR_DEVICES=opencl:0 ./model_parallel */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>

#include "sample_util.h"

typedef struct {
  clpar_device *dev0, *dev1;
} toy_devices;

/* def forward(self, x): return self.net2(self.relu(self.net1(x.to(dev0))).to(dev1)) */
static clpar_status toy_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **out,
                                void *user) {
  const toy_devices *d = user;
  clpar_tensor *h;
  clpar_status s = CLPAR_OK;
  if (clpar_tensor_device(x) != d->dev0) s = clpar_tensor_to(x, d->dev0, &x);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "net1"), x, &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "relu"), h, &h);
  if (s == CLPAR_OK && d->dev1 != d->dev0) s = clpar_tensor_to(h, d->dev1, &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "net2"), h, out);
  return s; /* the intermediates belong to the caller's scope */
}

/* ToyModel: `net1` and `net2` are sent to dev0 and dev1. */
static clpar_status toy_create(toy_devices *d, clpar_module **out) {
  clpar_module *net1 = NULL, *relu = NULL, *net2 = NULL, *m = NULL;
  clpar_status s = clpar_module_create("ToyModel", toy_forward, d, NULL, &m);
  if (s == CLPAR_OK) s = clpar_linear_create(10, 10, 1, d->dev0, &net1);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "net1", net1);
  if (s == CLPAR_OK) s = clpar_relu_create(&relu);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "relu", relu);
  if (s == CLPAR_OK) s = clpar_linear_create(10, 5, 1, d->dev1, &net2);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "net2", net2);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 10;
  if (steps < 1) steps = 1;
  if (!check(clpar_init(), "clpar_init")) return 1;
  toy_devices d = {clpar_device_get(0), NULL};
  d.dev1 = clpar_device_count() > 1 ? clpar_device_get(1) : clpar_device_host();
  printf("ToyModel: net1 on %s, net2 on %s%s\n", clpar_device_id(d.dev0), clpar_device_id(d.dev1),
         d.dev0 == d.dev1 ? " (one device: nothing to split)" : "");
  clpar_manual_seed(0);
  clpar_module *model = NULL;
  clpar_optimizer *opt = NULL;
  clpar_sgd_options sgd = {.lr = 0.001f};
  int ok = check(toy_create(&d, &model), "ToyModel") &&
           check(clpar_sgd_create_for(model, &sgd, &opt), "SGD");
  for (int step = 0; ok && step < steps; step++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x, *labels, *outputs, *loss;
    float value = 0;
    /* outputs = model(torch.randn(20, 10)): the batch is made in host memory */
    ok = check(clpar_tensor_rand_normal(clpar_device_host(), 2, (int64_t[]){20, 10},
                                        100 + (uint64_t)step, 0, 1, &x),
               "input") &&
         check(clpar_optimizer_zero_grad(opt), "zero_grad") &&
         check(clpar_module_forward(model, x, &outputs), "forward") &&
         /* labels = torch.randn(20, 5).to(dev1): on the outputs' device */
         check(clpar_tensor_rand_normal(d.dev1, 2, (int64_t[]){20, 5}, 200 + (uint64_t)step, 0, 1,
                                        &labels),
               "labels") &&
         check(clpar_mse_loss(outputs, labels, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
         check(clpar_backward(loss), "backward") && check(clpar_optimizer_step(opt), "step") &&
         check(clpar_tensor_read(loss, &value, 1), "read");
    if (ok)
      printf("step %d: loss %.6f (outputs on %s)\n", step, value,
             clpar_device_id(clpar_tensor_device(outputs)));
    clpar_scope_end(scope);
  }
  clpar_optimizer_free(opt);
  clpar_module_free(model);
  clpar_shutdown();
  return ok ? 0 : 1;
}
