/* test_zero.c — sharded data parallel (include/clpar/zero.h) against plain
 * DistributedDataParallel, run by ctest through mpirun on 2 and 4 ranks (tests/CMakeLists.txt).
 * Both train the same model (rank 0's weights, broadcast) on each rank's share of a batch for
 * 5 Adam steps (and AdamW, SGD with momentum, and two backwards a step); the parameters must
 * agree. The model has 1391 parameters, which divides by neither 2 nor 4, so the last shard is
 * padded. Also: each rank's optimizer state covers its shard only, stage 2 never holds the
 * whole gradient on the device nor one parameter's twice, and the options ZeRO refuses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ddp_internal.h"
#include "internal.h"
#include "test_util.h"

enum { IN = 16, HIDDEN = 63, OUT = 5, BATCH = 24, STEPS = 5, NUMEL = 1391, UNUSED = 7 };

static int unused; /* the model has a parameter its forward never uses (find_unused_parameters) */

/* Linear(IN, HIDDEN) ReLU Linear(HIDDEN, OUT): 1071 + 320 = 1391 parameters. */
static clpar_module *make_mlp(uint64_t seed) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *mlp = tu_mlp(dev, seed, 3, (int64_t[]){IN, HIDDEN, OUT});
  if (unused) { /* a parameter the forward never reaches */
    clpar_tensor *t;
    tu_ok(clpar_tensor_rand_normal(dev, 1, (int64_t[]){UNUSED}, seed, 0, 1, &t));
    tu_ok(clpar_module_add_parameter(mlp, "unused", t));
    clpar_tensor_unscope(t);
    clpar_tensor_free(t);
  }
  return mlp;
}

static double cap_mb = 0; /* the buckets' size (0: DDP's 25 MiB, one bucket here) */

static clpar_module *make_ddp(int stage) {
  clpar_ddp_options o = {
      .zero_stage = stage, .bucket_cap_mb = cap_mb, .find_unused_parameters = unused};
  clpar_module *ddp;
  /* seeded by rank: the broadcast from rank 0 makes them agree */
  tu_ok(clpar_ddp_create(make_mlp(100 + (uint64_t)clpar_dist_rank()), &o, &ddp));
  return ddp;
}

/* Forward and backward of MSE on this rank's rows of the batch for step k. */
static void forward_backward(clpar_module *m, int k) {
  tu_rank_mse_backward_rand(m, k, BATCH, IN, OUT);
}

/* Every parameter of m, in order, into a new host array of NUMEL floats (and UNUSED more). */
static float *read_params(clpar_module *m) {
  return tu_read_params(m, NUMEL + (unused ? UNUSED : 0));
}

static const clpar_adam_options adam = {.lr = 0.01f, .weight_decay = 0.01f};
static const clpar_sgd_options sgd = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f};

/* The optimizer the training below uses: Adam, AdamW or SGD with momentum. */
enum { ADAM, ADAMW, SGD };
static int kind = ADAM;

static clpar_optimizer *make_optimizer(clpar_module *ddp) {
  clpar_optimizer *opt;
  if (kind == SGD)
    tu_ok(clpar_sgd_create_for(ddp, &sgd, &opt));
  else if (kind == ADAMW)
    tu_ok(clpar_adamw_create_for(ddp, &adam, &opt));
  else
    tu_ok(clpar_adam_create_for(ddp, &adam, &opt));
  return opt;
}

static clpar_zero_optimizer *make_zero_optimizer(clpar_module *ddp) {
  clpar_zero_optimizer *opt;
  if (kind == SGD)
    tu_ok(clpar_zero_sgd_create(ddp, &sgd, &opt));
  else if (kind == ADAMW)
    tu_ok(clpar_zero_adamw_create(ddp, &adam, &opt));
  else
    tu_ok(clpar_zero_adam_create(ddp, &adam, &opt));
  return opt;
}

/* STEPS steps of micro backwards each (gradients accumulate over them). */
static float *train_ddp(int micro) {
  clpar_module *ddp = make_ddp(0);
  clpar_optimizer *opt = make_optimizer(ddp);
  for (int k = 0; k < STEPS; k++) {
    tu_ok(clpar_optimizer_zero_grad(opt));
    for (int m = 0; m < micro; m++) forward_backward(ddp, k + 7 * m);
    tu_ok(clpar_optimizer_step(opt));
  }
  float *p = read_params(ddp);
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
  return p;
}

static int poison; /* after each stage 1 zero_grad: the flat gradient's memory set to NaN */

/* The rank's averaged shard on the host (zero_comm.c) set to NaN. */
static void poison_shard(clpar_module *ddp, const clpar_zero_optimizer *opt) {
  int64_t lo, len;
  int have;
  clpar_zero_optimizer_shard(opt, &lo, &len);
  float *acc = clpar_zero_comm_shard(clpar_ddp_state_of(ddp), &have);
  assert_false(have);
  for (int64_t i = 0; i < len; i++) acc[i] = NAN;
}

/* Stage 1's zero_grad leaves the parameters without a gradient (PyTorch's set_to_none) and
 * fills nothing: NaN written into the flat gradient's memory, or into the averaged shard on
 * the host, must never reach the step. */
static void poison_flat_grad(clpar_module *ddp, const clpar_zero_optimizer *opt) {
  clpar_tensor *p = NULL;
  for (int i = 0; i < clpar_module_parameter_count(ddp); i++) {
    const char *name;
    tu_ok(clpar_module_parameter_at(ddp, i, &name, &p));
    assert_null(clpar_tensor_grad(p));
  }
  tu_ok(clpar_fill(p->flat->grad, NAN));
  poison_shard(ddp, opt);
}

static float *train_zero(int stage, int micro) {
  clpar_module *ddp = make_ddp(stage);
  clpar_zero_optimizer *opt = make_zero_optimizer(ddp);
  for (int k = 0; k < STEPS; k++) {
    tu_ok(clpar_zero_optimizer_zero_grad(opt));
    if (poison && k > 0) poison_flat_grad(ddp, opt);
    for (int m = 0; m < micro; m++) forward_backward(ddp, k + 7 * m);
    tu_ok(clpar_zero_optimizer_step(opt));
  }
  float *p = read_params(ddp);
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
  return p;
}

static void check_stage(int stage, int micro) {
  float *want = train_ddp(micro), *got = train_zero(stage, micro);
  /* the sums of 2 ranks are the same in any order; with 4 an MPI may add in another order, and
   * accumulated micro-steps are summed before the average (DDP averages each) */
  float tol = clpar_dist_world_size() == 2 && micro == 1 ? 0.0f : 1e-5f;
  tu_assert_close(got, want, NUMEL + (unused ? UNUSED : 0), tol, tol, "parameters after 5 steps");
  free(want);
  free(got);
}

static void test_stage1_matches_ddp(void **state) {
  (void)state;
  check_stage(1, 1);
}

static void test_stage2_matches_ddp(void **state) {
  (void)state;
  check_stage(2, 1);
}

/* The other inner optimizers: AdamW's decoupled decay, SGD's momentum buffer per shard. */
static void test_adamw_and_sgd_momentum_match_ddp(void **state) {
  (void)state;
  for (kind = ADAMW; kind <= SGD; kind++)
    for (int stage = 1; stage <= 2; stage++) check_stage(stage, 1);
  kind = ADAM;
}

/* Two backwards per step: stage 2 adds the second gradient into what the first left on the
 * host; stage 1 accumulates on the device as plain DDP does. */
static void test_accumulated_micro_steps_match_ddp(void **state) {
  (void)state;
  check_stage(1, 2);
  check_stage(2, 2);
}

/* Stage 1's zero_grad fills nothing: each backward's first gradient of a parameter replaces
 * what its memory held (NaN here), the second of a step adds, an unused parameter's part is
 * never read, with one bucket and with several. */
static void test_stage1_zero_grad_fills_nothing(void **state) {
  (void)state;
  poison = 1;
  check_stage(1, 1);
  check_stage(1, 2);
  cap_mb = 1.0 / 1024;
  check_stage(1, 1);
  unused = 1;
  check_stage(1, 2);
  unused = 0;
  cap_mb = 0;
  poison = 0;
}

/* Stage 1, a step with no backward since zero_grad: the averaged shard it steps is zeros, not
 * what the host memory held (NaN here). */
static void test_stage1_step_without_backward(void **state) {
  (void)state;
  clpar_module *ddp = make_ddp(1);
  clpar_zero_optimizer *opt = make_zero_optimizer(ddp);
  tu_ok(clpar_zero_optimizer_zero_grad(opt));
  forward_backward(ddp, 0);
  tu_ok(clpar_zero_optimizer_step(opt));
  tu_ok(clpar_zero_optimizer_zero_grad(opt));
  poison_shard(ddp, opt);
  tu_ok(clpar_zero_optimizer_step(opt));
  float *p = read_params(ddp);
  for (int i = 0; i < NUMEL; i++)
    if (!isfinite(p[i])) fail_msg("parameter %d is %g after a step without backward", i, p[i]);
  free(p);
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
}

/* Linear(2, 1) (3 parameters) trained 5 steps with Adam, ZeRO at stage (0: plain DDP); its
 * parameters into p. */
static void train_tiny(int stage, float p[3]) {
  int empty = tu_zero_train_tiny(stage, &adam, STEPS, p);
  if (stage && clpar_dist_world_size() == 4 && clpar_dist_rank() == 3)
    assert_true(empty); /* shards of 1: rank 3's is all padding */
}

/* Buckets of 1 KiB: four, two of which cross a shard boundary on 2 ranks (and more on 4), each
 * reduce-scattered as backward makes it. */
static void test_small_buckets_match_ddp(void **state) {
  (void)state;
  cap_mb = 1.0 / 1024;
  check_stage(1, 1);
  check_stage(2, 1);
  check_stage(2, 2);
  cap_mb = 0;
}

/* find_unused_parameters: a parameter the forward never reaches is counted ready with zeros
 * in the first hook, as in plain DDP, so its bucket is reduce-scattered (one bucket, and
 * small buckets where it has its own). */
static void test_unused_parameter_matches_ddp(void **state) {
  (void)state;
  unused = 1;
  for (int run = 0; run < 2; run++) {
    cap_mb = run ? 1.0 / 1024 : 0;
    check_stage(1, 1);
    check_stage(2, 2);
  }
  unused = 0;
  cap_mb = 0;
}

/* Backward under ZeRO-1 and 2 posts the copies of the gradients to host memory and leaves the
 * reduce-scatters to the communication thread: the program's thread never waits for the
 * device inside clpar_backward (clpar_device_host_waits unchanged), with one bucket and with
 * several. */
static void test_backward_waits_for_no_device(void **state) {
  (void)state;
  clpar_device *dev = clpar_dist_device();
  float *x = tu_rand(BATCH * IN, 11);
  for (int run = 0; run < 4; run++) {
    cap_mb = run % 2 ? 1.0 / 1024 : 0;
    clpar_module *ddp = make_ddp(1 + run / 2);
    clpar_zero_optimizer *opt = make_zero_optimizer(ddp);
    for (int step = 0; step < 2; step++) {
      clpar_scope *scope = clpar_scope_begin();
      clpar_tensor *xt, *out, *loss;
      tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){BATCH / 2, IN}, x, &xt));
      tu_ok(clpar_module_forward(ddp, xt, &out));
      tu_ok(clpar_mean(out, &loss));
      uint64_t before = clpar_device_host_waits(dev);
      tu_ok(clpar_backward(loss));
      assert_int_equal(clpar_device_host_waits(dev), before);
      clpar_scope_end(scope);
      tu_ok(clpar_zero_optimizer_step(opt));
      tu_ok(clpar_zero_optimizer_zero_grad(opt));
    }
    clpar_zero_optimizer_free(opt);
    clpar_module_free(ddp);
  }
  cap_mb = 0;
  free(x);
}

/* Fewer parameters than shards: a rank whose shard is all padding steps nothing and still
 * takes part in every collective. */
static void test_tiny_model_with_empty_shards(void **state) {
  (void)state;
  float want[3], got[3];
  train_tiny(0, want);
  for (int stage = 1; stage <= 2; stage++) {
    train_tiny(stage, got);
    tu_assert_close(got, want, 3, 1e-6f, 1e-6f, "Linear(2, 1) after 5 steps");
  }
}

/* Bytes the allocator counts for n floats (its rounding: 512 below 1 MiB). */
static uint64_t rounded(int64_t n) {
  return ((uint64_t)n * 4 + 511) / 512 * 512;
}

/* Optimizer state on this rank's device after one step of plain DDP with Adam. */
static uint64_t ddp_state_bytes(void) {
  clpar_device *dev = clpar_dist_device();
  uint64_t before = clpar_memory_in_use(dev, CLPAR_MEM_OPTIMIZER);
  clpar_module *ddp = make_ddp(0);
  clpar_optimizer *opt;
  tu_ok(clpar_adam_create_for(ddp, &adam, &opt));
  forward_backward(ddp, 0);
  tu_ok(clpar_optimizer_step(opt));
  uint64_t bytes = clpar_memory_in_use(dev, CLPAR_MEM_OPTIMIZER) - before;
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
  return bytes;
}

/* Each rank's Adam state is its shard's two moments, about 1/world of plain DDP's (the
 * allocator's rounding aside); the shards cover the parameters once. */
static void test_optimizer_state_is_sharded(void **state) {
  (void)state;
  int world = clpar_dist_world_size();
  clpar_device *dev = clpar_dist_device();
  uint64_t plain = ddp_state_bytes();
  assert_int_equal(plain, 2 * rounded(NUMEL));
  uint64_t before = clpar_memory_in_use(dev, CLPAR_MEM_OPTIMIZER);
  clpar_module *ddp = make_ddp(1);
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_adam_create(ddp, &adam, &opt));
  forward_backward(ddp, 0);
  tu_ok(clpar_zero_optimizer_step(opt));
  uint64_t sharded = clpar_memory_in_use(dev, CLPAR_MEM_OPTIMIZER) - before;
  float sum = (float)sharded;
  tu_ok(clpar_dist_all_reduce_sum(&sum, 1));
  assert_true(sum <= (float)(plain + (uint64_t)world * 2 * 512));
  int64_t lo, len, shard = (NUMEL + world - 1) / world;
  clpar_zero_optimizer_shard(opt, &lo, &len);
  assert_int_equal(lo, clpar_dist_rank() * shard);
  assert_true(len <= shard);
  clpar_optimizer *inner = clpar_zero_optimizer_inner(opt);
  assert_non_null(inner);
  assert_int_equal(clpar_optimizer_size(inner), 1);
  for (int k = 0; k < 2; k++)
    assert_int_equal(clpar_tensor_numel(clpar_optimizer_state_at(inner, 0, k)), len);
  assert_int_equal(sharded, 2 * rounded(len));
  float total = (float)len;
  tu_ok(clpar_dist_all_reduce_sum(&total, 1));
  assert_true(total == (float)NUMEL);
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
}

/* Stage 2 never holds the whole gradient on the device: each parameter's gradient leaves for
 * the host as backward makes it, so the gradients' peak is the rank's shard and the largest
 * parameter (Linear(IN, HIDDEN)'s weight); stage 1 holds the flat gradient throughout. */
static void test_stage2_never_holds_the_whole_gradient(void **state) {
  (void)state;
  clpar_device *dev = clpar_dist_device();
  uint64_t before = clpar_memory_in_use(dev, CLPAR_MEM_GRADIENTS);
  clpar_module *ddp = make_ddp(2);
  assert_int_equal(clpar_memory_in_use(dev, CLPAR_MEM_GRADIENTS), before);
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_adam_create(ddp, &adam, &opt));
  int64_t lo, len;
  clpar_zero_optimizer_shard(opt, &lo, &len);
  assert_int_equal(clpar_memory_in_use(dev, CLPAR_MEM_GRADIENTS) - before, rounded(len));
  const char *name;
  clpar_tensor *w;
  tu_ok(clpar_module_parameter_at(ddp, 0, &name, &w));
  tu_ok(clpar_memory_mark(dev));
  forward_backward(ddp, 0);
  assert_null(clpar_tensor_grad(w)); /* on the host now */
  assert_true(clpar_memory_peak(dev, CLPAR_MEM_GRADIENTS) - before <=
              rounded(len) + rounded(IN * HIDDEN));
  tu_ok(clpar_zero_optimizer_step(opt));
  clpar_status s = clpar_zero_optimizer_step(opt); /* no backward since the last step */
  assert_int_equal(s, CLPAR_ERROR_NO_GRADIENT);
  /* every rank fails alike, naming the lowest rank that could not step */
  assert_non_null(
      strstr(clpar_last_error(), "rank 0: clpar_zero_optimizer_step: no backward gave"));
  forward_backward(ddp, 1);
  tu_ok(clpar_zero_optimizer_step(opt));
  clpar_zero_optimizer *second = NULL;
  assert_int_equal(clpar_zero_adam_create(ddp, &adam, &second), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);

  ddp = make_ddp(1); /* for contrast: the flat gradient, all of it */
  tu_ok(clpar_memory_mark(dev));
  forward_backward(ddp, 0);
  assert_true(clpar_memory_peak(dev, CLPAR_MEM_GRADIENTS) - before >= rounded(NUMEL));
  clpar_module_free(ddp);
}

/* Stage 2 holds each parameter's gradient once while backward runs: the parameter keeps the
 * tensor backward made for it, and the hook takes it to the host. On Linear(WIDE, WIDE), whose
 * 1 MiB weight gradient dwarfs the rest of backward, the device's total peak above what the
 * forward left is one weight gradient, not two. */
static void test_stage2_holds_each_gradient_once(void **state) {
  (void)state;
  enum { WIDE = 512, ROWS = 2 };
  clpar_device *dev = clpar_dist_device();
  clpar_module *lin, *ddp;
  clpar_manual_seed(7);
  tu_ok(clpar_linear_create(WIDE, WIDE, 1, dev, &lin));
  clpar_ddp_options o = {.zero_stage = 2};
  tu_ok(clpar_ddp_create(lin, &o, &ddp));
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_adam_create(ddp, &adam, &opt));
  for (int step = 0; step < 2; step++) {
    float *x = tu_rand(ROWS * WIDE, 3 + (uint64_t)step);
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *xt, *out, *loss;
    tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){ROWS, WIDE}, x, &xt));
    tu_ok(clpar_module_forward(ddp, xt, &out));
    tu_ok(clpar_mean(out, &loss));
    uint64_t peak = tu_backward_peak(dev, loss);
    clpar_scope_end(scope);
    free(x);
    assert_true(peak < rounded(WIDE * WIDE) * 3 / 2);
    tu_ok(clpar_zero_optimizer_step(opt));
  }
  clpar_zero_optimizer_free(opt);
  clpar_module_free(ddp);
}

static void test_refused_options(void **state) {
  (void)state;
  clpar_ddp_options o = {.zero_stage = 4};
  clpar_module *ddp = NULL;
  assert_int_equal(clpar_ddp_create(make_mlp(1), &o, &ddp), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "zero_stage is 4"));
  o.zero_stage = -1;
  assert_int_equal(clpar_ddp_create(make_mlp(1), &o, &ddp), CLPAR_ERROR_INVALID_ARGUMENT);
  ddp = make_ddp(0);
  clpar_zero_optimizer *opt = NULL;
  assert_int_equal(clpar_zero_adam_create(ddp, NULL, &opt), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "clpar_zero_adam_create"));
  assert_null(opt);
  clpar_module_free(ddp);
  ddp = make_ddp(1);
  clpar_adam_options bad = {.beta1 = 1.0f};
  assert_int_equal(clpar_zero_adam_create(ddp, &bad, &opt), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_module_free(ddp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stage1_matches_ddp),
      cmocka_unit_test(test_stage2_matches_ddp),
      cmocka_unit_test(test_optimizer_state_is_sharded),
      cmocka_unit_test(test_adamw_and_sgd_momentum_match_ddp),
      cmocka_unit_test(test_accumulated_micro_steps_match_ddp),
      cmocka_unit_test(test_stage1_zero_grad_fills_nothing),
      cmocka_unit_test(test_stage1_step_without_backward),
      cmocka_unit_test(test_tiny_model_with_empty_shards),
      cmocka_unit_test(test_small_buckets_match_ddp),
      cmocka_unit_test(test_backward_waits_for_no_device),
      cmocka_unit_test(test_unused_parameter_matches_ddp),
      cmocka_unit_test(test_stage2_never_holds_the_whole_gradient),
      cmocka_unit_test(test_stage2_holds_each_gradient_once),
      cmocka_unit_test(test_refused_options),
  };
  return cmocka_run_group_tests_name("zero", tests, tu_dist_setup, tu_dist_teardown);
}
