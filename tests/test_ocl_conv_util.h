/* test_ocl_conv_util.h — what the OpenCL convolution tests (test_ocl_conv.c, the forward;
 * test_ocl_conv_bwd.c, the backward) share: their set-up (a cache directory of their own, no
 * variable forcing a choice), the device or the test skipped, a shape's inputs and options,
 * the device's convolution entry file, and the entry's counters between two reads. */
#ifndef CLPAR_TEST_OCL_CONV_UTIL_H
#define CLPAR_TEST_OCL_CONV_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "ocl_conv_shapes.h"
#include "opencl/ocl_conv_algo.h"

/* Group set-up: a fresh cache directory /tmp/clpar-test-<tag>-XXXXXX made CLPAR_CACHE_DIR,
 * CLPAR_TUNE, CLPAR_OCL_CONV and CLPAR_OCL_CONV_BWD unset, then tu_setup. */
int tcu_setup(void **state, const char *tag);
/* Group tear-down: tu_teardown, the cache directory removed. */
int tcu_teardown(void **state);

/* The backend context of the OpenCL device dev. */
clpar_ocl_device *tcu_ocl_of(clpar_device *dev);
/* The first OpenCL device, or the test skipped; its backend context into *d unless d is NULL. */
clpar_device *tcu_need_ocl(clpar_ocl_device **d);

/* s's convolution options: stride, padding, dilation, groups. */
clpar_conv2d_options tcu_opt_of(const cshape *s);
/* s's input x (N, C, H, W) and weight w (O, C / groups, KH, KW) on dev, random from seed and
 * seed + 1. */
void tcu_inputs(clpar_device *dev, const cshape *s, uint64_t seed, clpar_tensor **x,
                clpar_tensor **w);

/* The path of d's convolution entry file into path, the file removed. */
void tcu_entry_removed(clpar_ocl_device *d, char *path, size_t size);
/* d's entry file made of the len bytes of body (mode 0600). */
void tcu_write_entry(clpar_ocl_device *d, const char *body, size_t len);
/* The header an entry for d starts with (as ocl_conv_cache.c writes it). */
void tcu_header(clpar_ocl_device *d, char *out, size_t size);
/* d's counters now less those in *a, field by field, into *b. */
void tcu_stats_since(clpar_ocl_device *d, const clpar_ocl_conv_stats *a, clpar_ocl_conv_stats *b);

#endif
