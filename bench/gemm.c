/* gemm.c — clpar's GEMM against the raw library call on the same device: CLBlastSgemm on an
 * OpenCL device, cublasSgemm on a CUDA device (when the CUDA module is built), OpenBLAS's
 * cblas_sgemm on the host device (when the host backend is built on a BLAS).
 *
 * For each shape (default n x n x n for n in 256, 512, 1024, 2048): C = op(A) @ op(B) through
 * clpar_gemm (in place, beta 0) and through the library on a context/stream of our own on the
 * same device, timed in interleaved rounds (both warmed up first; ABBA order; the best round of
 * each counts). Prints one JSON object per shape with both GFLOP/s figures and their ratio
 * (clpar / raw). A shape is n (square, no transpose) or MxNxK with an optional :nn, :nt, :tn or
 * :tt (A, then B transposed or not; row-major, as clpar_gemm): on a CPU OpenCL device clpar
 * runs some of them with its own small-GEMM kernel instead of CLBlast (ocl_gemm), which this
 * compares against CLBlast on the same shape.
 *
 *   POCL_DEVICES=pthread ./bench_gemm [device-index] [shape ...]
 *   CLPAR_DEVICES=cuda:0 ./bench_gemm
 *   CLPAR_DEVICES=host ./bench_gemm 0 512 1024 2048
 *   POCL_DEVICES=basic ./bench_gemm 0 120x1024x1024:nt 512x4608x16:nt */
#ifdef BENCH_HAVE_OPENCL
#include <CL/cl.h>
#include <clblast_c.h>
#endif
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#ifdef BENCH_HAVE_BLAS
#include <cblas.h>
#endif
#ifdef BENCH_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

/* C [m, n] = op(A) op(B), row-major: A is [m, k] ([k, m] when ta), B [k, n] ([n, k] when tb). */
typedef struct {
  int64_t m, n, k;
  int ta, tb;
} shape;

static size_t lda_of(const shape *s) {
  return (size_t)(s->ta ? s->m : s->k);
}
static size_t ldb_of(const shape *s) {
  return (size_t)(s->tb ? s->k : s->n);
}

/* The raw side: set up on device `ordinal` with A and B, time reps products (seconds each),
 * free. */
typedef struct {
  const char *name;
  void *(*setup)(int ordinal, const shape *s, const float *a, const float *b);
  double (*time)(void *raw, const shape *s, int reps);
  void (*release)(void *raw);
} raw_impl;

/* ---- CLBlast ---- */
#ifdef BENCH_HAVE_OPENCL

typedef struct {
  cl_context ctx;
  cl_command_queue q;
  cl_mem a, b, c;
} cl_raw;

static void cl_release(void *p) {
  cl_raw *r = p;
  if (!r) return;
  if (r->a) clReleaseMemObject(r->a);
  if (r->b) clReleaseMemObject(r->b);
  if (r->c) clReleaseMemObject(r->c);
  if (r->q) clReleaseCommandQueue(r->q);
  if (r->ctx) clReleaseContext(r->ctx);
  free(r);
}

static void *cl_setup(int ordinal, const shape *s, const float *ha, const float *hb) {
  cl_device_id dev = bench_cl_device(ordinal);
  cl_raw *r = calloc(1, sizeof *r);
  cl_int err = dev && r ? CL_SUCCESS : CL_INVALID_DEVICE;
  size_t fl = sizeof(float), a_bytes = (size_t)(s->m * s->k) * fl,
         b_bytes = (size_t)(s->k * s->n) * fl, c_bytes = (size_t)(s->m * s->n) * fl;
  if (err == CL_SUCCESS) r->ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (err == CL_SUCCESS) r->q = clCreateCommandQueue(r->ctx, dev, 0, &err);
  if (err == CL_SUCCESS)
    r->a =
        clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, a_bytes, (void *)ha, &err);
  if (err == CL_SUCCESS)
    r->b =
        clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, b_bytes, (void *)hb, &err);
  if (err == CL_SUCCESS) r->c = clCreateBuffer(r->ctx, CL_MEM_READ_WRITE, c_bytes, NULL, &err);
  if (err != CL_SUCCESS) {
    cl_release(r);
    return NULL;
  }
  return r;
}

static double cl_time(void *p, const shape *s, int reps) {
  cl_raw *r = p;
  double t0 = now_seconds();
  for (int i = 0; i < reps; i++)
    CLBlastSgemm(CLBlastLayoutRowMajor, s->ta ? CLBlastTransposeYes : CLBlastTransposeNo,
                 s->tb ? CLBlastTransposeYes : CLBlastTransposeNo, (size_t)s->m, (size_t)s->n,
                 (size_t)s->k, 1.0f, r->a, 0, lda_of(s), r->b, 0, ldb_of(s), 0.0f, r->c, 0,
                 (size_t)s->n, &r->q, NULL);
  clFinish(r->q);
  return (now_seconds() - t0) / reps;
}

static const raw_impl clblast_impl = {"clblast", cl_setup, cl_time, cl_release};
#endif

/* ---- OpenBLAS (the host backend's own BLAS), called on this thread ---- */

#ifdef BENCH_HAVE_BLAS
typedef struct {
  float *a, *b, *c;
} blas_raw;

static void blas_release(void *p) {
  blas_raw *r = p;
  if (!r) return;
  free(r->a);
  free(r->b);
  free(r->c);
  free(r);
}

static void *blas_setup(int ordinal, const shape *s, const float *ha, const float *hb) {
  (void)ordinal;
  blas_raw *r = calloc(1, sizeof *r);
  size_t fl = sizeof(float), a_bytes = (size_t)(s->m * s->k) * fl,
         b_bytes = (size_t)(s->k * s->n) * fl, c_bytes = (size_t)(s->m * s->n) * fl;
  if (!r || posix_memalign((void **)&r->a, 64, a_bytes) ||
      posix_memalign((void **)&r->b, 64, b_bytes) || posix_memalign((void **)&r->c, 64, c_bytes)) {
    blas_release(r);
    return NULL;
  }
  memcpy(r->a, ha, a_bytes);
  memcpy(r->b, hb, b_bytes);
  return r;
}

static double blas_time(void *p, const shape *s, int reps) {
  blas_raw *r = p;
  double t0 = now_seconds();
  for (int i = 0; i < reps; i++)
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                (int)s->m, (int)s->n, (int)s->k, 1.0f, r->a, (int)lda_of(s), r->b, (int)ldb_of(s),
                0.0f, r->c, (int)s->n);
  return (now_seconds() - t0) / reps;
}

static const raw_impl blas_impl = {"openblas", blas_setup, blas_time, blas_release};
#endif

/* ---- cuBLAS ---- */

#ifdef BENCH_HAVE_CUDA
typedef struct {
  int ordinal;
  cublasHandle_t handle;
  float *a, *b, *c;
} cuda_raw;

static void cu_release(void *p) {
  cuda_raw *r = p;
  if (!r) return;
  cudaSetDevice(r->ordinal);
  cudaFree(r->a);
  cudaFree(r->b);
  cudaFree(r->c);
  if (r->handle) cublasDestroy(r->handle);
  free(r);
}

static void *cu_setup(int ordinal, const shape *s, const float *ha, const float *hb) {
  cuda_raw *r = calloc(1, sizeof *r);
  size_t fl = sizeof(float), a_bytes = (size_t)(s->m * s->k) * fl,
         b_bytes = (size_t)(s->k * s->n) * fl, c_bytes = (size_t)(s->m * s->n) * fl;
  int ok = r && cudaSetDevice(ordinal) == cudaSuccess;
  if (r) r->ordinal = ordinal;
  ok = ok && cudaMalloc((void **)&r->a, a_bytes) == cudaSuccess &&
       cudaMalloc((void **)&r->b, b_bytes) == cudaSuccess &&
       cudaMalloc((void **)&r->c, c_bytes) == cudaSuccess &&
       cudaMemcpy(r->a, ha, a_bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(r->b, hb, b_bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
       cublasCreate(&r->handle) == CUBLAS_STATUS_SUCCESS;
  if (!ok) {
    cu_release(r);
    return NULL;
  }
  return r;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, as
 * clpar does. */
static double cu_time(void *p, const shape *s, int reps) {
  cuda_raw *r = p;
  const float one = 1.0f, zero = 0.0f;
  cudaSetDevice(r->ordinal);
  double t0 = now_seconds();
  for (int i = 0; i < reps; i++)
    cublasSgemm(r->handle, s->tb ? CUBLAS_OP_T : CUBLAS_OP_N, s->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                (int)s->n, (int)s->m, (int)s->k, &one, r->b, (int)ldb_of(s), r->a, (int)lda_of(s),
                &zero, r->c, (int)s->n);
  cudaDeviceSynchronize();
  return (now_seconds() - t0) / reps;
}

static const raw_impl cublas_impl = {"cublas", cu_setup, cu_time, cu_release};
#endif

/* ---- the comparison ---- */

static double time_clpar(const shape *s, clpar_tensor *a, clpar_tensor *b, clpar_tensor *c,
                         int reps) {
  double t0 = now_seconds();
  for (int i = 0; i < reps; i++) clpar_gemm(s->ta, s->tb, 1.0f, a, b, 0.0f, c);
  clpar_device_synchronize(clpar_tensor_device(c));
  return (now_seconds() - t0) / reps;
}

static int bench_shape(clpar_device *dev, const raw_impl *impl, int ordinal, const shape *s) {
  size_t a_count = (size_t)(s->m * s->k), b_count = (size_t)(s->k * s->n);
  float *ha = malloc(a_count * sizeof *ha), *hb = malloc(b_count * sizeof *hb);
  for (size_t i = 0; ha && i < a_count; i++) ha[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
  for (size_t i = 0; hb && i < b_count; i++) hb[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
  int64_t a_shape[] = {s->ta ? s->k : s->m, s->ta ? s->m : s->k},
          b_shape[] = {s->tb ? s->n : s->k, s->tb ? s->k : s->n}, c_shape[] = {s->m, s->n};
  clpar_tensor *a = NULL, *b = NULL, *c = NULL;
  void *raw = NULL;
  int rounds = 0;
  int ok = ha && hb && bench_ok(clpar_tensor_from_host(dev, 2, a_shape, ha, &a), "A") &&
           bench_ok(clpar_tensor_from_host(dev, 2, b_shape, hb, &b), "B") &&
           bench_ok(clpar_tensor_zeros(dev, 2, c_shape, &c), "C") &&
           (raw = impl->setup(ordinal, s, ha, hb));
  if (ok) {
    /* Warm up both (kernel compilation), then size a round to ~0.1 s and run as many rounds
     * as fit in ~10 s (5 to 31), in ABBA order so that a drift in the machine's speed falls
     * on both sides; the best round of each counts. */
    time_clpar(s, a, b, c, 1);
    impl->time(raw, s, 1);
    double one = time_clpar(s, a, b, c, 1);
    int reps = one > 0.1 ? 1 : (int)(0.1 / one) + 1;
    rounds = (int)(10.0 / (2.0 * one * reps));
    rounds = rounds < 5 ? 5 : rounds > 31 ? 31 : rounds;
    double best_clpar = 1e30, best_raw = 1e30;
    for (int round = 0; round < rounds; round++) {
      for (int side = 0; side < 2; side++) {
        if ((side == 0) == (round % 2 == 0)) {
          double t = time_clpar(s, a, b, c, reps);
          if (t < best_clpar) best_clpar = t;
        } else {
          double t = impl->time(raw, s, reps);
          if (t < best_raw) best_raw = t;
        }
      }
    }
    double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
    printf(
        "{\"bench\": \"gemm\", \"device\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
        "\"trans\": \"%c%c\", \"reps\": %d, \"rounds\": %d, \"clpar_gflops\": %.2f, "
        "\"%s_gflops\": %.2f, \"ratio\": %.4f}\n",
        clpar_device_id(dev), (long long)s->m, (long long)s->n, (long long)s->k, s->ta ? 't' : 'n',
        s->tb ? 't' : 'n', reps, rounds, flop / best_clpar / 1e9, impl->name, flop / best_raw / 1e9,
        best_raw / best_clpar);
    fflush(stdout);
  } else {
    fprintf(stderr, "%lldx%lldx%lld: set-up failed\n", (long long)s->m, (long long)s->n,
            (long long)s->k);
  }
  if (raw) impl->release(raw);
  clpar_tensor_free(a);
  clpar_tensor_free(b);
  clpar_tensor_free(c);
  free(ha);
  free(hb);
  return ok;
}

/* "n", or "MxNxK" with an optional ":nn", ":nt", ":tn" or ":tt". */
static int parse_shape(const char *text, shape *s) {
  char *end;
  long long v[3];
  const char *p = text;
  int dims = 0;
  for (; dims < 3; dims++) {
    v[dims] = strtoll(p, &end, 10);
    if (end == p || v[dims] < 1 || v[dims] > 65536) return 0;
    p = end;
    if (*p != 'x') break;
    p++;
  }
  if (dims == 0 && *p == '\0') {
    *s = (shape){v[0], v[0], v[0], 0, 0};
    return 1;
  }
  if (dims != 2) return 0;
  *s = (shape){v[0], v[1], v[2], 0, 0};
  if (*p == '\0') return 1;
  if (p[0] != ':' || (p[1] != 'n' && p[1] != 't') || (p[2] != 'n' && p[2] != 't') || p[3]) return 0;
  s->ta = p[1] == 't';
  s->tb = p[2] == 't';
  return 1;
}

int main(int argc, char **argv) {
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  int index = argc > 1 ? atoi(argv[1]) : 0;
  clpar_device *dev = clpar_device_get(index);
  clpar_device_info info;
  const raw_impl *impl = NULL;
  if (dev && clpar_device_get_info(dev, &info) == CLPAR_OK) {
#ifdef BENCH_HAVE_OPENCL
    if (strcmp(info.backend, "opencl") == 0) impl = &clblast_impl;
#endif
#ifdef BENCH_HAVE_BLAS
    if (strcmp(info.backend, "host") == 0) impl = &blas_impl;
#endif
#ifdef BENCH_HAVE_CUDA
    if (strcmp(info.backend, "cuda") == 0) impl = &cublas_impl;
#endif
  }
  if (!impl) {
    fprintf(stderr,
            "device %d is not an OpenCL device, a CUDA device (with the CUDA module) or the "
            "host device on a BLAS; set CLPAR_DEVICES\n",
            index);
    clpar_shutdown();
    return 1;
  }
  shape shapes[16] = {{256, 256, 256, 0, 0},
                      {512, 512, 512, 0, 0},
                      {1024, 1024, 1024, 0, 0},
                      {2048, 2048, 2048, 0, 0}};
  int ns = 4;
  if (argc > 2) {
    ns = 0;
    for (int i = 2; i < argc && ns < 16; i++)
      if (!parse_shape(argv[i], &shapes[ns++])) {
        fprintf(stderr,
                "bench_gemm: '%s' is not a shape: give n, or MxNxK with an optional :nn, :nt, "
                ":tn or :tt (sizes 1 to 65536)\n",
                argv[i]);
        clpar_shutdown();
        return 1;
      }
  }
  fprintf(stderr, "bench_gemm on %s (%s) against %s\n", info.id, info.name, impl->name);
  const char *colon = strchr(info.id, ':');
  int ordinal = colon ? atoi(colon + 1) : 0;
  int ok = 1;
  for (int i = 0; i < ns && ok; i++) ok = bench_shape(dev, impl, ordinal, &shapes[i]);
  clpar_shutdown();
  return ok ? 0 : 1;
}
