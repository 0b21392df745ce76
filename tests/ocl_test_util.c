/* ocl_test_util.c — helpers shared by the OpenCL backend's own tests (ocl_test_util.h). */
#include "ocl_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

clpar_device *tu_ocl_device(void) {
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_device *d = clpar_device_get(i);
    if (d && strcmp(d->bd.iface->name, "opencl") == 0) return d;
  }
  return NULL;
}

int tu_ocl_cache_dir_make(char *dir, size_t size, const char *tag) {
  snprintf(dir, size, "/tmp/clpar-test-%s-XXXXXX", tag);
  if (!mkdtemp(dir)) return -1;
  return setenv("CLPAR_CACHE_DIR", dir, 1) == 0 ? 0 : -1;
}

clpar_ocl_program_stats tu_ocl_stats(void) {
  clpar_ocl_program_stats s;
  clpar_ocl_program_stats_get(&s);
  return s;
}

void tu_ocl_twice_plus_source(char *buf, size_t size, const char *tag, float mul, float add) {
  snprintf(buf, size,
           "/* %s */\n__kernel void twice_plus(__global float *x) {\n"
           "  size_t i = get_global_id(0);\n  x[i] = %.1ff * x[i] + %.1ff;\n}\n",
           tag, mul, add);
}

cl_program tu_ocl_get(clpar_ocl_device *d, const char *name, const char *src) {
  cl_program p = NULL;
  tu_ok(clpar_ocl_program_get(d, name, src, strlen(src), CLPAR_OCL_BUILD_OPTIONS, &p));
  assert_non_null(p);
  return p;
}

void tu_ocl_check_twice_plus(clpar_ocl_device *d, cl_program prog, float mul, float add) {
  enum { N = 64 };
  float host[N], back[N];
  for (int i = 0; i < N; i++) host[i] = (float)i - 20.0f;
  cl_int err;
  cl_kernel k = clCreateKernel(prog, "twice_plus", &err);
  assert_int_equal(err, CL_SUCCESS);
  cl_mem m =
      clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
  assert_int_equal(err, CL_SUCCESS);
  size_t global = N;
  assert_int_equal(clSetKernelArg(k, 0, sizeof m, &m), CL_SUCCESS);
  assert_int_equal(clEnqueueNDRangeKernel(d->queue, k, 1, NULL, &global, NULL, 0, NULL, NULL),
                   CL_SUCCESS);
  assert_int_equal(clEnqueueReadBuffer(d->queue, m, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL),
                   CL_SUCCESS);
  for (int i = 0; i < N; i++) assert_float_equal(back[i], mul * host[i] + add, 0);
  clReleaseMemObject(m);
  clReleaseKernel(k);
}
