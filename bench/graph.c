/* graph.c — one device's training step run eagerly and replayed from a captured graph
 * (clpar/graph.h), in one run: bench/data_parallel's latency-bound MLP (48 Linear(64, 64) with
 * ReLU between, batch 32, cross-entropy, SGD lr 0.01, parameters flattened: one optimizer
 * kernel), its inputs and labels written once into tensors made before the capture (the eager
 * step does not upload either). Rounds of steps alternate between eager and replay; prints one
 * JSON object with the best and worst round of each (ms per step), their ratio, the host time
 * per step (until the step was posted, best round), and the
 * commands each ran per step (kernels, GEMM calls, device copies: the device's profile count
 * for eager, the graph's list for replay).
 *
 * Also the host cost of posting one tiny command (a 1-element fill): eagerly (clpar_fill, one
 * lock and wake-up each) against within a replay of a graph of 1000 of them (one lock for all),
 * host time only (the posting thread's), and the time until the device ran them.
 *
 *   POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 ./bench_graph [steps [rounds]] */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>

enum { LAYERS = 48, WIDTH = 64, BATCH = 32, TINY = 1000 };

typedef struct {
  clpar_module *m;
  clpar_optimizer *opt;
  clpar_tensor *x, *y, *loss;
} bench_run;

static clpar_status step(void *ctx) {
  bench_run *r = ctx;
  clpar_tensor_free(r->loss);
  r->loss = NULL;
  clpar_tensor *logits = NULL;
  clpar_status s = clpar_optimizer_zero_grad(r->opt);
  if (s == CLPAR_OK) s = clpar_module_forward(r->m, r->x, &logits);
  if (s == CLPAR_OK)
    s = clpar_cross_entropy_targets(logits, r->y, -100, CLPAR_REDUCTION_MEAN, &r->loss);
  if (s == CLPAR_OK) s = clpar_backward(r->loss);
  if (s == CLPAR_OK) s = clpar_optimizer_step(r->opt);
  clpar_tensor_free(logits); /* the loss stays: read after the step */
  return s;
}

static int make_run(bench_run *r, clpar_device *dev) {
  clpar_module *l[2 * LAYERS];
  int n = 0, good = 1;
  clpar_manual_seed(3);
  for (int i = 0; good && i < LAYERS; i++) {
    good = bench_ok(clpar_linear_create(WIDTH, WIDTH, 1, dev, &l[n++]), "Linear");
    if (good && i < LAYERS - 1) good = bench_ok(clpar_relu_create(&l[n++]), "ReLU");
  }
  float x[BATCH * WIDTH];
  int32_t y[BATCH];
  bench_batch(x, y, BATCH, WIDTH, WIDTH);
  int64_t xs[2] = {BATCH, WIDTH}, ys = BATCH;
  clpar_sgd_options sgd = {.lr = 0.01f};
  return good && bench_ok(clpar_sequential_create(l, n, &r->m), "Sequential") &&
         bench_ok(clpar_module_flatten(r->m), "flatten") &&
         bench_ok(clpar_sgd_create_for(r->m, &sgd, &r->opt), "SGD") &&
         bench_ok(clpar_tensor_from_host(dev, 2, xs, x, &r->x), "input") &&
         bench_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 1, &ys, y, &r->y), "labels");
}

/* ms per step of one round of steps (eager or replayed), waiting once at the end; *host_ms:
 * per step until the last one was posted (the calling thread's own time on the step). */
static double round_ms(clpar_step *st, bench_run *r, clpar_device *dev, int replay, int steps,
                       double *host_ms) {
  double t0 = now_seconds();
  for (int i = 0; i < steps; i++)
    if (!bench_ok(replay ? clpar_step_run(st) : step(r), "step")) return -1;
  *host_ms = (now_seconds() - t0) * 1e3 / steps;
  if (!bench_ok(clpar_device_synchronize(dev), "synchronize")) return -1;
  return (now_seconds() - t0) * 1e3 / steps;
}

/* Commands the device ran per step, eagerly (its profile's count over 10 steps). */
static double eager_commands(bench_run *r, clpar_device *dev) {
  clpar_profile pr = {0, 0};
  int good = bench_ok(clpar_device_profile_start(dev), "profile");
  for (int i = 0; good && i < 10; i++) good = bench_ok(step(r), "step");
  good = good && bench_ok(clpar_device_profile_read(dev, &pr), "profile");
  clpar_device_profile_stop(dev);
  return good ? (double)pr.ops / 10 : -1;
}

/* Host microseconds to post one tiny fill: eagerly, and within a replay; *run_us: per fill
 * until the device ran them (eager, replay). */
static void tiny_cost(clpar_device *dev, double post_us[2], double run_us[2]) {
  clpar_tensor *t;
  int64_t one = 1;
  clpar_graph *g = NULL;
  if (!bench_ok(clpar_tensor_zeros(dev, 1, &one, &t), "tensor")) return;
  clpar_status s = clpar_graph_capture_begin(&dev, 1);
  for (int i = 0; s == CLPAR_OK && i < TINY; i++) s = clpar_fill(t, (float)i);
  clpar_status e = clpar_graph_capture_end(&g);
  if (!bench_ok(s, "capture") || !bench_ok(e, "capture")) return;
  for (int mode = 0; mode < 2; mode++) {
    double best_post = 1e30, best_run = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      clpar_device_synchronize(dev);
      double t0 = now_seconds();
      for (int i = 0; mode == 0 && i < TINY; i++) clpar_fill(t, (float)i);
      if (mode == 1) clpar_graph_replay(g);
      double t1 = now_seconds();
      clpar_device_synchronize(dev);
      double t2 = now_seconds();
      if (t1 - t0 < best_post) best_post = t1 - t0;
      if (t2 - t0 < best_run) best_run = t2 - t0;
    }
    post_us[mode] = best_post * 1e6 / TINY;
    run_us[mode] = best_run * 1e6 / TINY;
  }
  clpar_graph_destroy(g);
  clpar_tensor_free(t);
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 100, rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (steps < 1 || rounds < 1 || !bench_ok(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(0);
  bench_run r = {0};
  clpar_step *st = NULL;
  int good = make_run(&r, dev) && bench_ok(clpar_step_compile(step, &r, dev, &st), "compile") &&
             bench_ok(clpar_step_run(st), "warm-up") && bench_ok(clpar_step_run(st), "capture");
  double best[2] = {1e30, 1e30}, worst[2] = {0, 0}, host[2] = {1e30, 1e30};
  for (int k = 0; good && k < rounds; k++)
    for (int mode = 0; good && mode < 2; mode++) {
      double host_ms = 0, ms = round_ms(st, &r, dev, mode, steps, &host_ms);
      good = ms >= 0;
      if (host_ms < host[mode]) host[mode] = host_ms;
      if (ms < best[mode]) best[mode] = ms;
      if (ms > worst[mode]) worst[mode] = ms;
    }
  double eager_cmds = good ? eager_commands(&r, dev) : -1, post[2] = {0, 0}, run[2] = {0, 0};
  if (good) tiny_cost(dev, post, run);
  if (good)
    printf(
        "{\"model\": \"latency-bound MLP 48 x Linear(64, 64), batch 32, flat SGD\", "
        "\"device\": \"%s\", \"steps_per_round\": %d, \"rounds\": %d, "
        "\"eager_ms_per_step\": [%.3f, %.3f], \"replay_ms_per_step\": [%.3f, %.3f], "
        "\"speedup_best\": %.2f, \"host_ms_per_step\": {\"eager\": %.3f, \"replay\": %.3f}, "
        "\"kernels_per_step\": {\"eager\": %.1f, \"replay\": %zu}, "
        "\"tiny_fill_post_us\": {\"eager\": %.3f, \"replay\": %.3f}, "
        "\"tiny_fill_run_us\": {\"eager\": %.3f, \"replay\": %.3f}}\n",
        clpar_device_id(dev), steps, rounds, best[0], worst[0], best[1], worst[1],
        best[0] / best[1], host[0], host[1], eager_cmds,
        clpar_graph_command_count(clpar_step_graph(st)), post[0], post[1], run[0], run[1]);
  clpar_step_free(st);
  clpar_tensor_free(r.loss);
  clpar_tensor_free(r.x);
  clpar_tensor_free(r.y);
  clpar_optimizer_free(r.opt);
  clpar_module_free(r.m);
  clpar_shutdown();
  return good ? 0 : 1;
}
