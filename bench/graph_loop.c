/* graph_loop.c — one loop of the latency-bound MLP's step (bench/graph.c's model: 48
 * Linear(64, 64) with ReLU between, batch 32, cross-entropy, flat SGD lr 0.01) on the first
 * device, replayed from a captured graph (or run eagerly), and nothing else: a process to
 * profile (`perf record`, `perf stat -e task-clock`), where bench_graph alternates modes and
 * times tiny commands too. Prints one JSON object: ms per step (wall, one wait at the end) and
 * the loss after the last step.
 *
 *   POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 ./bench_graph_loop [steps [eager]] */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>

enum { LAYERS = 48, WIDTH = 64, BATCH = 32 };

/* The MLP on dev, its optimizer and static inputs, a warm-up step and the captured one. */
static int make_run(clpar_device *dev, bench_step_run *r) {
  float x[BATCH * WIDTH];
  int32_t y[BATCH];
  bench_batch(x, y, BATCH, WIDTH, WIDTH);
  int64_t xs[2] = {BATCH, WIDTH}, ys = BATCH;
  clpar_sgd_options sgd = {.lr = 0.01f};
  r->m = bench_mlp_layers(LAYERS, WIDTH, WIDTH, WIDTH, dev);
  return r->m && bench_ok(clpar_module_flatten(r->m), "flatten") &&
         bench_ok(clpar_sgd_create_for(r->m, &sgd, &r->opt), "SGD") &&
         bench_ok(clpar_tensor_from_host(dev, 2, xs, x, &r->x), "input") &&
         bench_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 1, &ys, y, &r->y), "labels") &&
         bench_ok(bench_step(r), "warm-up") && bench_step_capture(r, &dev, 1);
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 1000, eager = argc > 2 && atoi(argv[2]) != 0;
  if (steps < 1 || !bench_ok(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(0);
  bench_step_run r = {0};
  int good = dev && make_run(dev, &r) && bench_ok(clpar_device_synchronize(dev), "synchronize");
  double t0 = now_seconds();
  for (int i = 0; good && i < steps; i++)
    good = bench_ok(eager ? bench_step(&r) : clpar_graph_replay(r.graph), "step");
  good = good && bench_ok(clpar_device_synchronize(dev), "synchronize");
  double ms = (now_seconds() - t0) * 1e3 / steps;
  float loss = 0;
  good = good && bench_ok(clpar_tensor_read(r.loss, &loss, 1), "loss");
  if (good)
    printf(
        "{\"model\": \"latency-bound MLP 48 x Linear(64, 64), batch 32, flat SGD\", "
        "\"device\": \"%s\", \"mode\": \"%s\", \"steps\": %d, \"ms_per_step\": %.4f, "
        "\"loss\": %.9g, \"commands_per_step\": %zu}\n",
        clpar_device_id(dev), eager ? "eager" : "replay", steps, ms, loss,
        clpar_graph_command_count(r.graph));
  bench_step_run_free(&r);
  clpar_shutdown();
  return good ? 0 : 1;
}
