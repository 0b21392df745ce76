/* activation_checkpoint.c — a GPT of 24 small blocks trained with AdamW, every block
 * checkpointed (clpar_gpt_checkpoint_blocks) against none: the peak activation memory of a
 * step (the allocator's peak bytes in use over the step, clpar_device_memory_reset_peak at
 * its start, less what was in use then: parameters, gradients and optimizer state) and the
 * step time (zero_grad, forward, cross-entropy, backward, optimizer step, device synchronized)
 * with, where the device records it (OpenCL, CUDA), the kernels' device time of the step
 * (clpar_device_profile_read), which a busy machine disturbs less than the wall time.
 * The two models alternate step by step in one run, after a warm-up step each, so both see
 * the same machine; per model the median step time and its spread (min, max) are printed, one
 * JSON object per model, then one with the ratios.
 *
 *   ./bench_activation_checkpoint [device-index] [steps] [blocks] [batch] [seq] [embd] */
#include <clpar/clpar.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

enum { VOCAB = 256, HEADS = 4, MAX_STEPS = 64 };

typedef struct {
  clpar_module *m;
  clpar_optimizer *opt;
  double ms[MAX_STEPS];
  double dev_ms[MAX_STEPS]; /* the device's kernel time in the step, where it records one */
  uint64_t peak;            /* the largest activation peak of the measured steps */
  int steps;
} run;

static int64_t batch = 8, seq = 64, embd = 64, blocks = 24;

static int make(clpar_device *dev, int ckpt, run *r) {
  clpar_gpt_config c = {seq, VOCAB, blocks, HEADS, embd, 0.1f, 1};
  clpar_adam_options o = {.lr = 1e-3f};
  clpar_manual_seed(1);
  return bench_ok(clpar_gpt_create(&c, dev, &r->m), "clpar_gpt_create") &&
         (!ckpt || bench_ok(clpar_gpt_checkpoint_blocks(r->m), "clpar_gpt_checkpoint_blocks")) &&
         bench_ok(clpar_adamw_create_for(r->m, &o, &r->opt), "clpar_adamw_create_for");
}

/* One step; measured: its time and activation peak recorded. */
static int step(clpar_device *dev, run *r, const int32_t *ids, const int32_t *next, int measured) {
  clpar_memory_stats before, after;
  if (!bench_ok(clpar_device_synchronize(dev), "synchronize") ||
      !bench_ok(clpar_device_memory_reset_peak(dev), "reset_peak") ||
      !bench_ok(clpar_device_memory_stats(dev, &before), "memory_stats"))
    return 0;
  int profiled = clpar_device_profile_start(dev) == CLPAR_OK; /* not on the host backend */
  if (!profiled) clpar_clear_error();
  double t0 = now_seconds();
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *t, *logits, *loss;
  int64_t shape[2] = {batch, seq};
  int good =
      bench_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, shape, ids, &x), "ids") &&
      bench_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, shape, next, &t), "ids") &&
      bench_ok(clpar_optimizer_zero_grad(r->opt), "zero_grad") &&
      bench_ok(clpar_module_forward(r->m, x, &logits), "forward") &&
      bench_ok(
          clpar_cross_entropy_targets(logits, t, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, &loss),
          "loss") &&
      bench_ok(clpar_backward(loss), "backward") && bench_ok(clpar_optimizer_step(r->opt), "step");
  clpar_scope_end(scope);
  good = good && bench_ok(clpar_device_synchronize(dev), "synchronize");
  double ms = (now_seconds() - t0) * 1e3;
  clpar_profile prof = {0};
  if (profiled) {
    good = good && bench_ok(clpar_device_profile_read(dev, &prof), "profile_read");
    clpar_device_profile_stop(dev);
  }
  if (!good || !bench_ok(clpar_device_memory_stats(dev, &after), "memory_stats")) return 0;
  if (measured) {
    r->dev_ms[r->steps] = prof.device_seconds * 1e3;
    r->ms[r->steps++] = ms;
    uint64_t act = after.peak_bytes_in_use - before.bytes_in_use;
    if (act > r->peak) r->peak = act;
  }
  return 1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(run *r) {
  qsort(r->ms, (size_t)r->steps, sizeof *r->ms, cmp_double);
  qsort(r->dev_ms, (size_t)r->steps, sizeof *r->dev_ms, cmp_double);
  return r->ms[r->steps / 2];
}

static long long param_floats(const clpar_module *m) {
  long long n = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p = NULL;
    if (clpar_module_parameter_at(m, i, NULL, &p) == CLPAR_OK) n += clpar_tensor_numel(p);
  }
  return n;
}

static void print(const clpar_device *dev, const char *mode, run *r) {
  double med = median(r);
  printf(
      "{\"bench\": \"activation_checkpoint\", \"device\": \"%s\", \"mode\": \"%s\", "
      "\"blocks\": %lld, \"batch\": %lld, \"seq\": %lld, \"embd\": %lld, \"params\": %lld, "
      "\"peak_activation_bytes\": %llu, \"step_ms_median\": %.2f, \"step_ms_min\": %.2f, "
      "\"step_ms_max\": %.2f, \"device_ms_median\": %.2f, \"steps\": %d}\n",
      clpar_device_id(dev), mode, (long long)blocks, (long long)batch, (long long)seq,
      (long long)embd, param_floats(r->m), (unsigned long long)r->peak, med, r->ms[0],
      r->ms[r->steps - 1], r->dev_ms[r->steps / 2], r->steps);
}

int main(int argc, char **argv) {
  int index = argc > 1 ? atoi(argv[1]) : 0, steps = argc > 2 ? atoi(argv[2]) : 5;
  if (argc > 3) blocks = atoll(argv[3]);
  if (argc > 4) batch = atoll(argv[4]);
  if (argc > 5) seq = atoll(argv[5]);
  if (argc > 6) embd = atoll(argv[6]);
  if (steps < 1 || steps > MAX_STEPS || blocks < 1 || batch < 1 || seq < 1 || embd < HEADS) {
    fprintf(stderr, "usage: %s [device-index] [steps 1..%d] [blocks] [batch] [seq] [embd]\n",
            argv[0], MAX_STEPS);
    return 2;
  }
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(index);
  int32_t *ids = malloc((size_t)(batch * seq) * sizeof *ids);
  int32_t *next = malloc((size_t)(batch * seq) * sizeof *next);
  run r[2];
  memset(r, 0, sizeof r);
  int good = dev && ids && next && make(dev, 0, &r[0]) && make(dev, 1, &r[1]);
  for (int64_t i = 0; good && i < batch * seq; i++) {
    ids[i] = (int32_t)((i * 37 + 11) % VOCAB);
    next[i] = (int32_t)((i * 37 + 48) % VOCAB);
  }
  for (int k = 0; good && k < 2; k++) good = step(dev, &r[k], ids, next, 0); /* warm-up */
  for (int s = 0; good && s < steps; s++)
    for (int k = 0; good && k < 2; k++) good = step(dev, &r[k], ids, next, 1);
  if (good) {
    print(dev, "plain", &r[0]);
    print(dev, "checkpoint_every_block", &r[1]);
    double t1 = median(&r[1]), t0 = median(&r[0]), d0 = r[0].dev_ms[r[0].steps / 2];
    printf(
        "{\"bench\": \"activation_checkpoint\", \"peak_activation_ratio\": %.3f, "
        "\"step_time_ratio\": %.3f, \"device_time_ratio\": %.3f}\n",
        (double)r[1].peak / (double)r[0].peak, t1 / t0,
        d0 > 0 ? r[1].dev_ms[r[1].steps / 2] / d0 : 0.0);
  }
  for (int k = 0; k < 2; k++) {
    clpar_optimizer_free(r[k].opt);
    clpar_module_free(r[k].m);
  }
  free(ids);
  free(next);
  clpar_shutdown();
  return good ? 0 : 1;
}
