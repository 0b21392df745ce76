/* test_opencl_peer.c — OpenCL devices in one shared context (CLPAR_OPENCL_CONTEXT=platform)
 * copy between each other directly (the backend's copy_peer), and in contexts of their own
 * (the default) through host staging. Run twice by ctest: test_opencl_peer with the variable
 * unset, test_opencl_peer_shared with CLPAR_OPENCL_CONTEXT=platform; each checks the mode it
 * finds. Every test needs two OpenCL devices of one platform (PoCL:
 * POCL_DEVICES="pthread pthread"), selected or, when fewer are selected, probed; it skips,
 * saying why, when the machine has fewer.
 *
 * Checked: the contexts (shared or not), peer_access, copies with odd offsets and sizes (one
 * above the 4 MiB staging chunk) into a destination still being written by its queue and
 * read by the destination's next op, that the copies took the peer path (the devices'
 * peer_copies counters) or the staging one, that posting them blocked no thread, and that
 * DataParallel and the model-parallel tutorial's ToyModel on the two devices train to the
 * one-device result. Last, an unknown CLPAR_OPENCL_CONTEXT makes clpar_init fail naming it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "opencl/ocl_internal.h"
#include "test_util.h"

static int shared_mode(void) {
  const char *v = getenv("CLPAR_OPENCL_CONTEXT");
  return v && strcmp(v, "platform") == 0;
}

static clpar_ocl_device *ocl(clpar_device *d) {
  return (clpar_ocl_device *)d->bd.ctx;
}

static int is_opencl(const clpar_device *d) {
  return strcmp(d->bd.info.backend, "opencl") == 0;
}

/* Two OpenCL devices of one platform: the first two selected, else selected and probed ones. */
static int pick_pair(clpar_device **a, clpar_device **b) {
  clpar_device *list[64];
  int n = 0;
  for (int i = 0; i < clpar_device_count() && n < 64; i++)
    if (is_opencl(clpar_device_get(i))) list[n++] = clpar_device_get(i);
  for (int i = 0; i < clpar_device_probed_count() && n < 64; i++) {
    clpar_device *d = clpar_device_probed(i);
    int seen = 0;
    for (int j = 0; j < n; j++) seen |= list[j] == d;
    if (!seen && is_opencl(d)) list[n++] = d;
  }
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (ocl(list[i])->platform == ocl(list[j])->platform) {
        *a = list[i];
        *b = list[j];
        return 1;
      }
  return 0;
}

static void need_pair(clpar_device **a, clpar_device **b) {
  if (!pick_pair(a, b)) {
    fprintf(stderr,
            "skipped: fewer than two OpenCL devices of one platform (PoCL: "
            "POCL_DEVICES=\"pthread pthread\")\n");
    skip();
  }
}

static clpar_device_counters counters(const clpar_device *d) {
  clpar_device_counters c;
  tu_ok(clpar_device_counters_get(d, &c));
  return c;
}

/* Shared or separate contexts as the variable says; peer_access says yes exactly then. */
static void test_contexts_follow_the_variable(void **state) {
  (void)state;
  clpar_device *a, *b;
  need_pair(&a, &b);
  int yes = -1;
  tu_ok(clpar_dev_peer_access(a, b->bd.ctx, &yes));
  if (shared_mode()) {
    assert_ptr_equal(ocl(a)->context, ocl(b)->context);
    assert_true(ocl(a)->shared_context && ocl(b)->shared_context);
    cl_uint ndev = 0, refs = 0;
    assert_int_equal(
        clGetContextInfo(ocl(a)->context, CL_CONTEXT_NUM_DEVICES, sizeof ndev, &ndev, NULL),
        CL_SUCCESS);
    assert_true(ndev >= 2);
    /* every device of the context holds a reference (CLBlast's caches may hold more) */
    assert_int_equal(
        clGetContextInfo(ocl(a)->context, CL_CONTEXT_REFERENCE_COUNT, sizeof refs, &refs, NULL),
        CL_SUCCESS);
    assert_true(refs >= ndev);
    assert_int_equal(yes, 1);
  } else {
    assert_ptr_not_equal(ocl(a)->context, ocl(b)->context);
    assert_false(ocl(a)->shared_context || ocl(b)->shared_context);
    assert_int_equal(yes, 0);
  }
  tu_ok(clpar_dev_peer_access(a, a->bd.ctx, &yes)); /* a device is not its own peer */
  assert_int_equal(yes, 0);
}

/* A column tensor [n, 1] on dev holding tu_rand(n, seed), uploaded (the upload may make the
 * worker wait for a new pinned staging block: synchronized before the counters are read). */
static clpar_tensor *column(clpar_device *dev, int64_t n, uint64_t seed) {
  return tu_make(dev, 2, (int64_t[]){n, 1}, seed);
}

/* 2 p written by dev's queue behind a GEMM (the queue is still busy with both when this
 * returns); want = 2 tu_rand(n, seed). */
static clpar_tensor *late_values(clpar_tensor *p, clpar_tensor *sq, int64_t n, uint64_t seed,
                                 float **want) {
  clpar_tensor *prod, *out;
  tu_ok(clpar_matmul(sq, sq, 0, 0, &prod));
  tu_ok(clpar_scale(p, 2.0f, &out)); /* posted after the GEMM */
  clpar_tensor_free(prod);
  *want = tu_rand((size_t)n, seed);
  for (int64_t i = 0; i < n; i++) (*want)[i] *= 2.0f;
  return out;
}

/* Rows [so, so+n) of a tensor on a into rows [dst_at, dst_at+n) of a tensor being computed on b,
 * then b's next op reads the result; and the whole result back to a. */
static void copy_case(clpar_device *a, clpar_device *b, int64_t n, int64_t so, int64_t dst_at,
                      uint64_t seed) {
  int64_t src_rows = so + n + 5, dst_rows = dst_at + n + 3;
  float *src_host, *dst_host;
  clpar_tensor *src_p = column(a, src_rows, seed), *dst_p = column(b, dst_rows, seed + 10);
  clpar_tensor *sq_a = tu_make(a, 2, (int64_t[]){192, 192}, seed + 20);
  clpar_tensor *sq_b = tu_make(b, 2, (int64_t[]){192, 192}, seed + 30);
  tu_ok(clpar_device_synchronize(a));
  tu_ok(clpar_device_synchronize(b));
  clpar_device_counters a0 = counters(a), b0 = counters(b);
  clpar_tensor *src = late_values(src_p, sq_a, src_rows, seed, &src_host);
  clpar_tensor *dst = late_values(dst_p, sq_b, dst_rows, seed + 10, &dst_host);
  clpar_tensor *sv, *dv, *twice, *back;
  tu_ok(clpar_tensor_rows(src, so, n, &sv));
  tu_ok(clpar_tensor_rows(dst, dst_at, n, &dv));
  tu_ok(clpar_copy(dv, sv));               /* a to b, b's queue still writing dst */
  tu_ok(clpar_add(dst, dst, &twice));      /* b reads what the copy wrote */
  tu_ok(clpar_tensor_to(twice, a, &back)); /* b to a */
  clpar_device_counters a1 = counters(a), b1 = counters(b);
  /* posting blocked the calling thread on neither device (a worker may have waited inside the
   * backend: host_waits counts those too, as backend_waits) */
  assert_int_equal(a1.host_waits - a1.backend_waits, a0.host_waits - a0.backend_waits);
  assert_int_equal(b1.host_waits - b1.backend_waits, b0.host_waits - b0.backend_waits);
  tu_ok(clpar_device_synchronize(a));
  tu_ok(clpar_device_synchronize(b));
  if (shared_mode()) { /* no staging: not even a worker waited (for a pinned block's map) */
    assert_int_equal(counters(a).backend_waits, a0.backend_waits);
    assert_int_equal(counters(b).backend_waits, b0.backend_waits);
  }
  assert_int_equal(b1.transfers_in - b0.transfers_in, 1);
  assert_int_equal(a1.transfers_in - a0.transfers_in, 1);
  uint64_t want_peer = shared_mode() ? 2 : 0; /* each copy counts on both devices */
  assert_int_equal(a1.peer_copies - a0.peer_copies, want_peer);
  assert_int_equal(b1.peer_copies - b0.peer_copies, want_peer);
  float *want = malloc((size_t)dst_rows * sizeof *want);
  assert_non_null(want);
  for (int64_t i = 0; i < dst_rows; i++)
    want[i] = i >= dst_at && i < dst_at + n ? src_host[so + i - dst_at] : dst_host[i];
  float *got = tu_read(dst);
  char what[160];
  snprintf(what, sizeof what, "%lld floats from row %lld into row %lld", (long long)n,
           (long long)so, (long long)dst_at);
  tu_assert_close(got, want, (size_t)dst_rows, 0, 0, what);
  for (int64_t i = 0; i < dst_rows; i++) want[i] *= 2.0f;
  free(got);
  got = tu_read(twice);
  tu_assert_close(got, want, (size_t)dst_rows, 0, 0, "the destination's next op");
  free(got);
  got = tu_read(back);
  tu_assert_close(got, want, (size_t)dst_rows, 0, 0, "copied back");
  free(got);
  free(want);
  free(src_host);
  free(dst_host);
  clpar_tensor *list[] = {src, dst, sv, dv, twice, back, src_p, dst_p, sq_a, sq_b};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) clpar_tensor_free(list[i]);
}

static void test_copies_give_the_values(void **state) {
  (void)state;
  clpar_device *a, *b;
  need_pair(&a, &b);
  copy_case(a, b, 1, 0, 0, 1);
  copy_case(a, b, 3, 5, 1, 2);
  copy_case(a, b, 1023, 17, 333, 3);
  copy_case(b, a, 300001, 3, 7, 4);   /* the other way; above the 64 KiB staging blocks */
  copy_case(a, b, 1500007, 11, 2, 5); /* above the 4 MiB staging chunk */
  copy_case(b, a, 1500007, 0, 1, 6);
}

/* ---- DataParallel and the ToyModel on the two devices against one ---- */

enum { N_PARAMS = 5 * 16 + 16 + 16 * 3 + 3 };

static clpar_module *make_mlp(clpar_device *dev) {
  clpar_module *layers[3], *mlp;
  clpar_manual_seed(11);
  tu_ok(clpar_linear_create(5, 16, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(16, 3, 1, dev, &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &mlp));
  return mlp;
}

static void read_params(clpar_module *m, float *out, int n_out) {
  int at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, out + at, (size_t)(n_out - at)));
    at += (int)clpar_tensor_numel(p);
  }
  assert_int_equal(at, n_out);
}

static void train_mlp(clpar_module *m, clpar_device *dev, float *out) {
  clpar_optimizer *opt;
  clpar_sgd_options o = {.lr = 0.1f, .momentum = 0.9f};
  tu_ok(clpar_sgd_create_for(m, &o, &opt));
  for (int step = 0; step < 4; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *y, *target, *loss;
    tu_ok(clpar_tensor_rand_normal(dev, 2, (int64_t[]){31, 5}, 300 + (uint64_t)step, 0, 1, &x));
    tu_ok(
        clpar_tensor_rand_normal(dev, 2, (int64_t[]){31, 3}, 400 + (uint64_t)step, 0, 1, &target));
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(m, x, &y));
    tu_ok(clpar_mse_loss(y, target, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_scope_end(sc);
  }
  read_params(m, out, N_PARAMS);
  clpar_optimizer_free(opt);
}

static void test_data_parallel_equals_one_device(void **state) {
  (void)state;
  clpar_device *a, *b;
  need_pair(&a, &b);
  float ref[N_PARAMS], got[N_PARAMS];
  clpar_module *single = make_mlp(a);
  train_mlp(single, a, ref);
  clpar_module_free(single);
  clpar_device *devs[] = {a, b};
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = devs, .n_devices = 2};
  tu_ok(clpar_data_parallel_create(make_mlp(a), &o, &dp));
  clpar_device_counters a0 = counters(a), b0 = counters(b);
  train_mlp(dp, a, got);
  clpar_device_counters a1 = counters(a), b1 = counters(b);
  tu_assert_close(got, ref, N_PARAMS, 1e-5f, 1e-6f, "DataParallel on two OpenCL devices");
  uint64_t moved = b1.transfers_in - b0.transfers_in + b1.transfers_out - b0.transfers_out;
  assert_true(moved > 0);
  /* every copy between the two took the peer path, or none did */
  assert_int_equal(b1.peer_copies - b0.peer_copies, shared_mode() ? moved : 0);
  assert_int_equal(a1.peer_copies - a0.peer_copies, shared_mode() ? moved : 0);
  clpar_module_free(dp);
}

static void test_toy_model_parallel_equals_one_device(void **state) {
  (void)state;
  clpar_device *a, *b;
  need_pair(&a, &b);
  tu_toy_devices split = {a, b}, one = {a, a};
  float l_split[5], l_one[5], w_split[165], w_one[165];
  clpar_device_counters a0 = counters(a);
  tu_toy_train(&split, 0, &(clpar_sgd_options){.lr = 0.001f}, 5, l_split, w_split);
  clpar_device_counters a1 = counters(a);
  tu_toy_train(&one, 0, &(clpar_sgd_options){.lr = 0.001f}, 5, l_one, w_one);
  tu_assert_close(l_split, l_one, 5, 1e-5f, 1e-7f, "ToyModel losses");
  tu_assert_close(w_split, w_one, 165, 1e-5f, 1e-6f, "ToyModel weights");
  /* per step: the activation to b and its gradient back to a, peer copies both (the other
   * transfers are the uploads of x and of the initial weights) */
  assert_int_equal(a1.peer_copies - a0.peer_copies, shared_mode() ? 10 : 0);
}

/* An unknown value is the user's error: clpar_init fails naming the variable, and works again
 * once it is fixed. Runs last: it shuts the group's library down and brings it back. */
static void test_unknown_value_fails_init(void **state) {
  (void)state;
  char *saved = getenv("CLPAR_OPENCL_CONTEXT") ? strdup(getenv("CLPAR_OPENCL_CONTEXT")) : NULL;
  clpar_shutdown();
  assert_int_equal(setenv("CLPAR_OPENCL_CONTEXT", "per-gpu", 1), 0);
  assert_int_equal(clpar_init(), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "CLPAR_OPENCL_CONTEXT=\"per-gpu\""));
  assert_int_equal(clpar_device_count(), 0);
  if (saved)
    assert_int_equal(setenv("CLPAR_OPENCL_CONTEXT", saved, 1), 0);
  else
    assert_int_equal(unsetenv("CLPAR_OPENCL_CONTEXT"), 0);
  free(saved);
  tu_ok(clpar_init());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_contexts_follow_the_variable),
      cmocka_unit_test(test_copies_give_the_values),
      cmocka_unit_test(test_data_parallel_equals_one_device),
      cmocka_unit_test(test_toy_model_parallel_equals_one_device),
      cmocka_unit_test(test_unknown_value_fails_init),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
