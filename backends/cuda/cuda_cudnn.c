/* cuda_cudnn.c — the CUDA backend's whole convolutions (backend.h's conv2d entries) through
 * cuDNN's convolution API: forward (cudnnConvolutionForward, then cudnnAddTensor for the
 * bias), backward data, backward filter and backward bias, fp32 NCHW / KCRS as clpar keeps
 * them, with groups and dilation.
 *
 * cuDNN is opened with dlopen (libcudnn.so.<major of the headers built against>) through the
 * normal search path (LD_LIBRARY_PATH, the loader's cache), the first time a CUDA device is
 * probed: libclpar does not depend on it, so a machine without cuDNN (or with one built for
 * another CUDA major version) loads clpar and runs the plain path (im2col and cuBLAS).
 *
 * Algorithms are chosen as PyTorch's benchmark mode chooses them: the first time a shape is
 * seen, cudnnFind*AlgorithmEx times every algorithm on the call's own buffers (it writes only
 * the output, which the call then writes again) with a temporary workspace as large as the
 * largest that cudnnGet*Algorithm_v7 reports, capped at WS_FIND_MAX and half the free memory,
 * and the fastest that succeeded is kept. Each choice (with the descriptors) is cached per
 * shape, kind and operand alignment, most recently used first, at most CACHE_MAX of them.
 * The timed choice may differ run to run, and some algorithms sum with atomics, so results are
 * not guaranteed to be the same bits run to run (PyTorch's benchmark mode is not either).
 *
 * Math: CUDNN_FMA_MATH, full fp32 as the host and cuBLAS paths compute. PyTorch lets cuDNN
 * convolutions use TF32 tensor cores by default (torch.backends.cudnn.allow_tf32 = True);
 * CLPAR_CUDA_TF32=1 does the same here (CUDNN_DEFAULT_MATH, and the math type of the found
 * algorithm), faster on Ampere and later with a 10-bit mantissa in the products.
 *
 * The workspace of the chosen algorithms is one buffer per device, grown on demand (the
 * stream is drained before the old one is freed), counted in the device's own_bytes and freed
 * by the workspace_trim entry (cuda_elementwise.c). The entries are QUEUE entries, called from
 * the device's worker thread one at a time, so the per-device state needs no lock. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn.h>

#include "cuda/cuda_cudnn.h"

#define CACHE_MAX 256                 /* cached choices; ResNet-50 needs about 160 */
#define WS_FIND_MAX ((size_t)1 << 30) /* the most workspace an algorithm may use */
#define MAX_PERF 32                   /* results asked of Find and Get: > 2 x algorithms */
#define STR2_(x) #x
#define STR_(x) STR2_(x)
#define CUDNN_SONAME "libcudnn.so." STR_(CUDNN_MAJOR)

/* ---- the library, opened at run time ---- */

/* One X per entry point; clang-format would chain them into a staircase. */
// clang-format off
#define CUDNN_FUNCS(X) \
  X(cudnnGetVersion) \
  X(cudnnGetCudartVersion) \
  X(cudnnGetErrorString) \
  X(cudnnGetLastErrorString) \
  X(cudnnCreate) \
  X(cudnnDestroy) \
  X(cudnnSetStream) \
  X(cudnnCreateTensorDescriptor) \
  X(cudnnSetTensor4dDescriptor) \
  X(cudnnDestroyTensorDescriptor) \
  X(cudnnCreateFilterDescriptor) \
  X(cudnnSetFilter4dDescriptor) \
  X(cudnnDestroyFilterDescriptor) \
  X(cudnnCreateConvolutionDescriptor) \
  X(cudnnSetConvolution2dDescriptor) \
  X(cudnnSetConvolutionGroupCount) \
  X(cudnnSetConvolutionMathType) \
  X(cudnnGetConvolution2dForwardOutputDim) \
  X(cudnnDestroyConvolutionDescriptor) \
  X(cudnnGetConvolutionForwardAlgorithm_v7) \
  X(cudnnFindConvolutionForwardAlgorithmEx) \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7) \
  X(cudnnFindConvolutionBackwardDataAlgorithmEx) \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7) \
  X(cudnnFindConvolutionBackwardFilterAlgorithmEx) \
  X(cudnnConvolutionForward) \
  X(cudnnAddTensor) \
  X(cudnnConvolutionBackwardData) \
  X(cudnnConvolutionBackwardFilter) \
  X(cudnnConvolutionBackwardBias)
// clang-format on

static struct {
#define MEMBER_(f) __typeof__(f) *f;
  CUDNN_FUNCS(MEMBER_)
#undef MEMBER_
} lib;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;
static char load_why[512] = "not loaded";

/* Fills lib from the library, or says why not in load_why. The handle is kept for the
 * process's life: cached handles and descriptors point into it. */
static void load(void) {
  void *h = dlopen(CUDNN_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(load_why, sizeof load_why, "%s", e ? e : "dlopen(" CUDNN_SONAME ") failed");
    return;
  }
  void *p;
#define LOAD_(f)                                                                             \
  if (!(p = dlsym(h, #f))) {                                                                 \
    snprintf(load_why, sizeof load_why, "%s has no %s (too old a cuDNN)", CUDNN_SONAME, #f); \
    dlclose(h);                                                                              \
    return;                                                                                  \
  }                                                                                          \
  memcpy(&lib.f, &p, sizeof p);
  CUDNN_FUNCS(LOAD_)
#undef LOAD_
  size_t v = lib.cudnnGetVersion(), rt = lib.cudnnGetCudartVersion();
  if (v / 10000 != CUDNN_MAJOR || rt / 1000 != CUDART_VERSION / 1000) {
    snprintf(load_why, sizeof load_why,
             "%s is cuDNN %zu built for CUDA %zu.%zu; clpar was built with cuDNN %d headers and "
             "CUDA %d.%d",
             CUDNN_SONAME, v, rt / 1000, rt % 1000 / 10, CUDNN_MAJOR, CUDART_VERSION / 1000,
             CUDART_VERSION % 1000 / 10);
    dlclose(h);
    return;
  }
  snprintf(load_why, sizeof load_why, "cuDNN %zu.%zu.%zu", v / 10000, v % 10000 / 100, v % 100);
  loaded = 1;
}

int clpar_cudnn_load(const char **why) {
  pthread_once(&load_once, load);
  *why = load_why;
  return loaded;
}

/* A switch variable: unset is dflt; "0" or "1" exactly; anything else refused. */
static clpar_status env_switch(const char *name, int dflt, int *value, int *set,
                               const char *meaning) {
  const char *v = getenv(name);
  *value = dflt;
  *set = v != NULL;
  if (!v) return CLPAR_OK;
  if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0) {
    *value = v[0] == '1';
    return CLPAR_OK;
  }
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "cuda backend: %s is \"%.32s\"; use %s",
                         name, v, meaning);
}

clpar_status clpar_cudnn_settings(int *use, int *asked, int *tf32) {
  int set = 0;
  /* Opt-in: on an H200 the ResNet-50 step took 10.6 ms through cuDNN against 6.6 ms on the
   * plain path, and one layer's forward differed from the host by 2.1e-4 (docs/devices.md). */
  clpar_status s = env_switch("CLPAR_CUDA_CUDNN", 0, use, &set,
                              "1 (convolutions through cuDNN) or 0 (im2col and cuBLAS)");
  *asked = set && *use;
  if (s == CLPAR_OK)
    s = env_switch("CLPAR_CUDA_TF32", 0, tf32, &set,
                   "1 (cuDNN convolutions may use TF32 tensor cores) or 0 (full fp32)");
  return s;
}

/* ---- errors ---- */

static clpar_status fail(const char *what, cudnnStatus_t st) {
  char detail[256] = "";
  lib.cudnnGetLastErrorString(detail, sizeof detail);
  (void)cudaGetLastError(); /* see clpar_cuda_fail */
  clpar_status s = st == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                           st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                       ? CLPAR_ERROR_OUT_OF_MEMORY
                       : CLPAR_ERROR_BACKEND;
  return clpar_set_error(s, "cuda conv2d: %s failed: %s%s%.200s", what, lib.cudnnGetErrorString(st),
                         detail[0] ? ": " : "", detail);
}

#define TRY(what, call)                                      \
  do {                                                       \
    cudnnStatus_t st_ = (call);                              \
    if (st_ != CUDNN_STATUS_SUCCESS) return fail(what, st_); \
  } while (0)

/* ---- the per-device state and the cache ---- */

enum { K_FWD, K_BWD_DATA, K_BWD_FILTER };
static const char *const kind_name[3] = {"forward", "backward data", "backward filter"};

typedef struct entry {
  struct entry *next;
  int kind;
  unsigned align; /* the alignments of the kind's three operands (align_of) */
  clpar_conv2d_shape s;
  cudnnTensorDescriptor_t x, y, bias;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  int algo;
  size_t ws; /* the algorithm's workspace */
} entry;

typedef struct cudnn_state {
  cudnnHandle_t handle;
  entry *cache; /* most recently used first */
  int cache_len;
  void *ws;
  size_t ws_bytes;
} cudnn_state;

static void entry_free(entry *e) {
  if (!e) return;
  if (e->x) lib.cudnnDestroyTensorDescriptor(e->x);
  if (e->y) lib.cudnnDestroyTensorDescriptor(e->y);
  if (e->bias) lib.cudnnDestroyTensorDescriptor(e->bias);
  if (e->w) lib.cudnnDestroyFilterDescriptor(e->w);
  if (e->conv) lib.cudnnDestroyConvolutionDescriptor(e->conv);
  free(e);
}

void clpar_cudnn_release(cuda_dev *d) {
  cudnn_state *st = d->cudnn;
  if (!st) return;
  while (st->cache) {
    entry *e = st->cache;
    st->cache = e->next;
    entry_free(e);
  }
  if (st->ws) (void)cudaFree(st->ws);
  if (st->handle) (void)lib.cudnnDestroy(st->handle);
  (void)cudaGetLastError();
  free(st);
  d->cudnn = NULL;
}

/* The device's state, made at its first convolution (the device is current). */
static clpar_status state_of(cuda_dev *d, cudnn_state **out) {
  if (d->cudnn) {
    *out = d->cudnn;
    return CLPAR_OK;
  }
  cudnn_state *st = calloc(1, sizeof *st);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "cuda conv2d: out of host memory");
  cudnnStatus_t cs = lib.cudnnCreate(&st->handle);
  if (cs == CUDNN_STATUS_SUCCESS) {
    cs = lib.cudnnSetStream(st->handle, d->stream);
    if (cs != CUDNN_STATUS_SUCCESS) {
      (void)lib.cudnnDestroy(st->handle);
      free(st);
      return fail("cudnnSetStream", cs);
    }
  } else {
    free(st);
    return fail("cudnnCreate", cs);
  }
  d->cudnn = st;
  *out = st;
  return CLPAR_OK;
}

/* The workspace holds at least bytes; an old one may still be in use by enqueued work, so
 * the stream is drained before it is freed (only while shapes are first seen). */
static clpar_status ws_reserve(cuda_dev *d, cudnn_state *st, size_t bytes) {
  if (st->ws_bytes >= bytes) return CLPAR_OK;
  if (st->ws) {
    clpar_status s = clpar_cuda_check(cudaStreamSynchronize(d->stream),
                                      "cudaStreamSynchronize(cuDNN workspace)");
    clpar_backend_waited();
    if (s == CLPAR_OK) s = clpar_cuda_check(cudaFree(st->ws), "cudaFree(cuDNN workspace)");
    if (s != CLPAR_OK) return s;
    __atomic_sub_fetch(&d->own_bytes, st->ws_bytes, __ATOMIC_RELAXED);
    st->ws = NULL;
    st->ws_bytes = 0;
  }
  void *p = NULL;
  char what[64];
  snprintf(what, sizeof what, "cudaMalloc(cuDNN workspace, %zu bytes)", bytes);
  clpar_status s = clpar_cuda_check(cudaMalloc(&p, bytes), what);
  if (s == CLPAR_OK) {
    st->ws = p;
    st->ws_bytes = bytes;
    __atomic_add_fetch(&d->own_bytes, bytes, __ATOMIC_RELAXED);
  }
  return s;
}

clpar_status clpar_cudnn_trim(cuda_dev *d) {
  cudnn_state *st = d->cudnn;
  if (!st || !st->ws) return CLPAR_OK;
  clpar_status s = clpar_cuda_check(cudaFree(st->ws), "cudaFree(cuDNN workspace)");
  if (s != CLPAR_OK) return s;
  __atomic_sub_fetch(&d->own_bytes, st->ws_bytes, __ATOMIC_RELAXED);
  st->ws = NULL;
  st->ws_bytes = 0;
  return CLPAR_OK;
}

/* 16, 8 or 4: what p is aligned to, in bytes. */
static unsigned align_of(const void *p) {
  uintptr_t v = (uintptr_t)p;
  return v % 16 == 0 ? 16 : v % 8 == 0 ? 8 : 4;
}

static clpar_status int_dims(const clpar_conv2d_shape *s) {
  int64_t big = INT_MAX;
  int64_t x = s->n * s->c * s->h * s->w, y = s->n * s->o * s->oh * s->ow;
  int64_t w = s->o * (s->c / s->groups) * s->kh * s->kw;
  if (x <= big && y <= big && w <= big) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                         "cuda conv2d: input, output or weight has more than %d elements, more "
                         "than cuDNN's 4-d descriptors take; set CLPAR_CUDA_CUDNN=0",
                         INT_MAX);
}

/* The entry's descriptors: x [n, c, h, w], y [n, o, oh, ow], bias [1, o, 1, 1], the filter
 * [o, c / groups, kh, kw], and the convolution (cross-correlation, as PyTorch's). */
static clpar_status make_descs(const clpar_conv2d_shape *s, int tf32, entry *e) {
  clpar_status st = int_dims(s);
  if (st != CLPAR_OK) return st;
  TRY("cudnnCreateTensorDescriptor", lib.cudnnCreateTensorDescriptor(&e->x));
  TRY("cudnnCreateTensorDescriptor", lib.cudnnCreateTensorDescriptor(&e->y));
  TRY("cudnnCreateTensorDescriptor", lib.cudnnCreateTensorDescriptor(&e->bias));
  TRY("cudnnCreateFilterDescriptor", lib.cudnnCreateFilterDescriptor(&e->w));
  TRY("cudnnCreateConvolutionDescriptor", lib.cudnnCreateConvolutionDescriptor(&e->conv));
  const cudnnTensorFormat_t nchw = CUDNN_TENSOR_NCHW;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  TRY("cudnnSetTensor4dDescriptor(x)",
      lib.cudnnSetTensor4dDescriptor(e->x, nchw, f32, (int)s->n, (int)s->c, (int)s->h, (int)s->w));
  TRY("cudnnSetTensor4dDescriptor(y)",
      lib.cudnnSetTensor4dDescriptor(e->y, nchw, f32, (int)s->n, (int)s->o, (int)s->oh,
                                     (int)s->ow));
  TRY("cudnnSetTensor4dDescriptor(bias)",
      lib.cudnnSetTensor4dDescriptor(e->bias, nchw, f32, 1, (int)s->o, 1, 1));
  TRY("cudnnSetFilter4dDescriptor",
      lib.cudnnSetFilter4dDescriptor(e->w, f32, nchw, (int)s->o, (int)(s->c / s->groups),
                                     (int)s->kh, (int)s->kw));
  TRY("cudnnSetConvolution2dDescriptor",
      lib.cudnnSetConvolution2dDescriptor(e->conv, (int)s->ph, (int)s->pw, (int)s->sh, (int)s->sw,
                                          (int)s->dh, (int)s->dw, CUDNN_CROSS_CORRELATION, f32));
  TRY("cudnnSetConvolutionGroupCount", lib.cudnnSetConvolutionGroupCount(e->conv, (int)s->groups));
  TRY("cudnnSetConvolutionMathType",
      lib.cudnnSetConvolutionMathType(e->conv, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  int n = 0, c = 0, h = 0, w = 0;
  TRY("cudnnGetConvolution2dForwardOutputDim",
      lib.cudnnGetConvolution2dForwardOutputDim(e->conv, e->x, e->w, &n, &c, &h, &w));
  if (n != s->n || c != s->o || h != s->oh || w != s->ow)
    return clpar_set_error(CLPAR_ERROR_INTERNAL,
                           "cuda conv2d: cuDNN's output is [%d, %d, %d, %d], clpar's [%lld, %lld, "
                           "%lld, %lld]",
                           n, c, h, w, (long long)s->n, (long long)s->o, (long long)s->oh,
                           (long long)s->ow);
  return CLPAR_OK;
}

/* ---- choosing an algorithm ---- */

/* One result of Find or Get, whatever the kind. */
typedef struct {
  int algo;
  cudnnStatus_t status;
  size_t memory;
  cudnnMathType_t math;
} perf;

#define COPY_PERF_(src, n, out)           \
  for (int i_ = 0; i_ < (n); i_++) {      \
    (out)[i_].algo = (int)(src)[i_].algo; \
    (out)[i_].status = (src)[i_].status;  \
    (out)[i_].memory = (src)[i_].memory;  \
    (out)[i_].math = (src)[i_].mathType;  \
  }

/* cudnnGet*Algorithm_v7's heuristic list for e's kind. */
static clpar_status get_v7(cudnnHandle_t h, const entry *e, perf *out, int *n) {
  *n = 0;
  if (e->kind == K_FWD) {
    cudnnConvolutionFwdAlgoPerf_t r[MAX_PERF];
    TRY("cudnnGetConvolutionForwardAlgorithm_v7",
        lib.cudnnGetConvolutionForwardAlgorithm_v7(h, e->x, e->w, e->conv, e->y, MAX_PERF, n, r));
    COPY_PERF_(r, *n, out);
  } else if (e->kind == K_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t r[MAX_PERF];
    TRY("cudnnGetConvolutionBackwardDataAlgorithm_v7",
        lib.cudnnGetConvolutionBackwardDataAlgorithm_v7(h, e->w, e->y, e->conv, e->x, MAX_PERF, n,
                                                        r));
    COPY_PERF_(r, *n, out);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t r[MAX_PERF];
    TRY("cudnnGetConvolutionBackwardFilterAlgorithm_v7",
        lib.cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, e->x, e->y, e->conv, e->w, MAX_PERF, n,
                                                          r));
    COPY_PERF_(r, *n, out);
  }
  return CLPAR_OK;
}

/* cudnnFind*AlgorithmEx for e's kind, on the call's operands p (forward x, w, y; backward data
 * w, dy, dx; backward filter x, dy, dw: the last one written), fastest first. */
static clpar_status find_ex(cudnnHandle_t h, const entry *e, void *const *p, void *ws, size_t bytes,
                            perf *out, int *n) {
  *n = 0;
  if (e->kind == K_FWD) {
    cudnnConvolutionFwdAlgoPerf_t r[MAX_PERF];
    TRY("cudnnFindConvolutionForwardAlgorithmEx",
        lib.cudnnFindConvolutionForwardAlgorithmEx(h, e->x, p[0], e->w, p[1], e->conv, e->y, p[2],
                                                   MAX_PERF, n, r, ws, bytes));
    COPY_PERF_(r, *n, out);
  } else if (e->kind == K_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t r[MAX_PERF];
    TRY("cudnnFindConvolutionBackwardDataAlgorithmEx",
        lib.cudnnFindConvolutionBackwardDataAlgorithmEx(h, e->w, p[0], e->y, p[1], e->conv, e->x,
                                                        p[2], MAX_PERF, n, r, ws, bytes));
    COPY_PERF_(r, *n, out);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t r[MAX_PERF];
    TRY("cudnnFindConvolutionBackwardFilterAlgorithmEx",
        lib.cudnnFindConvolutionBackwardFilterAlgorithmEx(h, e->x, p[0], e->y, p[1], e->conv, e->w,
                                                          p[2], MAX_PERF, n, r, ws, bytes));
    COPY_PERF_(r, *n, out);
  }
  return CLPAR_OK;
}

/* The workspace Find may use: the most any algorithm the heuristics list asks for, at most
 * WS_FIND_MAX and half the device's free memory. */
static clpar_status find_budget(cudnnHandle_t h, const entry *e, size_t *bytes) {
  perf r[MAX_PERF];
  int n = 0;
  clpar_status s = get_v7(h, e, r, &n);
  if (s != CLPAR_OK) return s;
  size_t need = 0, free_b = 0, total = 0;
  for (int i = 0; i < n && i < MAX_PERF; i++)
    if (r[i].status == CUDNN_STATUS_SUCCESS && r[i].memory > need) need = r[i].memory;
  if (need > WS_FIND_MAX) need = WS_FIND_MAX;
  s = clpar_cuda_check(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
  if (s == CLPAR_OK && need > free_b / 2) need = free_b / 2;
  *bytes = need;
  return s;
}

/* The first usable result of Find (fastest first): it succeeded within bytes of workspace,
 * in a math type allowed. Full fp32 (tf32 0) takes FMA results first, and DEFAULT_MATH ones
 * only when there is none (run under the descriptor's FMA math all the same); with tf32 any. */
static int pick_result(const perf *r, int n, size_t bytes, int tf32) {
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n && i < MAX_PERF; i++) {
      if (r[i].status != CUDNN_STATUS_SUCCESS || r[i].memory > bytes) continue;
      if (tf32 || r[i].math == CUDNN_FMA_MATH || (pass && r[i].math == CUDNN_DEFAULT_MATH))
        return i;
    }
  return -1;
}

/* Times the algorithms of e's kind on operands p and keeps the fastest usable one in e (with
 * tf32, its math type set on e->conv, as PyTorch does; without, e->conv keeps FMA math). */
static clpar_status choose(cuda_dev *d, cudnn_state *st, entry *e, void *const *p) {
  size_t bytes = 0;
  void *tmp = NULL;
  clpar_status s = find_budget(st->handle, e, &bytes);
  if (s == CLPAR_OK && bytes && cudaMalloc(&tmp, bytes) != cudaSuccess) {
    (void)cudaGetLastError(); /* no room: Find tries the algorithms that need none */
    tmp = NULL;
    bytes = 0;
  }
  perf r[MAX_PERF];
  int n = 0;
  if (s == CLPAR_OK) s = find_ex(st->handle, e, p, tmp, bytes, r, &n);
  if (tmp) {
    clpar_status f = clpar_cuda_check(cudaFree(tmp), "cudaFree(cuDNN find workspace)");
    clpar_backend_waited(); /* cudaFree synchronizes the device */
    if (s == CLPAR_OK) s = f;
  }
  if (s != CLPAR_OK) return s;
  int pick = pick_result(r, n, bytes, d->cudnn_tf32);
  if (pick < 0)
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                           "cuda conv2d: cuDNN found no %s algorithm for this shape (%d tried, "
                           "%zu bytes of workspace); set CLPAR_CUDA_CUDNN=0",
                           kind_name[e->kind], n, bytes);
  if (d->cudnn_tf32)
    TRY("cudnnSetConvolutionMathType", lib.cudnnSetConvolutionMathType(e->conv, r[pick].math));
  e->algo = r[pick].algo;
  e->ws = r[pick].memory;
  return CLPAR_OK;
}

/* The cached entry for (s, kind, p's alignments), made (and its algorithm found on p) and put
 * first when missing; the least recently used one is dropped past CACHE_MAX. */
static clpar_status lookup(cuda_dev *d, cudnn_state *st, const clpar_conv2d_shape *s, int kind,
                           void *const *p, entry **out) {
  unsigned align = align_of(p[0]) | align_of(p[1]) << 5 | align_of(p[2]) << 10;
  entry **pp = &st->cache, *last_prev = NULL;
  for (entry *e = st->cache; e; pp = &e->next, e = e->next) {
    if (e->kind == kind && e->align == align && memcmp(&e->s, s, sizeof *s) == 0) {
      *pp = e->next; /* move to the front */
      e->next = st->cache;
      st->cache = e;
      *out = e;
      return CLPAR_OK;
    }
    if (e->next && !e->next->next) last_prev = e;
  }
  entry *e = calloc(1, sizeof *e);
  if (!e) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "cuda conv2d: out of host memory");
  e->kind = kind;
  e->align = align;
  e->s = *s;
  clpar_status r = make_descs(s, d->cudnn_tf32, e);
  if (r == CLPAR_OK) r = choose(d, st, e, p);
  if (r != CLPAR_OK) {
    entry_free(e);
    return r;
  }
  e->next = st->cache;
  st->cache = e;
  if (++st->cache_len > CACHE_MAX && last_prev) {
    entry_free(last_prev->next);
    last_prev->next = NULL;
    st->cache_len--;
  }
  *out = e;
  return CLPAR_OK;
}

/* ---- the entries ---- */

static void *ptr(clpar_bref r) {
  return r.buf ? (void *)at(r) : NULL;
}

/* The device current, its state, and the entries of the kinds wanted (ops[k] non-NULL: the
 * kind's three operands), found before any of them runs: Find writes the outputs. */
static clpar_status prepare(cuda_dev *d, const clpar_conv2d_shape *s, void *const *ops[3],
                            cudnn_state **st, entry *e[3]) {
  clpar_status r = clpar_cuda_use_device(d);
  if (r == CLPAR_OK) r = state_of(d, st);
  size_t ws = 0;
  for (int k = 0; k < 3 && r == CLPAR_OK; k++) {
    e[k] = NULL;
    if (ops[k]) r = lookup(d, *st, s, k, ops[k], &e[k]);
    if (r == CLPAR_OK && e[k] && e[k]->ws > ws) ws = e[k]->ws;
  }
  if (r == CLPAR_OK) r = ws_reserve(d, *st, ws);
  return r;
}

clpar_status clpar_cuda_entry_conv2d(void *dev, clpar_conv2d_shape s, clpar_bref x,
                                     clpar_bref weight, clpar_bref bias, clpar_bref y) {
  cuda_dev *d = dev;
  void *p[3] = {ptr(x), ptr(weight), ptr(y)};
  void *const *ops[3] = {p, NULL, NULL};
  cudnn_state *st = NULL;
  entry *e[3];
  clpar_status r = prepare(d, &s, ops, &st, e);
  if (r != CLPAR_OK) return r;
  prof_pair prof;
  if ((r = clpar_cuda_op_begin(d, &prof)) != CLPAR_OK) return r;
  const float one = 1.0f, zero = 0.0f;
  cudnnStatus_t cs = lib.cudnnConvolutionForward(st->handle, &one, e[0]->x, p[0], e[0]->w, p[1],
                                                 e[0]->conv, (cudnnConvolutionFwdAlgo_t)e[0]->algo,
                                                 st->ws, st->ws_bytes, &zero, e[0]->y, p[2]);
  if (cs != CUDNN_STATUS_SUCCESS)
    r = fail("cudnnConvolutionForward", cs);
  else if (bias.buf && (cs = lib.cudnnAddTensor(st->handle, &one, e[0]->bias, ptr(bias), &one,
                                                e[0]->y, p[2])) != CUDNN_STATUS_SUCCESS)
    r = fail("cudnnAddTensor(bias)", cs);
  return clpar_cuda_op_end(d, &prof, r);
}

/* dx, dw and db, each where its buf is set; all of them written whole (beta 0). */
static clpar_status run_backward(cudnn_state *st, entry *const e[3], void *const *pd,
                                 void *const *pf, void *db) {
  const float one = 1.0f, zero = 0.0f;
  if (e[1])
    TRY("cudnnConvolutionBackwardData",
        lib.cudnnConvolutionBackwardData(st->handle, &one, e[1]->w, pd[0], e[1]->y, pd[1],
                                         e[1]->conv, (cudnnConvolutionBwdDataAlgo_t)e[1]->algo,
                                         st->ws, st->ws_bytes, &zero, e[1]->x, pd[2]));
  if (e[2])
    TRY("cudnnConvolutionBackwardFilter",
        lib.cudnnConvolutionBackwardFilter(st->handle, &one, e[2]->x, pf[0], e[2]->y, pf[1],
                                           e[2]->conv, (cudnnConvolutionBwdFilterAlgo_t)e[2]->algo,
                                           st->ws, st->ws_bytes, &zero, e[2]->w, pf[2]));
  if (db && e[2]) /* db comes with dw: e[2] holds the bias's descriptor */
    TRY("cudnnConvolutionBackwardBias",
        lib.cudnnConvolutionBackwardBias(st->handle, &one, e[2]->y, pf[1], &zero, e[2]->bias, db));
  return CLPAR_OK;
}

clpar_status clpar_cuda_entry_conv2d_backward(void *dev, clpar_conv2d_shape s, clpar_bref x,
                                              clpar_bref weight, clpar_bref gy, clpar_bref dx,
                                              clpar_bref dw, clpar_bref db) {
  cuda_dev *d = dev;
  void *pd[3] = {ptr(weight), ptr(gy), ptr(dx)}, *pf[3] = {ptr(x), ptr(gy), ptr(dw)};
  void *const *ops[3] = {NULL, dx.buf ? pd : NULL, dw.buf ? pf : NULL};
  if (db.buf && !dw.buf) /* backend.h: the core asks for dw whenever it asks for db */
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "cuda conv2d_backward: db without dw");
  if (!ops[1] && !ops[2]) return CLPAR_OK;
  cudnn_state *st = NULL;
  entry *e[3];
  clpar_status r = prepare(d, &s, ops, &st, e);
  if (r != CLPAR_OK) return r;
  prof_pair prof;
  if ((r = clpar_cuda_op_begin(d, &prof)) != CLPAR_OK) return r;
  return clpar_cuda_op_end(d, &prof, run_backward(st, e, pd, pf, ptr(db)));
}
