/* ocl_gemm_tile.c — the register-tiled GEMM of kernels/opencl/gemm_tile.cl for CPU devices,
 * which ocl_gemm and ocl_gemm_batched take instead of CLBlast where it fits (below).
 *
 * Measured on PoCL 3.1, pthread device (2 cores of an AVX-512 EPYC, machine shared), GFLOP/s
 * against CLBlast 1.5 with its own parameters in the same run (`bench_gemm 0 256x256x2304:nn
 * 2304x256x256:tn 256x2304x256:nt 512x64x4608:nn 4608x64x512:tn`, ResNet-50's convolution
 * GEMMs at batch 16 of 64x64): 193 / 5.8, 237 / 8.4, 160 / 6.7, 436 / 23, 241 / 7.1. In the
 * ResNet-50 training step (`bench_train_step 0 2 --model resnet50`, device time summed per
 * kernel, back to back at load 8) the GEMMs took 239 ms a step against 3010 ms before. */
#include "ocl_gemm.h"

/* The kernel's default tiles (gemm_tile.cl): GT_MR x 16 GT_NV for nn / tn, GT_DM x GT_DN for
 * nt. The kernel takes them as -D build options; a tuner that builds it with others must
 * launch with the same tiles (global sizes below). */
#define TILE_MR 8
#define TILE_NR 32
#define TILE_DM 4
#define TILE_DN 4
/* Fewest multiply-adds for the tiled kernel: below it gemm_small's or CLBlast's launch is
 * the cheaper one (a tile's scalar edge loop dominates tiny products). */
#define TILE_MIN_MACS ((size_t)1 << 20)

int clpar_ocl_gemm_takes_tile(const clpar_ocl_device *d, int trans_a, int trans_b, size_t m,
                              size_t n, size_t k, size_t lda, size_t ldb, size_t ldc) {
  if (lda > UINT32_MAX || ldb > UINT32_MAX || ldc > UINT32_MAX) return 0;
  if (!d->cpu || (trans_a && trans_b) || k == 0) return 0;
  if (m > UINT32_MAX || n > UINT32_MAX || k > UINT32_MAX) return 0;
  if (m * n < TILE_MIN_MACS / k) return 0;
  if (trans_b) return m >= TILE_DM && n >= TILE_DN && k >= 16;
  return m >= TILE_MR && n >= TILE_NR;
}

clpar_status clpar_ocl_gemm_tile(clpar_ocl_device *d, int trans_a, int trans_b, size_t m, size_t n,
                                 size_t k, float alpha, clpar_bref a, size_t lda, size_t stride_a,
                                 clpar_bref b, size_t ldb, size_t stride_b, float beta,
                                 clpar_bref c, size_t ldc, size_t stride_c, size_t batch) {
  cl_mem am = AS_MEM(a.buf), bm = AS_MEM(b.buf), cm = AS_MEM(c.buf);
  cl_uint m_ = (cl_uint)m, n_ = (cl_uint)n, k_ = (cl_uint)k, la = (cl_uint)lda, lb = (cl_uint)ldb,
          lc = (cl_uint)ldc;
  cl_ulong ao = a.off, bo = b.off, co = c.off, sa = stride_a, sb = stride_b, sc = stride_c;
  karg args[] = {KARG(m_),   KARG(n_), KARG(k_), KARG(alpha), KARG(am), KARG(ao),
                 KARG(la),   KARG(sa), KARG(bm), KARG(bo),    KARG(lb), KARG(sb),
                 KARG(beta), KARG(cm), KARG(co), KARG(lc),    KARG(sc)};
  size_t tm = trans_b ? TILE_DM : TILE_MR, tn = trans_b ? TILE_DN : TILE_NR;
  size_t global[3] = {(m + tm - 1) / tm, (n + tn - 1) / tn, batch}, local[3] = {1, 1, 1};
  const char *name = trans_b ? "gemm_tile_nt" : trans_a ? "gemm_tile_tn" : "gemm_tile_nn";
  return clpar_ocl_launch(d, "gemm_tile.cl", name, args, 17, 3, global, local);
}
