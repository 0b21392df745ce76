/* bench_util.h — what the benchmarks share: a monotonic clock and a status check that says
 * what failed on stderr (stdout carries only the JSON figures). */
#ifndef CLPAR_BENCH_UTIL_H
#define CLPAR_BENCH_UTIL_H

#include <clpar/clpar.h>
#include <stdio.h>
#include <time.h>

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_ok(clpar_status s, const char *what) {
  if (s != CLPAR_OK)
    fprintf(stderr, "%s: %s: %s\n", what, clpar_status_name(s), clpar_last_error());
  return s == CLPAR_OK;
}

/* One training step of a classifier: upload the batch [batch, in] to dev, zero the
 * gradients, forward, cross-entropy, backward, optimizer step; nothing waits for the device.
 * Every temporary is released by a scope. Returns 1 on success. */
static inline int bench_train_step(clpar_module *model, clpar_optimizer *opt, clpar_device *dev,
                                   const float *x, const int32_t *y, int64_t batch, int64_t in) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *logits, *loss;
  int64_t shape[2] = {batch, in};
  int good = bench_ok(clpar_tensor_from_host(dev, 2, shape, x, &xt), "upload") &&
             bench_ok(clpar_optimizer_zero_grad(opt), "zero_grad") &&
             bench_ok(clpar_module_forward(model, xt, &logits), "forward") &&
             bench_ok(clpar_cross_entropy(logits, y, batch, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
             bench_ok(clpar_backward(loss), "backward") &&
             bench_ok(clpar_optimizer_step(opt), "step");
  clpar_scope_end(scope);
  return good;
}

#endif
