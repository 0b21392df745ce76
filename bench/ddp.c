/* ddp.c — DistributedDataParallel: samples per second of a compute-bound MLP training step
 * with a fixed batch per rank (so N ranks train N times the samples of one), and where the
 * communication thread's time goes per step: reading gradients to host memory (which waits
 * for the device to compute them), MPI_Allreduce (which includes waiting for the slowest
 * rank) and writing the averages back. "hidden" is the share of allreduce + write that ran
 * while the device still had backward work: 1 - exposed / (allreduce + write), exposed being
 * that time for the last bucket. One JSON object per run, printed by rank 0; bench/ddp.sh runs
 * 1 and 2 ranks and a bucket-size sweep and prints the scaling efficiency.
 *
 *   POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 mpirun -np 2 ./bench_ddp [steps] [bucket_cap_mb]
 */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>

enum { BATCH = 256, WIDTH = 512, LAYERS = 6, OUT = 16 };

/* LAYERS x (Linear(WIDTH, WIDTH), ReLU), then Linear(WIDTH, OUT): 1 MiB weights, so that the
 * bucket cap decides how many buckets there are. */
static clpar_module *deep_mlp(clpar_device *dev) {
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

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 10;
  double cap = argc > 2 ? atof(argv[2]) : 0;
  if (steps < 1) steps = 10;
  if (!bench_ok(clpar_dist_init(), "clpar_dist_init")) return 1;
  clpar_device *dev = clpar_dist_device();
  float *x = malloc(sizeof(float) * BATCH * WIDTH);
  int32_t *y = malloc(sizeof(int32_t) * BATCH);
  if (!x || !y) return 1;
  bench_batch(x, y, BATCH, WIDTH, OUT);
  clpar_module *model = deep_mlp(dev), *ddp = NULL;
  clpar_optimizer *opt = NULL;
  clpar_sgd_options sgd = {.lr = 0.01f, .momentum = 0.9f};
  clpar_ddp_options o = {.bucket_cap_mb = cap};
  int good = model && bench_ok(clpar_ddp_create(model, &o, &ddp), "clpar_ddp_create") &&
             bench_ok(clpar_sgd_create_for(ddp, &sgd, &opt), "SGD");
  /* two warm-up steps: kernels compile, the allocators' caches fill */
  for (int i = 0; good && i < 2; i++) good = bench_train_step(ddp, opt, dev, x, y, BATCH, WIDTH);
  good = good && bench_ok(clpar_device_synchronize(dev), "sync") &&
         bench_ok(clpar_dist_barrier(), "barrier");
  clpar_ddp_stats before = {0}, after = {0};
  if (good) clpar_ddp_stats_get(ddp, &before);
  double t0 = now_seconds();
  for (int i = 0; good && i < steps; i++)
    good = bench_train_step(ddp, opt, dev, x, y, BATCH, WIDTH);
  good = good && bench_ok(clpar_device_synchronize(dev), "sync") &&
         bench_ok(clpar_ddp_synchronize(ddp), "DistributedDataParallel");
  double per = (now_seconds() - t0) / steps;
  if (good) clpar_ddp_stats_get(ddp, &after);
  /* the ranks meet at every bucket, so their step times agree; report their mean */
  float mean_per = (float)per;
  int ok_all = good && bench_ok(clpar_dist_all_reduce_mean(&mean_per, 1), "average");
  per = mean_per;
  if (ok_all && clpar_dist_rank() == 0) {
    int world = clpar_dist_world_size();
    double read = (after.read_seconds - before.read_seconds) / steps,
           ar = (after.allreduce_seconds - before.allreduce_seconds) / steps,
           write = (after.write_seconds - before.write_seconds) / steps,
           exposed = (after.exposed_seconds - before.exposed_seconds) / steps;
    double hidden = ar + write > 0 ? 1.0 - exposed / (ar + write) : 1.0;
    printf(
        "{\"bench\": \"ddp\", \"ranks\": %d, \"device\": \"%s\", \"model\": \"MLP "
        "%d x %d-%d, then %d\", \"batch_per_rank\": %d, \"steps\": %d, \"bucket_cap_mb\": %g, "
        "\"buckets\": %d, \"ms_per_step\": %.1f, \"samples_per_s\": %.1f, "
        "\"per_step_ms\": {\"read\": %.2f, \"allreduce\": %.2f, \"write\": %.2f, "
        "\"exposed\": %.2f}, \"hidden\": %.3f}\n",
        world, clpar_device_id(dev), LAYERS, WIDTH, WIDTH, OUT, BATCH, steps, cap > 0 ? cap : 25.0,
        after.buckets, per * 1e3, world * BATCH / per, read * 1e3, ar * 1e3, write * 1e3,
        exposed * 1e3, hidden);
  }
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
  free(x);
  free(y);
  clpar_dist_finalize();
  return ok_all ? 0 : 1;
}
