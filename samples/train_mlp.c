/* train_mlp.c — trains an MLP classifier on one device: a synthetic task of 4 overlapping
 * Gaussian classes in 20 dimensions, Linear(20, 64) -> ReLU -> Linear(64, 64) -> ReLU ->
 * Linear(64, 4), cross-entropy, Adam. Prints step, loss and time per step as it goes, then
 * the accuracy on held-out data. The device is the first selected one:
 *
 *   CLPAR_DEVICES=opencl:0 ./train_mlp [steps] [--loss-plot loss.png]      (default 300)
 *
 * --loss-plot: the loss of every printed step as a curve (loss_plot.h: loss.dat and, with
 * gnuplot, loss.png). */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample_util.h"

#include "loss_plot.h"

enum { FEATURES = 20, CLASSES = 4, HIDDEN = 64, BATCH = 64, TRAIN = 4096, TEST = 1024 };

int main(int argc, char **argv) {
  int steps = 300;
  loss_plot plot = {0};
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--loss-plot") && i + 1 < argc)
      plot.png = argv[++i];
    else
      steps = atoi(argv[i]);
  if (steps < 1) steps = 300;
  if (!check(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(0);
  float centers[CLASSES * FEATURES];
  rng_seed(42);
  for (int i = 0; i < CLASSES * FEATURES; i++) centers[i] = (float)normal() * 0.6f;
  float *xtr = malloc(sizeof(float) * TRAIN * FEATURES),
        *xte = malloc(sizeof(float) * TEST * FEATURES);
  int32_t *ytr = malloc(sizeof(int32_t) * TRAIN), *yte = malloc(sizeof(int32_t) * TEST);
  make_blobs(xtr, ytr, TRAIN, centers, FEATURES, CLASSES);
  make_blobs(xte, yte, TEST, centers, FEATURES, CLASSES);
  clpar_module *mlp = build_mlp(FEATURES, HIDDEN, CLASSES, dev, 1);
  clpar_optimizer *opt = NULL;
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  int ok = mlp && check(clpar_adam_create_for(mlp, &adam, &opt), "Adam");
  printf("training on %s: MLP %d-%d-%d-%d, batch %d, Adam lr %g, %d steps\n", clpar_device_id(dev),
         FEATURES, HIDDEN, HIDDEN, CLASSES, BATCH, (double)adam.lr, steps);
  printf("accuracy before training: %.1f%%\n",
         ok ? 100 * accuracy(mlp, dev, xte, yte, TEST, FEATURES, CLASSES) : 0.0);
  double t0 = now_seconds(), first_loss = -1, last_loss = -1;
  int last_step = 0;
  for (int step = 1; ok && step <= steps; step++) {
    clpar_scope *scope = clpar_scope_begin();
    int at = ((step - 1) * BATCH) % TRAIN;
    clpar_tensor *x, *logits, *loss;
    ok =
        check(clpar_tensor_from_host(dev, 2, (int64_t[]){BATCH, FEATURES}, xtr + at * FEATURES, &x),
              "upload") &&
        check(clpar_optimizer_zero_grad(opt), "zero_grad") &&
        check(clpar_module_forward(mlp, x, &logits), "forward") &&
        check(clpar_cross_entropy(logits, ytr + at, BATCH, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
        check(clpar_backward(loss), "backward") && check(clpar_optimizer_step(opt), "step");
    if (ok && (step == 1 || step % 25 == 0 || step == steps)) {
      float l = 0;
      ok = check(clpar_tensor_read(loss, &l, 1), "read loss"); /* the only wait of the step */
      double t = now_seconds(), per_step = (t - t0) / (step - last_step); /* since the last line */
      t0 = t;
      last_step = step;
      printf("step %4d  loss %.4f  %.2f ms/step\n", step, (double)l, per_step * 1e3);
      fflush(stdout);
      if (first_loss < 0) first_loss = l;
      last_loss = l;
      loss_plot_add(&plot, step, l);
    }
    clpar_scope_end(scope);
  }
  double acc = ok ? accuracy(mlp, dev, xte, yte, TEST, FEATURES, CLASSES) : 0;
  if (ok) printf("loss %.4f -> %.4f; held-out accuracy %.1f%%\n", first_loss, last_loss, 100 * acc);
  if (ok) ok = loss_plot_write(&plot, "step", "train_mlp: cross-entropy, Adam");
  loss_plot_free(&plot);
  clpar_optimizer_free(opt);
  clpar_module_free(mlp);
  free(xtr);
  free(xte);
  free(ytr);
  free(yte);
  clpar_shutdown();
  return ok && last_loss < first_loss ? 0 : 1;
}
