/* test_autocast_gemm.c — autocast's GEMMs on 16-bit operands through the devices' gemm_half
 * entry (backends/backend_half.h, src/autocast_gemm.c):
 * - on the host backend (the reference: the core's conversions, then its SGEMM) a Linear
 *   (bias and ReLU, or neither) and a matmul (every transpose pair) under bfloat16 and float16
 *   autocast, forward and backward, give the same bits with the entry and with it forced off
 *   (clpar_compose_force: the operands widened to float32 tensors, then gemm), and the entry
 *   ran once per GEMM on two 16-bit operands (and not at all when forced off): the forward's,
 *   and backward's on the 16-bit incoming gradient (matmul's, and Linear's without an
 *   activation); odd sizes, m = 1, 16-bit inputs that are views at an odd word offset with
 *   rows starting at odd elements (with and without gradients), NaN and Inf in the inputs;
 * - matmul's and Linear's backward from clpar_backward's seed of a one-element bfloat16 result
 *   (ones of its dtype), and from clpar_backward_grad's gradient of float32, of float16 (both
 *   converted to the root's bfloat16, as PyTorch's engine does) or of bfloat16 (a view at an
 *   odd word offset), take the entry: the same bits either way on the host;
 * - on every selected device: the same, bit for bit where the device lacks the entry (OpenCL:
 *   both ways widen) or is the host; a CUDA device with CLPAR_CUDA_HALF_GEMM=1 runs cublasGemmEx
 *   (float32 sums in another order): within a tolerance of the widened path and the host;
 * - an MLP's training steps under bfloat16 autocast, eager and through clpar_step_run
 *   (captured, replayed), the same losses and parameters bit for bit on each selected device
 *   that has the entry;
 * - CLPAR_CUDA_HALF_GEMM, read at clpar_init by the CUDA backend: "0" and "1" only, anything
 *   else an error naming it (runs without a GPU; only in a build with the CUDA backend); unset
 *   or "0" leaves CUDA devices without the entry. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_graph_util.h"

/* backends/host/host_half.c: the host backend's gemm_half calls that ran. */
uint64_t clpar_host_gemm_half_runs(void);

#define GEMM_HALF_BIT ((uint64_t)1 << CLPAR_ENTRY_gemm_half)

static uint64_t composed_calls(const clpar_device *dev) {
  return __atomic_load_n(&dev->composed_calls, __ATOMIC_RELAXED);
}

static int is_backend(const clpar_device *dev, const char *name) {
  return strcmp(dev->bd.iface->name, name) == 0;
}

/* Whether dev runs gemm_half itself (unless forced off). */
static int has_entry(const clpar_device *dev) {
  return !clpar_entry_set(dev->natural, CLPAR_ENTRY_gemm_half);
}

/* ---- one case: a Linear or a matmul under autocast, forward and backward ---- */

typedef struct {
  int linear; /* 1: clpar_linear_act (x [m, k], w [n, k]); 0: clpar_matmul(a, b, ta, tb) */
  int64_t m, n, k;
  int ta, tb, bias, relu;
  int view;     /* a and b 16-bit views, a at row 2 of a taller tensor (odd word offset):
                 * 1 without gradients, 2 with */
  int specials; /* NaN, Inf and -Inf among a's elements */
} gcase;

typedef struct {
  float *out, *ga, *gb, *gbias; /* malloc'ed */
  size_t n_out, n_a, n_b, n_bias;
} gresult;

static void result_free(gresult *r) {
  free(r->out), free(r->ga), free(r->gb), free(r->gbias);
}

/* An operand of rows x cols on dev from seed (with NaN, Inf, -Inf at 1, 2, 3 when specials):
 * a float32 leaf that requires a gradient (*leaf), or with view rows 2 .. of a dt tensor
 * taller by 2 rows: a 16-bit view at word offset cols (odd for odd cols), its rows starting at
 * odd elements: view 1 of a dt tensor without a gradient (*leaf NULL), view 2 of the dt copy
 * (clpar_to_dtype) of a float32 leaf that requires one (*leaf). */
static clpar_tensor *operand(clpar_device *dev, clpar_dtype dt, int64_t rows, int64_t cols,
                             uint64_t seed, int view, int specials, clpar_tensor **leaf) {
  int64_t extra = view ? 2 : 0, shape[2] = {rows + extra, cols};
  size_t n = (size_t)(shape[0] * cols);
  float *v = tu_rand(n, seed);
  if (specials) v[extra * cols + 1] = NAN, v[extra * cols + 2] = INFINITY;
  if (specials && n > (size_t)(extra * cols + 3)) v[extra * cols + 3] = -INFINITY;
  clpar_tensor *t, *h, *r;
  tu_ok(clpar_tensor_from_floats(dev, view == 1 ? dt : CLPAR_FLOAT32, 2, shape, v, &t));
  free(v);
  *leaf = view == 1 ? NULL : t;
  if (view != 1) tu_ok(clpar_tensor_set_requires_grad(t, 1));
  if (!view) return t;
  h = t;
  if (view == 2) tu_ok(clpar_to_dtype(t, dt, &h));
  tu_ok(clpar_tensor_rows(h, extra, rows, &r));
  assert_int_equal((int64_t)r->offset, cols);
  return r;
}

static float *grad_of(const clpar_tensor *leaf, size_t *n) {
  *n = leaf ? (size_t)clpar_tensor_numel(leaf) : 0;
  if (!leaf) return NULL;
  const clpar_tensor *g = clpar_tensor_grad(leaf);
  assert_non_null(g);
  float *f = malloc(*n * sizeof *f);
  assert_non_null(f);
  tu_ok(clpar_tensor_read_floats(g, f, *n));
  return f;
}

/* The case on dev under dt autocast; loss = sum(float(out) * w) for a fixed w. */
static void run_case(clpar_device *dev, clpar_dtype dt, const gcase *c, gresult *r) {
  clpar_scope *sc = clpar_scope_begin();
  int64_t ar = c->linear || !c->ta ? c->m : c->k, ac = c->linear || !c->ta ? c->k : c->m;
  int64_t br = c->linear ? c->n : c->tb ? c->n : c->k, bc = c->linear || c->tb ? c->k : c->n;
  clpar_tensor *la, *lb, *lbias = NULL, *y, *y32, *p, *loss;
  clpar_tensor *a = operand(dev, dt, ar, ac, 31, c->view, c->specials, &la);
  clpar_tensor *b = operand(dev, dt, br, bc, 32, c->view, 0, &lb);
  if (c->bias) lbias = operand(dev, dt, 1, c->n, 33, 0, 0, &lbias);
  int64_t ys[2] = {c->m, c->n};
  clpar_tensor *w = tu_make(dev, 2, ys, 34);
  tu_ok(clpar_tensor_set_requires_grad(w, 1)); /* a backward even where a and b are views */
  tu_ok(clpar_autocast_begin(dt));
  if (c->linear) {
    clpar_tensor *bias1 = NULL;
    if (lbias) tu_ok(clpar_tensor_reshape(lbias, 1, &c->n, &bias1));
    tu_ok(clpar_linear_act(a, b, bias1, c->relu ? CLPAR_ACT_RELU : CLPAR_ACT_NONE, &y));
  } else {
    tu_ok(clpar_matmul(a, b, c->ta, c->tb, &y));
  }
  clpar_autocast_end();
  assert_int_equal(clpar_tensor_dtype(y), dt);
  tu_ok(clpar_to_dtype(y, CLPAR_FLOAT32, &y32));
  tu_ok(clpar_mul(y32, w, &p));
  tu_ok(clpar_sum(p, &loss));
  tu_ok(clpar_backward(loss));
  r->n_out = (size_t)(c->m * c->n);
  r->out = tu_read(y32);
  r->ga = grad_of(la, &r->n_a);
  r->gb = grad_of(lb, &r->n_b);
  r->gbias = grad_of(lbias, &r->n_bias);
  clpar_scope_end(sc);
}

static void expect_bits(const char *what, const char *part, const float *x, const float *y,
                        size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&x[i], &y[i], sizeof x[i]) != 0)
      fail_msg("%s: %s[%zu] %.9g with gemm_half, %.9g widened", what, part, i, (double)x[i],
               (double)y[i]);
}

static void expect_same(const char *what, const gresult *x, const gresult *y) {
  expect_bits(what, "out", x->out, y->out, x->n_out);
  expect_bits(what, "grad a", x->ga, y->ga, x->n_a);
  expect_bits(what, "grad b", x->gb, y->gb, x->n_b);
  expect_bits(what, "grad bias", x->gbias, y->gbias, x->n_bias);
}

/* Finite values within a tolerance (float32 sums of k products in another order), the
 * non-finite ones the same class. */
static void expect_close(const char *what, const char *part, const float *x, const float *y,
                         size_t n, int64_t k) {
  float atol = 2e-6f * (float)k + 1e-5f;
  for (size_t i = 0; i < n; i++) {
    if (isnan(x[i]) || isnan(y[i]) || isinf(x[i]) || isinf(y[i])) {
      if (!(isnan(x[i]) && isnan(y[i])) && x[i] != y[i])
        fail_msg("%s: %s[%zu] %g, widened %g", what, part, i, (double)x[i], (double)y[i]);
      continue;
    }
    if (fabsf(x[i] - y[i]) > atol + 1e-2f * fabsf(y[i]))
      fail_msg("%s: %s[%zu] %.9g, widened %.9g", what, part, i, (double)x[i], (double)y[i]);
  }
}

/* The GEMMs on two 16-bit operands in a case: the forward's, and where a and b want
 * gradients, backward's two on the 16-bit incoming gradient (the loss widens the result with
 * clpar_to_dtype, whose backward narrows): matmul's, and Linear's without an activation (with
 * one, backward multiplies the float32 gradient through it). */
static uint64_t half_gemms(const gcase *c) {
  return 1 + (c->view != 1 && (!c->linear || !c->relu) ? 2 : 0);
}

static const gcase cases[] = {
    {1, 7, 5, 13, 0, 0, 1, 1, 0, 0}, {1, 7, 5, 13, 0, 0, 0, 0, 0, 0},
    {1, 1, 9, 3, 0, 0, 1, 0, 0, 0},  {1, 5, 3, 7, 0, 0, 1, 1, 1, 0},
    {1, 4, 6, 5, 0, 0, 1, 0, 0, 1},  {1, 33, 17, 65, 0, 0, 1, 1, 0, 0},
    {0, 3, 4, 5, 0, 0, 0, 0, 0, 0},  {0, 3, 4, 5, 1, 0, 0, 0, 0, 0},
    {0, 3, 4, 5, 0, 1, 0, 0, 0, 0},  {0, 3, 4, 5, 1, 1, 0, 0, 0, 0},
    {0, 1, 7, 9, 0, 1, 0, 0, 0, 0},  {0, 5, 1, 3, 1, 0, 0, 0, 1, 0},
    {0, 6, 5, 7, 0, 0, 0, 0, 1, 1},  {0, 17, 19, 23, 1, 1, 0, 0, 1, 0},
    {0, 5, 7, 3, 0, 0, 0, 0, 2, 0},  {0, 9, 3, 5, 1, 0, 0, 0, 2, 0},
    {0, 3, 5, 7, 0, 1, 0, 0, 2, 1},  {0, 7, 9, 11, 1, 1, 0, 0, 2, 0},
    {1, 5, 3, 7, 0, 0, 1, 0, 2, 0},  {1, 3, 7, 5, 0, 0, 0, 1, 2, 1},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

static void describe(char *buf, size_t size, const clpar_device *dev, clpar_dtype dt,
                     const gcase *c) {
  snprintf(buf, size, "%s %s %s [%lld x %lld x %lld] ta %d tb %d%s%s%s%s", clpar_device_id(dev),
           clpar_dtype_name(dt), c->linear ? "linear" : "matmul", (long long)c->m, (long long)c->n,
           (long long)c->k, c->ta, c->tb, c->bias ? " bias" : "", c->relu ? " relu" : "",
           c->view == 2 ? " views with gradients"
           : c->view    ? " views"
                        : "",
           c->specials ? " NaN/Inf" : "");
}

/* Every case and dtype on dev with the entry and forced off; exact: bit for bit. */
static void check_device(clpar_device *dev, int exact) {
  char what[200];
  for (int d = 0; d < 2; d++) {
    clpar_dtype dt = d ? CLPAR_FLOAT16 : CLPAR_BFLOAT16;
    for (int i = 0; i < N_CASES; i++) {
      const gcase *c = &cases[i];
      describe(what, sizeof what, dev, dt, c);
      gresult r[2];
      uint64_t calls[2], runs[2];
      for (int forced = 0; forced < 2; forced++) {
        tu_ok(clpar_compose_force(dev, forced ? GEMM_HALF_BIT : 0));
        uint64_t c0 = composed_calls(dev), r0 = clpar_host_gemm_half_runs();
        run_case(dev, dt, c, &r[forced]);
        tu_ok(clpar_device_synchronize(dev));
        calls[forced] = composed_calls(dev) - c0;
        runs[forced] = clpar_host_gemm_half_runs() - r0;
      }
      tu_ok(clpar_compose_force(dev, 0));
      /* half_gemms(c) per case, composed when forced off or without the entry (other fused
       * entries a backend lacks count the same both ways) */
      uint64_t want = half_gemms(c);
      if (calls[1] - calls[0] != want * (uint64_t)has_entry(dev) ||
          (is_backend(dev, "host") && (calls[0] != 0 || runs[0] != want || runs[1] != 0)))
        fail_msg(
            "%s: composed %llu, %llu forced off; the host's entry ran %llu (%llu wanted), "
            "%llu forced off",
            what, (unsigned long long)calls[0], (unsigned long long)calls[1],
            (unsigned long long)runs[0], (unsigned long long)want, (unsigned long long)runs[1]);
      if (exact) {
        expect_same(what, &r[0], &r[1]);
      } else { /* float32 sums in the backend's order, backward's GEMMs' too */
        gresult h;
        int64_t most = c->m > c->n ? (c->m > c->k ? c->m : c->k) : (c->n > c->k ? c->n : c->k);
        run_case(tu_host(), dt, c, &h);
        expect_close(what, "out", r[0].out, r[1].out, r[0].n_out, c->k);
        expect_close(what, "out", r[0].out, h.out, r[0].n_out, c->k);
        if (!c->relu) { /* ReLU's mask reads the forward's output */
          expect_close(what, "grad a", r[0].ga, r[1].ga, r[0].n_a, most);
          expect_close(what, "grad b", r[0].gb, r[1].gb, r[0].n_b, most);
          expect_bits(what, "grad bias", r[0].gbias, r[1].gbias, r[0].n_bias);
        }
        result_free(&h);
      }
      result_free(&r[0]), result_free(&r[1]);
    }
  }
}

static void test_host_reference(void **state) {
  (void)state;
  clpar_device *host = tu_host();
  assert_true(is_backend(host, "host"));
  assert_true(has_entry(host));
  check_device(host, 1);
}

static void test_every_device(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    int exact = is_backend(dev, "host") || !has_entry(dev);
    printf("# %s (%s): gemm_half %s\n", clpar_device_id(dev), dev->bd.iface->name,
           has_entry(dev) ? "run by the backend" : "composed (operands widened)");
    check_device(dev, exact);
  }
}

/* ---- backward from gradients of other dtypes, and at an odd offset ---- */

/* The incoming gradient in test_backward_grads: clpar_backward's seed of a [1, 1] result, or
 * clpar_backward_grad's of a float32 tensor, of a bfloat16 view at an odd word offset, of a
 * float16 view. */
enum { G_SEED, G_FLOAT32, G_HALF_VIEW, G_OTHER_HALF, G_KINDS };

/* Under bfloat16 autocast on the host, y = a b^T (a [m, 7], b [n, 7] float32 leaves) by
 * clpar_matmul or (linear) clpar_linear, then backward from a gradient of the kind; the
 * gradients of a and b into r. */
static void run_grad_kind(int linear, int kind, gresult *r) {
  clpar_device *dev = tu_host();
  clpar_scope *sc = clpar_scope_begin();
  int64_t m = kind == G_SEED ? 1 : 5, n = kind == G_SEED ? 1 : 3, gs[2] = {m, n};
  clpar_tensor *la, *lb, *lg, *y;
  operand(dev, CLPAR_BFLOAT16, m, 7, 41, 0, 0, &la);
  operand(dev, CLPAR_BFLOAT16, n, 7, 42, 0, 0, &lb);
  tu_ok(clpar_autocast_begin(CLPAR_BFLOAT16));
  tu_ok(linear ? clpar_linear(la, lb, NULL, &y) : clpar_matmul(la, lb, 0, 1, &y));
  clpar_autocast_end();
  if (kind == G_SEED) {
    tu_ok(clpar_backward(y));
  } else if (kind == G_FLOAT32) {
    tu_ok(clpar_backward_grad(y, tu_make(dev, 2, gs, 43)));
  } else {
    clpar_dtype gdt = kind == G_HALF_VIEW ? CLPAR_BFLOAT16 : CLPAR_FLOAT16;
    clpar_tensor *g = operand(dev, gdt, m, n, 43, 1, 0, &lg);
    assert_true(g->offset % 2 == 1);
    tu_ok(clpar_backward_grad(y, g));
  }
  memset(r, 0, sizeof *r);
  r->ga = grad_of(la, &r->n_a);
  r->gb = grad_of(lb, &r->n_b);
  clpar_scope_end(sc);
}

/* Backward's GEMMs take the entry from every kind: the seed is of the result's dtype and a
 * gradient of another dtype is converted to it; on the host the widened path's bits either
 * way. */
static void test_backward_grads(void **state) {
  (void)state;
  static const char *name[G_KINDS] = {"seed", "float32 gradient", "bfloat16 gradient view",
                                      "float16 gradient"};
  static const uint64_t want[G_KINDS] = {3, 3, 3, 3}; /* forward, and backward's two */
  clpar_device *host = tu_host();
  char what[100];
  for (int linear = 0; linear < 2; linear++)
    for (int kind = 0; kind < G_KINDS; kind++) {
      gresult r[2];
      uint64_t runs[2];
      snprintf(what, sizeof what, "%s backward from a %s", linear ? "linear" : "matmul",
               name[kind]);
      for (int forced = 0; forced < 2; forced++) {
        tu_ok(clpar_compose_force(host, forced ? GEMM_HALF_BIT : 0));
        uint64_t r0 = clpar_host_gemm_half_runs();
        run_grad_kind(linear, kind, &r[forced]);
        runs[forced] = clpar_host_gemm_half_runs() - r0;
      }
      tu_ok(clpar_compose_force(host, 0));
      if (runs[0] != want[kind] || runs[1] != 0)
        fail_msg("%s: the host's entry ran %llu (%llu wanted), %llu forced off", what,
                 (unsigned long long)runs[0], (unsigned long long)want[kind],
                 (unsigned long long)runs[1]);
      expect_bits(what, "grad a", r[0].ga, r[1].ga, r[0].n_a);
      expect_bits(what, "grad b", r[0].gb, r[1].gb, r[0].n_b);
      result_free(&r[0]), result_free(&r[1]);
    }
}

/* ---- a captured step ---- */

enum { STEPS = 6 };

static clpar_status train_step(void *ctx) {
  tgu_train *t = ctx;
  clpar_scope *scope = tgu_step_begin(t);
  clpar_status s = clpar_autocast_begin(CLPAR_BFLOAT16);
  if (s == CLPAR_OK) {
    s = tgu_forward_backward(t, tgu_mse);
    clpar_autocast_end();
  }
  if (s == CLPAR_OK) s = clpar_optimizer_step(t->opt);
  tgu_step_end(t, scope);
  return s;
}

/* STEPS steps of an MLP (odd widths and batch) under bfloat16 autocast, eagerly or through
 * clpar_step_run; the losses into losses, the parameters returned (*n floats). */
static float *train(clpar_device *dev, int compiled, float *losses, size_t *n) {
  static const int64_t widths[4] = {13, 24, 17, 6};
  return tgu_mlp_run(dev, widths, 5, STEPS, train_step, compiled, losses, n);
}

static void test_captured_step_bits(void **state) {
  (void)state;
  int ran = 0;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    if (!has_entry(dev)) continue;
    float le[STEPS], lr[STEPS];
    size_t ne, nr;
    uint64_t c0 = composed_calls(dev);
    float *pe = train(dev, 0, le, &ne);
    float *pr = train(dev, 1, lr, &nr);
    assert_true(composed_calls(dev) == c0 || !is_backend(dev, "host"));
    tgu_expect_bits("loss", le, lr, STEPS);
    assert_int_equal(ne, nr);
    tgu_expect_bits("parameter", pe, pr, ne);
    free(pe), free(pr);
    ran++;
  }
  if (!ran) {
    fprintf(stderr, "test_autocast_gemm: no selected device has gemm_half (CLPAR_DEVICES=%s)\n",
            getenv("CLPAR_DEVICES") ? getenv("CLPAR_DEVICES") : "(unset)");
    skip();
  }
}

/* ---- the variable ---- */

#ifdef CLPAR_TEST_CUDA_BUILT
/* 1 when every CUDA device has gemm_half, 0 when none has; the count into *n. */
static int cuda_entries(int *n) {
  int yes = 0;
  *n = 0;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    if (!is_backend(dev, "cuda")) continue;
    (*n)++;
    yes += has_entry(dev);
  }
  assert_true(yes == 0 || yes == *n);
  return yes > 0;
}
#endif

static void test_env(void **state) {
  (void)state;
#ifndef CLPAR_TEST_CUDA_BUILT
  fprintf(stderr, "test_autocast_gemm: no CUDA backend in this build\n");
  skip();
#else
  const char *bad[] = {"banana", "2", "", "yes", "1 ", "01", "true"};
  const char *was = getenv("CLPAR_CUDA_HALF_GEMM");
  char *saved = was ? strdup(was) : NULL;
  int n;
  clpar_shutdown();
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("CLPAR_CUDA_HALF_GEMM", bad[i], 1);
    assert_int_equal(clpar_init(), CLPAR_ERROR_INVALID_ARGUMENT);
    if (!strstr(clpar_last_error(), "CLPAR_CUDA_HALF_GEMM"))
      fail_msg("CLPAR_CUDA_HALF_GEMM=\"%s\": %s", bad[i], clpar_last_error());
  }
  setenv("CLPAR_CUDA_HALF_GEMM", "0", 1);
  tu_ok(clpar_init());
  assert_false(cuda_entries(&n));
  clpar_shutdown();
  unsetenv("CLPAR_CUDA_HALF_GEMM"); /* unset is the default: widened operands */
  tu_ok(clpar_init());
  assert_false(cuda_entries(&n));
  clpar_shutdown();
  setenv("CLPAR_CUDA_HALF_GEMM", "1", 1);
  tu_ok(clpar_init());
  assert_int_equal(cuda_entries(&n), n > 0);
  fprintf(stderr, "test_autocast_gemm: %d CUDA devices checked\n", n);
  clpar_shutdown();
  if (saved)
    setenv("CLPAR_CUDA_HALF_GEMM", saved, 1);
  else
    unsetenv("CLPAR_CUDA_HALF_GEMM");
  free(saved);
  tu_ok(clpar_init());
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_reference),
      cmocka_unit_test(test_every_device),
      cmocka_unit_test(test_backward_grads),
      cmocka_unit_test(test_captured_step_bits),
      cmocka_unit_test(test_env),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
