/* train_step.c — time per training step on one device, and PyTorch's time for the same step
 * on the CPU in the same run (bench/torch_step.py, when `import torch` works).
 *
 *   --model mlp (default): MLP 784-1024-1024-10 at batch 256, cross-entropy, Adam, the batch
 *     uploaded each step; also the share of the step the device spent outside kernels (the
 *     library's own overhead), the kernels per step (the commands the device ran in the
 *     profiled round: kernel launches, GEMM calls, device-local copies) and the driver
 *     allocations during timed steps.
 *   --model small: "Optional: Data Parallelism"'s Linear(5, 2) at batch 30, MSE, SGD
 *     (lr 0.01), input and target uploaded each step: a latency-bound step where per-op
 *     costs dominate.
 *   --model resnet50: torchvision's ResNet-50 (1000 classes) at batch 16 of 3x64x64, MSE
 *     against one-hot labels, SGD (lr 0.001), images and labels uploaded each step (the
 *     model-parallel tutorial's train() at a CPU's size); also images per second. Default
 *     3 steps a round.
 *   --model gpt: nanoGPT's shakespeare_char CPU configuration (4 layers, 4 heads, 128 wide,
 *     block 64, batch 12, vocabulary 65, dropout 0): cross-entropy, clipping to a global norm
 *     of 1, AdamW in nanoGPT's decay groups (lr 1e-3, beta2 0.99, weight decay 0.1), a fixed
 *     batch of token ids uploaded each step; also the allocator's peak bytes in use.
 *
 * Steps run back to back and the device is waited for once at the end of a round, as a
 * training loop that reads its loss only now and then would. clpar runs `rounds` rounds, then
 * PyTorch its rounds, then clpar again; the best round of each counts. Prints one JSON object;
 * "torch_ms_per_step" and "ratio_to_torch" (clpar / PyTorch: below 1 is faster) are there when
 * PyTorch ran, "torch": "missing" when it could not be imported. --torch-threads N holds
 * PyTorch to N threads in every pool (its OpenBLAS's too); "torch_openblas_threads" and
 * "torch_cpu_per_wall" (its CPU seconds per wall second) show what held, as "cpu_per_wall"
 * does for clpar's first rounds (--model gpt): about 1 means one core was busy.
 *
 *   POCL_DEVICES=pthread ./bench_train_step [device-index] [steps]
 *                        [--model mlp|small|resnet50|gpt] [--rounds R] [--no-torch]
 *                        [--torch-threads N] (PyTorch's thread count; default its own)
 *   CLPAR_DEVICES=host ./bench_train_step 0 10
 *   CLPAR_BENCH_PYTHON=/usr/bin/python3 picks the interpreter (default: python3, then
 *   /usr/bin/python3, the first that imports torch). */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef BENCH_TORCH_SCRIPT
#define BENCH_TORCH_SCRIPT "torch_step.py"
#endif

enum { BATCH = 256, IN = 784, HIDDEN = 1024, OUT = 10 };
enum { SMALL_BATCH = 30, SMALL_IN = 5, SMALL_OUT = 2 };
enum { RESNET_BATCH = 16, RESNET_SIZE = 64, RESNET_CLASSES = 1000 };
enum { GPT_BATCH = 12, GPT_BLOCK = 64, GPT_VOCAB = 65 };

typedef enum { MODEL_MLP, MODEL_SMALL, MODEL_RESNET, MODEL_GPT } model_kind;
static const char *const model_names[] = {"mlp", "small", "resnet50", "gpt"};

typedef struct {
  model_kind kind;
  clpar_module *model;
  clpar_optimizer *opt;
  clpar_device *dev;
  float *x, *target; /* target: small model and ResNet only */
  int32_t y[BATCH];
  int32_t *ids; /* GPT: token ids and next tokens, GPT_BATCH x GPT_BLOCK each */
} bench_case;

/* The GPT's step: upload ids and targets, zero_grad, forward, cross-entropy, backward, clip,
 * AdamW. */
static int gpt_step(bench_case *c) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *y, *logits, *loss;
  int64_t shape[2] = {GPT_BATCH, GPT_BLOCK};
  int32_t *next = c->ids + GPT_BATCH * GPT_BLOCK;
  int good =
      bench_ok(clpar_tensor_from_host_dtype(c->dev, CLPAR_INT32, 2, shape, c->ids, &x), "ids") &&
      bench_ok(clpar_tensor_from_host_dtype(c->dev, CLPAR_INT32, 2, shape, next, &y), "ids") &&
      bench_ok(clpar_optimizer_zero_grad(c->opt), "zero_grad") &&
      bench_ok(clpar_module_forward(c->model, x, &logits), "forward") &&
      bench_ok(
          clpar_cross_entropy_targets(logits, y, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, &loss),
          "loss") &&
      bench_ok(clpar_backward(loss), "backward") &&
      bench_ok(clpar_clip_grad_norm_module(c->model, 1.0f, NULL), "clip") &&
      bench_ok(clpar_optimizer_step(c->opt), "step");
  clpar_scope_end(scope);
  return good;
}

/* nanoGPT's CPU GPT on dev, AdamW in decay groups; ids (i * 37) % 65 as torch_step.py's. */
static int gpt_case(bench_case *c) {
  c->ids = malloc(sizeof(int32_t) * 2 * GPT_BATCH * GPT_BLOCK);
  if (!c->ids) return 0;
  for (int i = 0; i < GPT_BATCH * GPT_BLOCK; i++) {
    c->ids[i] = (i * 37) % GPT_VOCAB;
    c->ids[GPT_BATCH * GPT_BLOCK + i] = ((i + 1) * 37) % GPT_VOCAB;
  }
  clpar_gpt_config cfg = {GPT_BLOCK, GPT_VOCAB, 4, 4, 128, 0.0f, 1};
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.1f};
  clpar_manual_seed(3);
  return bench_ok(clpar_gpt_create(&cfg, c->dev, &c->model), "GPT") &&
         bench_ok(clpar_adamw_create_decay_groups(c->model, &adam, &c->opt), "AdamW");
}

/* The small model's and the ResNet's step: upload input and target, zero_grad, forward, MSE,
 * backward, SGD. */
static int mse_step(bench_case *c) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *tt, *out, *loss;
  int resnet = c->kind == MODEL_RESNET;
  int64_t xs[4] = {RESNET_BATCH, 3, RESNET_SIZE, RESNET_SIZE},
          ts[2] = {RESNET_BATCH, RESNET_CLASSES};
  if (!resnet) {
    xs[0] = ts[0] = SMALL_BATCH;
    xs[1] = SMALL_IN;
    ts[1] = SMALL_OUT;
  }
  int good = bench_ok(clpar_tensor_from_host(c->dev, resnet ? 4 : 2, xs, c->x, &xt), "upload") &&
             bench_ok(clpar_tensor_from_host(c->dev, 2, ts, c->target, &tt), "upload") &&
             bench_ok(clpar_optimizer_zero_grad(c->opt), "zero_grad") &&
             bench_ok(clpar_module_forward(c->model, xt, &out), "forward") &&
             bench_ok(clpar_mse_loss(out, tt, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
             bench_ok(clpar_backward(loss), "backward") &&
             bench_ok(clpar_optimizer_step(c->opt), "step");
  clpar_scope_end(scope);
  return good;
}

static int one_step(bench_case *c) {
  if (c->kind == MODEL_GPT) return gpt_step(c);
  return c->kind != MODEL_MLP ? mse_step(c)
                              : bench_train_step(c->model, c->opt, c->dev, c->x, c->y, BATCH, IN);
}

/* Wall seconds per step over steps steps, the device waited for at the end. */
static double timed(bench_case *c, int steps) {
  double t0 = now_seconds();
  for (int i = 0; i < steps; i++)
    if (!one_step(c)) return -1;
  if (!bench_ok(clpar_device_synchronize(c->dev), "synchronize")) return -1;
  return (now_seconds() - t0) / steps;
}

/* Best of rounds rounds (or -1 on failure), folded into *best. */
static int best_of(bench_case *c, int steps, int rounds, double *best) {
  for (int r = 0; r < rounds; r++) {
    double t = timed(c, steps);
    if (t < 0) return 0;
    if (*best < 0 || t < *best) *best = t;
  }
  return 1;
}

/* CPU seconds of every thread of this process: over a wall second, the cores kept busy. */
static double cpu_seconds(void) {
  struct timespec t;
  return clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) == 0 ? (double)t.tv_sec + 1e-9 * t.tv_nsec
                                                          : 0.0;
}

/* An interpreter that imports torch, or NULL. */
static const char *find_python(void) {
  static char chosen[512];
  const char *env = getenv("CLPAR_BENCH_PYTHON");
  const char *candidates[] = {env, "python3", "/usr/bin/python3"};
  for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++) {
    const char *p = candidates[i];
    if (!p || !*p || strchr(p, '\'') || strlen(p) > 400) continue;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' >/dev/null 2>&1", p);
    if (system(cmd) == 0) {
      snprintf(chosen, sizeof chosen, "%s", p);
      return chosen;
    }
  }
  return NULL;
}

/* What bench/torch_step.py reported: ms per step, PyTorch's intra-op and OpenBLAS threads (-1:
not OpenBLAS), and CPU seconds per wall second over its rounds. */
typedef struct {
  double ms, cpu_per_wall;
  int threads, openblas_threads;
} torch_run;

/* Runs bench/torch_step.py and fills *r. 1 on success. */
static int run_torch(const char *python, const char *model, int steps, int rounds, int want_threads,
                     torch_run *r) {
  char cmd[1200], line[1024] = "";
  snprintf(cmd, sizeof cmd, "'%s' '%s' --model %s --steps %d --rounds %d --threads %d", python,
           BENCH_TORCH_SCRIPT, model, steps, rounds, want_threads);
  FILE *f = popen(cmd, "r");
  if (!f) return 0;
  int got = 0;
  while (fgets(line, sizeof line, f)) {
    const char *m = strstr(line, "\"ms_per_step\": "), *t = strstr(line, "\"threads\": ");
    const char *b = strstr(line, "\"openblas_threads\": "), *c = strstr(line, "\"cpu_per_wall\": ");
    if (m && t && sscanf(m + 15, "%lf", &r->ms) == 1 && sscanf(t + 11, "%d", &r->threads) == 1)
      got = 1;
    if (!b || sscanf(b + 20, "%d", &r->openblas_threads) != 1) r->openblas_threads = -1;
    if (!c || sscanf(c + 16, "%lf", &r->cpu_per_wall) != 1) r->cpu_per_wall = -1;
  }
  return pclose(f) == 0 && got;
}

static clpar_module *small_model(clpar_device *dev) {
  clpar_module *m = NULL;
  clpar_manual_seed(3);
  return bench_ok(clpar_linear_create(SMALL_IN, SMALL_OUT, 1, dev, &m), "Linear") ? m : NULL;
}

/* ResNet-50 on dev with its batch: images in [-0.5, 0.5), one-hot targets (class i % 1000). */
static int resnet_case(bench_case *c) {
  size_t n = (size_t)RESNET_BATCH * 3 * RESNET_SIZE * RESNET_SIZE;
  c->x = malloc(sizeof(float) * n);
  c->target = calloc((size_t)RESNET_BATCH * RESNET_CLASSES, sizeof(float));
  if (!c->x || !c->target) return 0;
  bench_images(c->x, c->target, RESNET_BATCH, RESNET_SIZE, RESNET_CLASSES);
  clpar_manual_seed(3);
  clpar_sgd_options sgd = {.lr = 0.001f};
  return bench_ok(clpar_resnet50(RESNET_CLASSES, c->dev, &c->model), "ResNet-50") &&
         bench_ok(clpar_sgd_create_for(c->model, &sgd, &c->opt), "SGD");
}

/* Linear(5, 2) on dev: fixed inputs and targets, SGD. */
static int small_case(bench_case *c) {
  c->x = malloc(sizeof(float) * SMALL_BATCH * SMALL_IN);
  c->target = malloc(sizeof(float) * SMALL_BATCH * SMALL_OUT);
  for (int i = 0; i < SMALL_BATCH * SMALL_IN; i++)
    c->x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  for (int i = 0; i < SMALL_BATCH * SMALL_OUT; i++) c->target[i] = (float)((i * 11) % 7) / 7.0f;
  c->model = small_model(c->dev);
  clpar_sgd_options sgd = {.lr = 0.01f};
  return c->model && bench_ok(clpar_sgd_create_for(c->model, &sgd, &c->opt), "SGD");
}

/* The MLP on dev: one batch, Adam. */
static int mlp_case(bench_case *c) {
  c->x = malloc(sizeof(float) * BATCH * IN);
  bench_batch(c->x, c->y, BATCH, IN, OUT);
  c->model = bench_mlp(IN, HIDDEN, OUT, c->dev);
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  return c->model && bench_ok(clpar_adam_create_for(c->model, &adam, &c->opt), "Adam");
}

/* The JSON fields of PyTorch's run into out: its time per step and threads, or why there is
 * none. The host backend's OpenMP threads spin between ops unless told not to; on a machine
 * shared with other work that decides its speed (docs/DESIGN.md), so they say which. */
static void torch_fields(char *out, size_t size, const torch_run *t, double plain, int use_torch,
                         const char *python) {
  const char *wait = getenv("OMP_WAIT_POLICY");
  if (t->ms > 0)
    snprintf(out, size,
             "\"torch_ms_per_step\": %.4f, \"torch_threads\": %d, \"torch_openblas_threads\": "
             "%d, \"torch_cpu_per_wall\": %.3f, \"ratio_to_torch\": %.3f, "
             "\"omp_wait_policy\": \"%.20s\"",
             t->ms, t->threads, t->openblas_threads, t->cpu_per_wall, plain * 1e3 / t->ms,
             wait ? wait : "default");
  else
    snprintf(out, size, "\"torch\": \"%s\", \"omp_wait_policy\": \"%.20s\"",
             !use_torch ? "not run"
             : python   ? "failed"
                        : "missing",
             wait ? wait : "default");
}

int main(int argc, char **argv) {
  int index = 0, steps = -1, rounds = 3, use_torch = 1, positional = 0, torch_threads_want = 0;
  model_kind kind = MODEL_MLP;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      const char *m = argv[++i];
      kind = strcmp(m, "small") == 0      ? MODEL_SMALL
             : strcmp(m, "resnet50") == 0 ? MODEL_RESNET
             : strcmp(m, "gpt") == 0      ? MODEL_GPT
                                          : MODEL_MLP;
    } else if (strcmp(argv[i], "--torch-threads") == 0 && i + 1 < argc)
      torch_threads_want = atoi(argv[++i]);
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--no-torch") == 0)
      use_torch = 0;
    else if (positional++ == 0)
      index = atoi(argv[i]);
    else
      steps = atoi(argv[i]);
  }
  int small = kind == MODEL_SMALL;
  if (steps <= 0) steps = small ? 2000 : kind == MODEL_RESNET ? 3 : 10;
  if (rounds <= 0) rounds = 1;
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  bench_case c = {.kind = kind, .dev = clpar_device_get(index)};
  if (!c.dev) {
    fprintf(stderr, "%s\n", clpar_last_error());
    clpar_shutdown();
    return 1;
  }
  int good = kind == MODEL_GPT      ? gpt_case(&c)
             : kind == MODEL_RESNET ? resnet_case(&c)
             : small                ? small_case(&c)
                                    : mlp_case(&c);
  /* Warm-up: kernels compile and the allocator's cache fills. */
  good = good && timed(&c, small ? 100 : kind == MODEL_RESNET ? 1 : 2) > 0;
  clpar_memory_stats m0, m1;
  clpar_device_memory_stats(c.dev, &m0);
  double plain = -1, cpu0 = cpu_seconds(), wall0 = now_seconds();
  good = good && best_of(&c, steps, rounds, &plain);
  double cpu_per_wall = (cpu_seconds() - cpu0) / (now_seconds() - wall0);
  clpar_device_memory_stats(c.dev, &m1);
  const char *python = use_torch && good ? find_python() : NULL;
  torch_run tr = {.ms = -1};
  if (python && !run_torch(python, model_names[kind], steps, rounds, torch_threads_want, &tr)) {
    fprintf(stderr, "bench/torch_step.py failed under %s\n", python);
    tr.ms = -1;
  }
  if (use_torch && !python) fprintf(stderr, "PyTorch is missing: no python3 here imports torch\n");
  good = good && best_of(&c, steps, rounds, &plain); /* clpar again, after PyTorch */
  clpar_profile prof = {0};
  double profiled = -1;
  /* Device time, where the device records it (the host backend does not). */
  if (good && kind == MODEL_MLP && clpar_device_profile_start(c.dev) == CLPAR_OK) {
    profiled = timed(&c, steps);
    good = profiled > 0 && bench_ok(clpar_device_profile_read(c.dev, &prof), "profile read");
    clpar_device_profile_stop(c.dev);
  }
  if (good) {
    char torch_part[384], torch_ips[64] = "";
    if (tr.ms > 0 && kind == MODEL_RESNET)
      snprintf(torch_ips, sizeof torch_ips, ", \"torch_images_per_s\": %.2f",
               RESNET_BATCH * 1e3 / tr.ms);
    torch_fields(torch_part, sizeof torch_part, &tr, plain, use_torch, python);
    if (kind == MODEL_RESNET) {
      printf(
          "{\"bench\": \"train_step\", \"device\": \"%s\", \"model\": \"ResNet-50\", "
          "\"batch\": %d, \"image_size\": %d, \"classes\": %d, \"loss\": \"MSE\", "
          "\"optimizer\": \"SGD\", \"steps\": %d, \"rounds\": %d, \"ms_per_step\": %.2f, "
          "\"images_per_s\": %.2f, %s%s}\n",
          clpar_device_id(c.dev), RESNET_BATCH, RESNET_SIZE, RESNET_CLASSES, steps, rounds,
          plain * 1e3, RESNET_BATCH / plain, torch_part, torch_ips);
    } else if (kind == MODEL_GPT) {
      printf(
          "{\"bench\": \"train_step\", \"device\": \"%s\", \"model\": \"GPT 4x4x128\", "
          "\"block\": %d, \"batch\": %d, \"optimizer\": \"AdamW\", \"steps\": %d, "
          "\"rounds\": %d, \"ms_per_step\": %.2f, \"cpu_per_wall\": %.3f, "
          "\"peak_bytes_in_use\": %llu, %s}\n",
          clpar_device_id(c.dev), GPT_BLOCK, GPT_BATCH, steps, rounds, plain * 1e3, cpu_per_wall,
          (unsigned long long)m1.peak_bytes_in_use, torch_part);
    } else if (small) {
      printf(
          "{\"bench\": \"train_step\", \"device\": \"%s\", \"model\": \"Linear 5-2\", "
          "\"batch\": %d, \"loss\": \"MSE\", \"optimizer\": \"SGD\", \"steps\": %d, "
          "\"rounds\": %d, \"ms_per_step\": %.4f, %s}\n",
          clpar_device_id(c.dev), SMALL_BATCH, steps, rounds, plain * 1e3, torch_part);
    } else {
      char prof_part[256] = "\"ms_per_step_profiled\": null";
      double kernel = prof.device_seconds / steps;
      if (profiled > 0)
        snprintf(prof_part, sizeof prof_part,
                 "\"ms_per_step_profiled\": %.2f, \"kernel_ms_per_step\": %.2f, "
                 "\"kernels_per_step\": %.1f, \"outside_kernels_share\": %.4f",
                 profiled * 1e3, kernel * 1e3, (double)prof.ops / steps,
                 prof.device_seconds > 0 ? 1.0 - kernel / profiled : -1.0);
      printf(
          "{\"bench\": \"train_step\", \"device\": \"%s\", \"model\": \"MLP %d-%d-%d-%d\", "
          "\"batch\": %d, \"optimizer\": \"Adam\", \"steps\": %d, \"rounds\": %d, "
          "\"ms_per_step\": %.2f, %s, \"driver_allocs_during_timed_steps\": %llu, %s}\n",
          clpar_device_id(c.dev), IN, HIDDEN, HIDDEN, OUT, BATCH, steps, rounds, plain * 1e3,
          prof_part, (unsigned long long)(m1.driver_allocs - m0.driver_allocs), torch_part);
    }
  }
  clpar_optimizer_free(c.opt);
  clpar_module_free(c.model);
  free(c.x);
  free(c.target);
  free(c.ids);
  clpar_shutdown();
  return good ? 0 : 1;
}
