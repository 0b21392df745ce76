/* pipeline.c — the experiment of "Single-Machine Model Parallel Best Practices": one training
 * step of a model on one device, split over two devices (model parallel), and pipelined over
 * them at several split sizes, GPipe (the module's forward, then one backward, as the tutorial
 * does) and 1F1B (clpar_pipeline_train_step). Rounds alternate between the set-ups so that
 * the machine's other load falls on all of them; each round times a few steps, and each
 * set-up reports the mean and standard deviation of its rounds' time per step, one JSON
 * object per line (scripts/plot_pipeline.sh draws them).
 *
 * The bubble: on p stages of equal cost, a step's ideal time is one device's over p; the
 * measured bubble is 1 - T_one / (p T), against GPipe's (p - 1) / (m + p - 1) for m
 * micro-batches (the transfers and the per-micro-batch overheads count as bubble here).
 * device_busy_ms_per_step is each device's own time in kernels, GEMMs and local copies
 * (clpar_device_profile_*): a pipeline whose busy times grow over model parallel's pays for
 * its micro-batches in compute, one whose busy times stay but whose step does not shrink idles.
 *
 * Models are entries of `models`: a way to cut the model into stages, make a batch and take
 * the loss. "mlp" has equal stages: each of the two is layers x (Linear(W, W), ReLU), the
 * loss an MSE against a random target (in backward the first stage computes no gradient for
 * its input, so it runs 5 of a step's 11 GEMMs at --layers 2). "resnet50" is ResNet-50 cut
 * as the tutorial cuts it (clpar_resnet_split: conv1 .. layer2 | layer3 .. fc) at --image-size
 * (default 64) with --classes (default 1000), MSE against one-hot targets; its stages are not
 * of equal cost (by FLOPs about 45% and 55%: the ideal pipeline is then 1.8x one device, not
 * 2x, and the bubble measured here counts the imbalance too).
 *
 * On this 2-core machine, two PoCL "basic" devices each run in their own worker thread:
 *   POCL_DEVICES="basic basic" POCL_MAX_PTHREAD_COUNT=1 ./bench_pipeline \
 *       [--model mlp] [--batch 120] [--width 512] [--layers 2] [--rounds 5] [--steps 3]
 *       [--splits 1,3,5,8,10,12,20,40,60] [--no-1f1b] */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *model;
  int64_t batch, width, image_size, classes;
  int layers, rounds, steps, with_1f1b;
  int64_t splits[32];
  int n_splits;
} args;

/* ---- models ---- */

typedef struct model_spec {
  const char *name;
  /* stage s of 2, on dev, from a fixed seed (the same weights for every set-up) */
  clpar_module *(*stage)(const args *a, int s, clpar_device *dev);
  /* the batch (input on dev, target on tdev) */
  int (*batch)(const args *a, clpar_device *dev, clpar_device *tdev, clpar_tensor **x,
               clpar_tensor **target);
  clpar_pipeline_loss_fn loss;
} model_spec;

static clpar_module *mlp_stage(const args *a, int s, clpar_device *dev) {
  clpar_module *l[64], *m = NULL;
  int n = 0, good = 1;
  clpar_manual_seed(7 + (uint64_t)s);
  for (int i = 0; good && i < a->layers && n < 62; i++) {
    good = bench_ok(clpar_linear_create(a->width, a->width, 1, dev, &l[n++]), "Linear") &&
           bench_ok(clpar_relu_create(&l[n++]), "ReLU");
  }
  if (good) bench_ok(clpar_sequential_create(l, n, &m), "Sequential");
  return m;
}

static int mlp_batch(const args *a, clpar_device *dev, clpar_device *tdev, clpar_tensor **x,
                     clpar_tensor **target) {
  int64_t shape[2] = {a->batch, a->width};
  return bench_ok(clpar_tensor_rand_normal(dev, 2, shape, 1, 0, 1, x), "input") &&
         bench_ok(clpar_tensor_rand_normal(tdev, 2, shape, 2, 0, 1, target), "target");
}

static clpar_status mse(clpar_tensor *out, clpar_tensor *target, int64_t first_row, void *user,
                        clpar_tensor **loss) {
  (void)first_row;
  (void)user;
  return clpar_mse_loss(out, target, CLPAR_REDUCTION_MEAN, loss);
}

/* ResNet-50 cut as the tutorial cuts it (clpar_resnet_split after layer2): stage 0 is conv1 ..
 * layer2, stage 1 layer3, layer4, avgpool, flatten and fc; training mode (BatchNorm on each
 * micro-batch's statistics), MSE against one-hot targets, as the tutorial's train(). */
static clpar_module *resnet50_stage(const args *a, int s, clpar_device *dev) {
  clpar_module *r = NULL, *half[2] = {NULL, NULL};
  clpar_manual_seed(7);
  if (!bench_ok(clpar_resnet50(a->classes, dev, &r), "ResNet-50") ||
      !bench_ok(clpar_resnet_split(r, 2, &half[0], &half[1]), "split")) {
    clpar_module_free(r);
    return NULL;
  }
  clpar_module_free(r);
  clpar_module_free(half[1 - s]);
  return half[s];
}

static int resnet50_batch(const args *a, clpar_device *dev, clpar_device *tdev, clpar_tensor **x,
                          clpar_tensor **target) {
  int64_t xs[4] = {a->batch, 3, a->image_size, a->image_size};
  float *onehot = calloc((size_t)(a->batch * a->classes), sizeof *onehot);
  for (int64_t i = 0; onehot && i < a->batch; i++)
    onehot[i * a->classes + (i * 7) % a->classes] = 1;
  int good =
      onehot && bench_ok(clpar_tensor_rand_normal(dev, 4, xs, 1, 0, 1, x), "input") &&
      bench_ok(clpar_tensor_from_host(tdev, 2, (int64_t[]){a->batch, a->classes}, onehot, target),
               "target");
  free(onehot);
  return good;
}

static const model_spec models[] = {
    {"mlp", mlp_stage, mlp_batch, mse},
    {"resnet50", resnet50_stage, resnet50_batch, mse},
};

/* ---- set-ups ---- */

typedef enum { ONE_DEVICE, MODEL_PARALLEL, GPIPE, ONE_F_ONE_B } kind;
static const char *kind_names[] = {"one device", "model parallel", "pipeline", "pipeline"};

typedef struct {
  kind k;
  int64_t split;
  int micro_batches;
  clpar_module *model;
  clpar_optimizer *opt;
  clpar_tensor *x, *target;
  double *times; /* per round, seconds per step */
  int n_times;
  uint64_t waits; /* host waits on either device during the rounds' steps */
  double busy[2]; /* seconds each device computed during the rounds (device profiling) */
} setup;

static int make_setup(setup *c, const model_spec *ms, const args *a, kind k, int64_t split) {
  clpar_device *d0 = clpar_device_get(0), *d1 = clpar_device_get(1);
  clpar_module *stages[2] = {ms->stage(a, 0, d0), ms->stage(a, 1, d0)};
  c->k = k;
  c->split = split;
  c->times = calloc((size_t)a->rounds, sizeof *c->times);
  if (!stages[0] || !stages[1] || !c->times) {
    clpar_module_free(stages[0]);
    clpar_module_free(stages[1]);
    return 0;
  }
  int good;
  if (k == ONE_DEVICE) {
    good = bench_ok(clpar_sequential_create(stages, 2, &c->model), "Sequential");
    c->micro_batches = 1;
  } else {
    clpar_device *devs[2] = {d0, d1};
    clpar_pipeline_options o = {
        .split_size = k == MODEL_PARALLEL ? 0 : split,
        .schedule = k == ONE_F_ONE_B ? CLPAR_PIPELINE_1F1B : CLPAR_PIPELINE_GPIPE};
    good = bench_ok(clpar_pipeline_create(stages, devs, 2, &o, &c->model), "Pipeline");
    c->micro_batches = good ? clpar_pipeline_split(c->model, a->batch, NULL, 0) : 0;
  }
  clpar_sgd_options sgd = {.lr = 0.001f, .momentum = 0.9f};
  return good && bench_ok(clpar_sgd_create_for(c->model, &sgd, &c->opt), "SGD") &&
         ms->batch(a, d0, k == ONE_DEVICE ? d0 : d1, &c->x, &c->target);
}

static int step(setup *c, const model_spec *ms) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *y, *loss;
  int good = bench_ok(clpar_optimizer_zero_grad(c->opt), "zero_grad");
  if (c->k == ONE_F_ONE_B) {
    good = good &&
           bench_ok(clpar_pipeline_train_step(c->model, c->x, c->target, ms->loss, NULL, &loss),
                    "train_step");
  } else {
    good = good && bench_ok(clpar_module_forward(c->model, c->x, &y), "forward") &&
           bench_ok(ms->loss(y, c->target, 0, NULL, &loss), "loss") &&
           bench_ok(clpar_backward(loss), "backward");
  }
  good = good && bench_ok(clpar_optimizer_step(c->opt), "step");
  clpar_scope_end(scope);
  return good;
}

static int sync_all(void) {
  return bench_ok(clpar_device_synchronize(clpar_device_get(0)), "sync") &&
         bench_ok(clpar_device_synchronize(clpar_device_get(1)), "sync");
}

static uint64_t waits_now(void) {
  return clpar_device_host_waits(clpar_device_get(0)) +
         clpar_device_host_waits(clpar_device_get(1));
}

static int round_of(setup *c, const model_spec *ms, int steps) {
  if (!sync_all()) return 0;
  /* Device time: how long each device's kernels, GEMMs and local copies ran (not counting
   * host transfers); against the wall time it shows how much of a step each device idled. */
  int prof = 1;
  for (int d = 0; d < 2; d++)
    prof = prof && clpar_device_profile_start(clpar_device_get(d)) == CLPAR_OK;
  double t0 = now_seconds();
  uint64_t w0 = waits_now();
  int good = 1;
  for (int i = 0; good && i < steps; i++) good = step(c, ms);
  c->waits += waits_now() - w0; /* before the synchronizing below, which waits by design */
  good = good && sync_all();
  c->times[c->n_times++] = (now_seconds() - t0) / steps;
  for (int d = 0; d < 2; d++) {
    clpar_profile pr = {0, 0};
    if (prof && clpar_device_profile_read(clpar_device_get(d), &pr) == CLPAR_OK)
      c->busy[d] += pr.device_seconds;
    clpar_device_profile_stop(clpar_device_get(d));
  }
  return good;
}

static void mean_std(const setup *c, double *mean, double *std) {
  double s = 0, q = 0;
  for (int i = 0; i < c->n_times; i++) s += c->times[i];
  *mean = s / c->n_times;
  for (int i = 0; i < c->n_times; i++) q += (c->times[i] - *mean) * (c->times[i] - *mean);
  *std = c->n_times > 1 ? sqrt(q / (c->n_times - 1)) : 0;
}

static void report(const setup *c, const args *a, double one, double mp) {
  double mean, std;
  mean_std(c, &mean, &std);
  int p = 2, m = c->micro_batches, mlp = !strcmp(a->model, "mlp");
  printf(
      "{\"bench\": \"pipeline\", \"model\": \"%s\", \"batch\": %lld, \"%s\": %lld, "
      "\"layers_per_stage\": %d, \"devices\": \"%s,%s\", \"setup\": \"%s\", \"schedule\": "
      "\"%s\", \"split_size\": %lld, \"micro_batches\": %d, \"rounds\": %d, "
      "\"steps_per_round\": %d, \"seconds_mean\": %.6f, \"seconds_std\": %.6f, "
      "\"vs_one_device\": %.3f, \"speedup_vs_model_parallel\": %.3f, \"host_waits_per_step\": %.2f",
      a->model, (long long)a->batch, mlp ? "width" : "image_size",
      (long long)(mlp ? a->width : a->image_size), mlp ? a->layers : 0,
      clpar_device_id(clpar_device_get(0)), clpar_device_id(clpar_device_get(1)), kind_names[c->k],
      c->k == ONE_F_ONE_B ? "1F1B"
      : c->k == GPIPE     ? "GPipe"
                          : "-",
      (long long)(c->k == GPIPE || c->k == ONE_F_ONE_B ? c->split : a->batch), m, c->n_times,
      a->steps, mean, std, mean / one, mp / mean,
      (double)c->waits / ((double)c->n_times * a->steps));
  double steps = (double)c->n_times * a->steps;
  printf(", \"device_busy_ms_per_step\": [%.2f, %.2f]", 1e3 * c->busy[0] / steps,
         1e3 * c->busy[1] / steps);
  if (c->k == GPIPE || c->k == ONE_F_ONE_B)
    printf(", \"bubble_measured\": %.3f, \"bubble_gpipe_theory\": %.3f", 1.0 - one / (p * mean),
           (double)(p - 1) / (m + p - 1));
  printf("}\n");
  fflush(stdout);
}

static int parse(int argc, char **argv, args *a) {
  *a = (args){"mlp", 120, 512, 64, 1000, 2, 5, 3, 1, {1, 3, 5, 8, 10, 12, 20, 40, 60}, 9};
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--no-1f1b")) {
      a->with_1f1b = 0;
    } else if (v && !strcmp(argv[i], "--model")) {
      a->model = argv[++i];
    } else if (v && !strcmp(argv[i], "--batch")) {
      a->batch = atoll(argv[++i]);
    } else if (v && !strcmp(argv[i], "--width")) {
      a->width = atoll(argv[++i]);
    } else if (v && !strcmp(argv[i], "--image-size")) {
      a->image_size = atoll(argv[++i]);
    } else if (v && !strcmp(argv[i], "--classes")) {
      a->classes = atoll(argv[++i]);
    } else if (v && !strcmp(argv[i], "--layers")) {
      a->layers = atoi(argv[++i]);
    } else if (v && !strcmp(argv[i], "--rounds")) {
      a->rounds = atoi(argv[++i]);
    } else if (v && !strcmp(argv[i], "--steps")) {
      a->steps = atoi(argv[++i]);
    } else if (v && !strcmp(argv[i], "--splits")) {
      a->n_splits = 0;
      for (char *p = argv[++i]; *p && a->n_splits < 32;) {
        a->splits[a->n_splits++] = strtoll(p, &p, 10);
        if (*p == ',')
          p++;
        else if (*p)
          return 0;
      }
    } else {
      return 0;
    }
  }
  return a->batch > 0 && a->width > 0 && a->image_size >= 32 && a->classes > 0 && a->layers > 0 &&
         a->layers <= 31 && a->rounds > 0 && a->steps > 0 && a->n_splits > 0;
}

int main(int argc, char **argv) {
  args a;
  if (!parse(argc, argv, &a)) {
    fprintf(
        stderr,
        "usage: %s [--model mlp|resnet50] [--batch N] [--width W] [--layers L] [--image-size S] "
        "[--classes C] [--rounds R] "
        "[--steps S] [--splits 1,3,5] [--no-1f1b]\n",
        argv[0]);
    return 2;
  }
  const model_spec *ms = NULL;
  for (size_t i = 0; i < sizeof models / sizeof *models; i++)
    if (!strcmp(models[i].name, a.model)) ms = &models[i];
  if (!ms) {
    fprintf(stderr, "unknown model %s\n", a.model);
    return 2;
  }
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  if (clpar_device_count() < 2) {
    fprintf(stderr, "bench_pipeline needs two devices, e.g. POCL_DEVICES=\"basic basic\"\n");
    clpar_shutdown();
    return 1;
  }
  int n = 2 + a.n_splits * (a.with_1f1b ? 2 : 1), good = 1, made = 0;
  setup *c = calloc((size_t)n, sizeof *c);
  good = c != NULL;
  for (int i = 0; good && i < n; i++, made++) {
    kind k = i == 0 ? ONE_DEVICE : i == 1 ? MODEL_PARALLEL : GPIPE;
    int j = i < 2 ? 0 : (i - 2) / (a.with_1f1b ? 2 : 1);
    if (i >= 2 && a.with_1f1b && (i - 2) % 2) k = ONE_F_ONE_B;
    /* two warm-up steps: kernels compile, the caches fill */
    good =
        make_setup(&c[i], ms, &a, k, i < 2 ? 0 : a.splits[j]) && step(&c[i], ms) && step(&c[i], ms);
  }
  for (int r = 0; good && r < a.rounds; r++)
    for (int i = 0; good && i < n; i++) good = round_of(&c[i], ms, a.steps);
  if (good) {
    double one, mp, std;
    mean_std(&c[0], &one, &std);
    mean_std(&c[1], &mp, &std);
    for (int i = 0; i < n; i++) report(&c[i], &a, one, mp);
  }
  for (int i = 0; c && i < made; i++) {
    clpar_optimizer_free(c[i].opt);
    clpar_module_free(c[i].model);
    clpar_tensor_free(c[i].x);
    clpar_tensor_free(c[i].target);
    free(c[i].times);
  }
  free(c);
  clpar_shutdown();
  return good ? 0 : 1;
}
