/* gemm.c — clpar's GEMM against the raw library call on the same device: CLBlastSgemm on an
 * OpenCL device, cublasSgemm on a CUDA device (when the CUDA module is built), OpenBLAS's
 * cblas_sgemm on the host device (when the host backend is built on a BLAS).
 *
 * For each n in 256, 512, 1024, 2048: C = A @ B through clpar_gemm (in place, beta 0) and
 * through the library on a context/stream of our own on the same device, timed in interleaved
 * rounds (both warmed up first; ABBA order; the best round of each counts). Prints one JSON object
 * per n with both GFLOP/s figures and their ratio (clpar / raw).
 *
 *   POCL_DEVICES=pthread ./bench_gemm [device-index] [n ...]
 *   CLPAR_DEVICES=cuda:0 ./bench_gemm
 *   CLPAR_DEVICES=host ./bench_gemm 0 512 1024 2048 */
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

/* The raw side: set up on device `ordinal` with A and B (n x n, row-major), time reps
 * products (seconds each), free. */
typedef struct {
  const char *name;
  void *(*setup)(int ordinal, size_t n, const float *a, const float *b);
  double (*time)(void *raw, size_t n, int reps);
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

static void *cl_setup(int ordinal, size_t n, const float *ha, const float *hb) {
  cl_device_id dev = bench_cl_device(ordinal);
  cl_raw *r = calloc(1, sizeof *r);
  cl_int err = dev && r ? CL_SUCCESS : CL_INVALID_DEVICE;
  size_t bytes = n * n * sizeof(float);
  if (err == CL_SUCCESS) r->ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (err == CL_SUCCESS) r->q = clCreateCommandQueue(r->ctx, dev, 0, &err);
  if (err == CL_SUCCESS)
    r->a =
        clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, (void *)ha, &err);
  if (err == CL_SUCCESS)
    r->b =
        clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, (void *)hb, &err);
  if (err == CL_SUCCESS) r->c = clCreateBuffer(r->ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
  if (err != CL_SUCCESS) {
    cl_release(r);
    return NULL;
  }
  return r;
}

static double cl_time(void *p, size_t n, int reps) {
  cl_raw *r = p;
  double t0 = bench_now();
  for (int i = 0; i < reps; i++)
    CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, n, n, n, 1.0f, r->a,
                 0, n, r->b, 0, n, 0.0f, r->c, 0, n, &r->q, NULL);
  clFinish(r->q);
  return (bench_now() - t0) / reps;
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

static void *blas_setup(int ordinal, size_t n, const float *ha, const float *hb) {
  (void)ordinal;
  blas_raw *r = calloc(1, sizeof *r);
  size_t bytes = n * n * sizeof(float);
  if (!r || posix_memalign((void **)&r->a, 64, bytes) ||
      posix_memalign((void **)&r->b, 64, bytes) || posix_memalign((void **)&r->c, 64, bytes)) {
    blas_release(r);
    return NULL;
  }
  memcpy(r->a, ha, bytes);
  memcpy(r->b, hb, bytes);
  return r;
}

static double blas_time(void *p, size_t n, int reps) {
  blas_raw *r = p;
  int in = (int)n;
  double t0 = bench_now();
  for (int i = 0; i < reps; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, in, in, 1.0f, r->a, in, r->b, in,
                0.0f, r->c, in);
  return (bench_now() - t0) / reps;
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

static void *cu_setup(int ordinal, size_t n, const float *ha, const float *hb) {
  cuda_raw *r = calloc(1, sizeof *r);
  size_t bytes = n * n * sizeof(float);
  int ok = r && cudaSetDevice(ordinal) == cudaSuccess;
  if (r) r->ordinal = ordinal;
  ok = ok && cudaMalloc((void **)&r->a, bytes) == cudaSuccess &&
       cudaMalloc((void **)&r->b, bytes) == cudaSuccess &&
       cudaMalloc((void **)&r->c, bytes) == cudaSuccess &&
       cudaMemcpy(r->a, ha, bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(r->b, hb, bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
       cublasCreate(&r->handle) == CUBLAS_STATUS_SUCCESS;
  if (!ok) {
    cu_release(r);
    return NULL;
  }
  return r;
}

/* Row-major C = A B is column-major C^T = B^T A^T: swap the operands, as clpar does. */
static double cu_time(void *p, size_t n, int reps) {
  cuda_raw *r = p;
  const float one = 1.0f, zero = 0.0f;
  int in = (int)n;
  cudaSetDevice(r->ordinal);
  double t0 = bench_now();
  for (int i = 0; i < reps; i++)
    cublasSgemm(r->handle, CUBLAS_OP_N, CUBLAS_OP_N, in, in, in, &one, r->b, in, r->a, in, &zero,
                r->c, in);
  cudaDeviceSynchronize();
  return (bench_now() - t0) / reps;
}

static const raw_impl cublas_impl = {"cublas", cu_setup, cu_time, cu_release};
#endif

/* ---- the comparison ---- */

static double time_clpar(clpar_tensor *a, clpar_tensor *b, clpar_tensor *c, int reps) {
  double t0 = bench_now();
  for (int i = 0; i < reps; i++) clpar_gemm(0, 0, 1.0f, a, b, 0.0f, c);
  clpar_device_synchronize(clpar_tensor_device(c));
  return (bench_now() - t0) / reps;
}

static int bench_n(clpar_device *dev, const raw_impl *impl, int ordinal, int64_t n) {
  size_t count = (size_t)(n * n);
  float *ha = malloc(count * sizeof *ha), *hb = malloc(count * sizeof *hb);
  for (size_t i = 0; i < count; i++) {
    ha[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    hb[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
  }
  int64_t shape[] = {n, n};
  clpar_tensor *a = NULL, *b = NULL, *c = NULL;
  void *raw = NULL;
  int rounds = 0;
  int ok = bench_ok(clpar_tensor_from_host(dev, 2, shape, ha, &a), "A") &&
           bench_ok(clpar_tensor_from_host(dev, 2, shape, hb, &b), "B") &&
           bench_ok(clpar_tensor_zeros(dev, 2, shape, &c), "C") &&
           (raw = impl->setup(ordinal, (size_t)n, ha, hb));
  if (ok) {
    /* Warm up both (kernel compilation), then size a round to ~0.1 s and run as many rounds
     * as fit in ~10 s (5 to 31), in ABBA order so that a drift in the machine's speed falls
     * on both sides; the best round of each counts. */
    time_clpar(a, b, c, 1);
    impl->time(raw, (size_t)n, 1);
    double one = time_clpar(a, b, c, 1);
    int reps = one > 0.1 ? 1 : (int)(0.1 / one) + 1;
    rounds = (int)(10.0 / (2.0 * one * reps));
    rounds = rounds < 5 ? 5 : rounds > 31 ? 31 : rounds;
    double best_clpar = 1e30, best_raw = 1e30;
    for (int round = 0; round < rounds; round++) {
      for (int side = 0; side < 2; side++) {
        if ((side == 0) == (round % 2 == 0)) {
          double t = time_clpar(a, b, c, reps);
          if (t < best_clpar) best_clpar = t;
        } else {
          double t = impl->time(raw, (size_t)n, reps);
          if (t < best_raw) best_raw = t;
        }
      }
    }
    double flop = 2.0 * (double)n * (double)n * (double)n;
    printf(
        "{\"bench\": \"gemm\", \"device\": \"%s\", \"n\": %lld, \"reps\": %d, \"rounds\": %d, "
        "\"clpar_gflops\": %.2f, \"%s_gflops\": %.2f, \"ratio\": %.4f}\n",
        clpar_device_id(dev), (long long)n, reps, rounds, flop / best_clpar / 1e9, impl->name,
        flop / best_raw / 1e9, best_raw / best_clpar);
    fflush(stdout);
  } else {
    fprintf(stderr, "n=%lld: set-up failed\n", (long long)n);
  }
  if (raw) impl->release(raw);
  clpar_tensor_free(a);
  clpar_tensor_free(b);
  clpar_tensor_free(c);
  free(ha);
  free(hb);
  return ok;
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
  int64_t sizes[16] = {256, 512, 1024, 2048};
  int ns = 4;
  if (argc > 2) {
    ns = 0;
    for (int i = 2; i < argc && ns < 16; i++) sizes[ns++] = atoll(argv[i]);
  }
  fprintf(stderr, "bench_gemm on %s (%s) against %s\n", info.id, info.name, impl->name);
  const char *colon = strchr(info.id, ':');
  int ordinal = colon ? atoi(colon + 1) : 0;
  int ok = 1;
  for (int i = 0; i < ns && ok; i++) ok = bench_n(dev, impl, ordinal, sizes[i]);
  clpar_shutdown();
  return ok ? 0 : 1;
}
