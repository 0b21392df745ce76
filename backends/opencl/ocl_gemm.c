/* ocl_gemm.c — the OpenCL backend's GEMM: CLBlast's SGEMM, and gemm_small.cl for the small
 * products (and the nt products) on CPU devices where it beats CLBlast. */
#include <clblast_c.h>

#include "ocl_gemm.h"

/* CLBlast compiles its kernels on the first call on a device, and that compilation races
 * when it runs for two devices at once: the first GEMM of each device runs alone. On PoCL CPU
 * devices before 6.0 (clblast_serial) every GEMM does: PoCL shares one loaded kernel between
 * devices that build the same program, and CLBlast builds the same program for every such
 * device, so two devices running one kernel at once can abort PoCL. */
pthread_mutex_t clpar_ocl_gemm_warmup_lock = PTHREAD_MUTEX_INITIALIZER;

/* What every CLBlast call here does around itself, d->lock held: while profiling, a marker
 * just before it (CLBlast's event is its last kernel's, so the call is timed from the marker),
 * and the warm-up lock until the device's first call of that routine (warm_flag: the GEMM's,
 * or convgemm's, a program of its own) has compiled CLBlast's kernels (always, on a device
 * with clblast_serial). */
typedef struct {
  cl_event ev, marker;
  int warm, serial;
  atomic_int *flag;
} blast_call;

static void blast_begin(clpar_ocl_device *d, blast_call *b, atomic_int *warm_flag) {
  clpar_ocl_prepare_foreign(d); /* CLBlast's launches are its own: not prepared */
  b->marker = NULL;
  if (clpar_ocl_profile_slot(d, &b->ev) &&
      clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &b->marker) != CL_SUCCESS)
    b->marker = NULL;
  b->flag = warm_flag;
  b->warm = atomic_load(warm_flag);
  b->serial = !b->warm || d->clblast_serial;
  if (b->serial) pthread_mutex_lock(&clpar_ocl_gemm_warmup_lock);
}

/* Keeps the span for the profile and leaves the warm-up lock; st is CLBlast's status. A
 * successful call that warms (a plain SGEMM, a convgemm) sets its flag: its kernels are
 * compiled then. */
static void blast_end(clpar_ocl_device *d, blast_call *b, CLBlastStatusCode st, int warms) {
  if (st == CLBlastSuccess && b->ev)
    clpar_ocl_profile_keep_span(d, b->marker, b->ev);
  else if (b->marker)
    clReleaseEvent(b->marker);
  if (!b->warm && warms && st == CLBlastSuccess) atomic_store(b->flag, 1);
  if (b->serial) pthread_mutex_unlock(&clpar_ocl_gemm_warmup_lock);
}

/* CLBlast honours beta == 0 as BLAS does: its kernels never read C then, so NaN in C does not
 * leak (checked for the direct and the indirect kernels, and by test_opencl_program). */
static clpar_status ocl_gemm_locked(void *dev, int trans_a, int trans_b, size_t m, size_t n,
                                    size_t k, float alpha, clpar_bref a, size_t lda, clpar_bref b,
                                    size_t ldb, float beta, clpar_bref c, size_t ldc) {
  clpar_ocl_device *d = dev;
  blast_call call;
  blast_begin(d, &call, &d->gemm_warm);
  CLBlastStatusCode st =
      CLBlastSgemm(CLBlastLayoutRowMajor, trans_a ? CLBlastTransposeYes : CLBlastTransposeNo,
                   trans_b ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, alpha,
                   AS_MEM(a.buf), a.off, lda, AS_MEM(b.buf), b.off, ldb, beta, AS_MEM(c.buf), c.off,
                   ldc, &d->queue, clpar_ocl_profile_slot(d, &call.ev));
  blast_end(d, &call, st, 1);
  if (st == CLBlastSuccess) return CLPAR_OK;
  return clpar_set_error(clpar_ocl_status(st), "CLBlastSgemm(%zux%zux%zu): %s", m, n, k,
                         clpar_ocl_clblast_status_name(st));
}

/* A GEMM of at most this many multiply-adds runs gemm_small.cl on a CPU device (when its
 * shape suits: n a multiple of 8 where B is not transposed, k where it is and A is not).
 * Measured on PoCL 5.0 (basic device, one Xeon core), CLBlast 1.5.3 with its own parameters
 * against gemm_small, nn / nt / tn: 32 x 64 x 64 62 / 56 / 63 us against 23 / 25 / 23;
 * 64 x 128 x 128 294 / 261 / 264 against 267 / 168 / 212; 128 x 128 x 128 556 / 662 / 533
 * against 382 / 310 / 505. CLBlast pads a 16-row product to its tile (66 us against 90-106
 * for 32 rows), gemm_small does not (9 us against 15). Above the threshold a tuned CLBlast
 * (clpar_device_tune_gemm) is the better choice. */
#define SMALL_GEMM_MACS ((size_t)1 << 20)
/* With B transposed and A not (nt: a Linear's forward, a convolution's weight gradient),
 * gemm_small's dot products (A's row and B's row both read along k) beat CLBlast on CPU
 * devices at any size while B stays within this many floats (16 MiB). Measured on PoCL, best
 * of 5: one basic device, against CLBlast's own parameters, 2.3-7x on 14 shapes (m 15 to 2048,
 * n 256 to 4608, k 16 to 2304; 1024^3 21.8 against 9.5 GFLOP/s, 256 x 2304 x 64 34 against
 * 4.9); the pthread device (2 cores) 1.7-4x untuned, and 0.85-2.8x against a clpar-tune entry.
 * With B of 64 MiB (32 x 4096 x 4096) it lost (9.7 against 14.4 tuned). The other transposes
 * keep the size rule: there the kernel lost to CLBlast on large shapes (tn with k >= 120, nn
 * with n >= 1024). DESIGN.md, "Fused Linear, gradients into their slots, small GEMMs";
 * `bench_gemm 0 512x4608x16:nt` shows it against CLBlast. */
#define SMALL_NT_B_FLOATS ((size_t)1 << 22)
/* nn products narrower than gemm_tile's 32-column tile (a convolution's forward on a few
 * images of a late layer) run gemm_small at any size: on a pthread device 1.4-2.9x CLBlast
 * (`bench_gemm 0 512x16x4608:nn 2048x16x512:nn 256x8x1152:nn`: 34 / 25, 36 / 24, 30 / 10.5
 * GFLOP/s); for tn it lost (512x16x2048: 12.7 / 26). */
#define SMALL_NARROW_N 32

static clpar_status gemm_small(clpar_ocl_device *d, int trans_a, int trans_b, size_t m, size_t n,
                               size_t k, float alpha, clpar_bref a, size_t lda, clpar_bref b,
                               size_t ldb, float beta, clpar_bref c, size_t ldc) {
  cl_mem am = AS_MEM(a.buf), bm = AS_MEM(b.buf), cm = AS_MEM(c.buf);
  cl_ulong m_ = m, n_ = n, k_ = k, aoff = a.off, boff = b.off, coff = c.off, la = lda, lb = ldb,
           lc = ldc;
  size_t global[2], local[2];
  clpar_ocl_shape_2d(d, trans_b ? n : n / 8, m, global, local);
  karg args[] = {KARG(m_), KARG(n_),   KARG(k_), KARG(alpha), KARG(am), KARG(aoff), KARG(la),
                 KARG(bm), KARG(boff), KARG(lb), KARG(beta),  KARG(cm), KARG(coff), KARG(lc)};
  return clpar_ocl_launch(d, "gemm_small.cl",
                          trans_b   ? "gemm_small_nt"
                          : trans_a ? "gemm_small_tn"
                                    : "gemm_small_nn",
                          args, 14, 2, global, local);
}

int clpar_ocl_gemm_takes_small(const clpar_ocl_device *d, int trans_a, int trans_b, size_t m,
                               size_t n, size_t k) {
  int fits = trans_b ? !trans_a && k % 8 == 0 : n % 8 == 0;
  int small = k > 0 && (m * n <= SMALL_GEMM_MACS / k || (trans_b && n <= SMALL_NT_B_FLOATS / k) ||
                        (!trans_a && !trans_b && n < SMALL_NARROW_N));
  return d->cpu && fits && small;
}

clpar_status ocl_gemm(void *dev, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                      float alpha, clpar_bref a, size_t lda, clpar_bref b, size_t ldb, float beta,
                      clpar_bref c, size_t ldc) {
  clpar_ocl_device *d_ = dev;
  if (clpar_ocl_gemm_takes_tile(d_, trans_a, trans_b, m, n, k, lda, ldb, ldc))
    return clpar_ocl_gemm_tile(d_, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                               ldc, 0, 1);
  if (clpar_ocl_gemm_takes_small(d_, trans_a, trans_b, m, n, k))
    return gemm_small(d_, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  pthread_mutex_lock(&d_->lock);
  clpar_status s_ =
      ocl_gemm_locked(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  pthread_mutex_unlock(&d_->lock);
  return s_;
}

/* gemm_small.cl's gsn_sizes: sizes and offsets in floats, has_bias, act. */
typedef struct {
  cl_ulong m, n, k, a_off, b_off, bias_off, c_off;
  cl_int has_bias, act;
} gsn_sizes;

/* A Linear's forward (backend.h's linear_act): where ocl_gemm would run gemm_small_nt, the
 * bias and activation go into its epilogue (one launch instead of two; 2 x 8 outputs a
 * work-item where n is a multiple of 8, the same sums); elsewhere the GEMM, then bias_act or
 * the activation's unary. */
clpar_status ocl_linear_act(void *dev, clpar_act_kind act, size_t m, size_t n, size_t k,
                            clpar_bref x, clpar_bref w, clpar_bref bias, clpar_bref out) {
  clpar_ocl_device *d = dev;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl linear_act: activation %d",
                           (int)act);
  if (!clpar_ocl_gemm_takes_tile(d, 0, 1, m, n, k, k, k, n) &&
      clpar_ocl_gemm_takes_small(d, 0, 1, m, n, k)) {
    cl_mem xm = AS_MEM(x.buf), wm = AS_MEM(w.buf), om = AS_MEM(out.buf);
    cl_mem bm = AS_MEM(bias.buf ? bias.buf : w.buf); /* never read without a bias */
    cl_ulong m_ = m, n_ = n, k_ = k, xo = x.off, wo = w.off, bo = bias.off, oo = out.off;
    cl_int has_bias = bias.buf != NULL, a = (cl_int)act;
    size_t global[2], local[2];
    if (n % 8 == 0) { /* 2 x 8 outputs a work-item */
      gsn_sizes z = {m, n, k, x.off, w.off, bias.off, out.off, has_bias, a};
      karg args[] = {KARG(xm), KARG(wm), KARG(bm), KARG(om), KARG(z)};
      clpar_ocl_shape_2d(d, n / 8, (m + 1) / 2, global, local);
      return clpar_ocl_launch(d, "gemm_small.cl", "gemm_small_nt_bias_act_2x8", args, 5, 2, global,
                              local);
    }
    karg args[] = {KARG(m_), KARG(n_), KARG(k_),       KARG(xm), KARG(xo), KARG(wm), KARG(wo),
                   KARG(bm), KARG(bo), KARG(has_bias), KARG(a),  KARG(om), KARG(oo)};
    clpar_ocl_shape_2d(d, n, m, global, local);
    return clpar_ocl_launch(d, "gemm_small.cl", "gemm_small_nt_bias_act", args, 13, 2, global,
                            local);
  }
  clpar_status s = ocl_gemm(dev, 0, 1, m, n, k, 1.0f, x, k, w, k, 0.0f, out, n);
  if (s == CLPAR_OK && bias.buf) return ocl_bias_act(dev, act, m, n, out, bias, out);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE)
    s = ocl_unary(dev,
                  act == CLPAR_ACT_RELU      ? CLPAR_UNARY_RELU
                  : act == CLPAR_ACT_SIGMOID ? CLPAR_UNARY_SIGMOID
                                             : CLPAR_UNARY_TANH,
                  m * n, out, out);
  return s;
}

/* A Linear's backward (backend.h's linear_act_backward): where the unfused path would run
 * bias_act_backward in one pass and both GEMMs as gemm_small, and n is a multiple of 8 (dw's
 * 8-row half blocks), linear_backward.cl does it all in one launch with the same sums; elsewhere
 * those three, d kept in the scratch. */
/* linear_backward.cl's lab_sizes: sizes and offsets in floats, block counts, acc. */
typedef struct {
  cl_ulong m, n, k, g_off, y_off, x_off, w_off, dx_off, n_dx, dw_off, n_dw, db_off, n_db;
  cl_int acc, unused;
} lab_sizes;

static int backward_small(clpar_ocl_device *d, size_t m, size_t n, size_t k) {
  return n % 8 == 0 && m <= CLPAR_OCL_SUM_ROWS_ONE_PASS && /* bias_act_backward in one pass */
         !clpar_ocl_gemm_takes_tile(d, 1, 0, n, k, m, n, k, k) &&
         clpar_ocl_gemm_takes_small(d, 1, 0, n, k, m) &&
         !clpar_ocl_gemm_takes_tile(d, 0, 0, m, k, n, n, k, k) &&
         clpar_ocl_gemm_takes_small(d, 0, 0, m, k, n);
}

clpar_status ocl_linear_act_backward(void *dev, clpar_act_kind act, size_t m, size_t n, size_t k,
                                     clpar_bref g, clpar_bref y, clpar_bref x, clpar_bref w,
                                     clpar_bref scratch, clpar_bref dx, clpar_bref dw,
                                     clpar_bref db, int accumulate) {
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "opencl linear_act_backward: activation %d", (int)act);
  if (act != CLPAR_ACT_NONE && !scratch.buf)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl linear_act_backward: no scratch");
  clpar_bref none = {NULL, 0}, dd = act == CLPAR_ACT_NONE ? g : scratch;
  if (!backward_small(dev, m, n, k)) {
    clpar_status s = CLPAR_OK;
    if (act != CLPAR_ACT_NONE || db.buf)
      s = ocl_bias_act_backward(dev, act, m, n, g, y, act != CLPAR_ACT_NONE ? dd : none, db,
                                (accumulate & CLPAR_ACC_DB) != 0);
    if (s == CLPAR_OK && dw.buf)
      s = ocl_gemm(dev, 1, 0, n, k, m, 1.0f, dd, n, x, k, accumulate & CLPAR_ACC_DW ? 1.0f : 0.0f,
                   dw, k);
    if (s == CLPAR_OK && dx.buf)
      s = ocl_gemm(dev, 0, 0, m, k, n, 1.0f, dd, n, w, k, accumulate & CLPAR_ACC_DX ? 1.0f : 0.0f,
                   dx, k);
    return s;
  }
  static const char *const kernels[] = {"linear_act_backward_none", "linear_act_backward_relu",
                                        "linear_act_backward_sigmoid", "linear_act_backward_tanh"};
  cl_mem gm = AS_MEM(g.buf), ym = AS_MEM(act != CLPAR_ACT_NONE ? y.buf : g.buf);
  cl_mem xm = AS_MEM(x.buf), wm = AS_MEM(w.buf); /* an absent output: any buffer, never used */
  cl_mem dxm = AS_MEM(dx.buf ? dx.buf : g.buf), dwm = AS_MEM(dw.buf ? dw.buf : g.buf);
  cl_mem dbm = AS_MEM(db.buf ? db.buf : g.buf);
  size_t k8 = k / 8;
  cl_ulong yo = act != CLPAR_ACT_NONE ? y.off : g.off, n_dx = dx.buf ? (m + 3) / 4 : 0;
  cl_ulong n_dw = dw.buf ? (n + 15) / 16 : 0, n_db = db.buf ? (n / 8 + k8 - 1) / k8 : 0;
  lab_sizes z = {m,    n,      k,    g.off,  yo,   x.off,      w.off, dx.off,
                 n_dx, dw.off, n_dw, db.off, n_db, accumulate, 0};
  karg args[] = {KARG(gm), KARG(ym), KARG(xm), KARG(wm), KARG(dxm), KARG(dwm), KARG(dbm), KARG(z)};
  if (n_dx + n_dw + n_db == 0) return CLPAR_OK;
  size_t global[2], local[2];
  clpar_ocl_shape_2d(dev, k8, n_dw + n_dx + n_db, global, local);
  return clpar_ocl_launch(dev, "linear_backward.cl", kernels[act], args, 8, 2, global, local);
}

clpar_status ocl_gemm_batched(void *dev, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                              float alpha, clpar_bref a, size_t lda, size_t stride_a, clpar_bref b,
                              size_t ldb, size_t stride_b, float beta, clpar_bref c, size_t ldc,
                              size_t stride_c, size_t batch) {
  clpar_ocl_device *d = dev;
  if (batch == 1)
    return ocl_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (clpar_ocl_gemm_takes_tile(d, trans_a, trans_b, m, n, k, lda, ldb, ldc))
    return clpar_ocl_gemm_tile(d, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                               stride_b, beta, c, ldc, stride_c, batch);
  pthread_mutex_lock(&d->lock);
  blast_call call;
  blast_begin(d, &call, &d->gemm_warm);
  CLBlastStatusCode st = CLBlastSgemmStridedBatched(
      CLBlastLayoutRowMajor, trans_a ? CLBlastTransposeYes : CLBlastTransposeNo,
      trans_b ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, alpha, AS_MEM(a.buf), a.off, lda,
      stride_a, AS_MEM(b.buf), b.off, ldb, stride_b, beta, AS_MEM(c.buf), c.off, ldc, stride_c,
      batch, &d->queue, clpar_ocl_profile_slot(d, &call.ev));
  blast_end(d, &call, st, 0);
  pthread_mutex_unlock(&d->lock);
  if (st == CLBlastSuccess) return CLPAR_OK;
  return clpar_set_error(clpar_ocl_status(st), "CLBlastSgemmStridedBatched(%zu x %zux%zux%zu): %s",
                         batch, m, n, k, clpar_ocl_clblast_status_name(st));
}

/* CLBlastSconvgemm (cross-correlation, NCHW, weights [O, C, kh, kw], one group): CLBlast's own
 * convolution, which ocl_conv_algo.c times beside clpar's. The caller checks that its sizes
 * and offsets fit CLBlast's 32-bit kernel arguments. */
clpar_status clpar_ocl_convgemm(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                clpar_bref wt, clpar_bref y) {
  pthread_mutex_lock(&d->lock);
  blast_call call;
  blast_begin(d, &call, &d->convgemm_warm);
  CLBlastStatusCode st = CLBlastSconvgemm(
      CLBlastKernelModeCrossCorrelation, (size_t)s->c, (size_t)s->h, (size_t)s->w, (size_t)s->kh,
      (size_t)s->kw, (size_t)s->ph, (size_t)s->pw, (size_t)s->sh, (size_t)s->sw, (size_t)s->dh,
      (size_t)s->dw, (size_t)s->o, (size_t)s->n, AS_MEM(x.buf), x.off, AS_MEM(wt.buf), wt.off,
      AS_MEM(y.buf), y.off, &d->queue, clpar_ocl_profile_slot(d, &call.ev));
  blast_end(d, &call, st, 1);
  pthread_mutex_unlock(&d->lock);
  if (st == CLBlastSuccess) return CLPAR_OK;
  return clpar_set_error(clpar_ocl_status(st), "CLBlastSconvgemm(%lldx%lldx%lldx%lld -> %lld): %s",
                         (long long)s->n, (long long)s->c, (long long)s->h, (long long)s->w,
                         (long long)s->o, clpar_ocl_clblast_status_name(st));
}
