/* test_module.c — modules as PyTorch users build them: a submodule used twice or shared by two
 * models (reference counted, freed once), cycles refused, a shared parameter listed and
 * stepped once, parameter names that stay valid while their module lives; and optimizers
 * that follow their parameters to another device; flat parameters (clpar_module_flatten)
 * that keep values, names and gradients, train as before and move whole. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

static int warnings;
static void count_warnings(clpar_log_level level, const char *msg, void *user) {
  (void)msg;
  (void)user;
  if (level == CLPAR_LOG_WARN) warnings++;
}

/* Sequential(relu, relu): the same module twice, freed once (a double free before). */
static void test_child_used_twice(void **state) {
  (void)state;
  clpar_module *relu, *seq;
  tu_ok(clpar_relu_create(&relu));
  tu_ok(clpar_sequential_create((clpar_module *[]){relu, relu}, 2, &seq));
  assert_ptr_equal(clpar_module_child(seq, "0"), clpar_module_child(seq, "1"));
  clpar_tensor *x, *y;
  tu_ok(clpar_tensor_from_host(tu_host(), 1, (int64_t[]){3}, (float[]){-1, 0, 2}, &x));
  tu_ok(clpar_module_forward(seq, x, &y));
  float v[3];
  tu_ok(clpar_tensor_read(y, v, 3));
  assert_float_equal(v[0], 0, 0);
  assert_float_equal(v[2], 2, 0);
  clpar_tensor_free(x);
  clpar_tensor_free(y);
  clpar_module_free(seq);
}

/* Weight sharing: one Linear at two places of a model is one pair of parameters, listed once
 * (as PyTorch's parameters()) and stepped once. */
static void test_shared_layer_stepped_once(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *lin, *relu, *seq;
  tu_ok(clpar_linear_create(4, 4, 1, dev, &lin));
  tu_ok(clpar_relu_create(&relu));
  tu_ok(clpar_sequential_create((clpar_module *[]){lin, relu, lin}, 3, &seq));
  assert_int_equal(clpar_module_parameter_count(seq), 2);
  assert_int_equal(clpar_module_entry_count(seq), 4); /* what a walk of every place meets */
  const char *name;
  clpar_tensor *w;
  tu_ok(clpar_module_parameter_at(seq, 0, &name, &w));
  assert_string_equal(name, "0.weight");
  assert_ptr_equal(w, clpar_module_parameter(lin, "weight"));
  clpar_optimizer *opt;
  clpar_sgd_options o = {.lr = 0.5f};
  tu_ok(clpar_sgd_create_for(seq, &o, &opt));
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){5, 4}, 3), *y, *loss;
  tu_ok(clpar_module_forward(seq, x, &y));
  tu_ok(clpar_sum(y, &loss));
  tu_ok(clpar_backward(loss));
  float before[16], grad[16], after[16];
  tu_ok(clpar_tensor_read(w, before, 16));
  tu_ok(clpar_tensor_read(clpar_tensor_grad(w), grad, 16)); /* both uses accumulated */
  tu_ok(clpar_optimizer_step(opt));
  tu_ok(clpar_tensor_read(w, after, 16));
  for (int i = 0; i < 16; i++) assert_float_equal(after[i], before[i] - 0.5f * grad[i], 1e-6f);
  clpar_scope_end(sc);
  clpar_optimizer_free(opt);
  clpar_module_free(seq);
}

/* One layer in two models: freeing one model leaves it to the other. */
static void test_child_shared_by_two_parents(void **state) {
  (void)state;
  clpar_module *lin, *a, *b;
  tu_ok(clpar_linear_create(2, 2, 0, tu_host(), &lin));
  tu_ok(clpar_sequential_create(&lin, 1, &a));
  tu_ok(clpar_sequential_create(&lin, 1, &b));
  clpar_module_free(a);
  clpar_tensor *x, *y;
  tu_ok(clpar_tensor_zeros(tu_host(), 2, (int64_t[]){1, 2}, &x));
  tu_ok(clpar_module_forward(b, x, &y));
  assert_int_equal(clpar_module_parameter_count(b), 1);
  clpar_tensor_free(y);
  clpar_tensor_free(x);
  /* Freeing a module that a parent holds is refused with a warning, not done. */
  warnings = 0;
  clpar_log_set_callback(count_warnings, NULL);
  clpar_module_free(lin);
  clpar_log_set_callback(NULL, NULL);
  assert_int_equal(warnings, 1);
  assert_int_equal(clpar_module_parameter_count(b), 1);
  clpar_module_free(b);
}

/* A module cannot be its own child or descendant (it recursed until the stack overflowed);
 * the refusal frees nothing, since the "child" is the caller's own tree. */
static void test_cycles_refused(void **state) {
  (void)state;
  clpar_module *top, *mid, *leaf;
  tu_ok(clpar_linear_create(2, 2, 1, tu_host(), &leaf));
  tu_ok(clpar_sequential_create(&leaf, 1, &mid));
  tu_ok(clpar_sequential_create(&mid, 1, &top));
  assert_int_equal(clpar_module_add_child(top, "self", top), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "its own descendant"));
  /* the message says who frees it: the caller, as before (not freeing it leaked it) */
  assert_non_null(strstr(clpar_last_error(), "nothing was freed: free the module as before"));
  assert_int_equal(clpar_module_add_child(leaf, "up", top), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_module_add_child(mid, "up", top), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_module_parameter_count(top), 2);
  /* a deep chain of Sequential(x, x): each level listed once, not 2^depth times */
  clpar_module *x = top;
  for (int d = 0; d < 64; d++) tu_ok(clpar_sequential_create((clpar_module *[]){x, x}, 2, &x));
  assert_int_equal(clpar_module_parameter_count(x), 2);
  tu_ok(clpar_module_zero_grad(x));
  clpar_module_free(x);
}

/* The same tensor registered twice is one parameter; an optimizer given a tensor twice
 * refuses it (it would step it twice). */
static void test_parameter_registered_twice(void **state) {
  (void)state;
  clpar_tensor *p;
  tu_ok(clpar_tensor_zeros(tu_host(), 1, (int64_t[]){4}, &p));
  clpar_module *m, *lin;
  tu_ok(clpar_linear_create(2, 2, 1, tu_host(), &lin));
  tu_ok(clpar_module_add_parameter(lin, "alias", clpar_module_parameter(lin, "weight")));
  assert_int_equal(clpar_module_parameter_count(lin), 2);
  tu_ok(clpar_sequential_create(&lin, 1, &m));
  tu_ok(clpar_module_add_parameter(m, "p", p));
  tu_ok(clpar_module_add_parameter(m, "q", p));
  assert_int_equal(clpar_module_parameter_count(m), 3);
  clpar_optimizer *opt = NULL;
  clpar_sgd_options o = {.lr = 0.1f};
  assert_int_equal(clpar_sgd_create((clpar_tensor *[]){p, p}, 2, &o, &opt),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "parameter 1 is parameter 0 again"));
  assert_null(opt);
  clpar_adam_options ao = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f};
  clpar_tensor *w = clpar_module_parameter(lin, "weight");
  assert_int_equal(clpar_adam_create((clpar_tensor *[]){w, p, w}, 3, &ao, &opt),
                   CLPAR_ERROR_INVALID_ARGUMENT);
  tu_ok(clpar_adam_create_for(m, &ao, &opt));
  clpar_optimizer_free(opt);
  clpar_module_free(m);
  clpar_tensor_free(p);
}

/* Names from parameter_at live as long as their module (they were freed whenever any module
 * anywhere was created), also after the module's own tree changes. */
static void test_parameter_names_stay_valid(void **state) {
  (void)state;
  clpar_module *lin, *seq, *other;
  tu_ok(clpar_linear_create(3, 2, 1, tu_host(), &lin));
  tu_ok(clpar_sequential_create(&lin, 1, &seq));
  const char *w_name, *b_name;
  tu_ok(clpar_module_parameter_at(seq, 0, &w_name, NULL));
  tu_ok(clpar_module_parameter_at(seq, 1, &b_name, NULL));
  tu_ok(clpar_linear_create(2, 2, 1, tu_host(), &other)); /* another module, anywhere */
  assert_int_equal(clpar_module_parameter_count(seq), 2);
  assert_string_equal(w_name, "0.weight");
  assert_string_equal(b_name, "0.bias");
  const char *again;
  tu_ok(clpar_module_parameter_at(seq, 0, &again, NULL));
  assert_ptr_equal(again, w_name);                /* nothing changed in seq: the same string */
  tu_ok(clpar_module_add_child(seq, "1", other)); /* seq's own tree changes */
  assert_int_equal(clpar_module_parameter_count(seq), 4);
  tu_ok(clpar_module_parameter_at(seq, 3, &again, NULL));
  assert_string_equal(again, "1.bias");
  assert_string_equal(w_name, "0.weight");
  assert_string_equal(b_name, "0.bias");
  clpar_module_free(seq);
}

/* ---- optimizers after their parameters moved ---- */

static const int32_t labels[6] = {0, 2, 1, 1, 0, 2};

static clpar_module *make_mlp(clpar_device *dev) {
  clpar_module *layers[3], *mlp;
  clpar_manual_seed(7);
  tu_ok(clpar_linear_create(4, 8, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(8, 3, 1, dev, &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &mlp));
  return mlp;
}

static clpar_optimizer *make_optimizer(clpar_module *m, int adam) {
  clpar_optimizer *opt;
  clpar_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
  clpar_adam_options ao = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  if (adam)
    tu_ok(clpar_adam_create_for(m, &ao, &opt));
  else
    tu_ok(clpar_sgd_create_for(m, &so, &opt));
  return opt;
}

/* One cross-entropy training step of m on a fixed batch made on dev. */
static void train_step(clpar_module *m, clpar_optimizer *opt, clpar_device *dev) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){6, 4}, 5), *y, *loss;
  tu_ok(clpar_optimizer_zero_grad(opt));
  tu_ok(clpar_module_forward(m, x, &y));
  tu_ok(clpar_cross_entropy(y, labels, 6, CLPAR_REDUCTION_MEAN, &loss));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_optimizer_step(opt));
  clpar_scope_end(sc);
}

/* m's parameters against ref's, in flat order. */
static void expect_same_parameters(clpar_module *m, clpar_module *ref, const char *what) {
  assert_int_equal(clpar_module_parameter_count(m), clpar_module_parameter_count(ref));
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p, *q;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_module_parameter_at(ref, i, NULL, &q));
    tu_expect_equal(p, q, 1e-4f, 1e-5f, what);
  }
}

/* The optimizer's state (momentum, Adam's moments) follows parameters that clpar_module_to
 * moved: it stayed behind, and the next step handed one backend's memory to another. */
static void test_optimizer_follows_module_to(void **state) {
  (void)state;
  /* the first device and the host device; when host is the one selected, another device */
  clpar_device *dev = clpar_device_get(0), *host = tu_second_device(dev);
  if (!host) {
    print_message("no second device on this machine\n");
    skip();
  }
  for (int adam = 0; adam < 2; adam++)
    for (int back = 0; back < 2; back++) {
      clpar_device *from = back ? dev : host, *to = back ? host : dev;
      clpar_module *moved = make_mlp(from), *ref = make_mlp(to);
      clpar_optimizer *opt = make_optimizer(moved, adam), *ref_opt = make_optimizer(ref, adam);
      train_step(moved, opt, from); /* makes the state on from */
      train_step(ref, ref_opt, to);
      tu_ok(clpar_module_to(moved, to));
      for (int step = 0; step < 2; step++) {
        train_step(moved, opt, to);
        train_step(ref, ref_opt, to);
      }
      expect_same_parameters(moved, ref, adam ? "Adam after module_to" : "SGD after module_to");
      clpar_optimizer_free(opt);
      clpar_optimizer_free(ref_opt);
      clpar_module_free(moved);
      clpar_module_free(ref);
    }
}

/* The same when DataParallel moves the parameters to its first device. */
static void test_optimizer_follows_data_parallel(void **state) {
  (void)state;
  /* the first device and the host device; when host is the one selected, another device */
  clpar_device *dev = clpar_device_get(0), *host = tu_second_device(dev);
  if (!host) {
    print_message("no second device on this machine\n");
    skip();
  }
  clpar_device *devices[2] = {dev, host};
  for (int adam = 0; adam < 2; adam++) {
    clpar_module *m = make_mlp(host), *ref = make_mlp(dev), *dp;
    clpar_optimizer *opt = make_optimizer(m, adam), *ref_opt = make_optimizer(ref, adam);
    train_step(m, opt, host);
    train_step(ref, ref_opt, dev);
    clpar_data_parallel_options o = {.devices = devices, .n_devices = 2};
    tu_ok(clpar_data_parallel_create(m, &o, &dp)); /* moves m's parameters to dev */
    for (int step = 0; step < 2; step++) {
      train_step(dp, opt, dev);
      train_step(ref, ref_opt, dev);
    }
    expect_same_parameters(clpar_module_child(dp, "module"), ref,
                           adam ? "Adam after DataParallel" : "SGD after DataParallel");
    clpar_optimizer_free(opt);
    clpar_optimizer_free(ref_opt);
    clpar_module_free(dp);
    clpar_module_free(ref);
  }
}

/* ---- flat parameters (clpar_module_flatten) ---- */

static clpar_module *flat_mlp(clpar_device *dev) {
  clpar_module *l[3], *m;
  clpar_manual_seed(23);
  tu_ok(clpar_linear_create(5, 16, 1, dev, &l[0]));
  tu_ok(clpar_relu_create(&l[1]));
  tu_ok(clpar_linear_create(16, 3, 1, dev, &l[2]));
  tu_ok(clpar_sequential_create(l, 3, &m));
  return m;
}

enum { FLAT_N = 5 * 16 + 16 + 16 * 3 + 3 };

static void read_params(clpar_module *m, float *out) {
  int at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, out + at, (size_t)(FLAT_N - at)));
    at += (int)clpar_tensor_numel(p);
  }
  assert_int_equal(at, FLAT_N);
}

/* Every parameter a view of one buffer, in order, and its grad a view of another. */
static void assert_flat(clpar_module *m) {
  clpar_tensor *first;
  tu_ok(clpar_module_parameter_at(m, 0, NULL, &first));
  size_t at = first->offset;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    assert_non_null(p->flat);
    assert_ptr_equal(p->storage, first->storage);
    assert_ptr_equal(p->grad->storage, first->flat->grad->storage);
    assert_int_equal(p->offset, at);
    at += (size_t)p->numel;
  }
  assert_int_equal(at - first->offset, first->flat->numel);
}

/* Steps of SGD (momentum) or Adam; zero_grad through the module or the optimizer. */
static void flat_train(clpar_module *m, clpar_optimizer *opt, clpar_device *dev, int steps) {
  for (int step = 0; step < steps; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *t, *y, *loss;
    tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){8, 5}, 500 + (uint64_t)step, 0, 1, &x));
    tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){8, 3}, 600 + (uint64_t)step, 0, 1, &t));
    tu_ok(step % 2 ? clpar_module_zero_grad(m) : clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(m, x, &y));
    tu_ok(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_scope_end(sc);
  }
}

/* A flattened module keeps its names, values and gradients, and trains exactly as before:
 * with an optimizer made before flattening (its pointers stay valid) and one made after. */
static void test_flatten_trains_as_before(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    if (d >= 0 && dev == tu_host()) continue;
    for (int adam = 0; adam < 2; adam++) {
      clpar_module *plain = flat_mlp(dev), *flat = flat_mlp(dev);
      clpar_optimizer *o_plain, *o_flat;
      clpar_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
      clpar_adam_options ao = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
      tu_ok(adam ? clpar_adam_create_for(plain, &ao, &o_plain)
                 : clpar_sgd_create_for(plain, &so, &o_plain));
      if (!adam) tu_ok(clpar_sgd_create_for(flat, &so, &o_flat)); /* before flattening */
      flat_train(plain, o_plain, dev, 1); /* a gradient before flattening is kept */
      if (!adam) flat_train(flat, o_flat, dev, 1);
      float before[FLAT_N], after[FLAT_N], a[FLAT_N], b[FLAT_N];
      read_params(flat, before);
      clpar_tensor *w0;
      tu_ok(clpar_module_parameter_at(flat, 0, NULL, &w0));
      float *g_before = adam ? NULL : tu_read(clpar_tensor_grad(w0));
      tu_ok(clpar_module_flatten(flat));
      assert_flat(flat);
      const char *name;
      tu_ok(clpar_module_parameter_at(flat, 3, &name, NULL));
      assert_string_equal(name, "2.bias");
      read_params(flat, after);
      assert_memory_equal(before, after, sizeof before);
      if (!adam) {
        float *g_after = tu_read(clpar_tensor_grad(w0));
        assert_memory_equal(g_before, g_after, 80 * sizeof(float));
        free(g_after);
        free(g_before);
      }
      clpar_storage *st = w0->storage;
      tu_ok(clpar_module_flatten(flat)); /* already flat: nothing moves */
      assert_ptr_equal(w0->storage, st);
      if (adam) {
        tu_ok(clpar_adam_create_for(flat, &ao, &o_flat)); /* after flattening */
        flat_train(flat, o_flat, dev, 1);
      }
      flat_train(plain, o_plain, dev, 3);
      flat_train(flat, o_flat, dev, 3);
      read_params(plain, a);
      read_params(flat, b);
      tu_assert_close(b, a, FLAT_N, 1e-6f, 1e-7f, adam ? "flat Adam" : "flat SGD");
      clpar_optimizer_free(o_plain);
      clpar_optimizer_free(o_flat);
      clpar_module_free(plain);
      clpar_module_free(flat);
    }
  }
}

/* clpar_module_to moves a flat module's buffers whole (it stays flat and trains on the new
 * device), and refuses to move part of a flat group, changing nothing. */
static void test_flatten_and_module_to(void **state) {
  (void)state;
  clpar_device *a = clpar_device_get(0), *b = tu_second_device(a);
  if (!b) skip();
  clpar_module *m = flat_mlp(a);
  clpar_optimizer *opt;
  clpar_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
  tu_ok(clpar_sgd_create_for(m, &so, &opt));
  flat_train(m, opt, a, 1);
  tu_ok(clpar_module_flatten(m));
  float before[FLAT_N], after[FLAT_N];
  read_params(m, before);
  clpar_module *first = clpar_module_child(m, "0");
  assert_int_equal(clpar_module_to(first, b), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "flat"));
  clpar_tensor *w0;
  tu_ok(clpar_module_parameter_at(m, 0, NULL, &w0));
  assert_ptr_equal(clpar_tensor_device(w0), a); /* nothing moved */
  tu_ok(clpar_module_to(m, b));
  assert_ptr_equal(clpar_tensor_device(w0), b);
  assert_ptr_equal(clpar_tensor_device(clpar_tensor_grad(w0)), b);
  assert_flat(m);
  read_params(m, after);
  assert_memory_equal(before, after, sizeof before);
  flat_train(m, opt, b, 2); /* the optimizer follows, the module trains on b */
  tu_ok(clpar_module_to(m, a));
  assert_flat(m);
  flat_train(m, opt, a, 1);
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

/* Steps of the flat MLP with optimizers opts[0..n_opts) (zero_grad through the module or the
 * optimizers, in turn). */
static void flat_train_opts(clpar_module *m, clpar_optimizer **opts, int n_opts, clpar_device *dev,
                            int steps) {
  for (int step = 0; step < steps; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *t, *y, *loss;
    tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){8, 5}, 700 + (uint64_t)step, 0, 1, &x));
    tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){8, 3}, 800 + (uint64_t)step, 0, 1, &t));
    if (step % 2)
      tu_ok(clpar_module_zero_grad(m));
    else
      for (int k = 0; k < n_opts; k++) tu_ok(clpar_optimizer_zero_grad(opts[k]));
    tu_ok(clpar_module_forward(m, x, &y));
    tu_ok(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    for (int k = 0; k < n_opts; k++) tu_ok(clpar_optimizer_step(opts[k]));
    clpar_scope_end(sc);
  }
}

typedef struct {
  int adam; /* 0: SGD, 1: Adam, 2: AdamW */
  clpar_sgd_options sgd;
  clpar_adam_options ad;
  const char *what;
} opt_case;

static clpar_status make_opt(const opt_case *c, clpar_tensor *const *ps, int n,
                             clpar_optimizer **out) {
  return c->adam == 0   ? clpar_sgd_create(ps, n, &c->sgd, out)
         : c->adam == 1 ? clpar_adam_create(ps, n, &c->ad, out)
                        : clpar_adamw_create(ps, n, &c->ad, out);
}

/* An optimizer holding a whole flat group steps it with one kernel over the flat buffer (one
 * sgd_step or adam_step per step, counted on the composed path) and gives the same bits as
 * per-parameter steps: two optimizers each holding part of the group (one kernel per parameter,
 * which is what every optimizer did before). Zero_grad zeroes every member's gradient. */
static void test_flat_group_stepped_whole(void **state) {
  (void)state;
  const opt_case cases[] = {
      {.sgd = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = 1},
       .what = "nesterov"},
      {.sgd = {.lr = 0.1f, .momentum = 0.8f, .dampening = 0.25f, .weight_decay = 0.02f},
       .what = "momentum"},
      {.sgd = {.lr = 0.05f, .weight_decay = 0.01f}, .what = "plain SGD"},
      {.adam = 1,
       .ad = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f},
       .what = "Adam"},
      {.adam = 2,
       .ad = {.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.1f},
       .what = "AdamW"},
  };
  const uint64_t steps_bits =
      ((uint64_t)1 << CLPAR_ENTRY_sgd_step) | ((uint64_t)1 << CLPAR_ENTRY_adam_step);
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    if (d >= 0 && dev == tu_host()) continue;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
      for (int composed = 0; composed < 2; composed++) {
        tu_ok(clpar_compose_force(dev, composed ? steps_bits : 0));
        clpar_module *whole = flat_mlp(dev), *part = flat_mlp(dev);
        tu_ok(clpar_module_flatten(whole));
        tu_ok(clpar_module_flatten(part));
        clpar_tensor *pw[4], *pp[4];
        for (int i = 0; i < 4; i++) {
          tu_ok(clpar_module_parameter_at(whole, i, NULL, &pw[i]));
          tu_ok(clpar_module_parameter_at(part, i, NULL, &pp[i]));
        }
        clpar_optimizer *ow, *op[2];
        tu_ok(make_opt(&cases[c], pw, 4, &ow));
        tu_ok(make_opt(&cases[c], pp, 3, &op[0])); /* part of the group, and the rest */
        tu_ok(make_opt(&cases[c], pp + 3, 1, &op[1]));
        uint64_t before = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
        flat_train_opts(whole, &ow, 1, dev, 4);
        uint64_t mid = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
        flat_train_opts(part, op, 2, dev, 4);
        uint64_t after = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
        tu_ok(clpar_compose_force(dev, 0));
        if (composed) { /* one step of the flat buffer vs one per parameter */
          assert_int_equal(mid - before, 4);
          assert_int_equal(after - mid, 4 * 4);
        }
        float a[FLAT_N], b[FLAT_N];
        read_params(whole, a);
        read_params(part, b);
        if (memcmp(a, b, sizeof a) != 0)
          fail_msg("%s on %s (%s): the flat step differs from per-parameter steps", cases[c].what,
                   clpar_device_id(dev), composed ? "composed" : "fused");
        clpar_device *other = tu_second_device(dev);
        if (other && !composed) { /* the flat state follows the group there and back */
          for (int there = 1; there >= 0; there--) {
            clpar_device *to = there ? other : dev;
            tu_ok(clpar_module_to(whole, to));
            tu_ok(clpar_module_to(part, to));
            flat_train_opts(whole, &ow, 1, to, 2);
            flat_train_opts(part, op, 2, to, 2);
            read_params(whole, a);
            read_params(part, b);
            if (memcmp(a, b, sizeof a) != 0)
              fail_msg("%s on %s: the flat step differs from per-parameter steps after a move",
                       cases[c].what, clpar_device_id(to));
          }
        }
        /* one more step each, then zero_grad: every member's gradient reads zeros */
        flat_train_opts(whole, &ow, 1, dev, 1);
        tu_ok(clpar_optimizer_zero_grad(ow));
        for (int i = 0; i < 4; i++) {
          float *g = tu_read(clpar_tensor_grad(pw[i]));
          for (int64_t e = 0; e < clpar_tensor_numel(pw[i]); e++) assert_true(g[e] == 0.0f);
          free(g);
        }
        clpar_optimizer_free(ow);
        clpar_optimizer_free(op[0]);
        clpar_optimizer_free(op[1]);
        clpar_module_free(whole);
        clpar_module_free(part);
      }
  }
}

/* A group flattened again into a larger one (a child first, then the whole module): the
 * optimizer's state, flat for the child's group, is gathered into the new group's flat state
 * and the steps stay those of per-parameter steps, bit for bit. */
static void test_flat_group_state_follows_reflatten(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_adam_options ao = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  clpar_module *whole = flat_mlp(dev), *part = flat_mlp(dev);
  clpar_tensor *pw[4], *pp[4];
  for (int i = 0; i < 4; i++) {
    tu_ok(clpar_module_parameter_at(whole, i, NULL, &pw[i]));
    tu_ok(clpar_module_parameter_at(part, i, NULL, &pp[i]));
  }
  clpar_optimizer *ow, *op[4];
  tu_ok(clpar_adam_create(pw, 4, &ao, &ow));
  for (int i = 0; i < 4; i++) tu_ok(clpar_adam_create(pp + i, 1, &ao, &op[i]));
  tu_ok(clpar_module_flatten(clpar_module_child(whole, "0")));
  tu_ok(clpar_module_flatten(clpar_module_child(part, "0")));
  uint64_t bits = (uint64_t)1 << CLPAR_ENTRY_adam_step;
  tu_ok(clpar_compose_force(dev, bits));
  uint64_t before = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
  flat_train_opts(whole, &ow, 1, dev, 2); /* the child's group whole, the rest one by one */
  assert_int_equal(__atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED) - before, 2 * 3);
  flat_train_opts(part, op, 4, dev, 2);
  tu_ok(clpar_module_flatten(whole));
  tu_ok(clpar_module_flatten(part));
  assert_flat(whole);
  before = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
  flat_train_opts(whole, &ow, 1, dev, 3);
  assert_int_equal(__atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED) - before, 3);
  flat_train_opts(part, op, 4, dev, 3);
  tu_ok(clpar_compose_force(dev, 0));
  float a[FLAT_N], b[FLAT_N];
  read_params(whole, a);
  read_params(part, b);
  assert_memory_equal(a, b, sizeof a);
  clpar_optimizer_free(ow);
  for (int i = 0; i < 4; i++) clpar_optimizer_free(op[i]);
  clpar_module_free(whole);
  clpar_module_free(part);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_child_used_twice),
      cmocka_unit_test(test_shared_layer_stepped_once),
      cmocka_unit_test(test_child_shared_by_two_parents),
      cmocka_unit_test(test_cycles_refused),
      cmocka_unit_test(test_parameter_registered_twice),
      cmocka_unit_test(test_parameter_names_stay_valid),
      cmocka_unit_test(test_optimizer_follows_module_to),
      cmocka_unit_test(test_optimizer_follows_data_parallel),
      cmocka_unit_test(test_flatten_trains_as_before),
      cmocka_unit_test(test_flatten_and_module_to),
      cmocka_unit_test(test_flat_group_stepped_whole),
      cmocka_unit_test(test_flat_group_state_follows_reflatten),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
