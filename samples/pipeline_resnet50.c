/* pipeline_resnet50.c — the experiment of PyTorch's "Single-Machine Model Parallel" tutorial
 * ("Single-Machine Model Parallel Best Practices") on the selected devices: its train() (ResNet-50,
 * MSE against one-hot labels, SGD lr 0.001, 3 batches of 120 images of 3x128x128, 1000
 * classes) timed
 *   1. on one device (the first selected),
 *   2. model parallel: ModelParallelResNet50, seq1 = conv1 .. layer2 on the first device,
 *      seq2 = layer3, layer4, avgpool (and the flatten and fc, which the tutorial keeps as
 *      self.fc) on the second, the activation copied between them in forward,
 *   3. pipelined (PipelineParallelResNet50) with split_size 20: clpar_pipeline_create over the
 *      same two halves (clpar_resnet_split, include/clpar/models.h),
 * each repeated (the tutorial: 10 times) and reported as mean and standard deviation; then the
 * pipeline's sweep over split_size 1, 3, 5, 8, 10, 12, 20, 40, 60. It prints a table and writes
 * one JSON object per set-up (the lines bench_pipeline writes), which scripts/plot_pipeline.sh
 * draws: the three set-ups as bars, and time against split_size.
 *
 * As the tutorial: train() runs the batches on a model in training mode (BatchNorm on batch
 * statistics: the pipelined model normalizes each micro-batch with its own, as PyTorch's
 * does), forward on the whole batch, the loss on the output's device, one backward (every
 * micro-batch's forward, then every backward: GPipe). The images of the batches are drawn once
 * before any clock starts (the tutorial draws them inside train(); here that would time the host's
 * random numbers); a repeat's time covers, per batch, the upload, zero_grad, forward, loss,
 * backward and step, and ends when both devices are done. Each set-up first runs one batch
 * untimed (kernels compile, the caches fill).
 *
 * The devices are the first two selected; with one selected, the host backend is the second:
 *   POCL_DEVICES="pthread pthread" ./pipeline_resnet50                  (the tutorial's sizes)
 *   POCL_DEVICES="basic basic" POCL_MAX_PTHREAD_COUNT=1 ./pipeline_resnet50 --batch 16 \
 *       --image-size 64 --classes 10 --batches 1 --repeat 3 --split 4 --splits 1,2,4,8,16
 *   (about 4 minutes on a busy 2-core machine; at 32x32 a micro-batch of one row leaves
 *   layer4's BatchNorms one value per channel, which training mode refuses, as PyTorch does)
 *   flags: --batch N --image-size S --classes C --batches B --repeat R --split S
 *          --splits a,b,c --schedule gpipe|1f1b --json FILE (default pipeline_resnet50.json)
 *   scripts/plot_pipeline.sh pipeline_resnet50.json plots/
 *   Each row's warm-up and rounds are reported on stderr as they finish; the table goes to
 *   stdout. */
#include <clpar/clpar.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample_util.h"

typedef struct {
  int64_t batch, size, classes, split;
  int batches, repeat, one_f_one_b;
  int64_t splits[32];
  int n_splits;
  const char *json;
} options;

typedef struct {
  clpar_device *d0, *d1;
  const options *o;
  float *images, *labels; /* batches x (batch, 3, size, size); (batch, classes) one-hot */
  FILE *json;
} experiment;

/* ---- the models ---- */

/* ModelParallelResNet50.forward: seq2(seq1(x).to('cuda:1')), seq2 ending in flatten and fc */
static clpar_status mp_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **out,
                               void *user) {
  const experiment *e = user;
  clpar_tensor *h;
  clpar_status s = clpar_module_forward(clpar_module_child(self, "seq1"), x, &h);
  if (s == CLPAR_OK && e->d1 != e->d0) s = clpar_tensor_to(h, e->d1, &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "seq2"), h, out);
  return s; /* the intermediates belong to the caller's scope */
}

typedef enum { ONE_DEVICE, MODEL_PARALLEL, PIPELINE } setup;
static const char *setup_names[] = {"one device", "model parallel", "pipeline"};

/* A ResNet-50 from seed 0 (the same weights for every set-up), in training mode, set up as
 * `k`: on the first device, split over both, or a pipeline of its two halves. */
static clpar_module *make_model(experiment *e, setup k) {
  clpar_module *r = NULL, *halves[2] = {NULL, NULL}, *m = NULL;
  clpar_manual_seed(0);
  if (!check(clpar_resnet50(e->o->classes, e->d0, &r), "ResNet-50")) return NULL;
  if (k == ONE_DEVICE) return r;
  int ok = check(clpar_resnet_split(r, 2, &halves[0], &halves[1]), "split");
  clpar_module_free(r); /* its children live on in the halves */
  if (!ok) return NULL;
  if (k == PIPELINE) {
    clpar_pipeline_options po = {
        .split_size = e->o->split,
        .schedule = e->o->one_f_one_b ? CLPAR_PIPELINE_1F1B : CLPAR_PIPELINE_GPIPE};
    const char *names[2] = {"seq1", "seq2"};
    po.stage_names = names;
    ok = check(clpar_pipeline_create(halves, (clpar_device *const[]){e->d0, e->d1}, 2, &po, &m),
               "pipeline");
    return ok ? m : NULL;
  }
  ok = check(clpar_module_to(halves[1], e->d1), "seq2 to the second device") &&
       check(clpar_module_create("ModelParallelResNet50", mp_forward, e, NULL, &m), "module");
  if (!ok) {
    clpar_module_free(halves[0]);
    clpar_module_free(halves[1]);
    return NULL;
  }
  ok = check(clpar_module_add_child(m, "seq1", halves[0]), "seq1") &&
       check(clpar_module_add_child(m, "seq2", halves[1]), "seq2");
  if (!ok) clpar_module_free(m);
  return ok ? m : NULL;
}

/* ---- train() ---- */

static clpar_status mse(clpar_tensor *out, clpar_tensor *target, int64_t first_row, void *user,
                        clpar_tensor **loss) {
  (void)first_row;
  (void)user;
  return clpar_mse_loss(out, target, CLPAR_REDUCTION_MEAN, loss);
}

/* One batch of the tutorial's loop. */
static int train_batch(experiment *e, clpar_module *m, clpar_optimizer *opt, int b) {
  const options *o = e->o;
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *y, *out, *loss;
  int64_t xs[4] = {o->batch, 3, o->size, o->size}, ys[2] = {o->batch, o->classes};
  size_t per_batch = (size_t)(o->batch * 3 * o->size * o->size);
  int pipe = !strcmp(clpar_module_type(m), "Pipeline");
  clpar_device *out_dev = !strcmp(clpar_module_type(m), "ResNet") ? e->d0 : e->d1;
  int ok = check(clpar_optimizer_zero_grad(opt), "zero_grad") &&
           check(clpar_tensor_from_host(e->d0, 4, xs, e->images + per_batch * (size_t)b, &x),
                 "upload images") &&
           /* labels = labels.to(outputs.device) */
           check(clpar_tensor_from_host(out_dev, 2, ys, e->labels, &y), "upload labels");
  if (ok && pipe && o->one_f_one_b) {
    ok = check(clpar_pipeline_train_step(m, x, y, mse, NULL, &loss), "train_step");
  } else if (ok) {
    ok = check(clpar_module_forward(m, x, &out), "forward") &&
         check(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
         check(clpar_backward(loss), "backward");
  }
  ok = ok && check(clpar_optimizer_step(opt), "step");
  clpar_scope_end(scope);
  return ok;
}

/* The seed's train(model): every batch, then both devices done; seconds in *t. */
static int train(experiment *e, clpar_module *m, clpar_optimizer *opt, double *t) {
  double t0 = now_seconds();
  int ok = 1;
  for (int b = 0; ok && b < e->o->batches; b++) ok = train_batch(e, m, opt, b);
  ok = ok && check(clpar_device_synchronize(e->d0), "synchronize") &&
       check(clpar_device_synchronize(e->d1), "synchronize");
  *t = now_seconds() - t0;
  return ok;
}

static void mean_std(const double *t, int n, double *mean, double *std) {
  double s = 0, q = 0;
  for (int i = 0; i < n; i++) s += t[i];
  *mean = s / n;
  for (int i = 0; i < n; i++) q += (t[i] - *mean) * (t[i] - *mean);
  *std = n > 1 ? sqrt(q / (n - 1)) : 0;
}

/* Times o->repeat runs of train(m) and reports them (stdout and the JSON file). */
static int measure(experiment *e, clpar_module *m, clpar_optimizer *opt, setup k, int64_t split,
                   const char *role, double *mean_out) {
  const options *o = e->o;
  double *t = calloc((size_t)o->repeat, sizeof *t), mean, std;
  char what[64]; /* progress on stderr: a row takes a warm-up and --repeat rounds */
  snprintf(what, sizeof what, "%s %s", setup_names[k], role);
  if (k == PIPELINE)
    snprintf(what + strlen(what), sizeof what - strlen(what), " split %lld", (long long)split);
  fprintf(stderr, "  %s: warm-up, then %d rounds\n", what, o->repeat);
  int ok = t && train_batch(e, m, opt, 0) && /* warm-up */
           check(clpar_device_synchronize(e->d0), "synchronize") &&
           check(clpar_device_synchronize(e->d1), "synchronize");
  for (int r = 0; ok && r < o->repeat; r++) {
    ok = train(e, m, opt, &t[r]);
    if (ok) fprintf(stderr, "  %s: round %d/%d took %.2f s\n", what, r + 1, o->repeat, t[r]);
  }
  if (ok) {
    mean_std(t, o->repeat, &mean, &std);
    *mean_out = mean;
    int mb = k == PIPELINE ? clpar_pipeline_split(m, o->batch, NULL, 0) : 1;
    printf("%-16s %-12s %10lld %6d %12.3f %10.3f\n", setup_names[k], role,
           (long long)(k == PIPELINE ? split : o->batch), mb, mean, std);
    fflush(stdout);
    fprintf(e->json,
            "{\"bench\": \"pipeline\", \"source\": \"samples/pipeline_resnet50\", \"model\": "
            "\"resnet50\", \"role\": \"%s\", \"batch\": %lld, \"image_size\": %lld, \"classes\": "
            "%lld, \"batches\": %d, \"devices\": \"%s,%s\", \"setup\": \"%s\", \"schedule\": "
            "\"%s\", \"split_size\": %lld, \"micro_batches\": %d, \"rounds\": %d, "
            "\"seconds_mean\": %.6f, \"seconds_std\": %.6f}\n",
            role, (long long)o->batch, (long long)o->size, (long long)o->classes, o->batches,
            clpar_device_id(e->d0), clpar_device_id(e->d1), setup_names[k],
            k != PIPELINE    ? "-"
            : o->one_f_one_b ? "1F1B"
                             : "GPipe",
            (long long)(k == PIPELINE ? split : o->batch), mb, o->repeat, mean, std);
    fflush(e->json);
  }
  free(t);
  return ok;
}

/* One set-up: made from seed 0, measured, and for the pipeline the sweep after. */
static int run_setup(experiment *e, setup k, double *mean) {
  clpar_module *m = make_model(e, k);
  clpar_optimizer *opt = NULL;
  int ok = m && check(clpar_module_train(m, 1), "train mode") &&
           check(clpar_sgd_create_for(m, &(clpar_sgd_options){.lr = 0.001f}, &opt), "SGD") &&
           measure(e, m, opt, k, e->o->split, "experiment", mean);
  for (int i = 0; ok && k == PIPELINE && i < e->o->n_splits; i++) {
    clpar_pipeline_options po = {
        .split_size = e->o->splits[i],
        .schedule = e->o->one_f_one_b ? CLPAR_PIPELINE_1F1B : CLPAR_PIPELINE_GPIPE};
    double ignored;
    ok = check(clpar_pipeline_set_options(m, &po), "split_size") &&
         measure(e, m, opt, k, e->o->splits[i], "sweep", &ignored);
  }
  clpar_optimizer_free(opt);
  clpar_module_free(m);
  return ok;
}

/* ---- flags ---- */

static int parse_list(const char *v, options *o) {
  o->n_splits = 0;
  for (char *p = (char *)v; *p && o->n_splits < 32;) {
    long long x = strtoll(p, &p, 10);
    if (x < 1 || (*p && *p != ',')) return 0;
    o->splits[o->n_splits++] = x;
    if (*p == ',') p++;
  }
  return o->n_splits > 0;
}

static int parse(int argc, char **argv, options *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int good = v != NULL;
    if (good && !strcmp(a, "--batch"))
      o->batch = atoll(v);
    else if (good && !strcmp(a, "--image-size"))
      o->size = atoll(v);
    else if (good && !strcmp(a, "--classes"))
      o->classes = atoll(v);
    else if (good && !strcmp(a, "--batches"))
      o->batches = atoi(v);
    else if (good && !strcmp(a, "--repeat"))
      o->repeat = atoi(v);
    else if (good && !strcmp(a, "--split"))
      o->split = atoll(v);
    else if (good && !strcmp(a, "--splits"))
      good = parse_list(v, o);
    else if (good && !strcmp(a, "--schedule") && (!strcmp(v, "gpipe") || !strcmp(v, "1f1b")))
      o->one_f_one_b = !strcmp(v, "1f1b");
    else if (good && !strcmp(a, "--json"))
      o->json = v;
    else
      good = 0;
    if (!good) {
      fprintf(stderr,
              "bad flag %s %s\nusage: pipeline_resnet50 [--batch N] [--image-size S] [--classes "
              "C] [--batches B] [--repeat R] [--split S] [--splits 1,3,5] [--schedule "
              "gpipe|1f1b] [--json FILE]\n",
              a, v ? v : "");
      return 0;
    }
    i++;
  }
  /* ResNet's stem and four stride-2 stages need at least 32x32 to keep every map >= 1x1 */
  if (o->batch < 1 || o->batch > 4096 || o->size < 32 || o->size > 4096 || o->classes < 1 ||
      o->classes > 1000000 || o->batches < 1 || o->repeat < 1 || o->split < 1) {
    fprintf(stderr,
            "bad sizes: batch 1..4096, image size 32..4096, classes 1..1000000, "
            "batches, repeat and split >= 1\n");
    return 0;
  }
  return 1;
}

int main(int argc, char **argv) {
  options o = {.batch = 120,
               .size = 128,
               .classes = 1000,
               .split = 20,
               .batches = 3,
               .repeat = 10,
               .splits = {1, 3, 5, 8, 10, 12, 20, 40, 60},
               .n_splits = 9,
               .json = "pipeline_resnet50.json"};
  if (!parse(argc, argv, &o)) return 2;
  if (!check(clpar_init(), "clpar_init")) return 1;
  experiment e = {clpar_device_get(0), NULL, &o, NULL, NULL, NULL};
  e.d1 = clpar_device_count() > 1 ? clpar_device_get(1) : clpar_device_host();
  size_t per_batch = (size_t)(o.batch * 3 * o.size * o.size);
  e.images = malloc(per_batch * (size_t)o.batches * sizeof *e.images);
  e.labels = calloc((size_t)(o.batch * o.classes), sizeof *e.labels);
  e.json = fopen(o.json, "w");
  int ok = e.images && e.labels && e.json;
  if (!e.json) perror(o.json);
  if (ok) {
    randn(e.images, per_batch * (size_t)o.batches);
    /* one_hot_indices = torch.LongTensor(batch_size).random_(0, num_classes) */
    for (int64_t i = 0; i < o.batch; i++)
      e.labels[i * o.classes + (int64_t)(uniform() * (double)o.classes)] = 1.0f;
    printf(
        "ResNet-50, batch %lld of 3x%lldx%lld, %lld classes, %d batches per train(), %d "
        "repeats; seq1 on %s, seq2 on %s%s; %s\n",
        (long long)o.batch, (long long)o.size, (long long)o.size, (long long)o.classes, o.batches,
        o.repeat, clpar_device_id(e.d0), clpar_device_id(e.d1),
        e.d0 == e.d1 ? " (one device: nothing to split)" : "",
        o.one_f_one_b ? "pipeline: train_step, 1F1B" : "pipeline: forward + backward, GPipe");
    printf("%-16s %-12s %10s %6s %12s %10s\n", "set-up", "", "split_size", "m", "mean s", "std s");
  }
  double t[3] = {0, 0, 0};
  for (int k = 0; ok && k < 3; k++) ok = run_setup(&e, (setup)k, &t[k]);
  if (ok)
    printf(
        "model parallel / one device: %.3f; pipelined (split %lld) speedup over model "
        "parallel: %.2fx (the tutorial on two GPUs: 1.07, 1.60x)\nJSON: %s (draw with "
        "scripts/plot_pipeline.sh %s)\n",
        t[1] / t[0], (long long)o.split, t[1] / t[2], o.json, o.json);
  if (e.json) fclose(e.json);
  free(e.images);
  free(e.labels);
  clpar_shutdown();
  return ok ? 0 : 1;
}
