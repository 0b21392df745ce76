/* ocl_test_util.c — helpers shared by the OpenCL backend's own tests (ocl_test_util.h). */
#include "ocl_test_util.h"

#include "test_util.h"

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
