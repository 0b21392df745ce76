/* test_linear_fused.c — the fused Linear (clpar_linear_act, src/nn/functional.c), its backend
 * entries bias_act and bias_act_backward, and gradients written straight into their slots
 * (clpar_grad_slot, src/autograd.c).
 *
 * - The entries on every selected device, fused and composed (clpar_compose_force), against
 *   a float64 reference computed here, for each activation, with and without out, db and
 *   accumulation, out aliasing its input, and a tall matrix (OpenCL's two-pass sum).
 * - clpar_linear and clpar_linear_act's gradients on every device against central finite
 *   differences of the float64 forward on the host.
 * - The slots: a second backward adds into the leaves' grads (twice the first), a flattened
 *   module's gradients go straight into the flat gradient, and Sequential(Linear, ReLU) gives
 *   the unfused ops' values and gradients.
 * - The linear_act entry (the forward: GEMM, bias, activation) on every device, fused and
 *   composed, against a float64 reference and each other (the same bits): each activation,
 *   with and without a bias, k a multiple of 8 (OpenCL CPU devices' one-kernel epilogue; n too:
 *   its 2 x 8 register-blocked kernel) and not (GEMM, then bias_act).
 * - On devices with a profile, the ops a Linear + ReLU layer enqueues: 2 forward (1 on CPU
 *   OpenCL devices: the GEMM's epilogue), 3 backward (1 on CPU OpenCL devices:
 *   linear_act_backward's one kernel) once the parameters have gradients (no separate adds
 *   into them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_act_ref.h"
#include "test_util.h"

#define BIT(entry) ((uint64_t)1 << CLPAR_ENTRY_##entry)

/* ---- the entries ---- */

/* One shape through both entries on dev, checked against the float64 reference. */
static void check_entries(clpar_device *dev, clpar_act_kind act, int64_t rows, int64_t cols,
                          const char *way) {
  int64_t shape[2] = {rows, cols};
  size_t n = (size_t)(rows * cols);
  clpar_tensor *a = tu_make(dev, 2, shape, 1), *bias = tu_make(dev, 1, &cols, 2);
  clpar_tensor *g = tu_make(dev, 2, shape, 3), *db0 = tu_make(dev, 1, &cols, 4);
  clpar_tensor *y, *out, *db, *gcopy;
  tu_ok(clpar_tensor_empty(dev, 2, shape, &y));
  tu_ok(clpar_tensor_empty(dev, 2, shape, &out));
  tu_ok(clpar_tensor_empty(dev, 1, &cols, &db));
  float *pa = tu_read(a), *pb = tu_read(bias), *pg = tu_read(g), *pdb0 = tu_read(db0);
  float *want_y = malloc(n * sizeof *want_y), *want_d = malloc(n * sizeof *want_d);
  float *want_sum = malloc((size_t)cols * sizeof *want_sum);
  float *want_acc = malloc((size_t)cols * sizeof *want_acc);
  assert_non_null(want_y);
  assert_non_null(want_d);
  assert_non_null(want_sum);
  assert_non_null(want_acc);
  for (size_t i = 0; i < n; i++) want_y[i] = (float)tu_act(act, (double)(pa[i] + pb[i % cols]));
  for (int64_t c = 0; c < cols; c++) {
    double s = 0;
    for (int64_t r = 0; r < rows; r++) {
      size_t i = (size_t)(r * cols + c);
      want_d[i] = (float)((double)pg[i] * tu_act_grad(act, want_y[i]));
      s += want_d[i];
    }
    want_sum[c] = (float)s;
    want_acc[c] = (float)(s + pdb0[c]);
  }
  char label[160];
  clpar_bref none = {NULL, 0};
  /* forward into y; and in place (out aliases a) */
  tu_ok(clpar_dev_bias_act(dev, act, (size_t)rows, (size_t)cols, clpar_tensor_bref(a),
                           clpar_tensor_bref(bias), clpar_tensor_bref(y)));
  float *got = tu_read(y);
  snprintf(label, sizeof label, "bias_act %s %lldx%lld on %s (%s)", tu_act_name(act),
           (long long)rows, (long long)cols, clpar_device_id(dev), way);
  tu_assert_close(got, want_y, n, 1e-5f, 1e-6f, label);
  free(got);
  tu_ok(clpar_dev_bias_act(dev, act, (size_t)rows, (size_t)cols, clpar_tensor_bref(a),
                           clpar_tensor_bref(bias), clpar_tensor_bref(a)));
  got = tu_read(a);
  tu_assert_close(got, want_y, n, 1e-5f, 1e-6f, label);
  free(got);
  /* the backward reads the output y the forward wrote (as clpar_linear_act's node does) */
  clpar_bref yref = act == CLPAR_ACT_NONE ? none : clpar_tensor_bref(y);
  snprintf(label, sizeof label, "bias_act_backward %s %lldx%lld on %s (%s)", tu_act_name(act),
           (long long)rows, (long long)cols, clpar_device_id(dev), way);
  /* out and db, db overwritten */
  tu_ok(clpar_dev_bias_act_backward(dev, act, (size_t)rows, (size_t)cols, clpar_tensor_bref(g),
                                    yref, clpar_tensor_bref(out), clpar_tensor_bref(db), 0));
  got = tu_read(out);
  tu_assert_close(got, want_d, n, 1e-5f, 1e-6f, label);
  free(got);
  got = tu_read(db);
  tu_assert_close(got, want_sum, (size_t)cols, 1e-4f, 1e-5f, label);
  free(got);
  /* db only, accumulated onto db0 */
  tu_ok(clpar_dev_bias_act_backward(dev, act, (size_t)rows, (size_t)cols, clpar_tensor_bref(g),
                                    yref, none, clpar_tensor_bref(db0), 1));
  got = tu_read(db0);
  tu_assert_close(got, want_acc, (size_t)cols, 1e-4f, 1e-5f, label);
  free(got);
  /* out only, in place over a copy of g */
  tu_ok(clpar_tensor_empty(dev, 2, shape, &gcopy));
  tu_ok(clpar_copy(gcopy, g));
  tu_ok(clpar_dev_bias_act_backward(dev, act, (size_t)rows, (size_t)cols, clpar_tensor_bref(gcopy),
                                    yref, clpar_tensor_bref(gcopy), none, 0));
  got = tu_read(gcopy);
  tu_assert_close(got, want_d, n, 1e-5f, 1e-6f, label);
  free(got);
  clpar_tensor_free(gcopy);
  free(pa);
  free(pb);
  free(pg);
  free(pdb0);
  free(want_y);
  free(want_d);
  free(want_sum);
  free(want_acc);
  clpar_tensor_free(a);
  clpar_tensor_free(bias);
  clpar_tensor_free(g);
  clpar_tensor_free(db0);
  clpar_tensor_free(y);
  clpar_tensor_free(out);
  clpar_tensor_free(db);
}

static void test_entries_against_reference(void **state) {
  (void)state;
  static const int64_t shapes[][2] = {{5, 7}, {3, 70}, {300, 33}, {1, 1}};
  uint64_t bits = BIT(bias_act) | BIT(bias_act_backward);
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    for (int composed = 0; composed < 2; composed++) {
      tu_ok(clpar_compose_force(dev, composed ? bits : 0));
      uint64_t before = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
      for (int act = CLPAR_ACT_NONE; act <= CLPAR_ACT_TANH; act++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
          check_entries(dev, (clpar_act_kind)act, shapes[s][0], shapes[s][1],
                        composed ? "composed" : "the backend's");
      uint64_t calls = __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED) - before;
      if (composed)
        assert_true(calls > 0);
      else
        assert_int_equal(calls, 0);
    }
    tu_ok(clpar_compose_force(dev, 0));
  }
}

/* ---- gradients against finite differences ---- */

static void test_gradients_finite_differences(void **state) {
  (void)state;
  tu_act_check_gradients((tu_linear_dims){4, 5, 3}, 21, 1);
}

/* ---- the slots ---- */

/* Sequential(Linear, ReLU, Linear) against the same parameters through the unfused ops
 * (matmul, add, relu), on dev: the outputs, and the gradients of two backward passes (the
 * second adds into the grads the first made: the leaves' slots) and of a flattened module
 * (the flat gradient's slices from the start). */
static void check_sequential(clpar_device *dev, int flatten) {
  int64_t xs[2] = {6, 8}, rs[2] = {6, 4};
  clpar_module *l[3], *seq;
  tu_ok(clpar_linear_create(8, 16, 1, dev, &l[0]));
  tu_ok(clpar_relu_create(&l[1]));
  tu_ok(clpar_linear_create(16, 4, 1, dev, &l[2]));
  tu_ok(clpar_sequential_create(l, 3, &seq));
  if (flatten) tu_ok(clpar_module_flatten(seq));
  int np = clpar_module_parameter_count(seq);
  assert_int_equal(np, 4);
  clpar_tensor *x = tu_make(dev, 2, xs, 31), *r = tu_make(dev, 2, rs, 32);
  /* unfused copies of the parameters, leaves of their own */
  clpar_tensor *p[4], *q[4];
  for (int i = 0; i < np; i++) {
    const char *name;
    tu_ok(clpar_module_parameter_at(seq, i, &name, &p[i]));
    float *v = tu_read(p[i]);
    int64_t shape[CLPAR_MAX_DIMS];
    int nd = clpar_tensor_ndim(p[i]);
    for (int k = 0; k < nd; k++) shape[k] = clpar_tensor_dim(p[i], k);
    tu_ok(clpar_tensor_from_host(dev, nd, shape, v, &q[i]));
    tu_ok(clpar_tensor_set_requires_grad(q[i], 1));
    free(v);
  }
  for (int pass = 0; pass < 2; pass++) {
    clpar_tensor *y, *yr, *loss, *h, *hb, *hr, *o, *ob, *or_, *loss2;
    tu_ok(clpar_module_forward(seq, x, &y));
    tu_ok(clpar_mul(y, r, &yr));
    tu_ok(clpar_sum(yr, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_matmul(x, q[0], 0, 1, &h));
    tu_ok(clpar_add(h, q[1], &hb));
    tu_ok(clpar_relu(hb, &hr));
    tu_ok(clpar_matmul(hr, q[2], 0, 1, &o));
    tu_ok(clpar_add(o, q[3], &ob));
    tu_ok(clpar_mul(ob, r, &or_));
    tu_ok(clpar_sum(or_, &loss2));
    tu_ok(clpar_backward(loss2));
    char label[160];
    snprintf(label, sizeof label, "Sequential(Linear, ReLU, Linear)%s on %s, pass %d: output",
             flatten ? " flattened" : "", clpar_device_id(dev), pass);
    tu_expect_equal(y, ob, 1e-5f, 1e-6f, label);
    for (int i = 0; i < np; i++) {
      snprintf(label, sizeof label, "Sequential%s on %s, pass %d: gradient of parameter %d",
               flatten ? " flattened" : "", clpar_device_id(dev), pass, i);
      tu_expect_equal(clpar_tensor_grad(p[i]), clpar_tensor_grad(q[i]), 1e-5f, 1e-6f, label);
    }
    clpar_tensor *ts[] = {y, yr, loss, h, hb, hr, o, ob, or_, loss2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) clpar_tensor_free(ts[i]);
  }
  for (int i = 0; i < np; i++) clpar_tensor_free(q[i]);
  clpar_tensor_free(x);
  clpar_tensor_free(r);
  clpar_module_free(seq);
}

static void test_sequential_matches_unfused_ops(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    check_sequential(dev, 0);
    check_sequential(dev, 1);
  }
}

/* A parameter used twice in one graph collects both shares in its slot. */
static void test_shared_weight_accumulates(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    int64_t xs[2] = {3, 4}, ws[2] = {4, 4};
    clpar_tensor *x = tu_make(dev, 2, xs, 41), *w = tu_make(dev, 2, ws, 42);
    clpar_tensor *w2 = tu_make(dev, 2, ws, 42); /* the same values, unfused */
    tu_ok(clpar_tensor_set_requires_grad(w, 1));
    tu_ok(clpar_tensor_set_requires_grad(w2, 1));
    for (int pass = 0; pass < 2; pass++) {
      clpar_tensor *a, *b, *loss, *a2, *b2, *loss2;
      tu_ok(clpar_linear_act(x, w, NULL, CLPAR_ACT_TANH, &a));
      tu_ok(clpar_linear_act(a, w, NULL, CLPAR_ACT_TANH, &b));
      clpar_tensor_free(a);
      tu_ok(clpar_sum(b, &loss));
      tu_ok(clpar_backward(loss));
      tu_ok(clpar_matmul(x, w2, 0, 1, &a));
      clpar_tensor *t;
      tu_ok(clpar_tanh(a, &t));
      clpar_tensor_free(a);
      tu_ok(clpar_matmul(t, w2, 0, 1, &a2));
      tu_ok(clpar_tanh(a2, &b2));
      tu_ok(clpar_sum(b2, &loss2));
      tu_ok(clpar_backward(loss2));
      tu_expect_equal(clpar_tensor_grad(w), clpar_tensor_grad(w2), 1e-5f, 1e-6f,
                      "a weight used by two fused layers");
      clpar_tensor *ts[] = {b, loss, t, a2, b2, loss2};
      for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) clpar_tensor_free(ts[i]);
    }
    clpar_tensor_free(x);
    clpar_tensor_free(w);
    clpar_tensor_free(w2);
  }
}

/* ---- ops per layer ---- */

/* A CUDA device running a Linear's bias and ReLU in cuBLASLt's epilogue (CLPAR_CUDA_LT=1): one
 * kernel forward, with other bits than the composition's GEMM then bias_act. */
static int cuda_lt(const clpar_device *dev) {
  const char *v = getenv("CLPAR_CUDA_LT");
  return strcmp(dev->bd.iface->name, "cuda") == 0 && v && strcmp(v, "1") == 0;
}

/* linear_act on dev for x [m, k], w [n, k], an optional bias [n]: fused and composed against
 * float64. */
static void check_linear_act(clpar_device *dev, clpar_act_kind act, int64_t m, int64_t n, int64_t k,
                             int with_bias) {
  int64_t xs[2] = {m, k}, ws[2] = {n, k}, ys[2] = {m, n};
  clpar_tensor *x = tu_make(dev, 2, xs, 31), *w = tu_make(dev, 2, ws, 32);
  clpar_tensor *b = tu_make(dev, 1, &n, 33), *y;
  tu_ok(clpar_tensor_empty(dev, 2, ys, &y));
  float *px = tu_read(x), *pw = tu_read(w), *pb = tu_read(b);
  size_t count = (size_t)(m * n);
  float *want = malloc(count * sizeof *want), *got = malloc(count * sizeof *got);
  float *fused = malloc(count * sizeof *fused);
  assert_non_null(want);
  assert_non_null(got);
  assert_non_null(fused);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0;
      for (int64_t p = 0; p < k; p++) acc += (double)px[i * k + p] * pw[j * k + p];
      want[i * n + j] = (float)tu_act(act, (double)(float)acc + (with_bias ? pb[j] : 0.0f));
    }
  clpar_bref none = {NULL, 0};
  for (int way = 0; way < 2; way++) {
    tu_ok(clpar_compose_force(dev, way ? BIT(linear_act) : 0));
    tu_ok(clpar_dev_linear_act(dev, act, (size_t)m, (size_t)n, (size_t)k, clpar_tensor_bref(x),
                               clpar_tensor_bref(w), with_bias ? clpar_tensor_bref(b) : none,
                               clpar_tensor_bref(y)));
    tu_ok(clpar_tensor_read(y, got, count));
    char what[160];
    snprintf(what, sizeof what, "linear_act %s [%lld x %lld x %lld] bias %d %s on %s",
             tu_act_name(act), (long long)m, (long long)n, (long long)k, with_bias,
             way ? "composed" : "fused", clpar_device_id(dev));
    tu_assert_close(got, want, count, 1e-4f, 1e-5f, what);
    int epilogue = cuda_lt(dev) && with_bias && act <= CLPAR_ACT_RELU;
    if (!way)
      memcpy(fused, got, count * sizeof *got);
    else if (!epilogue && memcmp(fused, got, count * sizeof *got) != 0) { /* the same sums */
      tu_assert_close(fused, got, count, 0.0f, 0.0f, what);
      fail_msg("%s: the entry and its composition differ in bits", what);
    }
  }
  tu_ok(clpar_compose_force(dev, 0));
  free(px), free(pw), free(pb), free(want), free(got), free(fused);
  clpar_tensor_free(x), clpar_tensor_free(w), clpar_tensor_free(b), clpar_tensor_free(y);
}

static void test_linear_act_entry(void **state) {
  (void)state;
  static const int64_t shapes[][3] = {{32, 64, 64}, {5, 3, 16},  {7, 9, 13},
                                      {1, 1, 8},    {5, 24, 40}, {1, 8, 8}};
  clpar_device *devs[8];
  int nd = 0;
  devs[nd++] = tu_host();
  for (int d = 0; d < clpar_device_count() && nd < 8; d++)
    if (clpar_device_get(d) != tu_host()) devs[nd++] = clpar_device_get(d);
  for (int d = 0; d < nd; d++)
    for (int act = CLPAR_ACT_NONE; act <= CLPAR_ACT_TANH; act++)
      for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int with_bias = 0; with_bias < 2; with_bias++)
          check_linear_act(devs[d], (clpar_act_kind)act, shapes[sh][0], shapes[sh][1],
                           shapes[sh][2], with_bias);
}

/* Linear + ReLU: a GEMM and bias_act forward; bias_act_backward and two GEMMs backward (on
 * CPU OpenCL devices one kernel each way: the GEMM's epilogue, linear_act_backward's kernel),
 * and nothing more once the parameters have gradients (added into by the entries themselves).
 * Counted by the profile of the devices that have one. */
static void test_ops_per_layer(void **state) {
  (void)state;
  int checked = 0;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_device_info info;
    tu_ok(clpar_device_get_info(dev, &info));
    if (strcmp(info.backend, "opencl") != 0 && strcmp(info.backend, "cuda") != 0) continue;
    int64_t xs[2] = {8, 16};
    clpar_module *l[2], *seq;
    tu_ok(clpar_linear_create(16, 16, 1, dev, &l[0]));
    tu_ok(clpar_relu_create(&l[1]));
    tu_ok(clpar_sequential_create(l, 2, &seq));
    clpar_tensor *x = tu_make(dev, 2, xs, 51);
    tu_ok(clpar_tensor_set_requires_grad(x, 1));
    for (int pass = 0; pass < 2; pass++) {
      clpar_tensor *y, *loss;
      tu_ok(clpar_device_synchronize(dev));
      tu_ok(clpar_device_profile_start(dev));
      tu_ok(clpar_module_forward(seq, x, &y));
      clpar_profile prof;
      tu_ok(clpar_device_profile_read(dev, &prof));
      /* a CPU OpenCL device runs the bias and ReLU in the GEMM's epilogue, and so does a CUDA
       * device with cuBLASLt's */
      int one_kernel = strcmp(info.backend, "opencl") == 0 && info.type == CLPAR_DEVICE_CPU;
      assert_int_equal(prof.ops, one_kernel || cuda_lt(dev) ? 1 : 2);
      tu_ok(clpar_sum(y, &loss));
      tu_ok(clpar_device_profile_start(dev)); /* restarts the count */
      tu_ok(clpar_backward(loss));
      tu_ok(clpar_device_profile_read(dev, &prof));
      tu_ok(clpar_device_profile_stop(dev));
      /* backward's seed fill, sum's backward (a broadcast), then the layer's one entry: one
       * kernel on a CPU OpenCL device, else bias_act_backward and two GEMMs; on the first
       * pass x, W and b keep the gradients backward made for them, without a copy */
      assert_int_equal(prof.ops, one_kernel ? 3 : 5);
      if (pass == 1) checked++;
      clpar_tensor_free(y);
      clpar_tensor_free(loss);
    }
    clpar_tensor_free(x);
    clpar_module_free(seq);
  }
  if (!checked) skip(); /* the host backend keeps no profile */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entries_against_reference),
      cmocka_unit_test(test_gradients_finite_differences),
      cmocka_unit_test(test_sequential_matches_unfused_ops),
      cmocka_unit_test(test_shared_weight_accumulates),
      cmocka_unit_test(test_linear_act_entry),
      cmocka_unit_test(test_ops_per_layer),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
