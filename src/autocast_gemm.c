/* autocast_gemm.c — autocast's GEMMs on two 16-bit operands (src/autocast.c: Linear's and
 * matmul's forward on the 16-bit copies themselves; their backward's on the 16-bit incoming
 * gradient, matmul's and, without an activation, Linear's), through the device's gemm_half
 * entry (backends/backend_half.h: float32 products and sums, a float32 result), where the
 * device has it. Elsewhere, and where a test forced it off (clpar_compose_force), the caller
 * widens the operands to float32 tensors and calls gemm: gemm_half's composition, counted in
 * the device's composed_calls. The host backend's gemm_half is that composition run inside the
 * backend, so on the host both ways give the same bits. A float32 operand (a gradient through
 * an activation) takes the caller's widened path, uncounted. */
#include "internal.h"

/* Whether dev runs gemm_half itself (its bit clear in dev->composed). */
static int has_gemm_half(clpar_device *dev) {
  return !clpar_entry_set(dev->composed, CLPAR_ENTRY_gemm_half);
}

clpar_status clpar_autocast_gemm_half(clpar_device *dev, int ta, int tb, int64_t m, int64_t n,
                                      int64_t k, const clpar_tensor *a, const clpar_tensor *b,
                                      clpar_tensor **c, int *done) {
  *done = 0;
  if (!clpar_dtype_is_half(a->dtype) || b->dtype != a->dtype) return CLPAR_OK;
  if (!has_gemm_half(dev)) { /* the caller composes it */
    __atomic_add_fetch(&dev->composed_calls, 1, __ATOMIC_RELAXED);
    return CLPAR_OK;
  }
  int64_t shape[2] = {m, n};
  clpar_status s = clpar_tensor_empty(dev, 2, shape, c);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(*c);
  s = clpar_dev_gemm_half(dev, a->dtype == CLPAR_BFLOAT16, ta, tb, (size_t)m, (size_t)n, (size_t)k,
                          1.0f, clpar_tensor_bref(a), (size_t)a->shape[1], clpar_tensor_bref(b),
                          (size_t)b->shape[1], 0.0f, clpar_tensor_bref(*c), (size_t)n);
  if (s != CLPAR_OK) {
    clpar_device_fail(dev, s);
    clpar_tensor_release(*c);
    *c = NULL;
    return s;
  }
  *done = 1;
  return CLPAR_OK;
}
