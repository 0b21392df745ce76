/* test_zero3.c — ZeRO stage 3 (clpar_ddp_options.zero_stage 3, include/clpar/zero.h) against
 * plain DistributedDataParallel, run by ctest through mpirun on 2 and 4 ranks. Both train the
 * same model (rank 0's weights, broadcast) on each rank's share of a batch for 5 steps; the
 * parameters, gathered with clpar_zero_gather_parameters, must agree. The MLP's units are its
 * three Linear layers: 1071, 320 and 6 parameters (none divides by 2 or 4; the last unit's
 * bias, 1 float, is smaller than the world). Also: each rank holds its shards and at most one
 * unit's full parameters and gradients at a time, and what stage 3 refuses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

enum { IN = 16, HIDDEN = 63, MID = 5, OUT = 1, BATCH = 24, STEPS = 5 };
enum { NUMEL = IN * HIDDEN + HIDDEN + HIDDEN * MID + MID + MID * OUT + OUT };

/* Linear(IN, HIDDEN) ReLU Linear(HIDDEN, MID) ReLU Linear(MID, OUT). */
static clpar_module *make_mlp(uint64_t seed) {
  return tu_mlp(clpar_dist_device(), seed, 4, (int64_t[]){IN, HIDDEN, MID, OUT});
}

static clpar_module *make_ddp(int stage) {
  clpar_ddp_options o = {.zero_stage = stage};
  clpar_module *ddp;
  /* seeded by rank: the broadcast from rank 0 makes them agree */
  tu_ok(clpar_ddp_create(make_mlp(100 + (uint64_t)clpar_dist_rank()), &o, &ddp));
  return ddp;
}

static int extra_forward; /* 1: a forward no backward follows after each forward_backward */

/* Forward and backward of MSE on this rank's rows of the batch for step k. */
static void forward_backward(clpar_module *m, int k) {
  tu_rank_mse_backward_rand(m, k, BATCH, IN, OUT);
  if (extra_forward) {
    clpar_scope *scope = clpar_scope_begin();
    int64_t shape[2] = {BATCH / clpar_dist_world_size(), IN};
    clpar_tensor *x = tu_make(clpar_dist_device(), 2, shape, 90 + (uint64_t)k), *y;
    tu_ok(clpar_module_forward(m, x, &y));
    clpar_scope_end(scope);
  }
}

/* Every parameter of m, in order, into a new host array of n floats. */
static float *read_params(clpar_module *m, size_t n) {
  return tu_read_params(m, n);
}

static const clpar_adam_options adam = {.lr = 0.01f, .weight_decay = 0.01f};
static const clpar_sgd_options sgd = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f};

static float *train_ddp(int use_sgd, int micro) {
  clpar_module *ddp = make_ddp(0);
  clpar_optimizer *opt;
  tu_ok(use_sgd ? clpar_sgd_create_for(ddp, &sgd, &opt) : clpar_adam_create_for(ddp, &adam, &opt));
  for (int k = 0; k < STEPS; k++) {
    tu_ok(clpar_optimizer_zero_grad(opt));
    for (int m = 0; m < micro; m++) forward_backward(ddp, k + 7 * m);
    tu_ok(clpar_optimizer_step(opt));
  }
  float *p = read_params(ddp, NUMEL);
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
  return p;
}

static float *train_zero3(int use_sgd, int micro) {
  clpar_module *ddp = make_ddp(3);
  clpar_zero_optimizer *opt;
  tu_ok(use_sgd ? clpar_zero_sgd_create(ddp, &sgd, &opt)
                : clpar_zero_adam_create(ddp, &adam, &opt));
  for (int k = 0; k < STEPS; k++) {
    tu_ok(clpar_zero_optimizer_zero_grad(opt));
    for (int m = 0; m < micro; m++) forward_backward(ddp, k + 7 * m);
    tu_ok(clpar_zero_optimizer_step(opt));
  }
  /* released: each parameter a [1] tensor holding NaN */
  clpar_tensor *w;
  const char *name;
  float v = 0;
  tu_ok(clpar_module_parameter_at(ddp, 0, &name, &w));
  assert_string_equal(name, "module.0.weight");
  assert_int_equal(clpar_tensor_numel(w), 1);
  tu_ok(clpar_tensor_read(w, &v, 1));
  assert_true(isnan(v));
  tu_ok(clpar_zero_gather_parameters(ddp));
  assert_int_equal(clpar_tensor_numel(w), IN * HIDDEN);
  assert_int_equal(clpar_tensor_dim(w, 0), HIDDEN);
  float *p = read_params(ddp, NUMEL);
  tu_ok(clpar_zero_release_parameters(ddp));
  assert_int_equal(clpar_tensor_numel(w), 1);
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
  return p;
}

static void check(int use_sgd, int micro) {
  float *want = train_ddp(use_sgd, micro), *got = train_zero3(use_sgd, micro);
  tu_assert_close(got, want, NUMEL, 1e-5f, 1e-6f, "parameters after 5 steps");
  free(want);
  free(got);
}

static void test_adam_matches_ddp(void **state) {
  (void)state;
  check(0, 1);
}

/* The collectives' host memory pinned (the device's host_alloc), as on a GPU. */
extern int clpar_ddp_pin_cpu;
static void test_adam_with_pinned_host_memory_matches_ddp(void **state) {
  (void)state;
  clpar_ddp_pin_cpu = 1;
  check(0, 1);
  clpar_ddp_pin_cpu = 0;
}

/* A recorded forward whose output is dropped, after each backward: its last unit's gather,
 * prefetched for a backward that does not come, holds the values from before the step, which
 * the next forward must not take. */
static void test_forward_without_backward_matches_ddp(void **state) {
  (void)state;
  extra_forward = 1;
  check(0, 1);
  extra_forward = 0;
}

/* SGD's momentum per shard; two backwards a step accumulate into the shards' gradients. */
static void test_sgd_and_micro_steps_match_ddp(void **state) {
  (void)state;
  check(1, 1);
  check(0, 2);
}

/* A unit holding Dropout(0.3): Sequential(Sequential(Linear(IN, HIDDEN), ReLU, Dropout),
 * Linear(HIDDEN, MID)), seeded alike on both sides; 5 Adam steps of it into p. The recompute
 * in backward must draw the forward's mask. */
static void train_dropout(int stage, float *p) {
  enum { N = IN * HIDDEN + HIDDEN + HIDDEN * MID + MID };
  clpar_device *dev = clpar_dist_device();
  clpar_module *inner[3], *outer[2], *model, *ddp;
  clpar_manual_seed(200 + (uint64_t)clpar_dist_rank()); /* the masks differ by rank */
  tu_ok(clpar_linear_create(IN, HIDDEN, 1, dev, &inner[0]));
  tu_ok(clpar_relu_create(&inner[1]));
  tu_ok(clpar_dropout_create(0.3f, &inner[2]));
  tu_ok(clpar_sequential_create(inner, 3, &outer[0]));
  tu_ok(clpar_linear_create(HIDDEN, MID, 1, dev, &outer[1]));
  tu_ok(clpar_sequential_create(outer, 2, &model));
  tu_ok(clpar_ddp_create(model, &(clpar_ddp_options){.zero_stage = stage}, &ddp));
  clpar_optimizer *opt = NULL;
  clpar_zero_optimizer *zopt = NULL;
  tu_ok(stage ? clpar_zero_adam_create(ddp, &adam, &zopt)
              : clpar_adam_create_for(ddp, &adam, &opt));
  for (int k = 0; k < STEPS; k++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x = tu_make(dev, 2, (int64_t[]){4, IN}, 60 + (uint64_t)k), *y, *loss;
    tu_ok(clpar_module_forward(ddp, x, &y));
    tu_ok(clpar_mean(y, &loss));
    tu_ok(clpar_backward(loss));
    clpar_scope_end(scope);
    tu_ok(stage ? clpar_zero_optimizer_step(zopt) : clpar_optimizer_step(opt));
    tu_ok(stage ? clpar_zero_optimizer_zero_grad(zopt) : clpar_optimizer_zero_grad(opt));
  }
  if (stage) tu_ok(clpar_zero_gather_parameters(ddp));
  float *all = read_params(ddp, N);
  memcpy(p, all, N * sizeof(float));
  free(all);
  clpar_zero_optimizer_free(zopt);
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
}

static void test_dropout_in_a_unit_matches_ddp(void **state) {
  (void)state;
  enum { N = IN * HIDDEN + HIDDEN + HIDDEN * MID + MID };
  float *want = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
  assert_true(want && got);
  train_dropout(0, want);
  train_dropout(3, got);
  tu_assert_close(got, want, N, 1e-5f, 1e-6f, "parameters after 5 steps with Dropout(0.3)");
  free(want);
  free(got);
}

/* A GPT (2 blocks, tied head) with zero_units "transformer.h" (stage 3; 0: plain DDP):
 * units are the blocks, the root unit the embeddings, ln_f and the head. 5 Adam steps of
 * next-token cross-entropy; its parameters into a new array of *n floats. */
static float *train_gpt(int stage, size_t *n) {
  enum { B = 2, T = 6, V = 11 };
  clpar_gpt_config cfg = {.block_size = 8,
                          .vocab_size = V,
                          .n_layer = 2,
                          .n_head = 2,
                          .n_embd = 8,
                          .dropout = 0.1f,
                          .bias = 1};
  clpar_device *dev = clpar_dist_device();
  clpar_module *gpt, *ddp;
  clpar_manual_seed(300 + (uint64_t)clpar_dist_rank());
  tu_ok(clpar_gpt_create(&cfg, dev, &gpt));
  clpar_ddp_options o = {.zero_stage = stage, .zero_units = stage ? "transformer.h" : NULL};
  tu_ok(clpar_ddp_create(gpt, &o, &ddp));
  clpar_optimizer *opt = NULL;
  clpar_zero_optimizer *zopt = NULL;
  tu_ok(stage ? clpar_zero_adam_create(ddp, &adam, &zopt)
              : clpar_adam_create_for(ddp, &adam, &opt));
  for (int k = 0; k < STEPS; k++) {
    int32_t ids[B * T], next[B * T];
    for (int i = 0; i < B * T; i++) {
      ids[i] = (int32_t)((i * 7 + k * 3 + clpar_dist_rank() * 5) % V);
      next[i] = (int32_t)((ids[i] * 3 + 1) % V);
    }
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x, *logits, *flat, *loss;
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, (int64_t[]){B, T}, ids, &x));
    tu_ok(clpar_module_forward(ddp, x, &logits));
    tu_ok(clpar_tensor_reshape(logits, 2, (int64_t[]){B * T, V}, &flat));
    tu_ok(clpar_cross_entropy(flat, next, B * T, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    clpar_scope_end(scope);
    tu_ok(stage ? clpar_zero_optimizer_step(zopt) : clpar_optimizer_step(opt));
    tu_ok(stage ? clpar_zero_optimizer_zero_grad(zopt) : clpar_optimizer_zero_grad(opt));
  }
  if (stage) tu_ok(clpar_zero_gather_parameters(ddp));
  *n = 0;
  for (int i = 0; i < clpar_module_parameter_count(ddp); i++) {
    clpar_tensor *t;
    tu_ok(clpar_module_parameter_at(ddp, i, NULL, &t));
    *n += (size_t)clpar_tensor_numel(t);
  }
  float *p = read_params(ddp, *n);
  clpar_zero_optimizer_free(zopt);
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
  return p;
}

/* Units named by zero_units, and a root unit around them holding a tied weight. */
static void test_gpt_blocks_as_units_match_ddp(void **state) {
  (void)state;
  size_t n_want, n_got;
  float *want = train_gpt(0, &n_want), *got = train_gpt(3, &n_got);
  assert_int_equal(n_got, n_want);
  tu_assert_close(got, want, n_want, 1e-5f, 1e-6f, "GPT parameters after 5 steps");
  free(want);
  free(got);
}

/* Linear(2, 1) is its own unit (the module holds parameters itself): 3 floats in shards of 2
 * (2 ranks) or 1 (4 ranks: rank 3's shard is all padding). */
static void train_tiny(int stage, float p[3]) {
  tu_zero_train_tiny(stage, &adam, STEPS, p);
}

static void test_whole_module_unit_with_empty_shards(void **state) {
  (void)state;
  float want[3], got[3];
  train_tiny(0, want);
  train_tiny(3, got);
  tu_assert_close(got, want, 3, 1e-6f, 1e-6f, "Linear(2, 1) after 5 steps");
}

/* Bytes the allocator counts for n floats (its rounding: 512 below 1 MiB). */
static uint64_t rounded(int64_t n) {
  return ((uint64_t)n * 4 + 511) / 512 * 512;
}

/* Four Linear(64, 64) units: a rank keeps its shard of each (plus the [1] placeholder) and,
 * during a step, at most one unit's full parameters more; the gradients likewise. The
 * allocator may serve a request from a cached block up to 25% larger: the bounds allow it. */
static void test_memory_is_sharded(void **state) {
  (void)state;
  enum { W = 64, UNITS = 4, UNIT = W * W + W };
  clpar_device *dev = clpar_dist_device();
  int world = clpar_dist_world_size();
  int64_t shard = (UNIT + world - 1) / world;
  uint64_t p0 = clpar_memory_in_use(dev, CLPAR_MEM_PARAMETERS);
  uint64_t g0 = clpar_memory_in_use(dev, CLPAR_MEM_GRADIENTS);
  uint64_t o0 = clpar_memory_in_use(dev, CLPAR_MEM_OPTIMIZER);
  clpar_module *layers[UNITS], *mlp, *ddp;
  clpar_manual_seed(9);
  for (int i = 0; i < UNITS; i++) tu_ok(clpar_linear_create(W, W, 1, dev, &layers[i]));
  tu_ok(clpar_sequential_create(layers, UNITS, &mlp));
  tu_ok(clpar_ddp_create(mlp, &(clpar_ddp_options){.zero_stage = 3}, &ddp));
  uint64_t kept = UNITS * rounded(shard) + rounded(1), full = UNITS * rounded(UNIT);
  uint64_t now = clpar_memory_in_use(dev, CLPAR_MEM_PARAMETERS) - p0;
  assert_true(now >= kept && now <= kept * 5 / 4);
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_adam_create(ddp, &adam, &opt));
  tu_ok(clpar_memory_mark(dev));
  for (int k = 0; k < 2; k++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x = tu_make(dev, 2, (int64_t[]){4, W}, 3 + (uint64_t)k), *y, *loss;
    tu_ok(clpar_module_forward(ddp, x, &y));
    tu_ok(clpar_mean(y, &loss));
    tu_ok(clpar_backward(loss));
    clpar_scope_end(scope);
    tu_ok(clpar_zero_optimizer_step(opt));
  }
  uint64_t peak = clpar_memory_peak(dev, CLPAR_MEM_PARAMETERS) - p0;
  uint64_t gpeak = clpar_memory_peak(dev, CLPAR_MEM_GRADIENTS) - g0;
  print_message(
      "rank %d: parameters %llu after creation, peak %llu; gradients peak %llu; full "
      "model %llu, unit %llu\n",
      clpar_dist_rank(), (unsigned long long)now, (unsigned long long)peak,
      (unsigned long long)gpeak, (unsigned long long)full, (unsigned long long)rounded(UNIT));
  assert_true(peak >= now + rounded(UNIT)); /* a unit was gathered */
  assert_true(peak <= (kept + rounded(UNIT)) * 5 / 4);
  assert_true(peak < full); /* below one full copy of the model */
  /* the shards' gradients, one unit's full gradient or a shard's on its way */
  assert_true(gpeak <= (UNITS * rounded(shard) + rounded(UNIT)) * 5 / 4);
  assert_true(gpeak < full);
  now = clpar_memory_in_use(dev, CLPAR_MEM_PARAMETERS) - p0;
  assert_true(now >= kept && now <= kept * 5 / 4);
  uint64_t state_bytes = clpar_memory_in_use(dev, CLPAR_MEM_OPTIMIZER) - o0;
  assert_true(state_bytes >= UNITS * 2 * rounded(shard));
  assert_true(state_bytes <= UNITS * 2 * rounded(shard) * 5 / 4);
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
}

/* Forward and backward of a ZeRO-3 step only post: the reads of the shards and gradients into
 * host memory, with events the communication thread waits for, and the writes of the gathered
 * parameters (blocking copies made three host waits per unit and step: the shard's read in
 * forward, the shard's and the gradient's in backward). The program's thread never waits for
 * the device in them (clpar_device_host_waits unchanged); the parameters still match DDP's
 * (test_adam_matches_ddp), and the device holds at most one unit's full parameters beside the
 * shards while the next unit's all-gather is in flight. */
static void test_step_waits_for_no_device(void **state) {
  (void)state;
  enum { W = 64, UNITS = 4, UNIT = W * W + W };
  clpar_device *dev = clpar_dist_device();
  int64_t shard = (UNIT + clpar_dist_world_size() - 1) / clpar_dist_world_size();
  uint64_t p0 = clpar_memory_in_use(dev, CLPAR_MEM_PARAMETERS);
  clpar_module *layers[UNITS], *mlp, *ddp;
  clpar_manual_seed(9);
  for (int i = 0; i < UNITS; i++) tu_ok(clpar_linear_create(W, W, 1, dev, &layers[i]));
  tu_ok(clpar_sequential_create(layers, UNITS, &mlp));
  tu_ok(clpar_ddp_create(mlp, &(clpar_ddp_options){.zero_stage = 3}, &ddp));
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_adam_create(ddp, &adam, &opt));
  tu_ok(clpar_memory_mark(dev));
  for (int k = 0; k < 3; k++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x = tu_make(dev, 2, (int64_t[]){4, W}, 3 + (uint64_t)k), *y, *loss;
    uint64_t w0 = clpar_device_host_waits(dev);
    tu_ok(clpar_module_forward(ddp, x, &y));
    uint64_t w1 = clpar_device_host_waits(dev);
    tu_ok(clpar_mean(y, &loss));
    uint64_t w2 = clpar_device_host_waits(dev);
    tu_ok(clpar_backward(loss));
    uint64_t w3 = clpar_device_host_waits(dev);
    print_message("rank %d, step %d: host waits in forward %llu, in backward %llu\n",
                  clpar_dist_rank(), k, (unsigned long long)(w1 - w0),
                  (unsigned long long)(w3 - w2));
    assert_int_equal(w1 - w0, 0);
    assert_int_equal(w3 - w2, 0);
    clpar_scope_end(scope);
    tu_ok(clpar_zero_optimizer_step(opt));
    tu_ok(clpar_zero_optimizer_zero_grad(opt));
  }
  uint64_t peak = clpar_memory_peak(dev, CLPAR_MEM_PARAMETERS) - p0;
  assert_true(peak <= (UNITS * rounded(shard) + rounded(1) + rounded(UNIT)) * 5 / 4);
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
}

static void test_refused(void **state) {
  (void)state;
  clpar_module *ddp = NULL;
  clpar_ddp_options o = {.zero_stage = 3, .find_unused_parameters = 1};
  assert_int_equal(clpar_ddp_create(make_mlp(1), &o, &ddp), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "zero_stage is 3 with find_unused_parameters"));
  o = (clpar_ddp_options){.zero_stage = 4};
  assert_int_equal(clpar_ddp_create(make_mlp(1), &o, &ddp), CLPAR_ERROR_INVALID_ARGUMENT);
  /* one Linear twice: two units would share its parameters */
  clpar_module *lin, *seq;
  tu_ok(clpar_linear_create(4, 4, 1, clpar_dist_device(), &lin));
  tu_ok(clpar_sequential_create((clpar_module *[]){lin, lin}, 2, &seq));
  o.zero_stage = 3;
  assert_int_equal(clpar_ddp_create(seq, &o, &ddp), CLPAR_ERROR_UNSUPPORTED);
  assert_non_null(strstr(clpar_last_error(), "share a parameter"));
  assert_null(ddp);
  /* a unit's weight also held outside the units: Sequential(Sequential(lin), lin) */
  clpar_module *lin2, *inner, *outer;
  tu_ok(clpar_linear_create(4, 4, 1, clpar_dist_device(), &lin2));
  tu_ok(clpar_sequential_create((clpar_module *[]){lin2}, 1, &inner));
  tu_ok(clpar_sequential_create((clpar_module *[]){inner, lin2}, 2, &outer));
  o.zero_units = "0";
  assert_int_equal(clpar_ddp_create(outer, &o, &ddp), CLPAR_ERROR_UNSUPPORTED);
  assert_non_null(strstr(clpar_last_error(), "also held outside it"));
  o.zero_units = "0.nothing";
  assert_int_equal(clpar_ddp_create(make_mlp(1), &o, &ddp), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "zero_units is \"0.nothing\""));
  o.zero_units = NULL;
  ddp = make_ddp(2);
  assert_int_equal(clpar_zero_gather_parameters(ddp), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_zero_release_parameters(ddp), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_module_free(ddp);
  /* a step without a backward since the last one fails on every rank */
  ddp = make_ddp(3);
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_adam_create(ddp, &adam, &opt));
  assert_int_equal(clpar_zero_optimizer_step(opt), CLPAR_ERROR_NO_GRADIENT);
  assert_non_null(strstr(clpar_last_error(), "rank 0: clpar_zero_optimizer_step: no backward"));
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adam_matches_ddp),
      cmocka_unit_test(test_adam_with_pinned_host_memory_matches_ddp),
      cmocka_unit_test(test_forward_without_backward_matches_ddp),
      cmocka_unit_test(test_sgd_and_micro_steps_match_ddp),
      cmocka_unit_test(test_dropout_in_a_unit_matches_ddp),
      cmocka_unit_test(test_gpt_blocks_as_units_match_ddp),
      cmocka_unit_test(test_whole_module_unit_with_empty_shards),
      cmocka_unit_test(test_memory_is_sharded),
      cmocka_unit_test(test_step_waits_for_no_device),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests_name("zero3", tests, tu_dist_setup, tu_dist_teardown);
}
