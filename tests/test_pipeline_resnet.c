/* test_pipeline_resnet.c — a ResNet cut as the model-parallel tutorial cuts it
 * (clpar_resnet_split: conv1 .. layer2 | layer3 .. fc), over two devices, against the same
 * ResNet on one device.
 *
 * The model is small so that the test takes seconds: BasicBlocks, one per layer, 10 classes,
 * batch 4 of 3x40x40 (layer4's maps are 2x2, so a BatchNorm there normalizes 16 values in
 * training mode: at 1x1 and batch 2 the gradient is an ill-conditioned remainder, see DESIGN
 * "Models"). Each set-up trains 3 SGD-momentum steps (lr 0.01: a larger rate makes the run
 * ill-conditioned, which expect_well_conditioned checks) with cross entropy (labels in host
 * memory: the pipeline's loss callback takes its rows by first_row) and is compared with one
 * device: every step's loss, the last gradients, the final weights and the BatchNorm buffers.
 *   - eval mode (BatchNorm on its running statistics, set to values that are not 0 and 1):
 *     model parallel (a module whose forward copies the activation between its two
 *     Sequentials), and the pipeline with micro-batches of 1 and of 3 rows (one that does not
 *     divide the batch), driven by its forward + one backward (GPipe) and by
 *     clpar_pipeline_train_step under GPipe and 1F1B: the one-device step.
 *   - training mode: model parallel, and the pipeline with one micro-batch, are the one-device
 *     step (running statistics included). With micro-batches each BatchNorm sees its
 *     micro-batch's statistics and updates its running statistics once per micro-batch, as in
 *     PyTorch's Pipe: the pipeline with micro-batches of 2 rows equals one device that
 *     accumulates the gradients of the two halves run one after the other, and differs from the
 *     full-batch step (asserted, so that the test would notice if it did not).
 * Tolerance: 1e-5 of each tensor's largest value when both devices run the same backend; when
 * the host backend is one of the two (CLPAR_DEVICES=host,opencl:0, or one device selected)
 * 1e-4: the two backends sum convolutions' products in different orders (the host's GEMM and
 * the OpenCL kernels), and 10 convolutions and BatchNorms of float32 rounding over 3 steps
 * came to 7e-6 (training, one micro-batch) and 1.9e-5 (training, micro-batches of 2) on
 * PoCL's pthread device with the host; two PoCL devices differed by at most 1.2e-6. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { STEPS = 3, BATCH = 4, SIZE = 40, CLASSES = 10 };

static clpar_device *dev0, *dev1;

static int pick(void) {
  dev0 = clpar_device_get(0);
  dev1 = clpar_device_count() > 1 ? clpar_device_get(1) : tu_second_device(dev0);
  return dev1 != NULL;
}

static float tolerance(void) {
  return (dev0 == clpar_device_host() || dev1 == clpar_device_host()) ? 1e-4f : 1e-5f;
}

/* ---- models ---- */

/* The same small ResNet every time, on dev0, in training or eval mode; in eval mode its
 * running statistics get values of their own (mean in +-0.2, variance in 0.5 .. 1.5). */
static clpar_module *small_resnet(int training) {
  clpar_module *m;
  clpar_manual_seed(5);
  tu_ok(clpar_resnet_create(CLPAR_RESNET_BASIC, (const int[4]){1, 1, 1, 1}, CLASSES, dev0, &m));
  tu_ok(clpar_module_train(m, training));
  for (int i = 0; !training && i < clpar_module_buffer_count(m); i++) {
    const char *name;
    clpar_tensor *b;
    tu_ok(clpar_module_buffer_at(m, i, &name, &b));
    if (clpar_tensor_dtype(b) != CLPAR_FLOAT32) continue;
    size_t n = (size_t)clpar_tensor_numel(b);
    float *v = tu_rand(n, 900 + (uint64_t)i);
    int is_var = strstr(name, "running_var") != NULL;
    for (size_t j = 0; j < n; j++) v[j] = is_var ? 1.0f + 0.5f * v[j] : 0.2f * v[j];
    tu_ok(clpar_tensor_write(b, v, n));
    free(v);
  }
  return m;
}

typedef struct {
  clpar_device *d0, *d1;
} mp_devices;

/* ModelParallelResNet50's forward: seq2(seq1(x).to(dev1)) (fc is the last module of seq2). */
static clpar_status mp_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **out,
                               void *user) {
  const mp_devices *d = user;
  clpar_tensor *h;
  clpar_status s = clpar_module_forward(clpar_module_child(self, "seq1"), x, &h);
  if (s == CLPAR_OK) s = clpar_tensor_to(h, d->d1, &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "seq2"), h, out);
  return s;
}

static mp_devices mp_devs;

static clpar_module *model_parallel(int training) {
  clpar_module *r = small_resnet(training), *head, *tail, *m;
  tu_ok(clpar_resnet_split(r, 2, &head, &tail));
  clpar_module_free(r); /* its children live on in head and tail */
  tu_ok(clpar_module_to(tail, dev1));
  mp_devs = (mp_devices){dev0, dev1};
  tu_ok(clpar_module_create("ModelParallelResNet", mp_forward, &mp_devs, NULL, &m));
  tu_ok(clpar_module_add_child(m, "seq1", head));
  tu_ok(clpar_module_add_child(m, "seq2", tail));
  return m;
}

static clpar_module *pipelined(int training, int64_t split, clpar_pipeline_schedule sched) {
  clpar_module *r = small_resnet(training), *stages[2], *pipe;
  tu_ok(clpar_resnet_split(r, 2, &stages[0], &stages[1]));
  clpar_module_free(r);
  clpar_pipeline_options o = {.split_size = split, .schedule = sched};
  tu_ok(clpar_pipeline_create(stages, (clpar_device *const[]){dev0, dev1}, 2, &o, &pipe));
  return pipe;
}

/* ---- training ---- */

typedef enum { BY_FORWARD, BY_STEP, BY_HALVES } drive;

typedef struct {
  float loss[STEPS];
  float **grads, **weights, **buffers; /* per parameter / float buffer */
  size_t *n_grads, *n_bufs;
  int n_params, n_buffers;
} run_result;

static int32_t labels[STEPS][BATCH];

static clpar_status ce_fn(clpar_tensor *out, clpar_tensor *target, int64_t first_row, void *user,
                          clpar_tensor **loss) {
  (void)target;
  const int32_t *l = user;
  return clpar_cross_entropy(out, l + first_row, clpar_tensor_dim(out, 0), CLPAR_REDUCTION_MEAN,
                             loss);
}

static void read_all(clpar_module *m, run_result *r) {
  r->n_params = clpar_module_parameter_count(m);
  r->n_buffers = clpar_module_buffer_count(m);
  r->grads = calloc((size_t)r->n_params, sizeof *r->grads);
  r->weights = calloc((size_t)r->n_params, sizeof *r->weights);
  r->n_grads = calloc((size_t)r->n_params, sizeof *r->n_grads);
  r->buffers = calloc((size_t)r->n_buffers, sizeof *r->buffers);
  r->n_bufs = calloc((size_t)r->n_buffers, sizeof *r->n_bufs);
  for (int i = 0; i < r->n_params; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    assert_non_null(clpar_tensor_grad(p));
    r->n_grads[i] = (size_t)clpar_tensor_numel(p);
    r->weights[i] = tu_read(p);
    r->grads[i] = tu_read(clpar_tensor_grad(p));
  }
  for (int i = 0; i < r->n_buffers; i++) {
    clpar_tensor *b;
    tu_ok(clpar_module_buffer_at(m, i, NULL, &b));
    if (clpar_tensor_dtype(b) != CLPAR_FLOAT32) continue; /* num_batches_tracked: below */
    r->n_bufs[i] = (size_t)clpar_tensor_numel(b);
    r->buffers[i] = tu_read(b);
  }
}

static void result_free(run_result *r) {
  for (int i = 0; i < r->n_params; i++) {
    free(r->grads[i]);
    free(r->weights[i]);
  }
  for (int i = 0; i < r->n_buffers; i++) free(r->buffers[i]);
  free(r->grads);
  free(r->weights);
  free(r->n_grads);
  free(r->buffers);
  free(r->n_bufs);
}

/* rows [row0, row0 + rows) of the step's images on dev0 */
static float input_scale = 1.0f; /* 1 +- 1e-6 in the conditioning check */

static clpar_tensor *images(int step, int row0, int rows) {
  size_t per = 3 * SIZE * SIZE;
  float *all = tu_rand(per * BATCH, 700 + (uint64_t)step);
  for (size_t i = 0; input_scale != 1.0f && i < per * BATCH; i++) all[i] *= input_scale;
  clpar_tensor *x;
  tu_ok(clpar_tensor_from_host(dev0, 4, (int64_t[]){rows, 3, SIZE, SIZE}, all + per * row0, &x));
  free(all);
  return x;
}

static void train(clpar_module *m, drive how, run_result *r) {
  clpar_optimizer *opt;
  clpar_sgd_options o = {.lr = 0.01f, .momentum = 0.9f}; /* 0.02 is ill-conditioned: below */
  tu_ok(clpar_sgd_create_for(m, &o, &opt));
  for (int step = 0; step < STEPS; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *y, *loss = NULL;
    tu_ok(clpar_optimizer_zero_grad(opt));
    if (how == BY_STEP) {
      x = images(step, 0, BATCH);
      tu_ok(clpar_pipeline_train_step(m, x, NULL, ce_fn, labels[step], &loss));
      tu_ok(clpar_tensor_read(loss, &r->loss[step], 1));
    } else if (how == BY_FORWARD) {
      x = images(step, 0, BATCH);
      tu_ok(clpar_module_forward(m, x, &y));
      tu_ok(ce_fn(y, NULL, 0, labels[step], &loss));
      tu_ok(clpar_backward(loss));
      tu_ok(clpar_tensor_read(loss, &r->loss[step], 1));
    } else { /* gradient accumulation over two halves: what micro-batches of 2 rows compute */
      r->loss[step] = 0;
      for (int half = 0; half < 2; half++) {
        float v;
        x = images(step, half * BATCH / 2, BATCH / 2);
        tu_ok(clpar_module_forward(m, x, &y));
        tu_ok(ce_fn(y, NULL, half * BATCH / 2, labels[step], &loss));
        tu_ok(clpar_scale(loss, 0.5f, &loss));
        tu_ok(clpar_backward(loss));
        tu_ok(clpar_tensor_read(loss, &v, 1));
        r->loss[step] += v;
      }
    }
    tu_ok(clpar_optimizer_step(opt)); /* leaves the last step's gradients */
    clpar_scope_end(sc);
  }
  read_all(m, r);
  clpar_optimizer_free(opt);
}

/* the largest |a - b| of a tensor over its largest |b| */
static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0, big = 0;
  for (size_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    big = fmax(big, fabs((double)b[i]));
  }
  return big > 0 ? d / big : d;
}

/* The worst relative difference over the losses, gradients, weights and buffers; *where names
 * the tensor that gives it (for the failure message). */
static double worst_diff_at(const run_result *a, const run_result *ref, char *where, size_t len) {
  assert_int_equal(a->n_params, ref->n_params);
  assert_int_equal(a->n_buffers, ref->n_buffers);
  double w = rel_diff(a->loss, ref->loss, STEPS), d;
  snprintf(where, len, "the losses");
  for (int i = 0; i < a->n_params; i++) {
    assert_int_equal(a->n_grads[i], ref->n_grads[i]);
    if ((d = rel_diff(a->grads[i], ref->grads[i], a->n_grads[i])) > w)
      w = d, snprintf(where, len, "the gradient of parameter %d", i);
    if ((d = rel_diff(a->weights[i], ref->weights[i], a->n_grads[i])) > w)
      w = d, snprintf(where, len, "parameter %d", i);
  }
  for (int i = 0; i < a->n_buffers; i++)
    if (ref->buffers[i] && (d = rel_diff(a->buffers[i], ref->buffers[i], ref->n_bufs[i])) > w)
      w = d, snprintf(where, len, "buffer %d", i);
  return w;
}

static double worst_diff(const run_result *a, const run_result *ref) {
  char where[64];
  return worst_diff_at(a, ref, where, sizeof where);
}

static void expect_same(const run_result *a, const run_result *ref, const char *what) {
  char where[64];
  double w = worst_diff_at(a, ref, where, sizeof where);
  if (!(w <= tolerance()))
    fail_msg(
        "%s on %s and %s: %s differs from one device by %.3g of the tensor's largest value "
        "(tolerance %.0g)",
        what, clpar_device_id(dev0), clpar_device_id(dev1), where, w, (double)tolerance());
}

static void run_one_device(int training, drive how, run_result *r) {
  clpar_module *m = small_resnet(training);
  train(m, how, r);
  clpar_module_free(m);
}

/* The comparisons test the parallel modes only if the one-device run is well conditioned:
 * devices round differently, so the run must not amplify a small change of its input. The
 * input is scaled by 1 - 1e-6 and 1 + 1e-6, and each result must move by at most 50 times
 * that (about 4e-6 at learning rate 0.01 here). At learning rate 0.05 (or 0.02) a decision near its
 * threshold (a ReLU, a max-pool, a BatchNorm over 16 values in layer4) flipped: the third
 * step's gradients moved by 0.2-0.9 of their largest value for a change of 1e-6, and NVIDIA's
 * OpenCL device, rounding its sums in another order than the host, "differed" by as much. */
static void expect_well_conditioned(int training, drive how, const run_result *ref) {
  for (int sign = -1; sign <= 1; sign += 2) {
    run_result p;
    input_scale = 1.0f + (float)sign * 1e-6f;
    run_one_device(training, how, &p);
    input_scale = 1.0f;
    char where[64];
    double w = worst_diff_at(&p, ref, where, sizeof where);
    if (!(w <= 50 * 1e-6))
      fail_msg(
          "one device: %s moves by %.3g of its largest value when the input is scaled by "
          "1 %c 1e-6: the run is ill-conditioned, and a comparison of devices would measure "
          "their rounding",
          where, w, sign < 0 ? '-' : '+');
    result_free(&p);
  }
}

static void run_and_compare(clpar_module *m, drive how, const run_result *ref, const char *what) {
  run_result r;
  train(m, how, &r);
  expect_same(&r, ref, what);
  result_free(&r);
  clpar_module_free(m);
}

static int setup_labels(void **state) {
  for (int s = 0; s < STEPS; s++)
    for (int i = 0; i < BATCH; i++) labels[s][i] = (int32_t)((7 * s + 3 * i + 1) % CLASSES);
  return tu_setup(state);
}

/* ---- tests ---- */

static void test_split_structure(void **state) {
  (void)state;
  clpar_module *r, *head, *tail;
  tu_ok(clpar_resnet_create(CLPAR_RESNET_BOTTLENECK, (const int[4]){1, 1, 1, 1}, CLASSES,
                            clpar_device_get(0), &r));
  /* errors first: nothing made */
  clpar_module *none = NULL;
  assert_int_equal(clpar_resnet_split(r, 0, &head, &tail), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_resnet_split(r, 4, &head, &tail), CLPAR_ERROR_INVALID_ARGUMENT);
  tu_ok(clpar_relu_create(&none));
  assert_int_equal(clpar_resnet_split(none, 2, &head, &tail), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "conv1"));
  clpar_module_free(none);

  tu_ok(clpar_resnet_split(r, 2, &head, &tail));
  assert_ptr_equal(clpar_module_child(head, "0"), clpar_module_child(r, "conv1"));
  assert_ptr_equal(clpar_module_child(head, "5"), clpar_module_child(r, "layer2"));
  assert_null(clpar_module_child(head, "6"));
  assert_ptr_equal(clpar_module_child(tail, "0"), clpar_module_child(r, "layer3"));
  assert_ptr_equal(clpar_module_child(tail, "2"), clpar_module_child(r, "avgpool"));
  assert_string_equal(clpar_module_type(clpar_module_child(tail, "3")), "Flatten");
  assert_ptr_equal(clpar_module_child(tail, "4"), clpar_module_child(r, "fc"));
  /* the same parameters, in the same order */
  int nh = clpar_module_parameter_count(head), nt = clpar_module_parameter_count(tail);
  assert_int_equal(nh + nt, clpar_module_parameter_count(r));
  for (int i = 0; i < nh + nt; i++) {
    clpar_tensor *a, *b;
    tu_ok(clpar_module_parameter_at(i < nh ? head : tail, i < nh ? i : i - nh, NULL, &a));
    tu_ok(clpar_module_parameter_at(r, i, NULL, &b));
    assert_ptr_equal(a, b);
  }
  const char *name;
  tu_ok(clpar_module_parameter_at(head, 0, &name, NULL));
  assert_string_equal(name, "0.weight");

  /* tail(head(x)) is resnet(x), and the halves outlive the ResNet */
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(clpar_device_get(0), 4, (int64_t[]){2, 3, 32, 32}, 3), *y, *h, *z;
  tu_ok(clpar_module_forward(r, x, &y));
  float *want = tu_read(y);
  clpar_module_free(r);
  tu_ok(clpar_module_forward(head, x, &h));
  tu_ok(clpar_module_forward(tail, h, &z));
  assert_int_equal(clpar_tensor_numel(z), 2 * CLASSES);
  float *got = tu_read(z);
  tu_assert_close(got, want, 2 * CLASSES, 1e-6f, 1e-7f, "tail(head(x)) against resnet(x)");
  free(got);
  free(want);
  clpar_scope_end(sc);
  clpar_module_free(head);
  clpar_module_free(tail);
}

/* BatchNorm in eval mode: model parallel and every pipelined set-up equal one device. */
static void test_eval_mode_equals_one_device(void **state) {
  (void)state;
  if (!pick()) skip();
  run_result ref;
  run_one_device(0, BY_FORWARD, &ref);
  expect_well_conditioned(0, BY_FORWARD, &ref);
  run_and_compare(model_parallel(0), BY_FORWARD, &ref, "model parallel, eval");
  /* micro-batches of 1 and of 3 rows (not dividing the batch); the forward is always GPipe */
  run_and_compare(pipelined(0, 1, CLPAR_PIPELINE_GPIPE), BY_FORWARD, &ref,
                  "pipeline split 1, eval, forward + backward");
  run_and_compare(pipelined(0, 1, CLPAR_PIPELINE_1F1B), BY_STEP, &ref,
                  "pipeline split 1, eval, train_step 1F1B");
  run_and_compare(pipelined(0, 3, CLPAR_PIPELINE_GPIPE), BY_STEP, &ref,
                  "pipeline split 3, eval, train_step GPipe");
  run_and_compare(pipelined(0, 3, CLPAR_PIPELINE_1F1B), BY_STEP, &ref,
                  "pipeline split 3, eval, train_step 1F1B");
  result_free(&ref);
}

/* BatchNorm in training mode: exact with one micro-batch; micro-batch statistics otherwise. */
static void test_train_mode_micro_batch_statistics(void **state) {
  (void)state;
  if (!pick()) skip();
  run_result ref, halves, r;
  run_one_device(1, BY_FORWARD, &ref);
  expect_well_conditioned(1, BY_FORWARD, &ref);
  run_and_compare(model_parallel(1), BY_FORWARD, &ref, "model parallel, training");
  run_and_compare(pipelined(1, 0, CLPAR_PIPELINE_GPIPE), BY_STEP, &ref,
                  "pipeline, one micro-batch, training, GPipe");
  run_and_compare(pipelined(1, 0, CLPAR_PIPELINE_1F1B), BY_STEP, &ref,
                  "pipeline, one micro-batch, training, 1F1B");
  /* micro-batches of 2: the accumulated halves, not the full batch */
  run_one_device(1, BY_HALVES, &halves);
  expect_well_conditioned(1, BY_HALVES, &halves);
  run_and_compare(pipelined(1, 2, CLPAR_PIPELINE_1F1B), BY_STEP, &halves,
                  "pipeline split 2, training, 1F1B, against two accumulated halves");
  clpar_module *m = pipelined(1, 2, CLPAR_PIPELINE_GPIPE);
  train(m, BY_FORWARD, &r);
  expect_same(&r, &halves, "pipeline split 2, training, forward + backward, against two halves");
  double w = worst_diff(&r, &ref);
  if (!(w > 100 * tolerance()))
    fail_msg("micro-batch statistics: split 2 differs from the full batch by only %.3g", w);
  result_free(&r);
  clpar_module_free(m);
  result_free(&halves);
  result_free(&ref);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_structure),
      cmocka_unit_test(test_eval_mode_equals_one_device),
      cmocka_unit_test(test_train_mode_micro_batch_statistics),
  };
  return cmocka_run_group_tests(tests, setup_labels, tu_teardown);
}
