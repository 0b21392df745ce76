/* test_graph_fuse.c — element-wise chains fused at capture end (src/runtime/capture_fuse.c,
 * backend.h's ew_chain): a step full of chains (a residual x + relu(x) * 0.5, sigmoid, tanh,
 * mul, add, GELU, pow, exp, and their gradients) replayed with fusion equals the eager step bit
 * for bit over 20 steps, and so does the replay with fusion off; on OpenCL the fused graph has
 * fewer commands, on the host as many. Runs that would change results are not fused: an op
 * reading an earlier op's output at another offset, writing what an earlier op read at another
 * offset, a broadcast row. The chains as built for compilers that contract across statements
 * give the same bits too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* clpar_tensor_unscope, the runtime's commands */
#include "opencl/ocl_internal.h"
#include "test_util.h"

enum { STEPS = 20 };

typedef struct {
  clpar_device *dev;
  clpar_module *lin1, *lin2, *all;
  clpar_optimizer *opt;
  clpar_tensor *x, *y, *loss;
} run;

static clpar_device_info info_of(const clpar_device *dev) {
  clpar_device_info info;
  tu_ok(clpar_device_get_info(dev, &info));
  return info;
}

static int is_backend(const clpar_device *dev, const char *name) {
  return strcmp(info_of(dev).backend, name) == 0;
}

static void run_make(run *r, clpar_device *dev) {
  memset(r, 0, sizeof *r);
  r->dev = dev;
  clpar_manual_seed(11);
  tu_ok(clpar_linear_create(8, 16, 1, dev, &r->lin1));
  tu_ok(clpar_linear_create(16, 4, 1, dev, &r->lin2));
  clpar_module *c[2] = {r->lin1, r->lin2};
  tu_ok(clpar_sequential_create(c, 2, &r->all));
  tu_ok(clpar_sgd_create_for(r->all, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &r->opt));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){6, 8}, &r->x));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){6, 4}, &r->y));
}

static void run_free(run *r) {
  clpar_tensor_free(r->loss);
  clpar_tensor_free(r->x);
  clpar_tensor_free(r->y);
  clpar_optimizer_free(r->opt);
  clpar_module_free(r->all);
}

/* h = lin1(x); u = h + relu(h) * 0.5; z = sigmoid(u) * tanh(u) + u;
 * out = lin2(gelu(z) + exp(-pow(z, 2)) * 0.25); MSE. */
static clpar_status forward_loss(run *r) {
  clpar_tensor *t[14] = {0};
  clpar_status s = clpar_module_forward(r->lin1, r->x, &t[0]);
  if (s == CLPAR_OK) s = clpar_relu(t[0], &t[1]);
  if (s == CLPAR_OK) s = clpar_scale(t[1], 0.5f, &t[2]);
  if (s == CLPAR_OK) s = clpar_add(t[0], t[2], &t[3]);
  if (s == CLPAR_OK) s = clpar_sigmoid(t[3], &t[4]);
  if (s == CLPAR_OK) s = clpar_tanh(t[3], &t[5]);
  if (s == CLPAR_OK) s = clpar_mul(t[4], t[5], &t[6]);
  if (s == CLPAR_OK) s = clpar_add(t[6], t[3], &t[7]);
  if (s == CLPAR_OK) s = clpar_gelu(t[7], CLPAR_GELU_TANH, &t[8]);
  if (s == CLPAR_OK) s = clpar_pow(t[7], 2.0f, &t[9]);
  if (s == CLPAR_OK) s = clpar_scale(t[9], -1.0f, &t[10]);
  if (s == CLPAR_OK) s = clpar_exp(t[10], &t[11]);
  if (s == CLPAR_OK) s = clpar_scale(t[11], 0.25f, &t[12]);
  if (s == CLPAR_OK) s = clpar_add(t[8], t[12], &t[13]);
  clpar_tensor *out = NULL;
  if (s == CLPAR_OK) s = clpar_module_forward(r->lin2, t[13], &out);
  if (s == CLPAR_OK) s = clpar_mse_loss(out, r->y, CLPAR_REDUCTION_MEAN, &r->loss);
  clpar_tensor_free(out);
  for (int i = 0; i < 14; i++) clpar_tensor_free(t[i]);
  return s;
}

static clpar_status step(void *ctx) {
  run *r = ctx;
  clpar_tensor_free(r->loss);
  r->loss = NULL;
  clpar_scope *scope = clpar_scope_begin();
  clpar_status s = clpar_optimizer_zero_grad(r->opt);
  if (s == CLPAR_OK) s = forward_loss(r);
  if (s == CLPAR_OK) s = clpar_backward(r->loss);
  if (s == CLPAR_OK) s = clpar_optimizer_step(r->opt);
  if (r->loss) clpar_tensor_unscope(r->loss);
  clpar_scope_end(scope);
  return s;
}

/* Two models, one per device, stepped together (one graph over both devices). */
typedef struct {
  run *runs;
  int n;
} pair;

static clpar_status step_all(void *ctx) {
  pair *p = ctx;
  clpar_status s = CLPAR_OK;
  for (int i = 0; i < p->n && s == CLPAR_OK; i++) s = step(&p->runs[i]);
  return s;
}

static void write_inputs(run *r, int i) {
  float *x = tu_rand(48, 100 + (uint64_t)i), *y = tu_rand(24, 300 + (uint64_t)i);
  tu_ok(clpar_tensor_write(r->x, x, 48));
  tu_ok(clpar_tensor_write(r->y, y, 24));
  free(x);
  free(y);
}

/* Trains STEPS steps of the models in runs (eagerly, or compiled: warm-up, capture, replays),
 * the losses into losses[run][step]; returns the graph's command count. */
static size_t train(run *runs, int n, int compiled, float losses[][STEPS]) {
  pair p = {runs, n};
  clpar_device *devs[2] = {runs[0].dev, n > 1 ? runs[1].dev : NULL};
  clpar_step *st = NULL;
  if (compiled) tu_ok(clpar_step_compile(step_all, &p, devs, n, &st));
  for (int i = 0; i < STEPS; i++) {
    for (int k = 0; k < n; k++) write_inputs(&runs[k], i);
    if (compiled)
      tu_ok(clpar_step_run(st));
    else
      tu_ok(step_all(&p));
    for (int k = 0; k < n; k++) tu_ok(clpar_tensor_read(runs[k].loss, &losses[k][i], 1));
  }
  size_t count = st ? clpar_graph_command_count(clpar_step_graph(st)) : 0;
  clpar_step_free(st);
  return count;
}

static void expect_same(run *a, run *b, float la[STEPS], float lb[STEPS], const char *what) {
  for (int i = 0; i < STEPS; i++)
    if (memcmp(&la[i], &lb[i], sizeof la[i]) != 0)
      fail_msg("%s: step %d: loss %.9g, eager %.9g", what, i, (double)lb[i], (double)la[i]);
  assert_true(la[0] != la[STEPS - 1]); /* it trained */
  size_t n = 16 * 8 + 16 + 4 * 16 + 4;
  float *pa = tu_read_params(a->all, n), *pb = tu_read_params(b->all, n);
  for (size_t i = 0; i < n; i++)
    if (memcmp(&pa[i], &pb[i], sizeof pa[i]) != 0)
      fail_msg("%s: parameter %zu: %.9g, eager %.9g", what, i, (double)pb[i], (double)pa[i]);
  free(pa);
  free(pb);
}

/* Eager, replayed with fusion and replayed without, on devs[0 .. n): the same bits; the fused
 * graph smaller where every device is OpenCL, the same size where none fuses. */
static void check(clpar_device **devs, int n) {
  run eager[2], fused[2], plain[2];
  float le[2][STEPS], lf[2][STEPS], lp[2][STEPS];
  for (int k = 0; k < n; k++) run_make(&eager[k], devs[k]);
  train(eager, n, 0, le);
  for (int k = 0; k < n; k++) run_make(&fused[k], devs[k]);
  size_t with = train(fused, n, 1, lf);
  clpar_capture_fuse_disable(1);
  for (int k = 0; k < n; k++) run_make(&plain[k], devs[k]);
  size_t without = train(plain, n, 1, lp);
  clpar_capture_fuse_disable(0);
  int opencl = 1;
  for (int k = 0; k < n; k++) {
    expect_same(&eager[k], &fused[k], le[k], lf[k], "fused");
    expect_same(&eager[k], &plain[k], le[k], lp[k], "not fused");
    opencl &= is_backend(devs[k], "opencl");
  }
  print_message("%s x %d: %zu commands fused, %zu not\n", info_of(devs[0]).id, n, with, without);
  if (opencl)
    assert_true(with < without);
  else if (is_backend(devs[0], "host") && n == 1)
    assert_int_equal(with, without);
  for (int k = 0; k < n; k++) {
    run_free(&eager[k]);
    run_free(&fused[k]);
    run_free(&plain[k]);
  }
}

static void test_chains_bitwise(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    check(&dev, 1);
  }
}

/* The chains as built for a compiler that contracts across statements (NVIDIA's: each op's
 * result through a volatile variable, ocl_fuse.c), on every OpenCL device: the same bits. */
static void test_chains_bitwise_volatile(void **state) {
  (void)state;
  int ran = 0;
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    if (!is_backend(dev, "opencl")) continue;
    clpar_ocl_device *o = dev->bd.ctx;
    tu_ok(clpar_device_synchronize(dev));
    o->contracts_across = 2;
    check(&dev, 1);
    o->contracts_across = 0; /* probed again at the next chain */
    ran++;
  }
  if (!ran) skip();
}

static void test_chains_two_devices(void **state) {
  (void)state;
  clpar_device *devs[2] = {clpar_device_get(0), NULL};
  devs[1] = tu_second_device(devs[0]); /* the host device where only one is selected */
  if (!devs[1]) skip();
  check(devs, 2);
}

/* ---- what is not fused ---- */

static clpar_command unary_cmd(void *a, size_t aoff, void *out, size_t ooff, size_t n) {
  clpar_command c = {.op = CLPAR_ENTRY_unary};
  c.u.unary = (clpar_args_unary){0, CLPAR_UNARY_RELU, n, {a, aoff}, {out, ooff}};
  return c;
}

static clpar_command add_cmd(void *a, size_t aoff, void *b, size_t boff, size_t b_rows, void *out,
                             size_t ooff, size_t rows, size_t cols) {
  clpar_command c = {.op = CLPAR_ENTRY_binary};
  c.u.binary = (clpar_args_binary){0,         CLPAR_BINARY_ADD, rows,   cols,
                                   {a, aoff}, {b, boff},        b_rows, {out, ooff}};
  return c;
}

/* How many commands clpar_capture_fuse leaves of cmds (buffers are never touched: the chain's
 * kernel is only built). */
static size_t fused_count(clpar_device *dev, clpar_command *cmds, size_t n) {
  size_t *map = NULL;
  clpar_fused *f = NULL;
  clpar_capture_fuse(dev, cmds, &n, &map, &f);
  free(map);
  clpar_capture_fused_free(f);
  return n;
}

static void test_not_fused(void **state) {
  (void)state;
  clpar_device *dev = NULL;
  for (int d = 0; d < clpar_device_count() && !dev; d++)
    if (is_backend(clpar_device_get(d), "opencl")) dev = clpar_device_get(d);
  if (!dev) skip();
  char A, B, C; /* stand-ins for buffers */
  /* fused: relu A -> B, then B + C -> C at the same offsets */
  clpar_command ok[2] = {unary_cmd(&A, 0, &B, 0, 64), add_cmd(&B, 0, &C, 0, 4, &C, 0, 4, 16)};
  assert_int_equal(fused_count(dev, ok, 2), 1);
  assert_int_equal(ok[0].op, CLPAR_ENTRY_ew_chain);
  /* reads B at another offset than the relu wrote it */
  clpar_command rd[2] = {unary_cmd(&A, 0, &B, 0, 64), add_cmd(&B, 16, &C, 0, 4, &C, 0, 4, 16)};
  assert_int_equal(fused_count(dev, rd, 2), 2);
  /* writes A at another offset than the relu read it */
  clpar_command wr[2] = {unary_cmd(&A, 0, &B, 0, 64), add_cmd(&C, 0, &C, 0, 4, &A, 8, 4, 16)};
  assert_int_equal(fused_count(dev, wr, 2), 2);
  /* other offsets that do not overlap: fused */
  clpar_command far[2] = {unary_cmd(&A, 0, &B, 0, 64), add_cmd(&C, 0, &C, 0, 4, &A, 64, 4, 16)};
  assert_int_equal(fused_count(dev, far, 2), 1);
  /* a broadcast row */
  clpar_command bc[2] = {unary_cmd(&A, 0, &B, 0, 64), add_cmd(&B, 0, &C, 0, 1, &B, 0, 4, 16)};
  assert_int_equal(fused_count(dev, bc, 2), 2);
  /* another element count */
  clpar_command cnt[2] = {unary_cmd(&A, 0, &B, 0, 64), unary_cmd(&B, 0, &C, 0, 32)};
  assert_int_equal(fused_count(dev, cnt, 2), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chains_bitwise),
      cmocka_unit_test(test_chains_bitwise_volatile),
      cmocka_unit_test(test_chains_two_devices),
      cmocka_unit_test(test_not_fused),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
