/* devices.c — the first thing to run on a new machine: lists the devices clpar sees (in the
 * order CLPAR_DEVICES or the default gives) and runs a GEMM on each, checked against the host
 * backend's result, with the time it took.
 *
 *   ./devices [n]                        every device, n x n GEMM (default 256)
 *   CLPAR_DEVICES=opencl:1,opencl:0 ./devices 512 */
#include <clpar/clpar.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "sample_util.h"

static clpar_status report(clpar_status s, const char *what) {
  if (s != CLPAR_OK)
    fprintf(stderr, "%s: %s: %s\n", what, clpar_status_name(s), clpar_last_error());
  return s;
}

/* out = A @ B on dev for the seeded A and B; *seconds is the second (warm) call's time. */
static clpar_status gemm_on(clpar_device *dev, int64_t n, float *out, double *seconds) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *a, *b, *r;
  int64_t shape[] = {n, n};
  clpar_status s = clpar_tensor_rand_uniform(dev, 2, shape, 1, -1, 1, &a);
  if (s == CLPAR_OK) s = clpar_tensor_rand_uniform(dev, 2, shape, 2, -1, 1, &b);
  if (s == CLPAR_OK) s = clpar_matmul(a, b, 0, 0, &r); /* compiles kernels: not timed */
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  double t0 = now_seconds();
  if (s == CLPAR_OK) s = clpar_matmul(a, b, 0, 0, &r);
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  *seconds = now_seconds() - t0;
  if (s == CLPAR_OK) s = clpar_tensor_read(r, out, (size_t)(n * n));
  clpar_scope_end(scope);
  return report(s, clpar_device_id(dev));
}

static void list_devices(void) {
  printf("clpar %s: %d device(s)\n", clpar_version(), clpar_device_count());
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_device_info in;
    clpar_device_get_info(clpar_device_get(i), &in);
    printf("  %-9s %-4s %s | %s | %d compute units, %.1f GiB, largest buffer %.1f GiB\n", in.id,
           in.type == CLPAR_DEVICE_GPU   ? "GPU"
           : in.type == CLPAR_DEVICE_CPU ? "CPU"
                                         : "other",
           in.name, in.platform[0] ? in.platform : in.backend, in.compute_units,
           (double)in.global_mem_bytes / (1 << 30), (double)in.max_alloc_bytes / (1 << 30));
  }
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 256;
  if (n < 1 || n > 8192) {
    fprintf(stderr, "usage: %s [n], 1 <= n <= 8192\n", argv[0]);
    return 2;
  }
  if (report(clpar_init(), "clpar_init") != CLPAR_OK) return 1;
  list_devices();
  size_t count = (size_t)(n * n);
  float *ref = malloc(count * sizeof *ref), *got = malloc(count * sizeof *got);
  double secs;
  int failures = 0;
  printf("\nGEMM %lld x %lld on each device, against the host backend:\n", (long long)n,
         (long long)n);
  if (!ref || !got || gemm_on(clpar_device_host(), n, ref, &secs) != CLPAR_OK) failures++;
  for (int i = 0; !failures && i < clpar_device_count(); i++) {
    clpar_device *dev = clpar_device_get(i);
    if (gemm_on(dev, n, got, &secs) != CLPAR_OK) {
      failures++;
      continue;
    }
    double worst = 0;
    for (size_t j = 0; j < count; j++) {
      double d = fabs((double)got[j] - ref[j]) / (1.0 + fabs((double)ref[j]));
      if (d > worst) worst = d;
    }
    int ok = worst < 1e-4;
    failures += !ok;
    printf("  %-9s %8.2f ms  %7.2f GFLOP/s  max rel. diff %.1e  %s\n", clpar_device_id(dev),
           secs * 1e3, 2.0 * (double)n * n * n / secs / 1e9, worst, ok ? "ok" : "WRONG");
  }
  free(ref);
  free(got);
  clpar_shutdown();
  printf("%s\n", failures ? "FAILED" : "every device agrees with the host backend");
  return failures ? 1 : 0;
}
