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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loss_plot.h"

enum { FEATURES = 20, CLASSES = 4, HIDDEN = 64, BATCH = 64, TRAIN = 4096, TEST = 1024 };

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 42;
static double uniform(void) { /* xorshift64*, enough for a toy data set */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}
static double normal(void) {
  return sqrt(-2 * log(1 - uniform())) * cos(6.283185307179586 * uniform());
}

/* n points: class c is a Gaussian around a fixed random center. */
static void make_data(float *x, int32_t *y, int n, const float *centers) {
  for (int i = 0; i < n; i++) {
    int c = (int)(uniform() * CLASSES);
    y[i] = c;
    for (int f = 0; f < FEATURES; f++)
      x[i * FEATURES + f] = centers[c * FEATURES + f] + (float)(1.2 * normal());
  }
}

static int check(clpar_status s, const char *what) {
  if (s != CLPAR_OK)
    fprintf(stderr, "%s: %s: %s\n", what, clpar_status_name(s), clpar_last_error());
  return s == CLPAR_OK;
}

static clpar_module *build_mlp(clpar_device *dev) {
  clpar_module *layers[5], *mlp = NULL;
  clpar_manual_seed(1);
  if (!check(clpar_linear_create(FEATURES, HIDDEN, 1, dev, &layers[0]), "Linear") ||
      !check(clpar_relu_create(&layers[1]), "ReLU") ||
      !check(clpar_linear_create(HIDDEN, HIDDEN, 1, dev, &layers[2]), "Linear") ||
      !check(clpar_relu_create(&layers[3]), "ReLU") ||
      !check(clpar_linear_create(HIDDEN, CLASSES, 1, dev, &layers[4]), "Linear"))
    return NULL; /* (a sample: leaks on this path are left to the process's exit) */
  check(clpar_sequential_create(layers, 5, &mlp), "Sequential");
  return mlp;
}

/* Fraction of rows of x whose largest logit is the label. */
static double accuracy(clpar_module *mlp, clpar_device *dev, const float *x, const int32_t *y,
                       int n) {
  clpar_scope *scope = clpar_scope_begin();
  int was = clpar_set_grad_enabled(0);
  clpar_tensor *xt, *logits;
  float *out = malloc((size_t)n * CLASSES * sizeof *out);
  int correct = 0;
  if (out && check(clpar_tensor_from_host(dev, 2, (int64_t[]){n, FEATURES}, x, &xt), "upload") &&
      check(clpar_module_forward(mlp, xt, &logits), "forward") &&
      check(clpar_tensor_read(logits, out, (size_t)n * CLASSES), "read")) {
    for (int i = 0; i < n; i++) {
      int best = 0;
      for (int c = 1; c < CLASSES; c++)
        best = out[i * CLASSES + c] > out[i * CLASSES + best] ? c : best;
      correct += best == y[i];
    }
  }
  free(out);
  clpar_set_grad_enabled(was);
  clpar_scope_end(scope);
  return (double)correct / n;
}

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
  for (int i = 0; i < CLASSES * FEATURES; i++) centers[i] = (float)normal() * 0.6f;
  float *xtr = malloc(sizeof(float) * TRAIN * FEATURES),
        *xte = malloc(sizeof(float) * TEST * FEATURES);
  int32_t *ytr = malloc(sizeof(int32_t) * TRAIN), *yte = malloc(sizeof(int32_t) * TEST);
  make_data(xtr, ytr, TRAIN, centers);
  make_data(xte, yte, TEST, centers);
  clpar_module *mlp = build_mlp(dev);
  clpar_optimizer *opt = NULL;
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  int ok = mlp && check(clpar_adam_create_for(mlp, &adam, &opt), "Adam");
  printf("training on %s: MLP %d-%d-%d-%d, batch %d, Adam lr %g, %d steps\n", clpar_device_id(dev),
         FEATURES, HIDDEN, HIDDEN, CLASSES, BATCH, (double)adam.lr, steps);
  printf("accuracy before training: %.1f%%\n", ok ? 100 * accuracy(mlp, dev, xte, yte, TEST) : 0.0);
  double t0 = now(), first_loss = -1, last_loss = -1;
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
      ok = check(clpar_tensor_read(loss, &l, 1), "read loss");    /* the only wait of the step */
      double t = now(), per_step = (t - t0) / (step - last_step); /* since the last line */
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
  double acc = ok ? accuracy(mlp, dev, xte, yte, TEST) : 0;
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
