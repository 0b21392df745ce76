/* test_activation_checkpoint.c — activation checkpointing (include/clpar/recompute.h):
 * transformer blocks with dropout, each wrapped, against the same blocks unwrapped (same
 * seed, so the same weights and Dropout seeds): outputs and every parameter's gradient must
 * be the same bits, on the selected non-host device and on the host, in a Sequential, nested,
 * through the whole GPT (clpar_gpt_checkpoint_blocks), under DataParallel on two devices and
 * in a two-stage pipeline (GPipe and 1F1B). Two forwards run before each backward, so the
 * Dropouts' offsets move on between a block's forward and its recompute (the recorded draws
 * must be replayed). Also: the peak memory of a step is lower, and the errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { B = 4, T = 8, C = 16, NH = 2, BLOCKS = 4, VOCAB = 32 };

static const clpar_block_config block_config = {C, NH, 0.25f, 1};

/* n blocks from one seed (the same weights and Dropout seeds every time), each wrapped by
 * clpar_activation_checkpoint_create when wrap is set. */
static void make_block_array(clpar_device *dev, int n, int wrap, clpar_module **b) {
  clpar_manual_seed(7);
  for (int i = 0; i < n; i++) {
    tu_ok(clpar_transformer_block_create(&block_config, dev, &b[i]));
    if (wrap) tu_ok(clpar_activation_checkpoint_create(b[i], &b[i]));
  }
}

/* A Sequential of n blocks. kind 0: plain; 1: each block wrapped; 2: wrapped by
 * clpar_activation_checkpoint_children; 3: as 1, and the whole Sequential wrapped again. */
static clpar_module *make_blocks(clpar_device *dev, int n, int kind) {
  clpar_module *b[16], *seq;
  make_block_array(dev, n, kind == 1 || kind == 3, b);
  tu_ok(clpar_sequential_create(b, n, &seq));
  if (kind == 2) tu_ok(clpar_activation_checkpoint_children(seq));
  if (kind == 3) {
    clpar_module *inner = seq;
    tu_ok(clpar_activation_checkpoint_create(inner, &seq));
  }
  return seq;
}

static void expect_same_bits(const float *a, const float *b, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof *a) != 0)
      fail_msg("%s: element %zu is %.9g with checkpointing, %.9g without", what, i, (double)a[i],
               (double)b[i]);
}

/* Every parameter's name and gradient of a and b (checkpointed and plain) agree exactly. */
static void expect_same_grads(clpar_module *a, clpar_module *b, const char *what) {
  int n = clpar_module_parameter_count(b);
  assert_int_equal(clpar_module_parameter_count(a), n);
  assert_true(n > 0);
  for (int i = 0; i < n; i++) {
    const char *na, *nb;
    clpar_tensor *pa, *pb;
    tu_ok(clpar_module_parameter_at(a, i, &na, &pa));
    tu_ok(clpar_module_parameter_at(b, i, &nb, &pb));
    assert_string_equal(na, nb);
    assert_non_null(clpar_tensor_grad(pb));
    if (!clpar_tensor_grad(pa)) fail_msg("%s: %s has no gradient with checkpointing", what, na);
    float *ga = tu_read(clpar_tensor_grad(pa)), *gb = tu_read(clpar_tensor_grad(pb));
    char w[256];
    snprintf(w, sizeof w, "%s, gradient of %s", what, na);
    expect_same_bits(ga, gb, (size_t)clpar_tensor_numel(pb), w);
    free(ga);
    free(gb);
  }
}

/* Two batches forwarded, then one backward of the sum of their MSE losses; the first
 * output's values returned (malloc'ed). */
static float *two_forwards_one_backward(clpar_module *m, clpar_device *dev, uint64_t seed) {
  clpar_scope *scope = clpar_scope_begin();
  const int64_t shape[3] = {B, T, C};
  clpar_tensor *loss = NULL, *first = NULL;
  for (int k = 0; k < 2; k++) {
    clpar_tensor *x = tu_make(dev, 3, shape, seed + 10 * (uint64_t)k), *y, *t, *l;
    tu_ok(clpar_module_forward(m, x, &y));
    t = tu_make(clpar_tensor_device(y), 3, shape, seed + 10 * (uint64_t)k + 1);
    tu_ok(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &l));
    if (loss)
      tu_ok(clpar_add(loss, l, &loss));
    else
      loss = l;
    if (!first) first = y;
  }
  tu_ok(clpar_backward(loss));
  float *out = tu_read(first);
  clpar_scope_end(scope);
  return out;
}

/* Two steps (gradients zeroed before each) of plain against checkpointed blocks of kind. */
static void check_blocks(clpar_device *dev, int kind) {
  clpar_module *plain = make_blocks(dev, BLOCKS, 0), *ck = make_blocks(dev, BLOCKS, kind);
  char what[128];
  for (int step = 0; step < 2; step++) {
    tu_ok(clpar_module_zero_grad(plain));
    tu_ok(clpar_module_zero_grad(ck));
    float *a = two_forwards_one_backward(ck, dev, 100 + (uint64_t)step);
    float *b = two_forwards_one_backward(plain, dev, 100 + (uint64_t)step);
    snprintf(what, sizeof what, "%s, kind %d, step %d", clpar_device_id(dev), kind, step);
    expect_same_bits(a, b, (size_t)B * T * C, what);
    expect_same_grads(ck, plain, what);
    free(a);
    free(b);
  }
  clpar_module_free(plain);
  clpar_module_free(ck);
}

static void for_each_device(void (*check)(clpar_device *, int), int kind) {
  clpar_device *dev = tu_non_host();
  if (dev) check(dev, kind);
  check(tu_host(), kind);
}

static void test_blocks_bit_identical(void **state) {
  (void)state;
  for_each_device(check_blocks, 1);
}

static void test_children_helper_bit_identical(void **state) {
  (void)state;
  for_each_device(check_blocks, 2);
}

static void test_nested_bit_identical(void **state) {
  (void)state;
  for_each_device(check_blocks, 3);
}

/* The GPT with every block checkpointed (clpar_gpt_checkpoint_blocks) against the plain one:
 * cross-entropy of next tokens, one step. */
static clpar_module *make_gpt(clpar_device *dev, int ckpt) {
  clpar_gpt_config c = {T, VOCAB, BLOCKS, NH, C, 0.25f, 1};
  clpar_module *m;
  clpar_manual_seed(3);
  tu_ok(clpar_gpt_create(&c, dev, &m));
  if (ckpt) tu_ok(clpar_gpt_checkpoint_blocks(m));
  return m;
}

static float *gpt_step(clpar_module *m, clpar_device *dev) {
  int32_t ids[B * T], next[B * T];
  for (int i = 0; i < B * T; i++) {
    ids[i] = (int32_t)((i * 7 + 3) % VOCAB);
    next[i] = (int32_t)((i * 5 + 1) % VOCAB);
  }
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *t, *logits, *loss;
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, (int64_t[]){B, T}, ids, &x));
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, (int64_t[]){B, T}, next, &t));
  tu_ok(clpar_module_forward(m, x, &logits));
  tu_ok(clpar_cross_entropy_targets(logits, t, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, &loss));
  tu_ok(clpar_backward(loss));
  float *out = tu_read(logits);
  clpar_scope_end(scope);
  return out;
}

static void check_gpt(clpar_device *dev, int unused) {
  (void)unused;
  clpar_module *plain = make_gpt(dev, 0), *ck = make_gpt(dev, 1);
  clpar_module *blk =
      clpar_module_child(clpar_module_child(clpar_module_child(ck, "transformer"), "h"), "0");
  assert_string_equal(clpar_module_type(blk), "ActivationCheckpoint");
  float *a = gpt_step(ck, dev), *b = gpt_step(plain, dev);
  char what[128];
  snprintf(what, sizeof what, "GPT on %s", clpar_device_id(dev));
  expect_same_bits(a, b, (size_t)B * T * VOCAB, what);
  expect_same_grads(ck, plain, what);
  free(a);
  free(b);
  clpar_module_free(plain);
  clpar_module_free(ck);
}

static void test_gpt_blocks_bit_identical(void **state) {
  (void)state;
  for_each_device(check_gpt, 0);
}

/* Two devices: the first selected non-host device (else the host) and another one. */
static int two_devices(clpar_device **devs) {
  devs[0] = tu_non_host() ? tu_non_host() : tu_host();
  devs[1] = tu_second_device(devs[0]);
  return devs[1] != NULL;
}

static void test_data_parallel_bit_identical(void **state) {
  (void)state;
  clpar_device *devs[2];
  if (!two_devices(devs)) skip();
  clpar_data_parallel_options o = {devs, 2, NULL, NULL};
  clpar_module *plain, *ck;
  tu_ok(clpar_data_parallel_create(make_blocks(devs[0], BLOCKS, 0), &o, &plain));
  tu_ok(clpar_data_parallel_create(make_blocks(devs[0], BLOCKS, 1), &o, &ck));
  for (int step = 0; step < 2; step++) {
    tu_ok(clpar_module_zero_grad(plain));
    tu_ok(clpar_module_zero_grad(ck));
    float *a = two_forwards_one_backward(ck, devs[0], 200 + (uint64_t)step);
    float *b = two_forwards_one_backward(plain, devs[0], 200 + (uint64_t)step);
    expect_same_bits(a, b, (size_t)B * T * C, "DataParallel output");
    expect_same_grads(ck, plain, "DataParallel");
    free(a);
    free(b);
  }
  clpar_module_free(plain);
  clpar_module_free(ck);
}

static clpar_status mse_fn(clpar_tensor *out, clpar_tensor *target, int64_t first_row, void *user,
                           clpar_tensor **loss) {
  (void)first_row, (void)user;
  return clpar_mse_loss(out, target, CLPAR_REDUCTION_MEAN, loss);
}

/* Blocks 0 .. BLOCKS/2-1 on stage 0, the others on stage 1, two micro-batches. */
static clpar_module *make_pipeline(clpar_device **devs, int ckpt, clpar_pipeline_schedule sched) {
  clpar_module *b[BLOCKS], *stages[2], *pipe;
  make_block_array(devs[0], BLOCKS, ckpt, b);
  for (int s = 0; s < 2; s++)
    tu_ok(clpar_sequential_create(b + s * (BLOCKS / 2), BLOCKS / 2, &stages[s]));
  clpar_pipeline_options o = {.chunks = 2, .schedule = sched};
  tu_ok(clpar_pipeline_create(stages, devs, 2, &o, &pipe));
  return pipe;
}

static void pipeline_step(clpar_module *pipe, clpar_device *dev, int by_step) {
  clpar_scope *scope = clpar_scope_begin();
  const int64_t shape[3] = {B, T, C};
  clpar_device *last = clpar_pipeline_device(pipe, 1);
  clpar_tensor *x = tu_make(dev, 3, shape, 300), *t = tu_make(last, 3, shape, 301), *y, *loss;
  if (by_step) {
    tu_ok(clpar_pipeline_train_step(pipe, x, t, mse_fn, NULL, &loss));
  } else {
    tu_ok(clpar_module_forward(pipe, x, &y));
    tu_ok(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
  }
  clpar_scope_end(scope);
}

static void test_pipeline_bit_identical(void **state) {
  (void)state;
  clpar_device *devs[2];
  if (!two_devices(devs)) skip();
  static const char *const modes[3] = {"pipeline forward (GPipe)", "train_step GPipe",
                                       "train_step 1F1B"};
  for (int mode = 0; mode < 3; mode++) {
    clpar_pipeline_schedule sched = mode == 2 ? CLPAR_PIPELINE_1F1B : CLPAR_PIPELINE_GPIPE;
    clpar_module *plain = make_pipeline(devs, 0, sched), *ck = make_pipeline(devs, 1, sched);
    for (int step = 0; step < 2; step++) {
      tu_ok(clpar_module_zero_grad(plain));
      tu_ok(clpar_module_zero_grad(ck));
      pipeline_step(ck, devs[0], mode > 0);
      pipeline_step(plain, devs[0], mode > 0);
      expect_same_grads(ck, plain, modes[mode]);
    }
    clpar_module_free(plain);
    clpar_module_free(ck);
  }
}

/* The peak bytes in use on dev over one step of 8 blocks of kind. */
static uint64_t step_peak(clpar_device *dev, int kind) {
  clpar_module *m = make_blocks(dev, 8, kind);
  tu_ok(clpar_device_synchronize(dev));
  tu_ok(clpar_device_memory_reset_peak(dev));
  free(two_forwards_one_backward(m, dev, 400));
  tu_ok(clpar_device_synchronize(dev));
  clpar_memory_stats st;
  tu_ok(clpar_device_memory_stats(dev, &st));
  clpar_module_free(m);
  return st.peak_bytes_in_use;
}

static void test_peak_memory_lower(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  uint64_t plain = step_peak(dev, 0), ck = step_peak(dev, 1);
  fprintf(stderr, "peak over a step: %llu bytes plain, %llu checkpointed\n",
          (unsigned long long)plain, (unsigned long long)ck);
  assert_true(ck < plain / 2);
}

static void expect_error(clpar_status s, clpar_status want, const char *part) {
  assert_int_equal(s, want);
  if (!strstr(clpar_last_error(), part))
    fail_msg("expected \"%s\" in \"%s\"", part, clpar_last_error());
}

static clpar_status holder_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                   void *user) {
  (void)user;
  return clpar_module_forward(clpar_module_child(self, "dp"), x, y);
}

static void test_errors(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  clpar_module *w = NULL, *m, *dp;
  expect_error(clpar_activation_checkpoint_create(NULL, &w), CLPAR_ERROR_INVALID_ARGUMENT,
               "clpar_activation_checkpoint_create: module is NULL");
  tu_ok(clpar_linear_create(2, 2, 1, dev, &m));
  expect_error(clpar_activation_checkpoint_create(m, NULL), CLPAR_ERROR_INVALID_ARGUMENT,
               "out is NULL"); /* m was freed, as ownership was taken */
  tu_ok(clpar_data_parallel_create(make_blocks(dev, 1, 0), NULL, &dp));
  tu_ok(clpar_module_create("Holder", holder_forward, NULL, NULL, &m));
  tu_ok(clpar_module_add_child(m, "dp", dp));
  expect_error(clpar_activation_checkpoint_children(m), CLPAR_ERROR_INVALID_ARGUMENT,
               "DataParallel");
  expect_error(clpar_activation_checkpoint_create(m, &w), CLPAR_ERROR_INVALID_ARGUMENT,
               "contains a DataParallel");
  expect_error(clpar_activation_checkpoint_children(NULL), CLPAR_ERROR_INVALID_ARGUMENT,
               "clpar_activation_checkpoint_children: module is NULL");
  tu_ok(clpar_linear_create(2, 2, 1, dev, &m));
  expect_error(clpar_gpt_checkpoint_blocks(m), CLPAR_ERROR_INVALID_ARGUMENT, "not a GPT");
  expect_error(clpar_gpt_checkpoint_blocks(NULL), CLPAR_ERROR_INVALID_ARGUMENT, "not a GPT");
  /* a frozen parameter stays frozen in the wrapper */
  tu_ok(clpar_tensor_set_requires_grad(clpar_module_parameter(m, "bias"), 0));
  tu_ok(clpar_activation_checkpoint_create(m, &w));
  assert_false(clpar_tensor_requires_grad(clpar_module_parameter(w, "bias")));
  assert_true(clpar_tensor_requires_grad(clpar_module_parameter(w, "weight")));
  clpar_module_free(w);
}

/* One graph backpropagated twice: the recompute runs each time, the gradients add up. */
static void test_backward_twice(void **state) {
  (void)state;
  clpar_device *dev = tu_non_host() ? tu_non_host() : tu_host();
  clpar_module *m[2] = {make_blocks(dev, 2, 0), make_blocks(dev, 2, 1)};
  for (int k = 0; k < 2; k++) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x = tu_make(dev, 3, (int64_t[]){B, T, C}, 9), *y, *loss;
    tu_ok(clpar_tensor_set_requires_grad(x, 1));
    tu_ok(clpar_module_forward(m[k], x, &y));
    tu_ok(clpar_sum(y, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_backward(loss));
    float *gx = tu_read(clpar_tensor_grad(x));
    static float *gx_plain;
    if (k == 0) gx_plain = gx;
    if (k == 1) {
      expect_same_bits(gx, gx_plain, (size_t)B * T * C, "input gradient after two backwards");
      free(gx);
      free(gx_plain);
    }
    clpar_scope_end(scope);
  }
  expect_same_grads(m[1], m[0], "two backwards");
  clpar_module_free(m[0]);
  clpar_module_free(m[1]);
}

/* Dropout on in the forward, off in the recompute: the draws differ, backward says why. */
static void test_mode_changed_before_backward(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  clpar_module *m = make_blocks(dev, 2, 1);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 3, (int64_t[]){B, T, C}, 1), *y, *loss;
  tu_ok(clpar_module_forward(m, x, &y));
  tu_ok(clpar_sum(y, &loss));
  tu_ok(clpar_module_eval(m));
  expect_error(clpar_backward(loss), CLPAR_ERROR_INVALID_ARGUMENT, "training mode");
  /* eval: the wrapper is the plain forward (nothing recorded, nothing kept) */
  clpar_set_grad_enabled(0);
  tu_ok(clpar_module_forward(m, x, &y));
  clpar_set_grad_enabled(1);
  assert_false(clpar_tensor_requires_grad(y));
  clpar_scope_end(scope);
  clpar_module_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocks_bit_identical),
      cmocka_unit_test(test_children_helper_bit_identical),
      cmocka_unit_test(test_nested_bit_identical),
      cmocka_unit_test(test_gpt_blocks_bit_identical),
      cmocka_unit_test(test_data_parallel_bit_identical),
      cmocka_unit_test(test_pipeline_bit_identical),
      cmocka_unit_test(test_peak_memory_lower),
      cmocka_unit_test(test_backward_twice),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_mode_changed_before_backward),
  };
  return cmocka_run_group_tests_name("activation_checkpoint", tests, tu_setup, tu_teardown);
}
