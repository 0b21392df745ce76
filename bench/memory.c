/* memory.c — peak device memory per rank of data-parallel training with Adam, plain
 * DistributedDataParallel against ZeRO stages 1, 2 and 3 (include/clpar/zero.h), read from the
 * allocator's counts by category (include/clpar/memory.h), beside DeepSpeed's per-device
 * formulas in fp32 for Ψ parameters on N ranks: DDP 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, ZeRO-2 4Ψ + 12Ψ/N,
 * ZeRO-3 16Ψ/N plus one unit's full parameters and gradient (8Φ, Φ the largest unit's
 * parameters: a Linear(WIDTH, WIDTH)), each plus the activations measured in the same run; and
 * the mean step time. The model: Linear(WIDTH, WIDTH) x LAYERS with ReLUs, then Linear(WIDTH, 16):
 * about 21 M parameters. One JSON object per mode, printed by rank 0; peaks are the largest
 * over the ranks, from a mark after one warm-up step (optimizer state made) over the timed
 * steps.
 *
 *   POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 mpirun -np 2 ./bench_memory [steps] [modes...]
 *   (modes: ddp zero1 zero2 zero3; all four by default)
 */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

enum { BATCH = 16, WIDTH = 2048, LAYERS = 5, OUT = 16 };
static const char *names[4] = {"ddp", "zero1", "zero2", "zero3"};

static clpar_module *wide_mlp(clpar_device *dev) {
  clpar_module *l[2 * LAYERS + 1], *m = NULL;
  clpar_manual_seed(3);
  int good = 1;
  for (int i = 0; good && i < LAYERS; i++)
    good = bench_ok(clpar_linear_create(WIDTH, WIDTH, 1, dev, &l[2 * i]), "Linear") &&
           bench_ok(clpar_relu_create(&l[2 * i + 1]), "ReLU");
  if (good && bench_ok(clpar_linear_create(WIDTH, OUT, 1, dev, &l[2 * LAYERS]), "Linear"))
    bench_ok(clpar_sequential_create(l, 2 * LAYERS + 1, &m), "Sequential");
  return m;
}

/* zero_grad, forward, cross-entropy, backward and the step of the mode's optimizer. */
static int step(clpar_module *ddp, clpar_optimizer *opt, clpar_zero_optimizer *zopt,
                clpar_device *dev, const float *x, const int32_t *y) {
  if (opt) return bench_train_step(ddp, opt, dev, x, y, BATCH, WIDTH);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *logits, *loss;
  int good =
      bench_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){BATCH, WIDTH}, x, &xt), "upload") &&
      bench_ok(clpar_zero_optimizer_zero_grad(zopt), "zero_grad") &&
      bench_ok(clpar_module_forward(ddp, xt, &logits), "forward") &&
      bench_ok(clpar_cross_entropy(logits, y, BATCH, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
      bench_ok(clpar_backward(loss), "backward");
  clpar_scope_end(scope);
  return good && bench_ok(clpar_zero_optimizer_step(zopt), "ZeRO step");
}

/* The largest value of v over the ranks (through a sum of one slot per rank). */
static double max_over_ranks(double v) {
  int n = clpar_dist_world_size();
  float *all = calloc((size_t)n, sizeof(float));
  if (!all) return v;
  all[clpar_dist_rank()] = (float)(v / 1048576.0); /* MiB: exact enough in a float */
  clpar_dist_all_reduce_sum(all, n);
  double most = 0;
  for (int i = 0; i < n; i++) most = all[i] > most ? all[i] : most;
  free(all);
  return most;
}

static int run(int stage, int steps, const float *x, const int32_t *y) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *ddp = NULL, *model = wide_mlp(dev);
  clpar_optimizer *opt = NULL;
  clpar_zero_optimizer *zopt = NULL;
  clpar_ddp_options o = {.zero_stage = stage};
  clpar_adam_options adam = {.lr = 1e-4f};
  double numel = 0; /* counted before ZeRO-3 releases the parameters */
  for (int i = 0; model && i < clpar_module_parameter_count(model); i++) {
    const char *name;
    clpar_tensor *t;
    clpar_module_parameter_at(model, i, &name, &t);
    numel += (double)clpar_tensor_numel(t);
  }
  int good = model && bench_ok(clpar_ddp_create(model, &o, &ddp), "clpar_ddp_create");
  if (good)
    good = stage ? bench_ok(clpar_zero_adam_create(ddp, &adam, &zopt), "ZeRO Adam")
                 : bench_ok(clpar_adam_create_for(ddp, &adam, &opt), "Adam");
  good = good && step(ddp, opt, zopt, dev, x, y) && bench_ok(clpar_device_synchronize(dev), "sync");
  good =
      good && bench_ok(clpar_memory_mark(dev), "mark") && bench_ok(clpar_dist_barrier(), "barrier");
  double t0 = now_seconds();
  for (int i = 0; good && i < steps; i++) good = step(ddp, opt, zopt, dev, x, y);
  good = good && bench_ok(clpar_device_synchronize(dev), "sync") &&
         bench_ok(clpar_dist_barrier(), "barrier");
  double ms = (now_seconds() - t0) * 1e3 / steps;
  double peak[CLPAR_MEM_CATEGORIES];
  for (int c = 0; good && c < CLPAR_MEM_CATEGORIES; c++)
    peak[c] = max_over_ranks((double)clpar_memory_peak(dev, (clpar_mem_category)c));
  if (good && clpar_dist_rank() == 0) {
    double n = clpar_dist_world_size(), psi = numel / 1048576.0; /* MiB per 1 byte/param */
    double unit = (double)WIDTH * (WIDTH + 1) / 1048576.0;
    double f = stage == 0   ? 16 * psi
               : stage == 1 ? 8 * psi + 8 * psi / n
               : stage == 2 ? 4 * psi + 12 * psi / n
                            : 16 * psi / n + 8 * unit;
    double want = f + peak[CLPAR_MEM_ACTIVATIONS];
    printf(
        "{\"bench\": \"memory\", \"mode\": \"%s\", \"ranks\": %d, \"params\": %.0f, "
        "\"batch_per_rank\": %d, \"steps\": %d, \"step_ms\": %.1f, \"peak_mib\": %.1f, "
        "\"formula_mib\": %.1f, \"formula_plus_activations_mib\": %.1f, \"ratio\": %.3f",
        names[stage], (int)n, numel, BATCH, steps, ms, peak[CLPAR_MEM_TOTAL], f, want,
        peak[CLPAR_MEM_TOTAL] / want);
    for (int c = 0; c < CLPAR_MEM_CATEGORIES; c++) /* each category (workspace too), not total */
      if (c != CLPAR_MEM_TOTAL)
        printf(", \"peak_%s_mib\": %.1f", clpar_memory_category_name((clpar_mem_category)c),
               peak[c]);
    printf("}\n");
    fflush(stdout);
  }
  clpar_zero_optimizer_free(zopt);
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
  return good;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 3;
  if (steps < 1) steps = 3;
  if (!bench_ok(clpar_dist_init(), "clpar_dist_init")) return 1;
  float *x = malloc(sizeof(float) * BATCH * WIDTH);
  int32_t *y = malloc(sizeof(int32_t) * BATCH);
  if (!x || !y) return 1;
  bench_batch(x, y, BATCH, WIDTH, OUT);
  int good = 1;
  for (int stage = 0; good && stage < 4; stage++) {
    int wanted = argc <= 2;
    for (int i = 2; i < argc; i++) wanted |= !strcmp(argv[i], names[stage]);
    if (wanted) good = run(stage, steps, x, y);
  }
  free(x);
  free(y);
  clpar_dist_finalize();
  return good ? 0 : 1;
}
