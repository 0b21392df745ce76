/* test_graph_util.c — see test_graph_util.h. */
#include "test_graph_util.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h" /* clpar_tensor_unscope */

void tgu_train_free(tgu_train *t) {
  clpar_tensor_free(t->loss);
  clpar_tensor_free(t->x);
  clpar_tensor_free(t->y);
  clpar_optimizer_free(t->opt);
  clpar_module_free(t->m);
}

clpar_status tgu_mse(clpar_tensor *out, clpar_tensor *target, int64_t first_row, void *user,
                     clpar_tensor **loss) {
  (void)first_row;
  (void)user;
  return clpar_mse_loss(out, target, CLPAR_REDUCTION_MEAN, loss);
}

clpar_scope *tgu_step_begin(tgu_train *t) {
  clpar_tensor_free(t->loss);
  t->loss = NULL;
  return clpar_scope_begin();
}

clpar_status tgu_forward_backward(tgu_train *t, clpar_pipeline_loss_fn loss) {
  clpar_tensor *out = NULL;
  clpar_status s = clpar_optimizer_zero_grad(t->opt);
  if (s == CLPAR_OK) s = clpar_module_forward(t->m, t->x, &out);
  if (s == CLPAR_OK) s = loss(out, t->y, 0, NULL, &t->loss);
  if (s == CLPAR_OK) s = clpar_backward(t->loss);
  return s;
}

void tgu_step_end(tgu_train *t, clpar_scope *scope) {
  if (t->loss) clpar_tensor_unscope(t->loss);
  clpar_scope_end(scope);
}

float *tgu_floats_of(clpar_module *m, int buffers, size_t *n) {
  size_t at = 0, cap = 0;
  float *all = NULL;
  int np = clpar_module_parameter_count(m), nb = buffers ? clpar_module_buffer_count(m) : 0;
  for (int i = 0; i < np + nb; i++) {
    clpar_tensor *t;
    if (i < np)
      tu_ok(clpar_module_parameter_at(m, i, NULL, &t));
    else
      tu_ok(clpar_module_buffer_at(m, i - np, NULL, &t));
    if (clpar_tensor_dtype(t) != CLPAR_FLOAT32) continue;
    size_t k = (size_t)clpar_tensor_numel(t);
    if (at + k > cap) {
      cap = 2 * (at + k);
      all = realloc(all, cap * sizeof *all);
      assert_non_null(all);
    }
    tu_ok(clpar_tensor_read(t, all + at, k));
    at += k;
  }
  *n = at;
  return all;
}

void tgu_expect_bits(const char *what, const float *eager, const float *replayed, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&eager[i], &replayed[i], sizeof eager[i]) != 0)
      fail_msg("%s %zu: %.9g replayed, %.9g eager", what, i, (double)replayed[i], (double)eager[i]);
}

float *tgu_mlp_run(clpar_device *dev, const int64_t widths[4], int64_t batch, int steps,
                   clpar_step_fn step, int compiled, float *losses, size_t *n) {
  tgu_train t = {0};
  int64_t in = widths[0], out = widths[3];
  t.m = tu_mlp(dev, 7, 4, widths);
  clpar_sgd_options sgd = {.lr = 0.05f, .momentum = 0.9f};
  tu_ok(clpar_sgd_create_for(t.m, &sgd, &t.opt));
  tu_ok(clpar_tensor_empty(dev, 2, (int64_t[]){batch, in}, &t.x));
  tu_ok(clpar_tensor_empty(dev, 2, (int64_t[]){batch, out}, &t.y));
  clpar_step *st = NULL;
  if (compiled) tu_ok(clpar_step_compile(step, &t, &dev, 1, &st));
  for (int i = 0; i < steps; i++) {
    float *x = tu_rand((size_t)(batch * in), 100 + (uint64_t)i);
    float *y = tu_rand((size_t)(batch * out), 200 + (uint64_t)i);
    tu_ok(clpar_tensor_write(t.x, x, (size_t)(batch * in)));
    tu_ok(clpar_tensor_write(t.y, y, (size_t)(batch * out)));
    free(x), free(y);
    tu_ok(compiled ? clpar_step_run(st) : step(&t));
    tu_ok(clpar_tensor_read(t.loss, &losses[i], 1));
  }
  if (compiled) assert_non_null(clpar_step_graph(st));
  float *p = tgu_floats_of(t.m, 0, n);
  if (st) clpar_step_free(st);
  tgu_train_free(&t);
  return p;
}
