/* zero_phases.c — where a ZeRO stage-1 step's time goes, on bench/memory.c's MLP (5 x
 * Linear(2048, 2048) + ReLU, Linear(2048, 16): about 21 M parameters, Adam, batch 16 per rank):
 * each step split into zero_grad, forward + loss + backward, and the ZeRO step, each followed
 * by clpar_device_synchronize so that its device work is inside its span; medians over the
 * steps (after 2 warm-up steps), printed by rank 0 as one JSON line. The zero_grad span is the
 * flat gradient's fill where zero_grad fills it.
 *
 *   POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 mpirun --oversubscribe -np 2 \
 *     ./build/bench/bench_zero_phases [steps]
 */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

enum { BATCH = 16, WIDTH = 2048, LAYERS = 5, OUT = 16, PHASES = 3 };

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return v[n / 2];
}

static clpar_module *zero1_mlp(clpar_device *dev, clpar_zero_optimizer **z) {
  clpar_module *l[2 * LAYERS + 1], *m = NULL, *ddp = NULL;
  clpar_manual_seed(3);
  int good = 1;
  for (int i = 0; good && i < LAYERS; i++)
    good = bench_ok(clpar_linear_create(WIDTH, WIDTH, 1, dev, &l[2 * i]), "Linear") &&
           bench_ok(clpar_relu_create(&l[2 * i + 1]), "ReLU");
  good = good && bench_ok(clpar_linear_create(WIDTH, OUT, 1, dev, &l[2 * LAYERS]), "Linear") &&
         bench_ok(clpar_sequential_create(l, 2 * LAYERS + 1, &m), "Sequential") &&
         bench_ok(clpar_ddp_create(m, &(clpar_ddp_options){.zero_stage = 1}, &ddp), "DDP") &&
         bench_ok(clpar_zero_adam_create(ddp, &(clpar_adam_options){.lr = 1e-4f}, z), "ZeRO");
  return good ? ddp : NULL;
}

/* One step, its phases' milliseconds into ms. */
static int step(clpar_module *ddp, clpar_zero_optimizer *z, clpar_device *dev, const float *x,
                const int32_t *y, double ms[PHASES]) {
  double t0 = now_seconds();
  int good = bench_ok(clpar_zero_optimizer_zero_grad(z), "zero_grad") &&
             bench_ok(clpar_device_synchronize(dev), "sync");
  double t1 = now_seconds();
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *logits, *loss;
  good = good &&
         bench_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){BATCH, WIDTH}, x, &xt), "upload") &&
         bench_ok(clpar_module_forward(ddp, xt, &logits), "forward") &&
         bench_ok(clpar_cross_entropy(logits, y, BATCH, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
         bench_ok(clpar_backward(loss), "backward") &&
         bench_ok(clpar_device_synchronize(dev), "sync");
  clpar_scope_end(scope);
  double t2 = now_seconds();
  good = good && bench_ok(clpar_zero_optimizer_step(z), "ZeRO step") &&
         bench_ok(clpar_device_synchronize(dev), "sync");
  double t3 = now_seconds();
  ms[0] = (t1 - t0) * 1e3, ms[1] = (t2 - t1) * 1e3, ms[2] = (t3 - t2) * 1e3;
  return good;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 20;
  if (steps < 1) steps = 20;
  if (!bench_ok(clpar_dist_init(), "clpar_dist_init")) return 1;
  clpar_device *dev = clpar_dist_device();
  clpar_zero_optimizer *z = NULL;
  clpar_module *ddp = zero1_mlp(dev, &z);
  float *x = malloc(sizeof(float) * BATCH * WIDTH);
  int32_t *y = malloc(sizeof(int32_t) * BATCH);
  double *t = calloc((size_t)steps * PHASES, sizeof *t);
  int good = ddp && x && y && t;
  if (good) bench_batch(x, y, BATCH, WIDTH, OUT);
  for (int k = -2; good && k < steps; k++) {
    double ms[PHASES];
    good = bench_ok(clpar_dist_barrier(), "barrier") && step(ddp, z, dev, x, y, ms);
    for (int p = 0; good && k >= 0 && p < PHASES; p++) t[p * steps + k] = ms[p];
  }
  if (good && clpar_dist_rank() == 0)
    printf(
        "{\"bench\": \"zero_phases\", \"stage\": 1, \"ranks\": %d, \"steps\": %d, "
        "\"zero_grad_ms\": %.2f, \"forward_backward_ms\": %.1f, \"step_ms\": %.1f}\n",
        clpar_dist_world_size(), steps, median(t, steps), median(t + steps, steps),
        median(t + 2 * steps, steps));
  free(t);
  free(x);
  free(y);
  clpar_zero_optimizer_free(z);
  clpar_module_free(ddp);
  clpar_dist_finalize();
  return good ? 0 : 1;
}
