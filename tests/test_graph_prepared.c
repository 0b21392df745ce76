/* test_graph_prepared.c — a replay's prepared launches (backend.h's prepare_* entries): on a
 * backend that has them (OpenCL) the replay runs the prepared launches (counted), a backend
 * without them (the host) replays through its entries, and the replayed training equals the
 * eager one bit for bit with the prepared launches on and forced off, over steps where the
 * learning rate changes (patched commands keep the entry path), with SGD (momentum) and Adam,
 * and at a batch whose bias gradients take sum_rows' two passes (the backend's scratch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* clpar_prepared_force_off, the device's prepared_runs */
#include "test_graph_util.h"

enum { STEPS = 30, LR_CHANGE = 12, FILLS = 50 };

typedef struct {
  clpar_device *dev;
  tgu_train t;
} run;

static void run_make(run *r, clpar_device *dev, int adam, int64_t batch) {
  memset(r, 0, sizeof *r);
  r->dev = dev;
  clpar_manual_seed(11);
  clpar_module *c[3];
  tu_ok(clpar_linear_create(8, 16, 1, dev, &c[0]));
  tu_ok(clpar_relu_create(&c[1]));
  tu_ok(clpar_linear_create(16, 8, 1, dev, &c[2]));
  tu_ok(clpar_sequential_create(c, 3, &r->t.m));
  if (adam)
    tu_ok(clpar_adam_create_for(r->t.m, &(clpar_adam_options){.lr = 0.01f}, &r->t.opt));
  else
    tu_ok(clpar_sgd_create_for(r->t.m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f},
                               &r->t.opt));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){batch, 8}, &r->t.x));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){batch, 8}, &r->t.y));
}

static clpar_status step(void *ctx) {
  run *r = ctx;
  clpar_tensor_free(r->t.loss);
  r->t.loss = NULL;
  clpar_tensor *out = NULL;
  clpar_status s = clpar_optimizer_zero_grad(r->t.opt);
  if (s == CLPAR_OK) s = clpar_module_forward(r->t.m, r->t.x, &out);
  if (s == CLPAR_OK) s = clpar_mse_loss(out, r->t.y, CLPAR_REDUCTION_MEAN, &r->t.loss);
  if (s == CLPAR_OK) s = clpar_backward(r->t.loss);
  if (s == CLPAR_OK) s = clpar_optimizer_step(r->t.opt);
  clpar_tensor_free(out);
  return s;
}

/* STEPS steps, eagerly or compiled (warm-up, capture, replays), the learning rate scaled at
 * LR_CHANGE; the losses and, appended, the parameters into out (malloc'ed, *n floats). */
static float *train(run *r, int compiled, size_t *n) {
  clpar_step *st = NULL;
  if (compiled) tu_ok(clpar_step_compile(step, r, &r->dev, 1, &st));
  float *out = malloc(STEPS * sizeof *out);
  assert_non_null(out);
  size_t nx = (size_t)clpar_tensor_numel(r->t.x);
  for (int i = 0; i < STEPS; i++) {
    if (i == LR_CHANGE)
      tu_ok(clpar_optimizer_set_lr(r->t.opt, 0, 0.3f * clpar_optimizer_lr(r->t.opt, 0)));
    float *x = tu_rand(nx, 100 + (uint64_t)i), *y = tu_rand(nx, 900 + (uint64_t)i);
    tu_ok(clpar_tensor_write(r->t.x, x, nx));
    tu_ok(clpar_tensor_write(r->t.y, y, nx));
    free(x);
    free(y);
    tu_ok(compiled ? clpar_step_run(st) : step(r));
    tu_ok(clpar_tensor_read(r->t.loss, &out[i], 1));
  }
  clpar_step_free(st);
  size_t np;
  float *params = tgu_floats_of(r->t.m, 0, &np);
  out = realloc(out, (STEPS + np) * sizeof *out);
  assert_non_null(out);
  memcpy(out + STEPS, params, np * sizeof *out);
  free(params);
  *n = STEPS + np;
  return out;
}

/* Eager, replayed with prepared launches, replayed with them forced off: bit for bit. Returns
 * the prepared launches the replays ran. */
static uint64_t check_on(clpar_device *dev, int adam, int64_t batch) {
  run r;
  size_t n[3];
  float *v[3];
  uint64_t prepared = 0;
  for (int mode = 0; mode < 3; mode++) {
    run_make(&r, dev, adam, batch);
    clpar_prepared_force_off(mode == 2);
    uint64_t before = __atomic_load_n(&dev->prepared_runs, __ATOMIC_RELAXED);
    v[mode] = train(&r, mode > 0, &n[mode]);
    uint64_t ran = __atomic_load_n(&dev->prepared_runs, __ATOMIC_RELAXED) - before;
    clpar_prepared_force_off(0);
    if (mode == 1) prepared = ran;
    if (mode != 1) assert_int_equal(ran, 0);
    tgu_train_free(&r.t);
  }
  for (int mode = 1; mode < 3; mode++) {
    assert_int_equal(n[mode], n[0]);
    for (size_t i = 0; i < n[0]; i++)
      if (memcmp(&v[0][i], &v[mode][i], sizeof v[0][i]) != 0)
        fail_msg("%s, %s: value %zu (%s) %.9g replayed (prepared %s), %.9g eager",
                 clpar_device_id(dev), adam ? "Adam" : "SGD", i, i < STEPS ? "loss" : "parameter",
                 (double)v[mode][i], mode == 1 ? "on" : "off", (double)v[0][i]);
  }
  assert_true(v[0][STEPS - 1] != v[0][0]); /* it trained */
  for (int mode = 0; mode < 3; mode++) free(v[mode]);
  return prepared;
}

static int is_opencl(clpar_device *dev) {
  return strncmp(clpar_device_id(dev), "opencl:", 7) == 0;
}

/* An OpenCL device's replays run prepared launches (STEPS - 2 replays); the host's none. */
static void check_all(int adam, int64_t batch) {
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    uint64_t prepared = check_on(dev, adam, batch);
    if (is_opencl(dev))
      assert_true(prepared >= STEPS - 2);
    else
      assert_int_equal(prepared, 0);
  }
}

/* One eager-equals-replayed case, its test's prestate: 6 rows, or 300, where the bias
 * gradients' column sums take two passes through the backend's scratch. */
typedef struct {
  int adam;
  int64_t batch;
} prepared_case;

static void test_prepared_case(void **state) {
  const prepared_case *c = *state;
  check_all(c->adam, c->batch);
}

/* A graph of FILLS fills on an OpenCL device runs one prepared launch each per replay, and
 * leaves the last value, as the eager fills do. */
static void test_fills_counted(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_tensor *t;
    tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){3}, &t));
    clpar_graph *g = NULL;
    clpar_capture_fuse_disable(1); /* fills are element-wise: fused, they would be one chain */
    tu_ok(clpar_graph_capture_begin(&dev, 1));
    clpar_status s = CLPAR_OK;
    for (int i = 0; s == CLPAR_OK && i < FILLS; i++) s = clpar_fill(t, (float)i);
    tu_ok(clpar_graph_capture_end(&g));
    clpar_capture_fuse_disable(0);
    tu_ok(s);
    tu_ok(clpar_fill(t, -1.0f));
    uint64_t before = __atomic_load_n(&dev->prepared_runs, __ATOMIC_RELAXED);
    tu_ok(clpar_graph_replay(g));
    tu_ok(clpar_graph_replay(g));
    float v[3];
    tu_ok(clpar_tensor_read(t, v, 3));
    uint64_t ran = __atomic_load_n(&dev->prepared_runs, __ATOMIC_RELAXED) - before;
    assert_int_equal(ran, is_opencl(dev) ? 2 * FILLS : 0);
    for (int i = 0; i < 3; i++) assert_true(v[i] == (float)(FILLS - 1));
    clpar_graph_destroy(g);
    clpar_tensor_free(t);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fills_counted),
      TGU_CASE(test_sgd, test_prepared_case, prepared_case, 0, 6),
      TGU_CASE(test_adam, test_prepared_case, prepared_case, 1, 6),
      TGU_CASE(test_two_pass_sums, test_prepared_case, prepared_case, 0, 300),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
