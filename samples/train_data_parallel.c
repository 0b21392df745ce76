/* train_data_parallel.c — trains an MLP with DataParallel over every selected device, then
 * trains the same MLP from the same seed on one device, and shows that the weights agree.
 * Prints the loss and samples per second of each epoch. The task: 8 classes of overlapping
 * Gaussian clusters in 32 dimensions; the model Linear(32, 256) -> ReLU -> Linear(256, 256) ->
 * ReLU -> Linear(256, 8); SGD with momentum; cross-entropy.
 *
 *   POCL_DEVICES="pthread pthread pthread pthread" ./train_data_parallel [epochs]
 *       [--loss-plot loss.png]
 *
 * --loss-plot: the DataParallel run's loss per step as a curve (loss_plot.h: loss.dat and,
 * with gnuplot, loss.png). */
#include <clpar/clpar.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample_util.h"

#include "loss_plot.h"

enum { FEATURES = 32, HIDDEN = 256, CLASSES = 8, SAMPLES = 4096, BATCH = 256 };

static clpar_module *make_mlp(clpar_device *dev) {
  clpar_module *l[5], *m = NULL;
  clpar_manual_seed(2024); /* the same initial weights for both runs */
  if (check(clpar_linear_create(FEATURES, HIDDEN, 1, dev, &l[0]), "Linear") &&
      check(clpar_relu_create(&l[1]), "ReLU") &&
      check(clpar_linear_create(HIDDEN, HIDDEN, 1, dev, &l[2]), "Linear") &&
      check(clpar_relu_create(&l[3]), "ReLU") &&
      check(clpar_linear_create(HIDDEN, CLASSES, 1, dev, &l[4]), "Linear"))
    check(clpar_sequential_create(l, 5, &m), "Sequential");
  return m;
}

/* Trains m for epochs over the data set (on dev), printing a line per epoch when label. */
static int train(clpar_module *m, clpar_device *dev, clpar_tensor *x, const int32_t *y, int epochs,
                 const char *label, loss_plot *plot) {
  clpar_optimizer *opt = NULL;
  clpar_sgd_options sgd = {.lr = 0.05f, .momentum = 0.9f};
  int ok = check(clpar_sgd_create_for(m, &sgd, &opt), "SGD");
  for (int e = 1; ok && e <= epochs; e++) {
    double t0 = now_seconds(), sum = 0;
    for (int at = 0; ok && at < SAMPLES; at += BATCH) {
      clpar_scope *step = clpar_scope_begin();
      clpar_tensor *xb, *logits, *loss;
      float l = 0;
      ok = check(clpar_tensor_rows(x, at, BATCH, &xb), "batch") &&
           check(clpar_optimizer_zero_grad(opt), "zero_grad") &&
           check(clpar_module_forward(m, xb, &logits), "forward") &&
           check(clpar_cross_entropy(logits, y + at, BATCH, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
           check(clpar_backward(loss), "backward") && check(clpar_optimizer_step(opt), "step") &&
           check(clpar_tensor_read(loss, &l, 1), "read loss");
      sum += l;
      loss_plot_add(plot, (e - 1) + (double)(at + BATCH) / SAMPLES, l);
      clpar_scope_end(step);
    }
    ok = ok && check(clpar_device_synchronize(dev), "sync");
    double secs = now_seconds() - t0;
    if (ok && label)
      printf("%s epoch %d  loss %.4f  %.0f samples/s\n", label, e, sum / (SAMPLES / BATCH),
             SAMPLES / secs);
    fflush(stdout);
  }
  clpar_optimizer_free(opt);
  return ok;
}

int main(int argc, char **argv) {
  int epochs = 5;
  loss_plot plot = {0}, none = {0};
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--loss-plot") && i + 1 < argc)
      plot.png = argv[++i];
    else
      epochs = atoi(argv[i]);
  if (epochs < 1) epochs = 5;
  if (!check(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(0);
  /* the data set: the counter-based generator makes it the same on every device */
  clpar_tensor *centers, *noise, *x;
  int32_t *y = malloc(sizeof(int32_t) * SAMPLES);
  float *xc = malloc(sizeof(float) * SAMPLES * FEATURES),
        *c = malloc(sizeof(float) * CLASSES * FEATURES);
  int ok = check(clpar_tensor_rand_normal(clpar_device_host(), 2, (int64_t[]){CLASSES, FEATURES}, 1,
                                          0, 1, &centers),
                 "data") &&
           check(clpar_tensor_rand_normal(clpar_device_host(), 2, (int64_t[]){SAMPLES, FEATURES}, 2,
                                          0, 1.5f, &noise),
                 "data") &&
           check(clpar_tensor_read(centers, c, CLASSES * FEATURES), "data") &&
           check(clpar_tensor_read(noise, xc, SAMPLES * FEATURES), "data");
  for (int i = 0; ok && i < SAMPLES; i++) {
    y[i] = (i * 7 + i / 3) % CLASSES;
    for (int f = 0; f < FEATURES; f++) xc[i * FEATURES + f] += c[y[i] * FEATURES + f];
  }
  ok = ok && check(clpar_tensor_from_host(dev, 2, (int64_t[]){SAMPLES, FEATURES}, xc, &x), "data");
  printf("DataParallel over %d device(s):", clpar_device_count());
  for (int i = 0; i < clpar_device_count(); i++)
    printf(" %s", clpar_device_id(clpar_device_get(i)));
  printf("\n");
  clpar_module *dp = NULL, *single = NULL;
  ok = ok && check(clpar_data_parallel_create(make_mlp(dev), NULL, &dp), "DataParallel") &&
       train(dp, dev, x, y, epochs, "DataParallel", &plot);
  printf("the same model from the same seed on %s alone:\n", clpar_device_id(dev));
  ok = ok && (single = make_mlp(dev)) && train(single, dev, x, y, epochs, "one device  ", &none);
  double worst = 0;
  for (int i = 0; ok && i < clpar_module_parameter_count(single); i++) {
    clpar_tensor *a, *b;
    ok = check(clpar_module_parameter_at(single, i, NULL, &a), "params") &&
         check(clpar_module_parameter_at(dp, i, NULL, &b), "params");
    size_t n = ok ? (size_t)clpar_tensor_numel(a) : 0;
    float *va = malloc(n * sizeof *va), *vb = malloc(n * sizeof *vb);
    ok = ok && check(clpar_tensor_read(a, va, n), "read") &&
         check(clpar_tensor_read(b, vb, n), "read");
    for (size_t j = 0; ok && j < n; j++) {
      double d = fabs((double)va[j] - vb[j]) / (1e-3 + fabs((double)va[j]));
      worst = d > worst ? d : worst;
    }
    free(va);
    free(vb);
  }
  int match = ok && worst < 1e-3;
  if (ok)
    printf("weights after %d epochs: largest relative difference %.2e: %s\n", epochs, worst,
           match ? "they match" : "THEY DIFFER");
  if (ok) match = loss_plot_write(&plot, "epoch", "train_data_parallel: DataParallel") && match;
  loss_plot_free(&plot);
  clpar_module_free(dp);
  clpar_module_free(single);
  clpar_tensor_free(x);
  clpar_tensor_free(centers);
  clpar_tensor_free(noise);
  free(y);
  free(xc);
  free(c);
  clpar_shutdown();
  return match ? 0 : 1;
}
