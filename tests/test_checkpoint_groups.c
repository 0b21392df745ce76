/* test_checkpoint_groups.c — a training checkpoint keeps every parameter group's options (as
 * PyTorch's optimizer.state_dict()["param_groups"]), not group 0's alone: an AdamW and an SGD
 * of two groups with options of their own (and a learning rate changed after creation) are
 * saved after two steps, loaded into fresh optimizers made with other options, and the next
 * steps equal the uninterrupted run's; a file of another group structure is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

static char path[256];

/* The parity MLP's parameters in two groups (the weights, the biases) with options of their
 * own; fresh: the options a program that is about to resume would make. */
static clpar_optimizer *make_opt(clpar_module *m, int sgd, int fresh) {
  clpar_tensor *p[4];
  for (int i = 0; i < 4; i++) tu_ok(clpar_module_parameter_at(m, i, NULL, &p[i]));
  clpar_tensor *w[2] = {p[0], p[2]}, *b[2] = {p[1], p[3]};
  clpar_optimizer *o;
  if (sgd) {
    clpar_sgd_group g[2] = {{w, 2, {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f}},
                            {b, 2, {.lr = 0.05f, .momentum = 0.5f, .nesterov = 1}}};
    if (fresh) g[1].options = g[0].options;
    tu_ok(clpar_sgd_create_groups(g, 2, &o));
  } else {
    clpar_adam_group g[2] = {
        {w, 2, {.lr = 0.01f, .beta2 = 0.99f, .weight_decay = 0.1f}},
        {b, 2, {.lr = 0.02f, .beta1 = 0.8f, .eps = 1e-6f, .weight_decay = CLPAR_ZERO}}};
    if (fresh) g[1].options = g[0].options;
    tu_ok(clpar_adamw_create_groups(g, 2, &o));
  }
  if (!fresh) tu_ok(clpar_optimizer_set_lr(o, 1, sgd ? 0.07f : 0.03f)); /* as a schedule does */
  return o;
}

static void step(clpar_module *m, clpar_optimizer *o) {
  clpar_scope *sc = clpar_scope_begin();
  float xv[8] = {1, -2, 0.5f, 3, -1, 2, 1.5f, -0.5f}, yv[4] = {0.5f, -1, 2, 0};
  clpar_tensor *x, *y, *out, *loss;
  tu_ok(clpar_tensor_from_host(tu_host(), 2, (int64_t[]){2, 4}, xv, &x));
  tu_ok(clpar_tensor_from_host(tu_host(), 2, (int64_t[]){2, 2}, yv, &y));
  tu_ok(clpar_optimizer_zero_grad(o));
  tu_ok(clpar_module_forward(m, x, &out));
  tu_ok(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &loss));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_optimizer_step(o));
  clpar_scope_end(sc);
}

static void read_all(clpar_module *m, float *v) {
  for (int i = 0, at = 0; i < 4; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, v + at, (size_t)clpar_tensor_numel(p)));
    at += (int)clpar_tensor_numel(p);
  }
}

static void check_resume(int sgd) {
  const char *what = sgd ? "SGD, 2 groups" : "AdamW, 2 groups";
  clpar_module *a = tu_parity_mlp(tu_host()), *b = tu_parity_mlp(tu_host());
  clpar_optimizer *oa = make_opt(a, sgd, 0), *ob = make_opt(b, sgd, 1);
  step(a, oa);
  step(a, oa);
  tu_ok(clpar_checkpoint_save(path, a, oa, 2, 0));
  tu_ok(clpar_checkpoint_load(path, b, ob, NULL, NULL));
  for (int g = 0; g < 2; g++) assert_true(clpar_optimizer_lr(ob, g) == clpar_optimizer_lr(oa, g));
  for (int t = 0; t < 3; t++) step(a, oa), step(b, ob);
  float va[23], vb[23];
  read_all(a, va);
  read_all(b, vb);
  tu_assert_close(vb, va, 23, 0.0f, 0.0f, what); /* the same operations: the same bits */
  clpar_optimizer_free(oa);
  clpar_optimizer_free(ob);
  clpar_module_free(a);
  clpar_module_free(b);
}

static void test_adamw_groups_resume(void **state) {
  (void)state;
  check_resume(0);
}

static void test_sgd_groups_resume(void **state) {
  (void)state;
  check_resume(1);
}

/* Another number of groups, or groups of other sizes: refused, nothing loaded. */
static void test_other_groups_refused(void **state) {
  (void)state;
  clpar_module *a = tu_parity_mlp(tu_host());
  clpar_optimizer *oa = make_opt(a, 0, 0), *one, *split;
  tu_ok(clpar_checkpoint_save(path, a, oa, 0, 0));
  clpar_adam_options ad = {.lr = 0.01f};
  tu_ok(clpar_adamw_create_for(a, &ad, &one));
  assert_int_equal(clpar_checkpoint_load(path, a, one, NULL, NULL), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_non_null(strstr(clpar_last_error(), "groups"));
  clpar_tensor *p[4];
  for (int i = 0; i < 4; i++) tu_ok(clpar_module_parameter_at(a, i, NULL, &p[i]));
  clpar_adam_group g[2] = {{p, 3, ad}, {p + 3, 1, ad}};
  tu_ok(clpar_adamw_create_groups(g, 2, &split));
  assert_int_equal(clpar_checkpoint_load(path, a, split, NULL, NULL), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_true(clpar_optimizer_lr(split, 1) == 0.01f); /* unchanged */
  clpar_optimizer_free(oa);
  clpar_optimizer_free(one);
  clpar_optimizer_free(split);
  clpar_module_free(a);
}

static int setup(void **state) {
  snprintf(path, sizeof path, "/tmp/clpar_ckpt_groups_%d.safetensors", (int)getpid());
  return tu_setup(state);
}

static int teardown(void **state) {
  unlink(path);
  return tu_teardown(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw_groups_resume),
      cmocka_unit_test(test_sgd_groups_resume),
      cmocka_unit_test(test_other_groups_refused),
  };
  return cmocka_run_group_tests_name("checkpoint_groups", tests, setup, teardown);
}
