/* ddp.c — DistributedDataParallel: samples per second of an MLP training step with a fixed
 * batch per rank (so N ranks train N times the samples of one), and where the communication
 * thread's time goes per step: reading gradients to host memory (which waits for the device to
 * compute them), MPI_Allreduce (which includes waiting for the slowest rank) and writing the
 * averages back. "hidden" is the share of allreduce + write that ran while the device still had
 * backward work: 1 - exposed / (allreduce + write), exposed being that time for the last
 * bucket. One JSON object per run, printed by rank 0; bench/ddp.sh runs 1 and 2 ranks and a
 * bucket-size sweep and prints the scaling efficiency.
 *
 * --graph: the step captured (clpar/graph.h, the bucket hand-offs included) and timed eager
 * against replayed, in rounds of steps that alternate between the two on one module (best and
 * worst round of each; the ranks' mean), on static inputs (nothing uploaded per step); each
 * free-running (the device waited for once per round: replays queue up on the device) and
 * synced (waited for after every step, so each step starts from idle ranks).
 * --model latency: 48 x Linear(64, 64) at batch 32 (bench/data_parallel's latency-bound MLP)
 * instead of the compute-bound default, 6 x Linear(512, 512) then Linear(512, 16) at batch 256.
 * --model bn: a module with buffers, broadcast from rank 0 before each forward: Conv2d(3, 16,
 * 3x3), BatchNorm2d, ReLU, a ResNet BasicBlock(16) (two more BatchNorm2d), then Linear to 16
 * classes, on [32, 3, 8, 8] inputs.
 * --eager-on-captured (with --graph): the eager rounds run on the captured module too, what an
 * eager step after a capture costs (it waits for the replays still in flight: none here, the
 * rounds end synchronized).
 * --zero 1|2|3: ZeRO at that stage (clpar/zero.h; its SGD with the same options) instead of
 * plain DDP, with --graph: its step eager against replayed. Stage 3 (each Linear a unit) also
 * prints the device memory a step takes beyond what the module holds at rest: the eager
 * step's peak (clpar_memory_peak, all categories) over an emptied cache, and the replayed
 * step's (the memory its capture kept in the graph's pool: a replay allocates nothing).
 *
 *   POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 mpirun -np 2 ./bench_ddp [steps] [bucket_cap_mb]
 *       [--graph] [--model compute|latency|bn] [--zero 1|2|3] [--eager-on-captured]
 */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *name;
  int layers;
  int64_t batch, width, out;
  int64_t channels; /* 0: an MLP on [batch, width]; else a conv net on [batch, channels, width,
                     * width] */
} model_spec;

static const model_spec compute = {"compute", 6, 256, 512, 16, 0},
                        latency = {"latency", 48, 32, 64, 64, 0}, bn = {"bn", 1, 32, 8, 16, 3};

static int64_t input_numel(const model_spec *s) {
  return s->batch * (s->channels ? s->channels * s->width * s->width : s->width);
}

/* --model bn's conv net (s->width 8: 8x8 images, 16 features). */
static clpar_module *make_bn_net(const model_spec *s, clpar_device *dev) {
  clpar_module *c[6] = {0}, *m = NULL;
  clpar_conv2d_options pad = {.padding = {1, 1}};
  clpar_manual_seed(3);
  int good =
      bench_ok(clpar_conv2d_create(s->channels, 16, 3, 3, &pad, 0, dev, &c[0]), "Conv2d") &&
      bench_ok(clpar_batchnorm2d_create(16, NULL, dev, &c[1]), "BatchNorm2d") &&
      bench_ok(clpar_relu_create(&c[2]), "ReLU") &&
      bench_ok(clpar_resnet_block_create(CLPAR_RESNET_BASIC, 16, 16, 1, dev, &c[3]),
               "BasicBlock") &&
      bench_ok(clpar_flatten_create(1, -1, &c[4]), "Flatten") &&
      bench_ok(clpar_linear_create(16 * s->width * s->width, s->out, 1, dev, &c[5]), "Linear") &&
      bench_ok(clpar_sequential_create(c, 6, &m), "Sequential");
  if (!good)
    for (int i = 0; i < 6; i++) clpar_module_free(c[i]);
  return m;
}

/* --zero: the stage, and each run's ZeRO optimizer (bench_step_run's opt is then NULL) */
static int zero_stage;
static int eager_on_captured; /* --eager-on-captured */
static clpar_zero_optimizer *zero_opt[2];
static bench_step_run *zero_run[2];

/* One step of r: bench_step, or with ZeRO its step on the same static inputs. */
static clpar_status run_step(void *ctx) {
  bench_step_run *r = ctx;
  clpar_zero_optimizer *z = r == zero_run[0] ? zero_opt[0] : r == zero_run[1] ? zero_opt[1] : NULL;
  if (!z) return bench_step(r);
  clpar_tensor_free(r->loss);
  r->loss = NULL;
  clpar_tensor *logits = NULL;
  clpar_status s = clpar_zero_optimizer_zero_grad(z);
  if (s == CLPAR_OK) s = clpar_module_forward(r->m, r->x, &logits);
  if (s == CLPAR_OK)
    s = clpar_cross_entropy_targets(logits, r->y, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN,
                                    &r->loss);
  if (s == CLPAR_OK) s = clpar_backward(r->loss);
  if (s == CLPAR_OK) s = clpar_zero_optimizer_step(z);
  clpar_tensor_free(logits);
  return s;
}

/* layers x (Linear(width, width), ReLU), then Linear(width, out) for the compute MLP (1 MiB
 * weights, so that the bucket cap decides how many buckets there are); the latency MLP's
 * last layer is its 48th. */
static clpar_module *make_mlp(const model_spec *s, clpar_device *dev) {
  if (s->channels) return make_bn_net(s, dev);
  int n_lin = s == &compute ? s->layers + 1 : s->layers;
  return bench_mlp_layers(n_lin, s->width, s->width, s->out, dev);
}

/* ms per step of a round: eager steps or replays, waiting for the device and the
 * communication thread at the end (synced: after every step too); the ranks' mean. */
static double round_ms(bench_step_run *r, clpar_module *ddp, clpar_device *dev, int replay,
                       int synced, int steps) {
  double t0 = now_seconds();
  int good = 1;
  for (int i = 0; good && i < steps; i++) {
    good = bench_ok(replay ? clpar_graph_replay(r->graph) : run_step(r), "step");
    if (good && synced) good = bench_ok(clpar_device_synchronize(dev), "sync");
  }
  good = good && bench_ok(clpar_device_synchronize(dev), "sync") &&
         bench_ok(clpar_ddp_synchronize(ddp), "DistributedDataParallel");
  float ms = (float)((now_seconds() - t0) * 1e3 / steps);
  return good && bench_ok(clpar_dist_all_reduce_mean(&ms, 1), "average") ? ms : -1;
}

/* A run's static inputs, and two warm-up steps. */
static int inputs(bench_step_run *r, const model_spec *s, clpar_device *dev, const float *x,
                  const int32_t *y) {
  int64_t xs[4] = {s->batch, s->channels ? s->channels : s->width, s->width, s->width};
  int64_t ys = s->batch;
  int good = bench_ok(clpar_tensor_from_host(dev, s->channels ? 4 : 2, xs, x, &r->x), "input") &&
             bench_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 1, &ys, y, &r->y), "labels");
  for (int i = 0; good && i < 2; i++) good = bench_ok(run_step(r), "warm-up");
  return good;
}

/* --zero 3: the device memory a step takes beyond the module's at rest, in MiB: the eager
 * step's peak over an emptied cache, and the replayed step's: what its capture left allocated
 * (m0, m1: the device's stats before and after the capture, the cache emptied before). */
static int zero3_memory(bench_step_run *e, clpar_device *dev, const clpar_memory_stats *m0,
                        const clpar_memory_stats *m1) {
  int good = bench_ok(clpar_device_empty_cache(dev), "empty_cache") &&
             bench_ok(clpar_memory_mark(dev), "mark");
  uint64_t base = clpar_memory_in_use(dev, CLPAR_MEM_TOTAL);
  good = good && bench_ok(run_step(e), "step") && bench_ok(clpar_device_synchronize(dev), "sync");
  float mb[2] = {
      (float)(clpar_memory_peak(dev, CLPAR_MEM_TOTAL) - base) / 1048576.0f,
      (float)((m1->bytes_in_use + m1->bytes_cached) - (m0->bytes_in_use + m0->bytes_cached)) /
          1048576.0f};
  if (good && clpar_dist_rank() == 0)
    printf(
        "{\"bench\": \"ddp_graph_zero3_memory\", \"step_mib_beyond_rest\": {\"eager_peak\": "
        "%.2f, \"replay_capture_allocated\": %.2f}}\n",
        mb[0], mb[1]);
  return good;
}

/* --graph: eager against replayed, ROUNDS rounds of each, alternated, free-running (the
 * device waited for at the round's end) and synced (after each step too); best and worst
 * ms per step of each, and the all-reduce seconds per step of the free-running rounds. The
 * replays run on a second module made alike (p), the eager rounds on e (on p with
 * --eager-on-captured: an eager step of a captured module first waits for its replays still in
 * flight, capture_host.c). */
static int graph_bench(const model_spec *s, bench_step_run *e, bench_step_run *p, clpar_device *dev,
                       const float *x, const int32_t *y, int steps) {
  enum { ROUNDS = 5 };
  clpar_status ran = CLPAR_OK;
  clpar_memory_stats m0 = {0}, m1 = {0};
  int good = inputs(e, s, dev, x, y) && inputs(p, s, dev, x, y) &&
             bench_ok(clpar_device_synchronize(dev), "sync") &&
             bench_ok(clpar_device_empty_cache(dev), "empty_cache") &&
             bench_ok(clpar_device_memory_stats(dev, &m0), "memory") &&
             bench_ok(clpar_graph_capture_begin(&dev, 1), "capture") && (ran = run_step(p), 1) &&
             bench_ok(clpar_graph_capture_end(&p->graph), "capture") && bench_ok(ran, "captured") &&
             bench_ok(clpar_device_synchronize(dev), "sync") &&
             bench_ok(clpar_device_memory_stats(dev, &m1), "memory");
  if (good && zero_stage == 3) good = zero3_memory(e, dev, &m0, &m1);
  /* [kind]: eager, replay, eager synced, replay synced */
  double best[4] = {1e30, 1e30, 1e30, 1e30}, worst[4] = {0}, ar[2] = {0};
  for (int k = 0; good && k < 4 * ROUNDS; k++) {
    int kind = k % 4;
    bench_step_run *r = kind % 2 || eager_on_captured ? p : e;
    clpar_ddp_stats a = {0}, b = {0};
    clpar_ddp_stats_get(r->m, &a);
    double ms = round_ms(r, r->m, dev, kind % 2, kind / 2, steps);
    clpar_ddp_stats_get(r->m, &b);
    if (kind < 2) ar[kind] += (b.allreduce_seconds - a.allreduce_seconds) * 1e3 / (ROUNDS * steps);
    good = ms > 0;
    best[kind] = ms < best[kind] ? ms : best[kind];
    worst[kind] = ms > worst[kind] ? ms : worst[kind];
  }
  clpar_ddp_stats st = {0};
  char model[128];
  if (s->channels)
    snprintf(model, sizeof model,
             "Conv2d, BatchNorm2d, BasicBlock(16), Linear on [%lld, %lld, %lld, %lld]",
             (long long)s->batch, (long long)s->channels, (long long)s->width, (long long)s->width);
  else
    snprintf(model, sizeof model, "%s MLP %d x Linear(%lld)", s->name, s->layers,
             (long long)s->width);
  if (good && clpar_dist_rank() == 0 && clpar_ddp_stats_get(p->m, &st) == CLPAR_OK)
    printf(
        "{\"bench\": \"ddp_graph\", \"ranks\": %d, \"zero_stage\": %d, \"device\": \"%s\", "
        "\"model\": \"%s\", \"batch_per_rank\": %lld, \"buckets\": %d, \"steps\": %d, "
        "\"rounds\": %d, \"eager_ms_per_step\": [%.2f, %.2f], \"replay_ms_per_step\": "
        "[%.2f, %.2f], \"speedup_best\": %.2f, \"synced_eager_ms_per_step\": [%.2f, %.2f], "
        "\"synced_replay_ms_per_step\": [%.2f, %.2f], \"synced_speedup_best\": %.2f, "
        "\"allreduce_ms_per_step\": [%.2f, %.2f], \"commands_per_step\": %zu}\n",
        clpar_dist_world_size(), zero_stage, clpar_device_id(dev), model, (long long)s->batch,
        st.buckets, steps, ROUNDS, best[0], worst[0], best[1], worst[1], best[0] / best[1], best[2],
        worst[2], best[3], worst[3], best[2] / best[3], ar[0], ar[1],
        clpar_graph_command_count(p->graph));
  return good;
}

/* The plain bench (bench/ddp.sh): uploads the batch each step; per-step stats. */
static int plain_bench(const model_spec *s, clpar_module *ddp, clpar_optimizer *opt,
                       clpar_device *dev, const float *x, const int32_t *y, int steps, double cap) {
  int good = 1;
  /* two warm-up steps: kernels compile, the allocators' caches fill */
  for (int i = 0; good && i < 2; i++)
    good = bench_train_step(ddp, opt, dev, x, y, s->batch, s->width);
  good = good && bench_ok(clpar_device_synchronize(dev), "sync") &&
         bench_ok(clpar_dist_barrier(), "barrier");
  clpar_ddp_stats before = {0}, after = {0};
  if (good) clpar_ddp_stats_get(ddp, &before);
  double t0 = now_seconds();
  for (int i = 0; good && i < steps; i++)
    good = bench_train_step(ddp, opt, dev, x, y, s->batch, s->width);
  good = good && bench_ok(clpar_device_synchronize(dev), "sync") &&
         bench_ok(clpar_ddp_synchronize(ddp), "DistributedDataParallel");
  double per = (now_seconds() - t0) / steps;
  if (good) clpar_ddp_stats_get(ddp, &after);
  /* the ranks meet at every bucket, so their step times agree; report their mean */
  float mean_per = (float)per;
  int ok_all = good && bench_ok(clpar_dist_all_reduce_mean(&mean_per, 1), "average");
  per = mean_per;
  if (ok_all && clpar_dist_rank() == 0) {
    int world = clpar_dist_world_size();
    double read = (after.read_seconds - before.read_seconds) / steps,
           ar = (after.allreduce_seconds - before.allreduce_seconds) / steps,
           write = (after.write_seconds - before.write_seconds) / steps,
           exposed = (after.exposed_seconds - before.exposed_seconds) / steps;
    double hidden = ar + write > 0 ? 1.0 - exposed / (ar + write) : 1.0;
    printf(
        "{\"bench\": \"ddp\", \"ranks\": %d, \"device\": \"%s\", \"model\": \"MLP "
        "%d x %lld-%lld, then %lld\", \"batch_per_rank\": %lld, \"steps\": %d, "
        "\"bucket_cap_mb\": %g, \"buckets\": %d, \"ms_per_step\": %.1f, \"samples_per_s\": %.1f, "
        "\"per_step_ms\": {\"read\": %.2f, \"allreduce\": %.2f, \"write\": %.2f, "
        "\"exposed\": %.2f}, \"hidden\": %.3f}\n",
        world, clpar_device_id(dev), s->layers, (long long)s->width, (long long)s->width,
        (long long)s->out, (long long)s->batch, steps, cap > 0 ? cap : 25.0, after.buckets,
        per * 1e3, world * s->batch / per, read * 1e3, ar * 1e3, write * 1e3, exposed * 1e3,
        hidden);
  }
  return ok_all;
}

int main(int argc, char **argv) {
  int steps = 10, graph = 0, pos = 0, zero = 0;
  double cap = 0;
  const model_spec *s = &compute;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--graph"))
      graph = 1;
    else if (!strcmp(argv[i], "--eager-on-captured"))
      eager_on_captured = 1;
    else if (!strcmp(argv[i], "--zero") && i + 1 < argc)
      zero = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--model") && i + 1 < argc)
      s = !strcmp(argv[++i], "latency") ? &latency : !strcmp(argv[i], "bn") ? &bn : &compute;
    else if (pos++ == 0)
      steps = atoi(argv[i]);
    else
      cap = atof(argv[i]);
  }
  if (steps < 1) steps = 10;
  if (!bench_ok(clpar_dist_init(), "clpar_dist_init")) return 1;
  clpar_device *dev = clpar_dist_device();
  if (s->channels && !graph) {
    fprintf(stderr, "bench_ddp: --model bn runs with --graph only\n");
    return 1;
  }
  float *x = malloc(sizeof(float) * (size_t)input_numel(s));
  int32_t *y = malloc(sizeof(int32_t) * (size_t)s->batch);
  if (!x || !y) return 1;
  bench_batch(x, y, s->batch, input_numel(s) / s->batch, (int32_t)s->out);
  clpar_sgd_options sgd = {.lr = 0.01f, .momentum = 0.9f};
  clpar_ddp_options o = {.bucket_cap_mb = cap, .zero_stage = zero >= 1 && zero <= 3 ? zero : 0};
  zero_stage = o.zero_stage;
  bench_step_run e = {0}, p = {0}; /* eager, and (--graph) replayed */
  int good = 1;
  for (int k = 0; good && k < 1 + graph; k++) {
    bench_step_run *r = k ? &p : &e;
    clpar_module *model = make_mlp(s, dev);
    good = model && bench_ok(clpar_ddp_create(model, &o, &r->m), "clpar_ddp_create");
    zero_run[k] = r;
    if (good && zero_stage)
      good = bench_ok(clpar_zero_sgd_create(r->m, &sgd, &zero_opt[k]), "ZeRO SGD");
    else if (good)
      good = bench_ok(clpar_sgd_create_for(r->m, &sgd, &r->opt), "SGD");
  }
  if (good && zero_stage && !graph) {
    fprintf(stderr, "bench_ddp: --zero runs with --graph only\n");
    good = 0;
  }
  if (good)
    good = graph ? graph_bench(s, &e, &p, dev, x, y, steps)
                 : plain_bench(s, e.m, e.opt, dev, x, y, steps, cap);
  clpar_graph_destroy(p.graph); /* before the ZeRO optimizers its records belong to */
  p.graph = NULL;
  clpar_zero_optimizer_free(zero_opt[1]);
  clpar_zero_optimizer_free(zero_opt[0]);
  bench_step_run_free(&p);
  bench_step_run_free(&e);
  free(x);
  free(y);
  clpar_dist_finalize();
  return good ? 0 : 1;
}
