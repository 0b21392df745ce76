/* tiny_gpt.h — the tiny GPT of the PyTorch fixture (2 layers, 2 heads, 32 wide, block 16,
 * vocabulary 65) trained for a few AdamW steps as nanoGPT trains (decay groups, clipping to a
 * global norm of 1), and what a run leaves to compare: the losses, the last step's gradients
 * and the parameters after, under GPT-2's names whatever wrapper (DataParallel, Pipeline,
 * DDP) prefixes them. Shared by test_gpt_parallel.c and test_ddp_gpt.c. */
#ifndef CLPAR_TINY_GPT_H
#define CLPAR_TINY_GPT_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { TG_B = 4, TG_T = 16, TG_V = 65, TG_STEPS = 3, TG_MAX_PARAMS = 32 };
#define TG_LR 1e-2f

static inline clpar_gpt_config tg_config(float dropout) {
  return (clpar_gpt_config){TG_T, TG_V, 2, 2, 32, dropout, 1};
}

typedef struct {
  float loss[TG_STEPS];
  int n;
  char *name[TG_MAX_PARAMS]; /* GPT-2's names */
  /* the gradients of the first and of the last step (clipped), the parameters after */
  float *grad1[TG_MAX_PARAMS], *grad[TG_MAX_PARAMS], *param[TG_MAX_PARAMS];
  int64_t numel[TG_MAX_PARAMS];
} tg_run;

/* Token ids (and the next tokens as targets) of rows row0, row0 + 1, ... (rows of them,
 * wrapping around after the batch's TG_B rows). */
static inline void tg_batch(clpar_device *dev, int row0, int rows, clpar_tensor **x,
                            clpar_tensor **y) {
  int32_t ids[TG_B * TG_T], next[TG_B * TG_T];
  for (int b = 0; b < rows; b++)
    for (int t = 0; t < TG_T; t++) {
      int r = (row0 + b) % TG_B;
      ids[b * TG_T + t] = (7 * r + 13 * t + r * t * t) % TG_V;
      next[b * TG_T + t] = (7 * r + 13 * (t + 1) + r * (t + 1) * (t + 1)) % TG_V;
    }
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, (int64_t[]){rows, TG_T}, ids, x));
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, (int64_t[]){rows, TG_T}, next, y));
}

static inline clpar_status tg_loss_fn(clpar_tensor *out, clpar_tensor *target, int64_t first_row,
                                      void *user, clpar_tensor **loss) {
  (void)first_row, (void)user;
  return clpar_cross_entropy_targets(out, target, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, loss);
}

/* The parameter name from "transformer." or "lm_head." on (what follows a wrapper's prefix). */
static inline const char *tg_gpt_name(const char *name) {
  const char *t = strstr(name, "transformer.");
  return t ? t : name;
}

/* The names and gradients (into grads: r->grad1 or r->grad) of m's parameters. */
static inline void tg_collect(clpar_module *m, tg_run *r, float **grads) {
  r->n = clpar_module_parameter_count(m);
  assert_true(r->n <= TG_MAX_PARAMS);
  for (int i = 0; i < r->n; i++) {
    const char *name;
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, &name, &p));
    free(r->name[i]);
    r->name[i] = strdup(tg_gpt_name(name));
    r->numel[i] = clpar_tensor_numel(p);
    assert_non_null(clpar_tensor_grad(p));
    grads[i] = tu_read(clpar_tensor_grad(p));
  }
}

/* The parameters of m into r->param. */
static inline void tg_collect_params(clpar_module *m, tg_run *r) {
  for (int i = 0; i < r->n; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    r->param[i] = tu_read(p);
  }
}

static inline void tg_free(tg_run *r) {
  for (int i = 0; i < r->n; i++)
    free(r->name[i]), free(r->grad1[i]), free(r->grad[i]), free(r->param[i]);
}

/* TG_STEPS steps of m on rows row0, ... (rows of them, as tg_batch) of the batch, the input on dev:
 * forward, cross-entropy, backward (or clpar_pipeline_train_step with pipe_step), clip to 1, AdamW.
 */
static inline void tg_train(clpar_module *m, clpar_device *dev, int row0, int rows, int pipe_step,
                            tg_run *r) {
  clpar_optimizer *o;
  clpar_adam_options ad = {.lr = TG_LR, .beta2 = 0.99f, .weight_decay = 0.1f};
  tu_ok(clpar_adamw_create_decay_groups(m, &ad, &o));
  clpar_tensor *x, *y;
  tg_batch(dev, row0, rows, &x, &y);
  for (int t = 0; t < TG_STEPS; t++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *out, *loss;
    tu_ok(clpar_optimizer_zero_grad(o));
    if (pipe_step) {
      tu_ok(clpar_pipeline_train_step(m, x, y, tg_loss_fn, NULL, &loss));
    } else {
      clpar_tensor *yo; /* the targets where the output is (a pipeline's last stage) */
      tu_ok(clpar_module_forward(m, x, &out));
      tu_ok(clpar_tensor_to(y, clpar_tensor_device(out), &yo));
      tu_ok(tg_loss_fn(out, yo, 0, NULL, &loss));
      tu_ok(clpar_backward(loss));
    }
    tu_ok(clpar_clip_grad_norm_module(m, 1.0f, NULL));
    if (t == 0) tg_collect(m, r, r->grad1);
    if (t == TG_STEPS - 1) tg_collect(m, r, r->grad);
    tu_ok(clpar_optimizer_step(o));
    tu_ok(clpar_tensor_read(loss, &r->loss[t], 1));
    clpar_scope_end(sc);
  }
  tg_collect_params(m, r);
  clpar_tensor_free(x);
  clpar_tensor_free(y);
  clpar_optimizer_free(o);
}

/* Adam moves an element by lr m / sqrt(v), close to lr whatever the gradient's size: where
 * an element's gradient is near the rounding of the sums that make it (the key third of
 * c_attn.bias gets 0 in exact arithmetic, since softmax ignores a constant added to a query's
 * scores; an element that dropout mostly zeroes), m / sqrt(v) follows that rounding, which
 * differs with the order of the sums. So the parameters after the steps are compared with 1%
 * of lr per step more: a step missed or doubled still differs by about lr. */
static const float tg_value_atol = 1e-2f * TG_LR * TG_STEPS;

/* Fails unless b's losses, gradients and parameters equal a's (matched by name): the losses
 * and the first step's gradients within rtol of each tensor's largest value; the last step's
 * gradients, which also see the parameters' differences, within 10 rtol; the parameters
 * within rtol and tg_value_atol. */
static inline void tg_expect_same(const tg_run *a, const tg_run *b, float rtol, const char *what) {
  char msg[256];
  for (int t = 0; t < TG_STEPS; t++) {
    snprintf(msg, sizeof msg, "%s: loss of step %d", what, t + 1);
    tu_assert_close(&b->loss[t], &a->loss[t], 1, rtol, 0.0f, msg);
  }
  assert_int_equal(a->n, b->n);
  static const char *kinds[] = {"first step's gradient", "last step's gradient", "value"};
  for (int i = 0; i < a->n; i++) {
    int j = 0;
    while (j < b->n && strcmp(b->name[j], a->name[i]) != 0) j++;
    if (j == b->n) fail_msg("%s: no parameter %s", what, a->name[i]);
    assert_int_equal(a->numel[i], b->numel[j]);
    float *vals[3][2] = {
        {a->grad1[i], b->grad1[j]}, {a->grad[i], b->grad[j]}, {a->param[i], b->param[j]}};
    for (int k = 0; k < 3; k++) {
      float largest = 0, r = k == 1 ? 10 * rtol : rtol;
      for (int64_t e = 0; e < a->numel[i]; e++) largest = fmaxf(largest, fabsf(vals[k][0][e]));
      snprintf(msg, sizeof msg, "%s: %s of %s", what, kinds[k], a->name[i]);
      float atol = r * largest + (k == 2 ? tg_value_atol : 0.0f);
      tu_assert_close(vals[k][1], vals[k][0], (size_t)a->numel[i], r, atol, msg);
    }
  }
}

#endif
