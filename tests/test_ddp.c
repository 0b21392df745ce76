/* test_ddp.c — DistributedDataParallel against single-process training, run by ctest through
 * mpirun on 2 and 4 ranks (tests/CMakeLists.txt). Every rank trains its share of a batch with
 * DDP and, on its own, the whole batch on one model; after 5 SGD-with-momentum steps the
 * weights must agree. The ranks start from different weights (seeded by rank), so the
 * comparison also checks the broadcast from rank 0. Also: several buckets, a flattened
 * module (clpar_module_flatten), gradient accumulation over two micro-steps with one
 * reduction (clpar_ddp_set_sync), a module split over two devices (DDP with model
 * parallel), a parameter that gets no gradient (an error, or with find_unused_parameters
 * reduced with zeros), uneven inputs (clpar_ddp_join), models that differ between ranks (a clear
 * error on every rank, no hang), and buffers broadcast from rank 0 at creation and before forwards.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { IN = 16, HIDDEN = 64, OUT = 4, BATCH = 48, STEPS = 5 };

/* Linear(IN, HIDDEN) ReLU Linear(HIDDEN, HIDDEN) ReLU Linear(HIDDEN, out), optionally one
 * more Linear(out, out): the last two arguments make models that differ between ranks. */
static clpar_module *make_mlp(clpar_device *dev, uint64_t seed, int out, int extra) {
  clpar_module *layers[6], *mlp;
  clpar_manual_seed(seed);
  tu_ok(clpar_linear_create(IN, HIDDEN, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(HIDDEN, HIDDEN, 1, dev, &layers[2]));
  tu_ok(clpar_relu_create(&layers[3]));
  tu_ok(clpar_linear_create(HIDDEN, out, 1, dev, &layers[4]));
  if (extra) tu_ok(clpar_linear_create(out, out, 1, dev, &layers[5]));
  tu_ok(clpar_sequential_create(layers, extra ? 6 : 5, &mlp));
  return mlp;
}

/* The seed's "Distributed Model and Data Parallel": Linear(IN, HIDDEN) ReLU on the rank's
 * device, then Linear(HIDDEN, OUT) on a second device (the activation copied across, as
 * samples/model_parallel.c does). */
static clpar_device *split_devices[2];

static clpar_status split_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                  void *user) {
  (void)user;
  clpar_tensor *h;
  clpar_status s = clpar_module_forward(clpar_module_child(self, "0"), x, &h);
  if (s == CLPAR_OK) s = clpar_relu(h, &h);
  if (s == CLPAR_OK) s = clpar_tensor_to(h, split_devices[1], &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "2"), h, y);
  return s;
}

static clpar_module *make_split(uint64_t seed) {
  split_devices[0] = clpar_dist_device();
  split_devices[1] = tu_second_device(split_devices[0]);
  clpar_module *m, *l;
  clpar_manual_seed(seed);
  tu_ok(clpar_module_create("Split", split_forward, NULL, NULL, &m));
  tu_ok(clpar_linear_create(IN, HIDDEN, 1, split_devices[0], &l));
  tu_ok(clpar_module_add_child(m, "0", l));
  tu_ok(clpar_linear_create(HIDDEN, OUT, 1, split_devices[1], &l));
  tu_ok(clpar_module_add_child(m, "2", l));
  return m;
}

/* Forward and backward of MSE on rows [row0, row0+rows) of the batch. */
static void forward_backward(clpar_module *m, const float *x, const float *y, int row0, int rows) {
  clpar_device *dev = clpar_dist_device();
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *yt, *out, *loss;
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){rows, IN}, x + (size_t)row0 * IN, &xt));
  tu_ok(clpar_module_forward(m, xt, &out));
  tu_ok(clpar_tensor_from_host(clpar_tensor_device(out), 2, (int64_t[]){rows, OUT},
                               y + (size_t)row0 * OUT, &yt));
  tu_ok(clpar_mse_loss(out, yt, CLPAR_REDUCTION_MEAN, &loss));
  tu_ok(clpar_backward(loss));
  clpar_scope_end(scope);
}

/* One SGD-momentum step on rows [row0, row0+rows), in micro micro-steps whose gradients add
 * up. A DDP module synchronizes only in the last micro-step (clpar_ddp_set_sync); the one
 * process reference runs the whole batch micro times instead, which gives the same sum. */
static void train_step(clpar_module *m, clpar_optimizer *opt, const float *x, const float *y,
                       int row0, int rows, int micro) {
  int ddp = !strcmp(clpar_module_type(m), "DistributedDataParallel");
  tu_ok(clpar_optimizer_zero_grad(opt));
  for (int k = 0; k < micro; k++) {
    if (ddp) tu_ok(clpar_ddp_set_sync(m, k == micro - 1));
    if (ddp)
      forward_backward(m, x, y, row0 + k * (rows / micro), rows / micro);
    else
      forward_backward(m, x, y, row0, rows);
  }
  /* no call between backward and the step: backward returns with the gradients reduced */
  tu_ok(clpar_optimizer_step(opt));
  if (ddp) tu_ok(clpar_ddp_synchronize(m));
}

static clpar_optimizer *make_sgd(clpar_module *m) {
  clpar_sgd_options o = {.lr = 0.05f, .momentum = 0.9f};
  clpar_optimizer *opt;
  tu_ok(clpar_sgd_create_for(m, &o, &opt));
  return opt;
}

/* DDP with the given bucket cap, in micro micro-steps, against the whole batch on one
 * process; returns the number of buckets DDP made. */
static int check_matches_full_batch(double bucket_cap_mb, int micro, int flatten, int split) {
  int rank = clpar_dist_rank(), world = clpar_dist_world_size();
  assert_int_equal(BATCH % world, 0);
  float *x = tu_rand(BATCH * IN, 11), *y = tu_rand(BATCH * OUT, 12);

  clpar_module *ref = split ? make_split(1) : make_mlp(clpar_dist_device(), 1, OUT, 0), *ddp;
  clpar_ddp_options o = {.bucket_cap_mb = bucket_cap_mb};
  clpar_module *inner = split ? make_split(1 + (uint64_t)rank)
                              : make_mlp(clpar_dist_device(), 1 + (uint64_t)rank, OUT, 0);
  if (flatten) tu_ok(clpar_module_flatten(inner)); /* parameters become views of one buffer */
  tu_ok(clpar_ddp_create(inner, &o, &ddp));
  assert_string_equal(clpar_module_type(ddp), "DistributedDataParallel");
  clpar_optimizer *ref_opt = make_sgd(ref), *ddp_opt = make_sgd(ddp);
  int rows = BATCH / world;
  for (int step = 0; step < STEPS; step++) {
    train_step(ref, ref_opt, x, y, 0, BATCH, micro);
    train_step(ddp, ddp_opt, x, y, rank * rows, rows, micro);
  }

  int n = clpar_module_parameter_count(ref);
  assert_int_equal(clpar_module_parameter_count(ddp), n);
  for (int i = 0; i < n; i++) {
    const char *ref_name, *ddp_name;
    clpar_tensor *a, *b;
    tu_ok(clpar_module_parameter_at(ddp, i, &ddp_name, &a));
    tu_ok(clpar_module_parameter_at(ref, i, &ref_name, &b));
    char want[128];
    snprintf(want, sizeof want, "module.%s", ref_name);
    assert_string_equal(ddp_name, want);
    float *av = tu_read(a), *bv = tu_read(b);
    int64_t k = clpar_tensor_numel(b);
    float largest = 0;
    for (int64_t j = 0; j < k; j++) largest = fmaxf(largest, fabsf(bv[j]));
    /* 1e-5 relative to the tensor's largest weight: the two sum the rows' gradients in
     * different orders, so equality is only up to float rounding */
    char what[160];
    snprintf(what, sizeof what, "rank %d, %s after %d steps", rank, ddp_name, STEPS);
    tu_assert_close(av, bv, (size_t)k, 0.0f, 1e-5f * largest, what);
    free(av);
    free(bv);
  }
  clpar_ddp_stats stats;
  tu_ok(clpar_ddp_stats_get(ddp, &stats));
  assert_int_equal(stats.reductions, STEPS); /* one per step, also with micro-steps */
  clpar_optimizer_free(ref_opt);
  clpar_optimizer_free(ddp_opt);
  clpar_module_free(ref);
  clpar_module_free(ddp);
  free(x);
  free(y);
  return stats.buckets;
}

static void test_matches_full_batch(void **state) {
  (void)state;
  /* 5,508 parameters (22 KiB): all in the first bucket (1 MiB) */
  assert_int_equal(check_matches_full_batch(0, 1, 0, 0), 1);
}

static void test_matches_full_batch_several_buckets(void **state) {
  (void)state;
  /* 0.0005 MiB (524 bytes): reversed, the parameters make 3 buckets: {4.bias, 4.weight},
   * {2.bias, 2.weight}, {0.bias, 0.weight} */
  assert_int_equal(check_matches_full_batch(0.0005, 1, 0, 0), 3);
}

static void test_matches_full_batch_flat_parameters(void **state) {
  (void)state;
  assert_int_equal(check_matches_full_batch(0.0005, 1, 1, 0), 3);
}

/* src/dist/dist_internal.h (it needs mpi.h): pinned bucket memory on CPU devices too */
extern int clpar_ddp_pin_cpu;

/* The pinned buffers that GPUs get (host_alloc), forced on the CPU devices here. */
static void test_matches_full_batch_pinned_buckets(void **state) {
  (void)state;
  clpar_ddp_pin_cpu = 1;
  assert_int_equal(check_matches_full_batch(0.0005, 1, 0, 0), 3);
  clpar_ddp_pin_cpu = 0;
}

static void test_no_sync_accumulates_two_micro_steps(void **state) {
  (void)state;
  assert_int_equal(check_matches_full_batch(0.0005, 2, 0, 0), 3);
}

/* DDP over a module split over two devices (each rank: its device and a second one) against
 * the same split module trained on the whole batch: a bucket never spans devices, so the
 * parameters on each device make their own buckets (2 with the default cap). */
static void test_model_parallel_matches_full_batch(void **state) {
  (void)state;
  assert_int_equal(check_matches_full_batch(0, 1, 0, 1), 2);
}

static clpar_status forward_mlp_only(clpar_module *self, clpar_tensor *input, clpar_tensor **output,
                                     void *user) {
  (void)user;
  return clpar_module_forward(clpar_module_child(self, "mlp"), input, output);
}

/* A parameter the loss does not reach: backward leaves its bucket pending, and the next
 * forward fails on every rank naming it; the ranks stay in step. */
static void test_unused_parameter_named_at_next_forward(void **state) {
  (void)state;
  clpar_device *dev = clpar_dist_device();
  clpar_module *m, *ddp;
  clpar_tensor *unused, *out, *loss, *xt;
  tu_ok(clpar_module_create("WithUnused", forward_mlp_only, NULL, NULL, &m));
  tu_ok(clpar_module_add_child(m, "mlp", make_mlp(dev, 1, OUT, 0)));
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){3}, &unused));
  tu_ok(clpar_module_add_parameter(m, "unused", unused));
  clpar_tensor_free(unused);
  tu_ok(clpar_ddp_create(m, NULL, &ddp));
  float *x = tu_rand(4 * IN, 3);
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){4, IN}, x, &xt));
  tu_ok(clpar_module_forward(ddp, xt, &out));
  tu_ok(clpar_mean(out, &loss));
  tu_ok(clpar_backward(loss));
  clpar_tensor_free(out);
  clpar_tensor_free(loss);
  assert_int_equal(clpar_module_forward(ddp, xt, &out), CLPAR_ERROR_NO_GRADIENT);
  if (!strstr(clpar_last_error(), "no gradient to parameter module.unused"))
    fail_msg("rank %d: %s", clpar_dist_rank(), clpar_last_error());
  tu_ok(clpar_module_forward(ddp, xt, &out)); /* the step was reset */
  clpar_tensor_free(out);
  float one = 1;
  tu_ok(clpar_dist_all_reduce_sum(&one, 1));
  assert_true(one == (float)clpar_dist_world_size());
  clpar_tensor_free(xt);
  clpar_module_free(ddp);
  free(x);
}

/* ---- find_unused_parameters ---- */

/* a(x), plus b(x) where *user is set (rank 0 only, or no rank) */
static clpar_status partial_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                    void *user) {
  const int *use_b = user;
  clpar_tensor *ya, *yb;
  clpar_status s = clpar_module_forward(clpar_module_child(self, "a"), x, &ya);
  if (s != CLPAR_OK || !*use_b) {
    *y = ya;
    return s;
  }
  s = clpar_module_forward(clpar_module_child(self, "b"), x, &yb);
  if (s == CLPAR_OK) {
    s = clpar_add(ya, yb, y); /* its node holds what backward needs */
    clpar_tensor_free(yb);
  }
  clpar_tensor_free(ya);
  return s;
}

/* The gradient of mean(x W^T + c) over [rows, OUT]: dW[o][i] = sum_r x[r][i] / (rows OUT),
 * dc[o] = 1 / OUT, whatever the weights; times scale. */
static void expect_linear_grads(clpar_module *lin, const float *x, int rows, float scale,
                                const char *what) {
  float want_w[OUT * IN], want_b[OUT], got_w[OUT * IN], got_b[OUT];
  for (int o = 0; o < OUT; o++) {
    want_b[o] = scale / OUT;
    for (int i = 0; i < IN; i++) {
      double acc = 0;
      for (int r = 0; r < rows; r++) acc += x[r * IN + i];
      want_w[o * IN + i] = (float)(scale * acc / (rows * OUT));
    }
  }
  clpar_tensor *gw = clpar_tensor_grad(clpar_module_parameter(lin, "weight"));
  clpar_tensor *gb = clpar_tensor_grad(clpar_module_parameter(lin, "bias"));
  if (!gw || !gb) fail_msg("rank %d: %s: no gradient", clpar_dist_rank(), what);
  tu_ok(clpar_tensor_read(gw, got_w, OUT * IN));
  tu_ok(clpar_tensor_read(gb, got_b, OUT));
  char msg[200];
  snprintf(msg, sizeof msg, "rank %d: %s", clpar_dist_rank(), what);
  tu_assert_close(got_w, want_w, OUT * IN, 1e-5f, 1e-6f, msg);
  tu_assert_close(got_b, want_b, OUT, 1e-5f, 1e-6f, msg);
}

/* With find_unused_parameters, a layer that only rank 0 uses gets rank 0's gradient divided
 * by the world size on every rank, the others' as usual, and no step fails; a layer no rank
 * uses gets zeros. */
static void test_find_unused_parameters(void **state) {
  (void)state;
  int rank = clpar_dist_rank(), world = clpar_dist_world_size();
  clpar_device *dev = clpar_dist_device();
  static int use_b;
  clpar_module *m, *l, *ddp;
  clpar_manual_seed(7);
  tu_ok(clpar_module_create("Partial", partial_forward, &use_b, NULL, &m));
  tu_ok(clpar_linear_create(IN, OUT, 1, dev, &l));
  tu_ok(clpar_module_add_child(m, "a", l));
  tu_ok(clpar_linear_create(IN, OUT, 1, dev, &l));
  tu_ok(clpar_module_add_child(m, "b", l));
  /* a 1-float cap: one bucket per parameter, so b's make buckets of their own */
  clpar_ddp_options o = {.bucket_cap_mb = 1e-6, .find_unused_parameters = 1};
  tu_ok(clpar_ddp_create(m, &o, &ddp));
  float *x = tu_rand(4 * IN, 3); /* the same rows on every rank */
  clpar_tensor *xt, *out, *loss;
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){4, IN}, x, &xt));
  for (int step = 0; step < 3; step++) {
    use_b = step == 0 ? rank == 0 : step == 1 ? rank == world - 1 : 0;
    tu_ok(clpar_module_zero_grad(ddp));
    tu_ok(clpar_module_forward(ddp, xt, &out));
    tu_ok(clpar_mean(out, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_ddp_synchronize(ddp));
    clpar_tensor_free(out);
    clpar_tensor_free(loss);
    char what[80];
    snprintf(what, sizeof what, "step %d, layer a (used by every rank)", step);
    expect_linear_grads(clpar_module_child(m, "a"), x, 4, 1.0f, what);
    snprintf(what, sizeof what, "step %d, layer b (used by %s)", step,
             step == 0   ? "rank 0"
             : step == 1 ? "the last rank"
                         : "no rank");
    expect_linear_grads(clpar_module_child(m, "b"), x, 4, step < 2 ? 1.0f / (float)world : 0, what);
  }
  clpar_ddp_stats stats;
  tu_ok(clpar_ddp_stats_get(ddp, &stats));
  assert_int_equal(stats.buckets, 4);
  assert_int_equal(stats.reductions, 3);
  clpar_tensor_free(xt);
  clpar_module_free(ddp);
  free(x);
}

/* ---- uneven inputs ---- */

/* Each rank trains `steps` batches (its own number), then joins: the step where the first
 * rank joins; the status there. */
static clpar_status train_until_join(clpar_module *ddp, int steps, int *at) {
  clpar_device *dev = clpar_dist_device();
  float *x = tu_rand(4 * IN, 5);
  clpar_tensor *xt, *out, *loss;
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){4, IN}, x, &xt));
  clpar_status s = CLPAR_OK;
  int step = 0;
  for (;; step++) {
    if (step == steps) {
      s = clpar_ddp_join(ddp);
      break;
    }
    s = clpar_module_forward(ddp, xt, &out);
    if (s != CLPAR_OK) break;
    tu_ok(clpar_mean(out, &loss));
    tu_ok(clpar_backward(loss));
    clpar_tensor_free(out);
    clpar_tensor_free(loss);
  }
  *at = step;
  clpar_tensor_free(xt);
  free(x);
  return s;
}

static void in_step(void) {
  float one = 1;
  tu_ok(clpar_dist_all_reduce_sum(&one, 1));
  assert_true(one == (float)clpar_dist_world_size());
}

/* The last rank has 2 batches, the others 3: at the third step every rank fails naming the
 * last rank; a later forward fails at once; the ranks stay in step. */
static void test_uneven_inputs_fail_on_every_rank(void **state) {
  (void)state;
  int rank = clpar_dist_rank(), last = clpar_dist_world_size() - 1;
  clpar_ddp_options o = {.uneven_inputs = 1};
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(make_mlp(clpar_dist_device(), 1, OUT, 0), &o, &ddp));
  int at;
  clpar_status s = train_until_join(ddp, rank == last ? 2 : 3, &at);
  assert_int_equal(s, CLPAR_ERROR_UNEVEN_INPUTS);
  assert_int_equal(at, 2);
  char want[160];
  snprintf(want, sizeof want, "uneven inputs: rank %d ran out of inputs (clpar_ddp_join) at step 3",
           last);
  if (!strstr(clpar_last_error(), want) || !strstr(clpar_last_error(), "still had some"))
    fail_msg("rank %d: expected \"%s\" in \"%s\"", rank, want, clpar_last_error());
  clpar_tensor *xt, *out = NULL;
  tu_ok(clpar_tensor_zeros(clpar_dist_device(), 2, (int64_t[]){2, IN}, &xt));
  assert_int_equal(clpar_module_forward(ddp, xt, &out), CLPAR_ERROR_UNEVEN_INPUTS);
  assert_null(out);
  clpar_tensor_free(xt);
  in_step();
  clpar_module_free(ddp);
}

/* Every rank joins at the same step: CLPAR_OK; a join needs the option. */
static void test_even_inputs_join_together(void **state) {
  (void)state;
  clpar_ddp_options o = {.uneven_inputs = 1};
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(make_mlp(clpar_dist_device(), 1, OUT, 0), &o, &ddp));
  int at;
  tu_ok(train_until_join(ddp, 2, &at));
  assert_int_equal(at, 2);
  clpar_ddp_stats stats;
  tu_ok(clpar_ddp_stats_get(ddp, &stats));
  assert_int_equal(stats.reductions, 2);
  in_step();
  clpar_module_free(ddp);
  tu_ok(clpar_ddp_create(make_mlp(clpar_dist_device(), 1, OUT, 0), NULL, &ddp));
  assert_int_equal(clpar_ddp_join(ddp), CLPAR_ERROR_INVALID_ARGUMENT); /* no collective */
  if (!strstr(clpar_last_error(), "without the uneven_inputs option"))
    fail_msg("rank %d: %s", clpar_dist_rank(), clpar_last_error());
  in_step();
  clpar_module_free(ddp);
}

/* The last rank's model differs (how: out and extra); every rank must fail with message
 * `want` (printf format with the last rank), and no rank may hang. */
static void check_mismatch(int out, int extra, const char *want_format) {
  int rank = clpar_dist_rank(), last = clpar_dist_world_size() - 1;
  clpar_module *m = rank == last ? make_mlp(clpar_dist_device(), 1, out, extra)
                                 : make_mlp(clpar_dist_device(), 1, OUT, 0);
  clpar_module *ddp = NULL;
  clpar_status s = clpar_ddp_create(m, NULL, &ddp);
  assert_int_equal(s, CLPAR_ERROR_SHAPE_MISMATCH);
  assert_null(ddp);
  char want[256];
  snprintf(want, sizeof want, want_format, last);
  if (!strstr(clpar_last_error(), want))
    fail_msg("rank %d: expected \"%s\" in \"%s\"", rank, want, clpar_last_error());
  /* the ranks are still in step: a collective after the failure completes */
  float one = 1;
  tu_ok(clpar_dist_all_reduce_sum(&one, 1));
  assert_true(one == (float)(last + 1));
}

static void test_shape_mismatch_fails_on_every_rank(void **state) {
  (void)state;
  check_mismatch(OUT + 1, 0,
                 "parameter 4 is \"module.4.weight [5, 64]\" on rank %d but \"module.4.weight "
                 "[4, 64]\" on rank 0");
}

static void test_count_mismatch_fails_on_every_rank(void **state) {
  (void)state;
  check_mismatch(OUT, 1, "rank %d has 8 parameters where rank 0 has 6 (the first 6 agree)");
}

/* ---- buffers ---- */

static clpar_status shifted_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                    void *user) {
  (void)user;
  return clpar_linear(x, clpar_module_parameter(self, "weight"), clpar_module_buffer(self, "shift"),
                      y);
}

static void set_buffer(clpar_module *m, const char *name, float base, float step, int n) {
  float v[8];
  for (int j = 0; j < n; j++) v[j] = base + step * (float)j;
  tu_ok(clpar_tensor_write(clpar_module_buffer(m, name), v, (size_t)n));
}

static void expect_buffer(clpar_module *m, const char *name, float base, float step, int n,
                          const char *when) {
  float v[8], want[8];
  for (int j = 0; j < n; j++) want[j] = base + step * (float)j;
  tu_ok(clpar_tensor_read(clpar_module_buffer(m, name), v, (size_t)n));
  char what[160];
  snprintf(what, sizeof what, "rank %d: buffer %s %s", clpar_dist_rank(), name, when);
  tu_assert_close(v, want, (size_t)n, 0, 0, what);
}

/* x @ weight^T + shift, weight [OUT, IN] and buffers shift [OUT], extra [extra_n]; values
 * differ by rank. */
static clpar_module *make_shifted(clpar_device *dev, int rank, int extra_n) {
  clpar_module *m;
  clpar_tensor *w, *b;
  tu_ok(clpar_module_create("Shifted", shifted_forward, NULL, NULL, &m));
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){OUT, IN}, 5 + (uint64_t)rank, -1, 1, &w));
  tu_ok(clpar_module_add_parameter(m, "weight", w));
  clpar_tensor_free(w);
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){OUT}, &b));
  tu_ok(clpar_module_add_buffer(m, "shift", b));
  clpar_tensor_free(b);
  tu_ok(clpar_tensor_zeros(dev, 1, (int64_t[]){extra_n}, &b));
  tu_ok(clpar_module_add_buffer(m, "extra", b));
  clpar_tensor_free(b);
  set_buffer(m, "shift", 100.0f * (float)rank, 1, OUT);
  set_buffer(m, "extra", -(float)rank, -1, extra_n);
  return m;
}

/* The forward's output against x @ weight^T + shift on the host, with rank 0's shift. */
static void forward_and_check(clpar_module *ddp, clpar_tensor *xt, const float *x, float shift_base,
                              const char *when) {
  clpar_module *m = clpar_module_child(ddp, "module");
  clpar_tensor *out;
  tu_ok(clpar_module_forward(ddp, xt, &out));
  float *y = tu_read(out), *w = tu_read(clpar_module_parameter(m, "weight")), want[2 * OUT];
  for (int r = 0; r < 2; r++)
    for (int o = 0; o < OUT; o++) {
      double acc = shift_base + o;
      for (int i = 0; i < IN; i++) acc += (double)x[r * IN + i] * w[o * IN + i];
      want[r * OUT + o] = (float)acc;
    }
  char what[160];
  snprintf(what, sizeof what, "rank %d: output %s", clpar_dist_rank(), when);
  tu_assert_close(y, want, 2 * OUT, 1e-5f, 1e-4f, what);
  free(y);
  free(w);
  clpar_tensor_free(out);
}

/* Rank 0's buffers reach every rank at creation and before a forward (broadcast_buffers), but
 * not in the forward after one without gradients, as in PyTorch. */
static void test_buffers_broadcast_from_rank_0(void **state) {
  (void)state;
  int rank = clpar_dist_rank();
  clpar_device *dev = clpar_dist_device();
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(make_shifted(dev, rank, 3), NULL, &ddp));
  clpar_module *m = clpar_module_child(ddp, "module");
  const char *name;
  assert_int_equal(clpar_module_buffer_count(ddp), 2);
  tu_ok(clpar_module_buffer_at(ddp, 1, &name, NULL));
  assert_string_equal(name, "module.extra");
  expect_buffer(m, "shift", 0, 1, OUT, "after clpar_ddp_create");
  expect_buffer(m, "extra", 0, -1, 3, "after clpar_ddp_create");

  float *x = tu_rand(2 * IN, 21);
  clpar_tensor *xt;
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){2, IN}, x, &xt));
  set_buffer(m, "shift", 1000.0f * (float)(rank + 1), 1, OUT); /* rank 0: 1000 + j */
  forward_and_check(ddp, xt, x, 1000, "of a forward");
  expect_buffer(m, "shift", 1000, 1, OUT, "after a forward");

  int was = clpar_set_grad_enabled(0); /* this forward broadcasts, the next one does not */
  forward_and_check(ddp, xt, x, 1000, "of a forward without gradients");
  clpar_set_grad_enabled(was);
  set_buffer(m, "shift", 2000.0f * (float)(rank + 1), 1, OUT);
  forward_and_check(ddp, xt, x, 2000.0f * (float)(rank + 1), "after a forward without gradients");
  expect_buffer(m, "shift", 2000.0f * (float)(rank + 1), 1, OUT,
                "after a forward that follows one without gradients");
  forward_and_check(ddp, xt, x, 2000, "of the forward after that");
  expect_buffer(m, "shift", 2000, 1, OUT, "after the forward after that");
  clpar_tensor_free(xt);
  clpar_module_free(ddp);
  free(x);
}

/* A buffer of another shape on the last rank: every rank fails naming it, none hangs. */
static void test_buffer_mismatch_fails_on_every_rank(void **state) {
  (void)state;
  int rank = clpar_dist_rank(), last = clpar_dist_world_size() - 1;
  clpar_module *ddp = NULL;
  clpar_status s =
      clpar_ddp_create(make_shifted(clpar_dist_device(), rank, rank == last ? 5 : 3), NULL, &ddp);
  assert_int_equal(s, CLPAR_ERROR_SHAPE_MISMATCH);
  assert_null(ddp);
  char want[256];
  snprintf(want, sizeof want,
           "buffer 1 is \"module.extra [5]\" on rank %d but \"module.extra [3]\" on rank 0", last);
  if (!strstr(clpar_last_error(), want))
    fail_msg("rank %d: expected \"%s\" in \"%s\"", rank, want, clpar_last_error());
  float one = 1;
  tu_ok(clpar_dist_all_reduce_sum(&one, 1));
  assert_true(one == (float)(last + 1));
}

static int setup(void **state) {
  if (tu_dist_setup(state) != 0) return -1;
  fprintf(stderr, "rank %d of %d (local %d of %d) on %s\n", clpar_dist_rank(),
          clpar_dist_world_size(), clpar_dist_local_rank(), clpar_dist_local_size(),
          clpar_device_id(clpar_dist_device()));
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_full_batch),
      cmocka_unit_test(test_matches_full_batch_several_buckets),
      cmocka_unit_test(test_matches_full_batch_flat_parameters),
      cmocka_unit_test(test_matches_full_batch_pinned_buckets),
      cmocka_unit_test(test_no_sync_accumulates_two_micro_steps),
      cmocka_unit_test(test_model_parallel_matches_full_batch),
      cmocka_unit_test(test_unused_parameter_named_at_next_forward),
      cmocka_unit_test(test_find_unused_parameters),
      cmocka_unit_test(test_uneven_inputs_fail_on_every_rank),
      cmocka_unit_test(test_even_inputs_join_together),
      cmocka_unit_test(test_shape_mismatch_fails_on_every_rank),
      cmocka_unit_test(test_count_mismatch_fails_on_every_rank),
      cmocka_unit_test(test_buffers_broadcast_from_rank_0),
      cmocka_unit_test(test_buffer_mismatch_fails_on_every_rank),
  };
  return cmocka_run_group_tests_name("ddp", tests, setup, tu_dist_teardown);
}
