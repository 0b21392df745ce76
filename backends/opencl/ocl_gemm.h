/* ocl_gemm.h — private to the OpenCL backend: the GEMM's rules that the tuner (ocl_tune.c)
 * follows too. ocl_gemm.c implements them; the tuner depends on this header, never the
 * other way round. */
#ifndef CLPAR_OCL_GEMM_H
#define CLPAR_OCL_GEMM_H

#include "ocl_internal.h"

/* Held around a device's first CLBlast GEMM (ocl_gemm.c), around every one on a PoCL CPU
 * device before 6.0 (clblast_serial), and by the tuner throughout: CLBlast's compilation
 * races when two devices compile at once. */
extern pthread_mutex_t clpar_ocl_gemm_warmup_lock;

/* Whether ocl_gemm runs this GEMM with gemm_small.cl rather than CLBlast (CPU devices only;
 * the tuner leaves such shapes out: CLBlast never runs them). */
int clpar_ocl_gemm_takes_small(const clpar_ocl_device *d, int trans_a, int trans_b, size_t m,
                               size_t n, size_t k);

#endif
