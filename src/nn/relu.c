/* relu.c — the built-in ReLU module (PyTorch's nn.ReLU). */
#include "internal.h"

clpar_status clpar_relu_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *user) {
  (void)self;
  (void)user;
  return clpar_relu(x, y);
}

clpar_status clpar_relu_create(clpar_module **out) {
  return clpar_module_create("ReLU", clpar_relu_forward, NULL, NULL, out);
}
