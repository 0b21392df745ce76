/* test_data_parallel.c — DataParallel against the same computation on one device: forward
 * outputs, and parameters after several SGD steps (a batch the device count does not divide,
 * the device order permuted, uneven weights); the split sizes; replicas that copy only what
 * changed; an error inside one replica reported with its device, with nothing changed; a
 * training step that blocks the caller only to read the loss and makes a fixed number of
 * transfers; backward after the wrapper was freed; training with parameters large enough for
 * pinned staging, many steps posted ahead. The devices are the selected ones, plus a
 * second one when one is selected (tu_second_device: the host backend, or, when host is the
 * one selected, an unselected PoCL device), so every run spans two devices at least. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* Up to four devices for DataParallel: the selected ones, else the one and a second. */
static int pick_devices(clpar_device **devs) {
  int n = 0;
  for (int i = 0; i < clpar_device_count() && n < 4; i++) devs[n++] = clpar_device_get(i);
  if (n < 2 && (devs[1] = tu_second_device(devs[0]))) n++;
  return n;
}

/* Only a build without OpenCL on a machine without CUDA has no second device. */
static void no_second_device(void) {
  fprintf(stderr, "skipped: this machine has no second device\n");
  skip();
}

/* An MLP 5-hidden-3 with fixed weights (seeded), its parameters on dev. */
static clpar_module *make_mlp_hidden(clpar_device *dev, int64_t hidden) {
  clpar_module *layers[3], *mlp;
  clpar_manual_seed(11);
  tu_ok(clpar_linear_create(5, hidden, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(hidden, 3, 1, dev, &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &mlp));
  return mlp;
}

static clpar_module *make_mlp(clpar_device *dev) {
  return make_mlp_hidden(dev, 16);
}

/* Trains m for steps SGD steps (learning rate lr) on batches of rows rows; params (flattened)
 * into out. */
static void train_lr(clpar_module *m, clpar_device *data_dev, int rows, int steps, float lr,
                     float *out, int n_out) {
  clpar_optimizer *opt;
  clpar_sgd_options o = {.lr = lr, .momentum = 0.9f};
  tu_ok(clpar_sgd_create_for(m, &o, &opt));
  for (int step = 0; step < steps; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *y, *target, *loss;
    tu_ok(clpar_tensor_rand_normal(data_dev, 2, (int64_t[]){rows, 5}, 300 + (uint64_t)step, 0, 1,
                                   &x));
    tu_ok(clpar_tensor_rand_normal(data_dev, 2, (int64_t[]){rows, 3}, 400 + (uint64_t)step, 0, 1,
                                   &target));
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(m, x, &y));
    clpar_tensor *t = target;
    if (clpar_tensor_device(y) != data_dev)
      tu_ok(clpar_tensor_to(target, clpar_tensor_device(y), &t));
    tu_ok(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_scope_end(sc);
  }
  int at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, out + at, (size_t)(n_out - at)));
    at += (int)clpar_tensor_numel(p);
  }
  assert_int_equal(at, n_out);
  clpar_optimizer_free(opt);
}

static void train(clpar_module *m, clpar_device *data_dev, int rows, int steps, float *out,
                  int n_out) {
  train_lr(m, data_dev, rows, steps, 0.1f, out, n_out);
}

enum { N_PARAMS = 5 * 16 + 16 + 16 * 3 + 3 };

static void compare_training(clpar_device **devs, int n, const float *weights, int rows,
                             const char *what) {
  float ref[N_PARAMS], got[N_PARAMS];
  clpar_module *single = make_mlp(devs[0]);
  train(single, devs[0], rows, 4, ref, N_PARAMS);
  clpar_module_free(single);
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n, .weights = weights};
  tu_ok(clpar_data_parallel_create(make_mlp(devs[0]), &o, &dp));
  const char *name;
  tu_ok(clpar_module_parameter_at(dp, 0, &name, NULL));
  assert_string_equal(name, "module.0.weight"); /* PyTorch's names under DataParallel */
  train(dp, devs[0], rows, 4, got, N_PARAMS);
  tu_assert_close(got, ref, N_PARAMS, 1e-5f, 1e-6f, what);
  clpar_module_free(dp);
}

static void test_training_equals_one_device(void **state) {
  (void)state;
  clpar_device *devs[4];
  int n = pick_devices(devs);
  if (n < 2) no_second_device();
  compare_training(devs, n, NULL, 30, "DataParallel, batch 30");
  compare_training(devs, n, NULL, 31, "DataParallel, batch 31 (not divisible)");
  compare_training(devs, n, NULL, 3, "DataParallel, batch 3 (fewer chunks than devices)");
  clpar_device *rev[4];
  for (int i = 0; i < n; i++) rev[i] = devs[n - 1 - i];
  compare_training(rev, n, NULL, 31, "DataParallel, devices permuted");
  float w[4] = {3, 1, 2, 1};
  compare_training(devs, n, w, 29, "DataParallel, uneven weights");
  float tiny_first[4] = {0.001f, 1, 1, 1}; /* the first device gets no rows at all */
  compare_training(devs, n, tiny_first, 5, "DataParallel, no rows on the parameters' device");
}

/* Parameters above the 16 KiB that go through plain memory (5-1024-3: 36 KiB): the flat copies
 * take pinned staging blocks, and over 24 steps posted without reading anything back (the
 * caller runs ahead) blocks are reused while still busy once a device has 8 (transfer.c). */
static void test_training_through_pinned_staging(void **state) {
  (void)state;
  clpar_device *devs[4];
  int n = pick_devices(devs);
  if (n < 2) no_second_device();
  enum { H = 1024, P = 5 * H + H + H * 3 + 3 };
  float *ref = malloc(sizeof(float) * P), *got = malloc(sizeof(float) * P);
  assert_non_null(ref);
  assert_non_null(got);
  clpar_module *single = make_mlp_hidden(devs[0], H);
  train_lr(single, devs[0], 30, 24, 0.002f, ref, P);
  clpar_module_free(single);
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  tu_ok(clpar_data_parallel_create(make_mlp_hidden(devs[0], H), &o, &dp));
  train_lr(dp, devs[0], 30, 24, 0.002f, got, P);
  tu_assert_close(got, ref, P, 1e-4f, 1e-5f, "DataParallel, 36 KiB of parameters, 24 steps");
  clpar_module_free(dp);
  free(ref);
  free(got);
}

static void test_forward_equals_one_device(void **state) {
  (void)state;
  clpar_device *devs[4];
  int n = pick_devices(devs);
  clpar_module *single = make_mlp(devs[0]), *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n, .output_device = devs[n - 1]};
  tu_ok(clpar_data_parallel_create(make_mlp(devs[0]), &o, &dp));
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *ys, *yd;
  tu_ok(
      clpar_tensor_rand_normal(tu_host(), 2, (int64_t[]){30, 5}, 9, 0, 1, &x)); /* input on host */
  clpar_tensor *xd;
  tu_ok(clpar_tensor_to(x, devs[0], &xd));
  tu_ok(clpar_module_forward(single, xd, &ys));
  tu_ok(clpar_module_forward(dp, x, &yd));
  assert_ptr_equal(clpar_tensor_device(yd), devs[n - 1]); /* gathered on the output device */
  assert_int_equal(clpar_tensor_dim(yd, 0), 30);
  float *a = tu_read(yd), *b = tu_read(ys);
  tu_assert_close(a, b, 90, 1e-5f, 1e-6f, "DataParallel forward");
  free(a);
  free(b);
  clpar_scope_end(sc);
  clpar_module_free(single);
  clpar_module_free(dp);
}

static void test_split_sizes(void **state) {
  (void)state;
  clpar_device *devs[4];
  int n = pick_devices(devs);
  if (n < 2) no_second_device();
  clpar_module *dp;
  float w[2] = {3, 1};
  clpar_data_parallel_options o = {.devices = devs, .n_devices = 2, .weights = w};
  tu_ok(clpar_data_parallel_create(make_mlp(devs[0]), &o, &dp));
  int64_t sizes[2];
  assert_int_equal(clpar_data_parallel_split(dp, 100, sizes), 2);
  assert_int_equal(sizes[0], 75); /* weights 3, 1: 75% and 25% of the rows */
  assert_int_equal(sizes[1], 25);
  assert_int_equal(clpar_data_parallel_split(dp, 30, sizes), 2);
  assert_int_equal(sizes[0] + sizes[1], 30);
  assert_int_equal(sizes[0], 23); /* 22.5 and 7.5: the tie goes to the first */
  assert_int_equal(clpar_data_parallel_split(dp, 0, sizes), CLPAR_ERROR_EMPTY);
  /* weighted, the largest batch there is: no endless loop, no overflow, 3:1 kept */
  assert_int_equal(clpar_data_parallel_split(dp, INT64_MAX, sizes), 2);
  int64_t sum;
  assert_false(__builtin_add_overflow(sizes[0], sizes[1], &sum));
  assert_int_equal(sum, INT64_MAX);
  assert_true(sizes[0] > 0 && sizes[1] > 0);
  assert_true(fabs((double)sizes[0] / (double)INT64_MAX - 0.75) < 1e-6);
  clpar_module_free(dp);
  /* torch.chunk sizes without weights, zero for devices left without rows */
  o.weights = NULL;
  o.n_devices = n;
  tu_ok(clpar_data_parallel_create(make_mlp(devs[0]), &o, &dp));
  int64_t s4[4];
  assert_int_equal(clpar_data_parallel_split(dp, 2, s4), n);
  assert_int_equal(s4[0], 1);
  assert_int_equal(s4[1], 1);
  for (int i = 2; i < n; i++) assert_int_equal(s4[i], 0);
  /* the largest batch there is: no overflow, no endless loop, every row placed */
  assert_int_equal(clpar_data_parallel_split(dp, INT64_MAX, s4), n);
  int64_t total = 0;
  for (int i = 0; i < n; i++) assert_false(__builtin_add_overflow(total, s4[i], &total));
  assert_int_equal(total, INT64_MAX);
  clpar_module_free(dp);
}

/* Replicas persist: a forward copies the flat parameters once to each replica after they
 * changed (any of them), and never when none changed. */
static void test_replicas_copy_only_what_changed(void **state) {
  (void)state;
  clpar_device *devs[4];
  int n = pick_devices(devs);
  if (n < 2) no_second_device();
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  tu_ok(clpar_data_parallel_create(make_mlp(devs[0]), &o, &dp));
  clpar_data_parallel_stats st;
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *y, *loss;
  tu_ok(clpar_tensor_rand_normal(devs[0], 2, (int64_t[]){40, 5}, 1, 0, 1, &x));
  tu_ok(clpar_module_forward(dp, x, &y)); /* first forward: one flat copy per replica */
  tu_ok(clpar_data_parallel_stats_get(dp, &st));
  assert_int_equal(st.parameters_copied, n - 1);
  tu_ok(clpar_module_forward(dp, x, &y)); /* nothing changed: nothing copied */
  tu_ok(clpar_data_parallel_stats_get(dp, &st));
  assert_int_equal(st.parameters_copied, n - 1);
  assert_int_equal(st.forwards, 2);
  /* an optimizer step on one parameter only: again one flat copy per replica */
  tu_ok(clpar_sum(y, &loss));
  tu_ok(clpar_backward(loss));
  clpar_tensor *bias =
      clpar_module_parameter(clpar_module_child(clpar_module_child(dp, "module"), "2"), "bias");
  clpar_optimizer *opt;
  clpar_sgd_options so = {.lr = 0.1f};
  tu_ok(clpar_sgd_create(&bias, 1, &so, &opt));
  tu_ok(clpar_optimizer_step(opt));
  tu_ok(clpar_module_forward(dp, x, &y));
  tu_ok(clpar_data_parallel_stats_get(dp, &st));
  assert_int_equal(st.parameters_copied, 2 * (n - 1));
  tu_ok(clpar_data_parallel_stats_reset(dp));
  tu_ok(clpar_data_parallel_stats_get(dp, &st));
  assert_int_equal(st.forwards, 0);
  assert_int_equal(st.parameters_copied, 0);
  assert_true(st.scatter_seconds == 0 && st.replicate_seconds == 0 && st.apply_seconds == 0 &&
              st.gather_seconds == 0 && st.reduce_seconds == 0);
  clpar_optimizer_free(opt);
  clpar_scope_end(sc);
  clpar_module_free(dp);
}

/* A user module whose forward fails on one device (a shape error of its own making). */
static clpar_device *failing_device;

static clpar_status picky_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                  void *user) {
  (void)user;
  clpar_tensor *w = clpar_module_parameter(self, "w");
  if (clpar_tensor_device(x) == failing_device) {
    clpar_tensor *bad;
    clpar_status s = clpar_tensor_rows(x, 0, 1, &bad);
    if (s != CLPAR_OK) return s;
    s = clpar_matmul(bad, bad, 0, 0, y); /* [1, 4] @ [1, 4]: the inner sizes differ */
    clpar_tensor_free(bad);
    return s;
  }
  return clpar_matmul(x, w, 0, 0, y);
}

static void test_replica_error_is_reported(void **state) {
  (void)state;
  clpar_device *devs[4];
  int n = pick_devices(devs);
  if (n < 2) no_second_device();
  clpar_module *m, *dp;
  clpar_tensor *w;
  tu_ok(clpar_tensor_rand_uniform(devs[0], 2, (int64_t[]){4, 2}, 5, -1, 1, &w));
  tu_ok(clpar_module_create("Picky", picky_forward, NULL, NULL, &m));
  tu_ok(clpar_module_add_parameter(m, "w", w));
  float before[8], after[8];
  tu_ok(clpar_tensor_read(w, before, 8));
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  tu_ok(clpar_data_parallel_create(m, &o, &dp));
  failing_device = devs[n - 1];
  clpar_tensor *x, *y = (clpar_tensor *)(uintptr_t)0x5;
  tu_ok(clpar_tensor_rand_uniform(devs[0], 2, (int64_t[]){20, 4}, 6, -1, 1, &x));
  clpar_memory_stats m0, m1;
  tu_ok(clpar_device_memory_stats(devs[0], &m0));
  assert_int_equal(clpar_module_forward(dp, x, &y), CLPAR_ERROR_SHAPE_MISMATCH);
  const char *msg = clpar_last_error();
  assert_non_null(strstr(msg, "DataParallel replica on"));
  assert_non_null(strstr(msg, clpar_device_id(failing_device)));
  assert_ptr_equal(y, (clpar_tensor *)(uintptr_t)0x5);
  tu_ok(clpar_device_memory_stats(devs[0], &m1));
  assert_int_equal(m1.bytes_in_use, m0.bytes_in_use); /* nothing left behind */
  tu_ok(clpar_tensor_read(w, after, 8));
  assert_memory_equal(before, after, sizeof before);
  failing_device = NULL; /* and the same wrapper works again */
  tu_ok(clpar_module_forward(dp, x, &y));
  clpar_tensor_free(y);
  clpar_tensor_free(x);
  clpar_tensor_free(w);
  clpar_module_free(dp);
}

static void test_bad_options(void **state) {
  (void)state;
  clpar_device *devs[2] = {clpar_device_get(0), clpar_device_get(0)};
  clpar_module *dp = (clpar_module *)(uintptr_t)0x9;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = 2};
  assert_int_equal(clpar_data_parallel_create(make_mlp(devs[0]), &o, &dp),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "listed twice"));
  float w[1] = {0};
  clpar_data_parallel_options o2 = {.devices = devs, .n_devices = 1, .weights = w};
  assert_int_equal(clpar_data_parallel_create(make_mlp(devs[0]), &o2, &dp),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_data_parallel_create(NULL, NULL, &dp), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_ptr_equal(dp, (clpar_module *)(uintptr_t)0x9);
  assert_int_equal(clpar_data_parallel_split(NULL, 3, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
}

/* One device: the wrapper runs the module as it is, no copy. Its forward takes exactly the
 * device memory the wrapped module's own forward takes. */
static void test_one_device_makes_no_copies(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = &dev, .n_devices = 1};
  tu_ok(clpar_data_parallel_create(make_mlp(dev), &o, &dp));
  clpar_module *inner = clpar_module_child(dp, "module");
  clpar_tensor *x;
  tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){30, 5}, 2, 0, 1, &x));
  uint64_t used[2];
  clpar_module *which[2] = {inner, dp};
  for (int i = 0; i < 2; i++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *y;
    clpar_memory_stats a, b;
    tu_ok(clpar_device_memory_stats(dev, &a));
    tu_ok(clpar_module_forward(which[i], x, &y));
    tu_ok(clpar_device_memory_stats(dev, &b));
    used[i] = b.bytes_in_use - a.bytes_in_use;
    assert_ptr_equal(clpar_tensor_device(y), dev);
    clpar_scope_end(sc);
  }
  assert_true(used[0] > 0);
  assert_int_equal(used[1], used[0]); /* no copy of the input, none of the output */
  clpar_data_parallel_stats st;
  tu_ok(clpar_data_parallel_stats_get(dp, &st));
  assert_int_equal(st.parameters_copied, 0);
  clpar_tensor_free(x);
  clpar_module_free(dp);
}

/* Host waits and transfers into devices so far, summed over devs and the host device. */
static void count_now(clpar_device *const *devs, int n, uint64_t *waits, uint64_t *transfers) {
  *waits = *transfers = 0;
  int host_seen = 0;
  for (int i = 0; i <= n; i++) {
    clpar_device *d = i < n ? devs[i] : tu_host();
    if (i == n && host_seen) break;
    host_seen |= d == tu_host();
    clpar_device_counters c;
    tu_ok(clpar_device_counters_get(d, &c));
    *waits += c.host_waits;
    *transfers += c.transfers_in;
  }
}

/* One DataParallel training step on two devices (after a warm-up step): the calling thread
 * blocks once, to read the loss, and the step makes exactly five transfers, all for the
 * second replica: its input chunk, one flat copy of the parameters (they changed in the
 * last step), its output to the output device; in backward, that output's gradient back,
 * and one flat copy of its parameters' gradient to the main device. With the parameters as
 * separate tensors the step would make a parameter and a gradient copy per tensor. */
static void test_step_waits_once_and_transfers_are_bounded(void **state) {
  (void)state;
  clpar_device *devs[4];
  if (pick_devices(devs) < 2) no_second_device();
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = 2};
  tu_ok(clpar_data_parallel_create(make_mlp(devs[0]), &o, &dp));
  clpar_optimizer *opt;
  clpar_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
  tu_ok(clpar_sgd_create_for(dp, &so, &opt));
  clpar_tensor *x, *target;
  tu_ok(clpar_tensor_rand_normal(devs[0], 2, (int64_t[]){32, 5}, 71, 0, 1, &x));
  tu_ok(clpar_tensor_rand_normal(devs[0], 2, (int64_t[]){32, 3}, 72, 0, 1, &target));
  float losses[3];
  for (int step = 0; step < 3; step++) { /* step 0 warms up: pinned memory, kernels */
    uint64_t w0, t0, w1, t1, w2, t2;
    count_now(devs, 2, &w0, &t0);
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *y, *loss;
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(dp, x, &y));
    tu_ok(clpar_mse_loss(y, target, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    count_now(devs, 2, &w1, &t1);
    tu_ok(clpar_tensor_read(loss, &losses[step], 1));
    count_now(devs, 2, &w2, &t2);
    clpar_scope_end(sc);
    if (step == 0) continue;
    assert_int_equal(w1 - w0, 0); /* the step itself never blocks the caller */
    assert_int_equal(w2 - w1, 1); /* reading the loss does, once */
    assert_int_equal(t1 - t0, 5);
  }
  assert_true(losses[2] < losses[0]); /* and it trains */
  clpar_data_parallel_stats st;
  tu_ok(clpar_data_parallel_stats_get(dp, &st));
  assert_int_equal(st.parameters_copied, 3); /* one flat copy per forward to the one replica */
  clpar_tensor_free(x);
  clpar_tensor_free(target);
  clpar_optimizer_free(opt);
  clpar_module_free(dp);
}

/* The graph of a DataParallel forward owns what its backward uses: freeing the wrapper (and
 * the module it holds) before backward is safe, and the gradient still reaches a parameter
 * the caller kept, equal to the one-device gradient. */
static void test_backward_after_wrapper_freed(void **state) {
  (void)state;
  clpar_device *devs[4];
  int n = pick_devices(devs);
  if (n < 2) no_second_device();
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *y, *loss;
  tu_ok(clpar_tensor_rand_normal(devs[0], 2, (int64_t[]){12, 5}, 81, 0, 1, &x));
  /* the reference: the same module on one device */
  clpar_module *single = make_mlp(devs[0]);
  tu_ok(clpar_module_forward(single, x, &y));
  tu_ok(clpar_sum(y, &loss));
  tu_ok(clpar_backward(loss));
  clpar_tensor *ref_w;
  tu_ok(clpar_module_parameter_at(single, 0, NULL, &ref_w));
  float *ref = tu_read(clpar_tensor_grad(ref_w));
  clpar_module_free(single);
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  tu_ok(clpar_data_parallel_create(make_mlp(devs[0]), &o, &dp));
  clpar_tensor *w;
  tu_ok(clpar_module_parameter_at(dp, 0, NULL, &w));
  clpar_tensor_retain(w);
  tu_ok(clpar_module_forward(dp, x, &y));
  tu_ok(clpar_sum(y, &loss));
  clpar_module_free(dp); /* the wrapper, its replicas and the module go */
  tu_ok(clpar_backward(loss));
  assert_non_null(clpar_tensor_grad(w));
  float *got = tu_read(clpar_tensor_grad(w));
  tu_assert_close(got, ref, 80, 1e-5f, 1e-5f, "gradient after the wrapper was freed");
  free(got);
  free(ref);
  clpar_scope_end(sc);
  clpar_tensor_free(w);
}

/* A user module that keeps its children in its user data and reaches them there: every
 * replica then runs the original module's layers, whose parameters live on devices[0]. */
typedef struct {
  clpar_module *fc; /* the original's child, not the replica's */
} via_user;

static clpar_status via_user_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                     void *user) {
  (void)self;
  return clpar_module_forward(((via_user *)user)->fc, x, y);
}

static clpar_status param_via_user_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                           void *user) {
  (void)self;
  return clpar_linear(x, clpar_module_parameter(((via_user *)user)->fc, "weight"), NULL, y);
}

static void test_children_through_user_explained(void **state) {
  (void)state;
  clpar_device *devs[4];
  int n = pick_devices(devs);
  if (n < 2) no_second_device();
  via_user u;
  clpar_module *m, *dp;
  tu_ok(clpar_linear_create(4, 2, 1, devs[0], &u.fc));
  tu_ok(clpar_module_create("ViaUser", via_user_forward, &u, NULL, &m));
  tu_ok(clpar_module_add_child(m, "fc", u.fc));
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  tu_ok(clpar_data_parallel_create(m, &o, &dp));
  clpar_tensor *x, *y = NULL;
  tu_ok(clpar_tensor_rand_uniform(devs[0], 2, (int64_t[]){8, 4}, 6, -1, 1, &x));
  assert_int_equal(clpar_module_forward(dp, x, &y), CLPAR_ERROR_DEVICE_MISMATCH);
  const char *msg = clpar_last_error();
  if (!strstr(msg, "the original module's") || !strstr(msg, "through self") ||
      strstr(msg, "move one with clpar_tensor_to"))
    fail_msg("the message does not say what is wrong: %s", msg);
  assert_null(y);
  clpar_module_free(dp);
  /* a parameter reached through user data: the op's mismatch, with the same advice */
  tu_ok(clpar_linear_create(4, 2, 1, devs[0], &u.fc));
  tu_ok(clpar_module_create("ParamViaUser", param_via_user_forward, &u, NULL, &m));
  tu_ok(clpar_module_add_child(m, "fc", u.fc));
  tu_ok(clpar_data_parallel_create(m, &o, &dp));
  assert_int_equal(clpar_module_forward(dp, x, &y), CLPAR_ERROR_DEVICE_MISMATCH);
  msg = clpar_last_error();
  if (!strstr(msg, "every replica uses the original module's") || !strstr(msg, "through self"))
    fail_msg("the message does not say what may be wrong: %s", msg);
  assert_null(y);
  clpar_tensor_free(x);
  clpar_module_free(dp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_equals_one_device),
      cmocka_unit_test(test_training_equals_one_device),
      cmocka_unit_test(test_training_through_pinned_staging),
      cmocka_unit_test(test_split_sizes),
      cmocka_unit_test(test_replicas_copy_only_what_changed),
      cmocka_unit_test(test_replica_error_is_reported),
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_one_device_makes_no_copies),
      cmocka_unit_test(test_step_waits_once_and_transfers_are_bounded),
      cmocka_unit_test(test_backward_after_wrapper_freed),
      cmocka_unit_test(test_children_through_user_explained),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
