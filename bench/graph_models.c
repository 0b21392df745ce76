/* graph_models.c — bench_graph --model mlp784|resnet50: a compute-bound training step run
 * eagerly and replayed from a captured graph (clpar/graph.h), on device 0.
 *
 *   mlp784: bench_train_step's MLP 784-1024-1024-10 (ReLU) at batch 256, cross-entropy against
 *     int32 labels; Adam (lr 1e-3, bench_train_step's) or --optim sgd (lr 0.01, momentum 0.9).
 *   resnet50: torchvision's ResNet-50 (1000 classes, training mode: BatchNorm on the batch's
 *     statistics, its running statistics and counters updated) at batch 16 of 3x64x64, MSE
 *     against one-hot targets; SGD (lr 0.001, bench_train_step's) or --optim adam (lr 1e-3).
 *
 * Two copies of the model, made alike (seed 3): one steps eagerly, the other replays. Each runs
 * a warm-up step, then a second (the replayed copy's is captured). Inputs and labels are
 * written once into tensors made before (neither step uploads). Rounds of steps alternate
 * between the copies (eager first in even rounds, replay first in odd ones), each waited for
 * once at its end. Prints one JSON object: best, median
 * and worst round (ms per step), the best rounds' ratio, the host time per step (until the
 * round's last step was posted, best round), the process's CPU ms per step (best and median
 * round), the host's waits for the device per step during the rounds (a replay that waits for the
 * previous one counts 1), the commands per step (eager: the device's profile over steps; replay:
 * the profile over replays, and the graph's list; null where the device has no profile, as the host
 * backend), and whether both copies' last losses and all their parameters and buffers are the same
 * bits after the same steps. */
#include <clpar/clpar.h>

#include "bench_util.h"
#include "graph_models.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MLP_BATCH = 256, MLP_IN = 784, MLP_HIDDEN = 1024, MLP_OUT = 10 };
enum { RN_BATCH = 16, RN_SIZE = 64, RN_CLASSES = 1000, MAX_ROUNDS = 64 };

int bench_model_parse(int argc, char **argv, bench_model_args *a) {
  *a = (bench_model_args){BENCH_MODEL_LATENCY, 0, 0, -1};
  int positional = 0, good = 1;
  for (int i = 1; good && i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : "";
    if (strcmp(argv[i], "--model") == 0) {
      a->kind = strcmp(v, "latency") == 0    ? BENCH_MODEL_LATENCY
                : strcmp(v, "mlp784") == 0   ? BENCH_MODEL_MLP784
                : strcmp(v, "resnet50") == 0 ? BENCH_MODEL_RESNET50
                                             : (bench_model_kind)-1;
      good = (int)a->kind >= 0;
      i++;
    } else if (strcmp(argv[i], "--optim") == 0) {
      a->adam = strcmp(v, "adam") == 0 ? 1 : strcmp(v, "sgd") == 0 ? 0 : -2;
      good = a->adam >= 0;
      i++;
    } else if (positional < 2) {
      int n = atoi(argv[i]);
      good = n >= 1 && (positional == 0 || n <= MAX_ROUNDS);
      *(positional++ == 0 ? &a->steps : &a->rounds) = n;
    } else {
      good = 0;
    }
  }
  if (good && a->kind == BENCH_MODEL_LATENCY && a->adam >= 0) good = 0; /* flat SGD only */
  if (!good)
    fprintf(stderr,
            "usage: bench_graph [steps [rounds (at most %d)]] "
            "[--model latency|mlp784|resnet50] [--optim sgd|adam (not for latency)]\n",
            MAX_ROUNDS);
  return good;
}

/* The model's optimizer: Adam (lr 1e-3) or SGD (the MLP's lr 0.01 with momentum 0.9,
 * ResNet-50's lr 0.001 without, as bench_train_step's). */
static int make_optimizer(bench_step_run *s, bench_model_kind kind, int adam) {
  clpar_adam_options ao = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  clpar_sgd_options so = {.lr = 0.001f};
  if (kind == BENCH_MODEL_MLP784) so = (clpar_sgd_options){.lr = 0.01f, .momentum = 0.9f};
  return adam ? bench_ok(clpar_adam_create_for(s->m, &ao, &s->opt), "Adam")
              : bench_ok(clpar_sgd_create_for(s->m, &so, &s->opt), "SGD");
}

/* The MLP's or ResNet-50's model (seed 3), optimizer and static inputs on dev. */
static int make_model(bench_step_run *s, clpar_device *dev, bench_model_kind kind, int adam) {
  int resnet = kind == BENCH_MODEL_RESNET50;
  int64_t nx = resnet ? (int64_t)RN_BATCH * 3 * RN_SIZE * RN_SIZE : (int64_t)MLP_BATCH * MLP_IN;
  int64_t xs[4] = {RN_BATCH, 3, RN_SIZE, RN_SIZE}, ys[2] = {RN_BATCH, RN_CLASSES};
  float *x = malloc(sizeof(float) * (size_t)nx), *target = NULL;
  int32_t labels[MLP_BATCH];
  int good = x != NULL;
  if (good && resnet) {
    target = malloc(sizeof(float) * RN_BATCH * RN_CLASSES);
    good = target != NULL;
    if (good) bench_images(x, target, RN_BATCH, RN_SIZE, RN_CLASSES);
    clpar_manual_seed(3);
    good = good && bench_ok(clpar_resnet50(RN_CLASSES, dev, &s->m), "ResNet-50") &&
           bench_ok(clpar_tensor_from_host(dev, 4, xs, x, &s->x), "input") &&
           bench_ok(clpar_tensor_from_host(dev, 2, ys, target, &s->y), "targets");
    s->mse = 1;
  } else if (good) {
    bench_batch(x, labels, MLP_BATCH, MLP_IN, MLP_OUT);
    xs[0] = ys[0] = MLP_BATCH;
    xs[1] = MLP_IN;
    s->m = bench_mlp(MLP_IN, MLP_HIDDEN, MLP_OUT, dev);
    good = s->m && bench_ok(clpar_tensor_from_host(dev, 2, xs, x, &s->x), "input") &&
           bench_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 1, ys, labels, &s->y), "labels");
  }
  free(x);
  free(target);
  return good && make_optimizer(s, kind, adam);
}

/* What the rounds measured, by mode (0 eager, 1 replay): ms per step of each round and the
 * process's CPU ms per step (every thread's: the caller's, the worker's, which on a PoCL
 * basic device or the host backend with passive OpenMP threads runs the kernels; not counted
 * while other work holds the cores, so steadier than wall time on a shared machine), the
 * best round's host ms per step, the most host waits per step, commands per step. */
typedef struct {
  double ms[2][MAX_ROUNDS], cpu[2][MAX_ROUNDS], host[2], waits[2], cmds[2];
} figures;

static double cpu_ms(void) {
  struct timespec t;
  return clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) == 0 ? t.tv_sec * 1e3 + t.tv_nsec * 1e-6 : 0;
}

/* Round k of mode m into f, waiting once at the end: ms per step, CPU ms per step, host ms
 * until the last step was posted, the host's waits for the device per step (the round's final
 * one not counted). Returns 1 on success. */
static int run_round(bench_step_run *s, clpar_device *dev, int steps, figures *f, int m, int k) {
  uint64_t w0 = clpar_device_host_waits(dev);
  double t0 = now_seconds(), c0 = cpu_ms();
  for (int i = 0; i < steps; i++)
    if (!bench_ok(s->graph ? clpar_graph_replay(s->graph) : bench_step(s), "step")) return 0;
  double host = (now_seconds() - t0) * 1e3 / steps;
  double waits = (double)(clpar_device_host_waits(dev) - w0) / steps;
  if (!bench_ok(clpar_device_synchronize(dev), "synchronize")) return 0;
  f->ms[m][k] = (now_seconds() - t0) * 1e3 / steps;
  f->cpu[m][k] = (cpu_ms() - c0) / steps;
  if (host < f->host[m]) f->host[m] = host;
  if (waits > f->waits[m]) f->waits[m] = waits;
  return 1;
}

/* Runs steps steps; the commands the device ran per step (its profile) into *cmds, left -1
 * where it keeps no profile (the host backend). Returns 1 on success. */
static int commands_per_step(bench_step_run *s, clpar_device *dev, int steps, double *cmds) {
  int profiled = clpar_device_profile_start(dev) == CLPAR_OK, good = 1;
  for (int i = 0; good && i < steps; i++)
    good = bench_ok(s->graph ? clpar_graph_replay(s->graph) : bench_step(s), "step");
  clpar_profile pr = {0, 0};
  if (profiled) {
    good = good && bench_ok(clpar_device_profile_read(dev, &pr), "profile");
    clpar_device_profile_stop(dev);
    if (good) *cmds = (double)pr.ops / steps;
  }
  return good && bench_ok(clpar_device_synchronize(dev), "synchronize");
}

/* Whether both copies' losses, parameters and float buffers are the same bits. */
static int same_bits(bench_step_run *e, bench_step_run *r) {
  float le = 0, lr = 1;
  if (!bench_ok(clpar_tensor_read(e->loss, &le, 1), "loss") ||
      !bench_ok(clpar_tensor_read(r->loss, &lr, 1), "loss") || memcmp(&le, &lr, sizeof le) != 0)
    return 0;
  int np = clpar_module_parameter_count(e->m), nb = clpar_module_buffer_count(e->m), same = 1;
  for (int i = 0; same && i < np + nb; i++) {
    clpar_tensor *a = NULL, *b = NULL;
    if (i < np)
      same = clpar_module_parameter_at(e->m, i, NULL, &a) == CLPAR_OK &&
             clpar_module_parameter_at(r->m, i, NULL, &b) == CLPAR_OK;
    else
      same = clpar_module_buffer_at(e->m, i - np, NULL, &a) == CLPAR_OK &&
             clpar_module_buffer_at(r->m, i - np, NULL, &b) == CLPAR_OK;
    if (!same || clpar_tensor_dtype(a) != CLPAR_FLOAT32) continue;
    size_t n = (size_t)clpar_tensor_numel(a);
    float *va = malloc(n * sizeof *va), *vb = malloc(n * sizeof *vb);
    same = va && vb && clpar_tensor_numel(b) == (int64_t)n &&
           clpar_tensor_read(a, va, n) == CLPAR_OK && clpar_tensor_read(b, vb, n) == CLPAR_OK &&
           memcmp(va, vb, n * sizeof *va) == 0;
    free(va);
    free(vb);
  }
  return same;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The JSON object of a run, f's rounds sorted. */
static void print_run(const bench_model_args *a, clpar_device *dev, int adam, figures *f,
                      size_t graph_cmds, int same) {
  int steps = a->steps, rounds = a->rounds, resnet = a->kind == BENCH_MODEL_RESNET50;
  char c[2][32];
  for (int m = 0; m < 2; m++) {
    qsort(f->ms[m], (size_t)rounds, sizeof(double), cmp_double);
    qsort(f->cpu[m], (size_t)rounds, sizeof(double), cmp_double);
    if (f->cmds[m] < 0)
      snprintf(c[m], sizeof c[m], "null");
    else
      snprintf(c[m], sizeof c[m], "%.1f", f->cmds[m]);
  }
  double(*ms)[MAX_ROUNDS] = f->ms, (*cpu)[MAX_ROUNDS] = f->cpu;
  printf(
      "{\"bench\": \"graph\", \"device\": \"%s\", \"model\": \"%s\", \"batch\": %d, "
      "\"loss\": \"%s\", \"optimizer\": \"%s\", \"steps_per_round\": %d, \"rounds\": %d, "
      "\"eager_ms_per_step\": [%.2f, %.2f, %.2f], \"replay_ms_per_step\": [%.2f, %.2f, %.2f], "
      "\"speedup_best\": %.3f, \"speedup_median\": %.3f, "
      "\"cpu_ms_per_step\": {\"eager\": [%.2f, %.2f], \"replay\": [%.2f, %.2f]}, "
      "\"host_ms_per_step\": {\"eager\": %.3f, \"replay\": %.3f}, "
      "\"host_waits_per_step\": {\"eager\": %.2f, \"replay\": %.2f}, "
      "\"commands_per_step\": {\"eager\": %s, \"replay\": %s, \"replay_graph\": %zu}, "
      "\"same_bits\": %s}\n",
      clpar_device_id(dev), resnet ? "ResNet-50 3x64x64" : "MLP 784-1024-1024-10",
      resnet ? RN_BATCH : MLP_BATCH, resnet ? "MSE" : "cross-entropy", adam ? "Adam" : "SGD", steps,
      rounds, ms[0][0], ms[0][rounds / 2], ms[0][rounds - 1], ms[1][0], ms[1][rounds / 2],
      ms[1][rounds - 1], ms[0][0] / ms[1][0], ms[0][rounds / 2] / ms[1][rounds / 2], cpu[0][0],
      cpu[0][rounds / 2], cpu[1][0], cpu[1][rounds / 2], f->host[0], f->host[1], f->waits[0],
      f->waits[1], c[0], c[1], graph_cmds, same ? "true" : "false");
}

int bench_model_run(const bench_model_args *given) {
  bench_model_args a = *given;
  int resnet = a.kind == BENCH_MODEL_RESNET50;
  int adam = a.adam >= 0 ? a.adam : !resnet;
  if (a.steps <= 0) a.steps = resnet ? 2 : 5;
  if (a.rounds <= 0) a.rounds = resnet ? 3 : 5;
  clpar_device *dev = clpar_device_get(0);
  bench_step_run s[2];
  memset(s, 0, sizeof s);
  int good = dev != NULL;
  for (int m = 0; good && m < 2; m++) /* a warm-up step each; the replayed copy's second captured */
    good = make_model(&s[m], dev, a.kind, adam) && bench_ok(bench_step(&s[m]), "warm-up") &&
           (m == 0 ? bench_ok(bench_step(&s[m]), "step") : bench_step_capture(&s[m], &dev, 1));
  static figures f; /* large: off the stack */
  f = (figures){.host = {1e30, 1e30}, .cmds = {-1, -1}};
  for (int k = 0; good && k < a.rounds; k++)
    for (int j = 0; good && j < 2; j++) /* which goes first alternates between rounds */
      good = run_round(&s[j ^ (k & 1)], dev, a.steps, &f, j ^ (k & 1), k);
  for (int m = 0; good && m < 2; m++)
    good = commands_per_step(&s[m], dev, resnet ? 1 : 3, &f.cmds[m]);
  if (good)
    print_run(&a, dev, adam, &f, clpar_graph_command_count(s[1].graph), same_bits(&s[0], &s[1]));
  bench_step_run_free(&s[0]);
  bench_step_run_free(&s[1]);
  return good;
}
