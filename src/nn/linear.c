/* linear.c — the built-in Linear module (PyTorch's nn.Linear), and the uniform initialization
 * it shares with Conv2d. */
#include <math.h>

#include "internal.h"

clpar_status clpar_linear_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                  void *user) {
  (void)user;
  return clpar_linear(x, clpar_module_parameter(self, "weight"),
                      clpar_module_parameter(self, "bias"), y);
}

/* PyTorch's nn.Linear initialization: weight and bias uniform in +-1/sqrt(in_features). */
clpar_status clpar_linear_create(int64_t in_features, int64_t out_features, int bias,
                                 clpar_device *dev, clpar_module **out) {
  if (in_features < 1 || out_features < 1 || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_linear_create: features must be >= 1 (got %lld, %lld)",
                           (long long)in_features, (long long)out_features);
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                           "clpar_linear_create: call clpar_init first");
  if (!dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_linear_create: device is NULL");
  float bound = 1.0f / sqrtf((float)in_features);
  int64_t ws[2] = {out_features, in_features}, numel;
  /* Sizes first: nothing is made (and no seed drawn) for a layer the device cannot hold. */
  clpar_status s = clpar_check_size("clpar_linear_create", dev, 2, ws, &numel);
  if (s != CLPAR_OK) return s;
  clpar_module *m;
  s = clpar_module_create("Linear", clpar_linear_forward, NULL, NULL, &m);
  if (s != CLPAR_OK) return s;
  s = clpar_module_add_uniform_params(m, dev, 2, ws, bias, bound);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}

clpar_status clpar_module_add_uniform_params(clpar_module *m, clpar_device *dev, int ndim,
                                             const int64_t *wshape, int bias, float bound) {
  clpar_tensor *w = NULL, *b = NULL;
  clpar_status s =
      clpar_tensor_rand_uniform(dev, ndim, wshape, clpar_param_seed_next(), -bound, bound, &w);
  if (s == CLPAR_OK) s = clpar_module_add_parameter(m, "weight", w);
  if (s == CLPAR_OK && bias)
    s = clpar_tensor_rand_uniform(dev, 1, wshape, clpar_param_seed_next(), -bound, bound, &b);
  if (s == CLPAR_OK && bias) s = clpar_module_add_parameter(m, "bias", b);
  clpar_tensor_free(w);
  clpar_tensor_free(b);
  return s;
}
