/* graph_gpt.c — the GPT training step of bench_train_step --model gpt (nanoGPT's
 * shakespeare_char CPU configuration: 4 layers, 4 heads, 128 wide, block 64, batch 12,
 * vocabulary 65, dropout 0; cross-entropy, clipping to a global norm of 1, AdamW in nanoGPT's
 * decay groups, lr 1e-3) run eagerly and replayed from a captured graph (clpar/graph.h), on one
 * device. Two copies of the model, made alike: one steps eagerly, the other replays; rounds of
 * steps alternate between them, each round waited for once at its end. The token ids are
 * written once into tensors made before the capture (neither step uploads). Prints one JSON
 * object: best, median and worst round of each (ms per step), the best rounds' ratio, the host
 * time per step (until the round's last step was posted, best round), the commands per step of
 * the graph, and whether both copies' losses after the same number of steps are the same bits.
 *
 *   CLPAR_DEVICES=host ./bench_graph_gpt [steps [rounds]]
 *   POCL_DEVICES=pthread ./bench_graph_gpt 10 5 */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 12, BLOCK = 64, VOCAB = 65, MAX_ROUNDS = 64 };

typedef struct {
  clpar_device *dev;
  bench_step_run s;
} gpt_run;

/* The GPT, AdamW and the token ids ((i * 37) % 65, as bench_train_step's); two steps, the
 * second captured when capture is set. */
static int make_run(gpt_run *r, int capture) {
  static int32_t ids[2 * BATCH * BLOCK];
  for (int i = 0; i < BATCH * BLOCK; i++) {
    ids[i] = (i * 37) % VOCAB;
    ids[BATCH * BLOCK + i] = ((i + 1) * 37) % VOCAB;
  }
  clpar_gpt_config cfg = {BLOCK, VOCAB, 4, 4, 128, 0.0f, 1};
  clpar_adam_options adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.1f};
  int64_t shape[2] = {BATCH, BLOCK};
  clpar_manual_seed(3);
  r->s.clip = 1.0f; /* nanoGPT's grad_clip */
  int good =
      bench_ok(clpar_gpt_create(&cfg, r->dev, &r->s.m), "GPT") &&
      bench_ok(clpar_adamw_create_decay_groups(r->s.m, &adam, &r->s.opt), "AdamW") &&
      bench_ok(clpar_tensor_from_host_dtype(r->dev, CLPAR_INT32, 2, shape, ids, &r->s.x), "ids") &&
      bench_ok(
          clpar_tensor_from_host_dtype(r->dev, CLPAR_INT32, 2, shape, ids + BATCH * BLOCK, &r->s.y),
          "targets") &&
      bench_ok(bench_step(&r->s), "warm-up");
  if (good && !capture) return bench_ok(bench_step(&r->s), "step");
  return good && bench_step_capture(&r->s, &r->dev, 1);
}

/* ms per step of one round, waiting once at the end; *host_ms until the last was posted. */
static double round_ms(gpt_run *r, int steps, double *host_ms) {
  double t0 = now_seconds();
  for (int i = 0; i < steps; i++)
    if (!bench_ok(r->s.graph ? clpar_graph_replay(r->s.graph) : bench_step(&r->s), "step"))
      return -1;
  *host_ms = (now_seconds() - t0) * 1e3 / steps;
  if (!bench_ok(clpar_device_synchronize(r->dev), "synchronize")) return -1;
  return (now_seconds() - t0) * 1e3 / steps;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 10, rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (steps < 1 || rounds < 1 || rounds > MAX_ROUNDS || !bench_ok(clpar_init(), "clpar_init"))
    return 1;
  gpt_run runs[2] = {{.dev = clpar_device_get(0)}, {.dev = clpar_device_get(0)}};
  double ms[2][MAX_ROUNDS], host[2] = {1e30, 1e30};
  int good = runs[0].dev && make_run(&runs[0], 0) && make_run(&runs[1], 1);
  for (int k = 0; good && k < rounds; k++)
    for (int mode = 0; good && mode < 2; mode++) {
      double h = 0;
      ms[mode][k] = round_ms(&runs[mode], steps, &h);
      good = ms[mode][k] >= 0;
      if (h < host[mode]) host[mode] = h;
    }
  float loss[2] = {0, 0};
  for (int mode = 0; good && mode < 2; mode++)
    good = bench_ok(clpar_tensor_read(runs[mode].s.loss, &loss[mode], 1), "loss");
  if (good) {
    for (int mode = 0; mode < 2; mode++)
      qsort(ms[mode], (size_t)rounds, sizeof(double), cmp_double);
    printf(
        "{\"bench\": \"graph_gpt\", \"device\": \"%s\", \"model\": \"GPT 4x4x128\", "
        "\"block\": %d, \"batch\": %d, \"optimizer\": \"AdamW\", \"steps_per_round\": %d, "
        "\"rounds\": %d, \"eager_ms_per_step\": [%.2f, %.2f, %.2f], "
        "\"replay_ms_per_step\": [%.2f, %.2f, %.2f], \"speedup_best\": %.3f, "
        "\"host_ms_per_step\": {\"eager\": %.3f, \"replay\": %.3f}, "
        "\"replay_commands_per_step\": %zu, \"same_loss\": %s}\n",
        clpar_device_id(runs[0].dev), BLOCK, BATCH, steps, rounds, ms[0][0], ms[0][rounds / 2],
        ms[0][rounds - 1], ms[1][0], ms[1][rounds / 2], ms[1][rounds - 1], ms[0][0] / ms[1][0],
        host[0], host[1], clpar_graph_command_count(runs[1].s.graph),
        memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0 ? "true" : "false");
  }
  bench_step_run_free(&runs[0].s);
  bench_step_run_free(&runs[1].s);
  clpar_shutdown();
  return good ? 0 : 1;
}
