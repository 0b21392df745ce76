/* test_opencl_program.c — the OpenCL backend below the tensor API: a kernel that does not
 * compile gives CLPAR_ERROR_BUILD with its build log; a program is built once and then served
 * from memory, or from the disk cache after the memory cache is dropped (as in a new process);
 * a corrupt, truncated or stale disk entry is rebuilt, never trusted (the process-wide
 * counters tell which path a build took). Then every backend entry is checked at odd offsets:
 * the ABI 1 ops against plain C (CLBlast with NaN in C and beta == 0 included), the training
 * ops against the host backend. Skips without an OpenCL device. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "internal.h"
#include "ocl_test_util.h"
#include "opencl/ocl_internal.h"

static char cache_dir[256];

static int setup(void **state) {
  /* Read at every build, so setting it here, after nothing was built, is enough. */
  if (tu_ocl_cache_dir_make(cache_dir, sizeof cache_dir, "cache") != 0) return -1;
  return tu_setup(state);
}

static int teardown(void **state) {
  int r = tu_teardown(state);
  tu_remove_dir(cache_dir);
  unsetenv("CLPAR_CACHE_DIR");
  return r;
}

static void test_build_error_has_log(void **state) {
  (void)state;
  NEED_DEVICE(d);
  const char *src = "__kernel void broken(__global float *x) { x[0] = undeclared_thingy; }\n";
  clpar_ocl_program_stats before = tu_ocl_stats();
  cl_program p = NULL;
  clpar_status s = clpar_ocl_program_get(d, "broken", src, strlen(src), "", &p);
  assert_int_equal(s, CLPAR_ERROR_BUILD);
  assert_null(p);
  assert_non_null(strstr(clpar_last_error(), "clBuildProgram(broken)"));
  assert_non_null(strstr(clpar_last_error(), "undeclared_thingy"));
  assert_int_equal(tu_ocl_stats().source_builds, before.source_builds);
}

static void test_memory_then_disk(void **state) {
  (void)state;
  NEED_DEVICE(d);
  char src[512], path[1024];
  tu_ocl_twice_plus_source(src, sizeof src, "memory_then_disk", 2.0f, 1.0f);
  clpar_ocl_program_stats s0 = tu_ocl_stats();
  cl_program p1 = tu_ocl_get(d, "t1", src);
  clpar_ocl_program_stats s1 = tu_ocl_stats();
  assert_int_equal(s1.source_builds, s0.source_builds + 1);
  assert_int_equal(s1.disk_loads, s0.disk_loads);

  cl_program p2 = tu_ocl_get(d, "t1", src);
  clpar_ocl_program_stats s2 = tu_ocl_stats();
  assert_ptr_equal(p1, p2);
  assert_int_equal(s2.memory_hits, s1.memory_hits + 1);
  assert_int_equal(s2.source_builds, s1.source_builds);

  tu_ok(clpar_ocl_cache_file(d, src, strlen(src), CLPAR_OCL_BUILD_OPTIONS, path, sizeof path));
  assert_int_equal(strncmp(path, cache_dir, strlen(cache_dir)), 0);
  assert_int_equal(access(path, R_OK), 0);

  clpar_ocl_program_cache_clear(d);
  cl_program p3 = tu_ocl_get(d, "t1", src);
  clpar_ocl_program_stats s3 = tu_ocl_stats();
  assert_int_equal(s3.disk_loads, s2.disk_loads + 1);
  assert_int_equal(s3.source_builds, s2.source_builds);
  tu_ocl_check_twice_plus(d, p3, 2.0f, 1.0f);
}

typedef enum { FLIP_PAYLOAD, FLIP_HEADER, TRUNCATE, STALE } damage;

static void damage_file(const char *path, damage how, const char *other_path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  if (how == TRUNCATE) {
    assert_int_equal(truncate(path, st.st_size / 2), 0);
    return;
  }
  if (how == STALE) { /* a valid entry, but for another program */
    assert_int_equal(rename(other_path, path), 0);
    return;
  }
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  long at = how == FLIP_HEADER ? 20 /* inside the key */ : (long)(st.st_size * 2 / 3);
  assert_int_equal(fseek(f, at, SEEK_SET), 0);
  int c = fgetc(f);
  assert_int_equal(fseek(f, at, SEEK_SET), 0);
  fputc(c ^ 0x5a, f);
  fclose(f);
}

/* PoCL's CPU devices before 6.0 share loaded kernels between devices that build the same
 * program (ocl_program.c): each such device builds with a define of its own, so two of them
 * never share a program, in PoCL or on disk. */
static void test_pocl_cpu_devices_build_apart(void **state) {
  (void)state;
  clpar_ocl_device fake = {.cpu = 1};
  static const struct {
    int cpu;
    const char *version;
    int shares;
  } cases[] = {{1, "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, LLVM 15.0.6", 1},
               {1, "OpenCL 3.0 PoCL 5.0+debian  Linux", 1},
               {1, "OpenCL 3.0 PoCL 6.0  Linux", 0},
               {0, "OpenCL 3.0 PoCL 3.1 CUDA", 0},
               {1, "OpenCL 3.0 CUDA 12.4", 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fake.cpu = cases[i].cpu;
    snprintf(fake.platform_version, sizeof fake.platform_version, "%s", cases[i].version);
    assert_int_equal(clpar_ocl_pocl_shares_kernels(&fake), cases[i].shares);
  }
  const char *src = "__kernel void apart(__global float *x) { x[get_global_id(0)] = 1.0f; }";
  char path[2][1024];
  clpar_ocl_device *seen[2];
  int n = 0;
  for (int i = 0; i < clpar_device_count() && n < 2; i++) {
    clpar_device *dev = clpar_device_get(i);
    if (strcmp(dev->bd.iface->name, "opencl") != 0) continue;
    clpar_ocl_device *d = dev->bd.ctx;
    if (!clpar_ocl_pocl_shares_kernels(d)) continue;
    char options[512];
    cl_program p = tu_ocl_get(d, "apart", src);
    assert_int_equal(clGetProgramBuildInfo(p, d->device, CL_PROGRAM_BUILD_OPTIONS, sizeof options,
                                           options, NULL),
                     CL_SUCCESS);
    assert_non_null(strstr(options, "-D CLPAR_POCL_DEVICE="));
    tu_ok(clpar_ocl_cache_file(d, src, strlen(src), CLPAR_OCL_BUILD_OPTIONS, path[n],
                               sizeof path[n]));
    seen[n++] = d;
  }
  if (n == 2) {
    assert_ptr_not_equal(seen[0], seen[1]);
    assert_string_not_equal(path[0], path[1]);
  }
}

/* Builds a program, damages its disk entry, and checks that the next process-like load
 * rebuilds it from source, computes right, and leaves a good entry behind. */
static void check_rebuilt(damage how, const char *tag) {
  NEED_DEVICE(d);
  char src[512], other[512], path[1024], other_path[1024];
  tu_ocl_twice_plus_source(src, sizeof src, tag, 3.0f, -1.0f);
  tu_ocl_twice_plus_source(other, sizeof other, tag, 5.0f,
                           7.0f); /* same kernel name, other values */
  (void)tu_ocl_get(d, tag, src);
  (void)tu_ocl_get(d, "other", other);
  tu_ok(clpar_ocl_cache_file(d, src, strlen(src), CLPAR_OCL_BUILD_OPTIONS, path, sizeof path));
  tu_ok(clpar_ocl_cache_file(d, other, strlen(other), CLPAR_OCL_BUILD_OPTIONS, other_path,
                             sizeof other_path));
  damage_file(path, how, other_path);
  clpar_ocl_program_cache_clear(d);

  clpar_ocl_program_stats s0 = tu_ocl_stats();
  cl_program p = tu_ocl_get(d, tag, src);
  clpar_ocl_program_stats s1 = tu_ocl_stats();
  assert_int_equal(s1.source_builds, s0.source_builds + 1);
  assert_int_equal(s1.disk_rejects, s0.disk_rejects + 1);
  assert_int_equal(s1.disk_loads, s0.disk_loads);
  tu_ocl_check_twice_plus(d, p, 3.0f, -1.0f);

  clpar_ocl_program_cache_clear(d); /* the rewritten entry is good again */
  p = tu_ocl_get(d, tag, src);
  clpar_ocl_program_stats s2 = tu_ocl_stats();
  assert_int_equal(s2.disk_loads, s1.disk_loads + 1);
  assert_int_equal(s2.source_builds, s1.source_builds);
  tu_ocl_check_twice_plus(d, p, 3.0f, -1.0f);
}

static void test_corrupt_payload_rebuilt(void **state) {
  (void)state;
  check_rebuilt(FLIP_PAYLOAD, "corrupt_payload");
}

static void test_corrupt_header_rebuilt(void **state) {
  (void)state;
  check_rebuilt(FLIP_HEADER, "corrupt_header");
}

static void test_truncated_rebuilt(void **state) {
  (void)state;
  check_rebuilt(TRUNCATE, "truncated");
}

static void test_stale_rebuilt(void **state) {
  (void)state;
  check_rebuilt(STALE, "stale");
}

static int warnings;
static void count_warnings(clpar_log_level level, const char *msg, void *user) {
  (void)msg;
  (void)user;
  if (level == CLPAR_LOG_WARN) warnings++;
}

static void test_unusable_cache_dir(void **state) {
  (void)state;
  NEED_DEVICE(d);
  char src[512];
  tu_ocl_twice_plus_source(src, sizeof src, "no_disk", 1.0f, 2.0f);
  setenv("CLPAR_CACHE_DIR", "/proc/clpar-cannot-be-here/cache", 1);
  warnings = 0;
  clpar_log_set_callback(count_warnings, NULL);
  clpar_ocl_program_stats s0 = tu_ocl_stats();
  cl_program p = tu_ocl_get(d, "no_disk", src);
  clpar_log_set_callback(NULL, NULL);
  setenv("CLPAR_CACHE_DIR", cache_dir, 1);
  assert_int_equal(tu_ocl_stats().source_builds, s0.source_builds + 1);
  assert_true(warnings >= 1);
  tu_ocl_check_twice_plus(d, p, 1.0f, 2.0f);
}

/* ---- error names, device info, allocation failures ---- */

static void test_error_names(void **state) {
  (void)state;
  assert_string_equal(clpar_ocl_error_name(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES");
  assert_string_equal(clpar_ocl_error_name(CL_INVALID_DEVICE_PARTITION_COUNT),
                      "CL_INVALID_DEVICE_PARTITION_COUNT");
  assert_string_equal(clpar_ocl_error_name(-1001), "CL_PLATFORM_NOT_FOUND_KHR");
  assert_string_equal(clpar_ocl_error_name(-1234), "CL_UNKNOWN_ERROR(-1234)");
  assert_string_equal(clpar_ocl_clblast_status_name(-1009), "CLBlastInsufficientMemoryC");
  assert_string_equal(clpar_ocl_clblast_status_name(-2046), "CLBlastInvalidLocalMemUsage");
  assert_string_equal(clpar_ocl_clblast_status_name(7), "CLBlastUnknownStatus(7)");
  assert_int_equal(clpar_ocl_status(CL_MEM_OBJECT_ALLOCATION_FAILURE), CLPAR_ERROR_OUT_OF_MEMORY);
  assert_int_equal(clpar_ocl_status(CL_INVALID_KERNEL_ARGS), CLPAR_ERROR_BACKEND);
}

static void test_device_info_and_oversized_alloc(void **state) {
  (void)state;
  clpar_device *dev = tu_ocl_device();
  if (!dev) skip();
  const clpar_device_info *in = &dev->bd.info;
  assert_string_equal(in->backend, "opencl");
  assert_true(in->name[0] && in->platform[0] && in->driver_version[0]);
  assert_true(in->global_mem_bytes > 0 && in->max_alloc_bytes > 0 && in->compute_units > 0);
  assert_true(in->max_alloc_bytes <= in->global_mem_bytes);
  void *buf = NULL;
  clpar_status s = dev->bd.iface->alloc(dev->bd.ctx, (size_t)in->max_alloc_bytes + 4096, &buf);
  assert_true(s == CLPAR_ERROR_TOO_LARGE || s == CLPAR_ERROR_OUT_OF_MEMORY);
  assert_null(buf);
  assert_non_null(strstr(clpar_last_error(), "clCreateBuffer"));
}

/* ---- the backend's ops at odd offsets, against plain C ---- */

/* Entries run through the device's worker (clpar_dev_<entry>_sync), as the core runs them. */
typedef struct {
  const clpar_backend_iface *ifc; /* non-NULL when there is a device */
  clpar_device *ctx;
} backend;

static backend need_backend(void) {
  clpar_device *dev = tu_ocl_device();
  backend b = {NULL, NULL};
  if (dev) {
    b.ifc = dev->bd.iface;
    b.ctx = dev;
  }
  return b;
}

#define NEED_BACKEND(b)                            \
  backend b = need_backend();                      \
  if (!b.ifc) {                                    \
    print_message("no OpenCL device: skipping\n"); \
    skip();                                        \
  }

/* A buffer of n floats (plus a guard) holding host. */
/* n 4-byte elements (floats, or nll's int32 labels) */
static void *upload(backend b, const void *host, size_t n) {
  void *buf = NULL;
  tu_ok(clpar_dev_alloc(b.ctx, (n + 8) * sizeof(float), &buf));
  tu_ok(clpar_upload(b.ctx, buf, 0, host, n * sizeof(float)));
  return buf;
}

static float *download(backend b, void *buf, size_t n) {
  float *h = malloc(n * sizeof *h);
  assert_non_null(h);
  tu_ok(clpar_download(b.ctx, buf, 0, h, n * sizeof(float)));
  return h;
}

static void test_fill_scale_copy(void **state) {
  (void)state;
  NEED_BACKEND(b);
  enum { N = 1000, OFF = 3 };
  float *h = tu_rand(N + OFF, 1);
  void *buf = upload(b, h, N + OFF);
  tu_ok(clpar_dev_fill_sync(b.ctx, (clpar_bref){buf, OFF}, N - 10, 0.5f));
  tu_ok(clpar_dev_scale_sync(b.ctx, OFF, -3.0f, (clpar_bref){buf, 0}, (clpar_bref){buf, 0}));
  float *r = download(b, buf, N + OFF);
  for (size_t i = 0; i < N + OFF; i++) {
    float want = i < OFF ? -3.0f * h[i] : i < N - 10 + OFF ? 0.5f : h[i];
    assert_float_equal(r[i], want, 0);
  }
  free(r);
  /* overlapping copies within one buffer, both directions */
  tu_ok(clpar_upload(b.ctx, buf, 0, h, (N + OFF) * sizeof(float)));
  tu_ok(clpar_dev_copy_sync(b.ctx, buf, 40 * sizeof(float), buf, 10 * sizeof(float),
                            100 * sizeof(float)));
  tu_ok(clpar_dev_copy_sync(b.ctx, buf, 500 * sizeof(float), buf, 520 * sizeof(float),
                            100 * sizeof(float)));
  r = download(b, buf, N + OFF);
  for (size_t i = 40; i < 140; i++) assert_float_equal(r[i], h[i - 30], 0);
  for (size_t i = 500; i < 600; i++) assert_float_equal(r[i], h[i + 20], 0);
  free(r);
  clpar_dev_release(b.ctx, buf);
  free(h);
}

static void check_binary(backend b, clpar_binary_kind kind, size_t rows, size_t cols, size_t b_rows,
                         int in_place) {
  size_t n = rows * cols, aoff = 5, boff = 2, ooff = in_place ? aoff : 7;
  float *ha = tu_rand(n + aoff, 2), *hb = tu_rand(b_rows * cols + boff, 3);
  void *a = upload(b, ha, n + aoff), *bb = upload(b, hb, b_rows * cols + boff);
  void *out = a;
  if (!in_place) tu_ok(clpar_dev_alloc(b.ctx, (n + ooff) * sizeof(float), &out));
  tu_ok(clpar_dev_binary_sync(b.ctx, kind, rows, cols, (clpar_bref){a, aoff},
                              (clpar_bref){bb, boff}, b_rows, (clpar_bref){out, ooff}));
  float *r = download(b, out, n + ooff);
  for (size_t i = 0; i < n; i++) {
    float x = ha[aoff + i], y = hb[boff + (b_rows == 1 ? i % cols : i)];
    float want = kind == CLPAR_BINARY_ADD ? x + y : kind == CLPAR_BINARY_SUB ? x - y : x * y;
    assert_float_equal(r[ooff + i], want, 0);
  }
  free(r);
  if (!in_place) clpar_dev_release(b.ctx, out);
  clpar_dev_release(b.ctx, a);
  clpar_dev_release(b.ctx, bb);
  free(ha);
  free(hb);
}

static void test_binary(void **state) {
  (void)state;
  NEED_BACKEND(b);
  for (int k = CLPAR_BINARY_ADD; k <= CLPAR_BINARY_MUL; k++) {
    check_binary(b, (clpar_binary_kind)k, 37, 53, 37, 0);
    check_binary(b, (clpar_binary_kind)k, 37, 53, 1, 0);
    check_binary(b, (clpar_binary_kind)k, 300, 3, 1, 1);
    check_binary(b, (clpar_binary_kind)k, 1, 1, 1, 1);
  }
}

/* Covers the one-pass (wide or short) and the two-pass (narrow and long) shapes. */
static void test_sum_rows(void **state) {
  (void)state;
  NEED_BACKEND(b);
  static const size_t shapes[][2] = {{1, 7},    {3, 5},    {70, 1500}, {1000, 3},
                                     {4097, 1}, {333, 65}, {70001, 2}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    size_t rows = shapes[s][0], cols = shapes[s][1], off = 3;
    float *h = tu_rand(rows * cols + off, 4 + s);
    void *a = upload(b, h, rows * cols + off), *out = NULL;
    tu_ok(clpar_dev_alloc(b.ctx, (cols + 1) * sizeof(float), &out));
    tu_ok(clpar_dev_sum_rows_sync(b.ctx, rows, cols, (clpar_bref){a, off}, (clpar_bref){out, 1}));
    float *r = download(b, out, cols + 1), *want = malloc(cols * sizeof *want);
    for (size_t c = 0; c < cols; c++) {
      double acc = 0;
      for (size_t i = 0; i < rows; i++) acc += h[off + i * cols + c];
      want[c] = (float)acc;
    }
    tu_assert_close(r + 1, want, cols, 1e-5f, 1e-5f, "sum_rows");
    free(want);
    free(r);
    clpar_dev_release(b.ctx, a);
    clpar_dev_release(b.ctx, out);
    free(h);
  }
}

/* C = alpha op(A) op(B) + beta C at offsets, with C full of NaN when beta == 0: CLBlast must
 * not read C then (the interface's promise). */
static void check_gemm(backend b, int ta, int tb, size_t m, size_t n, size_t k, float beta) {
  size_t off = 3, lda = ta ? m : k, ldb = tb ? k : n;
  float *ha = tu_rand(m * k + off, 10), *hb = tu_rand(k * n + off, 11);
  float *hc = tu_rand(m * n + off, 12), *want = malloc(m * n * sizeof *want);
  if (beta == 0.0f)
    for (size_t i = 0; i < m * n + off; i++) hc[i] = NAN;
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < n; j++) {
      double acc = 0;
      for (size_t l = 0; l < k; l++)
        acc +=
            (double)ha[off + (ta ? l * m + i : i * k + l)] * hb[off + (tb ? j * k + l : l * n + j)];
      want[i * n + j] = (float)(1.5 * acc + (beta != 0.0f ? beta * hc[off + i * n + j] : 0.0));
    }
  void *a = upload(b, ha, m * k + off), *bb = upload(b, hb, k * n + off);
  void *c = upload(b, hc, m * n + off);
  tu_ok(clpar_dev_gemm_sync(b.ctx, ta, tb, m, n, k, 1.5f, (clpar_bref){a, off}, lda,
                            (clpar_bref){bb, off}, ldb, beta, (clpar_bref){c, off}, n));
  float *r = download(b, c, m * n + off);
  tu_assert_close(r + off, want, m * n, 1e-4f, 1e-4f, beta == 0.0f ? "gemm beta=0" : "gemm");
  free(r);
  clpar_dev_release(b.ctx, a);
  clpar_dev_release(b.ctx, bb);
  clpar_dev_release(b.ctx, c);
  free(ha);
  free(hb);
  free(hc);
  free(want);
}

static void test_gemm(void **state) {
  (void)state;
  NEED_BACKEND(b);
  for (int t = 0; t < 4; t++) {
    check_gemm(b, t & 1, t >> 1, 7, 9, 11, 0.0f);
    check_gemm(b, t & 1, t >> 1, 7, 9, 11, -2.0f);
  }
  /* m*n*k above every XGEMM_MIN_INDIRECT_SIZE^3 of CLBlast's database (704^3 by default):
   * the indirect kernel, with C padded through a temporary */
  check_gemm(b, 0, 0, 721, 710, 705, 0.0f);
  check_gemm(b, 1, 1, 721, 710, 705, 0.0f);
}

/* ---- training ops: the OpenCL backend against the host backend, entry by entry ---- */

typedef struct {
  backend o, h; /* OpenCL, host */
} both;

typedef struct {
  void *o, *h;
  size_t n;
} pair;

static pair pair_new(both *b, const void *data, size_t n) {
  pair p = {upload(b->o, data, n), upload(b->h, data, n), n};
  return p;
}

static pair pair_rand(both *b, size_t n, uint64_t seed, float lo, float hi) {
  float *h = tu_rand(n, seed);
  for (size_t i = 0; i < n; i++) h[i] = lo + (h[i] + 1.0f) * 0.5f * (hi - lo);
  pair p = pair_new(b, h, n);
  free(h);
  return p;
}

/* Compares the two copies and frees both. */
static void pair_check_free(both *b, pair p, float rtol, float atol, const char *what) {
  float *ro = download(b->o, p.o, p.n), *rh = download(b->h, p.h, p.n);
  tu_assert_close(ro, rh, p.n, rtol, atol, what);
  free(ro);
  free(rh);
  clpar_dev_release(b->o.ctx, p.o);
  clpar_dev_release(b->h.ctx, p.h);
}

static void pair_free(both *b, pair p) {
  clpar_dev_release(b->o.ctx, p.o);
  clpar_dev_release(b->h.ctx, p.h);
}

#define O(p, off) ((clpar_bref){(p).o, (off)})
#define H(p, off) ((clpar_bref){(p).h, (off)})
/* Runs one entry on both devices: CALL(side) with side O or H, on device ctx. */
#define BOTH(b, call)              \
  do {                             \
    clpar_device *ctx = (b).o.ctx; \
    tu_ok(call(O));                \
    ctx = (b).h.ctx;               \
    tu_ok(call(H));                \
  } while (0)

static both need_both(void) {
  both b = {need_backend(), {tu_host()->bd.iface, tu_host()}};
  return b;
}

static void test_activations(void **state) {
  (void)state;
  both b = need_both();
  if (!b.o.ifc) skip();
  enum { N = 1001, OFF = 3 };
  for (int k = CLPAR_UNARY_RELU; k <= CLPAR_UNARY_TANH; k++) {
    pair a = pair_rand(&b, N + OFF, 20 + k, -6.0f, 6.0f), g = pair_rand(&b, N + OFF, 30, -1, 1);
    pair y = pair_rand(&b, N + OFF, 40, 0, 1), dx = pair_rand(&b, N + OFF, 41, 0, 1);
#define UNARY(S) clpar_dev_unary_sync(ctx, (clpar_unary_kind)k, N, S(a, OFF), S(y, 1))
    BOTH(b, UNARY);
#define UNARY_BW(S) \
  clpar_dev_unary_backward_sync(ctx, (clpar_unary_kind)k, N, S(g, OFF), S(y, 1), S(dx, 2))
    BOTH(b, UNARY_BW);
#define UNARY_INPLACE(S) clpar_dev_unary_sync(ctx, (clpar_unary_kind)k, N, S(a, OFF), S(a, OFF))
    BOTH(b, UNARY_INPLACE);
    pair_check_free(&b, y, 1e-5f, 1e-6f, "unary");
    pair_check_free(&b, dx, 1e-5f, 1e-6f, "unary_backward");
    pair_check_free(&b, a, 1e-5f, 1e-6f, "unary in place");
    pair_free(&b, g);
  }
}

static void test_softmax_and_nll(void **state) {
  (void)state;
  both b = need_both();
  if (!b.o.ifc) skip();
  static const size_t shapes[][2] = {{37, 53}, {3, 1000}, {5, 1}, {1, 64}, {2, 65}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    size_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
    for (int lg = 0; lg < 2; lg++) {
      pair a = pair_rand(&b, n + 2, 50 + s, -30.0f, 30.0f), y = pair_rand(&b, n + 1, 51, 0, 1);
      pair g = pair_rand(&b, n + 3, 52, -1, 1), dx = pair_rand(&b, n, 53, 0, 1);
#define SOFTMAX(S) clpar_dev_softmax_sync(ctx, lg, rows, cols, S(a, 2), S(y, 1))
      BOTH(b, SOFTMAX);
#define SOFTMAX_BW(S) \
  clpar_dev_softmax_backward_sync(ctx, lg, rows, cols, S(y, 1), S(g, 3), S(dx, 0))
      BOTH(b, SOFTMAX_BW);
      pair_check_free(&b, y, 1e-5f, 1e-6f, lg ? "log_softmax" : "softmax");
      pair_check_free(&b, dx, 1e-4f, 1e-5f, lg ? "log_softmax backward" : "softmax backward");
      pair_free(&b, a);
      pair_free(&b, g);
    }
    int32_t *lab = malloc(rows * sizeof *lab); /* nll reads int32 labels */
    for (size_t r = 0; r < rows; r++) lab[r] = (int32_t)((r * 7 + 3) % cols);
    pair labels = pair_new(&b, lab, rows), a = pair_rand(&b, n + 1, 60, -3, 3);
    pair loss = pair_rand(&b, rows, 61, 0, 1), g = pair_rand(&b, rows, 62, -1, 1);
    pair dx = pair_rand(&b, n + 4, 63, 0, 1);
#define NLL(S) clpar_dev_nll_sync(ctx, rows, cols, S(a, 1), S(labels, 0), S(loss, 0))
    BOTH(b, NLL);
#define NLL_BW(S) clpar_dev_nll_backward_sync(ctx, rows, cols, S(labels, 0), S(g, 0), S(dx, 4))
    BOTH(b, NLL_BW);
    pair_check_free(&b, loss, 0, 0, "nll");
    pair_check_free(&b, dx, 0, 0, "nll backward");
    pair_free(&b, labels);
    pair_free(&b, a);
    pair_free(&b, g);
    free(lab);
  }
}

static void test_broadcast_rows(void **state) {
  (void)state;
  both b = need_both();
  if (!b.o.ifc) skip();
  static const size_t shapes[][2] = {{37, 53}, {300, 1}, {1, 9}};
  for (size_t s = 0; s < 3; s++) {
    size_t rows = shapes[s][0], cols = shapes[s][1];
    pair a = pair_rand(&b, cols + 5, 70, -1, 1), out = pair_rand(&b, rows * cols + 2, 71, -1, 1);
#define BCAST(S) clpar_dev_broadcast_rows_sync(ctx, rows, cols, S(a, 5), S(out, 2))
    BOTH(b, BCAST);
    pair_check_free(&b, out, 0, 0, "broadcast_rows");
    pair_free(&b, a);
  }
}

static void test_optimizers(void **state) {
  (void)state;
  both b = need_both();
  if (!b.o.ifc) skip();
  enum { N = 777 };
  static const clpar_sgd_args sgds[] = {{0.1f, 0.0f, 0.0f, 0.01f, 0, 1},
                                        {0.1f, 0.9f, 0.1f, 0.0f, 0, 1},
                                        {0.05f, 0.9f, 0.0f, 0.001f, 1, 1}};
  for (int v = 0; v < 3; v++) {
    pair p = pair_rand(&b, N + 1, 80, -1, 1), g = pair_rand(&b, N + 2, 81, -1, 1);
    pair buf = pair_rand(&b, N + 3, 82, -1, 1);
    clpar_sgd_args a = sgds[v];
    for (int step = 0; step < 3; step++, a.first = 0) {
#define SGD(S) clpar_dev_sgd_step_sync(ctx, N, S(p, 1), S(g, 2), S(buf, 3), a)
      BOTH(b, SGD);
    }
    pair_check_free(&b, p, 1e-5f, 1e-6f, "sgd param");
    pair_check_free(&b, buf, 1e-5f, 1e-6f, "sgd momentum buffer");
    pair_free(&b, g);
  }
  for (int decoupled = 0; decoupled < 2; decoupled++) {
    pair p = pair_rand(&b, N + 1, 90, -1, 1), g = pair_rand(&b, N + 2, 91, -1, 1);
    float *zeros = calloc(N + 4, sizeof(float));
    pair m = pair_new(&b, zeros, N + 3), v = pair_new(&b, zeros, N + 4);
    for (int t = 1; t <= 3; t++) {
      clpar_adam_args a = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.1f, 0.001f, 0, 0, 1e-5f, decoupled};
      a.step = a.lr / (1.0f - powf(a.beta1, (float)t));
      a.root2 = sqrtf(1.0f - powf(a.beta2, (float)t));
      a.keep = 1.0f - a.lr * a.weight_decay;
#define ADAM(S) clpar_dev_adam_step_sync(ctx, N, S(p, 1), S(g, 2), S(m, 3), S(v, 4), a)
      BOTH(b, ADAM);
    }
    pair_check_free(&b, p, 1e-5f, 1e-6f, "adam param");
    pair_check_free(&b, m, 1e-5f, 1e-7f, "adam m");
    pair_check_free(&b, v, 1e-5f, 1e-9f, "adam v");
    pair_free(&b, g);
    free(zeros);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_build_error_has_log),
      cmocka_unit_test(test_pocl_cpu_devices_build_apart),
      cmocka_unit_test(test_memory_then_disk),
      cmocka_unit_test(test_corrupt_payload_rebuilt),
      cmocka_unit_test(test_corrupt_header_rebuilt),
      cmocka_unit_test(test_truncated_rebuilt),
      cmocka_unit_test(test_stale_rebuilt),
      cmocka_unit_test(test_unusable_cache_dir),
      cmocka_unit_test(test_error_names),
      cmocka_unit_test(test_device_info_and_oversized_alloc),
      cmocka_unit_test(test_fill_scale_copy),
      cmocka_unit_test(test_binary),
      cmocka_unit_test(test_sum_rows),
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_activations),
      cmocka_unit_test(test_softmax_and_nll),
      cmocka_unit_test(test_broadcast_rows),
      cmocka_unit_test(test_optimizers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
