/* test_cuda_lt.c — a Linear's forward through cuBLASLt's GEMM epilogue on CUDA devices
 * (backends/cuda/cuda_lt.c, CLPAR_CUDA_LT=1):
 * - the linear_act entry against a float64 reference and the host device's entry: act none
 *   and ReLU with a bias, odd m, n and k (m = 1 too), large k, operands 4 bytes off their
 *   allocation's alignment, an output full of NaN before (beta 0 must not read it); the aligned
 *   shapes must have run through cuBLASLt;
 * - an MLP's training steps eager and through clpar_step_run (captured, replayed): the same
 *   losses and parameters bit for bit;
 * - CLPAR_CUDA_LT, read at clpar_init: "0" and "1" only, anything else an error naming it
 *   (this part runs without a GPU too); "0" leaves the plain path.
 * Without a CUDA device the device parts print why and skip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_graph_util.h"

/* backends/cuda/cuda_lt.c: the matmuls a device ran through cuBLASLt. */
uint64_t clpar_cuda_lt_runs(const void *dev);

#define MAX_CUDA 16
static clpar_device *cuda_devs[MAX_CUDA];
static int cuda_count;

static int is_cuda(const clpar_device *d) {
  return strcmp(d->bd.iface->name, "cuda") == 0;
}

static void find_devices(void) {
  cuda_count = 0;
  for (int i = 0; i < clpar_device_count() && cuda_count < MAX_CUDA; i++)
    if (is_cuda(clpar_device_get(i))) cuda_devs[cuda_count++] = clpar_device_get(i);
}

static uint64_t lt_runs(clpar_device *dev) {
  return clpar_cuda_lt_runs(dev->bd.ctx);
}

#define NEED_CUDA()                                                           \
  do {                                                                        \
    if (cuda_count == 0) {                                                    \
      fprintf(stderr,                                                         \
              "test_cuda_lt: no CUDA device selected (CLPAR_DEVICES=%s; "     \
              "CLPAR_LOG_LEVEL=info tells why)\n",                            \
              getenv("CLPAR_DEVICES") ? getenv("CLPAR_DEVICES") : "(unset)"); \
      skip();                                                                 \
    }                                                                         \
  } while (0)

/* ---- the entry against the reference ---- */

typedef struct {
  int64_t m, n, k;
  int off; /* floats each operand starts after its allocation's start */
} lt_case;

/* A tensor of count + off floats from seed, and its reference past the first off. */
static clpar_tensor *operand(clpar_device *dev, int64_t count, int off, uint64_t seed,
                             clpar_bref *ref) {
  int64_t total = count + off;
  clpar_tensor *t = tu_make(dev, 1, &total, seed);
  *ref = clpar_tensor_bref(t);
  ref->off += (size_t)off;
  return t;
}

/* out of linear_act on dev for c, read back (malloc'ed); out holds NaN before. */
static float *run_entry(clpar_device *dev, clpar_act_kind act, const lt_case *c) {
  clpar_bref x, w, b, y;
  clpar_tensor *tx = operand(dev, c->m * c->k, c->off, 61, &x);
  clpar_tensor *tw = operand(dev, c->n * c->k, c->off, 62, &w);
  clpar_tensor *tb = operand(dev, c->n, c->off, 63, &b);
  clpar_tensor *ty = operand(dev, c->m * c->n, c->off, 64, &y);
  tu_ok(clpar_fill(ty, NAN));
  tu_ok(clpar_dev_linear_act(dev, act, (size_t)c->m, (size_t)c->n, (size_t)c->k, x, w, b, y));
  size_t total = (size_t)(c->m * c->n + c->off);
  float *all = malloc(total * sizeof *all);
  assert_non_null(all);
  tu_ok(clpar_tensor_read(ty, all, total));
  memmove(all, all + c->off, (size_t)(c->m * c->n) * sizeof *all);
  clpar_tensor_free(tx), clpar_tensor_free(tw), clpar_tensor_free(tb), clpar_tensor_free(ty);
  return all;
}

/* The float64 reference of c from the same seeds as run_entry's operands. */
static float *reference(clpar_act_kind act, const lt_case *c) {
  size_t o = (size_t)c->off;
  float *x = tu_rand((size_t)(c->m * c->k) + o, 61), *w = tu_rand((size_t)(c->n * c->k) + o, 62);
  float *b = tu_rand((size_t)c->n + o, 63);
  float *want = malloc((size_t)(c->m * c->n) * sizeof *want);
  assert_non_null(want);
  for (int64_t i = 0; i < c->m; i++)
    for (int64_t j = 0; j < c->n; j++) {
      double acc = 0;
      for (int64_t p = 0; p < c->k; p++) acc += (double)x[o + i * c->k + p] * w[o + j * c->k + p];
      double v = (double)(float)acc + b[o + j];
      want[i * c->n + j] = (float)(act == CLPAR_ACT_RELU && !(v > 0) ? 0.0 : v);
    }
  free(x), free(w), free(b);
  return want;
}

static void check_case(clpar_device *dev, clpar_act_kind act, const lt_case *c, int must_run_lt,
                       int *ran, int *calls) {
  size_t count = (size_t)(c->m * c->n);
  char what[160];
  snprintf(what, sizeof what, "linear_act %s [%lld x %lld x %lld] offset %d on %s",
           act == CLPAR_ACT_RELU ? "relu" : "none", (long long)c->m, (long long)c->n,
           (long long)c->k, c->off, clpar_device_id(dev));
  uint64_t before = lt_runs(dev);
  float *got = run_entry(dev, act, c);
  int used = lt_runs(dev) > before;
  float *host = run_entry(tu_host(), act, c), *want = reference(act, c);
  /* fp32 sums over k terms of products in [-1, 1], in another order than the reference's */
  float atol = 1e-6f * (float)c->k + 1e-5f;
  tu_assert_close(got, want, count, 1e-4f, atol, what);
  tu_assert_close(got, host, count, 1e-4f, atol, what);
  if (must_run_lt && !used) fail_msg("%s: ran the plain path, not cuBLASLt", what);
  *ran += used;
  (*calls)++;
  free(got), free(host), free(want);
}

static void test_against_reference(void **state) {
  (void)state;
  NEED_CUDA();
  static const lt_case cases[] = {
      {32, 64, 64, 0}, {1, 64, 64, 0}, {64, 128, 4096, 0}, {1, 1, 1, 0},     {5, 3, 17, 0},
      {7, 9, 13, 0},   {1, 7, 13, 0},  {33, 31, 29, 0},    {3, 5, 4099, 0},  {129, 65, 33, 0},
      {32, 64, 64, 1}, {7, 9, 13, 1},  {1, 64, 64, 1},     {16, 32, 1000, 1}};
  for (int d = 0; d < cuda_count; d++) {
    int ran = 0, calls = 0;
    for (int act = CLPAR_ACT_NONE; act <= CLPAR_ACT_RELU; act++)
      for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const lt_case *c = &cases[i];
        /* cuBLASLt has fp32 kernels for these: 16-byte aligned rows and operands */
        int aligned = c->off == 0 && c->n % 4 == 0 && c->k % 4 == 0;
        check_case(cuda_devs[d], (clpar_act_kind)act, c, aligned, &ran, &calls);
      }
    fprintf(stderr, "test_cuda_lt: %s ran %d of %d calls through cuBLASLt\n",
            clpar_device_id(cuda_devs[d]), ran, calls);
  }
}

/* Sigmoid and tanh have no cuBLASLt epilogue, and a Linear without a bias none to fuse: the
 * plain path, with the same results as the reference. */
static void test_plain_path_cases(void **state) {
  (void)state;
  NEED_CUDA();
  clpar_device *dev = cuda_devs[0];
  int64_t xs[2] = {4, 8}, ws[2] = {8, 8}, n = 8;
  clpar_tensor *x = tu_make(dev, 2, xs, 71), *w = tu_make(dev, 2, ws, 72);
  clpar_tensor *b = tu_make(dev, 1, &n, 73), *y;
  tu_ok(clpar_tensor_empty(dev, 2, xs, &y));
  clpar_bref none = {NULL, 0};
  uint64_t before = lt_runs(dev);
  tu_ok(clpar_dev_linear_act(dev, CLPAR_ACT_SIGMOID, 4, 8, 8, clpar_tensor_bref(x),
                             clpar_tensor_bref(w), clpar_tensor_bref(b), clpar_tensor_bref(y)));
  tu_ok(clpar_dev_linear_act(dev, CLPAR_ACT_RELU, 4, 8, 8, clpar_tensor_bref(x),
                             clpar_tensor_bref(w), none, clpar_tensor_bref(y)));
  tu_ok(clpar_device_synchronize(dev));
  assert_int_equal(lt_runs(dev), before);
  clpar_tensor_free(x), clpar_tensor_free(w), clpar_tensor_free(b), clpar_tensor_free(y);
}

/* ---- a captured step ---- */

enum { STEPS = 8 };

static clpar_status train_step(void *ctx) {
  tgu_train *t = ctx;
  clpar_scope *scope = tgu_step_begin(t);
  clpar_status s = tgu_forward_backward(t, tgu_mse);
  if (s == CLPAR_OK) s = clpar_optimizer_step(t->opt);
  tgu_step_end(t, scope);
  return s;
}

/* STEPS steps of an MLP (Linear + ReLU twice, then a Linear; widths that are multiples of 4
 * but not all of 16, so that cuBLASLt has algorithms for them, and an odd batch), eagerly or
 * through clpar_step_run; the losses into losses, the parameters returned (*n floats). */
static float *train(clpar_device *dev, int compiled, float *losses, size_t *n) {
  static const int64_t widths[4] = {12, 36, 28, 8};
  return tgu_mlp_run(dev, widths, 7, STEPS, train_step, compiled, losses, n);
}

static void test_captured_step_bits(void **state) {
  (void)state;
  NEED_CUDA();
  clpar_device *dev = cuda_devs[0];
  float le[STEPS], lr[STEPS];
  size_t ne, nr;
  uint64_t before = lt_runs(dev);
  float *pe = train(dev, 0, le, &ne);
  uint64_t mid = lt_runs(dev);
  float *pr = train(dev, 1, lr, &nr);
  /* 3 Linear layers with a bias forward per step, on both runs */
  assert_true(mid - before >= 3 * STEPS);
  assert_true(lt_runs(dev) - mid >= 3 * STEPS);
  tgu_expect_bits("loss", le, lr, STEPS);
  assert_int_equal(ne, nr);
  tgu_expect_bits("parameter", pe, pr, ne);
  free(pe), free(pr);
}

/* ---- the variable ---- */

/* Runs one Linear + ReLU forward on each CUDA device; 1 when any went through cuBLASLt. */
static int any_lt_run(void) {
  find_devices();
  int any = 0;
  for (int d = 0; d < cuda_count; d++) {
    lt_case c = {8, 16, 16, 0};
    uint64_t before = lt_runs(cuda_devs[d]);
    free(run_entry(cuda_devs[d], CLPAR_ACT_RELU, &c));
    any |= lt_runs(cuda_devs[d]) > before;
  }
  return any;
}

static void test_env(void **state) {
  (void)state;
  const char *bad[] = {"banana", "2", "", "yes", "1 ", "01", "true"};
  clpar_shutdown();
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("CLPAR_CUDA_LT", bad[i], 1);
    assert_int_equal(clpar_init(), CLPAR_ERROR_INVALID_ARGUMENT);
    if (!strstr(clpar_last_error(), "CLPAR_CUDA_LT"))
      fail_msg("CLPAR_CUDA_LT=\"%s\": %s", bad[i], clpar_last_error());
  }
  setenv("CLPAR_CUDA_LT", "0", 1);
  tu_ok(clpar_init());
  assert_false(any_lt_run());
  clpar_shutdown();
  unsetenv("CLPAR_CUDA_LT"); /* unset is the default: the plain path */
  tu_ok(clpar_init());
  assert_false(any_lt_run());
  clpar_shutdown();
  setenv("CLPAR_CUDA_LT", "1", 1);
  tu_ok(clpar_init());
  int any = any_lt_run(); /* finds the devices again */
  assert_int_equal(any, cuda_count > 0);
}

static int group_setup(void **state) {
  int rc = tu_setup(state);
  if (rc == 0) find_devices();
  return rc;
}

int main(void) {
  setenv("CLPAR_CUDA_LT", "1", 1); /* opt-in; these tests are about it */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_against_reference),
      cmocka_unit_test(test_plain_path_cases),
      cmocka_unit_test(test_captured_step_bits),
      cmocka_unit_test(test_env),
  };
  return cmocka_run_group_tests(tests, group_setup, tu_teardown);
}
