/* test_cuda.c — the CUDA backend against the host reference: enumeration and device info,
 * every op (fill, add/sub/mul with and without a broadcast row, scale, sum_rows, GEMM in all
 * four transpose combinations), copies between a CUDA device and the host, use from another
 * host thread, and an allocation larger than the device can give; then the training entries
 * through the public API, forward and backward (activations, softmax and log-softmax,
 * cross-entropy, sum_rows's backward) and optimizer steps (SGD, Adam, AdamW); then
 * device-time profiling and sum_rows's two-pass path for tall, narrow matrices; last, the
 * backend entries for events, pinned staging memory, transfers that do not wait,
 * exp/sqrt/neg and div) called through the backend's table.
 *
 * Built wherever the CUDA module is; on a machine without a GPU (or without the driver) every
 * test prints why to stderr and skips, so the suite still passes there. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "internal.h"
#include "test_util.h"

#define MAX_CUDA 16

static clpar_device *cuda_devs[MAX_CUDA]; /* the selected CUDA devices */
static int cuda_count;
static int runtime_count; /* what cudaGetDeviceCount reports */
static char skip_reason[512];

static int is_cuda(const clpar_device *d) {
  return strcmp(d->bd.iface->name, "cuda") == 0;
}

/* clpar_init, then the CUDA devices among the selected ones, or the reason there are none. */
static int group_setup(void **state) {
  int rc = tu_setup(state);
  if (rc != 0) return rc;
  cudaError_t e = cudaGetDeviceCount(&runtime_count);
  if (e != cudaSuccess) {
    runtime_count = 0;
    (void)cudaGetLastError();
    snprintf(skip_reason, sizeof skip_reason, "no CUDA device: %s", cudaGetErrorString(e));
    return 0;
  }
  if (runtime_count == 0) {
    snprintf(skip_reason, sizeof skip_reason, "no CUDA device: the runtime reports none");
    return 0;
  }
  for (int i = 0; i < clpar_device_count() && cuda_count < MAX_CUDA; i++) {
    clpar_device *d = clpar_device_get(i);
    if (is_cuda(d)) cuda_devs[cuda_count++] = d;
  }
  if (cuda_count == 0) {
    const char *spec = getenv("CLPAR_DEVICES");
    snprintf(skip_reason, sizeof skip_reason,
             "%d CUDA device(s), but none is selected (CLPAR_DEVICES=%s; "
             "CLPAR_LOG_LEVEL=info tells why a device was left out)",
             runtime_count, spec ? spec : "(unset)");
  }
  return 0;
}

#define NEED_CUDA()                                    \
  do {                                                 \
    if (cuda_count == 0) {                             \
      fprintf(stderr, "test_cuda: %s\n", skip_reason); \
      skip();                                          \
    }                                                  \
  } while (0)

static void test_enumeration(void **state) {
  (void)state;
  NEED_CUDA();
  assert_true(cuda_count <= runtime_count);
  if (!getenv("CLPAR_DEVICES") && cuda_count < runtime_count)
    fprintf(stderr, "test_cuda: %d of %d CUDA devices listed (see CLPAR_LOG_LEVEL=info)\n",
            cuda_count, runtime_count);
  for (int i = 0; i < cuda_count; i++) {
    clpar_device_info in;
    tu_ok(clpar_device_get_info(cuda_devs[i], &in));
    /* The table is made by CLPAR_BACKEND_TABLE, which stamps the current ABI. */
    assert_int_equal(cuda_devs[i]->bd.iface->abi_version, CLPAR_BACKEND_ABI_VERSION);
    assert_string_equal(in.backend, "cuda");
    assert_int_equal(strncmp(in.id, "cuda:", 5), 0);
    assert_string_equal(in.vendor, "NVIDIA");
    assert_int_equal(in.type, CLPAR_DEVICE_GPU);
    assert_true(in.name[0] != '\0');
    assert_true(in.driver_version[0] != '\0');
    assert_true(in.global_mem_bytes > 0);
    assert_true(in.max_alloc_bytes == in.global_mem_bytes);
    assert_true(in.compute_units > 0);
    clpar_device *found = NULL;
    tu_ok(clpar_device_find(in.id, &found));
    assert_ptr_equal(found, cuda_devs[i]);
    fprintf(stderr, "test_cuda: %s: %s, %d SMs, %.1f GiB, driver %s\n", in.id, in.name,
            in.compute_units, (double)in.global_mem_bytes / (1 << 30), in.driver_version);
  }
}

/* Fill on a whole tensor and on a view at an odd offset; +0.0 takes cudaMemsetAsync, other
 * values (-0.0 and NaN included) the kernel. */
static void test_fill(void **state) {
  (void)state;
  NEED_CUDA();
  static const float values[] = {0.75f, 0.0f, -0.0f, -3.0e38f};
  int64_t shape[] = {1001, 37};
  for (int d = 0; d < cuda_count; d++)
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *t = tu_make(cuda_devs[d], 2, shape, 1), *h = tu_make(tu_host(), 2, shape, 1);
      clpar_tensor *tv, *hv;
      tu_ok(clpar_tensor_rows(t, 13, 500, &tv));
      tu_ok(clpar_tensor_rows(h, 13, 500, &hv));
      tu_ok(clpar_fill(tv, values[v]));
      tu_ok(clpar_fill(hv, values[v]));
      tu_expect_equal(t, h, 0, 0, "fill of a view");
      float *r = tu_read(tv);
      assert_int_equal(!!signbit(r[0]), !!signbit(values[v]));
      free(r);
      tu_ok(clpar_fill(t, NAN));
      r = tu_read(t);
      for (size_t i = 0; i < (size_t)(shape[0] * shape[1]); i++) assert_true(isnan(r[i]));
      free(r);
      clpar_scope_end(sc);
    }
}

typedef clpar_status (*binary_fn)(const clpar_tensor *, const clpar_tensor *, clpar_tensor **);

/* a (rows x cols) against b of a's shape, [cols] and [1, cols]. */
static void check_binary(clpar_device *dev, binary_fn fn, int64_t rows, int64_t cols,
                         const char *name) {
  const int64_t a_shape[] = {rows, cols}, row1[] = {cols}, row2[] = {1, cols};
  const int64_t *b_shapes[] = {a_shape, row1, row2};
  const int b_ndims[] = {2, 1, 2};
  for (int v = 0; v < 3; v++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *a = tu_make(dev, 2, a_shape, 1), *b = tu_make(dev, b_ndims[v], b_shapes[v], 2);
    clpar_tensor *ha = tu_make(tu_host(), 2, a_shape, 1);
    clpar_tensor *hb = tu_make(tu_host(), b_ndims[v], b_shapes[v], 2);
    clpar_tensor *r, *hr;
    tu_ok(fn(a, b, &r));
    tu_ok(fn(ha, hb, &hr));
    tu_expect_equal(r, hr, 1e-6f, 1e-6f, name);
    clpar_scope_end(sc);
  }
}

static void test_binary(void **state) {
  (void)state;
  NEED_CUDA();
  for (int d = 0; d < cuda_count; d++) {
    check_binary(cuda_devs[d], clpar_add, 37, 53, "add");
    check_binary(cuda_devs[d], clpar_sub, 37, 53, "sub");
    check_binary(cuda_devs[d], clpar_mul, 37, 53, "mul");
    check_binary(cuda_devs[d], clpar_add, 1, 1, "add 1x1");
    /* More elements than one pass of the capped grid covers: the grid-stride loop and the
     * broadcast column index (i % cols) over many passes. */
    check_binary(cuda_devs[d], clpar_mul, 4099, 4097, "mul large");
  }
}

/* out aliasing a or b exactly, through the backend entry (the public ops make new tensors). */
static void test_binary_in_place(void **state) {
  (void)state;
  NEED_CUDA();
  int64_t shape[] = {33, 65}, row[] = {65};
  for (int d = 0; d < cuda_count; d++) {
    clpar_device *dev = cuda_devs[d];
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *a = tu_make(dev, 2, shape, 3), *b = tu_make(dev, 2, shape, 4),
                 *bias = tu_make(dev, 1, row, 5);
    clpar_tensor *ha = tu_make(tu_host(), 2, shape, 3), *hb = tu_make(tu_host(), 2, shape, 4);
    clpar_tensor *hbias = tu_make(tu_host(), 1, row, 5), *h1, *h2;
    /* a = a + bias (broadcast, out == a), then b = a - b (out == b) */
    tu_ok(clpar_dev_binary_sync(dev, CLPAR_BINARY_ADD, 33, 65, clpar_tensor_bref(a),
                                clpar_tensor_bref(bias), 1, clpar_tensor_bref(a)));
    tu_ok(clpar_dev_binary_sync(dev, CLPAR_BINARY_SUB, 33, 65, clpar_tensor_bref(a),
                                clpar_tensor_bref(b), 33, clpar_tensor_bref(b)));
    tu_ok(clpar_add(ha, hbias, &h1));
    tu_ok(clpar_sub(h1, hb, &h2));
    tu_expect_equal(a, h1, 1e-6f, 1e-6f, "add in place");
    tu_expect_equal(b, h2, 1e-6f, 1e-6f, "sub in place");
    clpar_scope_end(sc);
  }
}

/* Scale, then a chain of in-place scales with no wait between them: the stream keeps them in
 * order, and only the read at the end waits. */
static void test_scale(void **state) {
  (void)state;
  NEED_CUDA();
  int64_t shape[] = {3, 5, 7}, big[] = {1 << 20};
  for (int d = 0; d < cuda_count; d++) {
    clpar_device *dev = cuda_devs[d];
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *a = tu_make(dev, 3, shape, 6), *ha = tu_make(tu_host(), 3, shape, 6), *r, *hr;
    tu_ok(clpar_scale(a, -2.5f, &r));
    tu_ok(clpar_scale(ha, -2.5f, &hr));
    tu_expect_equal(r, hr, 1e-6f, 0, "scale");
    clpar_tensor *t;
    tu_ok(clpar_tensor_zeros(dev, 1, big, &t));
    tu_ok(clpar_fill(t, 1.0f));
    for (int i = 0; i < 100; i++)
      tu_ok(clpar_dev_scale_sync(dev, (size_t)big[0], i % 2 ? 0.5f : 4.0f, clpar_tensor_bref(t),
                                 clpar_tensor_bref(t)));
    float *v = tu_read(t); /* (4 * 0.5)^50 */
    for (int i = 0; i < big[0]; i++) assert_float_equal(v[i], 1125899906842624.0f, 0);
    free(v);
    clpar_scope_end(sc);
  }
}

static void test_sum_rows(void **state) {
  (void)state;
  NEED_CUDA();
  static const int64_t shapes[][3] = {{1000, 33, 0}, {1, 17, 0},    {7, 3, 5},
                                      {4099, 1, 0},  {3, 70001, 0}, {1, 1, 0}};
  static const int ndims[] = {2, 2, 3, 2, 2, 2};
  for (int d = 0; d < cuda_count; d++)
    for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++) {
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *a = tu_make(cuda_devs[d], ndims[s], shapes[s], 30), *r;
      clpar_tensor *ha = tu_make(tu_host(), ndims[s], shapes[s], 30), *hr;
      tu_ok(clpar_sum_rows(a, &r));
      tu_ok(clpar_sum_rows(ha, &hr));
      /* float sums in another order than the host's double: error grows with the rows */
      float atol = 1e-6f * (float)shapes[s][0] + 1e-6f;
      tu_expect_equal(r, hr, 1e-5f, atol, "sum_rows");
      clpar_scope_end(sc);
    }
}

/* matmul, the accumulating gemm, and beta = 0 over a C full of NaN. */
static void check_gemm(clpar_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k) {
  clpar_scope *sc = clpar_scope_begin();
  int64_t as[2] = {ta ? k : m, ta ? m : k}, bs[2] = {tb ? n : k, tb ? k : n}, cs[2] = {m, n};
  clpar_tensor *a = tu_make(dev, 2, as, 10), *b = tu_make(dev, 2, bs, 11), *r;
  clpar_tensor *ha = tu_make(tu_host(), 2, as, 10), *hb = tu_make(tu_host(), 2, bs, 11), *hr;
  char what[96];
  snprintf(what, sizeof what, "matmul ta=%d tb=%d %lldx%lldx%lld", ta, tb, (long long)m,
           (long long)n, (long long)k);
  tu_ok(clpar_matmul(a, b, ta, tb, &r));
  tu_ok(clpar_matmul(ha, hb, ta, tb, &hr));
  tu_expect_equal(r, hr, 1e-4f, 1e-4f, what);
  clpar_tensor *c = tu_make(dev, 2, cs, 12), *hc = tu_make(tu_host(), 2, cs, 12);
  tu_ok(clpar_gemm(ta, tb, 0.5f, a, b, -2.0f, c));
  tu_ok(clpar_gemm(ta, tb, 0.5f, ha, hb, -2.0f, hc));
  tu_expect_equal(c, hc, 1e-4f, 1e-4f, "gemm alpha beta");
  tu_ok(clpar_fill(c, NAN));
  tu_ok(clpar_gemm(ta, tb, 1.0f, a, b, 0.0f, c));
  tu_expect_equal(c, hr, 1e-4f, 1e-4f, "gemm beta 0 over NaN");
  clpar_scope_end(sc);
}

static void test_gemm(void **state) {
  (void)state;
  NEED_CUDA();
  for (int d = 0; d < cuda_count; d++)
    for (int t = 0; t < 4; t++) {
      check_gemm(cuda_devs[d], t & 1, t >> 1, 37, 53, 29);
      check_gemm(cuda_devs[d], t & 1, t >> 1, 1, 7, 64);
      check_gemm(cuda_devs[d], t & 1, t >> 1, 129, 3, 257);
    }
}

/* A view starts at an odd element offset into its buffer. */
static void test_gemm_on_views(void **state) {
  (void)state;
  NEED_CUDA();
  int64_t xs[2] = {30, 5}, ws[2] = {2, 5};
  for (int d = 0; d < cuda_count; d++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x = tu_make(cuda_devs[d], 2, xs, 20), *w = tu_make(cuda_devs[d], 2, ws, 21);
    clpar_tensor *hx = tu_make(tu_host(), 2, xs, 20), *hw = tu_make(tu_host(), 2, ws, 21);
    clpar_tensor *xv, *hxv, *r, *hr;
    tu_ok(clpar_tensor_rows(x, 13, 11, &xv));
    tu_ok(clpar_tensor_rows(hx, 13, 11, &hxv));
    tu_ok(clpar_matmul(xv, w, 0, 1, &r));
    tu_ok(clpar_matmul(hxv, hw, 0, 1, &hr));
    tu_expect_equal(r, hr, 1e-5f, 1e-5f, "matmul of a view");
    clpar_scope_end(sc);
  }
}

/* CUDA to host and host to CUDA (tensor_to and copy), CUDA to CUDA, views included: exact. */
static void test_copy_host_cuda(void **state) {
  (void)state;
  NEED_CUDA();
  int64_t shape[] = {37, 53}, part[] = {10, 53};
  for (int d = 0; d < cuda_count; d++) {
    clpar_device *dev = cuda_devs[d];
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *h = tu_make(tu_host(), 2, shape, 40), *c, *back, *c2, *hv, *cv;
    tu_ok(clpar_tensor_to(h, dev, &c));
    assert_ptr_equal(clpar_tensor_device(c), dev);
    tu_ok(clpar_tensor_to(c, tu_host(), &back));
    tu_expect_equal(back, h, 0, 0, "host -> cuda -> host");
    tu_ok(clpar_tensor_zeros(dev, 2, shape, &c2));
    tu_ok(clpar_copy(c2, c)); /* device-local */
    tu_expect_equal(c2, h, 0, 0, "cuda -> cuda");
    /* rows 20..29 of a new host tensor into rows 5..14 of c2, then back out */
    clpar_tensor *h2 = tu_make(tu_host(), 2, shape, 41), *hp;
    tu_ok(clpar_tensor_rows(h2, 20, 10, &hv));
    tu_ok(clpar_tensor_rows(c2, 5, 10, &cv));
    tu_ok(clpar_copy(cv, hv));
    tu_ok(clpar_tensor_zeros(tu_host(), 2, part, &hp));
    tu_ok(clpar_copy(hp, cv));
    tu_expect_equal(hp, hv, 0, 0, "host view -> cuda view -> host");
    clpar_scope_end(sc);
  }
}

typedef struct {
  clpar_device *dev;
  clpar_status status;
  char error[256];
  float values[64];
} thread_job;

static void *thread_main(void *arg) {
  thread_job *job = arg;
  int64_t shape[] = {64, 64};
  clpar_tensor *a = NULL, *b = NULL, *r = NULL;
  job->status = clpar_tensor_zeros(job->dev, 2, shape, &a);
  if (job->status == CLPAR_OK) job->status = clpar_fill(a, 1.5f);
  if (job->status == CLPAR_OK) job->status = clpar_matmul(a, a, 0, 1, &b);
  if (job->status == CLPAR_OK) job->status = clpar_sum_rows(b, &r);
  if (job->status == CLPAR_OK) job->status = clpar_tensor_read(r, job->values, 64);
  snprintf(job->error, sizeof job->error, "%s", clpar_last_error());
  clpar_tensor_free(a);
  clpar_tensor_free(b);
  clpar_tensor_free(r);
  return NULL;
}

/* Entries come from any host thread: a new thread has no current CUDA device of its own. */
static void test_other_thread(void **state) {
  (void)state;
  NEED_CUDA();
  for (int d = 0; d < cuda_count; d++) {
    thread_job job = {.dev = cuda_devs[d]};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, thread_main, &job), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    if (job.status != CLPAR_OK) fail_msg("%s: %s", clpar_status_name(job.status), job.error);
    for (int i = 0; i < 64; i++) /* 64 * 64 * 1.5 * 1.5, exact in float */
      assert_float_equal(job.values[i], 9216.0f, 0);
  }
}

/* Larger than the device: the core refuses it up front; a little under the device's total
 * memory reaches cudaMalloc and comes back as out of memory. The device works afterwards. */
static void test_alloc_too_large(void **state) {
  (void)state;
  NEED_CUDA();
  for (int d = 0; d < cuda_count; d++) {
    clpar_device *dev = cuda_devs[d];
    clpar_device_info in;
    tu_ok(clpar_device_get_info(dev, &in));
    clpar_tensor *t = NULL;
    int64_t huge[] = {(int64_t)(in.max_alloc_bytes / sizeof(float)) + 1};
    assert_int_equal(clpar_tensor_zeros(dev, 1, huge, &t), CLPAR_ERROR_TOO_LARGE);
    assert_null(t);
    /* the context and cuBLAS's workspace already hold some of the memory */
    int64_t nearly[] = {(int64_t)(in.global_mem_bytes / sizeof(float)) - 1024};
    assert_int_equal(clpar_tensor_zeros(dev, 1, nearly, &t), CLPAR_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(clpar_last_error(), "cudaErrorMemoryAllocation"));
    assert_non_null(strstr(clpar_last_error(), in.id));
    void *buf = NULL;
    assert_int_equal(dev->bd.iface->alloc(dev->bd.ctx, (size_t)in.global_mem_bytes, &buf),
                     CLPAR_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(clpar_last_error(), "cudaMalloc"));
    /* The failed cudaMalloc must not be reported by the next kernel launch. */
    int64_t small[] = {8, 8};
    clpar_tensor *a = tu_make(dev, 2, small, 50), *r = NULL;
    tu_ok(clpar_scale(a, 2.0f, &r));
    tu_ok(clpar_device_synchronize(dev));
    clpar_tensor_free(a);
    clpar_tensor_free(r);
  }
}

/* ---- training ops ---- */

typedef clpar_status (*unary_fn)(const clpar_tensor *, clpar_tensor **);

typedef struct {
  float rtol, atol;
} tol;

/* y = f(scale * x) and the gradient of sum(y * R) with respect to x, on dev and on the host
 * from the same x and R: both must agree. view (NULL or {start, count}) takes those rows of
 * x first, so that the op sees an offset into its buffer. */
static void check_fn(clpar_device *dev, unary_fn f, int ndim, const int64_t *shape, float scale,
                     const int64_t *view, tol fwd, tol bwd, const char *what) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_device *devs[2] = {dev, tu_host()};
  clpar_tensor *x[2], *y[2];
  for (int i = 0; i < 2; i++) {
    clpar_tensor *in, *xs, *r, *prod, *loss;
    x[i] = tu_make(devs[i], ndim, shape, 70);
    tu_ok(clpar_tensor_set_requires_grad(x[i], 1));
    in = x[i];
    if (view) tu_ok(clpar_tensor_rows(x[i], view[0], view[1], &in));
    tu_ok(clpar_scale(in, scale, &xs));
    tu_ok(f(xs, &y[i]));
    int64_t ys[CLPAR_MAX_DIMS];
    for (int k = 0; k < clpar_tensor_ndim(y[i]); k++) ys[k] = clpar_tensor_dim(y[i], k);
    r = tu_make(devs[i], clpar_tensor_ndim(y[i]), ys, 71);
    tu_ok(clpar_mul(y[i], r, &prod));
    tu_ok(clpar_sum(prod, &loss));
    tu_ok(clpar_backward(loss));
  }
  char msg[160];
  snprintf(msg, sizeof msg, "%s: forward", what);
  tu_expect_equal(y[0], y[1], fwd.rtol, fwd.atol, msg);
  snprintf(msg, sizeof msg, "%s: gradient", what);
  assert_non_null(clpar_tensor_grad(x[0]));
  tu_expect_equal(clpar_tensor_grad(x[0]), clpar_tensor_grad(x[1]), bwd.rtol, bwd.atol, msg);
  clpar_scope_end(sc);
}

/* relu, sigmoid and tanh over [-6, 6) (saturating sigmoid and tanh), a single element, a view
 * at an odd offset, and more elements than one pass of the capped grid. Near saturation the
 * derivatives y (1 - y) and 1 - y^2 cancel, so their tolerance is absolute. */
static void test_unary(void **state) {
  (void)state;
  NEED_CUDA();
  static const unary_fn fns[] = {clpar_relu, clpar_sigmoid, clpar_tanh};
  static const char *names[] = {"relu", "sigmoid", "tanh"};
  const int64_t small[] = {37, 53}, one[] = {1}, tall[] = {1001, 37}, view[] = {13, 500};
  const int64_t big[] = {4099, 4097};
  const tol fwd = {2e-6f, 1e-7f}, bwd = {1e-5f, 5e-6f}, exact = {0, 0};
  for (int d = 0; d < cuda_count; d++) {
    for (int k = 0; k < 3; k++) {
      check_fn(cuda_devs[d], fns[k], 2, small, 6.0f, NULL, k ? fwd : exact, bwd, names[k]);
      check_fn(cuda_devs[d], fns[k], 1, one, 6.0f, NULL, k ? fwd : exact, bwd, names[k]);
      check_fn(cuda_devs[d], fns[k], 2, tall, 6.0f, view, k ? fwd : exact, bwd, names[k]);
    }
    check_fn(cuda_devs[d], clpar_relu, 2, big, 1.0f, NULL, exact, exact, "relu large");
  }
}

/* out aliasing the input (forward) and g (backward), through the backend entries. */
static void test_unary_in_place(void **state) {
  (void)state;
  NEED_CUDA();
  int64_t shape[] = {33, 65};
  for (int d = 0; d < cuda_count; d++)
    for (int k = CLPAR_UNARY_RELU; k <= CLPAR_UNARY_TANH; k++) {
      clpar_device *dev = cuda_devs[d];
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *a = tu_make(dev, 2, shape, 80), *g = tu_make(dev, 2, shape, 81);
      clpar_tensor *ha = tu_make(tu_host(), 2, shape, 80), *hg = tu_make(tu_host(), 2, shape, 81);
      clpar_unary_kind kind = (clpar_unary_kind)k;
      size_t n = 33 * 65;
      tu_ok(clpar_dev_unary_sync(dev, kind, n, clpar_tensor_bref(a), clpar_tensor_bref(a)));
      tu_ok(clpar_dev_unary_sync(tu_host(), kind, n, clpar_tensor_bref(ha), clpar_tensor_bref(ha)));
      tu_expect_equal(a, ha, 2e-6f, 1e-7f, "unary in place");
      tu_ok(clpar_dev_unary_backward_sync(dev, kind, n, clpar_tensor_bref(g), clpar_tensor_bref(a),
                                          clpar_tensor_bref(g)));
      tu_ok(clpar_dev_unary_backward_sync(tu_host(), kind, n, clpar_tensor_bref(hg),
                                          clpar_tensor_bref(ha), clpar_tensor_bref(hg)));
      tu_expect_equal(g, hg, 1e-5f, 1e-6f, "unary_backward in place");
      clpar_scope_end(sc);
    }
}

/* Rows of one warp (up to 1024 columns) and of a whole block (1025 and more), a single
 * column, three dimensions, a view, and logits of +-1000 that overflow exp unless the row's
 * maximum is subtracted first. There the gradient is 1000 times larger, and y (g - sum(g y))
 * cancels where y is about 1: its tolerance grows with it. */
static void test_softmax(void **state) {
  (void)state;
  NEED_CUDA();
  static const int64_t shapes[][3] = {{5, 10, 0},   {1, 1, 0},     {37, 1000, 0}, {4, 1024, 0},
                                      {4, 1025, 0}, {3, 70001, 0}, {2, 3, 7}};
  static const int ndims[] = {2, 2, 2, 2, 2, 2, 3};
  const int64_t tall[] = {1001, 37}, view[] = {13, 500}, wide[] = {2, 3000}, narrow[] = {8, 50};
  const unary_fn fns[] = {clpar_softmax, clpar_log_softmax};
  const char *names[] = {"softmax", "log_softmax"};
  const tol fwd[] = {{2e-5f, 1e-7f}, {2e-5f, 1e-5f}}, bwd = {1e-4f, 1e-6f}, big = {1e-4f, 2e-3f};
  for (int d = 0; d < cuda_count; d++)
    for (int lg = 0; lg < 2; lg++) {
      clpar_device *dev = cuda_devs[d];
      char what[64];
      for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++) {
        snprintf(what, sizeof what, "%s %lldx%lld", names[lg], (long long)shapes[s][0],
                 (long long)shapes[s][1]);
        check_fn(dev, fns[lg], ndims[s], shapes[s], 1.0f, NULL, fwd[lg], bwd, what);
      }
      check_fn(dev, fns[lg], 2, tall, 1.0f, view, fwd[lg], bwd, names[lg]);
      check_fn(dev, fns[lg], 2, narrow, 1000.0f, NULL, fwd[lg], big, "softmax of +-1000, warp");
      check_fn(dev, fns[lg], 2, wide, 1000.0f, NULL, fwd[lg], big, "softmax of +-1000, block");
    }
}

/* log_softmax + nll + mean or sum, forward and backward, in warp and block-sized rows. */
static void test_cross_entropy(void **state) {
  (void)state;
  NEED_CUDA();
  static const int64_t shapes[][2] = {{64, 10}, {5, 4}, {1, 1}, {3, 2000}};
  int32_t labels[64];
  for (int d = 0; d < cuda_count; d++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int red = 0; red < 2; red++) {
        clpar_scope *sc = clpar_scope_begin();
        clpar_device *devs[2] = {cuda_devs[d], tu_host()};
        clpar_tensor *logits[2], *loss[2];
        for (int64_t r = 0; r < shapes[s][0]; r++)
          labels[r] = (int32_t)((r * 7 + 3) % shapes[s][1]);
        for (int i = 0; i < 2; i++) {
          logits[i] = tu_make(devs[i], 2, shapes[s], 90);
          tu_ok(clpar_tensor_set_requires_grad(logits[i], 1));
          tu_ok(
              clpar_cross_entropy(logits[i], labels, shapes[s][0], (clpar_reduction)red, &loss[i]));
          tu_ok(clpar_backward(loss[i]));
        }
        tu_expect_equal(loss[0], loss[1], 1e-5f, 1e-6f, "cross_entropy");
        tu_expect_equal(clpar_tensor_grad(logits[0]), clpar_tensor_grad(logits[1]), 1e-4f, 1e-6f,
                        "cross_entropy gradient");
        clpar_scope_end(sc);
      }
}

static clpar_status sum_all(const clpar_tensor *x, clpar_tensor **out) {
  return clpar_sum(x, out);
}

/* The backward of sum_rows is broadcast_rows: exact copies. clpar_sum sums a [numel, 1]
 * column, so its backward broadcasts a scalar; the large cases take more than one pass of
 * the capped grid. Forward tolerances as in test_sum_rows (float sums in another order). */
static void test_sum_rows_backward(void **state) {
  (void)state;
  NEED_CUDA();
  static const int64_t shapes[][3] = {
      {1000, 33, 0}, {1, 17, 0}, {7, 3, 5}, {4099, 1, 0}, {4099, 4097, 0}};
  static const int ndims[] = {2, 2, 3, 2, 2};
  const tol exact = {0, 0};
  for (int d = 0; d < cuda_count; d++)
    for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++) {
      tol fwd = {1e-5f, 1e-6f * (float)shapes[s][0] + 1e-6f};
      check_fn(cuda_devs[d], clpar_sum_rows, ndims[s], shapes[s], 1.0f, NULL, fwd, exact,
               "sum_rows backward");
      tol whole = {1e-4f, 1e-4f * sqrtf((float)(shapes[s][0] * shapes[s][1])) + 1e-6f};
      check_fn(cuda_devs[d], sum_all, ndims[s], shapes[s], 1.0f, NULL, whole, exact,
               "sum backward");
    }
}

enum { OPT_SGD, OPT_ADAM, OPT_ADAMW };

/* A [7, 13] parameter on dev after steps of the optimizer: each step's gradient comes from
 * backward of sum(p * p * R), so it changes with p and the state carries across steps. p and
 * R live outside the steps' scopes, as a model's parameters do. */
static float *train(clpar_device *dev, int kind, const void *options, int steps) {
  int64_t shape[] = {7, 13};
  clpar_tensor *p = tu_make(dev, 2, shape, 60), *r = tu_make(dev, 2, shape, 61);
  tu_ok(clpar_tensor_set_requires_grad(p, 1));
  clpar_optimizer *opt = NULL;
  if (kind == OPT_SGD) tu_ok(clpar_sgd_create(&p, 1, options, &opt));
  if (kind == OPT_ADAM) tu_ok(clpar_adam_create(&p, 1, options, &opt));
  if (kind == OPT_ADAMW) tu_ok(clpar_adamw_create(&p, 1, options, &opt));
  for (int s = 0; s < steps; s++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *sq, *prod, *loss;
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_mul(p, p, &sq));
    tu_ok(clpar_mul(sq, r, &prod));
    tu_ok(clpar_sum(prod, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    clpar_scope_end(sc);
  }
  float *v = tu_read(p);
  clpar_optimizer_free(opt);
  clpar_tensor_free(p);
  clpar_tensor_free(r);
  return v;
}

static void check_train(int kind, const void *options, const char *what) {
  float *want = train(tu_host(), kind, options, 3);
  for (int d = 0; d < cuda_count; d++) {
    float *got = train(cuda_devs[d], kind, options, 3);
    tu_assert_close(got, want, 7 * 13, 1e-5f, 1e-6f, what);
    free(got);
  }
  free(want);
}

/* Plain SGD (no momentum buffer), momentum with dampening and weight decay, Nesterov: three
 * steps each, so that the momentum buffer's first step and later ones both count. */
static void test_sgd_step(void **state) {
  (void)state;
  NEED_CUDA();
  const clpar_sgd_options plain = {.lr = 0.1f};
  const clpar_sgd_options momentum = {
      .lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 0.01f};
  const clpar_sgd_options nesterov = {
      .lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = 1};
  check_train(OPT_SGD, &plain, "sgd");
  check_train(OPT_SGD, &momentum, "sgd momentum dampening weight_decay");
  check_train(OPT_SGD, &nesterov, "sgd nesterov");
}

static void test_adam_step(void **state) {
  (void)state;
  NEED_CUDA();
  const clpar_adam_options adam = {
      .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  const clpar_adam_options adamw = {
      .lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.1f};
  check_train(OPT_ADAM, &adam, "adam");
  check_train(OPT_ADAMW, &adamw, "adamw");
}

/* ---- profiling ---- */

static clpar_profile profile_now(clpar_device *dev) {
  clpar_profile p = {-1.0, 99};
  tu_ok(clpar_device_profile_read(dev, &p));
  return p;
}

/* A matmul and an add are two ops with device time; a restart, and a stop, give zero. */
static void test_profiling(void **state) {
  (void)state;
  NEED_CUDA();
  int64_t s[] = {64, 64};
  for (int d = 0; d < cuda_count; d++) {
    clpar_device *dev = cuda_devs[d];
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *a = tu_make(dev, 2, s, 70), *r, *q;
    tu_ok(clpar_device_profile_start(dev));
    tu_ok(clpar_matmul(a, a, 0, 0, &r)); /* one GEMM */
    tu_ok(clpar_add(r, a, &q));          /* one kernel */
    clpar_profile p = profile_now(dev);
    assert_int_equal(p.ops, 2);
    assert_true(isfinite(p.device_seconds) && p.device_seconds >= 0);
    /* read does not restart: the totals only grow */
    tu_ok(clpar_add(q, a, &r));
    clpar_profile p2 = profile_now(dev);
    assert_int_equal(p2.ops, 3);
    assert_true(p2.device_seconds >= p.device_seconds);
    tu_ok(clpar_device_profile_start(dev)); /* restarts from zero */
    p = profile_now(dev);
    assert_int_equal(p.ops, 0);
    assert_true(p.device_seconds == 0);
    tu_ok(clpar_device_profile_stop(dev));
    tu_ok(clpar_add(q, a, &r)); /* not recorded */
    p = profile_now(dev);
    assert_int_equal(p.ops, 0);
    assert_true(p.device_seconds == 0);
    clpar_scope_end(sc);
  }
}

/* Through the backend entries: a device-local copy and a two-pass sum_rows count once each,
 * host transfers not at all; and more ops than the first list of event pairs holds (256). */
static void test_profiling_entries(void **state) {
  (void)state;
  NEED_CUDA();
  for (int d = 0; d < cuda_count; d++) {
    clpar_device *dev = cuda_devs[d];
    tu_ok(clpar_device_synchronize(dev)); /* the worker idle: this test drives the queue */
    const clpar_backend_iface *f = dev->bd.iface;
    void *ctx = dev->bd.ctx, *buf = NULL;
    size_t n = 1 << 20;
    float *h = tu_rand(n, 5);
    tu_ok(f->alloc(ctx, 2 * n * sizeof(float) + 64, &buf));
    clpar_bref a = {buf, 0}, b = {buf, n}, out = {buf, 2 * n};
    tu_ok(clpar_device_profile_start(dev));
    tu_ok(clpar_device_synchronize(dev)); /* the start is posted: on before the calls below */
    tu_ok(f->write(ctx, buf, 0, h, n * sizeof(float)));
    tu_ok(f->copy(ctx, buf, n * sizeof(float), buf, 0, n * sizeof(float)));
    tu_ok(f->sum_rows(ctx, n, 1, b, out));
    tu_ok(f->read(ctx, buf, 0, h, sizeof(float)));
    clpar_profile p = profile_now(dev);
    assert_int_equal(p.ops, 2);
    assert_true(isfinite(p.device_seconds) && p.device_seconds >= 0);
    for (int i = 0; i < 600; i++) tu_ok(f->scale(ctx, 1000, 0.5f, a, a));
    p = profile_now(dev);
    assert_int_equal(p.ops, 602);
    tu_ok(clpar_device_profile_stop(dev));
    tu_ok(f->release(ctx, buf));
    free(h);
  }
}

/* ---- sum_rows on tall, narrow matrices ---- */

/* The two-pass path (fewer than 32 columns and more rows than one chunk), its one-pass case,
 * the most chunks there are (9e6 x 1, 270001 x 31) and the wide path beside them; each twice,
 * which must give the same bits. */
static void test_sum_rows_narrow(void **state) {
  (void)state;
  NEED_CUDA();
  static const int64_t shapes[][2] = {{1 << 20, 1}, {100003, 3}, {37, 1}, {5, 1000},   {9000001, 1},
                                      {270001, 31}, {8193, 2},   {1, 1},  {100000, 32}};
  for (int d = 0; d < cuda_count; d++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *a = tu_make(cuda_devs[d], 2, shapes[s], 31), *r, *r2;
      clpar_tensor *ha = tu_make(tu_host(), 2, shapes[s], 31), *hr;
      char what[64];
      snprintf(what, sizeof what, "sum_rows %lldx%lld", (long long)shapes[s][0],
               (long long)shapes[s][1]);
      tu_ok(clpar_sum_rows(a, &r));
      tu_ok(clpar_sum_rows(ha, &hr));
      float atol = 1e-6f * (float)shapes[s][0] + 1e-6f;
      tu_expect_equal(r, hr, 1e-5f, atol, what);
      tu_ok(clpar_sum_rows(a, &r2));
      float *v = tu_read(r), *v2 = tu_read(r2);
      assert_memory_equal(v, v2, (size_t)shapes[s][1] * sizeof(float));
      free(v);
      free(v2);
      clpar_scope_end(sc);
    }
}

/* ---- events, pinned staging memory, transfers that do not wait ---- */

typedef struct then_wait {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int calls;
  clpar_status status;
} then_wait;

static void then_wait_init(then_wait *w) {
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->cond, NULL);
  w->calls = 0;
  w->status = CLPAR_ERROR_INTERNAL;
}

static void then_wait_destroy(then_wait *w) {
  pthread_cond_destroy(&w->cond);
  pthread_mutex_destroy(&w->lock);
}

/* An event_then callback: from the runtime's callback thread, or at once from the caller. */
static void then_signal(void *user, clpar_status status) {
  then_wait *w = user;
  pthread_mutex_lock(&w->lock);
  w->calls++;
  w->status = status;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

/* The number of calls so far, after waiting up to 10 s for the first. */
static int then_calls(then_wait *w) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&w->lock);
  int rc = 0;
  while (w->calls == 0 && rc == 0) rc = pthread_cond_timedwait(&w->cond, &w->lock, &until);
  int calls = w->calls;
  pthread_mutex_unlock(&w->lock);
  return calls;
}

/* Through the table, as the core's worker calls it: a write from pinned memory, the new
 * kinds (exp, sqrt of exp's output, neg, div with and without a broadcast row), a read back
 * into the pinned block, none of which waits; then an event recorded after them whose
 * callback and query say the read has landed. The forward-only kinds have no backward. */
static void test_abi4_entries(void **state) {
  (void)state;
  NEED_CUDA();
  enum { rows = 67, cols = 129 };
  const size_t n = (size_t)rows * cols, bytes = n * sizeof(float);
  for (int d = 0; d < cuda_count; d++) {
    clpar_device *dev = cuda_devs[d];
    tu_ok(clpar_device_synchronize(dev)); /* the worker idle: this test drives the queue */
    const clpar_backend_iface *f = dev->bd.iface;
    void *ctx = dev->bd.ctx, *handle = NULL, *ptr = NULL, *buf = NULL, *ev = NULL;
    float *x = tu_rand(n, 95), *y = tu_rand(n, 96), *want = malloc(bytes);
    assert_non_null(want);
    for (size_t i = 0; i < n; i++) y[i] += y[i] < 0 ? -0.25f : 0.25f; /* away from 0 */
    /* x | y | exp | sqrt | neg | div | div by a row, in the buffer and in the pinned block */
    tu_ok(f->host_alloc(ctx, 7 * bytes, &handle, &ptr));
    assert_non_null(handle);
    float *pin = ptr;
    memcpy(pin, x, bytes);
    memcpy(pin + n, y, bytes);
    tu_ok(f->alloc(ctx, 7 * bytes, &buf));
    clpar_bref bx = {buf, 0}, by = {buf, n};
    clpar_bref out[5];
    for (int k = 0; k < 5; k++) out[k] = (clpar_bref){buf, (size_t)(k + 2) * n};
    tu_ok(f->write(ctx, buf, 0, pin, 2 * bytes));
    tu_ok(f->unary(ctx, CLPAR_UNARY_EXP, n, bx, out[0]));
    tu_ok(f->unary(ctx, CLPAR_UNARY_SQRT, n, out[0], out[1]));
    tu_ok(f->unary(ctx, CLPAR_UNARY_NEG, n, bx, out[2]));
    tu_ok(f->binary(ctx, CLPAR_BINARY_DIV, rows, cols, bx, by, rows, out[3]));
    tu_ok(f->binary(ctx, CLPAR_BINARY_DIV, rows, cols, bx, by, 1, out[4]));
    assert_int_equal(f->unary_backward(ctx, CLPAR_UNARY_EXP, n, bx, bx, out[0]),
                     CLPAR_ERROR_INVALID_ARGUMENT);
    tu_ok(f->read(ctx, buf, 2 * bytes, pin + 2 * n, 5 * bytes));
    tu_ok(f->event_record(ctx, &ev));
    then_wait w, now;
    then_wait_init(&w);
    then_wait_init(&now);
    tu_ok(f->event_then(ctx, ev, then_signal, &w));
    assert_int_equal(then_calls(&w), 1);
    assert_int_equal(w.status, CLPAR_OK);
    int done = 0;
    tu_ok(f->event_query(ctx, ev, &done));
    assert_int_equal(done, 1);
    /* A completed event calls back at once, on this thread. */
    tu_ok(f->event_then(ctx, ev, then_signal, &now));
    assert_int_equal(now.calls, 1);
    assert_int_equal(now.status, CLPAR_OK);
    tu_ok(f->event_free(ctx, ev));
    /* expf within CUDA's 2 ulp of the host's; sqrt, negation and division are exact. */
    for (size_t i = 0; i < n; i++) want[i] = expf(x[i]);
    tu_assert_close(pin + 2 * n, want, n, 5e-7f, 0, "exp");
    for (size_t i = 0; i < n; i++) want[i] = sqrtf(pin[2 * n + i]);
    tu_assert_close(pin + 3 * n, want, n, 0, 0, "sqrt");
    for (size_t i = 0; i < n; i++) want[i] = -x[i];
    tu_assert_close(pin + 4 * n, want, n, 0, 0, "neg");
    for (size_t i = 0; i < n; i++) want[i] = x[i] / y[i];
    tu_assert_close(pin + 5 * n, want, n, 0, 0, "div");
    for (size_t i = 0; i < n; i++) want[i] = x[i] / y[i % cols];
    tu_assert_close(pin + 6 * n, want, n, 0, 0, "div by a row");
    tu_ok(f->finish(ctx));
    tu_ok(f->release(ctx, buf));
    tu_ok(f->host_free(ctx, handle));
    then_wait_destroy(&w);
    then_wait_destroy(&now);
    free(want);
    free(y);
    free(x);
  }
}

/* release synchronizes the stream before cudaFree: each one is a backend wait the dispatch
 * counts (one per buffer given back to the driver). */
static void test_release_wait_counted(void **state) {
  (void)state;
  NEED_CUDA();
  for (int d = 0; d < cuda_count; d++) {
    clpar_device *dev = cuda_devs[d];
    int64_t shape[] = {1000};
    clpar_tensor *t;
    tu_ok(clpar_device_empty_cache(dev)); /* the workspaces too: freeing them waits once more */
    tu_ok(clpar_tensor_zeros(dev, 1, shape, &t));
    clpar_tensor_free(t); /* into the cache */
    clpar_device_counters before, after;
    clpar_memory_stats mb, ma;
    tu_ok(clpar_device_counters_get(dev, &before));
    tu_ok(clpar_device_memory_stats(dev, &mb));
    tu_ok(clpar_device_empty_cache(dev));
    tu_ok(clpar_device_counters_get(dev, &after));
    tu_ok(clpar_device_memory_stats(dev, &ma));
    assert_true(ma.driver_frees > mb.driver_frees);
    assert_int_equal(after.backend_waits - before.backend_waits, ma.driver_frees - mb.driver_frees);
  }
}

/* Between two CUDA devices a transfer is a peer copy where the runtime allows it (else
 * staged); either way the values arrive exactly, both ways, and the caller does not wait. */
static void test_copy_between_cuda_devices(void **state) {
  (void)state;
  NEED_CUDA();
  if (cuda_count < 2) skip();
  enum { N = 1 << 20 };
  int64_t shape[] = {N};
  float *x = tu_rand(N, 97), *back = malloc(N * sizeof *back);
  assert_non_null(back);
  for (int dir = 0; dir < 2; dir++) {
    clpar_device *a = cuda_devs[dir], *b = cuda_devs[1 - dir];
    int peer = 0;
    tu_ok(clpar_dev_peer_access(a, b->bd.ctx, &peer));
    fprintf(stderr, "test_cuda: %s -> %s: %s\n", clpar_device_id(a), clpar_device_id(b),
            peer ? "peer copy" : "through host staging");
    clpar_tensor *ta, *tb;
    tu_ok(clpar_tensor_from_host(a, 1, shape, x, &ta));
    tu_ok(clpar_device_synchronize(a));
    tu_ok(clpar_tensor_to(ta, b, &tb)); /* warm: staging memory, peer access set up */
    clpar_tensor_free(tb);
    tu_ok(clpar_device_synchronize(a));
    tu_ok(clpar_device_synchronize(b));
    uint64_t wa = clpar_device_host_waits(a), wb = clpar_device_host_waits(b);
    tu_ok(clpar_tensor_to(ta, b, &tb));
    assert_true(clpar_device_host_waits(a) == wa && clpar_device_host_waits(b) == wb);
    tu_ok(clpar_tensor_read(tb, back, N));
    assert_memory_equal(back, x, N * sizeof *x);
    clpar_tensor_free(tb);
    clpar_tensor_free(ta);
  }
  free(back);
  free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_enumeration),
      cmocka_unit_test(test_fill),
      cmocka_unit_test(test_binary),
      cmocka_unit_test(test_binary_in_place),
      cmocka_unit_test(test_scale),
      cmocka_unit_test(test_sum_rows),
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_gemm_on_views),
      cmocka_unit_test(test_copy_host_cuda),
      cmocka_unit_test(test_other_thread),
      cmocka_unit_test(test_alloc_too_large),
      cmocka_unit_test(test_unary),
      cmocka_unit_test(test_unary_in_place),
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_cross_entropy),
      cmocka_unit_test(test_sum_rows_backward),
      cmocka_unit_test(test_sgd_step),
      cmocka_unit_test(test_adam_step),
      cmocka_unit_test(test_profiling),
      cmocka_unit_test(test_profiling_entries),
      cmocka_unit_test(test_sum_rows_narrow),
      cmocka_unit_test(test_abi4_entries),
      cmocka_unit_test(test_release_wait_counted),
      cmocka_unit_test(test_copy_between_cuda_devices),
  };
  return cmocka_run_group_tests(tests, group_setup, tu_teardown);
}
