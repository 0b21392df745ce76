/* ocl_test_util.h — helpers shared by the OpenCL backend's own tests (program building, the
 * kernel cache, the tuners): the device and a fresh cache directory, running the one-kernel
 * test program and checking what it computed. */
#ifndef CLPAR_OCL_TEST_UTIL_H
#define CLPAR_OCL_TEST_UTIL_H

#include "opencl/ocl_internal.h"

/* The first selected OpenCL device, or NULL. */
clpar_device *tu_ocl_device(void);

/* Declares d, the backend context of that device, or skips the test. */
#define NEED_DEVICE(d)                             \
  clpar_device *d##_dev = tu_ocl_device();         \
  if (!d##_dev) {                                  \
    print_message("no OpenCL device: skipping\n"); \
    skip();                                        \
  }                                                \
  clpar_ocl_device *d = d##_dev->bd.ctx

/* A fresh directory dir (from the mkdtemp template /tmp/clpar-test-<tag>-XXXXXX) made the
 * kernel and tuning cache (CLPAR_CACHE_DIR); 0, or -1 where it could not be made. */
int tu_ocl_cache_dir_make(char *dir, size_t size, const char *tag);

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
