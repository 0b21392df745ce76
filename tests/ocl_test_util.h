/* ocl_test_util.h — helpers shared by the OpenCL backend's own tests (program building and
 * the kernel cache): running the one-kernel test program and checking what it computed. */
#ifndef CLPAR_OCL_TEST_UTIL_H
#define CLPAR_OCL_TEST_UTIL_H

#include "opencl/ocl_internal.h"

/* The program cache's counters now. */
clpar_ocl_program_stats tu_ocl_stats(void);

/* The source of one kernel, twice_plus: x[i] = mul * x[i] + add. The tag makes each test's
 * program (and disk entry) its own. */
void tu_ocl_twice_plus_source(char *buf, size_t size, const char *tag, float mul, float add);

/* The program built (or taken from the caches) for src on d, asserted to exist. */
cl_program tu_ocl_get(clpar_ocl_device *d, const char *name, const char *src);

/* Runs the kernel twice_plus (x[i] = mul * x[i] + add) of prog on 64 values on d's queue and
 * asserts that it computed exactly that: a cached binary of another program fails it. */
void tu_ocl_check_twice_plus(clpar_ocl_device *d, cl_program prog, float mul, float add);

#endif
