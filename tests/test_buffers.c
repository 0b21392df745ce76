/* test_buffers.c — module buffers and train/eval mode: names and order as PyTorch's
 * named_parameters(), named_buffers() and state_dict() give them (a hand-built tree whose
 * PyTorch twin is in tests/reference/module_state_names.py), buffers refused where PyTorch
 * refuses them, train/eval propagated through a tree, clpar_module_to moving buffers,
 * DataParallel giving every replica the main module's buffers and mode at each forward
 * (against the same module on one device), and safetensors checkpoints of parameters and
 * buffers (round trip, a missing or unexpected buffer named by a strict load). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

static clpar_status identity_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                     void *user) {
  (void)self;
  (void)user;
  return clpar_tensor_reshape(x, clpar_tensor_ndim(x),
                              (int64_t[]){clpar_tensor_dim(x, 0), clpar_tensor_dim(x, 1)}, y);
}

static clpar_tensor *zeros(clpar_device *dev, int64_t n) {
  clpar_tensor *t;
  tu_ok(clpar_tensor_zeros(dev, 1, &n, &t));
  return t;
}

static void add_param(clpar_module *m, const char *name, clpar_tensor *t) {
  tu_ok(clpar_module_add_parameter(m, name, t));
  clpar_tensor_free(t);
}

static void add_buffer(clpar_module *m, const char *name, clpar_tensor *t) {
  tu_ok(clpar_module_add_buffer(m, name, t));
  clpar_tensor_free(t);
}

/* A module with BatchNorm1d(c)'s parameters and buffers (only the names matter here);
 * extra: one more buffer, "extra". */
static clpar_module *bn_like(clpar_device *dev, int64_t c, int extra) {
  clpar_module *m;
  tu_ok(clpar_module_create("BatchNorm1d", identity_forward, NULL, NULL, &m));
  add_param(m, "weight", zeros(dev, c));
  add_param(m, "bias", zeros(dev, c));
  add_buffer(m, "running_mean", zeros(dev, c));
  add_buffer(m, "running_var", zeros(dev, c));
  add_buffer(m, "num_batches_tracked", zeros(dev, 1));
  if (extra) add_buffer(m, "extra", zeros(dev, 3));
  return m;
}

/* PyTorch's twin (tests/reference/module_state_names.py):
 *   class M(nn.Module): register_buffer("b0", zeros(2)); fc = Linear(3, 2);
 *     bn1 = BatchNorm1d(2); w = Parameter(zeros(1)); register_buffer("b1", zeros(1));
 *     seq = Sequential(BatchNorm1d(4), Linear(4, 4))
 * variant 1: bn1 has a buffer "extra" too; variant 2: no buffer "b1". */
static clpar_module *make_tree(clpar_device *dev, uint64_t seed, int variant) {
  clpar_module *m, *fc, *seq, *parts[2];
  clpar_manual_seed(seed);
  tu_ok(clpar_module_create("M", identity_forward, NULL, NULL, &m));
  add_buffer(m, "b0", zeros(dev, 2));
  tu_ok(clpar_linear_create(3, 2, 1, dev, &fc));
  tu_ok(clpar_module_add_child(m, "fc", fc));
  tu_ok(clpar_module_add_child(m, "bn1", bn_like(dev, 2, variant == 1)));
  add_param(m, "w", zeros(dev, 1));
  if (variant != 2) add_buffer(m, "b1", zeros(dev, 1));
  parts[0] = bn_like(dev, 4, 0);
  tu_ok(clpar_linear_create(4, 4, 1, dev, &parts[1]));
  tu_ok(clpar_sequential_create(parts, 2, &seq));
  tu_ok(clpar_module_add_child(m, "seq", seq));
  return m;
}

/* torch 1.13: list(M().state_dict()), [n for n, _ in M().named_buffers()],
 * [n for n, _ in M().named_parameters()] */
static const char *const want_state[] = {"w",
                                         "b0",
                                         "b1",
                                         "fc.weight",
                                         "fc.bias",
                                         "bn1.weight",
                                         "bn1.bias",
                                         "bn1.running_mean",
                                         "bn1.running_var",
                                         "bn1.num_batches_tracked",
                                         "seq.0.weight",
                                         "seq.0.bias",
                                         "seq.0.running_mean",
                                         "seq.0.running_var",
                                         "seq.0.num_batches_tracked",
                                         "seq.1.weight",
                                         "seq.1.bias"};
static const char *const want_buffers[] = {"b0",
                                           "b1",
                                           "bn1.running_mean",
                                           "bn1.running_var",
                                           "bn1.num_batches_tracked",
                                           "seq.0.running_mean",
                                           "seq.0.running_var",
                                           "seq.0.num_batches_tracked"};
static const char *const want_params[] = {"w",          "fc.weight",    "fc.bias",
                                          "bn1.weight", "bn1.bias",     "seq.0.weight",
                                          "seq.0.bias", "seq.1.weight", "seq.1.bias"};
enum { N_STATE = 17, N_BUFFERS = 8, N_PARAMS = 9 };

static int is_buffer_name(const char *name, const char *prefix) {
  for (int i = 0; i < N_BUFFERS; i++) {
    char full[96];
    snprintf(full, sizeof full, "%s%s", prefix, want_buffers[i]);
    if (!strcmp(full, name)) return 1;
  }
  return 0;
}

/* m's three lists against PyTorch's, every name under prefix ("module." for a wrapper). */
static void expect_names(const clpar_module *m, const char *prefix) {
  char want[96];
  assert_int_equal(clpar_module_state_count(m), N_STATE);
  for (int i = 0; i < N_STATE; i++) {
    const char *name;
    clpar_tensor *t;
    int is_buffer = -1;
    tu_ok(clpar_module_state_at(m, i, &name, &t, &is_buffer));
    snprintf(want, sizeof want, "%s%s", prefix, want_state[i]);
    assert_string_equal(name, want);
    assert_int_equal(is_buffer, is_buffer_name(name, prefix));
    assert_int_equal(clpar_tensor_requires_grad(t), !is_buffer);
  }
  assert_int_equal(clpar_module_buffer_count(m), N_BUFFERS);
  for (int i = 0; i < N_BUFFERS; i++) {
    const char *name;
    tu_ok(clpar_module_buffer_at(m, i, &name, NULL));
    snprintf(want, sizeof want, "%s%s", prefix, want_buffers[i]);
    assert_string_equal(name, want);
  }
  assert_int_equal(clpar_module_parameter_count(m), N_PARAMS);
  for (int i = 0; i < N_PARAMS; i++) {
    const char *name;
    tu_ok(clpar_module_parameter_at(m, i, &name, NULL));
    snprintf(want, sizeof want, "%s%s", prefix, want_params[i]);
    assert_string_equal(name, want);
  }
  assert_int_equal(clpar_module_buffer_at(m, N_BUFFERS, NULL, NULL), CLPAR_ERROR_INDEX);
  assert_int_equal(clpar_module_state_at(m, -1, NULL, NULL, NULL), CLPAR_ERROR_INDEX);
}

static void test_names_and_order_as_pytorch(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *m = make_tree(dev, 1, 0);
  expect_names(m, "");
  assert_non_null(clpar_module_buffer(m, "b0"));
  assert_null(clpar_module_buffer(m, "w")); /* a parameter, not a buffer */
  assert_null(clpar_module_buffer(m, "nope"));
  assert_non_null(clpar_module_buffer(clpar_module_child(m, "bn1"), "running_var"));
  /* optimizers see the parameters only */
  clpar_sgd_options o = {.lr = 0.1f};
  clpar_optimizer *opt;
  tu_ok(clpar_sgd_create_for(m, &o, &opt));
  assert_int_equal(clpar_optimizer_size(opt), N_PARAMS);
  tu_ok(clpar_optimizer_zero_grad(opt));
  tu_ok(clpar_module_zero_grad(m));
  clpar_optimizer_free(opt);
  /* a wrapper lists the wrapped module's names with "module.", as PyTorch's */
  clpar_data_parallel_options dpo = {.devices = &dev, .n_devices = 1};
  clpar_module *dp;
  tu_ok(clpar_data_parallel_create(m, &dpo, &dp));
  expect_names(dp, "module.");
  clpar_module_free(dp);

  /* Sequential(bn, bn): a shared module's buffers are listed once, under the first name */
  clpar_module *bn = bn_like(dev, 2, 0), *twice;
  tu_ok(clpar_sequential_create((clpar_module *[]){bn, bn}, 2, &twice));
  assert_int_equal(clpar_module_buffer_count(twice), 3);
  assert_int_equal(clpar_module_state_count(twice), 5);
  const char *name;
  tu_ok(clpar_module_state_at(twice, 4, &name, NULL, NULL));
  assert_string_equal(name, "0.num_batches_tracked");
  clpar_module_free(twice);
}

/* What PyTorch's register_buffer refuses, and a tensor that needs a gradient: nothing is
 * added. */
static void test_bad_buffers_refused(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *lin;
  tu_ok(clpar_linear_create(3, 2, 1, dev, &lin));
  clpar_tensor *t = zeros(dev, 2), *g = zeros(dev, 2), *op;
  tu_ok(clpar_tensor_set_requires_grad(g, 1));
  tu_ok(clpar_scale(g, 2.0f, &op));
  assert_int_equal(clpar_module_add_buffer(lin, "weight", t), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "already registered as a parameter"));
  assert_int_equal(clpar_module_add_buffer(lin, "g", g), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "requires a gradient"));
  assert_int_equal(clpar_module_add_buffer(lin, "op", op), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "result of an op"));
  assert_int_equal(clpar_module_add_buffer(lin, "a.b", t), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_module_add_buffer(lin, "", t), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_module_add_buffer(NULL, "t", t), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_module_add_buffer(lin, "t", NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_module_buffer_count(lin), 0);
  tu_ok(clpar_module_add_buffer(lin, "t", t));
  assert_int_equal(clpar_module_add_buffer(lin, "t", t), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_module_add_parameter(lin, "t", g), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "already registered as a buffer"));
  assert_int_equal(clpar_module_buffer_count(lin), 1);
  assert_int_equal(clpar_module_parameter_count(lin), 2);
  assert_false(clpar_tensor_requires_grad(t)); /* and stays so */
  clpar_tensor_free(op);
  clpar_tensor_free(g);
  clpar_tensor_free(t); /* the module keeps its reference */
  assert_ptr_equal(clpar_module_buffer(lin, "t"), t);
  clpar_module_free(lin);
}

static void expect_training(clpar_module *m, const char *path, int on) {
  clpar_module *c = m;
  char copy[64];
  snprintf(copy, sizeof copy, "%s", path);
  for (char *part = strtok(copy, "."); part; part = strtok(NULL, "."))
    c = clpar_module_child(c, part);
  assert_non_null(c);
  if (clpar_module_is_training(c) != on)
    fail_msg("\"%s\" is in %s mode", path, on ? "eval" : "training");
}

static void test_train_eval_propagates(void **state) {
  (void)state;
  clpar_module *m = make_tree(clpar_device_get(0), 1, 0);
  static const char *const all[] = {"fc", "bn1", "seq", "seq.0", "seq.1"};
  assert_int_equal(clpar_module_is_training(m), 1); /* as PyTorch's, made in training mode */
  for (int i = 0; i < 5; i++) expect_training(m, all[i], 1);
  tu_ok(clpar_module_train(m, 0));
  assert_int_equal(clpar_module_is_training(m), 0);
  for (int i = 0; i < 5; i++) expect_training(m, all[i], 0);
  tu_ok(clpar_module_train(clpar_module_child(m, "seq"), 1)); /* a subtree only */
  assert_int_equal(clpar_module_is_training(m), 0);
  expect_training(m, "bn1", 0);
  expect_training(m, "seq", 1);
  expect_training(m, "seq.0", 1);
  expect_training(m, "seq.1", 1);
  tu_ok(clpar_module_train(m, 7)); /* any non-zero is training */
  for (int i = 0; i < 5; i++) expect_training(m, all[i], 1);
  assert_int_equal(clpar_module_train(NULL, 0), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_module_free(m);
}

/* Fills every parameter and buffer of m with values from seed (distinct per entry). */
static void fill_state(clpar_module *m, uint64_t seed) {
  for (int i = 0; i < clpar_module_state_count(m); i++) {
    clpar_tensor *t;
    tu_ok(clpar_module_state_at(m, i, NULL, &t, NULL));
    float *v = tu_rand((size_t)clpar_tensor_numel(t), seed + (uint64_t)i);
    tu_ok(clpar_tensor_write(t, v, (size_t)clpar_tensor_numel(t)));
    free(v);
  }
}

/* a's and b's state entries i (same names) hold the same values. */
static void expect_same_state(const clpar_module *a, const clpar_module *b) {
  assert_int_equal(clpar_module_state_count(a), clpar_module_state_count(b));
  for (int i = 0; i < clpar_module_state_count(a); i++) {
    const char *na, *nb;
    clpar_tensor *ta, *tb;
    tu_ok(clpar_module_state_at(a, i, &na, &ta, NULL));
    tu_ok(clpar_module_state_at(b, i, &nb, &tb, NULL));
    assert_string_equal(na, nb);
    tu_expect_equal(ta, tb, 0, 0, na);
  }
}

static void test_module_to_moves_buffers(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0), *other = tu_second_device(dev);
  if (!other) {
    print_message("no second device on this machine\n");
    skip();
  }
  clpar_module *m = make_tree(dev, 1, 0), *ref = make_tree(dev, 1, 0);
  fill_state(m, 40);
  fill_state(ref, 40);
  clpar_tensor *rm = clpar_module_buffer(clpar_module_child(m, "bn1"), "running_mean");
  tu_ok(clpar_module_to(m, other));
  /* the same tensor objects, now on the other device, with their values */
  assert_ptr_equal(clpar_module_buffer(clpar_module_child(m, "bn1"), "running_mean"), rm);
  for (int i = 0; i < clpar_module_state_count(m); i++) {
    clpar_tensor *t;
    tu_ok(clpar_module_state_at(m, i, NULL, &t, NULL));
    assert_ptr_equal(clpar_tensor_device(t), other);
  }
  expect_same_state(m, ref);
  tu_ok(clpar_module_to(m, dev)); /* and back */
  assert_ptr_equal(clpar_tensor_device(rm), dev);
  expect_same_state(m, ref);
  clpar_module_free(m);
  clpar_module_free(ref);
}

/* ---- DataParallel ---- */

enum { F = 6 };

/* y = x @ weight^T + bias where bias is the buffer "shift", plus the buffer "count" in
 * training mode, where each forward also adds 1 to "count" in place (a running statistic's
 * update). So the output shows which buffer values and which mode a replica had. */
static clpar_status shift_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                  void *user) {
  (void)user;
  clpar_tensor *w = clpar_module_parameter(self, "weight");
  clpar_tensor *shift = clpar_module_buffer(self, "shift"),
               *count = clpar_module_buffer(self, "count");
  if (!clpar_module_is_training(self)) return clpar_linear(x, w, shift, y);
  clpar_tensor *bias = NULL, *ones = NULL, *next = NULL;
  clpar_status s = clpar_add(shift, count, &bias);
  if (s == CLPAR_OK) s = clpar_linear(x, w, bias, y);
  if (s == CLPAR_OK) s = clpar_tensor_zeros(clpar_tensor_device(count), 1, (int64_t[]){F}, &ones);
  if (s == CLPAR_OK) s = clpar_fill(ones, 1.0f);
  if (s == CLPAR_OK) s = clpar_add(count, ones, &next);
  if (s == CLPAR_OK) s = clpar_copy(count, next);
  clpar_tensor_free(bias);
  clpar_tensor_free(ones);
  clpar_tensor_free(next);
  return s;
}

/* Sequential(Linear(F, F), Shift): the buffers sit in a child. */
static clpar_module *make_shift_model(clpar_device *dev) {
  clpar_module *parts[2];
  clpar_manual_seed(77);
  tu_ok(clpar_linear_create(F, F, 1, dev, &parts[0]));
  tu_ok(clpar_module_create("Shift", shift_forward, NULL, NULL, &parts[1]));
  clpar_tensor *w;
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){F, F}, 78, -0.5f, 0.5f, &w));
  add_param(parts[1], "weight", w);
  add_buffer(parts[1], "shift", zeros(dev, F));
  add_buffer(parts[1], "count", zeros(dev, F));
  clpar_module *m;
  tu_ok(clpar_sequential_create(parts, 2, &m));
  return m;
}

/* Output and the Shift weight's gradient of one forward and backward of m on x. */
static void step(clpar_module *m, clpar_module *shift_of, clpar_tensor *x, float **out,
                 float **grad) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *y, *loss;
  tu_ok(clpar_module_zero_grad(m));
  tu_ok(clpar_module_forward(m, x, &y));
  *out = tu_read(y);
  *grad = NULL;
  if (clpar_module_is_training(m)) {
    tu_ok(clpar_mean(y, &loss));
    tu_ok(clpar_backward(loss));
    *grad = tu_read(clpar_tensor_grad(clpar_module_parameter(shift_of, "weight")));
  }
  clpar_scope_end(sc);
}

static void expect_count(clpar_module *shift, float want, const char *what) {
  float v[F], w[F];
  for (int j = 0; j < F; j++) w[j] = want;
  tu_ok(clpar_tensor_read(clpar_module_buffer(shift, "count"), v, F));
  tu_assert_close(v, w, F, 0, 0, what);
}

/* A buffer changed on the main module shows in every replica's next forward; the main
 * module's own update (replica 0) persists, the other replicas' do not; eval mode reaches the
 * replicas. Compared with the same model on one device, on every selected device (at least
 * two). */
static void test_data_parallel_copies_buffers(void **state) {
  (void)state;
  clpar_device *devs[8];
  int n = clpar_device_count();
  if (n > 8) n = 8;
  for (int i = 0; i < n; i++) devs[i] = clpar_device_get(i);
  if (n < 2) {
    devs[1] = tu_second_device(devs[0]);
    if (!devs[1]) {
      print_message("no second device on this machine\n");
      skip();
    }
    n = 2;
  }
  clpar_module *ref = make_shift_model(devs[0]), *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = n};
  tu_ok(clpar_data_parallel_create(make_shift_model(devs[0]), &o, &dp));
  clpar_module *ref_shift = clpar_module_child(ref, "1");
  clpar_module *dp_shift = clpar_module_child(clpar_module_child(dp, "module"), "1");
  assert_int_equal(clpar_module_buffer_count(dp), 2);
  int64_t rows = 2 * n + 1;
  for (int it = 0; it < 6; it++) {
    int training = it != 3 && it != 4; /* two forwards in eval mode */
    if (it == 3 || it == 5) {
      tu_ok(clpar_module_train(dp, training));
      tu_ok(clpar_module_train(ref, training));
    }
    float shift[F];
    for (int j = 0; j < F; j++) shift[j] = 0.25f * (float)(it + 1) - 0.1f * (float)j;
    tu_ok(clpar_tensor_write(clpar_module_buffer(dp_shift, "shift"), shift, F));
    tu_ok(clpar_tensor_write(clpar_module_buffer(ref_shift, "shift"), shift, F));
    clpar_tensor *x;
    tu_ok(clpar_tensor_rand_normal(devs[0], 2, (int64_t[]){rows, F}, 100 + (uint64_t)it, 0, 1, &x));
    float *y, *g, *ry, *rg;
    step(dp, dp_shift, x, &y, &g);
    step(ref, ref_shift, x, &ry, &rg);
    char what[64];
    snprintf(what, sizeof what, "output of forward %d on %d devices", it, n);
    tu_assert_close(y, ry, (size_t)(rows * F), 1e-5f, 1e-5f, what);
    if (training) {
      snprintf(what, sizeof what, "weight gradient of forward %d on %d devices", it, n);
      tu_assert_close(g, rg, F * F, 1e-5f, 1e-5f, what);
    }
    /* the main module's count moved once per training forward, as on one device */
    float forwards = (float)(it + 1 - (it >= 3) - (it >= 4));
    expect_count(dp_shift, forwards, "the main module's count");
    expect_count(ref_shift, forwards, "the one-device count");
    free(y);
    free(g);
    free(ry);
    free(rg);
    clpar_tensor_free(x);
  }
  clpar_module_free(dp);
  clpar_module_free(ref);
}

/* ---- checkpoints ---- */

static char *temp_dir(void) {
  char *dir = strdup("/tmp/clpar_buffers_XXXXXX");
  assert_non_null(mkdtemp(dir));
  return dir;
}

static void test_checkpoint_round_trip_with_buffers(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  char *dir = temp_dir(), path[256], train_path[256];
  snprintf(path, sizeof path, "%s/m.safetensors", dir);
  snprintf(train_path, sizeof train_path, "%s/train.safetensors", dir);
  clpar_module *a = make_tree(dev, 1, 0), *b = make_tree(dev, 2, 0);
  fill_state(a, 10);
  tu_ok(clpar_safetensors_save(a, path, NULL, NULL, 0));
  tu_ok(clpar_safetensors_load(b, path, 1, NULL));
  expect_same_state(a, b);
  fill_state(b, 20);
  tu_ok(clpar_checkpoint_save(train_path, a, NULL, 3, 1));
  tu_ok(clpar_checkpoint_load(train_path, b, NULL, NULL, NULL));
  expect_same_state(a, b);

  /* the module has a buffer the file lacks: strict names it and changes nothing */
  clpar_module *c = make_tree(dev, 3, 1), *c_ref = make_tree(dev, 3, 1);
  fill_state(c, 30);
  fill_state(c_ref, 30);
  assert_int_equal(clpar_safetensors_load(c, path, 1, NULL), CLPAR_ERROR_SHAPE_MISMATCH);
  if (!strstr(clpar_last_error(), "missing: [bn1.extra]; unexpected: []"))
    fail_msg("%s", clpar_last_error());
  expect_same_state(c, c_ref);
  assert_int_equal(clpar_checkpoint_load(train_path, c, NULL, NULL, NULL),
                   CLPAR_ERROR_SHAPE_MISMATCH);
  if (!strstr(clpar_last_error(), "missing: [model.bn1.extra]")) fail_msg("%s", clpar_last_error());
  expect_same_state(c, c_ref);
  clpar_load_report report;
  tu_ok(clpar_safetensors_load(c, path, 0, &report)); /* not strict: the rest loads */
  assert_string_equal(report.missing, "bn1.extra");
  assert_string_equal(report.unexpected, "");
  assert_int_equal(report.loaded, N_STATE);
  clpar_load_report_free(&report);
  clpar_tensor *extra = clpar_module_buffer(clpar_module_child(c, "bn1"), "extra");
  tu_expect_equal(extra, clpar_module_buffer(clpar_module_child(c_ref, "bn1"), "extra"), 0, 0,
                  "the buffer the file lacks");
  tu_expect_equal(clpar_module_buffer(c, "b1"), clpar_module_buffer(a, "b1"), 0, 0, "b1 loaded");

  /* the file has a buffer the module lacks */
  clpar_module *d = make_tree(dev, 4, 2);
  assert_int_equal(clpar_safetensors_load(d, path, 1, NULL), CLPAR_ERROR_SHAPE_MISMATCH);
  if (!strstr(clpar_last_error(), "missing: []; unexpected: [b1]"))
    fail_msg("%s", clpar_last_error());

  /* a DataParallel wrapper's file ("module.b0") loads into the bare module */
  clpar_module *dp;
  clpar_data_parallel_options dpo = {.devices = &dev, .n_devices = 1};
  tu_ok(clpar_data_parallel_create(make_tree(dev, 5, 0), &dpo, &dp));
  fill_state(dp, 50);
  tu_ok(clpar_safetensors_save(dp, path, NULL, NULL, 0));
  tu_ok(clpar_safetensors_load(b, path, 1, NULL));
  expect_same_state(clpar_module_child(dp, "module"), b);

  clpar_module_free(dp);
  clpar_module_free(a);
  clpar_module_free(b);
  clpar_module_free(c);
  clpar_module_free(c_ref);
  clpar_module_free(d);
  tu_remove_dir(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_and_order_as_pytorch),
      cmocka_unit_test(test_bad_buffers_refused),
      cmocka_unit_test(test_train_eval_propagates),
      cmocka_unit_test(test_module_to_moves_buffers),
      cmocka_unit_test(test_data_parallel_copies_buffers),
      cmocka_unit_test(test_checkpoint_round_trip_with_buffers),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
