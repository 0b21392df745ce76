/* test_graph_gpt.c — the tiny GPT's training step (tiny_gpt.h: forward, cross-entropy with
 * device targets, backward, clip_grad_norm to 1, AdamW with decay groups) captured and replayed
 * (clpar/graph.h) against the same step run eagerly, under nanoGPT's warm-up cosine schedule:
 * the losses and the parameters bit for bit over 20 steps, without and with
 * dropout, and with the blocks checkpointed (the recomputed Dropout masks at each replay are
 * the forward's). A checkpointed Dropout whose forward ran before the capture is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_graph_util.h"
#include "tiny_gpt.h"

enum { STEPS = 20, WARMUP = 4 };

typedef struct {
  tgu_train t; /* x, y: token ids and targets, int32, written before each step */
  clpar_lr_scheduler *sched;
} run;

static void run_make(run *r, clpar_device *dev, float dropout, int checkpoint) {
  memset(r, 0, sizeof *r);
  clpar_gpt_config c = tg_config(dropout);
  clpar_manual_seed(7);
  tu_ok(clpar_gpt_create(&c, dev, &r->t.m));
  if (checkpoint) tu_ok(clpar_gpt_checkpoint_blocks(r->t.m));
  clpar_adam_options ad = {.lr = TG_LR, .beta2 = 0.99f, .weight_decay = 0.1f};
  tu_ok(clpar_adamw_create_decay_groups(r->t.m, &ad, &r->t.opt));
  tu_ok(clpar_warmup_cosine_lr_create(r->t.opt, WARMUP, STEPS, TG_LR / 10, &r->sched));
  tg_batch(dev, 0, TG_B, &r->t.x, &r->t.y);
}

static void run_free(run *r) {
  clpar_lr_scheduler_free(r->sched);
  tgu_train_free(&r->t);
}

/* zero_grad, forward, cross-entropy, backward, clip to 1, AdamW; the loss stays in r->t.loss. */
static clpar_status step(void *ctx) {
  run *r = ctx;
  clpar_scope *scope = tgu_step_begin(&r->t);
  clpar_status s = tgu_forward_backward(&r->t, tg_loss_fn);
  if (s == CLPAR_OK) s = clpar_clip_grad_norm_module(r->t.m, 1.0f, NULL);
  if (s == CLPAR_OK) s = clpar_optimizer_step(r->t.opt);
  tgu_step_end(&r->t, scope);
  return s;
}

/* Step i's token ids: tiny_gpt.h's batch, its rows rotated by i (targets the next tokens). */
static void write_batch(run *r, int i) {
  int32_t ids[TG_B * TG_T], next[TG_B * TG_T];
  for (int b = 0; b < TG_B; b++)
    for (int t = 0; t < TG_T; t++) {
      int row = (b + i) % TG_B; /* the same rows, in another order */
      ids[b * TG_T + t] = (7 * row + 13 * t + row * t * t) % TG_V;
      next[b * TG_T + t] = (7 * row + 13 * (t + 1) + row * (t + 1) * (t + 1)) % TG_V;
    }
  tu_ok(clpar_tensor_write_raw(r->t.x, ids, sizeof ids));
  tu_ok(clpar_tensor_write_raw(r->t.y, next, sizeof next));
}

/* STEPS steps, eagerly or through clpar_step_run, the scheduler stepped after each; the
 * losses into losses. */
static void train(run *r, int compiled, float *losses) {
  clpar_step *st = NULL;
  if (compiled)
    tu_ok(clpar_step_compile(step, r, (clpar_device *[]){clpar_tensor_device(r->t.x)}, 1, &st));
  for (int i = 0; i < STEPS; i++) {
    write_batch(r, i);
    tu_ok(compiled ? clpar_step_run(st) : step(r));
    tu_ok(clpar_tensor_read(r->t.loss, &losses[i], 1));
    tu_ok(clpar_lr_scheduler_step(r->sched));
  }
  if (compiled) {
    assert_non_null(clpar_step_graph(st));
    clpar_step_free(st);
  }
}

static void check_on(int d, float dropout, int checkpoint) {
  clpar_device *dev = clpar_device_get(d);
  run eager, replayed;
  float le[STEPS], lr[STEPS];
  run_make(&eager, dev, dropout, checkpoint);
  train(&eager, 0, le);
  run_make(&replayed, dev, dropout, checkpoint);
  train(&replayed, 1, lr);
  char what[64];
  snprintf(what, sizeof what, "device %d: loss at step", d);
  tgu_expect_bits(what, le, lr, STEPS);
  size_t ne, nr;
  float *pe = tgu_floats_of(eager.t.m, 0, &ne), *pr = tgu_floats_of(replayed.t.m, 0, &nr);
  assert_int_equal(ne, nr);
  snprintf(what, sizeof what, "device %d: parameter element", d);
  tgu_expect_bits(what, pe, pr, ne);
  assert_true(le[STEPS - 1] < le[0]); /* it trained */
  free(pe);
  free(pr);
  run_free(&eager);
  run_free(&replayed);
}

static void check_all(float dropout, int checkpoint) {
  for (int d = 0; d < clpar_device_count(); d++) check_on(d, dropout, checkpoint);
}

/* One replay-equals-eager case, its test's prestate. The checkpointed blocks' recomputed
 * Dropout masks at each replay take the offsets their forward drew at the same replay, as the
 * eager recompute replays the forward's draws. */
typedef struct {
  float dropout;
  int checkpoint;
} gpt_case;

static void test_gpt_case(void **state) {
  const gpt_case *c = *state;
  check_all(c->dropout, c->checkpoint);
}

/* A checkpointed Dropout whose forward ran before the capture and whose recompute runs in it:
 * no captured draw to take the offset from, so refused, naming why. */
static void test_recompute_outside_forward_refused(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  run r;
  run_make(&r, dev, 0.1f, 1);
  write_batch(&r, 0);
  tu_ok(step(&r));
  clpar_tensor *out = NULL, *loss = NULL;
  tu_ok(clpar_optimizer_zero_grad(r.t.opt));
  tu_ok(clpar_module_forward(r.t.m, r.t.x, &out));
  tu_ok(tg_loss_fn(out, r.t.y, 0, NULL, &loss));
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  clpar_status ran = clpar_backward(loss);
  clpar_graph *g;
  assert_int_not_equal(clpar_graph_capture_end(&g), CLPAR_OK);
  assert_null(g);
  assert_int_not_equal(ran, CLPAR_OK);
  if (!strstr(clpar_last_error(), "forward ran outside")) fail_msg("%s", clpar_last_error());
  clpar_tensor_free(loss);
  clpar_tensor_free(out);
  tu_ok(step(&r)); /* eager steps go on */
  run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      TGU_CASE(test_gpt, test_gpt_case, gpt_case, 0.0f, 0),
      TGU_CASE(test_gpt_dropout, test_gpt_case, gpt_case, 0.1f, 0),
      TGU_CASE(test_gpt_checkpoint_dropout, test_gpt_case, gpt_case, 0.1f, 1),
      cmocka_unit_test(test_recompute_outside_forward_refused),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
