/* host_backend.c — the host backend: C + OpenMP, GEMM through a BLAS (OpenBLAS's
 * cblas_sgemm when built with CLPAR_BLAS; a plain loop summing in double otherwise). It is
 * the reference every other backend is tested against (tests/test_host_blas.c checks the BLAS
 * path against a naive GEMM) and a backend users may select ("host") on a machine without an
 * accelerator. Work runs synchronously on the device's worker thread (and OpenMP's), so finish
 * has nothing to wait for. Element-wise loops are written so that the compiler vectorizes
 * them, and go parallel only above CLPAR_HOST_PAR elements: a team costs microseconds, more
 * than a small model's whole op. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include <limits.h>
#include <stdint.h>

#include "backend.h"
#include "host/host_conv.h"
#include "host/host_tensor_ops.h"
#include "host/host_dnnl.h"

#ifdef CLPAR_HAVE_BLAS
#include <cblas.h>
#endif

/* Below this many elements an element-wise op runs on the worker thread alone. */
#define CLPAR_HOST_PAR 65536

static clpar_status host_destroy(void *dev) {
  (void)dev;
#ifdef CLPAR_HAVE_DNNL
  clpar_host_dnnl_release();
#endif
  return CLPAR_OK;
}

static clpar_status host_alloc(void *dev, size_t bytes, void **buf) {
  (void)dev;
  void *p = NULL;
  size_t rounded = (bytes + 63) / 64 * 64;
  if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "posix_memalign(%zu bytes) failed", bytes);
  *buf = p;
  return CLPAR_OK;
}

static clpar_status host_release(void *dev, void *buf) {
  (void)dev;
  free(buf);
  return CLPAR_OK;
}

/* Work runs on the worker thread as it is posted, so an event is complete once recorded. */
static clpar_status host_event_record(void *dev, void **ev) {
  (void)dev;
  *ev = NULL;
  return CLPAR_OK;
}

static clpar_status host_event_query(void *dev, void *ev, int *done) {
  (void)dev;
  (void)ev;
  *done = 1;
  return CLPAR_OK;
}

static clpar_status host_event_then(void *dev, void *ev, clpar_event_fn fn, void *user) {
  (void)dev;
  (void)ev;
  fn(user, CLPAR_OK);
  return CLPAR_OK;
}

static clpar_status host_event_free(void *dev, void *ev) {
  (void)dev;
  (void)ev;
  return CLPAR_OK;
}

#define host_supports_op NULL
/* Whole convolutions, batch norm and adaptive average pooling through oneDNN (host_dnnl*.c)
 * when built with it; else, or with CLPAR_HOST_DNNL=0, the core's im2col and GEMMs over this
 * file's loops, and host_conv.c's. */
#ifdef CLPAR_HAVE_DNNL
#define host_conv2d clpar_host_dnnl_conv2d
#define host_conv2d_backward clpar_host_dnnl_conv2d_backward
#define HOST_DNNL_SWAPS_(X) \
  X(bn_stats) X(bn_apply) X(bn_backward_sums) X(bn_backward) X(avgpool) X(avgpool_backward)
#undef host_bn_stats
#undef host_bn_apply
#undef host_bn_backward_sums
#undef host_bn_backward
#undef host_avgpool
#undef host_avgpool_backward
#define host_bn_stats clpar_host_dnnl_bn_stats
#define host_bn_apply clpar_host_dnnl_bn_apply
#define host_bn_backward_sums clpar_host_dnnl_bn_backward_sums
#define host_bn_backward clpar_host_dnnl_bn_backward
#define host_avgpool clpar_host_dnnl_avgpool
#define host_avgpool_backward clpar_host_dnnl_avgpool_backward
#define host_workspace_bytes clpar_host_dnnl_workspace_bytes
#define host_workspace_trim clpar_host_dnnl_workspace_trim
#else
#define host_conv2d NULL
#define host_conv2d_backward NULL
#define host_workspace_bytes NULL
#define host_workspace_trim NULL
#endif
#define host_profile NULL
#define host_profile_read NULL
/* One host device: no peers. */
#define host_peer_access NULL
#define host_copy_peer NULL
#define host_tune_gemm NULL
/* Element-wise chains stay single commands. */
#define host_ew_chain_prepare NULL
#define host_ew_chain NULL
/* No collectives on the device: DistributedDataParallel reduces host devices over MPI. */
#define host_comm_id NULL
#define host_comm_init NULL
#define host_comm_query NULL
#define host_comm_abort NULL
#define host_comm_free NULL
#define host_comm_allreduce NULL

static clpar_status host_host_alloc(void *dev, size_t bytes, void **handle, void **ptr) {
  clpar_status s = host_alloc(dev, bytes, ptr);
  if (s == CLPAR_OK) *handle = *ptr;
  return s;
}

static clpar_status host_host_free(void *dev, void *handle) {
  return host_release(dev, handle);
}

static clpar_status host_write(void *dev, void *buf, size_t off, const void *src, size_t bytes) {
  (void)dev;
  memcpy((char *)buf + off, src, bytes);
  return CLPAR_OK;
}

static clpar_status host_read(void *dev, const void *buf, size_t off, void *dst, size_t bytes) {
  (void)dev;
  memcpy(dst, (const char *)buf + off, bytes);
  return CLPAR_OK;
}

static clpar_status host_copy(void *dev, void *dst, size_t dst_off, const void *src, size_t src_off,
                              size_t bytes) {
  (void)dev;
  memmove((char *)dst + dst_off, (const char *)src + src_off, bytes);
  return CLPAR_OK;
}

static clpar_status host_finish(void *dev) {
  (void)dev;
  return CLPAR_OK; /* every entry ran to its end on the worker: nothing to wait for */
}

static float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

static clpar_status host_fill(void *dev, clpar_bref out, size_t n, float value) {
  (void)dev;
  float *o = at(out);
#pragma omp parallel for simd if (n > CLPAR_HOST_PAR) schedule(static)
  for (size_t i = 0; i < n; i++) o[i] = value;
  return CLPAR_OK;
}

/* One row of a binary op; the kind is hoisted out of the loop so that each loop vectorizes.
 * o may be x or y (no restrict: the compiler checks overlap at run time). */
static void binary_row(clpar_binary_kind kind, size_t cols, const float *x, const float *y,
                       float *o) {
  switch (kind) {
    case CLPAR_BINARY_ADD:
      for (size_t c = 0; c < cols; c++) o[c] = x[c] + y[c];
      break;
    case CLPAR_BINARY_SUB:
      for (size_t c = 0; c < cols; c++) o[c] = x[c] - y[c];
      break;
    case CLPAR_BINARY_MUL:
      for (size_t c = 0; c < cols; c++) o[c] = x[c] * y[c];
      break;
    case CLPAR_BINARY_DIV:
      for (size_t c = 0; c < cols; c++) o[c] = x[c] / y[c];
      break;
  }
}

/* x op v over n elements: a one-column broadcast (a tensor scaled by a factor on the device)
 * without a call per element. */
static void binary_scalar(clpar_binary_kind kind, size_t n, const float *x, float v, float *o) {
  switch (kind) {
    case CLPAR_BINARY_ADD:
      for (size_t i = 0; i < n; i++) o[i] = x[i] + v;
      break;
    case CLPAR_BINARY_SUB:
      for (size_t i = 0; i < n; i++) o[i] = x[i] - v;
      break;
    case CLPAR_BINARY_MUL:
      for (size_t i = 0; i < n; i++) o[i] = x[i] * v;
      break;
    case CLPAR_BINARY_DIV:
      for (size_t i = 0; i < n; i++) o[i] = x[i] / v;
      break;
  }
}

static clpar_status host_binary(void *dev, clpar_binary_kind kind, size_t rows, size_t cols,
                                clpar_bref a, clpar_bref b, size_t b_rows, clpar_bref out) {
  (void)dev;
  const float *pa = at(a), *pb = at(b);
  float *po = at(out);
  if (b_rows == 1 && cols == 1) {
    float v = pb[0]; /* read before out (which may be b) is written */
#pragma omp parallel for if (rows > CLPAR_HOST_PAR) schedule(static)
    for (size_t i = 0; i < rows; i += 4096)
      binary_scalar(kind, rows - i < 4096 ? rows - i : 4096, pa + i, v, po + i);
    return CLPAR_OK;
  }
  if (b_rows != 1) { /* same shape: one flat loop, however the rows fall */
    size_t n = rows * cols;
#pragma omp parallel for if (n > CLPAR_HOST_PAR) schedule(static)
    for (size_t i = 0; i < n; i += 4096)
      binary_row(kind, n - i < 4096 ? n - i : 4096, pa + i, pb + i, po + i);
    return CLPAR_OK;
  }
#pragma omp parallel for if (rows * cols > CLPAR_HOST_PAR) schedule(static)
  for (size_t r = 0; r < rows; r++) binary_row(kind, cols, pa + r * cols, pb, po + r * cols);
  return CLPAR_OK;
}

static clpar_status host_scale(void *dev, size_t n, float alpha, clpar_bref a, clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
#pragma omp parallel for simd if (n > CLPAR_HOST_PAR) schedule(static)
  for (size_t i = 0; i < n; i++) po[i] = alpha * pa[i];
  return CLPAR_OK;
}

/* Columns are split between threads in blocks; each block walks the rows in order (unit
 * stride) into a double accumulator: the reference sums in double. */
static clpar_status host_sum_rows(void *dev, size_t rows, size_t cols, clpar_bref a,
                                  clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
  enum { BLOCK = 256, SPAN = 8192 };
  if (cols == 1 && rows > SPAN) { /* a whole sum: spans of rows in parallel, then in order */
    size_t spans = (rows + SPAN - 1) / SPAN;
    double *part = malloc(spans * sizeof *part);
    if (part) {
#pragma omp parallel for if (rows > CLPAR_HOST_PAR) schedule(static)
      for (size_t sp = 0; sp < spans; sp++) {
        size_t r1 = (sp + 1) * SPAN < rows ? (sp + 1) * SPAN : rows;
        double acc = 0.0;
        for (size_t r = sp * SPAN; r < r1; r++) acc += pa[r];
        part[sp] = acc;
      }
      double total = 0.0;
      for (size_t sp = 0; sp < spans; sp++) total += part[sp];
      po[0] = (float)total;
      free(part);
      return CLPAR_OK;
    }
  }
  size_t blocks = (cols + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (rows * cols > CLPAR_HOST_PAR) schedule(static)
  for (size_t blk = 0; blk < blocks; blk++) {
    double acc[BLOCK] = {0};
    size_t c0 = blk * BLOCK, w = cols - c0 < BLOCK ? cols - c0 : BLOCK;
    for (size_t r = 0; r < rows; r++) {
      const float *row = pa + r * cols + c0;
      for (size_t c = 0; c < w; c++) acc[c] += row[c];
    }
    for (size_t c = 0; c < w; c++) po[c0 + c] = (float)acc[c];
  }
  return CLPAR_OK;
}

/* Row-major C = alpha op(A) op(B) + beta C, one row of C per iteration, summed in double.
 * beta == 0 ignores C (NaN in C does not leak). The whole GEMM without a BLAS, and the
 * fallback for sizes a BLAS int cannot hold. */
static void gemm_loop(int ta, int tb, size_t m, size_t n, size_t k, float alpha, const float *pa,
                      size_t lda, const float *pb, size_t ldb, float beta, float *pc, size_t ldc) {
#pragma omp parallel for if (m * n * k > 32768) schedule(static)
  for (size_t i = 0; i < m; i++) {
    double *acc = calloc(n, sizeof *acc);
    if (!acc) continue; /* cannot happen in practice; leaves the row as it was */
    for (size_t p = 0; p < k; p++) {
      double aip = ta ? pa[p * lda + i] : pa[i * lda + p];
      if (tb)
        for (size_t j = 0; j < n; j++) acc[j] += aip * pb[j * ldb + p];
      else
        for (size_t j = 0; j < n; j++) acc[j] += aip * pb[p * ldb + j];
    }
    float *crow = pc + i * ldc;
    for (size_t j = 0; j < n; j++)
      crow[j] = (float)(alpha * acc[j] + (beta == 0.0f ? 0.0 : (double)beta * crow[j]));
    free(acc);
  }
}

static clpar_status host_gemm(void *dev, int ta, int tb, size_t m, size_t n, size_t k, float alpha,
                              clpar_bref a, size_t lda, clpar_bref b, size_t ldb, float beta,
                              clpar_bref c, size_t ldc) {
  (void)dev;
  const float *pa = at(a), *pb = at(b);
  float *pc = at(c);
#ifdef CLPAR_HAVE_BLAS
  size_t most = m > n ? m : n;
  most = most > k ? most : k;
  most = most > lda ? most : lda;
  most = most > ldb ? most : ldb;
  most = most > ldc ? most : ldc;
  if (most <= (size_t)INT_MAX) {
    /* The BLAS interface says C need not be set on input when beta is 0 (the reference BLAS
     * and OpenBLAS store, not scale): NaN in C does not leak (tests/test_host_blas.c). */
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, pa, (int)lda, pb, (int)ldb, beta, pc, (int)ldc);
    return CLPAR_OK;
  }
#endif
  gemm_loop(ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc);
  return CLPAR_OK;
}

/* 16-bit operands widened by the core's conversions, then host_gemm (host_half.c). */
static clpar_status host_gemm_half(void *dev, int bf16, int ta, int tb, size_t m, size_t n,
                                   size_t k, float alpha, clpar_bref a, size_t lda, clpar_bref b,
                                   size_t ldb, float beta, clpar_bref c, size_t ldc) {
  return clpar_host_gemm_half(host_gemm, dev, bf16, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                              ldc);
}

/* One BLAS call per matrix (each threaded by the BLAS itself). */
static clpar_status host_gemm_batched(void *dev, int ta, int tb, size_t m, size_t n, size_t k,
                                      float alpha, clpar_bref a, size_t lda, size_t stride_a,
                                      clpar_bref b, size_t ldb, size_t stride_b, float beta,
                                      clpar_bref c, size_t ldc, size_t stride_c, size_t batch) {
  for (size_t i = 0; i < batch; i++) {
    clpar_bref ai = {a.buf, a.off + i * stride_a}, bi = {b.buf, b.off + i * stride_b};
    clpar_bref ci = {c.buf, c.off + i * stride_c};
    host_gemm(dev, ta, tb, m, n, k, alpha, ai, lda, bi, ldb, beta, ci, ldc);
  }
  return CLPAR_OK;
}

static clpar_status host_broadcast_rows(void *dev, size_t rows, size_t cols, clpar_bref a,
                                        clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
  if (cols == 1) { /* one value repeated */
    float v = pa[0];
#pragma omp parallel for simd if (rows > CLPAR_HOST_PAR) schedule(static)
    for (size_t r = 0; r < rows; r++) po[r] = v;
    return CLPAR_OK;
  }
#pragma omp parallel for if (rows * cols > CLPAR_HOST_PAR) schedule(static)
  for (size_t r = 0; r < rows; r++) memcpy(po + r * cols, pa, cols * sizeof *po);
  return CLPAR_OK;
}

/* Sums along a dimension of [outer, red, inner]: each job is one o and a block of up to 256
 * of the inner positions, walking r in order (unit stride within a block) into double
 * accumulators, as sum_rows does. */
static clpar_status host_reduce_sum(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                                    clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
  enum { BLOCK = 256 };
  size_t blocks = (inner + BLOCK - 1) / BLOCK, jobs = outer * blocks;
#pragma omp parallel for if (outer * red * inner > CLPAR_HOST_PAR) schedule(static)
  for (size_t j = 0; j < jobs; j++) {
    size_t o = j / blocks, i0 = (j % blocks) * BLOCK, w = inner - i0 < BLOCK ? inner - i0 : BLOCK;
    const float *base = pa + o * red * inner + i0;
    if (w == 1) { /* a contiguous run (inner == 1): one accumulator */
      double acc = 0;
      for (size_t r = 0; r < red; r++) acc += base[r * inner];
      po[o * inner + i0] = (float)acc;
      continue;
    }
    double acc[BLOCK];
    for (size_t c = 0; c < w; c++) acc[c] = 0;
    for (size_t r = 0; r < red; r++) {
      const float *row = base + r * inner;
      for (size_t c = 0; c < w; c++) acc[c] += row[c];
    }
    for (size_t c = 0; c < w; c++) po[o * inner + i0 + c] = (float)acc[c];
  }
  return CLPAR_OK;
}

static clpar_status host_expand(void *dev, size_t outer, size_t red, size_t inner, clpar_bref a,
                                clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
  size_t rows = outer * red;
#pragma omp parallel for if (rows * inner > CLPAR_HOST_PAR) schedule(static)
  for (size_t j = 0; j < rows; j++) {
    const float *src = pa + (j / red) * inner;
    float *dst = po + j * inner;
    for (size_t i = 0; i < inner; i++) dst[i] = src[i];
  }
  return CLPAR_OK;
}

static clpar_status host_unary(void *dev, clpar_unary_kind kind, size_t n, clpar_bref a,
                               clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
  /* One loop per kind, so that the cheap ones (relu, sqrt, neg) vectorize. */
  switch (kind) {
    case CLPAR_UNARY_RELU:
#pragma omp parallel for simd if (n > CLPAR_HOST_PAR) schedule(static)
      for (size_t i = 0; i < n; i++) po[i] = pa[i] > 0.0f ? pa[i] : 0.0f;
      break;
    case CLPAR_UNARY_SIGMOID:
#pragma omp parallel for if (n > CLPAR_HOST_PAR / 8) schedule(static)
      for (size_t i = 0; i < n; i++) po[i] = 1.0f / (1.0f + expf(-pa[i]));
      break;
    case CLPAR_UNARY_TANH:
#pragma omp parallel for if (n > CLPAR_HOST_PAR / 8) schedule(static)
      for (size_t i = 0; i < n; i++) po[i] = tanhf(pa[i]);
      break;
    case CLPAR_UNARY_EXP:
#pragma omp parallel for if (n > CLPAR_HOST_PAR / 8) schedule(static)
      for (size_t i = 0; i < n; i++) po[i] = expf(pa[i]);
      break;
    case CLPAR_UNARY_SQRT:
#pragma omp parallel for simd if (n > CLPAR_HOST_PAR) schedule(static)
      for (size_t i = 0; i < n; i++) po[i] = sqrtf(pa[i]);
      break;
    case CLPAR_UNARY_NEG:
#pragma omp parallel for simd if (n > CLPAR_HOST_PAR) schedule(static)
      for (size_t i = 0; i < n; i++) po[i] = -pa[i];
      break;
  }
  return CLPAR_OK;
}

static clpar_status host_unary_backward(void *dev, clpar_unary_kind kind, size_t n, clpar_bref g,
                                        clpar_bref saved, clpar_bref out) {
  (void)dev;
  const float *pg = at(g), *ps = at(saved);
  float *po = at(out);
  if (kind == CLPAR_UNARY_RELU) {
    /* a select of g loaded unconditionally, as PyTorch's threshold_backward (g where x > 0,
     * else 0): GCC vectorizes this form, where g times a 0-or-1 (or a select with the load
     * inside) compiled to a branch per element */
#pragma omp parallel for simd if (n > CLPAR_HOST_PAR) schedule(static)
    for (size_t i = 0; i < n; i++) {
      float g = pg[i];
      po[i] = ps[i] > 0.0f ? g : 0.0f;
    }
  } else if (kind == CLPAR_UNARY_SIGMOID) {
#pragma omp parallel for simd if (n > CLPAR_HOST_PAR) schedule(static)
    for (size_t i = 0; i < n; i++) po[i] = pg[i] * (ps[i] * (1.0f - ps[i]));
  } else {
#pragma omp parallel for simd if (n > CLPAR_HOST_PAR) schedule(static)
    for (size_t i = 0; i < n; i++) po[i] = pg[i] * (1.0f - ps[i] * ps[i]);
  }
  return CLPAR_OK;
}

/* f(x) of the fused bias entries; the same expressions as host_unary's. */
static inline float act_of(clpar_act_kind act, float x) {
  return act == CLPAR_ACT_RELU      ? (x > 0.0f ? x : 0.0f)
         : act == CLPAR_ACT_SIGMOID ? 1.0f / (1.0f + expf(-x))
         : act == CLPAR_ACT_TANH    ? tanhf(x)
                                    : x;
}

/* f'(.) from the output y, as host_unary_backward's. */
static inline float act_grad(clpar_act_kind act, float y) {
  return act == CLPAR_ACT_RELU      ? (y > 0.0f ? 1.0f : 0.0f)
         : act == CLPAR_ACT_SIGMOID ? y * (1.0f - y)
         : act == CLPAR_ACT_TANH    ? 1.0f - y * y
                                    : 1.0f;
}

static clpar_status host_bias_act(void *dev, clpar_act_kind act, size_t rows, size_t cols,
                                  clpar_bref a, clpar_bref bias, clpar_bref out) {
  (void)dev;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "host bias_act: activation %d", (int)act);
  const float *pa = at(a), *pb = at(bias);
  float *po = at(out);
  /* the activation chosen outside the loops, so that the plain and ReLU rows vectorize */
#pragma omp parallel for if (rows * cols > CLPAR_HOST_PAR / 8) schedule(static)
  for (size_t r = 0; r < rows; r++) {
    const float *ar = pa + r * cols;
    float *orow = po + r * cols;
    if (act == CLPAR_ACT_NONE) {
      for (size_t c = 0; c < cols; c++) orow[c] = ar[c] + pb[c];
    } else if (act == CLPAR_ACT_RELU) {
      for (size_t c = 0; c < cols; c++) {
        float x = ar[c] + pb[c];
        orow[c] = x > 0.0f ? x : 0.0f;
      }
    } else {
      for (size_t c = 0; c < cols; c++)
        orow[c] = act_of(act, ar[c] + pb[c]); /* rounded to float, then f */
    }
  }
  return CLPAR_OK;
}

/* A block of w columns of the gradient without an activation: d = g, copied to out when
 * given, summed down the rows into acc in double, row by row as the general loop does. */
static void bias_grad_plain(const float *pg, float *po, size_t rows, size_t cols, size_t c0,
                            size_t w, double *acc) {
  for (size_t r = 0; r < rows; r++) {
    const float *g = pg + r * cols + c0;
    if (po) {
      float *o = po + r * cols + c0;
      for (size_t c = 0; c < w; c++) o[c] = g[c];
    }
    for (size_t c = 0; c < w; c++) acc[c] += g[c];
  }
}

/* d = g f'(y) written to out (when given), and its column sums in double as host_sum_rows,
 * rounded to float and added to db (when given). */
static clpar_status host_bias_act_backward(void *dev, clpar_act_kind act, size_t rows, size_t cols,
                                           clpar_bref g, clpar_bref y, clpar_bref out,
                                           clpar_bref db, int accumulate) {
  (void)dev;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "host bias_act_backward: activation %d",
                           (int)act);
  const float *pg = at(g), *py = act == CLPAR_ACT_NONE ? NULL : at(y);
  float *po = out.buf ? at(out) : NULL, *pd = db.buf ? at(db) : NULL;
  enum { BLOCK = 256 };
  size_t blocks = (cols + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (rows * cols > CLPAR_HOST_PAR) schedule(static)
  for (size_t blk = 0; blk < blocks; blk++) {
    double acc[BLOCK] = {0};
    size_t c0 = blk * BLOCK, w = cols - c0 < BLOCK ? cols - c0 : BLOCK;
    if (!py) bias_grad_plain(pg, po, rows, cols, c0, w, acc);
    for (size_t r = 0; py && r < rows; r++) {
      size_t i0 = r * cols + c0;
      for (size_t c = 0; c < w; c++) {
        float g = pg[i0 + c], d = !py                     ? g
                                  : act == CLPAR_ACT_RELU ? (py[i0 + c] > 0.0f ? g : 0.0f)
                                                          : g * act_grad(act, py[i0 + c]);
        if (po) po[i0 + c] = d;
        acc[c] += d;
      }
    }
    if (pd)
      for (size_t c = 0; c < w; c++)
        pd[c0 + c] = accumulate ? pd[c0 + c] + (float)acc[c] : (float)acc[c];
  }
  return CLPAR_OK;
}

#define SOFTMAX_KEEP 1024 /* rows up to this long compute each exp once */

static clpar_status host_softmax(void *dev, int take_log, size_t rows, size_t cols, clpar_bref a,
                                 clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  float *po = at(out);
#pragma omp parallel for if (rows * cols > CLPAR_HOST_PAR) schedule(static)
  for (size_t r = 0; r < rows; r++) {
    const float *x = pa + r * cols;
    float *y = po + r * cols;
    float max = x[0];
    for (size_t c = 1; c < cols; c++) max = x[c] > max ? x[c] : max;
    double sum = 0.0, e[SOFTMAX_KEEP]; /* a short row's exps, kept for the second pass */
    int keep = !take_log && cols <= SOFTMAX_KEEP;
    for (size_t c = 0; c < cols; c++) { /* a masked (-inf) entry's exp is 0: no call */
      double v = x[c] == -INFINITY ? 0.0 : exp((double)x[c] - max);
      if (keep) e[c] = v;
      sum += v;
    }
    double lse = log(sum);
    if (keep)
      for (size_t c = 0; c < cols; c++) y[c] = (float)(e[c] / sum);
    else
      for (size_t c = 0; c < cols; c++)
        y[c] =
            take_log ? (float)((double)x[c] - max - lse) : (float)(exp((double)x[c] - max) / sum);
  }
  return CLPAR_OK;
}

static clpar_status host_softmax_backward(void *dev, int take_log, size_t rows, size_t cols,
                                          clpar_bref y, clpar_bref g, clpar_bref out) {
  (void)dev;
  const float *py = at(y), *pg = at(g);
  float *po = at(out);
#pragma omp parallel for if (rows * cols > CLPAR_HOST_PAR) schedule(static)
  for (size_t r = 0; r < rows; r++) {
    const float *yr = py + r * cols, *gr = pg + r * cols;
    float *o = po + r * cols;
    double dot = 0.0;
    for (size_t c = 0; c < cols; c++) dot += take_log ? (double)gr[c] : (double)gr[c] * yr[c];
    for (size_t c = 0; c < cols; c++)
      o[c] = take_log ? (float)(gr[c] - exp((double)yr[c]) * dot) : (float)(yr[c] * (gr[c] - dot));
  }
  return CLPAR_OK;
}

static clpar_status host_pick(void *dev, int scatter, size_t rows, size_t cols, clpar_bref idx,
                              clpar_bref a, clpar_bref out) {
  (void)dev;
  const int32_t *pi = (const int32_t *)idx.buf + idx.off;
  const float *pa = at(a);
  float *po = at(out);
  for (size_t r = 0; r < rows; r++) {
    size_t k = r * cols + (size_t)pi[r];
    if (scatter)
      po[k] = pa[r];
    else
      po[r] = pa[k];
  }
  return CLPAR_OK;
}

static clpar_status host_nll(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref labels,
                             clpar_bref out) {
  (void)dev;
  const float *pa = at(a);
  const int32_t *pl = (const int32_t *)labels.buf + labels.off; /* int32 labels */
  float *po = at(out);
  for (size_t r = 0; r < rows; r++) po[r] = -pa[r * cols + (size_t)pl[r]];
  return CLPAR_OK;
}

static clpar_status host_nll_backward(void *dev, size_t rows, size_t cols, clpar_bref labels,
                                      clpar_bref g, clpar_bref out) {
  (void)dev;
  const int32_t *pl = (const int32_t *)labels.buf + labels.off; /* int32 labels */
  const float *pg = at(g);
  float *po = at(out);
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < cols; c++) po[r * cols + c] = c == (size_t)pl[r] ? -pg[r] : 0.0f;
  return CLPAR_OK;
}

/* A Linear's forward: OpenBLAS's GEMM, then one pass for the bias and the activation. */
static clpar_status host_linear_act(void *dev, clpar_act_kind act, size_t m, size_t n, size_t k,
                                    clpar_bref x, clpar_bref w, clpar_bref bias, clpar_bref out) {
  clpar_status s = host_gemm(dev, 0, 1, m, n, k, 1.0f, x, k, w, k, 0.0f, out, n);
  if (s == CLPAR_OK && bias.buf) return host_bias_act(dev, act, m, n, out, bias, out);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE)
    s = host_unary(dev,
                   act == CLPAR_ACT_RELU      ? CLPAR_UNARY_RELU
                   : act == CLPAR_ACT_SIGMOID ? CLPAR_UNARY_SIGMOID
                                              : CLPAR_UNARY_TANH,
                   m * n, out, out);
  return s;
}

/* A Linear's backward: one pass for d and the bias' sums (host_bias_act_backward), then
 * OpenBLAS's two GEMMs; the core's composition in one posted entry. */
static clpar_status host_linear_act_backward(void *dev, clpar_act_kind act, size_t m, size_t n,
                                             size_t k, clpar_bref g, clpar_bref y, clpar_bref x,
                                             clpar_bref w, clpar_bref scratch, clpar_bref dx,
                                             clpar_bref dw, clpar_bref db, int accumulate) {
  return clpar_be_linear_act_backward("host", host_bias_act_backward, host_gemm, dev, act, m, n, k,
                                      g, y, x, w, scratch, dx, dw, db, accumulate);
}

/* No prepared launches: a replay calls the entries (docs/graphs.md). */
#define host_prepare_begin NULL
#define host_prepare_end NULL
#define host_prepare_run NULL
#define host_prepare_free NULL
#define CLPAR_BE_PREFIX_ host
static const clpar_backend_iface host_iface = CLPAR_BACKEND_TABLE("host");

#ifdef CLPAR_HAVE_DNNL
/* host_iface with the plain loops in place of oneDNN (CLPAR_HOST_DNNL=0). */
static clpar_backend_iface host_iface_plain;
static pthread_once_t plain_once = PTHREAD_ONCE_INIT;

static void make_plain(void) {
  host_iface_plain = host_iface;
  host_iface_plain.conv2d = NULL;
  host_iface_plain.conv2d_backward = NULL;
#define PLAIN_(e) host_iface_plain.e = clpar_host_##e;
  HOST_DNNL_SWAPS_(PLAIN_)
#undef PLAIN_
}

/* CLPAR_HOST_DNNL: unset or "1" runs convolutions, batch norm and average pooling through oneDNN
 * (PyTorch's CPU convolutions are oneDNN's too), "0" through the plain loops; anything else is
 * refused. */
static clpar_status dnnl_wanted(int *yes) {
  const char *v = getenv("CLPAR_HOST_DNNL");
  *yes = 1;
  if (!v || strcmp(v, "1") == 0) return CLPAR_OK;
  if (strcmp(v, "0") == 0) {
    *yes = 0;
    return CLPAR_OK;
  }
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "host backend: CLPAR_HOST_DNNL is \"%.32s\"; use 1 (oneDNN) or 0 (the "
                         "plain loops)",
                         v);
}
#endif

/* The one host device; a CLPAR_HOST_DNNL the probe refuses still adds it (clpar_init needs the
 * host device to fail cleanly) and returns the error. */
clpar_status clpar_host_probe(clpar_backend_device **devs, int *count) {
  clpar_status s = CLPAR_OK;
  const char *libs = "";
  clpar_backend_device *d = clpar_backend_device_append(devs, count);
  if (!d) return CLPAR_ERROR_OUT_OF_MEMORY;
  d->iface = &host_iface;
  d->ctx = NULL;
#ifdef CLPAR_HAVE_DNNL
  int dnnl = 1;
  s = dnnl_wanted(&dnnl);
  pthread_once(&plain_once, make_plain);
  if (!dnnl) d->iface = &host_iface_plain;
  libs = dnnl ? " + oneDNN" : "";
#endif
  clpar_device_info *in = &d->info;
#ifdef CLPAR_HAVE_BLAS
  snprintf(in->name, sizeof in->name, "host (C + OpenMP + BLAS%s)", libs);
#else
  snprintf(in->name, sizeof in->name, "host (C + OpenMP%s)", libs);
#endif
  snprintf(in->vendor, sizeof in->vendor, "clpar");
  snprintf(in->driver_version, sizeof in->driver_version, "%s", CLPAR_VERSION_STRING);
  in->type = CLPAR_DEVICE_CPU;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  in->global_mem_bytes =
      pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (uint64_t)1 << 32;
  in->max_alloc_bytes = in->global_mem_bytes / 2;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  in->compute_units = cpus > 0 ? (int)cpus : 1;
  return s;
}
