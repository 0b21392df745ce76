/* test_checkpoint_sharded.c — sharded training checkpoints, run by tests/checkpoint_sharded.sh:
 *
 *   save DIR   (2 ranks) trains an MLP with DDP and Adam for 3 steps, saves a sharded
 *              checkpoint (DIR/sharded) and, on rank 0, the same as one file (DIR/full.ckpt),
 *              then trains 3 steps more and keeps their losses (DIR/losses.bin);
 *   load DIR   (1 to 4 ranks) loads DIR/sharded into a fresh model and optimizer: the same
 *              parameters, optimizer state and generator state, bit for bit, as
 *              clpar_checkpoint_load of DIR/full.ckpt; 3 more steps give the saved losses
 *              (bit for bit on 2 ranks; within float rounding of the gradient mean on others);
 *   hostile DIR (1 process, no MPI) consolidates DIR/sharded (equal to DIR/full.ckpt byte for
 * byte), then loads damaged copies of it: missing file, names outside the directory, wrong shapes,
 * truncated shard, a shard of another save, wrong total_size, bytes flipped at random; each a clear
 * error, and the model left unchanged. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

enum { IN = 8, HIDDEN = 32, OUT = 4, BATCH = 24, STEPS_BEFORE = 3, STEPS_AFTER = 3 };

static const char *dir; /* argv[2] */
static char path_buf[4][1024];

/* DIR/name (4 buffers in turn). */
static const char *in_dir(const char *name) {
  static int next;
  char *p = path_buf[next++ % 4];
  snprintf(p, sizeof path_buf[0], "%s/%s", dir, name);
  return p;
}

/* The rank's device in a job; the first device in a process outside one (hostile). */
static clpar_device *device(void) {
  return clpar_dist_device() ? clpar_dist_device() : clpar_device_get(0);
}

static clpar_module *make_mlp(uint64_t seed, int hidden) {
  return tu_mlp(device(), seed, 4, (int64_t[]){IN, hidden, hidden, OUT});
}

static clpar_optimizer *make_adam(clpar_module *m) {
  clpar_adam_options o = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  clpar_optimizer *opt;
  tu_ok(clpar_adam_create_for(m, &o, &opt));
  return opt;
}

/* One Adam step on this rank's rows of batch k; the loss of the whole batch (the mean over
 * the ranks of each one's mean). */
static float train_step(clpar_module *m, clpar_optimizer *opt, int k) {
  float x[BATCH * IN], y[BATCH * OUT], loss;
  tu_wave_batch(k, x, BATCH * IN, y, BATCH * OUT);
  tu_ok(clpar_optimizer_zero_grad(opt));
  tu_rank_mse_backward(m, clpar_dist_device(), x, y, BATCH, IN, OUT, &loss);
  tu_ok(clpar_optimizer_step(opt));
  if (clpar_dist_world_size() > 1) tu_ok(clpar_dist_all_reduce_mean(&loss, 1));
  return loss;
}

static clpar_module *wrap(clpar_module *m) {
  if (clpar_dist_world_size() == 1) return m;
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(m, NULL, &ddp));
  return ddp;
}

static void test_save(void **state) {
  (void)state;
  int rank = clpar_dist_rank();
  assert_int_equal(clpar_dist_world_size(), 2);
  clpar_module *m = wrap(make_mlp(1, HIDDEN));
  clpar_optimizer *opt = make_adam(m);
  for (int k = 0; k < STEPS_BEFORE; k++) train_step(m, opt, k);
  /* the ranks' generators differ (as when each seeds its own dropout): rank 0's is saved */
  if (rank == 1) clpar_manual_seed(999);
  tu_ok(clpar_checkpoint_save_sharded(in_dir("sharded"), m, opt, STEPS_BEFORE, 1));
  if (rank == 0) tu_ok(clpar_checkpoint_save(in_dir("full.ckpt"), m, opt, STEPS_BEFORE, 1));
  /* both ranks wrote a shard; the index names both */
  assert_int_equal(access(in_dir("sharded/model-00001-of-00002.safetensors"), R_OK), 0);
  assert_int_equal(access(in_dir("sharded/model-00002-of-00002.safetensors"), R_OK), 0);
  assert_int_equal(access(in_dir("sharded/model.safetensors.index.json"), R_OK), 0);
  /* balanced: apart from their headers (under 1 KiB here), the shards differ by at most the
   * largest tensor, 2.weight's 4 KiB, out of 17 KiB */
  struct stat a, b;
  assert_int_equal(stat(in_dir("sharded/model-00001-of-00002.safetensors"), &a), 0);
  assert_int_equal(stat(in_dir("sharded/model-00002-of-00002.safetensors"), &b), 0);
  assert_true(llabs((long long)a.st_size - (long long)b.st_size) < 4096 + 1024);
  /* ranks with different models: refused on both, and the checkpoint there is kept */
  clpar_module *other = make_mlp(5, HIDDEN / 2);
  clpar_status s = clpar_checkpoint_save_sharded(in_dir("sharded"), rank ? other : m, NULL, 0, 0);
  if (s != CLPAR_ERROR_INVALID_ARGUMENT || !strstr(clpar_last_error(), "other tensors"))
    fail_msg("rank %d: %s \"%s\"", rank, clpar_status_name(s), clpar_last_error());
  assert_int_equal(access(in_dir("sharded/model.safetensors.index.json"), R_OK), 0);
  clpar_module_free(other);
  float losses[STEPS_AFTER];
  for (int k = 0; k < STEPS_AFTER; k++) losses[k] = train_step(m, opt, STEPS_BEFORE + k);
  if (rank == 0) {
    FILE *f = fopen(in_dir("losses.bin"), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(losses, sizeof losses, 1, f), 1);
    assert_int_equal(fclose(f), 0);
  }
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

/* Each state tensor of a and b, and each optimizer state tensor and step count, bit for bit. */
static void expect_identical(clpar_module *a, clpar_optimizer *oa, clpar_module *b,
                             clpar_optimizer *ob) {
  int n = clpar_module_state_count(a);
  assert_int_equal(clpar_module_state_count(b), n);
  for (int i = 0; i < n; i++) {
    const char *na, *nb;
    clpar_tensor *ta, *tb;
    tu_ok(clpar_module_state_at(a, i, &na, &ta, NULL));
    tu_ok(clpar_module_state_at(b, i, &nb, &tb, NULL));
    float *va = tu_read(ta), *vb = tu_read(tb);
    if (memcmp(va, vb, (size_t)clpar_tensor_numel(ta) * sizeof *va) != 0)
      fail_msg("rank %d: %s differs", clpar_dist_rank(), na);
    free(va);
    free(vb);
  }
  n = clpar_optimizer_size(oa);
  assert_int_equal(clpar_optimizer_size(ob), n);
  for (int i = 0; i < n; i++) {
    assert_true(clpar_optimizer_steps_at(oa, i) == clpar_optimizer_steps_at(ob, i));
    for (int k = 0; k < 2; k++) {
      clpar_tensor *sa = clpar_optimizer_state_at(oa, i, k),
                   *sb = clpar_optimizer_state_at(ob, i, k);
      assert_true((sa == NULL) == (sb == NULL));
      if (!sa) continue;
      float *va = tu_read(sa), *vb = tu_read(sb);
      if (memcmp(va, vb, (size_t)clpar_tensor_numel(sa) * sizeof *va) != 0)
        fail_msg("rank %d: optimizer state %d.%d differs", clpar_dist_rank(), i, k);
      free(va);
      free(vb);
    }
  }
}

static void test_load(void **state) {
  (void)state;
  int world = clpar_dist_world_size();
  clpar_module *ref = make_mlp(7, HIDDEN), *m = make_mlp(8, HIDDEN);
  clpar_optimizer *ref_opt = make_adam(ref), *opt = make_adam(m);
  int64_t step = -1, epoch = -1, ref_step, ref_epoch;
  uint64_t seed, counter, ref_seed, ref_counter;
  tu_ok(clpar_checkpoint_load(in_dir("full.ckpt"), ref, ref_opt, &ref_step, &ref_epoch));
  clpar_rng_state_get(&ref_seed, &ref_counter);
  clpar_manual_seed(12345); /* the load must restore the generator */
  tu_ok(clpar_checkpoint_load_sharded(in_dir("sharded"), m, opt, &step, &epoch));
  clpar_rng_state_get(&seed, &counter);
  assert_true(step == STEPS_BEFORE && epoch == 1 && ref_step == step && ref_epoch == epoch);
  assert_true(seed == ref_seed && counter == ref_counter);
  expect_identical(m, opt, ref, ref_opt);

  float want[STEPS_AFTER];
  FILE *f = fopen(in_dir("losses.bin"), "rb");
  assert_non_null(f);
  assert_int_equal(fread(want, sizeof want, 1, f), 1);
  fclose(f);
  clpar_module *run = wrap(m);
  for (int k = 0; k < STEPS_AFTER; k++) {
    float got = train_step(run, opt, STEPS_BEFORE + k);
    if (world == 2 && memcmp(&got, &want[k], sizeof got) != 0)
      fail_msg("step %d: loss %.9g, the uninterrupted run's %.9g", k, got, want[k]);
    /* other world sizes sum the rows' gradients in another order */
    if (fabsf(got - want[k]) > 1e-5f * fabsf(want[k]) + 1e-7f)
      fail_msg("rank %d of %d, step %d: loss %.9g, the uninterrupted run's %.9g", clpar_dist_rank(),
               world, k, got, want[k]);
  }
  clpar_optimizer_free(opt);
  clpar_optimizer_free(ref_opt);
  clpar_module_free(run);
  clpar_module_free(ref);
}

/* ---- damaged copies ---- */

static void spill(const char *path, const char *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

static const char *const files[] = {"model.safetensors.index.json",
                                    "model-00001-of-00002.safetensors",
                                    "model-00002-of-00002.safetensors"};

/* DIR/<name>: a fresh copy of DIR/sharded. */
static const char *copy_of_sharded(const char *name) {
  static char dst[1024];
  snprintf(dst, sizeof dst, "%s/%s", dir, name);
  tu_remove_dir(dst);
  assert_int_equal(mkdir(dst, 0777), 0);
  for (int i = 0; i < 3; i++) {
    char from[1200], to[1200];
    snprintf(from, sizeof from, "%s/sharded/%s", dir, files[i]);
    snprintf(to, sizeof to, "%s/%s", dst, files[i]);
    size_t len;
    char *buf = tu_slurp(from, &len);
    spill(to, buf, len);
    free(buf);
  }
  return dst;
}

/* The first old in dir's file name replaced by new. */
static void edit(const char *d, const char *name, const char *old, const char *new) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s", d, name);
  size_t len;
  char *buf = tu_slurp(path, &len), *at = strstr(buf, old);
  assert_non_null(at);
  size_t head = (size_t)(at - buf), tail = len - head - strlen(old);
  char *out = malloc(len + strlen(new) + 1);
  memcpy(out, buf, head);
  memcpy(out + head, new, strlen(new));
  memcpy(out + head + strlen(new), at + strlen(old), tail);
  spill(path, out, head + strlen(new) + tail);
  free(out);
  free(buf);
}

/* Loading d fails with status want and a message holding what; the model is unchanged. */
static void expect_refused(const char *d, clpar_status want, const char *what) {
  clpar_module *m = make_mlp(8, HIDDEN), *before = make_mlp(8, HIDDEN);
  clpar_optimizer *opt = make_adam(m), *opt_before = make_adam(before);
  clpar_status s = clpar_checkpoint_load_sharded(d, m, opt, NULL, NULL);
  if (s != want || !strstr(clpar_last_error(), what))
    fail_msg("%s: %s \"%s\"; expected %s naming \"%s\"", d, clpar_status_name(s),
             clpar_last_error(), clpar_status_name(want), what);
  expect_identical(m, opt, before, opt_before);
  clpar_optimizer_free(opt);
  clpar_optimizer_free(opt_before);
  clpar_module_free(m);
  clpar_module_free(before);
}

static void test_consolidate_equals_unsharded_save(void **state) {
  (void)state;
  tu_ok(clpar_checkpoint_consolidate(in_dir("sharded"), in_dir("consolidated.safetensors")));
  size_t a_len, b_len;
  char *a = tu_slurp(in_dir("consolidated.safetensors"), &a_len),
       *b = tu_slurp(in_dir("full.ckpt"), &b_len);
  assert_int_equal(a_len, b_len);
  assert_memory_equal(a, b, a_len);
  free(a);
  free(b);
  assert_int_equal(clpar_checkpoint_consolidate(in_dir("nothing-here"), in_dir("x")),
                   CLPAR_ERROR_IO);
}

static void test_hostile_files(void **state) {
  (void)state;
  const char *d = copy_of_sharded("h_missing");
  unlink(in_dir("h_missing/model-00002-of-00002.safetensors"));
  expect_refused(d, CLPAR_ERROR_IO, "model-00002-of-00002.safetensors");
  d = copy_of_sharded("h_no_index");
  unlink(in_dir("h_no_index/model.safetensors.index.json"));
  expect_refused(d, CLPAR_ERROR_IO, "model.safetensors.index.json");
  /* a whole training checkpoint one level up, named through ".." or an absolute path */
  const char *outside[][2] = {{"\"../full.ckpt\"", "not a plain name inside the directory"},
                              {"\"/etc/passwd\"", "not a plain name inside the directory"},
                              {"\"..\"", "not a plain name inside the directory"},
                              {"\"\"", "not a plain name inside the directory"},
                              {"\"a\\u0000b\"", "not JSON"}};
  for (int i = 0; i < 5; i++) {
    d = copy_of_sharded("h_escape");
    edit(d, files[0], "\"model-00001-of-00002.safetensors\"", outside[i][0]);
    expect_refused(d, CLPAR_ERROR_CORRUPT, outside[i][1]);
  }
  d = copy_of_sharded("h_truncated");
  size_t len;
  char *buf = tu_slurp(in_dir("h_truncated/model-00001-of-00002.safetensors"), &len);
  spill(in_dir("h_truncated/model-00001-of-00002.safetensors"), buf, len - 4);
  free(buf);
  expect_refused(d, CLPAR_ERROR_CORRUPT, "model-00001-of-00002.safetensors");
}

static void test_hostile_index(void **state) {
  (void)state;
  const char *d = copy_of_sharded("h_total");
  edit(d, files[0], "\"total_size\": ", "\"total_size\": 9");
  expect_refused(d, CLPAR_ERROR_CORRUPT, "total_size");
  d = copy_of_sharded("h_id"); /* the index of another save */
  edit(d, files[0], "\"shard.id\": \"", "\"shard.id\": \"x");
  expect_refused(d, CLPAR_ERROR_CORRUPT, "mixes two saves");
  d = copy_of_sharded("h_moved"); /* a tensor mapped to the other shard */
  edit(d, files[0], "model-00002-of-00002", "model-00001-of-00002");
  expect_refused(d, CLPAR_ERROR_CORRUPT, "model-00001-of-00002.safetensors");
  d = copy_of_sharded("h_duplicate");
  edit(d, files[0], "\"weight_map\": {", "\"weight_map\": {\"model.module.0.bias\": \"x\", ");
  expect_refused(d, CLPAR_ERROR_CORRUPT, "duplicate");
  d = copy_of_sharded("h_not_json");
  spill(in_dir("h_not_json/model.safetensors.index.json"), "{", 1);
  expect_refused(d, CLPAR_ERROR_CORRUPT, "not JSON");
  d = copy_of_sharded("h_layout");
  spill(in_dir("h_layout/model.safetensors.index.json"), "[1]", 3);
  expect_refused(d, CLPAR_ERROR_CORRUPT, "not an index");
  d = copy_of_sharded("h_meta"); /* a shard whose metadata is not the index's */
  edit(d, files[0], "\"optimizer.lr\": \"", "\"optimizer.lr\": \"1");
  expect_refused(d, CLPAR_ERROR_CORRUPT, "differs from the index's");
}

/* A valid checkpoint of another model: shapes named, nothing loaded (saved here by a job of
 * one process, which writes a single shard). */
static void test_wrong_shapes(void **state) {
  (void)state;
  clpar_module *other = make_mlp(3, HIDDEN / 2);
  clpar_optimizer *opt = make_adam(other);
  char d[1024];
  snprintf(d, sizeof d, "%s/h_shapes", dir);
  tu_ok(clpar_checkpoint_save_sharded(d, other, opt, 0, 0));
  assert_int_equal(access(in_dir("h_shapes/model-00001-of-00001.safetensors"), R_OK), 0);
  expect_refused(d, CLPAR_ERROR_SHAPE_MISMATCH, "model.2.weight (F32 [16, 16] in the file");
  clpar_optimizer_free(opt);
  clpar_module_free(other);
}

/* A save that fails part way (here the shard cannot be renamed into place) leaves no index,
 * so the directory holds no checkpoint rather than the old index over new shards. */
static void test_failed_save_leaves_no_checkpoint(void **state) {
  (void)state;
  clpar_module *m = make_mlp(3, HIDDEN);
  clpar_optimizer *opt = make_adam(m);
  char d[1024];
  snprintf(d, sizeof d, "%s/h_failed_save", dir);
  tu_ok(clpar_checkpoint_save_sharded(d, m, opt, 1, 0));
  tu_ok(clpar_checkpoint_load_sharded(d, m, opt, NULL, NULL));
  const char *shard = in_dir("h_failed_save/model-00001-of-00001.safetensors");
  assert_int_equal(unlink(shard), 0);
  assert_int_equal(mkdir(shard, 0777), 0);
  assert_int_equal(clpar_checkpoint_save_sharded(d, m, opt, 2, 0), CLPAR_ERROR_IO);
  assert_int_equal(access(in_dir("h_failed_save/model.safetensors.index.json"), F_OK), -1);
  expect_refused(d, CLPAR_ERROR_IO, "model.safetensors.index.json");
  rmdir(shard);
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

/* Random bytes changed in the index or a shard's header: an error or a load, never a crash
 * (ASan checks the reads). */
static void test_random_damage(void **state) {
  (void)state;
  clpar_module *m = make_mlp(8, HIDDEN);
  clpar_optimizer *opt = make_adam(m);
  uint64_t r = 0x9e3779b97f4a7c15ull;
  int refused = 0;
  for (int trial = 0; trial < 200; trial++) {
    const char *d = copy_of_sharded("h_random");
    int which = trial % 3;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", d, files[which]);
    size_t len;
    char *buf = tu_slurp(path, &len);
    for (int k = 0; k < 1 + trial % 4; k++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      size_t at = (size_t)(r >> 33) % (which ? (len < 600 ? len : 600) : len);
      buf[at] = (char)(r >> 20);
    }
    spill(path, buf, len);
    free(buf);
    refused += clpar_checkpoint_load_sharded(d, m, opt, NULL, NULL) != CLPAR_OK;
  }
  assert_true(refused > 100); /* most damage is caught; the rest changed nothing checked */
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_checkpoint_sharded save|load|hostile DIR\n");
    return 2;
  }
  dir = argv[2];
  const struct CMUnitTest save[] = {cmocka_unit_test(test_save)};
  const struct CMUnitTest load[] = {cmocka_unit_test(test_load)};
  const struct CMUnitTest hostile[] = {
      cmocka_unit_test(test_consolidate_equals_unsharded_save),
      cmocka_unit_test(test_hostile_files),
      cmocka_unit_test(test_hostile_index),
      cmocka_unit_test(test_wrong_shapes),
      cmocka_unit_test(test_failed_save_leaves_no_checkpoint),
      cmocka_unit_test(test_random_damage),
  };
  if (strcmp(argv[1], "save") == 0)
    return cmocka_run_group_tests_name("checkpoint_sharded_save", save, tu_dist_setup,
                                       tu_dist_teardown);
  if (strcmp(argv[1], "load") == 0)
    return cmocka_run_group_tests_name("checkpoint_sharded_load", load, tu_dist_setup,
                                       tu_dist_teardown);
  /* outside MPI: the save makes a job of one, and leak checkers see no MPI library */
  return cmocka_run_group_tests_name("checkpoint_sharded_hostile", hostile, tu_setup, tu_teardown);
}
