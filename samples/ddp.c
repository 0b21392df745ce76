/* ddp.c — the MLP of train_mlp.c trained with DistributedDataParallel, one process per
 * device: every rank makes the same synthetic data set (4 Gaussian classes in 20 dimensions),
 * trains on its share of it (rows rank, rank + world, ... as PyTorch's DistributedSampler
 * takes them), and DDP averages the gradients, so all ranks hold the same weights after
 * every step. Rank 0 prints the loss averaged over the ranks, samples per second over the
 * whole job, and the held-out accuracy; each rank ends with its device's peak memory per
 * category on stderr.
 *
 *   mpirun -np 2 ./ddp [steps]                            (default 200)
 *   mpirun -np 4 --host a:2,b:2 ./ddp                     (two machines, README) */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>

#include "sample_util.h"

enum { FEATURES = 20, CLASSES = 4, HIDDEN = 64, BATCH = 64, TRAIN = 8192, TEST = 1024 };

/* This rank's share: rows rank, rank + world, ... of the training set. */
static int take_share(const float *x, const int32_t *y, float *sx, int32_t *sy) {
  int rank = clpar_dist_rank(), world = clpar_dist_world_size(), n = 0;
  for (int i = rank; i < TRAIN; i += world, n++) {
    for (int f = 0; f < FEATURES; f++) sx[n * FEATURES + f] = x[i * FEATURES + f];
    sy[n] = y[i];
  }
  return n;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 200;
  if (steps < 1) steps = 200;
  if (!check(clpar_dist_init(), "clpar_dist_init")) return 1;
  int rank = clpar_dist_rank(), world = clpar_dist_world_size();
  clpar_device *dev = clpar_dist_device();
  float centers[CLASSES * FEATURES];
  rng_seed(42); /* the data: the same on every rank */
  for (int i = 0; i < CLASSES * FEATURES; i++) centers[i] = (float)normal() * 0.6f;
  float *xtr = malloc(sizeof(float) * TRAIN * FEATURES),
        *xs = malloc(sizeof(float) * TRAIN * FEATURES),
        *xte = malloc(sizeof(float) * TEST * FEATURES);
  int32_t *ytr = malloc(sizeof(int32_t) * TRAIN), *ys = malloc(sizeof(int32_t) * TRAIN),
          *yte = malloc(sizeof(int32_t) * TEST);
  if (!xtr || !xs || !xte || !ytr || !ys || !yte) return 1;
  make_blobs(xtr, ytr, TRAIN, centers, FEATURES, CLASSES);
  make_blobs(xte, yte, TEST, centers, FEATURES, CLASSES);
  int share = take_share(xtr, ytr, xs, ys);
  printf("rank %d of %d (local rank %d) on %s: %d of %d training samples (rows %d, %d, %d, ...)\n",
         rank, world, clpar_dist_local_rank(), clpar_device_id(dev), share, TRAIN, rank,
         rank + world, rank + 2 * world);
  fflush(stdout);

  /* a seed per rank: DDP starts every rank from rank 0's weights */
  clpar_module *mlp = build_mlp(FEATURES, HIDDEN, CLASSES, dev, 1 + (uint64_t)clpar_dist_rank());
  clpar_module *ddp = NULL;
  clpar_optimizer *opt = NULL;
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  int ok = mlp && check(clpar_ddp_create(mlp, NULL, &ddp), "clpar_ddp_create") &&
           check(clpar_adam_create_for(ddp, &adam, &opt), "Adam");
  if (ok && rank == 0)
    printf("DistributedDataParallel over %d ranks: MLP %d-%d-%d-%d, batch %d per rank, Adam\n",
           world, FEATURES, HIDDEN, HIDDEN, CLASSES, BATCH);
  double t0 = now_seconds(), first_loss = -1, last_loss = -1;
  int last_step = 0;
  for (int step = 1; ok && step <= steps; step++) {
    clpar_scope *scope = clpar_scope_begin();
    int at = ((step - 1) * BATCH) % (share - BATCH + 1);
    clpar_tensor *x, *logits, *loss;
    /* backward returns with the gradients averaged over the ranks: the step follows */
    ok = check(clpar_tensor_from_host(dev, 2, (int64_t[]){BATCH, FEATURES}, xs + at * FEATURES, &x),
               "upload") &&
         check(clpar_optimizer_zero_grad(opt), "zero_grad") &&
         check(clpar_module_forward(ddp, x, &logits), "forward") &&
         check(clpar_cross_entropy(logits, ys + at, BATCH, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
         check(clpar_backward(loss), "backward") && check(clpar_optimizer_step(opt), "step");
    if (ok && (step == 1 || step % 25 == 0 || step == steps)) {
      float l = 0;
      ok = check(clpar_tensor_read(loss, &l, 1), "read loss") &&
           check(clpar_dist_all_reduce_mean(&l, 1), "average the loss");
      double t = now_seconds(), rate = (double)(step - last_step) * BATCH * world / (t - t0);
      t0 = t;
      last_step = step;
      if (rank == 0) printf("step %4d  loss %.4f  %.0f samples/s\n", step, (double)l, rate);
      fflush(stdout);
      if (first_loss < 0) first_loss = l;
      last_loss = l;
    }
    clpar_scope_end(scope);
  }
  if (ok) ok = check(clpar_ddp_synchronize(ddp), "DistributedDataParallel");
  double acc = ok ? accuracy(ddp, dev, xte, yte, TEST, FEATURES, CLASSES) : 0;
  if (ok && rank == 0)
    printf("loss %.4f -> %.4f; held-out accuracy %.1f%%\n", first_loss, last_loss, 100 * acc);
  if (ok) print_memory_peaks(dev); /* each rank its device's, on stderr */
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
  free(xtr);
  free(xs);
  free(xte);
  free(ytr);
  free(ys);
  free(yte);
  clpar_dist_finalize();
  return ok && last_loss < first_loss ? 0 : 1;
}
