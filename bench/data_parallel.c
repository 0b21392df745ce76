/* data_parallel.c — DataParallel over 1 and over 2 devices, in one run, for two models: a
 * compute-bound MLP (1024-1024-1024-16, batch 512) and a latency-bound one (48 Linear layers
 * of width 64 with ReLU between, batch 32), each trained by steps of forward, cross-entropy,
 * backward and SGD. For each model and device count one JSON object: time per step, the
 * speedup of 2 devices over 1, the host time per step spent in each part of DataParallel,
 * and, counted by the devices (clpar_device_counters_get, summed over the two devices and the
 * host device), how often the calling thread blocked on a device per step and how many
 * transfers the step made (copies into a device: from another device or from host memory,
 * the batch's upload and the labels' included). Rounds of steps alternate between the two
 * set-ups and the best round of each counts.
 *
 * On this 2-core machine, the meaningful set-up is two PoCL "basic" devices, each in its own
 * context and driven by its own worker thread (DESIGN.md):
 *   POCL_DEVICES="basic basic" POCL_MAX_PTHREAD_COUNT=1 ./bench_data_parallel [steps [model]]
 * where model, when given, runs only the models whose name contains it ("compute", "latency").
 *
 * Also per model: kernels per device per step (the commands each device ran in the profiled
 * round: kernel launches, GEMM calls, device-local copies) and the machine's own two-core
 * scaling (core_scaling.h: two one-device processes at once, each bound to a core of its own,
 * against one alone), printed with the two-device figures, so that a speedup measured while
 * other work runs can be told from a regression. */
#define _GNU_SOURCE /* sched_setaffinity */
#include <clpar/clpar.h>

#include "bench_util.h"
#include "core_scaling.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const char *name;
  int layers; /* Linear layers */
  int64_t batch, in, hidden, out;
  int steps_scale; /* steps per round: the command line's times this */
} model_spec;

static const model_spec models[] = {
    {"compute-bound MLP 1024-1024-1024-16", 3, 512, 1024, 1024, 16, 1},
    {"latency-bound MLP 48 x Linear(64, 64)", 48, 32, 64, 64, 64, 10},
};

/* layers Linear layers in -> hidden -> ... -> out with ReLU between them, on dev. */
static clpar_module *make_model(const model_spec *m, clpar_device *dev) {
  return bench_mlp_layers(m->layers, m->in, m->hidden, m->out, dev);
}

typedef struct {
  uint64_t waits, transfers;
} counts;

/* Host waits and transfers into devices so far, over devices 0 and 1 and the host device. */
static counts count_now(void) {
  clpar_device *devs[3] = {clpar_device_get(0), clpar_device_get(1), clpar_device_host()};
  counts c = {0, 0};
  for (int i = 0; i < 3; i++) {
    if ((i == 2 && (devs[2] == devs[0] || devs[2] == devs[1]))) continue;
    clpar_device_counters k;
    if (clpar_device_counters_get(devs[i], &k) != CLPAR_OK) continue;
    c.waits += k.host_waits;
    c.transfers += k.transfers_in;
  }
  return c;
}

typedef struct {
  const model_spec *m;
  int n;
  clpar_module *dp;
  clpar_optimizer *opt;
  float *x;
  int32_t *y;
  double best;                  /* seconds per step, best round */
  clpar_data_parallel_stats st; /* of the best round */
  double waits, transfers;      /* per step, in the best round */
  double busy[2], busy_wall;    /* per step, in the profiled round: each device's time in
                                   kernels, GEMMs and local copies, and the round's wall time */
  double kernels[2];            /* per step, in the profiled round: commands each device ran */
} config;

/* Waits for the set-up's devices. */
static int sync_all(const config *c) {
  int good = 1;
  for (int d = 0; good && d < c->n; d++)
    good = bench_ok(clpar_device_synchronize(clpar_device_get(d)), "sync");
  return good;
}

static int step(config *c) {
  return bench_train_step(c->dp, c->opt, clpar_device_get(0), c->x, c->y, c->m->batch, c->m->in);
}

static int setup(config *c, const model_spec *m, int n) {
  clpar_device *devs[2] = {clpar_device_get(0), clpar_device_get(1)};
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  clpar_sgd_options sgd = {.lr = 0.01f, .momentum = 0.9f};
  c->m = m;
  c->n = n;
  c->best = 1e30;
  c->x = malloc(sizeof(float) * (size_t)(m->batch * m->in));
  c->y = malloc(sizeof(int32_t) * (size_t)m->batch);
  if (!c->x || !c->y) return 0;
  bench_batch(c->x, c->y, m->batch, m->in, (int32_t)m->out);
  clpar_module *model = make_model(m, devs[0]);
  /* two warm-up steps: kernels compile, the allocators' caches fill */
  return model && bench_ok(clpar_data_parallel_create(model, &o, &c->dp), "DataParallel") &&
         bench_ok(clpar_sgd_create_for(c->dp, &sgd, &c->opt), "SGD") && step(c) && step(c) &&
         sync_all(c);
}

/* One round of steps steps; keeps it if it is the best so far. */
static int round_of(config *c, int steps) {
  clpar_data_parallel_stats_reset(c->dp);
  counts before = count_now();
  double t0 = now_seconds();
  int good = 1;
  for (int i = 0; good && i < steps; i++) good = step(c);
  counts after = count_now(); /* before the synchronizing below, which waits by design */
  good = good && sync_all(c);
  double per = (now_seconds() - t0) / steps;
  if (good && per < c->best) {
    c->best = per;
    clpar_data_parallel_stats_get(c->dp, &c->st);
    c->waits = (double)(after.waits - before.waits) / steps;
    c->transfers = (double)(after.transfers - before.transfers) / steps;
  }
  return good;
}

/* One more round with device profiling on (it adds an event per op, so the timed rounds run
 * without it): how long each device computed per step, against the step's wall time. */
static int profiled_round(config *c, int steps) {
  int good = 1;
  for (int d = 0; d < 2; d++)
    good = good && bench_ok(clpar_device_profile_start(clpar_device_get(d)), "profile");
  double t0 = now_seconds();
  for (int i = 0; good && i < steps; i++) good = step(c);
  for (int d = 0; d < 2; d++) {
    clpar_profile pr = {0, 0};
    good = good && bench_ok(clpar_device_profile_read(clpar_device_get(d), &pr), "profile");
    c->busy[d] = pr.device_seconds / steps;
    c->kernels[d] = (double)pr.ops / steps;
    clpar_device_profile_stop(clpar_device_get(d));
  }
  c->busy_wall = (now_seconds() - t0) / steps;
  return good;
}

/* The machine's two-core scaling, best of rounds (core_scaling.h); negative when not taken. */
typedef struct {
  double one, two;
} machine;

static void report(const config *c, int steps, int rounds, double baseline, const machine *mc) {
  const clpar_data_parallel_stats *st = &c->st;
  printf(
      "{\"bench\": \"data_parallel\", \"model\": \"%s\", \"batch\": %lld, \"devices\": %d, "
      "\"device_ids\": \"%s%s%s\", \"steps\": %d, \"rounds\": %d, \"ms_per_step\": %.2f, "
      "\"samples_per_s\": %.1f, \"speedup\": %.3f, \"host_waits_per_step\": %.2f, "
      "\"transfers_per_step\": %.2f, \"per_step_host_ms\": {\"scatter\": %.3f, \"replicate\": "
      "%.3f, \"apply\": %.3f, \"gather\": %.3f, \"reduce\": %.3f}, "
      "\"replica_parameter_copies_per_step\": %.2f, \"profiled_ms_per_step\": %.2f, "
      "\"device_busy_ms_per_step\": [%.2f, %.2f], \"kernels_per_step\": [%.1f, %.1f]",
      c->m->name, (long long)c->m->batch, c->n, clpar_device_id(clpar_device_get(0)),
      c->n > 1 ? "," : "", c->n > 1 ? clpar_device_id(clpar_device_get(1)) : "", steps, rounds,
      c->best * 1e3, (double)c->m->batch / c->best, baseline / c->best, c->waits, c->transfers,
      st->scatter_seconds / steps * 1e3, st->replicate_seconds / steps * 1e3,
      st->apply_seconds / steps * 1e3, st->gather_seconds / steps * 1e3,
      st->reduce_seconds / steps * 1e3, (double)st->parameters_copied / steps, c->busy_wall * 1e3,
      c->busy[0] * 1e3, c->busy[1] * 1e3, c->kernels[0], c->kernels[1]);
  if (c->n > 1 && mc->one > 0 && mc->two > 0)
    printf(
        ", \"machine_solo_samples_per_s\": %.1f, \"machine_two_solo_samples_per_s\": %.1f, "
        "\"machine_two_core_scaling\": %.3f, \"speedup_vs_machine\": %.3f",
        mc->one, mc->two, mc->two / mc->one, baseline / c->best / (mc->two / mc->one));
  else if (c->n > 1)
    printf(", \"machine_two_core_scaling\": null");
  printf("}\n");
  fflush(stdout);
}

static void teardown(config *c) {
  clpar_optimizer_free(c->opt);
  clpar_module_free(c->dp);
  free(c->x);
  free(c->y);
}

/* --solo CORE STEPS MODEL: the child of core_scaling.h. Bound to core CORE, it trains MODEL
 * on one device for 3 rounds of STEPS steps and prints the best round's samples/s. */
static int solo(int argc, char **argv) {
  if (argc < 5 || !core_bind(atoi(argv[2]))) return 1;
  int steps = atoi(argv[3]);
  const model_spec *m = NULL;
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
    if (strcmp(models[i].name, argv[4]) == 0) m = &models[i];
  if (!m || steps < 1 || !bench_ok(clpar_init(), "clpar_init")) return 1;
  config one = {0};
  int good = setup(&one, m, 1);
  for (int r = 0; good && r < 3; r++) good = round_of(&one, steps);
  if (good) printf("%.3f\n", (double)m->batch / one.best);
  teardown(&one);
  clpar_shutdown();
  return good ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--solo") == 0) return solo(argc, argv);
  int steps_arg = argc > 1 ? atoi(argv[1]) : 5;
  if (steps_arg < 1) steps_arg = 5;
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  if (clpar_device_count() < 2) {
    fprintf(stderr, "bench_data_parallel needs two devices, e.g. POCL_DEVICES=\"basic basic\"\n");
    clpar_shutdown();
    return 1;
  }
  int good = 1, rounds = 3;
  for (size_t mi = 0; good && mi < sizeof models / sizeof models[0]; mi++) {
    if (argc > 2 && !strstr(models[mi].name, argv[2])) continue;
    /* Rounds alternate between one and two devices, so that the machine's other load falls
     * on both; the best round of each counts. */
    int steps = steps_arg * models[mi].steps_scale;
    config one = {0}, two = {0};
    good = setup(&one, &models[mi], 1) && setup(&two, &models[mi], 2);
    for (int r = 0; good && r < rounds; r++) good = round_of(&one, steps) && round_of(&two, steps);
    good = good && profiled_round(&one, steps) && profiled_round(&two, steps);
    machine mc;
    if (good && !core_scaling(steps, models[mi].name, rounds, &mc.one, &mc.two))
      fprintf(stderr, "bench_data_parallel: the two-core scaling was not measured\n");
    if (good) {
      report(&one, steps, rounds, one.best, &mc);
      report(&two, steps, rounds, one.best, &mc);
    }
    teardown(&one);
    teardown(&two);
  }
  clpar_shutdown();
  return good ? 0 : 1;
}
