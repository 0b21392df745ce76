/* test_pipeline.c — model parallel and pipeline parallel against one device.
 *
 * Pipelines of 2, 3 and 4 stages (an MLP cut between its layers), trained 3 SGD-momentum
 * steps three ways (the module's forward + one backward, GPipe; clpar_pipeline_train_step
 * with GPipe and with 1F1B) with micro-batches that divide the batch, that do not, and one
 * larger than the batch: every step's loss, the last step's gradients and the final weights
 * equal the same model's on one device. 1F1B keeps at most n_stages micro-batches'
 * activations (the allocator's peak on the first stage's device against GPipe's); an error in
 * one stage names the stage, its device and the micro-batch, and leaves memory, parameters and
 * gradients as they were. The tutorial's ToyModel, split over two devices, trains to the
 * one-device result. Stages go round the selected devices (several stages share one when
 * there are fewer devices than stages); with one selected, a second comes from
 * tu_second_device, so every run spans two devices. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

enum { MAX_STAGES = 4, STEPS = 3, BATCH = 10, IN = 6, OUT = 3 };

static int pick_devices(clpar_device **devs) {
  int n = 0;
  for (int i = 0; i < clpar_device_count() && n < MAX_STAGES; i++) devs[n++] = clpar_device_get(i);
  if (n < 2 && (devs[1] = tu_second_device(devs[0]))) n++;
  return n;
}

static const int64_t widths[] = {IN, 8, 7, 9, OUT}; /* stage s: widths[..] by cut */

/* The layers of the MLP IN -> ... -> OUT cut into n stages: stage s maps the s-th width of the
 * cut to the next; each stage is Sequential(Linear, ReLU) but the last (Linear). Seeded: the
 * same weights every time. */
static void make_stages(int n, clpar_device *dev, clpar_module **stages) {
  clpar_manual_seed(11);
  for (int s = 0; s < n; s++) {
    int64_t in = s == 0 ? IN : widths[s], out = s == n - 1 ? OUT : widths[s + 1];
    clpar_module *l[2];
    tu_ok(clpar_linear_create(in, out, 1, dev, &l[0]));
    if (s == n - 1) {
      tu_ok(clpar_sequential_create(l, 1, &stages[s]));
    } else {
      tu_ok(clpar_relu_create(&l[1]));
      tu_ok(clpar_sequential_create(l, 2, &stages[s]));
    }
  }
}

static clpar_status mse_fn(clpar_tensor *out, clpar_tensor *target, int64_t first_row, void *user,
                           clpar_tensor **loss) {
  (void)first_row;
  (void)user;
  return clpar_mse_loss(out, target, CLPAR_REDUCTION_MEAN, loss);
}

typedef enum { BY_FORWARD, BY_STEP } drive;

typedef struct {
  float loss[STEPS];
  float *grads, *weights; /* every parameter, flattened in parameter order */
  size_t n;
} run_result;

static void read_params(clpar_module *m, run_result *r) {
  size_t n = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    n += (size_t)clpar_tensor_numel(p);
  }
  r->n = n;
  r->grads = calloc(n, sizeof(float));
  r->weights = calloc(n, sizeof(float));
  size_t at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    size_t k = (size_t)clpar_tensor_numel(p);
    tu_ok(clpar_tensor_read(p, r->weights + at, k));
    assert_non_null(clpar_tensor_grad(p));
    tu_ok(clpar_tensor_read(clpar_tensor_grad(p), r->grads + at, k));
    at += k;
  }
}

/* STEPS steps of SGD with momentum on m (a pipeline when how is BY_STEP); the batches are
 * made on data_dev. */
static void train(clpar_module *m, drive how, clpar_device *data_dev, run_result *r) {
  clpar_optimizer *opt;
  clpar_sgd_options o = {.lr = 0.1f, .momentum = 0.9f};
  tu_ok(clpar_sgd_create_for(m, &o, &opt));
  for (int step = 0; step < STEPS; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *target, *y, *loss, *t;
    tu_ok(clpar_tensor_rand_normal(data_dev, 2, (int64_t[]){BATCH, IN}, 300 + (uint64_t)step, 0, 1,
                                   &x));
    tu_ok(clpar_tensor_rand_normal(data_dev, 2, (int64_t[]){BATCH, OUT}, 400 + (uint64_t)step, 0, 1,
                                   &target));
    tu_ok(clpar_optimizer_zero_grad(opt));
    if (how == BY_STEP) {
      tu_ok(clpar_pipeline_train_step(m, x, target, mse_fn, NULL, &loss));
    } else {
      tu_ok(clpar_module_forward(m, x, &y));
      t = target;
      if (clpar_tensor_device(y) != data_dev)
        tu_ok(clpar_tensor_to(target, clpar_tensor_device(y), &t));
      tu_ok(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &loss));
      tu_ok(clpar_backward(loss));
    }
    tu_ok(clpar_tensor_read(loss, &r->loss[step], 1));
    tu_ok(clpar_optimizer_step(opt)); /* leaves the last step's gradients */
    clpar_scope_end(sc);
  }
  read_params(m, r);
  clpar_optimizer_free(opt);
}

static void result_free(run_result *r) {
  free(r->grads);
  free(r->weights);
}

/* The one-device reference for n stages: Sequential of the same stages on dev. */
static void reference(int n, clpar_device *dev, run_result *r) {
  clpar_module *stages[MAX_STAGES], *seq;
  make_stages(n, dev, stages);
  tu_ok(clpar_sequential_create(stages, n, &seq));
  train(seq, BY_FORWARD, dev, r);
  clpar_module_free(seq);
}

static void expect_same(const run_result *a, const run_result *ref, const char *what) {
  char w[256];
  snprintf(w, sizeof w, "%s: losses", what);
  tu_assert_close(a->loss, ref->loss, STEPS, 1e-5f, 1e-7f, w);
  assert_int_equal(a->n, ref->n);
  snprintf(w, sizeof w, "%s: gradients", what);
  tu_assert_close(a->grads, ref->grads, a->n, 1e-5f, 1e-6f, w);
  snprintf(w, sizeof w, "%s: weights", what);
  tu_assert_close(a->weights, ref->weights, a->n, 1e-5f, 1e-6f, w);
}

static clpar_module *make_pipeline(int n, clpar_device *const *devs, int n_devs,
                                   const clpar_pipeline_options *o) {
  clpar_module *stages[MAX_STAGES], *pipe;
  clpar_device *at[MAX_STAGES];
  for (int s = 0; s < n; s++) at[s] = devs[s % n_devs];
  make_stages(n, devs[0], stages);
  tu_ok(clpar_pipeline_create(stages, at, n, o, &pipe));
  return pipe;
}

static void test_pipeline_equals_one_device(void **state) {
  (void)state;
  clpar_device *devs[MAX_STAGES];
  int n_devs = pick_devices(devs);
  if (n_devs < 2) skip();
  /* split sizes: dividing the batch, not dividing it, larger than it; then chunks */
  const struct {
    int64_t split;
    int chunks;
  } splits[] = {{5, 0}, {3, 0}, {1, 0}, {16, 0}, {0, 4}};
  for (int n = 2; n <= MAX_STAGES; n++) {
    run_result ref;
    reference(n, devs[0], &ref);
    for (size_t k = 0; k < sizeof splits / sizeof *splits; k++) {
      for (int mode = 0; mode < 3; mode++) {
        clpar_pipeline_options o = {.split_size = splits[k].split, .chunks = splits[k].chunks};
        o.schedule = mode == 2 ? CLPAR_PIPELINE_1F1B : CLPAR_PIPELINE_GPIPE;
        clpar_module *pipe = make_pipeline(n, devs, n_devs, &o);
        run_result r;
        train(pipe, mode == 0 ? BY_FORWARD : BY_STEP, devs[0], &r);
        char what[160];
        snprintf(what, sizeof what, "%d stages, split %lld, chunks %d, %s", n,
                 (long long)splits[k].split, splits[k].chunks,
                 mode == 0   ? "forward + backward"
                 : mode == 1 ? "train_step GPipe"
                             : "train_step 1F1B");
        expect_same(&r, &ref, what);
        clpar_pipeline_stats st;
        tu_ok(clpar_pipeline_stats_get(pipe, &st));
        int m = clpar_pipeline_split(pipe, BATCH, NULL, 0);
        assert_true(m >= 1);
        if (mode == 2) assert_true(st.max_in_flight <= (m < n ? m : n));
        if (mode == 1) assert_int_equal(st.max_in_flight, m);
        assert_int_equal(st.micro_batches, (uint64_t)(STEPS * m));
        result_free(&r);
        clpar_module_free(pipe);
      }
    }
    result_free(&ref);
  }
}

static void test_structure(void **state) {
  (void)state;
  clpar_device *devs[MAX_STAGES];
  int n_devs = pick_devices(devs);
  if (n_devs < 2) skip();
  const char *names[] = {"front", "back"};
  clpar_pipeline_options o = {.split_size = 4, .stage_names = names};
  clpar_module *stages[2], *pipe;
  make_stages(2, devs[0], stages);
  tu_ok(clpar_pipeline_create(stages, devs, 2, &o, &pipe));
  assert_string_equal(clpar_module_type(pipe), "Pipeline");
  assert_int_equal(clpar_pipeline_stage_count(pipe), 2);
  assert_ptr_equal(clpar_pipeline_device(pipe, 1), devs[1]);
  assert_ptr_equal(clpar_pipeline_stage(pipe, 0), clpar_module_child(pipe, "front"));
  const char *name;
  clpar_tensor *p;
  tu_ok(clpar_module_parameter_at(pipe, 2, &name, &p));
  assert_string_equal(name, "back.0.weight");
  assert_ptr_equal(clpar_tensor_device(p), devs[1]);
  int64_t sizes[8];
  assert_int_equal(clpar_pipeline_split(pipe, 10, sizes, 8), 3);
  assert_int_equal(sizes[0], 4);
  assert_int_equal(sizes[2], 2);
  /* the output is gathered on the last stage's device, from an input anywhere */
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(devs[1], 2, (int64_t[]){10, IN}, 5), *y;
  tu_ok(clpar_module_forward(pipe, x, &y));
  assert_ptr_equal(clpar_tensor_device(y), devs[1]);
  assert_int_equal(clpar_tensor_dim(y, 0), 10);
  assert_int_equal(clpar_tensor_dim(y, 1), OUT);
  clpar_scope_end(sc);
  /* its devices are fixed */
  assert_int_equal(clpar_module_to(pipe, devs[0]), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "Pipeline wrapper"));
  /* not a DataParallel wrapper, and a DataParallel is no pipeline */
  assert_true(clpar_data_parallel_split(pipe, 10, sizes) < 0);
  clpar_pipeline_options bad = {.split_size = -1};
  assert_int_equal(clpar_pipeline_set_options(pipe, &bad), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_module_free(pipe);
  /* bad arguments: the stages are freed all the same (the leak checker sees it) */
  make_stages(2, devs[0], stages);
  assert_int_equal(clpar_pipeline_create(stages, devs, 2, &bad, &pipe),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  const char *same[] = {"a", "a"};
  clpar_pipeline_options dup = {.stage_names = same};
  make_stages(2, devs[0], stages);
  assert_int_equal(clpar_pipeline_create(stages, devs, 2, &dup, &pipe),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_pipeline_create(NULL, devs, 2, NULL, &pipe), CLPAR_ERROR_INVALID_ARGUMENT);
}

/* ---- 1F1B's memory ---- */

static clpar_status mse_sum_fn(clpar_tensor *out, clpar_tensor *target, int64_t first_row,
                               void *user, clpar_tensor **loss) {
  (void)first_row;
  (void)user;
  return clpar_mse_loss(out, target, CLPAR_REDUCTION_SUM, loss);
}

static uint64_t in_use(clpar_device *dev) {
  clpar_memory_stats m;
  tu_ok(clpar_device_memory_stats(dev, &m));
  return m.bytes_in_use;
}

/* Peak bytes in use on dev, above what was in use before, during one train step. */
static uint64_t step_peak(clpar_module *pipe, clpar_tensor *x, clpar_tensor *t, clpar_device *dev) {
  pthread_mutex_lock(&dev->alloc_lock);
  uint64_t base = dev->stats.bytes_in_use;
  dev->stats.peak_bytes_in_use = base; /* the test's own reset of the high-water mark */
  pthread_mutex_unlock(&dev->alloc_lock);
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *loss;
  tu_ok(clpar_pipeline_train_step(pipe, x, t, mse_sum_fn, NULL, &loss));
  clpar_scope_end(sc);
  clpar_memory_stats m;
  tu_ok(clpar_device_memory_stats(dev, &m));
  return m.peak_bytes_in_use - base;
}

static void test_1f1b_bounds_activations(void **state) {
  (void)state;
  clpar_device *devs[MAX_STAGES];
  int n_devs = pick_devices(devs);
  if (n_devs < 2) skip();
  enum { W = 256, ROWS = 256, SPLIT = 16 };
  clpar_module *l0[4], *l1[3], *stages[2], *pipe;
  clpar_manual_seed(5);
  tu_ok(clpar_linear_create(64, W, 1, devs[0], &l0[0]));
  tu_ok(clpar_relu_create(&l0[1]));
  tu_ok(clpar_linear_create(W, W, 1, devs[0], &l0[2]));
  tu_ok(clpar_relu_create(&l0[3]));
  tu_ok(clpar_linear_create(W, W, 1, devs[0], &l1[0]));
  tu_ok(clpar_relu_create(&l1[1]));
  tu_ok(clpar_linear_create(W, 8, 1, devs[0], &l1[2]));
  tu_ok(clpar_sequential_create(l0, 4, &stages[0]));
  tu_ok(clpar_sequential_create(l1, 3, &stages[1]));
  clpar_pipeline_options o = {.split_size = SPLIT, .loss_reduction = CLPAR_REDUCTION_SUM};
  tu_ok(clpar_pipeline_create(stages, devs, 2, &o, &pipe));
  clpar_tensor *x = tu_make(devs[0], 2, (int64_t[]){ROWS, 64}, 1);
  clpar_tensor *t = tu_make(devs[1], 2, (int64_t[]){ROWS, 8}, 2);
  clpar_tensor *x1 = tu_make(devs[0], 2, (int64_t[]){SPLIT, 64}, 1);
  clpar_tensor *t1 = tu_make(devs[1], 2, (int64_t[]){SPLIT, 8}, 2);
  step_peak(pipe, x, t, devs[0]); /* the gradients exist from here on */
  tu_ok(clpar_device_synchronize(devs[0]));
  tu_ok(clpar_device_synchronize(devs[1]));
  uint64_t one = step_peak(pipe, x1, t1, devs[0]); /* a step of one micro-batch */
  uint64_t gpipe = step_peak(pipe, x, t, devs[0]);
  o.schedule = CLPAR_PIPELINE_1F1B;
  tu_ok(clpar_pipeline_set_options(pipe, &o));
  uint64_t f1b = step_peak(pipe, x, t, devs[0]);
  clpar_pipeline_stats st;
  tu_ok(clpar_pipeline_stats_get(pipe, &st));
  assert_int_equal(st.max_in_flight, 2);
  fprintf(stderr,
          "peak above the step's start on %s: one micro-batch %llu B, 16 in GPipe %llu B, "
          "16 in 1F1B %llu B\n",
          clpar_device_id(devs[0]), (unsigned long long)one, (unsigned long long)gpipe,
          (unsigned long long)f1b);
  /* Above a step of one micro-batch (its activations and backward's temporaries, the weight
   * gradients before they are added in), GPipe holds 15 micro-batches more on the first
   * stage, 1F1B one more (n_stages in flight); a quarter's slack for the cache's rounding. */
  assert_true(gpipe > one && f1b >= one);
  uint64_t per_micro_batch = (gpipe - one) / 15;
  assert_true(per_micro_batch >= (uint64_t)SPLIT * W * sizeof(float)); /* one activation */
  assert_true(4 * (f1b - one) <= 5 * per_micro_batch);
  clpar_tensor_free(x);
  clpar_tensor_free(t);
  clpar_tensor_free(x1);
  clpar_tensor_free(t1);
  clpar_module_free(pipe);
}

/* ---- errors ---- */

static void test_stage_error_changes_nothing(void **state) {
  (void)state;
  clpar_device *devs[MAX_STAGES];
  int n_devs = pick_devices(devs);
  if (n_devs < 2) skip();
  clpar_module *stages[3], *l, *pipe;
  clpar_manual_seed(3);
  tu_ok(clpar_linear_create(IN, 8, 1, devs[0], &stages[0]));
  tu_ok(clpar_linear_create(7, 5, 1, devs[0], &l)); /* expects 7 features, gets 8 */
  tu_ok(clpar_sequential_create(&l, 1, &stages[1]));
  tu_ok(clpar_linear_create(5, OUT, 1, devs[0], &stages[2]));
  clpar_device *at[3] = {devs[0], devs[1], devs[2 % n_devs]};
  clpar_pipeline_options o = {.split_size = 4};
  tu_ok(clpar_pipeline_create(stages, at, 3, &o, &pipe));
  clpar_tensor *x = tu_make(devs[0], 2, (int64_t[]){BATCH, IN}, 1);
  clpar_tensor *t = tu_make(at[2], 2, (int64_t[]){BATCH, OUT}, 2);
  int n_params = clpar_module_parameter_count(pipe);
  float before[6][64];
  for (int i = 0; i < n_params; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(pipe, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, before[i], 64));
  }
  uint64_t used[3];
  for (int d = 0; d < 3; d++) used[d] = in_use(at[d]);
  for (int mode = 0; mode < 3; mode++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *y = NULL;
    clpar_status s;
    if (mode == 0) {
      s = clpar_module_forward(pipe, x, &y);
    } else {
      o.schedule = mode == 1 ? CLPAR_PIPELINE_GPIPE : CLPAR_PIPELINE_1F1B;
      tu_ok(clpar_pipeline_set_options(pipe, &o));
      s = clpar_pipeline_train_step(pipe, x, t, mse_fn, NULL, &y);
    }
    assert_int_equal(s, CLPAR_ERROR_SHAPE_MISMATCH);
    assert_null(y);
    char want[128];
    snprintf(want, sizeof want, "Pipeline stage 1 (\"1\", Sequential) on %s, micro-batch 0 of 3",
             clpar_device_id(at[1]));
    if (!strstr(clpar_last_error(), want))
      fail_msg("the error \"%s\" does not say \"%s\"", clpar_last_error(), want);
    clpar_scope_end(sc);
    for (int d = 0; d < 3; d++) assert_int_equal(in_use(at[d]), used[d]);
    for (int i = 0; i < n_params; i++) {
      clpar_tensor *p;
      float now[64];
      tu_ok(clpar_module_parameter_at(pipe, i, NULL, &p));
      tu_ok(clpar_tensor_read(p, now, 64));
      assert_memory_equal(now, before[i], (size_t)clpar_tensor_numel(p) * sizeof(float));
      assert_null(clpar_tensor_grad(p));
    }
  }
  /* a target whose rows differ from the input's; no loss function */
  clpar_tensor *t9 = tu_make(at[2], 2, (int64_t[]){BATCH - 1, OUT}, 2);
  assert_int_equal(clpar_pipeline_train_step(pipe, x, t9, mse_fn, NULL, NULL),
                   CLPAR_ERROR_SHAPE_MISMATCH);
  assert_non_null(strstr(clpar_last_error(), "differ in their rows"));
  clpar_tensor_free(t9);
  assert_int_equal(clpar_pipeline_train_step(pipe, x, t, NULL, NULL, NULL),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_tensor_free(x);
  clpar_tensor_free(t);
  clpar_module_free(pipe);
}

/* ---- the model-parallel tutorial's ToyModel, model parallel ---- */

static void test_toy_model_parallel_equals_one_device(void **state) {
  (void)state;
  clpar_device *devs[MAX_STAGES];
  if (pick_devices(devs) < 2) skip();
  tu_toy_devices split = {devs[0], devs[1]}, one = {devs[0], devs[0]};
  float l_split[5], l_one[5], w_split[165], w_one[165];
  tu_toy_train(&split, 0, &(clpar_sgd_options){.lr = 0.001f}, 5, l_split, w_split);
  tu_toy_train(&one, 0, &(clpar_sgd_options){.lr = 0.001f}, 5, l_one, w_one);
  tu_assert_close(l_split, l_one, 5, 1e-5f, 1e-7f, "ToyModel losses");
  tu_assert_close(w_split, w_one, 165, 1e-5f, 1e-6f, "ToyModel weights");
}

/* A module given as two stages is refused and freed once; a stage inside another stage goes
 * with it when creation fails (each was freed again, a double free, before). */
static void test_stage_given_twice(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *lin, *pipe = NULL;
  tu_ok(clpar_linear_create(IN, OUT, 1, dev, &lin));
  assert_int_equal(clpar_pipeline_create((clpar_module *[]){lin, lin}, NULL, 2, NULL, &pipe),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "stages 0 and 1 are the same module"));
  assert_null(pipe);
  clpar_module *stages[2];
  make_stages(1, dev, stages);
  stages[1] = clpar_module_child(stages[0], "0"); /* the Linear inside stage 0 */
  clpar_pipeline_options bad = {.split_size = -1};
  assert_int_equal(clpar_pipeline_create(stages, NULL, 2, &bad, &pipe),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(pipe);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_toy_model_parallel_equals_one_device),
      cmocka_unit_test(test_structure),
      cmocka_unit_test(test_pipeline_equals_one_device),
      cmocka_unit_test(test_1f1b_bounds_activations),
      cmocka_unit_test(test_stage_error_changes_nothing),
      cmocka_unit_test(test_stage_given_twice),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
