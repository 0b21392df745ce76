/* test_gpt_parallel.c — the tiny GPT (tiny_gpt.h) trained for 3 AdamW steps under
 * DataParallel over 2 devices and as a 2-stage pipeline (clpar_gpt_create_stages; GPipe by the
 * module's forward, GPipe and 1F1B by clpar_pipeline_train_step) against one device: losses,
 * the last step's gradients and the parameters after. The parallel runs add the same
 * products in other orders (a batch's gradient as a sum of halves or of micro-batches; a
 * LayerNorm bias's gradient is a sum over tokens that mostly cancels), so they agree to float
 * rounding: 1e-4 of each tensor's largest value (tg_expect_same says what more after steps). With
 * dropout, each Dropout module draws its mask from its seed and a running offset; a pipeline
 * posts the micro-batches of a stage in order, so the masks are the one device's and the runs
 * agree too; DataParallel posts device 0's forward last (test_data_parallel_dropout). */
#include <math.h>
#include <stdio.h>

#include "tiny_gpt.h"

static const float tol = 1e-4f;

static clpar_device *devs[2];

static int setup(void **state) {
  if (tu_setup(state)) return -1;
  devs[0] = clpar_device_get(0);
  devs[1] = clpar_device_count() > 1 ? clpar_device_get(1) : tu_second_device(devs[0]);
  return 0;
}

static void need_two(void) {
  if (!devs[1]) {
    fprintf(stderr, "skipped: this machine has no second device\n");
    skip();
  }
}

/* The one-device run; row0 rotates the batch (the loss, a mean over the rows, is the same). */
static void one_device_rows(float dropout, int row0, tg_run *r) {
  clpar_gpt_config c = tg_config(dropout);
  clpar_module *m;
  clpar_manual_seed(7);
  tu_ok(clpar_gpt_create(&c, devs[0], &m));
  tg_train(m, devs[0], row0, TG_B, 0, r);
  clpar_module_free(m);
}

static void one_device(float dropout, tg_run *r) {
  one_device_rows(dropout, 0, r);
}

static void check_data_parallel(float dropout, int ref_row0, const char *what) {
  tg_run ref = {0}, dp = {0};
  one_device_rows(dropout, ref_row0, &ref);
  clpar_gpt_config c = tg_config(dropout);
  clpar_module *m;
  clpar_manual_seed(7);
  tu_ok(clpar_gpt_create(&c, devs[0], &m));
  clpar_data_parallel_options o = {.devices = devs, .n_devices = 2};
  tu_ok(clpar_data_parallel_create(m, &o, &m));
  tg_train(m, devs[0], 0, TG_B, 0, &dp);
  tg_expect_same(&ref, &dp, tol, what);
  clpar_module_free(m);
  tg_free(&ref);
  tg_free(&dp);
}

static void test_data_parallel(void **state) {
  (void)state;
  need_two();
  check_data_parallel(0.0f, 0, "DataParallel over 2 devices");
}

/* DataParallel posts the replicas' forwards with device 0's last, and each Dropout module
 * gives its forwards consecutive ranges of its stream in the order they are posted: device 1's
 * rows (2, 3) get the masks that one device gives rows 0 and 1, and device 0's rows those of 2
 * and 3. So a step under DataParallel is the one-device step on the batch with its halves
 * swapped: distinct masks, the same for a seed, but not the one device's for each row. */
static void test_data_parallel_dropout(void **state) {
  (void)state;
  need_two();
  check_data_parallel(0.2f, TG_B / 2, "DataParallel over 2 devices, dropout 0.2");
}

/* A 2-stage pipeline of the tiny GPT, 4 micro-batches of one row. */
static clpar_module *make_pipeline(float dropout, clpar_pipeline_schedule schedule) {
  clpar_gpt_config c = tg_config(dropout);
  clpar_module *stages[2], *pipe;
  clpar_manual_seed(7);
  tu_ok(clpar_gpt_create_stages(&c, 2, devs[0], stages));
  clpar_pipeline_options po = {.chunks = TG_B, .schedule = schedule};
  tu_ok(clpar_pipeline_create(stages, devs, 2, &po, &pipe));
  return pipe;
}

static void check_pipeline(float dropout, const char *what) {
  tg_run ref = {0};
  one_device(dropout, &ref);
  for (int k = 0; k < 3; k++) {
    tg_run pr = {0};
    clpar_module *pipe =
        make_pipeline(dropout, k == 2 ? CLPAR_PIPELINE_1F1B : CLPAR_PIPELINE_GPIPE);
    tg_train(pipe, devs[0], 0, TG_B, k > 0, &pr);
    char msg[128];
    static const char *how[] = {"forward (GPipe)", "train_step GPipe", "train_step 1F1B"};
    snprintf(msg, sizeof msg, "%s, pipeline %s", what, how[k]);
    tg_expect_same(&ref, &pr, tol, msg);
    if (k == 2) {
      clpar_pipeline_stats st;
      tu_ok(clpar_pipeline_stats_get(pipe, &st));
      assert_int_equal(st.max_in_flight, 2); /* 1F1B: at most n_stages micro-batches */
    }
    clpar_module_free(pipe);
    tg_free(&pr);
  }
  tg_free(&ref);
}

static void test_pipeline(void **state) {
  (void)state;
  need_two();
  check_pipeline(0.0f, "dropout 0");
}

static void test_pipeline_dropout(void **state) {
  (void)state;
  need_two();
  tg_run with = {0}, without = {0}; /* dropout is on: the loss is another */
  one_device(0.2f, &with);
  one_device(0.0f, &without);
  assert_true(fabsf(with.loss[TG_STEPS - 1] - without.loss[TG_STEPS - 1]) > 1e-3f);
  tg_free(&with);
  tg_free(&without);
  check_pipeline(0.2f, "dropout 0.2");
}

/* The stages alone: names, the split of the blocks, and what is refused. */
static void test_stages(void **state) {
  (void)state;
  clpar_gpt_config c = tg_config(0.0f);
  clpar_module *s[2], *one[1];
  tu_ok(clpar_gpt_create_stages(&c, 2, devs[0], s));
  const char *name;
  tu_ok(clpar_module_parameter_at(s[0], 0, &name, NULL));
  assert_string_equal(name, "transformer.wte.weight");
  tu_ok(clpar_module_parameter_at(s[1], 0, &name, NULL));
  assert_string_equal(name, "transformer.h.1.ln_1.weight");
  /* wte, wpe and block 0's 12; block 1's 12 and ln_f's 2 (the head is wte) */
  assert_int_equal(clpar_module_parameter_count(s[0]), 14);
  assert_int_equal(clpar_module_parameter_count(s[1]), 14);
  clpar_tensor *ids, *next, *out = NULL; /* stage 1 takes activations, not token ids */
  tg_batch(devs[0], 0, TG_B, &ids, &next);
  assert_int_equal(clpar_module_forward(s[1], ids, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_null(out);
  clpar_tensor_free(ids);
  clpar_tensor_free(next);
  clpar_module_free(s[0]);
  clpar_module_free(s[1]);
  /* one stage is the whole GPT: the same logits as clpar_gpt_create's */
  clpar_module *g;
  clpar_manual_seed(3);
  tu_ok(clpar_gpt_create(&c, devs[0], &g));
  clpar_manual_seed(3);
  tu_ok(clpar_gpt_create_stages(&c, 1, devs[0], one));
  clpar_tensor *x, *y, *a, *b;
  tg_batch(devs[0], 0, TG_B, &x, &y);
  tu_ok(clpar_module_forward(g, x, &a));
  tu_ok(clpar_module_forward(one[0], x, &b));
  tu_expect_equal(b, a, 1e-6f, 1e-6f, "one stage against the GPT");
  clpar_tensor *all[] = {x, y, a, b};
  for (int i = 0; i < 4; i++) clpar_tensor_free(all[i]);
  clpar_module_free(g);
  clpar_module_free(one[0]);
  /* the seed stream goes on as after clpar_gpt_create: a module made next is the same */
  clpar_module *after[2];
  for (int k = 0; k < 2; k++) {
    clpar_manual_seed(3);
    tu_ok(k ? clpar_gpt_create_stages(&c, 2, devs[0], s) : clpar_gpt_create(&c, devs[0], &g));
    tu_ok(clpar_linear_create(4, 4, 1, devs[0], &after[k]));
    if (k)
      clpar_module_free(s[0]), clpar_module_free(s[1]);
    else
      clpar_module_free(g);
  }
  tu_expect_equal(clpar_module_parameter(after[1], "weight"),
                  clpar_module_parameter(after[0], "weight"), 0, 0, "a Linear made next");
  clpar_module_free(after[0]), clpar_module_free(after[1]);
  assert_int_equal(clpar_gpt_create_stages(&c, 3, devs[0], s), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_gpt_create_stages(&c, 0, devs[0], s), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_gpt_create_stages(NULL, 2, devs[0], s), CLPAR_ERROR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stages),
      cmocka_unit_test(test_data_parallel),
      cmocka_unit_test(test_data_parallel_dropout),
      cmocka_unit_test(test_pipeline),
      cmocka_unit_test(test_pipeline_dropout),
  };
  return cmocka_run_group_tests_name("gpt_parallel", tests, setup, tu_teardown);
}
