/* data_parallel.c — samples per second of a compute-bound MLP training step (forward,
 * cross-entropy, backward, SGD step) with DataParallel over 1 and over 2 devices, in one run,
 * and the speedup; with the host time per step spent scattering, copying parameters to the
 * replicas, gathering and reducing gradients. One JSON object per device count. Rounds of
 * steps alternate between the two set-ups and the best round of each counts.
 *
 * On this 2-core machine, the meaningful set-up is two PoCL "basic" devices, each in its own
 * context and driven by its own host thread (DESIGN.md):
 *   POCL_DEVICES="basic basic" POCL_MAX_PTHREAD_COUNT=1 ./bench_data_parallel [steps] */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BATCH = 512, IN = 1024, HIDDEN = 1024, OUT = 16 };

static int step(clpar_module *m, clpar_optimizer *opt, clpar_device *dev, const float *x,
                const int32_t *y) {
  return bench_train_step(m, opt, dev, x, y, BATCH, IN);
}

typedef struct {
  int n;
  clpar_module *dp;
  clpar_optimizer *opt;
  double best;                  /* seconds per step, best round */
  clpar_data_parallel_stats st; /* of the best round */
} config;

static int setup(config *c, int n, const float *x, const int32_t *y) {
  clpar_device *devs[2] = {clpar_device_get(0), clpar_device_get(1)};
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  clpar_sgd_options sgd = {.lr = 0.01f, .momentum = 0.9f};
  clpar_module *model = bench_mlp(IN, HIDDEN, OUT, devs[0]);
  c->n = n;
  c->best = 1e30;
  /* two warm-up steps: kernels compile, the allocators' caches fill */
  return model && bench_ok(clpar_data_parallel_create(model, &o, &c->dp), "DataParallel") &&
         bench_ok(clpar_sgd_create_for(c->dp, &sgd, &c->opt), "SGD") &&
         step(c->dp, c->opt, devs[0], x, y) && step(c->dp, c->opt, devs[0], x, y) &&
         bench_ok(clpar_device_synchronize(devs[0]), "sync");
}

/* One round of steps steps; keeps it if it is the best so far. */
static int round_of(config *c, int steps, const float *x, const int32_t *y) {
  clpar_device *dev = clpar_device_get(0);
  clpar_data_parallel_stats_reset(c->dp);
  double t0 = bench_now();
  int good = 1;
  for (int i = 0; good && i < steps; i++) good = step(c->dp, c->opt, dev, x, y);
  good = good && bench_ok(clpar_device_synchronize(dev), "sync");
  double per = (bench_now() - t0) / steps;
  if (good && per < c->best) {
    c->best = per;
    clpar_data_parallel_stats_get(c->dp, &c->st);
  }
  return good;
}

static void report(const config *c, int steps, int rounds, double baseline) {
  const clpar_data_parallel_stats *st = &c->st;
  printf(
      "{\"bench\": \"data_parallel\", \"devices\": %d, \"device_ids\": \"%s%s%s\", \"model\": "
      "\"MLP %d-%d-%d-%d\", "
      "\"batch\": %d, \"steps\": %d, \"rounds\": %d, \"ms_per_step\": %.1f, \"samples_per_s\": "
      "%.1f, "
      "\"speedup\": %.3f, \"per_step_ms\": {\"scatter\": %.2f, \"replicate\": %.2f, \"apply\": "
      "%.2f, "
      "\"gather\": %.2f, \"reduce\": %.2f}, \"parameters_copied_per_step\": %.1f}\n",
      c->n, clpar_device_id(clpar_device_get(0)), c->n > 1 ? "," : "",
      c->n > 1 ? clpar_device_id(clpar_device_get(1)) : "", IN, HIDDEN, HIDDEN, OUT, BATCH, steps,
      rounds, c->best * 1e3, BATCH / c->best, baseline / c->best, st->scatter_seconds / steps * 1e3,
      st->replicate_seconds / steps * 1e3, st->apply_seconds / steps * 1e3,
      st->gather_seconds / steps * 1e3, st->reduce_seconds / steps * 1e3,
      (double)st->parameters_copied / steps);
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 5;
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  if (clpar_device_count() < 2) {
    fprintf(stderr, "bench_data_parallel needs two devices, e.g. POCL_DEVICES=\"basic basic\"\n");
    clpar_shutdown();
    return 1;
  }
  float *x = malloc(sizeof(float) * BATCH * IN);
  int32_t y[BATCH];
  bench_batch(x, y, BATCH, IN, OUT);
  /* Rounds alternate between one and two devices, so that the machine's other load falls on
   * both; the best round of each counts. */
  config one = {0}, two = {0};
  int rounds = 3;
  int good = setup(&one, 1, x, y) && setup(&two, 2, x, y);
  for (int r = 0; good && r < rounds; r++)
    good = round_of(&one, steps, x, y) && round_of(&two, steps, x, y);
  if (good) {
    report(&one, steps, rounds, one.best);
    report(&two, steps, rounds, one.best);
  }
  clpar_optimizer_free(one.opt);
  clpar_optimizer_free(two.opt);
  clpar_module_free(one.dp);
  clpar_module_free(two.dp);
  free(x);
  clpar_shutdown();
  return good ? 0 : 1;
}
