/* train_digits.c — trains a classifier on the UCI handwritten digits (samples/data: 1,797 8x8
 * images, 10 classes) read from its gzip-compressed CSV, with DataParallel over every selected
 * device. A fixed split: every fifth sample is the test set (360), the rest the training set
 * (1,437). The loader shuffles the training set with a seed and gathers the next batch on its
 * thread; a progress bar per epoch (loss, accuracy, samples/s) goes to stderr; a checkpoint is
 * saved after each epoch, and --resume continues from it.
 *
 *   ./train_digits [--epochs N] [--data digits.csv.gz] [--checkpoint PATH] [--resume]
 *                  [--loss-plot loss.png]
 *
 * --loss-plot: the loss of every step of this run as a curve over epochs (loss_plot.h:
 * loss.dat and, with gnuplot, loss.png). */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loss_plot.h"
#include "sample_util.h"

#ifndef DIGITS_CSV
#define DIGITS_CSV "samples/data/digits.csv.gz"
#endif

enum { PIXELS = 64, HIDDEN = 256, CLASSES = 10, BATCH = 64 };

/* Splits all (pixels scaled to [0, 1]) into the training and test sets. */
static int split(const clpar_dataset *all, clpar_dataset **train, clpar_dataset **test) {
  int64_t n = clpar_dataset_size(all), nt = (n + 4) / 5;
  float *x[2] = {malloc(sizeof(float) * PIXELS * (size_t)n),
                 malloc(sizeof(float) * PIXELS * (size_t)n)};
  int32_t *y[2] = {malloc(sizeof(int32_t) * (size_t)n), malloc(sizeof(int32_t) * (size_t)n)};
  int64_t at[2] = {0, 0};
  for (int64_t i = 0; x[0] && x[1] && y[0] && y[1] && i < n; i++) {
    int k = i % 5 == 0; /* 1: test */
    const float *src = clpar_dataset_features(all, i);
    for (int p = 0; p < PIXELS; p++) x[k][at[k] * PIXELS + p] = src[p] / 16.0f;
    y[k][at[k]++] = clpar_dataset_label(all, i);
  }
  int ok =
      at[1] == nt &&
      check(clpar_dataset_from_arrays(at[0], 1, (int64_t[]){PIXELS}, x[0], y[0], train),
            "train set") &&
      check(clpar_dataset_from_arrays(at[1], 1, (int64_t[]){PIXELS}, x[1], y[1], test), "test set");
  for (int k = 0; k < 2; k++) {
    free(x[k]);
    free(y[k]);
  }
  return ok;
}

static int argmax(const float *v) {
  int best = 0;
  for (int c = 1; c < CLASSES; c++) best = v[c] > v[best] ? c : best;
  return best;
}

/* Test accuracy of m (on dev) over ds, without recording a graph. */
static int evaluate(clpar_module *m, clpar_device *dev, const clpar_dataset *ds, double *acc) {
  int64_t n = clpar_dataset_size(ds), right = 0;
  float *x = malloc(sizeof(float) * PIXELS * (size_t)n),
        *logits = malloc(sizeof(float) * CLASSES * (size_t)n);
  for (int64_t i = 0; x && i < n; i++)
    memcpy(x + i * PIXELS, clpar_dataset_features(ds, i), sizeof(float) * PIXELS);
  int was = clpar_set_grad_enabled(0);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *out;
  int ok = x && logits &&
           check(clpar_tensor_from_host(dev, 2, (int64_t[]){n, PIXELS}, x, &xt), "test data") &&
           check(clpar_module_forward(m, xt, &out), "forward") &&
           check(clpar_tensor_read(out, logits, (size_t)(n * CLASSES)), "read");
  clpar_scope_end(scope);
  clpar_set_grad_enabled(was);
  for (int64_t i = 0; ok && i < n; i++)
    right += argmax(logits + i * CLASSES) == clpar_dataset_label(ds, i);
  *acc = (double)right / (double)n;
  free(x);
  free(logits);
  return ok;
}

/* Redrawn in place on a terminal; elsewhere (a log, a pipe) only the epoch's last state. */
static void bar(int epoch, int epochs, int64_t done, int64_t total, double loss, double acc,
                double rate) {
  static int tty = -1;
  if (tty < 0) tty = isatty(fileno(stderr));
  if (!tty && done < total) return;
  char b[31];
  int fill = (int)(30 * done / total);
  for (int i = 0; i < 30; i++) b[i] = i < fill ? '#' : '.';
  b[30] = '\0';
  fprintf(stderr, "\repoch %3d/%d [%s] loss %.4f  acc %5.1f%%  %6.0f samples/s", epoch, epochs, b,
          loss, 100 * acc, rate);
}

/* One epoch over the loader; *loss and *acc are the epoch's means on the training batches. */
static int train_epoch(clpar_module *m, clpar_optimizer *opt, clpar_loader *loader, int epoch,
                       int epochs, int64_t total, int64_t *step, loss_plot *plot) {
  double t0 = now_seconds(), sum = 0;
  int64_t seen = 0, right = 0, batches = 0;
  float logits[BATCH * CLASSES];
  for (int ok = 1;;) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x, *out, *loss;
    const int32_t *y;
    int64_t n;
    float l = 0;
    ok = check(clpar_loader_next(loader, &x, &y, &n), "loader");
    if (ok && !x) {
      clpar_scope_end(scope);
      break;
    }
    ok = ok && check(clpar_optimizer_zero_grad(opt), "zero_grad") &&
         check(clpar_module_forward(m, x, &out), "forward") &&
         check(clpar_cross_entropy(out, y, n, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
         check(clpar_backward(loss), "backward") && check(clpar_optimizer_step(opt), "step") &&
         check(clpar_tensor_read(loss, &l, 1), "read loss") &&
         check(clpar_tensor_read(out, logits, (size_t)(n * CLASSES)), "read logits");
    for (int64_t i = 0; ok && i < n; i++) right += argmax(logits + i * CLASSES) == y[i];
    clpar_scope_end(scope);
    if (!ok) return 0;
    sum += l;
    seen += n;
    loss_plot_add(plot, epoch - 1 + (double)seen / (double)total, l);
    batches++;
    (*step)++;
    bar(epoch, epochs, seen, total, sum / (double)batches, (double)right / (double)seen,
        (double)seen / (now_seconds() - t0));
  }
  return 1;
}

int main(int argc, char **argv) {
  const char *data = DIGITS_CSV, *ckpt = "train_digits.safetensors";
  int epochs = 30, resume = 0;
  loss_plot plot = {0};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--epochs") && i + 1 < argc)
      epochs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--data") && i + 1 < argc)
      data = argv[++i];
    else if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc)
      ckpt = argv[++i];
    else if (!strcmp(argv[i], "--resume"))
      resume = 1;
    else if (!strcmp(argv[i], "--loss-plot") && i + 1 < argc)
      plot.png = argv[++i];
    else {
      fprintf(stderr,
              "usage: %s [--epochs N] [--data digits.csv.gz] [--checkpoint PATH] [--resume] "
              "[--loss-plot loss.png]\n",
              argv[0]);
      return 2;
    }
  }
  if (epochs < 1) epochs = 30;
  if (!check(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(0);
  clpar_dataset *all = NULL, *train = NULL, *test = NULL;
  clpar_module *l[3], *seq = NULL, *dp = NULL;
  clpar_optimizer *opt = NULL;
  clpar_loader *loader = NULL;
  clpar_manual_seed(7);
  clpar_sgd_options sgd = {.lr = 0.05f, .momentum = 0.9f};
  clpar_loader_options lo = {.batch_size = BATCH, .shuffle = 1, .seed = 1234, .drop_last = 0};
  int ok = check(clpar_dataset_from_csv(data, -1, 0, &all), "reading the digits") &&
           split(all, &train, &test) &&
           check(clpar_linear_create(PIXELS, HIDDEN, 1, dev, &l[0]), "Linear") &&
           check(clpar_relu_create(&l[1]), "ReLU") &&
           check(clpar_linear_create(HIDDEN, CLASSES, 1, dev, &l[2]), "Linear") &&
           check(clpar_sequential_create(l, 3, &seq), "Sequential") &&
           check(clpar_data_parallel_create(seq, NULL, &dp), "DataParallel") &&
           check(clpar_sgd_create_for(dp, &sgd, &opt), "SGD") &&
           check(clpar_loader_create(train, dev, &lo, &loader), "loader");
  int64_t step = 0, epoch = 0;
  if (ok) {
    fprintf(stderr, "%lld training and %lld test samples from %s; DataParallel over %d device(s):",
            (long long)clpar_dataset_size(train), (long long)clpar_dataset_size(test), data,
            clpar_device_count());
    for (int i = 0; i < clpar_device_count(); i++)
      fprintf(stderr, " %s", clpar_device_id(clpar_device_get(i)));
    fprintf(stderr, "\n");
  }
  if (ok && resume && access(ckpt, F_OK) == 0) {
    ok = check(clpar_checkpoint_load(ckpt, dp, opt, &step, &epoch), "resuming") &&
         check(clpar_loader_set_epoch(loader, epoch), "loader");
    if (ok)
      fprintf(stderr, "resumed from %s after epoch %lld (step %lld)\n", ckpt, (long long)epoch,
              (long long)step);
  }
  double acc = 0;
  for (; ok && epoch < epochs; epoch++) {
    ok = train_epoch(dp, opt, loader, (int)epoch + 1, epochs, clpar_dataset_size(train), &step,
                     &plot) &&
         evaluate(dp, dev, test, &acc) &&
         check(clpar_checkpoint_save(ckpt, dp, opt, step, epoch + 1), "checkpoint");
    if (ok) fprintf(stderr, "  test acc %5.1f%%\n", 100 * acc);
  }
  if (ok && acc == 0) ok = evaluate(dp, dev, test, &acc);
  if (ok)
    printf("test accuracy after %d epochs: %.2f%% (%lld of %lld)\n", epochs, 100 * acc,
           (long long)(acc * (double)clpar_dataset_size(test) + 0.5),
           (long long)clpar_dataset_size(test));
  if (ok) ok = loss_plot_write(&plot, "epoch", "train_digits: cross-entropy, SGD");
  loss_plot_free(&plot);
  clpar_loader_free(loader);
  clpar_optimizer_free(opt);
  clpar_module_free(dp);
  clpar_dataset_free(all);
  clpar_dataset_free(train);
  clpar_dataset_free(test);
  clpar_shutdown();
  return ok ? 0 : 1;
}
