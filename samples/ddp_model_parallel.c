/* ddp_model_parallel.c — PyTorch's DDP tutorial's
 * "Combining DDP with Model Parallelism": every process holds ToyMpModel split over
 * two devices (net1 = Linear(10, 10) and ReLU on the first, net2 = Linear(10, 5) on the
 * second), wraps it in DistributedDataParallel, and trains it with MSE and SGD (lr 0.001) on its
 * share of each batch. DDP reduces each gradient from the device it lives on (a bucket never
 * spans two devices).
 *
 * Every rank then checks the data-parallel result: it trains the same model (rank 0's initial
 * weights) on the whole batch of every step in one process and prints the largest difference
 * of the weights; the program fails when one is over 1e-5 of the tensor's largest weight.
 *
 * The devices of a process are entries 2 l and 2 l + 1 (l its local rank, modulo the count) of
 * the selected devices; with one selected, the host backend is the second:
 *   POCL_DEVICES="basic basic basic basic" mpirun -np 2 ./ddp_model_parallel [steps]
 *   mpirun -np 2 ./ddp_model_parallel        (one PoCL device: it and the host per rank) */
#include <clpar/clpar.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "sample_util.h"

enum { IN = 10, HIDDEN = 10, OUT = 5, ROWS = 20 }; /* ROWS per rank and step, as the tutorial */

typedef struct {
  clpar_device *dev0, *dev1;
} mp_devices;

/* def forward(self, x): return self.net2(self.relu(self.net1(x.to(dev0))).to(dev1)) */
static clpar_status mp_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **out,
                               void *user) {
  const mp_devices *d = user;
  clpar_tensor *h;
  clpar_status s = CLPAR_OK;
  if (clpar_tensor_device(x) != d->dev0) s = clpar_tensor_to(x, d->dev0, &x);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "net1"), x, &h);
  if (s == CLPAR_OK) s = clpar_relu(h, &h);
  if (s == CLPAR_OK && d->dev1 != d->dev0) s = clpar_tensor_to(h, d->dev1, &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "net2"), h, out);
  return s; /* the intermediates belong to the caller's scope */
}

static clpar_module *mp_create(mp_devices *d, uint64_t seed) {
  clpar_module *m = NULL, *net1 = NULL, *net2 = NULL;
  clpar_manual_seed(seed);
  if (!check(clpar_module_create("ToyMpModel", mp_forward, d, NULL, &m), "module") ||
      !check(clpar_linear_create(IN, HIDDEN, 1, d->dev0, &net1), "Linear") ||
      !check(clpar_module_add_child(m, "net1", net1), "add net1") ||
      !check(clpar_linear_create(HIDDEN, OUT, 1, d->dev1, &net2), "Linear") ||
      !check(clpar_module_add_child(m, "net2", net2), "add net2")) {
    clpar_module_free(m);
    return NULL;
  }
  return m;
}

/* Rows [row0, row0 + rows) of a step's batch: forward, MSE, backward, SGD step. */
static int train_step(clpar_module *m, clpar_optimizer *opt, const mp_devices *d, const float *x,
                      const float *y, int row0, int rows, float *loss_out) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *yt, *out, *loss;
  int ok = check(clpar_optimizer_zero_grad(opt), "zero_grad") &&
           check(clpar_tensor_from_host(d->dev0, 2, (int64_t[]){rows, IN}, x + row0 * IN, &xt),
                 "upload") &&
           check(clpar_module_forward(m, xt, &out), "forward") &&
           /* labels = torch.randn(20, 5).to(dev1) */
           check(clpar_tensor_from_host(d->dev1, 2, (int64_t[]){rows, OUT}, y + row0 * OUT, &yt),
                 "labels") &&
           check(clpar_mse_loss(out, yt, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
           check(clpar_backward(loss), "backward") && check(clpar_optimizer_step(opt), "step") &&
           (!loss_out || check(clpar_tensor_read(loss, loss_out, 1), "read loss"));
  clpar_scope_end(scope);
  return ok;
}

/* Uniform in [-1, 1), from 24 of the generator's bits. */
static float uniform_pm1(void) {
  return (float)(rng_next() >> 40) / 16777216.0f * 2 - 1;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 20;
  if (steps < 1) steps = 20;
  if (!check(clpar_dist_init(), "clpar_dist_init")) return 1;
  int rank = clpar_dist_rank(), world = clpar_dist_world_size(), n = clpar_device_count();
  int l = clpar_dist_local_rank();
  mp_devices d = {clpar_device_get((2 * l) % n), clpar_device_get((2 * l + 1) % n)};
  if (n == 1) d.dev1 = clpar_device_host();
  printf("rank %d of %d: net1 on %s, net2 on %s\n", rank, world, clpar_device_id(d.dev0),
         clpar_device_id(d.dev1));
  fflush(stdout);

  /* every rank starts from its own weights; DDP broadcasts rank 0's; the reference is made
   * with rank 0's seed */
  clpar_module *inner = mp_create(&d, 1 + (uint64_t)rank), *ddp = NULL;
  clpar_module *ref = mp_create(&d, 1);
  clpar_optimizer *opt = NULL, *ref_opt = NULL;
  clpar_sgd_options sgd = {.lr = 0.001f};
  int ok = inner && ref && check(clpar_ddp_create(inner, NULL, &ddp), "clpar_ddp_create") &&
           check(clpar_sgd_create_for(ddp, &sgd, &opt), "SGD") &&
           check(clpar_sgd_create_for(ref, &sgd, &ref_opt), "SGD");
  int batch = ROWS * world;
  float *x = malloc(sizeof(float) * (size_t)batch * IN),
        *y = malloc(sizeof(float) * (size_t)batch * OUT);
  if (!x || !y) ok = 0;
  rng_seed(7); /* the same on every rank: every rank makes every batch */
  for (int step = 1; ok && step <= steps; step++) {
    for (int i = 0; i < batch * IN; i++) x[i] = uniform_pm1();
    for (int i = 0; i < batch * OUT; i++) y[i] = uniform_pm1();
    float loss = 0;
    ok = train_step(ddp, opt, &d, x, y, rank * ROWS, ROWS, &loss) &&
         check(clpar_dist_all_reduce_mean(&loss, 1), "average the loss") &&
         train_step(ref, ref_opt, &d, x, y, 0, batch, NULL);
    if (ok && rank == 0 && (step == 1 || step % 5 == 0 || step == steps))
      printf("step %3d  loss %.5f (mean over the ranks)\n", step, (double)loss);
  }
  if (ok) ok = check(clpar_ddp_synchronize(ddp), "DistributedDataParallel");
  /* the weights against one process trained on the whole batches */
  double worst = 0;
  for (int i = 0; ok && i < clpar_module_parameter_count(ref); i++) {
    clpar_tensor *a, *b;
    ok = check(clpar_module_parameter_at(ddp, i, NULL, &a), "parameter") &&
         check(clpar_module_parameter_at(ref, i, NULL, &b), "parameter");
    int64_t k = ok ? clpar_tensor_numel(a) : 0;
    float *av = malloc(sizeof(float) * (size_t)k), *bv = malloc(sizeof(float) * (size_t)k);
    ok = ok && av && bv && check(clpar_tensor_read(a, av, (size_t)k), "read") &&
         check(clpar_tensor_read(b, bv, (size_t)k), "read");
    double largest = 0, diff = 0;
    for (int64_t j = 0; ok && j < k; j++) {
      largest = fmax(largest, fabs(bv[j]));
      diff = fmax(diff, fabs((double)av[j] - bv[j]));
    }
    if (largest > 0) worst = fmax(worst, diff / largest);
    free(av);
    free(bv);
  }
  if (ok)
    printf(
        "rank %d: after %d steps the weights differ from one process trained on the whole "
        "batches by at most %.2g of a tensor's largest weight\n",
        rank, steps, worst);
  ok = ok && worst <= 1e-5;
  clpar_optimizer_free(opt);
  clpar_optimizer_free(ref_opt);
  clpar_module_free(ddp);
  clpar_module_free(ref);
  free(x);
  free(y);
  clpar_dist_finalize();
  return ok ? 0 : 1;
}
