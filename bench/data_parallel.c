/* data_parallel.c — samples per second of a compute-bound MLP training step (forward,
 * cross-entropy, backward, SGD step) with DataParallel over 1 and over 2 devices, in one run,
 * and the speedup; with the host time per step spent scattering, copying parameters to the
 * replicas, gathering and reducing gradients. One JSON object per device count.
 *
 * On this 2-core machine, the meaningful set-up is two PoCL "basic" devices, each in its own
 * context and driven by its own host thread (DESIGN.md):
 *   POCL_DEVICES="basic basic" POCL_MAX_PTHREAD_COUNT=1 ./bench_data_parallel [steps] */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BATCH = 512, IN = 1024, HIDDEN = 1024, OUT = 16 };

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ok(clpar_status s, const char *what) {
  if (s != CLPAR_OK)
    fprintf(stderr, "%s: %s: %s\n", what, clpar_status_name(s), clpar_last_error());
  return s == CLPAR_OK;
}

static clpar_module *make_model(clpar_device *dev) {
  clpar_module *l[5], *m = NULL;
  clpar_manual_seed(3);
  if (ok(clpar_linear_create(IN, HIDDEN, 1, dev, &l[0]), "Linear") &&
      ok(clpar_relu_create(&l[1]), "ReLU") &&
      ok(clpar_linear_create(HIDDEN, HIDDEN, 1, dev, &l[2]), "Linear") &&
      ok(clpar_relu_create(&l[3]), "ReLU") &&
      ok(clpar_linear_create(HIDDEN, OUT, 1, dev, &l[4]), "Linear"))
    ok(clpar_sequential_create(l, 5, &m), "Sequential");
  return m;
}

static int step(clpar_module *dp, clpar_optimizer *opt, clpar_device *dev, const float *x,
                const int32_t *y) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *logits, *loss;
  int good = ok(clpar_tensor_from_host(dev, 2, (int64_t[]){BATCH, IN}, x, &xt), "upload") &&
             ok(clpar_optimizer_zero_grad(opt), "zero_grad") &&
             ok(clpar_module_forward(dp, xt, &logits), "forward") &&
             ok(clpar_cross_entropy(logits, y, BATCH, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
             ok(clpar_backward(loss), "backward") && ok(clpar_optimizer_step(opt), "step");
  clpar_scope_end(scope);
  return good;
}

/* Samples per second over steps steps with DataParallel on the first n devices; -1 on error. */
static double run(int n, int steps, const float *x, const int32_t *y, double *baseline) {
  clpar_device *devs[2] = {clpar_device_get(0), clpar_device_get(1)};
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  clpar_module *model = make_model(devs[0]), *dp = NULL;
  clpar_optimizer *opt = NULL;
  clpar_sgd_options sgd = {.lr = 0.01f, .momentum = 0.9f};
  double rate = -1;
  if (model && ok(clpar_data_parallel_create(model, &o, &dp), "DataParallel") &&
      ok(clpar_sgd_create_for(dp, &sgd, &opt), "SGD") && step(dp, opt, devs[0], x, y) &&
      step(dp, opt, devs[0], x, y) && ok(clpar_device_synchronize(devs[0]), "sync")) {
    clpar_data_parallel_stats_reset(dp);
    double t0 = now();
    int good = 1;
    for (int i = 0; good && i < steps; i++) good = step(dp, opt, devs[0], x, y);
    good = good && ok(clpar_device_synchronize(devs[0]), "sync");
    double secs = now() - t0;
    clpar_data_parallel_stats st;
    clpar_data_parallel_stats_get(dp, &st);
    if (good) {
      rate = (double)BATCH * steps / secs;
      if (n == 1) *baseline = rate;
      printf(
          "{\"bench\": \"data_parallel\", \"devices\": %d, \"device_ids\": \"%s%s%s\", \"model\": "
          "\"MLP %d-%d-%d-%d\", "
          "\"batch\": %d, \"steps\": %d, \"ms_per_step\": %.1f, \"samples_per_s\": %.1f, "
          "\"speedup\": %.3f, "
          "\"per_step_ms\": {\"scatter\": %.2f, \"replicate\": %.2f, \"apply\": %.2f, \"gather\": "
          "%.2f, "
          "\"reduce\": %.2f}, \"parameters_copied_per_step\": %.1f}\n",
          n, clpar_device_id(devs[0]), n > 1 ? "," : "", n > 1 ? clpar_device_id(devs[1]) : "", IN,
          HIDDEN, HIDDEN, OUT, BATCH, steps, secs / steps * 1e3, rate, rate / *baseline,
          st.scatter_seconds / steps * 1e3, st.replicate_seconds / steps * 1e3,
          st.apply_seconds / steps * 1e3, st.gather_seconds / steps * 1e3,
          st.reduce_seconds / steps * 1e3, (double)st.parameters_copied / steps);
      fflush(stdout);
    }
  }
  clpar_optimizer_free(opt);
  clpar_module_free(dp);
  return rate;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 6;
  if (!ok(clpar_init(), "clpar_init")) return 1;
  if (clpar_device_count() < 2) {
    fprintf(stderr, "bench_data_parallel needs two devices, e.g. POCL_DEVICES=\"basic basic\"\n");
    clpar_shutdown();
    return 1;
  }
  float *x = malloc(sizeof(float) * BATCH * IN);
  int32_t y[BATCH];
  for (int i = 0; i < BATCH * IN; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  for (int i = 0; i < BATCH; i++) y[i] = i % OUT;
  double baseline = 0;
  int good = run(1, steps, x, y, &baseline) > 0 && run(2, steps, x, y, &baseline) > 0;
  free(x);
  clpar_shutdown();
  return good ? 0 : 1;
}
