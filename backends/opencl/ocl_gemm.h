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

/* Whether ocl_gemm runs this GEMM with gemm_tile.cl rather than gemm_small or CLBlast (CPU
 * devices only), and that run (ocl_gemm_tile.c); batch 1 is a plain GEMM. */
int clpar_ocl_gemm_takes_tile(const clpar_ocl_device *d, int trans_a, int trans_b, size_t m,
                              size_t n, size_t k, size_t lda, size_t ldb, size_t ldc);
clpar_status clpar_ocl_gemm_tile(clpar_ocl_device *d, int trans_a, int trans_b, size_t m, size_t n,
                                 size_t k, float alpha, clpar_bref a, size_t lda, size_t stride_a,
                                 clpar_bref b, size_t ldb, size_t stride_b, float beta,
                                 clpar_bref c, size_t ldc, size_t stride_c, size_t batch);

/* CLBlast's Xconvgemm on s (one group, no bias) into y, under d->lock and the warm-up rules of
 * every CLBlast call (ocl_gemm.c). */
clpar_status clpar_ocl_convgemm(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                clpar_bref wt, clpar_bref y);

#endif
