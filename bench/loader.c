/* loader.c — the loader's overlap: a training epoch whose batches come from a shuffling
 * clpar_loader (rows gathered on its thread, uploaded at each step) against the same epoch on
 * data already on the device (row views of one tensor, no gather, no upload). The goal:
 * the ratio at most 1.05. One JSON object on stdout; best of 5 epochs each.
 *
 *   ./bench_loader [samples] [batch] */
#include <stdlib.h>

#include "bench_util.h"

enum { IN = 784, HIDDEN = 512, CLASSES = 10 };

static int step(clpar_module *m, clpar_optimizer *opt, clpar_tensor *x, const int32_t *y,
                int64_t n) {
  clpar_tensor *logits, *loss;
  return bench_ok(clpar_optimizer_zero_grad(opt), "zero_grad") &&
         bench_ok(clpar_module_forward(m, x, &logits), "forward") &&
         bench_ok(clpar_cross_entropy(logits, y, n, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
         bench_ok(clpar_backward(loss), "backward") && bench_ok(clpar_optimizer_step(opt), "step");
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 8192, batch = argc > 2 ? atoll(argv[2]) : 256;
  if (n < 1 || batch < 1 || n % batch) {
    fprintf(stderr, "samples must be a positive multiple of batch\n");
    return 2;
  }
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(0);
  float *x = malloc(sizeof(float) * (size_t)(n * IN));
  int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
  bench_batch(x, y, n, IN, CLASSES);
  clpar_dataset *ds = NULL;
  clpar_loader *loader = NULL;
  clpar_tensor *all = NULL;
  clpar_module *m = bench_mlp(IN, HIDDEN, CLASSES, dev);
  clpar_optimizer *opt = NULL;
  clpar_sgd_options sgd = {.lr = 0.01f, .momentum = 0.9f};
  clpar_loader_options lo = {.batch_size = batch, .shuffle = 1, .seed = 1};
  int ok = m && bench_ok(clpar_sgd_create_for(m, &sgd, &opt), "SGD") &&
           bench_ok(clpar_dataset_from_arrays(n, 1, (int64_t[]){IN}, x, y, &ds), "dataset") &&
           bench_ok(clpar_loader_create(ds, dev, &lo, &loader), "loader") &&
           bench_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){n, IN}, x, &all), "upload");
  double best[2] = {1e30, 1e30};
  for (int rep = 0; ok && rep < 6; rep++) { /* rep 0 warms up */
    for (int mode = 0; ok && mode < 2; mode++) {
      ok = bench_ok(clpar_device_synchronize(dev), "sync");
      double t0 = now_seconds();
      for (int64_t at = 0; ok && at < n; at += batch) {
        clpar_scope *scope = clpar_scope_begin();
        clpar_tensor *xb;
        const int32_t *yb = y + at;
        int64_t rows = batch;
        if (mode == 0)
          ok = bench_ok(clpar_tensor_rows(all, at, batch, &xb), "rows");
        else
          ok = bench_ok(clpar_loader_next(loader, &xb, &yb, &rows), "next");
        ok = ok && step(m, opt, xb, yb, rows);
        clpar_scope_end(scope);
      }
      if (ok && mode == 1) { /* the end-of-epoch call */
        clpar_tensor *none;
        ok = bench_ok(clpar_loader_next(loader, &none, NULL, NULL), "next");
      }
      ok = ok && bench_ok(clpar_device_synchronize(dev), "sync");
      double t = now_seconds() - t0;
      if (rep > 0 && t < best[mode]) best[mode] = t;
    }
  }
  if (ok)
    printf(
        "{\"bench\": \"loader_overlap\", \"device\": \"%s\", \"samples\": %lld, \"batch\": %lld, "
        "\"step_ms_on_device\": %.3f, \"step_ms_loader\": %.3f, \"ratio\": %.3f}\n",
        clpar_device_id(dev), (long long)n, (long long)batch, 1e3 * best[0] / (double)(n / batch),
        1e3 * best[1] / (double)(n / batch), best[1] / best[0]);
  clpar_loader_free(loader);
  clpar_dataset_free(ds);
  clpar_tensor_free(all);
  clpar_optimizer_free(opt);
  clpar_module_free(m);
  free(x);
  free(y);
  clpar_shutdown();
  return ok ? 0 : 1;
}
