/* cuda_lt.c — a Linear's forward (backend.h's linear_act) as one cuBLASLt matmul with the bias,
 * and ReLU, in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU_BIAS), where
 * the plain path runs a cuBLAS SGEMM then the bias_act kernel. Opt-in: CLPAR_CUDA_LT=1, read at
 * the probe. clpar has no GELU activation in linear_act, and sigmoid and tanh have no cuBLASLt
 * epilogue; those, and a Linear without a bias, keep the plain path.
 *
 * The GEMM is cuda_gemm's, transposed for cuBLASLt's column-major view: the row-major
 * out [m, n] = x [m, k] w [n, k]^T is the column-major D [n, m] = op(A) B with A = w stored as a
 * column-major k x n matrix (leading dimension k, op T) and B = x stored as k x m (leading
 * dimension k, op N); D is out, n x m with leading dimension n. The bias has D's row count (n)
 * and is added to every column of D, that is to every row of out, before the ReLU.
 *
 * Math: CUBLAS_COMPUTE_32F with fp32 scale, operands and output: full fp32 (no TF32), as
 * cuBLAS's SGEMM computes on the plain path, so results stay within the host reference's
 * tolerance; the bits may differ from the plain path's (another kernel, another summation
 * order), but not run to run for a shape: each shape's algorithm is chosen once.
 *
 * Per device, made at the first use on the device's worker: a cuBLASLt handle, a workspace of
 * LT_WORKSPACE bytes (cudaMalloc) and a cache of the shapes seen, each with its matmul
 * descriptor, layouts and the algorithm cublasLtMatmulAlgoGetHeuristic chose for it (keyed by
 * m, n, k, the epilogue and the operands' alignments, which the heuristic takes into account).
 * A shape the heuristic finds no algorithm for, or that cuBLASLt refuses, is cached as such
 * and runs the plain path; so does every shape when the handle or workspace cannot be made, and
 * every new shape once LT_CACHE_MAX are cached (entries are never evicted, so a pointer to one
 * stays valid while the device lives). All of it is guarded by the device's cuBLAS lock. The
 * workspace counts in the device's own_bytes (the workspace_bytes entry); workspace_trim frees
 * it (the stream drained) and the next matmul makes it again. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "cuda/cuda_internal.h"

#define LT_WORKSPACE ((size_t)32 << 20) /* as PyTorch and llm.c give cuBLASLt on Hopper */
#define LT_CACHE_MAX 256

typedef struct lt_entry {
  struct lt_entry *next;
  size_t m, n, k;
  int relu;
  unsigned align; /* align_key of x, w, bias and out */
  int ok;         /* 0: no algorithm; the plain path runs this shape */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d; /* w, x and out (out is also C, read with beta 0) */
  cublasLtMatmulAlgo_t algo;
} lt_entry;

typedef struct lt_state {
  cublasLtHandle_t handle; /* NULL when it could not be made: every shape runs the plain path */
  void *workspace;
  lt_entry *cache;
  int cache_len;
  uint64_t runs; /* matmuls run through cuBLASLt */
} lt_state;

/* The largest power of two (at most 256) that divides the address: what the heuristic's
 * alignment preferences take. */
static uint32_t align_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 1;
  while (al < 256 && a % (al * 2) == 0) al *= 2;
  return al;
}

/* log2 of each alignment (0 .. 8), four bits each. */
static unsigned align_key(const void *x, const void *w, const void *bias, const void *out) {
  const void *p[4] = {x, w, bias, out};
  unsigned key = 0;
  for (int i = 0; i < 4; i++) {
    unsigned l = 0;
    for (uint32_t al = align_of(p[i]); al > 1; al /= 2) l++;
    key |= l << (4 * i);
  }
  return key;
}

static void entry_free(lt_entry *e) {
  if (e->desc) (void)cublasLtMatmulDescDestroy(e->desc);
  if (e->a) (void)cublasLtMatrixLayoutDestroy(e->a);
  if (e->b) (void)cublasLtMatrixLayoutDestroy(e->b);
  if (e->d) (void)cublasLtMatrixLayoutDestroy(e->d);
  free(e);
}

void clpar_cuda_lt_release(cuda_dev *d) {
  lt_state *st = d->lt;
  if (!st) return;
  for (lt_entry *e = st->cache, *next; e; e = next) {
    next = e->next;
    entry_free(e);
  }
  if (st->workspace) {
    (void)cudaFree(st->workspace);
    __atomic_sub_fetch(&d->own_bytes, LT_WORKSPACE, __ATOMIC_RELAXED);
  }
  if (st->handle) (void)cublasLtDestroy(st->handle);
  free(st);
  d->lt = NULL;
}

/* The workspace made again after a trim; 0 (the plain path runs) when cudaMalloc refuses.
 * blas_lock held, the device current. */
static int workspace_ready(cuda_dev *d, lt_state *st) {
  if (st->workspace) return 1;
  if (cudaMalloc(&st->workspace, LT_WORKSPACE) != cudaSuccess) {
    (void)cudaGetLastError();
    st->workspace = NULL;
    return 0;
  }
  __atomic_add_fetch(&d->own_bytes, LT_WORKSPACE, __ATOMIC_RELAXED);
  return 1;
}

clpar_status clpar_cuda_lt_trim(cuda_dev *d) {
  clpar_status s = CLPAR_OK;
  pthread_mutex_lock(&d->blas_lock);
  lt_state *st = d->lt;
  if (st && st->workspace) {
    s = clpar_cuda_check(cudaFree(st->workspace), "cudaFree(cuBLASLt workspace)");
    if (s == CLPAR_OK) {
      st->workspace = NULL;
      __atomic_sub_fetch(&d->own_bytes, LT_WORKSPACE, __ATOMIC_RELAXED);
    }
  }
  pthread_mutex_unlock(&d->blas_lock);
  return s;
}

uint64_t clpar_cuda_lt_runs(const void *dev) {
  cuda_dev *d = (cuda_dev *)dev;
  pthread_mutex_lock(&d->blas_lock);
  const lt_state *st = d->lt;
  uint64_t runs = st ? st->runs : 0;
  pthread_mutex_unlock(&d->blas_lock);
  return runs;
}

/* The device's state, made at the first call; blas_lock held, the device current. NULL only
 * when out of host memory; a handle or workspace that cannot be made leaves handle NULL. */
static lt_state *state_of(cuda_dev *d) {
  if (d->lt) return d->lt;
  lt_state *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  cublasStatus_t bs = cublasLtCreate(&st->handle);
  cudaError_t ce = cudaSuccess;
  if (bs == CUBLAS_STATUS_SUCCESS) ce = cudaMalloc(&st->workspace, LT_WORKSPACE);
  if (bs != CUBLAS_STATUS_SUCCESS || ce != cudaSuccess) {
    (void)cudaGetLastError();
    clpar_log(CLPAR_LOG_WARN,
              "CUDA device %d: Linear layers run cuBLAS SGEMM then bias_act: %s failed (%s)",
              d->ordinal, bs != CUBLAS_STATUS_SUCCESS ? "cublasLtCreate" : "cudaMalloc(workspace)",
              bs != CUBLAS_STATUS_SUCCESS ? cublasGetStatusName(bs) : cudaGetErrorName(ce));
    if (st->handle) (void)cublasLtDestroy(st->handle);
    st->handle = NULL;
    st->workspace = NULL;
  } else {
    __atomic_add_fetch(&d->own_bytes, LT_WORKSPACE, __ATOMIC_RELAXED);
  }
  d->lt = st;
  return st;
}

/* The matmul descriptor and layouts of e's shape, and the heuristic's best algorithm for them
 * (e->ok), for operands aligned as al (x, w, bias, out) and the bias pointer bias. Returns the
 * first failure, CUBLAS_STATUS_NOT_SUPPORTED when the heuristic had no usable algorithm. */
static cublasStatus_t entry_build(lt_state *st, lt_entry *e, const void *bias,
                                  const uint32_t al[4]) {
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epi = e->relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  uint64_t ws = LT_WORKSPACE;
  cublasLtMatmulPreference_t pref = NULL;
  cublasStatus_t bs = cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
#define LT_TRY(call) \
  if (bs == CUBLAS_STATUS_SUCCESS) bs = (call)
  LT_TRY(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT_TRY(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  LT_TRY(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  /* the heuristic reads the pointer's alignment from it */
  LT_TRY(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                        sizeof bias));
  /* each layout as stored (before its op), column-major: rows, columns, leading dimension */
  LT_TRY(cublasLtMatrixLayoutCreate(&e->a, CUDA_R_32F, e->k, e->n, (int64_t)e->k));
  LT_TRY(cublasLtMatrixLayoutCreate(&e->b, CUDA_R_32F, e->k, e->m, (int64_t)e->k));
  LT_TRY(cublasLtMatrixLayoutCreate(&e->d, CUDA_R_32F, e->n, e->m, (int64_t)e->n));
  LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof ws));
  /* A is w, B is x, C and D are out */
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &al[1], sizeof al[1]));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &al[0], sizeof al[0]));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &al[3], sizeof al[3]));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &al[3], sizeof al[3]));
  cublasLtMatmulHeuristicResult_t res;
  int count = 0;
  memset(&res, 0, sizeof res);
  LT_TRY(cublasLtMatmulAlgoGetHeuristic(st->handle, e->desc, e->a, e->b, e->d, e->d, pref, 1, &res,
                                        &count));
#undef LT_TRY
  if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
  /* no result, or one that is not usable, is "not supported" */
  if (bs == CUBLAS_STATUS_SUCCESS && count > 0) bs = res.state;
  if (bs == CUBLAS_STATUS_SUCCESS && (count <= 0 || res.workspaceSize > LT_WORKSPACE))
    bs = CUBLAS_STATUS_NOT_SUPPORTED;
  e->ok = bs == CUBLAS_STATUS_SUCCESS;
  if (e->ok) e->algo = res.algo;
  return bs;
}

/* The cached entry for the call's shape and alignments, made (algorithm chosen) when new;
 * *out NULL when the plain path is to run. blas_lock held, the device current. */
static clpar_status find_entry(cuda_dev *d, int relu, size_t m, size_t n, size_t k, const void *x,
                               const void *w, const void *bias, const void *out, lt_entry **found) {
  *found = NULL;
  lt_state *st = state_of(d);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  if (!st->handle || !workspace_ready(d, st)) return CLPAR_OK;
  unsigned key = align_key(x, w, bias, out);
  for (lt_entry *e = st->cache; e; e = e->next)
    if (e->m == m && e->n == n && e->k == k && e->relu == relu && e->align == key) {
      *found = e;
      return CLPAR_OK;
    }
  if (st->cache_len >= LT_CACHE_MAX) return CLPAR_OK;
  lt_entry *e = calloc(1, sizeof *e);
  if (!e) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  e->m = m, e->n = n, e->k = k, e->relu = relu, e->align = key;
  const uint32_t al[4] = {align_of(x), align_of(w), align_of(bias), align_of(out)};
  cublasStatus_t bs = entry_build(st, e, bias, al);
  if (!e->ok)
    clpar_log(CLPAR_LOG_INFO,
              "CUDA device %d: linear_act [%zu x %zu x %zu]%s runs cuBLAS SGEMM then bias_act: "
              "cuBLASLt has no algorithm for it (%s)",
              d->ordinal, m, n, k, relu ? " relu" : "", cublasGetStatusName(bs));
  e->next = st->cache;
  st->cache = e;
  st->cache_len++;
  *found = e;
  return CLPAR_OK;
}

/* Errors of cublasLtMatmul that mean it refused the call (nothing was enqueued): the shape
 * then runs the plain path. */
static int refused(cublasStatus_t bs) {
  return bs == CUBLAS_STATUS_NOT_SUPPORTED || bs == CUBLAS_STATUS_INVALID_VALUE ||
         bs == CUBLAS_STATUS_ARCH_MISMATCH;
}

/* Enqueues the matmul of e's shape on d's stream, with this call's bias pointer in the
 * descriptor the shape's calls share; blas_lock held. */
static cublasStatus_t lt_matmul(cuda_dev *d, lt_entry *e, clpar_bref x, clpar_bref w,
                                clpar_bref bias, clpar_bref out) {
  lt_state *st = d->lt;
  const float alpha = 1.0f, beta = 0.0f; /* beta 0: out is not read, NaNs included */
  const void *bp = at(bias);
  cublasStatus_t bs =
      cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp);
  if (bs == CUBLAS_STATUS_SUCCESS)
    bs = cublasLtMatmul(st->handle, e->desc, &alpha, at(w), e->a, at(x), e->b, &beta, at(out), e->d,
                        at(out), e->d, &e->algo, st->workspace, LT_WORKSPACE, d->stream);
  if (bs == CUBLAS_STATUS_SUCCESS) st->runs++;
  return bs;
}

clpar_status clpar_cuda_lt_linear(cuda_dev *d, clpar_act_kind act, size_t m, size_t n, size_t k,
                                  clpar_bref x, clpar_bref w, clpar_bref bias, clpar_bref out,
                                  int *done) {
  *done = 0;
  if (!d->lt_use || !bias.buf || (act != CLPAR_ACT_NONE && act != CLPAR_ACT_RELU)) return CLPAR_OK;
  if (m == 0 || n == 0 || k == 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) return CLPAR_OK;
  clpar_status s = clpar_cuda_use_device(d);
  if (s != CLPAR_OK) return s;
  lt_entry *e = NULL;
  prof_pair prof;
  cublasStatus_t bs = CUBLAS_STATUS_NOT_SUPPORTED;
  pthread_mutex_lock(&d->blas_lock);
  s = find_entry(d, act == CLPAR_ACT_RELU, m, n, k, at(x), at(w), at(bias), at(out), &e);
  int run = s == CLPAR_OK && e && e->ok;
  if (run) s = clpar_cuda_op_begin(d, &prof); /* takes no lock */
  if (run && s == CLPAR_OK) bs = lt_matmul(d, e, x, w, bias, out);
  if (run && s == CLPAR_OK && refused(bs)) {
    e->ok = 0;
    clpar_log(CLPAR_LOG_WARN,
              "CUDA device %d: cublasLtMatmul refused linear_act [%zu x %zu x %zu] (%s); it runs "
              "cuBLAS SGEMM then bias_act",
              d->ordinal, m, n, k, cublasGetStatusName(bs));
  }
  pthread_mutex_unlock(&d->blas_lock);
  if (!run || s != CLPAR_OK) return s;
  if (refused(bs)) { /* nothing enqueued: the pair is dropped, the plain path profiles its ops */
    (void)clpar_cuda_op_end(d, &prof, CLPAR_ERROR_BACKEND);
    return CLPAR_OK;
  }
  *done = 1;
  return clpar_cuda_op_end(d, &prof, clpar_cuda_blas_check(bs, "cublasLtMatmul"));
}
