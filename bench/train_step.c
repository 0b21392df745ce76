/* train_step.c — time per training step of an MLP 784-1024-1024-10 at batch 256 on one
 * device (forward, cross-entropy, backward, Adam step, the batch uploaded each step), and
 * the share of that time the device spent outside kernels: the library's own overhead.
 * Steps run back to back and the device is waited for once at the end, as a training loop
 * that reads its loss only now and then would. Prints one JSON object.
 *
 *   POCL_DEVICES=pthread ./bench_train_step [device-index] [steps] */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BATCH = 256, IN = 784, HIDDEN = 1024, OUT = 10 };

static int step(clpar_module *m, clpar_optimizer *opt, clpar_device *dev, const float *x,
                const int32_t *y) {
  return bench_train_step(m, opt, dev, x, y, BATCH, IN);
}

/* Wall seconds per step over steps steps, the device waited for at the end. */
static double timed(clpar_module *mlp, clpar_optimizer *opt, clpar_device *dev, const float *x,
                    const int32_t *y, int steps) {
  double t0 = bench_now();
  for (int i = 0; i < steps; i++)
    if (!step(mlp, opt, dev, x, y)) return -1;
  if (!bench_ok(clpar_device_synchronize(dev), "synchronize")) return -1;
  return (bench_now() - t0) / steps;
}

int main(int argc, char **argv) {
  int index = argc > 1 ? atoi(argv[1]) : 0, steps = argc > 2 ? atoi(argv[2]) : 10;
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(index);
  if (!dev) {
    fprintf(stderr, "%s\n", clpar_last_error());
    clpar_shutdown();
    return 1;
  }
  float *x = malloc(sizeof(float) * BATCH * IN);
  int32_t y[BATCH];
  bench_batch(x, y, BATCH, IN, OUT);
  clpar_module *mlp = bench_mlp(IN, HIDDEN, OUT, dev);
  clpar_optimizer *opt = NULL;
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  int good = mlp && bench_ok(clpar_adam_create_for(mlp, &adam, &opt), "Adam");
  /* Two warm-up steps: kernels compile and the allocator's cache fills. */
  good = good && timed(mlp, opt, dev, x, y, 2) > 0;
  clpar_memory_stats m0, m1;
  clpar_device_memory_stats(dev, &m0);
  double plain = good ? timed(mlp, opt, dev, x, y, steps) : -1;
  clpar_device_memory_stats(dev, &m1);
  clpar_profile prof = {0};
  double profiled = -1;
  if (good && plain > 0 && bench_ok(clpar_device_profile_start(dev), "profile")) {
    profiled = timed(mlp, opt, dev, x, y, steps);
    good = profiled > 0 && bench_ok(clpar_device_profile_read(dev, &prof), "profile read");
    clpar_device_profile_stop(dev);
  }
  if (good && plain > 0) {
    double kernel = prof.device_seconds / steps;
    printf(
        "{\"bench\": \"train_step\", \"device\": \"%s\", \"model\": \"MLP %d-%d-%d-%d\", "
        "\"batch\": %d, "
        "\"optimizer\": \"Adam\", \"steps\": %d, \"ms_per_step\": %.2f, \"ms_per_step_profiled\": "
        "%.2f, "
        "\"kernel_ms_per_step\": %.2f, \"ops_per_step\": %.1f, \"outside_kernels_share\": %.4f, "
        "\"driver_allocs_during_timed_steps\": %llu}\n",
        clpar_device_id(dev), IN, HIDDEN, HIDDEN, OUT, BATCH, steps, plain * 1e3, profiled * 1e3,
        kernel * 1e3, (double)prof.ops / steps, profiled > 0 ? 1.0 - kernel / profiled : -1.0,
        (unsigned long long)(m1.driver_allocs - m0.driver_allocs));
  }
  clpar_optimizer_free(opt);
  clpar_module_free(mlp);
  free(x);
  clpar_shutdown();
  return good ? 0 : 1;
}
