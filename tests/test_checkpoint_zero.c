/* test_checkpoint_zero.c — sharded checkpoints of ZeRO optimizers (checkpoint_zero.h), run by
 * tests/checkpoint_zero.sh for stages 1, 2 and 3 (ZeRO-3: the parameters are all-gathered to
 * compare them, and each unit's shard of the state is checked with its padding):
 *
 *   save DIR STAGE   (2 ranks) trains an MLP of 1399 parameters (not divisible by 2, 3 or 4;
 *                    2.weight spans the two shards) with plain DDP and Adam for 3 steps and
 *                    saves it as one file (DIR/full.ckpt, rank 0); then the same with ZeRO,
 *                    saved sharded (DIR/zeroSTAGE), 3 steps more, their losses kept;
 *   load DIR STAGE   (1 to 4 ranks) loads DIR/zeroSTAGE into one process's plain Adam (the
 *                    same state, bit for bit, as DIR/full.ckpt) and into a ZeRO job of that
 *                    world size (the parameters and each rank's shard of the state bit for bit,
 *                    the options and step count restored; also SGD with Nesterov momentum); 3 more
 * steps give the saved losses (bit for bit on 2 ranks; within 1e-5 relative elsewhere, where the
 *                    gradient mean adds in another order), and so do 3 steps of the plain Adam
 *                    in a job of one; a checkpoint whose parameters took different step
 *                    counts is refused and changes nothing;
 *   hostile DIR STAGE (1 process, no MPI) consolidates DIR/zeroSTAGE: byte for byte
 *                    DIR/full.ckpt. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

enum { IN = 8, HIDDEN = 31, OUT = 4, BATCH = 24, STEPS_BEFORE = 3, STEPS_AFTER = 3 };

static const char *dir;
static int stage;
static char path_buf[4][1024];

static const char *in_dir(const char *fmt, int x) {
  static int next;
  char name[256], *p = path_buf[next++ % 4];
  snprintf(name, sizeof name, fmt, x);
  snprintf(p, sizeof path_buf[0], "%s/%s", dir, name);
  return p;
}

static clpar_device *device(void) {
  return clpar_dist_device() ? clpar_dist_device() : clpar_device_get(0);
}

static clpar_module *make_mlp(uint64_t seed) {
  return tu_mlp(device(), seed, 4, (int64_t[]){IN, HIDDEN, HIDDEN, OUT});
}

static const clpar_adam_options adam = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};

static clpar_module *make_ddp(uint64_t seed, int zero_stage) {
  clpar_ddp_options o = {.zero_stage = zero_stage};
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(make_mlp(seed), &o, &ddp));
  return ddp;
}

/* Forward and backward of this rank's rows of batch k; the loss of the whole batch. */
static float forward_backward(clpar_module *m, int k) {
  float x[BATCH * IN], y[BATCH * OUT], loss;
  tu_wave_batch(k, x, BATCH * IN, y, BATCH * OUT);
  tu_rank_mse_backward(m, device(), x, y, BATCH, IN, OUT, &loss);
  if (clpar_dist_world_size() > 1) tu_ok(clpar_dist_all_reduce_mean(&loss, 1));
  return loss;
}

static float plain_step(clpar_module *m, clpar_optimizer *opt, int k) {
  tu_ok(clpar_optimizer_zero_grad(opt));
  float loss = forward_backward(m, k);
  tu_ok(clpar_optimizer_step(opt));
  return loss;
}

static float zero_step(clpar_module *m, clpar_zero_optimizer *opt, int k) {
  tu_ok(clpar_zero_optimizer_zero_grad(opt));
  float loss = forward_backward(m, k);
  tu_ok(clpar_zero_optimizer_step(opt));
  return loss;
}

static const clpar_sgd_options sgd = {
    .lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = 1};

/* SGD with Nesterov momentum, the same two ways: DIR/full_sgd.ckpt and DIR/sgdSTAGE. */
static void save_sgd(void) {
  clpar_module *m = make_ddp(2, 0), *z = make_ddp(2, stage);
  clpar_optimizer *opt;
  clpar_zero_optimizer *zo;
  tu_ok(clpar_sgd_create_for(m, &sgd, &opt));
  tu_ok(clpar_zero_sgd_create(z, &sgd, &zo));
  for (int k = 0; k < STEPS_BEFORE; k++) plain_step(m, opt, k), zero_step(z, zo, k);
  clpar_manual_seed(43);
  if (clpar_dist_rank() == 0)
    tu_ok(clpar_checkpoint_save(in_dir("full_sgd.ckpt", 0), m, opt, 3, 0));
  tu_ok(clpar_checkpoint_save_sharded_zero(in_dir("sgd%d", stage), z, zo, 3, 0));
  clpar_zero_optimizer_free(zo);
  clpar_optimizer_free(opt);
  clpar_module_free(z);
  clpar_module_free(m);
}

static void test_save(void **state) {
  (void)state;
  assert_int_equal(clpar_dist_world_size(), 2);
  clpar_module *m = make_ddp(1, 0);
  clpar_optimizer *opt;
  tu_ok(clpar_adam_create_for(m, &adam, &opt));
  for (int k = 0; k < STEPS_BEFORE; k++) plain_step(m, opt, k);
  clpar_manual_seed(42); /* the generator state both checkpoints hold */
  if (clpar_dist_rank() == 0) tu_ok(clpar_checkpoint_save(in_dir("full.ckpt", 0), m, opt, 3, 1));
  clpar_optimizer_free(opt);
  clpar_module_free(m);

  clpar_module *z = make_ddp(1, stage);
  clpar_zero_optimizer *zo;
  tu_ok(clpar_zero_adam_create(z, &adam, &zo));
  for (int k = 0; k < STEPS_BEFORE; k++) zero_step(z, zo, k);
  clpar_manual_seed(42);
  tu_ok(clpar_checkpoint_save_sharded_zero(in_dir("zero%d", stage), z, zo, 3, 1));
  assert_int_equal(access(in_dir("zero%d/model-00002-of-00002.safetensors", stage), R_OK), 0);
  float losses[STEPS_AFTER];
  for (int k = 0; k < STEPS_AFTER; k++) losses[k] = zero_step(z, zo, STEPS_BEFORE + k);
  if (clpar_dist_rank() == 0) {
    FILE *f = fopen(in_dir("losses%d.bin", stage), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(losses, sizeof losses, 1, f), 1);
    assert_int_equal(fclose(f), 0);
  }
  save_sgd();
  /* not a ZeRO module: refused on every rank before anything is written */
  clpar_module *plain = make_ddp(1, 0);
  assert_int_equal(clpar_checkpoint_save_sharded_zero(in_dir("x%d", 0), plain, zo, 0, 0),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_module_free(plain);
  clpar_zero_optimizer_free(zo);
  clpar_module_free(z);
}

/* Every parameter and buffer of a and b, and the plain optimizers' state, bit for bit. */
static void expect_identical(clpar_module *a, clpar_optimizer *oa, clpar_module *b,
                             clpar_optimizer *ob) {
  int n = clpar_module_parameter_count(a);
  assert_int_equal(clpar_module_parameter_count(b), n);
  for (int i = 0; i < n; i++) {
    clpar_tensor *ta, *tb;
    tu_ok(clpar_module_parameter_at(a, i, NULL, &ta));
    tu_ok(clpar_module_parameter_at(b, i, NULL, &tb));
    float *va = tu_read(ta), *vb = tu_read(tb);
    if (memcmp(va, vb, (size_t)clpar_tensor_numel(ta) * sizeof *va) != 0)
      fail_msg("rank %d: parameter %d differs", clpar_dist_rank(), i);
    free(va);
    free(vb);
  }
  if (!oa) return;
  for (int i = 0; i < n; i++) {
    assert_true(clpar_optimizer_steps_at(oa, i) == clpar_optimizer_steps_at(ob, i));
    for (int k = 0; k < 2; k++) {
      clpar_tensor *sa = clpar_optimizer_state_at(oa, i, k),
                   *sb = clpar_optimizer_state_at(ob, i, k);
      assert_true(sa && sb);
      float *va = tu_read(sa), *vb = tu_read(sb);
      if (memcmp(va, vb, (size_t)clpar_tensor_numel(sa) * sizeof *va) != 0)
        fail_msg("rank %d: optimizer state %d.%d differs", clpar_dist_rank(), i, k);
      free(va);
      free(vb);
    }
  }
}

/* z's parameters (ZeRO-3: all-gathered for the comparison, then released) against ref's. */
static void expect_params(clpar_module *z, clpar_module *ref) {
  if (stage == 3) tu_ok(clpar_zero_gather_parameters(z));
  expect_identical(z, NULL, ref, NULL);
  if (stage == 3) tu_ok(clpar_zero_release_parameters(z));
}

/* ZeRO-3: the units are the Linear layers (ref's parameters 2 u and 2 u + 1, weight then
 * bias), each cut into world shards; the rank's shard of each unit's state, padding zeros
 * included, equals the plain optimizer's state there. */
static void expect_shard3(clpar_optimizer *inner, clpar_optimizer *ref_opt, int kinds) {
  int world = clpar_dist_world_size(), rank = clpar_dist_rank();
  for (int u = 0; u < 3; u++) {
    assert_true(clpar_optimizer_steps_at(inner, u) == STEPS_BEFORE);
    for (int k = 0; k < kinds; k++) {
      clpar_tensor *w = clpar_optimizer_state_at(ref_opt, 2 * u, k),
                   *b = clpar_optimizer_state_at(ref_opt, 2 * u + 1, k);
      int64_t nw = clpar_tensor_numel(w), n = nw + clpar_tensor_numel(b);
      int64_t shard = (n + world - 1) / world;
      float *want = calloc((size_t)(shard * world), sizeof *want), *vw = tu_read(w),
            *vb = tu_read(b);
      memcpy(want, vw, (size_t)nw * sizeof *vw);
      memcpy(want + nw, vb, (size_t)(n - nw) * sizeof *vb);
      clpar_tensor *have_t = clpar_optimizer_state_at(inner, u, k);
      assert_int_equal(clpar_tensor_numel(have_t), shard);
      float *have = tu_read(have_t);
      if (memcmp(want + rank * shard, have, (size_t)shard * sizeof *have) != 0)
        fail_msg("rank %d: ZeRO-3 state %d of unit %d differs", rank, k, u);
      free(want);
      free(vw);
      free(vb);
      free(have);
    }
  }
}

/* The ZeRO optimizer's shard of the state equals the plain optimizer's state there. */
static void expect_shard(clpar_zero_optimizer *zo, clpar_module *ref, clpar_optimizer *ref_opt) {
  int64_t lo, len;
  clpar_zero_optimizer_shard(zo, &lo, &len);
  clpar_optimizer *inner = clpar_zero_optimizer_inner(zo);
  if (len == 0) return;
  assert_non_null(inner);
  clpar_adam_options got;
  clpar_sgd_options got_sgd;
  clpar_optimizer_options(inner, &got_sgd, &got);
  int is_sgd = strcmp(clpar_optimizer_kind(inner), "SGD") == 0;
  assert_true(is_sgd ? got_sgd.lr == sgd.lr && got_sgd.nesterov == 1
                     : got.lr == adam.lr && got.eps == adam.eps);
  if (stage == 3) {
    expect_shard3(inner, ref_opt, is_sgd ? 1 : 2);
    return;
  }
  assert_true(clpar_optimizer_steps_at(inner, 0) == STEPS_BEFORE);
  for (int k = 0; k < (is_sgd ? 1 : 2); k++) {
    float *want = calloc(1400, sizeof *want),
          *have = tu_read(clpar_optimizer_state_at(inner, 0, k));
    int64_t at = 0;
    for (int i = 0; i < clpar_module_parameter_count(ref); i++) {
      clpar_tensor *s = clpar_optimizer_state_at(ref_opt, i, k);
      float *v = tu_read(s);
      memcpy(want + at, v, (size_t)clpar_tensor_numel(s) * sizeof *v);
      at += clpar_tensor_numel(s);
      free(v);
    }
    assert_int_equal(at, 1399);
    if (memcmp(want + lo, have, (size_t)len * sizeof *have) != 0)
      fail_msg("rank %d: ZeRO state %d of [%lld, +%lld) differs", clpar_dist_rank(), k,
               (long long)lo, (long long)len);
    free(want);
    free(have);
  }
}

static void read_losses(float *want) {
  FILE *f = fopen(in_dir("losses%d.bin", stage), "rb");
  assert_non_null(f);
  assert_int_equal(fread(want, sizeof(float) * STEPS_AFTER, 1, f), 1);
  fclose(f);
}

static void expect_losses(float got, float want, int k, int exact, const char *who) {
  if (exact && memcmp(&got, &want, sizeof got) != 0)
    fail_msg("%s, step %d: loss %.9g, the uninterrupted run's %.9g", who, k, got, want);
  if (fabsf(got - want) > 1e-5f * fabsf(want) + 1e-7f)
    fail_msg("%s, rank %d of %d, step %d: loss %.9g, the uninterrupted run's %.9g", who,
             clpar_dist_rank(), clpar_dist_world_size(), k, got, want);
}

static void test_load(void **state) {
  (void)state;
  int world = clpar_dist_world_size();
  float want[STEPS_AFTER];
  read_losses(want);
  clpar_adam_options other = adam;
  other.lr = 0.5f; /* the load restores the saved options */
  /* the plain DDP run's checkpoint, in one process: the reference */
  clpar_module *ref = make_mlp(7), *p = make_mlp(8);
  clpar_optimizer *ref_opt, *po;
  tu_ok(clpar_adam_create_for(ref, &adam, &ref_opt));
  tu_ok(clpar_adam_create_for(p, &other, &po));
  tu_ok(clpar_checkpoint_load(in_dir("full.ckpt", 0), ref, ref_opt, NULL, NULL));
  uint64_t seed, counter, want_seed, want_counter;
  clpar_manual_seed(42);
  clpar_rng_state_get(&want_seed, &want_counter);
  /* into plain Adam in one process */
  int64_t step = -1, epoch = -1;
  tu_ok(clpar_checkpoint_load_sharded(in_dir("zero%d", stage), p, po, &step, &epoch));
  assert_true(step == STEPS_BEFORE && epoch == 1);
  expect_identical(p, po, ref, ref_opt);
  for (int k = 0; world == 1 && k < STEPS_AFTER; k++)
    expect_losses(plain_step(p, po, STEPS_BEFORE + k), want[k], k, 0, "plain Adam");
  /* into a ZeRO job of this world size */
  clpar_module *z = make_ddp(8, stage);
  clpar_zero_optimizer *zo;
  tu_ok(clpar_zero_adam_create(z, &other, &zo));
  clpar_manual_seed(1234);
  step = epoch = -1;
  tu_ok(clpar_checkpoint_load_sharded_zero(in_dir("zero%d", stage), z, zo, &step, &epoch));
  clpar_rng_state_get(&seed, &counter);
  assert_true(step == STEPS_BEFORE && epoch == 1);
  assert_true(seed == want_seed && counter == want_counter);
  expect_params(z, ref);
  expect_shard(zo, ref, ref_opt);
  for (int k = 0; k < STEPS_AFTER; k++)
    expect_losses(zero_step(z, zo, STEPS_BEFORE + k), want[k], k, world == 2, "ZeRO");
  clpar_zero_optimizer_free(zo);
  clpar_module_free(z);
  clpar_optimizer_free(po);
  clpar_optimizer_free(ref_opt);
  clpar_module_free(p);
  clpar_module_free(ref);
}

/* The plain DDP run's file loads into ZeRO too; the same file with one parameter's step count
 * changed is refused, naming it, and changes nothing. */
static void test_load_file(void **state) {
  (void)state;
  clpar_module *ref = make_mlp(7);
  clpar_optimizer *ref_opt, *ref_opt_sgd;
  tu_ok(clpar_adam_create_for(ref, &adam, &ref_opt));
  tu_ok(clpar_checkpoint_load(in_dir("full.ckpt", 0), ref, ref_opt, NULL, NULL));
  FILE *f = fopen(in_dir("full.ckpt", 0), "rb");
  assert_non_null(f);
  static char buf[1 << 16];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  assert_true(len > 0 && len < sizeof buf);
  const char *key = "\"optimizer.state.1.step\":\"3\"";
  char *at = memmem(buf, len, key, strlen(key));
  assert_non_null(at);
  at[strlen(key) - 2] = '2';
  const char *uneven = in_dir("uneven%d.ckpt", clpar_dist_rank());
  f = fopen(uneven, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  assert_int_equal(fclose(f), 0);

  clpar_module *z = make_ddp(8, stage), *fresh = make_mlp(8);
  clpar_zero_optimizer *zo;
  tu_ok(clpar_zero_adam_create(z, &adam, &zo));
  clpar_status s = clpar_checkpoint_load_sharded_zero(uneven, z, zo, NULL, NULL);
  if (s != CLPAR_ERROR_INVALID_ARGUMENT || !strstr(clpar_last_error(), "parameter 1 took 2"))
    fail_msg("%s \"%s\"", clpar_status_name(s), clpar_last_error());
  expect_params(z, fresh);
  assert_int_equal(clpar_checkpoint_load_sharded_zero(in_dir("full.ckpt", 0), z, zo, NULL, NULL),
                   CLPAR_OK);
  expect_params(z, ref);
  expect_shard(zo, ref, ref_opt);
  unlink(uneven);
  /* another optimizer's state: refused */
  s = clpar_checkpoint_load_sharded_zero(in_dir("sgd%d", stage), z, zo, NULL, NULL);
  if (s != CLPAR_ERROR_INVALID_ARGUMENT || !strstr(clpar_last_error(), "holds the state of SGD"))
    fail_msg("%s \"%s\"", clpar_status_name(s), clpar_last_error());
  expect_params(z, ref);
  clpar_zero_optimizer_free(zo);
  /* SGD with momentum: its momentum buffers and options */
  clpar_sgd_options other = sgd;
  other.nesterov = 0;
  tu_ok(clpar_sgd_create_for(ref, &sgd, &ref_opt_sgd));
  tu_ok(clpar_checkpoint_load(in_dir("full_sgd.ckpt", 0), ref, ref_opt_sgd, NULL, NULL));
  tu_ok(clpar_zero_sgd_create(z, &other, &zo));
  tu_ok(clpar_checkpoint_load_sharded_zero(in_dir("sgd%d", stage), z, zo, NULL, NULL));
  expect_params(z, ref);
  expect_shard(zo, ref, ref_opt_sgd);
  clpar_optimizer_free(ref_opt_sgd);
  clpar_zero_optimizer_free(zo);
  clpar_module_free(fresh);
  clpar_module_free(z);
  clpar_optimizer_free(ref_opt);
  clpar_module_free(ref);
}

/* The ZeRO checkpoint consolidated is the plain DDP run's file, byte for byte. */
static void expect_consolidated(const char *sharded, const char *full) {
  const char *out = in_dir("consolidated%d.safetensors", stage);
  tu_ok(clpar_checkpoint_consolidate(sharded, out));
  size_t a_len, b_len;
  char *a = tu_slurp(out, &a_len), *b = tu_slurp(full, &b_len);
  assert_int_equal(a_len, b_len);
  assert_memory_equal(a, b, a_len);
  free(a);
  free(b);
}

static void test_consolidate(void **state) {
  (void)state;
  expect_consolidated(in_dir("zero%d", stage), in_dir("full.ckpt", 0));
  expect_consolidated(in_dir("sgd%d", stage), in_dir("full_sgd.ckpt", 0));
}

int main(int argc, char **argv) {
  if (argc != 4 || atoi(argv[3]) < 1 || atoi(argv[3]) > 3) {
    fprintf(stderr, "usage: test_checkpoint_zero save|load|hostile DIR 1|2|3\n");
    return 2;
  }
  dir = argv[2];
  stage = atoi(argv[3]);
  const struct CMUnitTest save[] = {cmocka_unit_test(test_save)};
  const struct CMUnitTest load[] = {cmocka_unit_test(test_load), cmocka_unit_test(test_load_file)};
  const struct CMUnitTest hostile[] = {cmocka_unit_test(test_consolidate)};
  if (strcmp(argv[1], "save") == 0)
    return cmocka_run_group_tests_name("checkpoint_zero_save", save, tu_dist_setup,
                                       tu_dist_teardown);
  if (strcmp(argv[1], "load") == 0)
    return cmocka_run_group_tests_name("checkpoint_zero_load", load, tu_dist_setup,
                                       tu_dist_teardown);
  return cmocka_run_group_tests_name("checkpoint_zero_hostile", hostile, tu_setup, tu_teardown);
}
