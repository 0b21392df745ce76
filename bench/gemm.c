/* gemm.c — clpar's GEMM against a raw CLBlastSgemm call on the same OpenCL device.
 *
 * For each n in 256, 512, 1024, 2048: C = A @ B through clpar_gemm (in place, beta 0) and
 * through CLBlastSgemm on a context and queue of our own on the same cl_device_id, timed in
 * interleaved rounds (best round of each counts, both warmed up first). Prints one JSON object
 * per n with both GFLOP/s figures and their ratio (clpar / raw).
 *
 *   POCL_DEVICES=pthread ./bench_gemm [device-index] [n ...] */
#include <CL/cl.h>
#include <clblast_c.h>
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The cl_device_id behind "opencl:N": the backend numbers devices across platforms in
 * enumeration order, as we do here. */
static cl_device_id find_cl_device(int ordinal) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS) return NULL;
  for (cl_uint p = 0; p < np; p++) {
    cl_device_id devs[64];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 64, devs, &nd) != CL_SUCCESS) continue;
    if (ordinal < (int)nd) return devs[ordinal];
    ordinal -= (int)nd;
  }
  return NULL;
}

typedef struct {
  cl_context ctx;
  cl_command_queue q;
  cl_mem a, b, c;
} raw_gemm;

static int raw_setup(raw_gemm *r, cl_device_id dev, size_t n, const float *ha, const float *hb) {
  cl_int err;
  r->ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (err != CL_SUCCESS) return 0;
  r->q = clCreateCommandQueue(r->ctx, dev, 0, &err);
  size_t bytes = n * n * sizeof(float);
  r->a = clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, (void *)ha, &err);
  r->b = clCreateBuffer(r->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, (void *)hb, &err);
  r->c = clCreateBuffer(r->ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
  return err == CL_SUCCESS;
}

static void raw_free(raw_gemm *r) {
  clReleaseMemObject(r->a);
  clReleaseMemObject(r->b);
  clReleaseMemObject(r->c);
  clReleaseCommandQueue(r->q);
  clReleaseContext(r->ctx);
}

static double time_raw(raw_gemm *r, size_t n, int reps) {
  double t0 = bench_now();
  for (int i = 0; i < reps; i++)
    CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, n, n, n, 1.0f, r->a,
                 0, n, r->b, 0, n, 0.0f, r->c, 0, n, &r->q, NULL);
  clFinish(r->q);
  return (bench_now() - t0) / reps;
}

static double time_clpar(clpar_tensor *a, clpar_tensor *b, clpar_tensor *c, int reps) {
  double t0 = bench_now();
  for (int i = 0; i < reps; i++) clpar_gemm(0, 0, 1.0f, a, b, 0.0f, c);
  clpar_device_synchronize(clpar_tensor_device(c));
  return (bench_now() - t0) / reps;
}

static int bench_n(clpar_device *dev, cl_device_id cldev, int64_t n) {
  size_t count = (size_t)(n * n);
  float *ha = malloc(count * sizeof *ha), *hb = malloc(count * sizeof *hb);
  for (size_t i = 0; i < count; i++) {
    ha[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    hb[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
  }
  int64_t shape[] = {n, n};
  clpar_tensor *a = NULL, *b = NULL, *c = NULL;
  raw_gemm raw;
  int ok = clpar_tensor_from_host(dev, 2, shape, ha, &a) == CLPAR_OK &&
           clpar_tensor_from_host(dev, 2, shape, hb, &b) == CLPAR_OK &&
           clpar_tensor_zeros(dev, 2, shape, &c) == CLPAR_OK &&
           raw_setup(&raw, cldev, (size_t)n, ha, hb);
  if (!ok) {
    fprintf(stderr, "n=%lld: set-up failed: %s\n", (long long)n, clpar_last_error());
    return 0;
  }
  /* Warm up both (kernel compilation), then size the repetitions to ~0.3 s a round. */
  double one = time_clpar(a, b, c, 1);
  time_raw(&raw, (size_t)n, 1);
  one = time_clpar(a, b, c, 1);
  int reps = one > 0.3 ? 1 : (int)(0.3 / one) + 1;
  double best_clpar = 1e30, best_raw = 1e30;
  for (int round = 0; round < 5; round++) {
    double t = time_clpar(a, b, c, reps);
    if (t < best_clpar) best_clpar = t;
    t = time_raw(&raw, (size_t)n, reps);
    if (t < best_raw) best_raw = t;
  }
  double flop = 2.0 * (double)n * (double)n * (double)n;
  printf(
      "{\"bench\": \"gemm\", \"device\": \"%s\", \"n\": %lld, \"reps\": %d, \"rounds\": 5, "
      "\"clpar_gflops\": %.2f, \"clblast_gflops\": %.2f, \"ratio\": %.4f}\n",
      clpar_device_id(dev), (long long)n, reps, flop / best_clpar / 1e9, flop / best_raw / 1e9,
      best_raw / best_clpar);
  fflush(stdout);
  raw_free(&raw);
  clpar_tensor_free(a);
  clpar_tensor_free(b);
  clpar_tensor_free(c);
  free(ha);
  free(hb);
  return 1;
}

int main(int argc, char **argv) {
  if (clpar_init() != CLPAR_OK) {
    fprintf(stderr, "clpar_init: %s\n", clpar_last_error());
    return 1;
  }
  int index = argc > 1 ? atoi(argv[1]) : 0;
  clpar_device *dev = clpar_device_get(index);
  clpar_device_info info;
  if (!dev || clpar_device_get_info(dev, &info) != CLPAR_OK ||
      strcmp(info.backend, "opencl") != 0) {
    fprintf(stderr, "device %d is not an OpenCL device (set CLPAR_DEVICES)\n", index);
    clpar_shutdown();
    return 1;
  }
  cl_device_id cldev = find_cl_device(atoi(strchr(info.id, ':') + 1));
  int64_t sizes[16] = {256, 512, 1024, 2048};
  int ns = 4;
  if (argc > 2) {
    ns = 0;
    for (int i = 2; i < argc && ns < 16; i++) sizes[ns++] = atoll(argv[i]);
  }
  fprintf(stderr, "bench_gemm on %s (%s)\n", info.id, info.name);
  int ok = 1;
  for (int i = 0; i < ns && ok; i++) ok = bench_n(dev, cldev, sizes[i]);
  clpar_shutdown();
  return ok ? 0 : 1;
}
