/* train_gpt.c — a character-level GPT trained on Shakespeare (data/shakespeare.txt.gz), as
 * nanoGPT's shakespeare_char on a CPU: 4 layers, 4 heads, 128 wide, context 64, batch 12,
 * dropout 0; AdamW (beta2 0.99, weight decay 0.1 on the 2-D weights only), learning rate
 * 1e-3 with 100 iterations of linear warm-up, then cosine decay to 1e-4 at --iters; gradients
 * clipped to a global norm of 1. A progress line (loss, learning rate, tokens/s) goes to stderr
 * every --log-interval iterations; every --eval-interval iterations (and at the end) the
 * validation loss over --eval-batches fixed batches is printed and a training checkpoint is
 * saved to --ckpt (and at the end the wall time, what evaluations and checkpoints took of it
 * and the process's CPU time go to stderr); --resume continues from it (model, AdamW state,
 * iteration, and from those the learning rate and the loader's position, so the run continues
 * bit for bit). At the end
 * the model writes --sample-len characters after a newline: greedy with --temperature 0, else
 * sampled from softmax(logits / temperature) restricted to the --top-k likeliest characters.
 *
 *   ./train_gpt [--iters N] [--layers N] [--heads N] [--width N] [--block N] [--batch N]
 *               [--lr X] [--min-lr X] [--warmup N] [--eval-interval N] [--eval-batches N]
 *               [--log-interval N] [--ckpt FILE] [--resume] [--stop-at N]
 *               [--data-parallel | --pipeline | --ddp] [--data FILE] [--loss-plot loss.png]
 *               [--sample-len N] [--temperature X] [--top-k N] [--seed N]
 *   mpirun -np 2 ./train_gpt --ddp [...]
 *
 * --data-parallel: DataParallel over every selected device (CLPAR_DEVICES, POCL_DEVICES).
 * --pipeline: the blocks split between 2 stages (clpar_gpt_create_stages) on the first two
 * selected devices (both on the one when only one is selected), each batch in 4 micro-batches
 * in the 1F1B schedule.
 * --ddp (under mpirun): DistributedDataParallel, one rank per device; every rank reads the same
 * batch and trains its share of the rows, so the run is the one-device run; rank 0 prints
 * (the losses are the ranks' mean) and writes the checkpoint.
 * --stop-at N: stop after iteration N (its checkpoint written), as an interrupted run does;
 * the schedule is still the one of --iters. At the end, each device used (each rank's under
 * --ddp) prints on stderr the most memory each category held at once over the run
 * (parameters, gradients, optimizer state, activations, communication buffers, total). */
#include <clpar/clpar.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loss_plot.h"
#include "sample_util.h"

#ifndef SHAKESPEARE_TXT
#define SHAKESPEARE_TXT "data/shakespeare.txt.gz"
#endif

typedef struct {
  int64_t iters, layers, heads, width, block, batch, warmup, eval_interval, eval_batches;
  int64_t log_interval, stop_at, sample_len, top_k, seed;
  double lr, min_lr, temperature;
  int resume, data_parallel, pipeline, ddp;
  const char *ckpt, *data;
  loss_plot plot;
} options;

typedef struct {
  clpar_text *text;
  clpar_module *model; /* the GPT, or DataParallel, a Pipeline or DDP over it */
  clpar_device *dev;
  clpar_optimizer *opt;
  clpar_lr_scheduler *sched;
  clpar_text_loader *train, *val;
  int64_t batch;
} run;

static int parse(int argc, char **argv, options *o) {
  *o = (options){.iters = 2000,
                 .layers = 4,
                 .heads = 4,
                 .width = 128,
                 .block = 64,
                 .batch = 12,
                 .warmup = 100,
                 .eval_interval = 250,
                 .eval_batches = 20,
                 .log_interval = 10,
                 .sample_len = 300,
                 .top_k = 0,
                 .seed = 1337,
                 .lr = 1e-3,
                 .min_lr = 1e-4,
                 .temperature = 0.8,
                 .ckpt = "train_gpt.safetensors",
                 .data = SHAKESPEARE_TXT};
  static const char *ints[] = {"--iters",        "--layers",       "--heads",   "--width",
                               "--block",        "--batch",        "--warmup",  "--eval-interval",
                               "--eval-batches", "--log-interval", "--stop-at", "--sample-len",
                               "--top-k",        "--seed"};
  int64_t *ivals[] = {&o->iters,        &o->layers,       &o->heads,   &o->width,
                      &o->block,        &o->batch,        &o->warmup,  &o->eval_interval,
                      &o->eval_batches, &o->log_interval, &o->stop_at, &o->sample_len,
                      &o->top_k,        &o->seed};
  for (int i = 1; i < argc; i++) {
    int done = 0;
    for (size_t k = 0; k < sizeof ints / sizeof *ints && !done; k++)
      if (!strcmp(argv[i], ints[k]) && i + 1 < argc) *ivals[k] = atoll(argv[++i]), done = 1;
    if (done) continue;
    if (!strcmp(argv[i], "--lr") && i + 1 < argc)
      o->lr = atof(argv[++i]);
    else if (!strcmp(argv[i], "--min-lr") && i + 1 < argc)
      o->min_lr = atof(argv[++i]);
    else if (!strcmp(argv[i], "--temperature") && i + 1 < argc)
      o->temperature = atof(argv[++i]);
    else if (!strcmp(argv[i], "--ckpt") && i + 1 < argc)
      o->ckpt = argv[++i];
    else if (!strcmp(argv[i], "--data") && i + 1 < argc)
      o->data = argv[++i];
    else if (!strcmp(argv[i], "--loss-plot") && i + 1 < argc)
      o->plot.png = argv[++i];
    else if (!strcmp(argv[i], "--resume"))
      o->resume = 1;
    else if (!strcmp(argv[i], "--data-parallel"))
      o->data_parallel = 1;
    else if (!strcmp(argv[i], "--pipeline"))
      o->pipeline = 1;
    else if (!strcmp(argv[i], "--ddp"))
      o->ddp = 1;
    else
      return 0;
  }
  return o->iters >= 1 && o->layers >= 1 && o->heads >= 1 && o->width >= o->heads &&
         o->width % o->heads == 0 && o->block >= 1 && o->batch >= 1 && o->warmup >= 0 &&
         o->eval_interval >= 1 && o->eval_batches >= 1 && o->log_interval >= 1 && o->stop_at >= 0 &&
         o->sample_len >= 0 && o->top_k >= 0 && o->lr > 0 && o->min_lr >= 0 &&
         o->temperature >= 0 && o->data_parallel + o->pipeline + o->ddp <= 1 &&
         (!o->pipeline || o->layers >= 2);
}

/* 1 on the process that prints and writes files: rank 0, or the only one. */
static int leader(void) {
  return clpar_dist_rank() <= 0;
}

/* The GPT on one device, or DataParallel, a 2-stage pipeline or DDP over it. */
static int make_model(const options *o, const clpar_gpt_config *cfg, run *r) {
  if (o->pipeline) {
    clpar_module *stages[2];
    clpar_pipeline_options po = {.chunks = 4, .schedule = CLPAR_PIPELINE_1F1B};
    return check(clpar_gpt_create_stages(cfg, 2, r->dev, stages), "GPT stages") &&
           check(clpar_pipeline_create(stages, NULL, 2, &po, &r->model), "pipeline");
  }
  if (!check(clpar_gpt_create(cfg, r->dev, &r->model), "GPT")) return 0;
  if (o->data_parallel)
    return check(clpar_data_parallel_create(r->model, NULL, &r->model), "DataParallel");
  if (o->ddp) return check(clpar_ddp_create(r->model, NULL, &r->model), "DDP");
  return 1;
}

/* The model, AdamW in nanoGPT's two decay groups, the schedule and the two loaders. */
static int build(const options *o, run *r) {
  r->dev = o->ddp ? clpar_dist_device() : clpar_device_get(0);
  r->batch = o->batch;
  if (!check(clpar_text_load(o->data, 0, &r->text), "reading the corpus")) return 0;
  clpar_gpt_config cfg = {
      o->block, clpar_text_vocab_size(r->text), o->layers, o->heads, o->width, 0.0f, 1};
  clpar_adam_options adam = {
      .lr = (float)o->lr, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.1f};
  clpar_text_loader_options tl = {
      .block_size = o->block, .batch_size = o->batch, .seed = (uint64_t)o->seed};
  clpar_text_loader_options vl = tl;
  vl.seed = (uint64_t)o->seed + 1;
  clpar_manual_seed((uint64_t)o->seed);
  if (!make_model(o, &cfg, r)) return 0;
  return check(clpar_adamw_create_decay_groups(r->model, &adam, &r->opt), "AdamW") &&
         check(clpar_warmup_cosine_lr_create(r->opt, o->warmup, o->iters,
                                             o->min_lr > 0 ? (float)o->min_lr : CLPAR_ZERO,
                                             &r->sched),
               "schedule") &&
         check(clpar_text_loader_create(r->text, CLPAR_TEXT_TRAIN, r->dev, &tl, &r->train),
               "train loader") &&
         check(clpar_text_loader_create(r->text, CLPAR_TEXT_VAL, r->dev, &vl, &r->val),
               "validation loader");
}

static clpar_status loss_fn(clpar_tensor *logits, clpar_tensor *y, int64_t first_row, void *user,
                            clpar_tensor **loss) {
  (void)first_row, (void)user;
  return clpar_cross_entropy_targets(logits, y, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, loss);
}

/* The next batch of loader: under DDP, this rank's share of its rows. */
static int next_batch(run *r, clpar_text_loader *loader, clpar_tensor **x, clpar_tensor **y) {
  if (!check(clpar_text_loader_next(loader, x, y, NULL), "loader")) return 0;
  if (clpar_dist_rank() < 0) return 1;
  int64_t rows = r->batch / clpar_dist_world_size(), first = rows * clpar_dist_rank();
  return check(clpar_tensor_rows(*x, first, rows, x), "rows") &&
         check(clpar_tensor_rows(*y, first, rows, y), "rows");
}

/* The mean cross-entropy of the model on the next batch of loader (a graph when training;
 * backward done too when the pipeline trains). */
static int batch_loss(run *r, clpar_text_loader *loader, int train, clpar_tensor **loss) {
  clpar_tensor *x, *y, *logits;
  if (!next_batch(r, loader, &x, &y)) return 0;
  if (train && clpar_pipeline_stage_count(r->model) > 0)
    return check(clpar_pipeline_train_step(r->model, x, y, loss_fn, NULL, loss), "pipeline step");
  return check(clpar_module_forward(r->model, x, &logits), "forward") &&
         check(clpar_tensor_to(y, clpar_tensor_device(logits), &y), "targets") && /* pipeline */
         check(loss_fn(logits, y, 0, NULL, loss), "loss") &&
         (!train || check(clpar_backward(*loss), "backward"));
}

/* A loss read back (waits for the device): the ranks' mean under DDP. */
static int read_loss(clpar_tensor *l, float *v) {
  return check(clpar_tensor_read(l, v, 1), "read loss") &&
         (clpar_dist_rank() < 0 || check(clpar_dist_all_reduce_mean(v, 1), "all-reduce loss"));
}

/* One training iteration; *loss read back only when want_loss (reading waits). */
static int train_step(run *r, int want_loss, float *loss) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *l;
  int ok =
      check(clpar_optimizer_zero_grad(r->opt), "zero_grad") && batch_loss(r, r->train, 1, &l) &&
      check(clpar_clip_grad_norm_module(r->model, 1.0f, NULL), "clip") &&
      check(clpar_optimizer_step(r->opt), "step") &&
      check(clpar_lr_scheduler_step(r->sched), "schedule") && (!want_loss || read_loss(l, loss));
  clpar_scope_end(scope);
  return ok;
}

/* The mean validation loss over the same eval_batches batches every time, in eval mode and
 * without a graph. */
static int evaluate(run *r, int64_t batches, double *mean) {
  int was = clpar_set_grad_enabled(0),
      ok = check(clpar_module_eval(r->model), "eval") &&
           check(clpar_text_loader_set_position(r->val, 0), "validation loader");
  double sum = 0;
  for (int64_t b = 0; ok && b < batches; b++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *l;
    float v = 0;
    ok = batch_loss(r, r->val, 0, &l) && read_loss(l, &v);
    sum += v;
    clpar_scope_end(scope);
  }
  clpar_set_grad_enabled(was);
  *mean = sum / (double)batches;
  return ok && check(clpar_module_train(r->model, 1), "train");
}

/* The next token from the last position's logits: argmax at temperature 0, else a draw from
 * softmax(logits / temperature) over the top_k largest (every one when top_k is 0). */
static int32_t pick(const float *logits, int vocab, double temperature, int64_t top_k) {
  int best = 0;
  for (int v = 1; v < vocab; v++) best = logits[v] > logits[best] ? v : best;
  if (temperature == 0) return best;
  double p[256], sum = 0, cut = -INFINITY;
  if (top_k > 0 && top_k < vocab) { /* the k-th largest logit: the bar to pass */
    float sorted[256];
    memcpy(sorted, logits, (size_t)vocab * sizeof *sorted);
    for (int64_t k = 0; k < top_k; k++)
      for (int v = k + 1; v < vocab; v++)
        if (sorted[v] > sorted[k]) {
          float t = sorted[k];
          sorted[k] = sorted[v], sorted[v] = t;
        }
    cut = sorted[top_k - 1];
  }
  for (int v = 0; v < vocab; v++)
    sum += p[v] = logits[v] < cut ? 0 : exp((logits[v] - logits[best]) / temperature);
  double u = uniform() * sum;
  for (int v = 0; v < vocab; v++)
    if ((u -= p[v]) < 0) return v;
  return best;
}

/* Writes n characters after a newline to stdout, each from the model's logits over the last
 * block_size characters, without a graph. */
static int generate(run *r, const options *o) {
  int vocab = clpar_text_vocab_size(r->text);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(o->sample_len + 1));
  float *logits = malloc(sizeof(float) * (size_t)(o->block * vocab));
  char c[2];
  int was = clpar_set_grad_enabled(0);
  int ok = ids && logits && check(clpar_module_eval(r->model), "eval") &&
           check(clpar_text_encode(r->text, "\n", 1, ids), "the prompt");
  for (int64_t n = 1; ok && n <= o->sample_len; n++) {
    clpar_scope *scope = clpar_scope_begin();
    int64_t t = n < o->block ? n : o->block;
    clpar_tensor *x, *out;
    ok = check(clpar_tensor_from_host_dtype(r->dev, CLPAR_INT32, 2, (int64_t[]){1, t}, ids + n - t,
                                            &x),
               "context") &&
         check(clpar_module_forward(r->model, x, &out), "forward") &&
         check(clpar_tensor_read(out, logits, (size_t)(o->block * vocab)), "logits");
    clpar_scope_end(scope);
    ids[n] = pick(logits + (t - 1) * vocab, vocab, o->temperature, o->top_k);
    if (ok && check(clpar_text_decode(r->text, ids + n, 1, c), "decode") && leader())
      fputs(c, stdout);
  }
  if (leader()) printf("\n");
  clpar_set_grad_enabled(was);
  free(ids);
  free(logits);
  return ok;
}

/* Iterations from *it to the end (or --stop-at): progress lines, evaluations, checkpoints;
 * at the end, where the wall time went and the CPU time of the process (every thread). */
static int train(run *r, options *o, int64_t it) {
  int64_t end = o->stop_at > 0 && o->stop_at < o->iters ? o->stop_at : o->iters;
  double t0 = now_seconds(), eval_s = 0, ckpt_s = 0;
  clock_t cpu0 = clock();
  int64_t t0_it = it;
  int ok = 1;
  while (ok && it < end) {
    float lr = clpar_optimizer_lr(r->opt, 0), loss = 0;
    int log = it == 0 || (it + 1) % o->log_interval == 0 || it + 1 == end;
    if (!train_step(r, log || o->plot.png, &loss)) return 0;
    it++;
    loss_plot_add(&o->plot, (double)it, loss);
    if (log && leader()) {
      double rate = (double)((it - t0_it) * o->batch * o->block) / (now_seconds() - t0);
      fprintf(stderr, "iter %lld/%lld: loss %.4f, lr %.3e, %.0f tokens/s (%.1f ms/iter)\n",
              (long long)it, (long long)o->iters, loss, lr, rate,
              1e3 * (double)(o->batch * o->block) / rate);
      if (it == end) printf("iter %lld train loss %.9g\n", (long long)it, loss);
    }
    if (it % o->eval_interval == 0 || it == end) {
      double val, te = now_seconds();
      ok = evaluate(r, o->eval_batches, &val);
      double tc = now_seconds();
      ok = ok && (!leader() ||
                  check(clpar_checkpoint_save(o->ckpt, r->model, r->opt, it, 0), "checkpoint"));
      eval_s += tc - te, ckpt_s += now_seconds() - tc;
      if (ok && leader()) printf("iter %lld val loss %.9g\n", (long long)it, val);
      fflush(stdout);
    }
  }
  if (ok && leader())
    fprintf(stderr,
            "wall %.1f s for %lld iterations (evaluations %.1f s, checkpoints %.1f s), CPU %.1f "
            "s\n",
            now_seconds() - t0, (long long)(it - t0_it), eval_s, ckpt_s,
            (double)(clock() - cpu0) / CLOCKS_PER_SEC);
  return ok;
}

/* Model, optimizer and iteration from the checkpoint; the schedule and the loader follow. */
static int resume(run *r, const options *o, int64_t *it) {
  if (access(o->ckpt, F_OK) != 0) {
    if (leader()) fprintf(stderr, "no checkpoint %s: starting afresh\n", o->ckpt);
    return 1;
  }
  int ok = check(clpar_checkpoint_load(o->ckpt, r->model, r->opt, it, NULL), "resuming") &&
           check(clpar_lr_scheduler_set_epoch(r->sched, *it), "schedule") &&
           check(clpar_text_loader_set_position(r->train, *it), "loader");
  if (ok && leader())
    fprintf(stderr, "resumed from %s after iteration %lld\n", o->ckpt, (long long)*it);
  return ok;
}

/* How many devices the run uses, and the i-th of them. */
static int device_count(const options *o) {
  return o->data_parallel ? clpar_device_count() : o->pipeline ? 2 : 1;
}
static clpar_device *device_at(const run *r, const options *o, int i) {
  return o->pipeline ? clpar_pipeline_device(r->model, i) : i ? clpar_device_get(i) : r->dev;
}

/* What runs where, on stderr. */
static void describe(const run *r, const options *o) {
  fprintf(stderr,
          "%lld characters, vocabulary %d; GPT %lld layers, %lld heads, %lld wide, block %lld, "
          "batch %lld, on",
          (long long)clpar_text_length(r->text), clpar_text_vocab_size(r->text),
          (long long)o->layers, (long long)o->heads, (long long)o->width, (long long)o->block,
          (long long)o->batch);
  for (int i = 0; i < device_count(o); i++)
    fprintf(stderr, " %s", clpar_device_id(device_at(r, o, i)));
  if (o->ddp) fprintf(stderr, " (rank 0 of %d)", clpar_dist_world_size());
  fprintf(stderr, "%s\n", o->pipeline ? " (2 pipeline stages)" : "");
}

int main(int argc, char **argv) {
  options o;
  if (!parse(argc, argv, &o)) {
    fprintf(stderr,
            "usage: %s [--iters N] [--layers N] [--heads N] [--width N] [--block N] "
            "[--batch N] [--lr X] [--min-lr X] [--warmup N] [--eval-interval N] "
            "[--eval-batches N] [--log-interval N] [--ckpt FILE] [--resume] [--stop-at N] "
            "[--data-parallel | --pipeline (2 layers or more) | --ddp (under mpirun)] "
            "[--data FILE] [--loss-plot loss.png] [--sample-len N] [--temperature X] "
            "[--top-k N] [--seed N]\n",
            argv[0]);
    return 2;
  }
  if (o.warmup >= o.iters) { /* the schedule needs warm-up < decay iterations */
    fprintf(stderr, "--warmup %lld cut to %lld, below --iters\n", (long long)o.warmup,
            (long long)(o.iters - 1));
    o.warmup = o.iters - 1;
  }
  if (!check(o.ddp ? clpar_dist_init() : clpar_init(), "init")) return 1;
  if (o.ddp && o.batch % clpar_dist_world_size() != 0) {
    fprintf(stderr, "--batch %lld does not split between %d ranks\n", (long long)o.batch,
            clpar_dist_world_size());
    clpar_dist_finalize();
    return 2;
  }
  run r = {0};
  int64_t it = 0;
  int ok = build(&o, &r) && (!o.resume || resume(&r, &o, &it));
  if (ok && leader()) describe(&r, &o);
  ok = ok && train(&r, &o, it);
  if (ok && o.sample_len > 0) ok = generate(&r, &o);
  if (ok && leader()) ok = loss_plot_write(&o.plot, "iteration", "train_gpt: cross-entropy, AdamW");
  for (int i = 0; ok && i < device_count(&o); i++) print_memory_peaks(device_at(&r, &o, i));
  loss_plot_free(&o.plot);
  clpar_text_loader_free(r.train);
  clpar_text_loader_free(r.val);
  clpar_lr_scheduler_free(r.sched);
  clpar_optimizer_free(r.opt);
  clpar_module_free(r.model);
  clpar_text_free(r.text);
  if (o.ddp)
    clpar_dist_finalize();
  else
    clpar_shutdown();
  return ok ? 0 : 1;
}
