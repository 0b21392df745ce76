/* tune.c — clpar_device_tune_gemm: checks its arguments and runs the backend's tuner on the
 * device's worker (the only thread that drives its queue). The tuning itself, its cache file
 * and its application at device open are the OpenCL backend's (backends/opencl/ocl_tune.c):
 * only CLBlast has parameters to tune. */
#include "runtime.h"

/* Largest dimension a tuning shape may have: the tuner allocates A, B and C for each shape
 * and checks them on the host. */
#define CLPAR_TUNE_MAX_DIM 16384
#define CLPAR_TUNE_MAX_SHAPES 64

clpar_status clpar_device_tune_gemm(clpar_device *dev, const clpar_gemm_shape *shapes, int n_shapes,
                                    const clpar_tune_options *options, clpar_tune_result *result) {
  const char *fn = "clpar_device_tune_gemm";
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_init first", fn);
  if (!dev) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: device is NULL", fn);
  if (!shapes || n_shapes < 1 || n_shapes > CLPAR_TUNE_MAX_SHAPES)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: give 1 to %d shapes (got %d%s)", fn,
                           CLPAR_TUNE_MAX_SHAPES, n_shapes, shapes ? "" : ", NULL");
  for (int i = 0; i < n_shapes; i++) {
    const clpar_gemm_shape *s = &shapes[i];
    if (s->m < 1 || s->n < 1 || s->k < 1 || s->m > CLPAR_TUNE_MAX_DIM ||
        s->n > CLPAR_TUNE_MAX_DIM || s->k > CLPAR_TUNE_MAX_DIM ||
        (s->trans_a != 0 && s->trans_a != 1) || (s->trans_b != 0 && s->trans_b != 1))
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: shape %d is m=%lld n=%lld k=%lld trans_a=%d trans_b=%d; sizes "
                             "must be 1..%d and transposes 0 or 1",
                             fn, i, (long long)s->m, (long long)s->n, (long long)s->k, s->trans_a,
                             s->trans_b, CLPAR_TUNE_MAX_DIM);
  }
  if (options && (options->candidates < 0 || options->candidates > 1000))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: candidates is %d (0..1000)", fn,
                           options->candidates);
  if (!dev->bd.iface->tune_gemm)
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "%s: %s has no GEMM parameters to tune (the %s backend); only OpenCL "
                           "devices (CLBlast) do",
                           fn, dev->bd.info.id, dev->bd.iface->name);
  clpar_tune_options defaults = {0};
  clpar_tune_result scratch;
  return clpar_dev_tune_gemm_sync(dev, shapes, n_shapes, options ? options : &defaults,
                                  result ? result : &scratch);
}
