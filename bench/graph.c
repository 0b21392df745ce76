/* graph.c — a training step run eagerly and replayed from a captured graph (clpar/graph.h),
 * in one run: bench/data_parallel's latency-bound MLP (48 Linear(64, 64) with ReLU between,
 * batch 32, cross-entropy, SGD lr 0.01, parameters flattened: one optimizer kernel), its
 * inputs and labels written once into tensors made before the capture (the eager step does
 * not upload either), on one device and, when two are selected, under DataParallel over both.
 * Rounds of steps alternate between eager and replay; one JSON object per set-up with the best
 * and worst round of each (ms per step), their ratio, the host time per step (until the step
 * was posted, best round), and the commands per step summed over the devices (kernels, GEMM
 * calls, copies: the devices' profile count for eager, the graph's list for replay, which
 * also holds the waits and signals between devices).
 *
 * Also, on one device, the host cost of posting one tiny command (a 1-element fill): eagerly
 * (clpar_fill, one lock and wake-up each) against within a replay of a graph of 1000 of them
 * (one lock for all), host time only (the posting thread's), and the time until the device
 * ran them.
 *
 * --model mlp784 and --model resnet50 time bench_train_step's compute-bound models instead, on
 * device 0 (graph_models.c): the MLP 784-1024-1024-10 and ResNet-50.
 *
 *   POCL_DEVICES="basic basic" POCL_MAX_PTHREAD_COUNT=1 ./bench_graph [steps [rounds]]
 *   ./bench_graph [steps [rounds]] --model latency|mlp784|resnet50 [--optim sgd|adam] */
#include <clpar/clpar.h>

#include "bench_util.h"
#include "graph_models.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 48, WIDTH = 64, BATCH = 32, TINY = 1000 };

typedef struct {
  clpar_device *devs[2];
  int n;
  bench_step_run s;
} bench_run;

/* The MLP on devs[0], wrapped in DataParallel over both devices when n is 2, its optimizer
 * and static inputs; then a warm-up step and the captured one. */
static int make_run(bench_run *r) {
  clpar_module *dp;
  float x[BATCH * WIDTH];
  int32_t y[BATCH];
  bench_batch(x, y, BATCH, WIDTH, WIDTH);
  int64_t xs[2] = {BATCH, WIDTH}, ys = BATCH;
  clpar_sgd_options sgd = {.lr = 0.01f};
  clpar_data_parallel_options o = {.devices = r->devs, .n_devices = 2};
  r->s.m = bench_mlp_layers(LAYERS, WIDTH, WIDTH, WIDTH, r->devs[0]);
  int good = r->s.m && bench_ok(clpar_module_flatten(r->s.m), "flatten");
  if (good && r->n == 2) {
    good = bench_ok(clpar_data_parallel_create(r->s.m, &o, &dp), "DataParallel");
    r->s.m = good ? dp : NULL;
  }
  good = good && bench_ok(clpar_sgd_create_for(r->s.m, &sgd, &r->s.opt), "SGD") &&
         bench_ok(clpar_tensor_from_host(r->devs[0], 2, xs, x, &r->s.x), "input") &&
         bench_ok(clpar_tensor_from_host_dtype(r->devs[0], CLPAR_INT32, 1, &ys, y, &r->s.y),
                  "labels") &&
         bench_ok(bench_step(&r->s), "warm-up") && bench_step_capture(&r->s, r->devs, r->n);
  return good;
}

/* ms per step of one round of steps (eager or replayed), waiting once at the end; *host_ms:
 * per step until the last one was posted (the calling thread's own time on the step). */
static double round_ms(bench_run *r, int replay, int steps, double *host_ms) {
  double t0 = now_seconds();
  for (int i = 0; i < steps; i++)
    if (!bench_ok(replay ? clpar_graph_replay(r->s.graph) : bench_step(&r->s), "step")) return -1;
  *host_ms = (now_seconds() - t0) * 1e3 / steps;
  for (int d = 0; d < r->n; d++)
    if (!bench_ok(clpar_device_synchronize(r->devs[d]), "synchronize")) return -1;
  return (now_seconds() - t0) * 1e3 / steps;
}

/* Commands the devices ran per step, eagerly (their profiles' counts over 10 steps). */
static double eager_commands(bench_run *r) {
  uint64_t ops = 0;
  int good = 1;
  for (int d = 0; good && d < r->n; d++)
    good = bench_ok(clpar_device_profile_start(r->devs[d]), "profile");
  for (int i = 0; good && i < 10; i++) good = bench_ok(bench_step(&r->s), "step");
  for (int d = 0; good && d < r->n; d++) {
    clpar_profile pr = {0, 0};
    good = bench_ok(clpar_device_profile_read(r->devs[d], &pr), "profile");
    clpar_device_profile_stop(r->devs[d]);
    ops += pr.ops;
  }
  return good ? (double)ops / 10 : -1;
}

/* Host microseconds to post one tiny fill: eagerly, and within a replay; *run_us: per fill
 * until the device ran them (eager, replay). */
static void tiny_cost(clpar_device *dev, double post_us[2], double run_us[2]) {
  clpar_tensor *t;
  int64_t one = 1;
  clpar_graph *g = NULL;
  if (!bench_ok(clpar_tensor_zeros(dev, 1, &one, &t), "tensor")) return;
  /* one command per fill: the fills are not fused into element-wise chains */
  const char *fuse = getenv("CLPAR_GRAPH_FUSE");
  char *saved = fuse ? strdup(fuse) : NULL;
  setenv("CLPAR_GRAPH_FUSE", "0", 1);
  clpar_status s = clpar_graph_capture_begin(&dev, 1);
  for (int i = 0; s == CLPAR_OK && i < TINY; i++) s = clpar_fill(t, (float)i);
  clpar_status e = clpar_graph_capture_end(&g);
  if (saved)
    setenv("CLPAR_GRAPH_FUSE", saved, 1);
  else
    unsetenv("CLPAR_GRAPH_FUSE");
  free(saved);
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

#ifdef BENCH_HAVE_OPENCL
static const char *fill_src =
    "__kernel void fill1(__global float *o, ulong off, ulong n, float v) {\n"
    "  size_t i = get_global_id(0); if (i < n) o[off + i] = v; }\n";

/* The same 1-element fill as bare OpenCL on the device behind opencl:ordinal, in a context
 * of its own, its arguments set once, over wg work-items in one group (1: as a bare kernel
 * would; 256: as clpar_fill launches it): microseconds per kernel for TINY enqueues (host
 * time) and until clFinish returned (best of 5); 0 when it cannot run. */
static void bare_enqueue(int ordinal, size_t wg, double *post_us, double *run_us) {
  cl_device_id d = bench_cl_device(ordinal);
  cl_int e = d ? CL_SUCCESS : CL_INVALID_DEVICE;
  cl_context ctx = d ? clCreateContext(NULL, 1, &d, NULL, NULL, &e) : NULL;
  cl_command_queue q = e == CL_SUCCESS ? clCreateCommandQueue(ctx, d, 0, &e) : NULL;
  cl_program prog = e == CL_SUCCESS ? clCreateProgramWithSource(ctx, 1, &fill_src, NULL, &e) : NULL;
  if (e == CL_SUCCESS) e = clBuildProgram(prog, 1, &d, "", NULL, NULL);
  cl_kernel k = e == CL_SUCCESS ? clCreateKernel(prog, "fill1", &e) : NULL;
  cl_mem m = e == CL_SUCCESS ? clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4, NULL, &e) : NULL;
  cl_ulong off = 0, n = 1;
  float v = 1.0f;
  size_t global = wg, local = wg;
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 0, sizeof m, &m);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 1, sizeof off, &off);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 2, sizeof n, &n);
  if (e == CL_SUCCESS) e = clSetKernelArg(k, 3, sizeof v, &v);
  *post_us = *run_us = 1e30;
  for (int rep = 0; e == CL_SUCCESS && rep < 5; rep++) {
    clFinish(q);
    double t0 = now_seconds();
    for (int i = 0; e == CL_SUCCESS && i < TINY; i++)
      e = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, wg > 1 ? &local : NULL, 0, NULL, NULL);
    double t1 = now_seconds();
    clFinish(q);
    double t2 = now_seconds();
    if ((t1 - t0) * 1e6 / TINY < *post_us) *post_us = (t1 - t0) * 1e6 / TINY;
    if ((t2 - t0) * 1e6 / TINY < *run_us) *run_us = (t2 - t0) * 1e6 / TINY;
  }
  if (e != CL_SUCCESS) fprintf(stderr, "bare OpenCL enqueue: error %d\n", (int)e);
  if (e != CL_SUCCESS) *post_us = *run_us = 0;
  if (m) clReleaseMemObject(m);
  if (k) clReleaseKernel(k);
  if (prog) clReleaseProgram(prog);
  if (q) clReleaseCommandQueue(q);
  if (ctx) clReleaseContext(ctx);
}
#else
static void bare_enqueue(int ordinal, size_t wg, double *post_us, double *run_us) {
  (void)ordinal;
  (void)wg;
  *post_us = *run_us = 0;
}
#endif

/* One set-up's rounds and its JSON object; 0 on failure. */
static int run_setup(bench_run *r, int steps, int rounds) {
  if (!make_run(r)) return 0;
  double best[2] = {1e30, 1e30}, worst[2] = {0, 0}, host[2] = {1e30, 1e30};
  int good = 1;
  for (int k = 0; good && k < rounds; k++)
    for (int mode = 0; good && mode < 2; mode++) {
      double host_ms = 0, ms = round_ms(r, mode, steps, &host_ms);
      good = ms >= 0;
      if (host_ms < host[mode]) host[mode] = host_ms;
      if (ms < best[mode]) best[mode] = ms;
      if (ms > worst[mode]) worst[mode] = ms;
    }
  double eager_cmds = good ? eager_commands(r) : -1, post[4] = {0}, run[4] = {0};
  if (good && r->n == 1) tiny_cost(r->devs[0], post, run);
  const char *id = clpar_device_id(r->devs[0]);
  if (good && r->n == 1 && strncmp(id, "opencl:", 7) == 0) {
    bare_enqueue(atoi(id + 7), 1, &post[2], &run[2]);
    bare_enqueue(atoi(id + 7), 256, &post[3], &run[3]);
  }
  if (good)
    printf(
        "{\"model\": \"latency-bound MLP 48 x Linear(64, 64), batch 32, flat SGD\", "
        "\"devices\": %d, \"data_parallel\": %s, \"steps_per_round\": %d, \"rounds\": %d, "
        "\"eager_ms_per_step\": [%.3f, %.3f], \"replay_ms_per_step\": [%.3f, %.3f], "
        "\"speedup_best\": %.2f, \"host_ms_per_step\": {\"eager\": %.3f, \"replay\": %.3f}, "
        "\"commands_per_step\": {\"eager\": %.1f, \"replay\": %zu}, "
        "\"tiny_fill_post_us\": {\"eager\": %.3f, \"replay\": %.3f, \"bare_opencl\": %.3f}, "
        "\"tiny_fill_run_us\": {\"eager\": %.3f, \"replay\": %.3f, \"bare_opencl\": %.3f, "
        "\"bare_opencl_wg256\": %.3f}}\n",
        r->n, r->n == 2 ? "true" : "false", steps, rounds, best[0], worst[0], best[1], worst[1],
        best[0] / best[1], host[0], host[1], eager_cmds, clpar_graph_command_count(r->s.graph),
        post[0], post[1], post[2], run[0], run[1], run[2], run[3]);
  return good;
}

int main(int argc, char **argv) {
  bench_model_args a;
  if (!bench_model_parse(argc, argv, &a)) return 1;
  int steps = a.steps > 0 ? a.steps : 100, rounds = a.rounds > 0 ? a.rounds : 5;
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  int good = 1;
  if (a.kind != BENCH_MODEL_LATENCY) {
    good = bench_model_run(&a);
    clpar_shutdown();
    return good ? 0 : 1;
  }
  for (int n = 1; good && n <= 2 && n <= clpar_device_count(); n++) {
    bench_run r = {.devs = {clpar_device_get(0), n == 2 ? clpar_device_get(1) : NULL}, .n = n};
    good = run_setup(&r, steps, rounds);
    bench_step_run_free(&r.s);
  }
  clpar_shutdown();
  return good ? 0 : 1;
}
