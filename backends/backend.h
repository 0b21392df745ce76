/* backend.h — the private interface between clpar's core and a backend (opencl, cuda, host),
 * and the only clpar header a backend includes: errors, logging and device registration are
 * declared here, so a backend never sees the core's tensors, nodes or devices.
 *
 * A backend's probe function reports its devices; each device is a table of entries
 * (clpar_backend_iface, shared by every device of that backend) plus the backend's own context
 * pointer. The core never sees cl_mem, CUdeviceptr or a platform id: buffers, host staging
 * blocks and events are opaque void* handles, and ops receive buffer + element offset pairs.
 *
 * The entries come from one X-macro list, CLPAR_BACKEND_ENTRIES: the table's members, the
 * backends' tables (CLPAR_BACKEND_TABLE), the core's completeness check and its dispatch
 * functions (src/runtime/worker.c) are all generated from it, so an entry is added in one
 * place.
 *
 * Two kinds of entry:
 * - DIRECT entries (alloc, release, events' query/then/free, supports_op) may be called from
 *   any host thread at any time; the backend makes them thread-safe.
 * - QUEUE entries enqueue work on the device's one in-order queue (stream). The core calls
 *   them only from the device's worker thread (src/runtime/worker.c), one at a time and in
 *   order, so a backend needs no lock around them, and PoCL's devices, whose `basic` driver runs a
 *   kernel in the thread that enqueues it, each get a thread of their own. They return
 *   without waiting for the device; `read`, `write` and `host_alloc` may complete later
 *   (the core keeps their host memory alive until an event recorded after them completes).
 *
 * Rules every backend follows:
 * - Every entry returns a clpar_status and, on error, sets the thread-local message with
 *   clpar_set_error naming what failed and the driver's error name
 *   ("clEnqueueNDRangeKernel(binary): CL_OUT_OF_RESOURCES"); the core prefixes the device id.
 * - Offsets and counts are in float elements (4-byte words) unless the name says bytes. Int
 *   tensors (int32, int64) keep that unit: an int64 element is two words, its offsets even;
 *   the entries that move memory (fill with 0, copy, read, write) serve every dtype, and the
 *   compute entries see float32 only (pick, nll, nll_backward also read int32 indices;
 *   half_convert and gemm_half read 16-bit floats, backend_half.h).
 * - The core validates shapes before calling: a backend may assume counts >= 1 and buffers
 *   large enough.
 * - Every wait for the device inside an entry is reported with clpar_backend_waited.
 * - Entries marked optional (required = 0) may be NULL. For the fused ops (softmax_backward,
 *   nll, nll_backward, xent, xent_backward, sgd_step, adam_step, bias_act, bias_act_backward,
 *   linear_act, linear_act_backward)
 *   the core then composes the op from primitive entries (fill, copy, binary, scale, unary,
 *   gemm, pick, softmax, nll_ignore; src/runtime/compose.c), so a new
 * backend can start with the primitives only; supports_op lets a backend refuse a fused op for some
 * of its devices (asked once per device at clpar_init). Without gemm_half (or refused), the
 * core widens the 16-bit operands itself and calls gemm. A device without profile cannot be
 * profiled, and one without peer_access/copy_peer copies to its peers through host staging. */
#ifndef CLPAR_BACKEND_H
#define CLPAR_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "clpar/device.h"
#include "clpar/log.h"
#include "clpar/status.h"
#include "clpar/version.h"

#define CLPAR_BACKEND_ABI_VERSION 20

#if defined(__GNUC__)
#define CLPAR_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLPAR_PRINTF(f, a)
#endif

/* ---- what the core gives a backend ---- */

/* Sets the thread-local error message and returns status, so that a failure path reads
 * `return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "add: a is [%s], b is [%s]", ...)`. */
clpar_status clpar_set_error(clpar_status status, const char *fmt, ...) CLPAR_PRINTF(2, 3);
/* Appends text to the current error message (a build log, say). */
void clpar_append_error(const char *fmt, ...) CLPAR_PRINTF(1, 2);
/* Logs to stderr or the user's callback, by level (never to stdout). */
void clpar_log(clpar_log_level level, const char *fmt, ...) CLPAR_PRINTF(2, 3);
/* A backend calls this each time one of its entries blocks the calling thread until the
 * device has done something: clFinish, clWaitForEvents, a blocking map or read,
 * cudaStreamSynchronize, cudaEventSynchronize, a cudaFree or cudaFreeHost (which synchronize
 * the device). The core counts it, on the device whose entry is running, in
 * clpar_device_host_waits and in the counters' backend_waits. Outside an entry called by
 * the core's dispatch it does nothing. */
void clpar_backend_waited(void);
/* Seconds on the monotonic clock (CLOCK_MONOTONIC), for deadlines and timings; the one
 * clock of the library, core and backends alike (src/runtime/clock.c). */
double clpar_clock_seconds(void);

/* The size of a communicator's id (comm_id, comm_init): NCCL's ncclUniqueId. */
#define CLPAR_COMM_ID_BYTES 128

/* A buffer and an offset into it, in floats. */
typedef struct clpar_bref {
  void *buf;
  size_t off;
} clpar_bref;

typedef enum clpar_binary_kind {
  CLPAR_BINARY_ADD = 0,
  CLPAR_BINARY_SUB = 1,
  CLPAR_BINARY_MUL = 2,
  CLPAR_BINARY_DIV = 3
} clpar_binary_kind;

typedef enum clpar_unary_kind {
  CLPAR_UNARY_RELU = 0,
  CLPAR_UNARY_SIGMOID = 1,
  CLPAR_UNARY_TANH = 2,
  CLPAR_UNARY_EXP = 3,  /* forward only */
  CLPAR_UNARY_SQRT = 4, /* forward only */
  CLPAR_UNARY_NEG = 5   /* forward only */
} clpar_unary_kind;

/* The activation of the fused bias entries (bias_act, bias_act_backward): none, relu
 * max(x, 0), sigmoid, tanh. */
typedef enum clpar_act_kind {
  CLPAR_ACT_NONE = 0,
  CLPAR_ACT_RELU = 1,
  CLPAR_ACT_SIGMOID = 2,
  CLPAR_ACT_TANH = 3
} clpar_act_kind;

/* linear_act_backward's accumulate bits: the output adds to what is there. */
enum { CLPAR_ACC_DX = 1, CLPAR_ACC_DW = 2, CLPAR_ACC_DB = 4 };

/* One SGD update with PyTorch's rule (torch.optim.SGD), per element:
 *   g = grad + weight_decay * p
 *   if momentum != 0: buf = first ? g : momentum * buf + (1 - dampening) * g
 *                     g = nesterov ? g + momentum * buf : buf
 *   p = p - lr * g */
typedef struct clpar_sgd_args {
  float lr, momentum, dampening, weight_decay;
  int nesterov, first;
} clpar_sgd_args;

/* The geometry of a 2-D convolution or pooling over a chunk of n images (planes for the
 * pools), as the core passes it to im2col, col2im and the pools (src/nn/conv.c, pool.c).
 * x's image b, channel ci starts at element b * img_stride + ci * h * w of x's bref; the
 * output is oh x ow per image, with oh = (h + 2 ph - dh (kh - 1) - 1) / sh + 1 (same for w).
 * The pools take c = 1, img_stride = h * w and dilation 1; adaptive pooling uses n, h, w, oh
 * and ow only. */
typedef struct clpar_conv_geom {
  int64_t n, c, h, w, img_stride;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t oh, ow;
} clpar_conv_geom;

/* A whole 2-D convolution, for the entries that hand it to a library (conv2d and its two
 * backward entries; oneDNN on the host): x [n, c, h, w], weight [o, c / groups, kh, kw] and
 * y [n, o, oh, ow], each contiguous (NCHW, OIHW) from its bref's offset. */
typedef struct clpar_conv2d_shape {
  int64_t n, c, h, w, o, groups;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t oh, ow;
} clpar_conv2d_shape;

/* One Adam/AdamW update with PyTorch's rule, per element (step t >= 1), in the order of
 * torch.optim's _single_tensor_adam on a CPU (fma: one rounding, as ATen's vectorized add
 * with alpha and addcmul round):
 *   decoupled (AdamW): p = p * keep;  else g = fma(weight_decay, p, grad)
 *   m = fma(one_minus_beta1, g, beta1 * m);  v = fma(one_minus_beta2 * g, g, beta2 * v)
 *   p = p - (step * m) / (sqrt(v) / root2 + eps)
 * The caller computes the scalars in double, as PyTorch does in Python, each rounded once:
 * keep = 1 - lr * weight_decay, one_minus_beta = 1 - beta, step = lr / (1 - beta1^t),
 * root2 = sqrt(1 - beta2^t). */
typedef struct clpar_adam_args {
  float lr, beta1, beta2, eps, weight_decay;
  float one_minus_beta1, one_minus_beta2, step, root2, keep;
  int decoupled;
} clpar_adam_args;

/* The tensor ops' element-wise math (pointwise), with a float parameter p
 * (pow's exponent; unused otherwise): log x; pow(x, p); GELU's tanh approximation
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); exact GELU 0.5 x (1 + erf(x / sqrt 2)). */
typedef enum clpar_pointwise_kind {
  CLPAR_PW_LOG = 0,
  CLPAR_PW_POW = 1,
  CLPAR_PW_GELU_TANH = 2,
  CLPAR_PW_GELU_ERF = 3
} clpar_pointwise_kind;

/* strided_copy's geometry: ndim (1 .. 8) dimensions of size shape[d]; element (i_0 .. i_n-1)
 * is read at in.off + sum i_d in_stride[d] and written at out.off + sum i_d out_stride[d]
 * (strides in words, >= 0). */
typedef struct clpar_strided_geom {
  int ndim;
  int64_t shape[8], in_stride[8], out_stride[8];
} clpar_strided_geom;

/* A run of element-wise commands fused into one kernel at capture end (ew_chain,
 * src/runtime/capture_fuse.c): every op is computed per element i < n, in order, and each op
 * stores its output as its command would have. An op's input in[k] >= 0 reads refs[in[k]] at
 * element i; in[k] < 0 takes the result of op -1 - in[k] (same element). The expressions are
 * the single commands' own, so the results are the same bits. */
enum { CLPAR_EW_MAX_OPS = 16 };
typedef enum clpar_ew_type {
  CLPAR_EW_FILL = 0,           /* p */
  CLPAR_EW_BINARY = 1,         /* in[0] (op kind) in[1], kind a clpar_binary_kind */
  CLPAR_EW_SCALE = 2,          /* p * in[0] */
  CLPAR_EW_UNARY = 3,          /* kind a clpar_unary_kind of in[0] */
  CLPAR_EW_UNARY_BACKWARD = 4, /* in[0] g, in[1] saved */
  CLPAR_EW_POINTWISE = 5       /* in[0] x, in[1] g when has_g; kind a clpar_pointwise_kind */
} clpar_ew_type;
typedef struct clpar_ew_op {
  int type, kind, has_g;
  float p;
  int in[2];
  int out; /* in refs */
} clpar_ew_op;
typedef struct clpar_ew_chain {
  size_t n;
  int n_ops, n_refs;
  clpar_ew_op ops[CLPAR_EW_MAX_OPS];
  clpar_bref refs[3 * CLPAR_EW_MAX_OPS];
  void *kernel; /* the backend's, set by ew_chain_prepare, valid while the device lives */
} clpar_ew_chain;

/* Called once an event has completed, from any thread (a driver's, or the one that asked).
 * It must not call into clpar or the driver; it may take a lock and signal. */
typedef void (*clpar_event_fn)(void *user, clpar_status status);

/* ---- the entries ----
 *
 * CLPAR_BACKEND_ENTRIES(X) calls X(name, kind, required) once per entry, in table order;
 * CLPAR_BE_ARGS_<name>(F) calls F(type, field) once per argument after `void *dev`. Every
 * entry returns clpar_status. */
#define CLPAR_BACKEND_ENTRIES(X)   \
  X(destroy, DIRECT, 1)            \
  X(alloc, DIRECT, 1)              \
  X(release, DIRECT, 1)            \
  X(event_query, DIRECT, 1)        \
  X(event_then, DIRECT, 1)         \
  X(event_free, DIRECT, 1)         \
  X(supports_op, DIRECT, 0)        \
  X(peer_access, DIRECT, 0)        \
  X(host_alloc, QUEUE, 1)          \
  X(host_free, QUEUE, 1)           \
  X(write, QUEUE, 1)               \
  X(read, QUEUE, 1)                \
  X(copy, QUEUE, 1)                \
  X(finish, QUEUE, 1)              \
  X(event_record, QUEUE, 1)        \
  X(fill, QUEUE, 1)                \
  X(binary, QUEUE, 1)              \
  X(scale, QUEUE, 1)               \
  X(sum_rows, QUEUE, 1)            \
  X(gemm, QUEUE, 1)                \
  X(gemm_batched, QUEUE, 1)        \
  X(gemm_half, QUEUE, 0)           \
  X(broadcast_rows, QUEUE, 1)      \
  X(reduce_sum, QUEUE, 1)          \
  X(expand, QUEUE, 1)              \
  X(unary, QUEUE, 1)               \
  X(unary_backward, QUEUE, 1)      \
  X(softmax, QUEUE, 1)             \
  X(pick, QUEUE, 1)                \
  X(softmax_backward, QUEUE, 0)    \
  X(nll, QUEUE, 0)                 \
  X(nll_backward, QUEUE, 0)        \
  X(xent, QUEUE, 0)                \
  X(xent_backward, QUEUE, 0)       \
  X(sgd_step, QUEUE, 0)            \
  X(adam_step, QUEUE, 0)           \
  X(profile, QUEUE, 0)             \
  X(profile_read, QUEUE, 0)        \
  X(copy_peer, QUEUE, 0)           \
  X(tune_gemm, QUEUE, 0)           \
  X(im2col, QUEUE, 1)              \
  X(col2im, QUEUE, 1)              \
  X(swap01, QUEUE, 1)              \
  X(maxpool, QUEUE, 1)             \
  X(maxpool_backward, QUEUE, 1)    \
  X(avgpool, QUEUE, 1)             \
  X(avgpool_backward, QUEUE, 1)    \
  X(bn_stats, QUEUE, 1)            \
  X(bn_apply, QUEUE, 1)            \
  X(bn_backward_sums, QUEUE, 1)    \
  X(bn_backward, QUEUE, 1)         \
  X(bias_act, QUEUE, 0)            \
  X(bias_act_backward, QUEUE, 0)   \
  X(linear_act, QUEUE, 0)          \
  X(linear_act_backward, QUEUE, 0) \
  X(conv2d, QUEUE, 0)              \
  X(conv2d_backward, QUEUE, 0)     \
  X(comm_id, DIRECT, 0)            \
  X(comm_init, DIRECT, 0)          \
  X(comm_query, DIRECT, 0)         \
  X(comm_abort, DIRECT, 0)         \
  X(comm_free, DIRECT, 0)          \
  X(comm_allreduce, QUEUE, 0)      \
  X(strided_copy, QUEUE, 1)        \
  X(pointwise, QUEUE, 1)           \
  X(mask_upper, QUEUE, 1)          \
  X(argmax, QUEUE, 1)              \
  X(nll_ignore, QUEUE, 1)          \
  X(nll_ignore_backward, QUEUE, 1) \
  X(embedding, QUEUE, 1)           \
  X(embedding_backward, QUEUE, 1)  \
  X(layernorm, QUEUE, 1)           \
  X(layernorm_backward, QUEUE, 1)  \
  X(dropout_mask, QUEUE, 1)        \
  X(half_convert, QUEUE, 1)        \
  X(ew_chain_prepare, DIRECT, 0)   \
  X(ew_chain, QUEUE, 0)            \
  X(prepare_begin, DIRECT, 0)      \
  X(prepare_end, DIRECT, 0)        \
  X(prepare_run, DIRECT, 0)        \
  X(prepare_free, DIRECT, 0)       \
  X(workspace_bytes, DIRECT, 0)    \
  X(workspace_trim, QUEUE, 0)

// clang-format off
/* one argument list per entry, kept as written */
/* Releases the device context and everything it owns; its queue is idle and its buffers and
 * staging blocks are all released first. */
#define CLPAR_BE_ARGS_destroy(F)
/* Memory. alloc must not return a buffer smaller than bytes. An allocation the driver
 * refuses for lack of memory returns CLPAR_ERROR_OUT_OF_MEMORY (the core then empties its
 * cache and tries once more). release may be called while queued work still uses the buffer
 * only if the driver defers the free (OpenCL, CUDA do); the core drains the host device's
 * queue before it frees a cached host buffer. */
#define CLPAR_BE_ARGS_alloc(F) F(size_t, bytes) F(void **, buf)
#define CLPAR_BE_ARGS_release(F) F(void *, buf)
/* Events: an event marks the completion of every command enqueued before event_record.
 * record may give NULL for "already complete" (a synchronous backend). query sets *done;
 * then calls fn(user, status) once the event completed (at once if it has, possibly on
 * this thread); free releases the handle (the wait, if any, is not cancelled). */
#define CLPAR_BE_ARGS_event_query(F) F(void *, ev) F(int *, done)
#define CLPAR_BE_ARGS_event_then(F) F(void *, ev) F(clpar_event_fn, fn) F(void *, user)
#define CLPAR_BE_ARGS_event_free(F) F(void *, ev)
#define CLPAR_BE_ARGS_event_record(F) F(void **, ev)
/* *yes = 1 when the device runs the optional entry named op ("sgd_step", ...) itself; 0
 * makes the core compose it. Without supports_op, a non-NULL entry is used. */
#define CLPAR_BE_ARGS_supports_op(F) F(const char *, op) F(int *, yes)
/* *yes = 1 when this device's copy_peer can copy from its memory into peer's, peer being
 * another device of the same backend (its context). May set up the access (CUDA
 * cudaDeviceEnablePeerAccess) the first time it is asked about a peer. */
#define CLPAR_BE_ARGS_peer_access(F) F(void *, peer) F(int *, yes)
/* Host memory the device transfers from and to at full speed (pinned: OpenCL
 * CL_MEM_ALLOC_HOST_PTR mapped, CUDA cudaMallocHost; plain memory on the host backend).
 * *handle is what host_free takes, *ptr the memory. */
#define CLPAR_BE_ARGS_host_alloc(F) F(size_t, bytes) F(void **, handle) F(void **, ptr)
#define CLPAR_BE_ARGS_host_free(F) F(void *, handle)
/* Transfers between host memory and a buffer. Both may return before the copy is done: the
 * host memory stays valid, and untouched by the core, until a later event completes. */
#define CLPAR_BE_ARGS_write(F) \
  F(void *, buf) F(size_t, off_bytes) F(const void *, src) F(size_t, bytes)
#define CLPAR_BE_ARGS_read(F) \
  F(const void *, buf) F(size_t, off_bytes) F(void *, dst) F(size_t, bytes)
/* Device-local copy; the ranges may overlap. */
#define CLPAR_BE_ARGS_copy(F) \
  F(void *, dst)              \
  F(size_t, dst_off_bytes) F(const void *, src) F(size_t, src_off_bytes) F(size_t, bytes)
/* Waits until every enqueued operation has finished (the worker's own wait). */
#define CLPAR_BE_ARGS_finish(F)
/* out[i] = value, i < n */
#define CLPAR_BE_ARGS_fill(F) F(clpar_bref, out) F(size_t, n) F(float, value)
/* out[r,c] = a[r,c] (op) b[b_rows == 1 ? 0 : r, c], r < rows, c < cols; b_rows is 1 or
 * rows. out may alias a or b exactly. */
#define CLPAR_BE_ARGS_binary(F) \
  F(clpar_binary_kind, kind)    \
  F(size_t, rows)               \
  F(size_t, cols) F(clpar_bref, a) F(clpar_bref, b) F(size_t, b_rows) F(clpar_bref, out)
/* out[i] = alpha * a[i], i < n; out may alias a. */
#define CLPAR_BE_ARGS_scale(F) F(size_t, n) F(float, alpha) F(clpar_bref, a) F(clpar_bref, out)
/* out[c] = sum over r < rows of a[r, c], c < cols (a row-major, rows x cols). */
#define CLPAR_BE_ARGS_sum_rows(F) \
  F(size_t, rows) F(size_t, cols) F(clpar_bref, a) F(clpar_bref, out)
/* Row-major SGEMM: C = alpha * op(A) @ op(B) + beta * C, op(A) m x k, op(B) k x n,
 * leading dimensions in elements (row-major: the row stride of the matrix as stored).
 * beta == 0 means C's old contents are ignored (NaN in C must not leak through). */
#define CLPAR_BE_ARGS_gemm(F)                                                           \
  F(int, trans_a) F(int, trans_b) F(size_t, m) F(size_t, n) F(size_t, k) F(float, alpha) \
  F(clpar_bref, a) F(size_t, lda) F(clpar_bref, b) F(size_t, ldb) F(float, beta)         \
  F(clpar_bref, c) F(size_t, ldc)
/* Strided batched SGEMM: gemm's C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, with
 * X_i starting stride_x elements after X_{i-1} (a stride 0 shares the operand: one weight
 * for every image of a convolution). The C_i do not overlap. */
#define CLPAR_BE_ARGS_gemm_batched(F)                                                       \
  F(int, trans_a) F(int, trans_b) F(size_t, m) F(size_t, n) F(size_t, k) F(float, alpha)     \
  F(clpar_bref, a) F(size_t, lda) F(size_t, stride_a) F(clpar_bref, b) F(size_t, ldb)        \
  F(size_t, stride_b) F(float, beta) F(clpar_bref, c) F(size_t, ldc) F(size_t, stride_c)     \
  F(size_t, batch)
/* out[r, c] = a[c], r < rows, c < cols: one row repeated (cols == 1: a scalar). */
#define CLPAR_BE_ARGS_broadcast_rows(F) \
  F(size_t, rows) F(size_t, cols) F(clpar_bref, a) F(clpar_bref, out)
/* Reductions along dimensions, with a seen as [outer, red, inner] (row-major):
 *   reduce_sum: out[o * inner + i] = sum over r < red of a[(o * red + r) * inner + i]
 *   expand:     out[(o * red + r) * inner + i] = a[o * inner + i]   (its gradient's broadcast)
 * o < outer, i < inner. reduce_sum's order of summation is the backend's (the host sums in
 * double); out does not alias a. */
#define CLPAR_BE_ARGS_reduce_sum(F) \
  F(size_t, outer) F(size_t, red) F(size_t, inner) F(clpar_bref, a) F(clpar_bref, out)
#define CLPAR_BE_ARGS_expand(F) \
  F(size_t, outer) F(size_t, red) F(size_t, inner) F(clpar_bref, a) F(clpar_bref, out)
/* out[i] = f(a[i]), i < n: relu max(x, 0), sigmoid 1/(1+exp(-x)), tanh, exp, sqrt, -x.
 * out may alias a. */
#define CLPAR_BE_ARGS_unary(F) \
  F(clpar_unary_kind, kind) F(size_t, n) F(clpar_bref, a) F(clpar_bref, out)
/* out[i] = g[i] * f'(.), from saved = the input x for relu (1 where x > 0, else 0) and
 * saved = the output y for sigmoid (y (1 - y)) and tanh (1 - y^2). out may alias g. */
#define CLPAR_BE_ARGS_unary_backward(F) \
  F(clpar_unary_kind, kind) F(size_t, n) F(clpar_bref, g) F(clpar_bref, saved) F(clpar_bref, out)
/* Row-wise softmax over cols (log == 0) or log-softmax (log == 1), subtracting the row's
 * maximum first so that large inputs do not overflow. */
#define CLPAR_BE_ARGS_softmax(F) \
  F(int, log) F(size_t, rows) F(size_t, cols) F(clpar_bref, a) F(clpar_bref, out)
/* One element per row at an int32 index (idx's off counts int32 elements; every index is
 * already checked to be in 0 .. cols-1):
 *   gather  (scatter == 0): out[r] = a[r, idx[r]]   (a rows x cols, out rows)
 *   scatter (scatter == 1): out[r, idx[r]] = a[r]   (a rows, out rows x cols; its other
 *                                                   elements are left as they are)
 * The primitive the core composes nll and nll_backward from. */
#define CLPAR_BE_ARGS_pick(F) \
  F(int, scatter) F(size_t, rows) F(size_t, cols) F(clpar_bref, idx) F(clpar_bref, a) F(clpar_bref, out)
/* Its gradient from the forward's output y and g, per row:
 *   softmax:     out = y * (g - sum_c(g * y))
 *   log-softmax: out = g - exp(y) * sum_c(g) */
#define CLPAR_BE_ARGS_softmax_backward(F) \
  F(int, log) F(size_t, rows) F(size_t, cols) F(clpar_bref, y) F(clpar_bref, g) F(clpar_bref, out)
/* out[r] = -a[r, labels[r]]; labels holds one class index per row as an int32 (not a float:
 * a float is exact only up to 2^24), already checked to be in 0 .. cols-1. Its off counts
 * int32 elements (the same 4 bytes as a float). */
#define CLPAR_BE_ARGS_nll(F) \
  F(size_t, rows) F(size_t, cols) F(clpar_bref, a) F(clpar_bref, labels) F(clpar_bref, out)
/* out[r, c] = c == labels[r] ? -g[r] : 0; labels as for nll (int32). */
#define CLPAR_BE_ARGS_nll_backward(F) \
  F(size_t, rows) F(size_t, cols) F(clpar_bref, labels) F(clpar_bref, g) F(clpar_bref, out)
/* Softmax cross-entropy, one pass over each row (targets t as for nll_ignore):
 *   loss[r] = t == ignore ? 0 : 0 <= t < cols ? -logp[r, t] : NaN;  weight[r] = t != ignore
 * with logp = log_softmax(a) as the softmax entry computes it (the core composes xent from
 * softmax and nll_ignore). */
#define CLPAR_BE_ARGS_xent(F) \
  F(size_t, rows) F(size_t, cols) F(int, idx64) F(int64_t, ignore) F(clpar_bref, a) \
  F(clpar_bref, idx) F(clpar_bref, loss) F(clpar_bref, weight)
/* Its gradient with respect to a, from one float g on the device and an optional count:
 *   s = count.buf ? g[0] / count[0] : alpha * g[0]     (rounded to float)
 *   out[r, c] = 0 <= t[r] < cols and t[r] != ignore ? d - exp(logp[r, c]) * -s : 0,
 *   d = c == t[r] ? -s : 0
 * (log-softmax's backward of nll_ignore's; composed from softmax, nll_ignore_backward and
 * softmax_backward). out does not alias a. */
#define CLPAR_BE_ARGS_xent_backward(F)                                                       \
  F(size_t, rows) F(size_t, cols) F(int, idx64) F(int64_t, ignore) F(clpar_bref, a)           \
  F(clpar_bref, idx) F(clpar_bref, g) F(clpar_bref, count) F(float, alpha) F(clpar_bref, out)
/* In place, n elements (see clpar_sgd_args); buf is ignored when momentum == 0. The args
 * are copied when the op is queued. */
#define CLPAR_BE_ARGS_sgd_step(F) \
  F(size_t, n) F(clpar_bref, param) F(clpar_bref, grad) F(clpar_bref, buf) F(clpar_sgd_args, args)
/* In place, n elements (see clpar_adam_args). */
#define CLPAR_BE_ARGS_adam_step(F) \
  F(size_t, n)                     \
  F(clpar_bref, param)             \
  F(clpar_bref, grad) F(clpar_bref, m) F(clpar_bref, v) F(clpar_adam_args, args)
/* Turns recording of device time on or off; either way the totals restart from zero. */
#define CLPAR_BE_ARGS_profile(F) F(int, enable)
/* Waits for the queue, then gives the device time of the ops enqueued since recording was
 * turned on (kernels, GEMMs and device-local copies; not host transfers), and their count. */
#define CLPAR_BE_ARGS_profile_read(F) F(double *, seconds) F(uint64_t *, ops)
/* Enqueued on this (the source) device's queue: copies bytes from its buffer src to the
 * buffer dst of peer, a device peer_access accepted, without the host. The core orders it
 * after peer's earlier work and peer's later work after it (events). */
#define CLPAR_BE_ARGS_copy_peer(F)                                                     \
  F(void *, peer) F(void *, dst) F(size_t, dst_off_bytes) F(const void *, src)          \
  F(size_t, src_off_bytes) F(size_t, bytes)
/* Tunes the device's GEMM for the shapes (see clpar_device_tune_gemm; arguments checked),
 * applies the result and saves it; result is filled. Waits for the device. */
#define CLPAR_BE_ARGS_tune_gemm(F)                                  \
  F(const clpar_gemm_shape *, shapes)                               \
  F(int, n_shapes) F(const clpar_tune_options *, options) F(clpar_tune_result *, result)

/* ---- convolution, pooling, batch norm (src/nn/conv.c, pool.c, batchnorm.c) ----
 * Optional inputs are brefs whose buf is NULL. */
/* col[(ci * kh + i) * kw + j, b * P + p] = x[b, ci, oy * sh - ph + i * dh, ox * sw - pw + j * dw]
 * (0 outside the image), P = oh * ow, p = oy * ow + ox, ci < c, b < n: the columns of n
 * images side by side, one row of n * P per kernel tap. */
#define CLPAR_BE_ARGS_im2col(F) F(clpar_conv_geom, g) F(clpar_bref, x) F(clpar_bref, col)
/* The adjoint of im2col, ADDED into x: x[b, ci, y, x] += the sum of the col entries im2col
 * would have read from it. The core zeroes x first. */
#define CLPAR_BE_ARGS_col2im(F) F(clpar_conv_geom, g) F(clpar_bref, col) F(clpar_bref, x)
/* out[j, i, q] = in[i, j, q] + (bias.buf ? bias[i] : 0), i < a, j < b, q < p: [a, b, p] to
 * [b, a, p] (a GEMM's [O, n * P] to NCHW and back). */
#define CLPAR_BE_ARGS_swap01(F) \
  F(size_t, a) F(size_t, b) F(size_t, p) F(clpar_bref, in) F(clpar_bref, bias) F(clpar_bref, out)
/* y = the maximum over each window of each of g.n planes (padding never wins), idx its
 * position y * w + x in the plane as an int32 (the first maximum in scan order; NaN wins). */
#define CLPAR_BE_ARGS_maxpool(F) \
  F(clpar_conv_geom, g) F(clpar_bref, x) F(clpar_bref, y) F(clpar_bref, idx)
/* dx[b, q] = the sum of dy over the windows whose idx is q (dx written whole). */
#define CLPAR_BE_ARGS_maxpool_backward(F) \
  F(clpar_conv_geom, g) F(clpar_bref, dy) F(clpar_bref, idx) F(clpar_bref, dx)
/* PyTorch's adaptive average pooling: bin i of oh covers rows floor(i h / oh) to
 * ceil((i + 1) h / oh) - 1 (columns likewise); y = the mean over the bin. */
#define CLPAR_BE_ARGS_avgpool(F) F(clpar_conv_geom, g) F(clpar_bref, x) F(clpar_bref, y)
/* dx[b, y, x] = sum over the bins holding (y, x) of dy / the bin's size (dx written whole). */
#define CLPAR_BE_ARGS_avgpool_backward(F) \
  F(clpar_conv_geom, g) F(clpar_bref, dy) F(clpar_bref, dx)
/* Per channel ch of x [n, c, p]: mean[ch] and the biased variance var[ch] over n and p
 * (two passes: the variance sums squared deviations from the mean). With running_mean.buf
 * set: running_mean = (1 - momentum) running_mean + momentum mean, running_var likewise with
 * the unbiased variance var * M / (M - 1), M = n p >= 2. */
#define CLPAR_BE_ARGS_bn_stats(F)                                                          \
  F(size_t, n) F(size_t, c) F(size_t, p) F(clpar_bref, x) F(clpar_bref, mean) F(clpar_bref, var) \
  F(clpar_bref, running_mean) F(clpar_bref, running_var) F(float, momentum)
/* y = (x - mean[ch]) / sqrt(var[ch] + eps) * weight[ch] + bias[ch] (weight 1 and bias 0 when
 * absent). */
#define CLPAR_BE_ARGS_bn_apply(F)                                                          \
  F(size_t, n) F(size_t, c) F(size_t, p) F(clpar_bref, x) F(clpar_bref, mean) F(clpar_bref, var) \
  F(clpar_bref, weight) F(clpar_bref, bias) F(float, eps) F(clpar_bref, y)
/* Per channel: sum_g = sum of g, sum_gxhat = sum of g * xhat, xhat = (x - mean) / sqrt(var +
 * eps), over n and p (the gradients of bias and weight). */
#define CLPAR_BE_ARGS_bn_backward_sums(F)                                                \
  F(size_t, n) F(size_t, c) F(size_t, p) F(clpar_bref, x) F(clpar_bref, g) F(clpar_bref, mean) \
  F(clpar_bref, var) F(float, eps) F(clpar_bref, sum_g) F(clpar_bref, sum_gxhat)
/* dx = w istd (g - sum_g / M - xhat sum_gxhat / M) when training (the statistics were the
 * batch's), dx = w istd g otherwise; istd = 1 / sqrt(var + eps), w = weight[ch] or 1. */
#define CLPAR_BE_ARGS_bn_backward(F)                                                 \
  F(size_t, n) F(size_t, c) F(size_t, p) F(clpar_bref, x) F(clpar_bref, g) F(clpar_bref, mean) \
  F(clpar_bref, var) F(clpar_bref, weight) F(float, eps) F(clpar_bref, sum_g)                 \
  F(clpar_bref, sum_gxhat) F(int, training) F(clpar_bref, dx)

/* Whole convolutions (optional; without them the core runs im2col and GEMMs):
 *   conv2d:          y = conv(x, weight) + bias (bias optional)
 *   conv2d_backward: from gy, each of dx, dw and db whose buf is set (dw whenever db is),
 *                    written whole; one entry, so that gy is read (or reordered) once */
#define CLPAR_BE_ARGS_conv2d(F) \
  F(clpar_conv2d_shape, s) F(clpar_bref, x) F(clpar_bref, weight) F(clpar_bref, bias) F(clpar_bref, y)
#define CLPAR_BE_ARGS_conv2d_backward(F)                                                  \
  F(clpar_conv2d_shape, s) F(clpar_bref, x) F(clpar_bref, weight) F(clpar_bref, gy)        \
  F(clpar_bref, dx) F(clpar_bref, dw) F(clpar_bref, db)

/* ---- fused Linear epilogues (src/nn/functional.c: clpar_linear, clpar_linear_act) ---- */
/* out[r, c] = f(a[r, c] + bias[c]), r < rows, c < cols (f: clpar_act_kind; the sum is
 * rounded to float before f, as an add then the activation). out may alias a. */
#define CLPAR_BE_ARGS_bias_act(F) \
  F(clpar_act_kind, act) F(size_t, rows) F(size_t, cols) F(clpar_bref, a) F(clpar_bref, bias) F(clpar_bref, out)
/* d[r, c] = g[r, c] * f'(.) from the forward's output y (relu: 1 where y > 0, else 0;
 * sigmoid y (1 - y); tanh 1 - y^2; none: d = g, y unused), then
 *   out[r, c] = d[r, c]                                   when out.buf != NULL (may alias g)
 *   db[c] = (accumulate ? db[c] : 0) + sum over r of d[r, c]   when db.buf != NULL
 * the sum rounded to float before it is added to db (as sum_rows then an add), in the
 * backend's sum_rows order. */
#define CLPAR_BE_ARGS_bias_act_backward(F)                                                   \
  F(clpar_act_kind, act) F(size_t, rows) F(size_t, cols) F(clpar_bref, g) F(clpar_bref, y)    \
  F(clpar_bref, out) F(clpar_bref, db) F(int, accumulate)
/* A Linear's forward with its epilogue, out [m, n] = f(x [m, k] w^T + bias) (w [n, k]): as
 * gemm(0, 1, ..., alpha 1, beta 0) then bias_act, or then the activation's unary without a
 * bias (bias.buf NULL), which the core composes it from; a backend may run it as one kernel
 * (the GEMM's epilogue). out does not alias x or w. */
#define CLPAR_BE_ARGS_linear_act(F)                                                     \
  F(clpar_act_kind, act) F(size_t, m) F(size_t, n) F(size_t, k) F(clpar_bref, x)         \
  F(clpar_bref, w) F(clpar_bref, bias) F(clpar_bref, out)
/* A Linear's backward, from the gradient g [m, n] of out = f(x [m, k] w^T + bias) (w [n, k])
 * and the forward's output y [m, n]: d = g * f'(.) as bias_act_backward computes it (d = g
 * and y unused for act none), then each output whose buf is set, written whole, or added to
 * what is there where its bit is set in accumulate (CLPAR_ACC_DX, _DW, _DB):
 *   dx [m, k] (+)= d w      as gemm(0, 0, m, k, n, 1, d, n, w, k, beta, dx, k)
 *   dw [n, k] (+)= d^T x    as gemm(1, 0, n, k, m, 1, d, n, x, k, beta, dw, k)
 *   db [n]    (+)= the column sums of d, as bias_act_backward
 * scratch: m x n floats the entry may use for d, its contents left undefined (buf NULL for act
 * none, where d is g). The core composes it as bias_act_backward into scratch then the two
 * GEMMs; a backend may run it as one kernel. The outputs alias none of the inputs. */
#define CLPAR_BE_ARGS_linear_act_backward(F)                                              \
  F(clpar_act_kind, act) F(size_t, m) F(size_t, n) F(size_t, k) F(clpar_bref, g)           \
  F(clpar_bref, y) F(clpar_bref, x) F(clpar_bref, w) F(clpar_bref, scratch) F(clpar_bref, dx) \
  F(clpar_bref, dw) F(clpar_bref, db) F(int, accumulate)

/* ---- collectives between processes on the device itself (CUDA with NCCL) ----
 * For DistributedDataParallel (src/dist/ddp.c): one communicator per process and device, made
 * from an id that one process creates and sends to the others (over MPI); the core sees the
 * id as CLPAR_COMM_ID_BYTES opaque bytes and the communicator as an opaque handle. All six are
 * optional and come together: a device without them has its gradients reduced through host
 * memory over MPI. No entry may block for the other processes: comm_init returns at once and
 * comm_query tells when the communicator is ready, so that the core can give up at its
 * deadline (comm_abort) instead of hanging for a process that never comes. */
/* A new id (ncclGetUniqueId) into id, bytes == CLPAR_COMM_ID_BYTES. */
#define CLPAR_BE_ARGS_comm_id(F) F(void *, id) F(size_t, bytes)
/* Starts joining the communicator of nranks processes named by id as rank, with this device
 * (made current); *comm is the handle at once, ready when comm_query says so. */
#define CLPAR_BE_ARGS_comm_init(F) \
  F(const void *, id) F(size_t, bytes) F(int, nranks) F(int, rank) F(void **, comm)
/* *pending = 1 while the communicator is still joining or enqueueing an operation; 0 when it
 * is idle. An error of the communicator (its init failed, a peer's connection broke, it was
 * aborted) is returned, naming it. Any thread, any time. */
#define CLPAR_BE_ARGS_comm_query(F) F(void *, comm) F(int *, pending)
/* Stops every operation of the communicator (running on the device or still being set up),
 * so that nothing waits for it any more; later entries on it fail. Any thread, any time. */
#define CLPAR_BE_ARGS_comm_abort(F) F(void *, comm)
/* Frees the handle: the communicator is destroyed (NCCL: finalized, which flushes, then
 * destroyed; aborted instead if flushing takes more than timeout_s seconds), or was aborted.
 * The core calls it once no operation of it is queued. */
#define CLPAR_BE_ARGS_comm_free(F) F(void *, comm) F(double, timeout_s)
/* On the device's queue, after everything posted before it: data[0 .. n) (floats) replaced
 * in place by its average over the communicator's ranks, without the host. If the
 * communicator needs time to enqueue (it is still connecting), the entry waits for it at most
 * timeout_s seconds, then fails with CLPAR_ERROR_TIMEOUT. */
#define CLPAR_BE_ARGS_comm_allreduce(F) \
  F(void *, comm) F(clpar_bref, data) F(size_t, n) F(double, timeout_s)

/* ---- tensor ops for transformers (src/tensor_ops.c, src/nn/loss_ops.c) ---- */
/* Copies the elements of the geometry (words: any dtype); the written positions are distinct
 * and out does not overlap in. Permute, narrow and concatenation along any dimension. */
#define CLPAR_BE_ARGS_strided_copy(F) F(clpar_strided_geom, g) F(clpar_bref, in) F(clpar_bref, out)
/* i < n, f of clpar_pointwise_kind:
 *   forward  (g.buf NULL): out[i] = f(x[i])
 *   backward (g.buf set):  out[i] = g[i] * f'(x[i]), from the forward's input x: log 1 / x,
 *                          pow p x^(p-1) (0 when p == 0), the GELUs' derivatives.
 * out may alias x or g. */
#define CLPAR_BE_ARGS_pointwise(F) \
  F(clpar_pointwise_kind, kind) F(size_t, n) F(float, p) F(clpar_bref, x) F(clpar_bref, g) \
  F(clpar_bref, out)
/* out[b, i, j] = j - i >= diagonal ? value : a[b, i, j] over batch x rows x cols (torch's
 * masked_fill with triu(ones, diagonal)); out may alias a. */
#define CLPAR_BE_ARGS_mask_upper(F) \
  F(size_t, batch) F(size_t, rows) F(size_t, cols) F(int64_t, diagonal) F(float, value) \
  F(clpar_bref, a) F(clpar_bref, out)
/* out[r] (an int64, off in words, even) = the first c < cols where a[r, c] is largest (NaN
 * wins, as torch.argmax). */
#define CLPAR_BE_ARGS_argmax(F) F(size_t, rows) F(size_t, cols) F(clpar_bref, a) F(clpar_bref, out)
/* Targets t[r] are int32 (idx64 == 0) or int64 (idx64 == 1; off in words, even), unchecked:
 *   loss[r] = t == ignore ? 0 : 0 <= t < cols ? -a[r, t] : NaN;  weight[r] = t != ignore. */
#define CLPAR_BE_ARGS_nll_ignore(F) \
  F(size_t, rows) F(size_t, cols) F(int, idx64) F(int64_t, ignore) F(clpar_bref, a) \
  F(clpar_bref, idx) F(clpar_bref, loss) F(clpar_bref, weight)
/* out[r, c] = t[r] != ignore && c == t[r] ? -scale[0] : 0 (scale: one float on the device). */
#define CLPAR_BE_ARGS_nll_ignore_backward(F) \
  F(size_t, rows) F(size_t, cols) F(int, idx64) F(int64_t, ignore) F(clpar_bref, idx) \
  F(clpar_bref, scale) F(clpar_bref, out)

/* ---- transformer layers (src/nn/embedding.c, layernorm.c, dropout.c) ---- */
/* Indices t[i] int32 (idx64 == 0) or int64 (idx64 == 1; off in words, even), unchecked:
 *   out[i, c] = 0 <= t[i] < num ? w[t[i], c] : NaN,  i < n, c < dim. */
#define CLPAR_BE_ARGS_embedding(F) \
  F(size_t, n) F(size_t, num) F(size_t, dim) F(int, idx64) F(clpar_bref, idx) F(clpar_bref, w) \
  F(clpar_bref, out)
/* dw[v, c] = the sum of g[i, c] over the i < n with t[i] == v, added in increasing i (the
 * same bits on every run, whatever the repeats), v < num, c < dim; dw written whole. */
#define CLPAR_BE_ARGS_embedding_backward(F) \
  F(size_t, n) F(size_t, num) F(size_t, dim) F(int, idx64) F(clpar_bref, idx) F(clpar_bref, g) \
  F(clpar_bref, dw)
/* Per row r of x [rows, cols]: mean[r], rstd[r] = 1 / sqrt(var + eps) with the biased
 * variance (two passes: squared deviations from the mean), and
 *   y[r, c] = (x[r, c] - mean) rstd w[c] + b[c]  (w 1 and b 0 when their buf is NULL). */
#define CLPAR_BE_ARGS_layernorm(F) \
  F(size_t, rows) F(size_t, cols) F(float, eps) F(clpar_bref, x) F(clpar_bref, w) \
  F(clpar_bref, b) F(clpar_bref, y) F(clpar_bref, mean) F(clpar_bref, rstd)
/* From the forward's x, mean and rstd, with xhat = (x - mean) rstd and h = g w (w 1 when
 * absent), each output written when its buf is set:
 *   dx[r, c] = rstd (h - mean_c(h) - xhat mean_c(h xhat))
 *   dw[c] = sum over r of g xhat,  db[c] = sum over r of g  (rows in increasing order). */
#define CLPAR_BE_ARGS_layernorm_backward(F) \
  F(size_t, rows) F(size_t, cols) F(clpar_bref, x) F(clpar_bref, g) F(clpar_bref, mean) \
  F(clpar_bref, rstd) F(clpar_bref, w) F(clpar_bref, dx) F(clpar_bref, dw) F(clpar_bref, db)
/* Dropout's mask from the counter-based generator of src/rng.c (clpar_rng_uniform01: a pure
 * function of seed and counter, the same on every backend):
 *   out[i] = uniform01(seed, offset + i) < p ? 0 : scale,  i < n. */
#define CLPAR_BE_ARGS_dropout_mask(F) \
  F(size_t, n) F(uint64_t, seed) F(uint64_t, offset) F(float, p) F(float, scale) \
  F(clpar_bref, out)

/* ---- 16-bit floats: half_convert, gemm_half (backend_half.h) ---- */
#include "backend_half.h"

/* ---- element-wise chains (clpar_ew_chain) ----
 * ew_chain_prepare builds the chain's kernel (once per distinct chain, kept in the program
 * cache) and sets chain->kernel; ew_chain runs it. Both optional: without them a captured
 * graph keeps the single commands. */
#define CLPAR_BE_ARGS_ew_chain_prepare(F) F(clpar_ew_chain *, chain)
#define CLPAR_BE_ARGS_ew_chain(F) F(const clpar_ew_chain *, chain)

/* ---- prepared launches for captured graphs (src/runtime/capture_prepared.c) ----
 * Optional, all four or none. While a graph is captured, the device's worker runs each QUEUE
 * entry between prepare_begin and prepare_end; prepare_end gives *launch, a handle that
 * enqueues again exactly what the entry op enqueued (its kernels, their arguments already set),
 * or NULL where the entry did anything the backend cannot record (a library call, a transfer,
 * host memory, state that changes). Each replay then calls prepare_run(launch) in place of the
 * entry (in the same order); prepare_free releases it with the graph (any thread). begin, end
 * and run are called on the device's worker thread only, like a QUEUE entry. */
#define CLPAR_BE_ARGS_prepare_begin(F)
#define CLPAR_BE_ARGS_prepare_end(F) F(const char *, op) F(void **, launch)
#define CLPAR_BE_ARGS_prepare_run(F) F(void *, launch)
#define CLPAR_BE_ARGS_prepare_free(F) F(void *, launch)
/* ---- the backend's own device memory outside the allocator (workspaces, scratch) ----
 * Optional, both or none. workspace_bytes: *bytes the backend holds now (any thread, without
 * waiting). workspace_trim: releases what no entry is using (a slot taken is kept), after the
 * work queued before it (CUDA drains its stream first); the next use grows it again. */
#define CLPAR_BE_ARGS_workspace_bytes(F) F(uint64_t *, bytes)
#define CLPAR_BE_ARGS_workspace_trim(F)

// clang-format on
#define CLPAR_BE_PARAM_(type, field) , type field

typedef struct clpar_backend_iface {
  int abi_version;  /* CLPAR_BACKEND_ABI_VERSION */
  const char *name; /* "opencl", "cuda", "host" */
#define CLPAR_BE_MEMBER_(name, kind, required) \
  clpar_status (*name)(void *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
  CLPAR_BACKEND_ENTRIES(CLPAR_BE_MEMBER_)
#undef CLPAR_BE_MEMBER_
} clpar_backend_iface;

/* A backend's table: CLPAR_BACKEND_TABLE(ocl, "opencl") expands to the initializer
 * {4, "opencl", ocl_destroy, ocl_alloc, ...}; prefix_<entry> must exist for every entry,
 * or be defined as NULL (`#define ocl_supports_op NULL`) for an optional one. */
#define CLPAR_BE_INIT_(name, kind, required) , CLPAR_BE_CAT_(CLPAR_BE_PREFIX_, _##name)
#define CLPAR_BE_CAT_(a, b) CLPAR_BE_CAT2_(a, b)
#define CLPAR_BE_CAT2_(a, b) a##b
#define CLPAR_BACKEND_TABLE(name_string) \
  { CLPAR_BACKEND_ABI_VERSION, name_string CLPAR_BACKEND_ENTRIES(CLPAR_BE_INIT_) }

/* One device as a backend reports it. info.id is left empty: the core numbers devices
 * ("opencl:0", ...) in the order a backend reports them. */
typedef struct clpar_backend_device {
  const clpar_backend_iface *iface;
  void *ctx;
  clpar_device_info info;
} clpar_backend_device;

/* A probe appends the backend's devices to *devs (realloc'ed, *count updated). No devices is
 * not an error (a machine without the driver returns CLPAR_OK and adds none). On error the
 * devices it already added stay valid and owned by the caller. A driver's error is logged and
 * clpar_init goes on with the devices found; CLPAR_ERROR_INVALID_ARGUMENT is kept for the
 * user's own configuration given wrong (an environment variable the backend reads, named in
 * the message): clpar_init fails with it. */
typedef clpar_status (*clpar_backend_probe_fn)(clpar_backend_device **devs, int *count);

clpar_status clpar_host_probe(clpar_backend_device **devs, int *count);
#ifdef CLPAR_HAVE_OPENCL
clpar_status clpar_opencl_probe(clpar_backend_device **devs, int *count);
#endif
#ifdef CLPAR_HAVE_CUDA
clpar_status clpar_cuda_probe(clpar_backend_device **devs, int *count);
#endif

/* Helper for probes: grows *devs by one and returns the new, zeroed slot (NULL when out of
 * memory, with the error set). Defined in src/runtime/registry.c. */
clpar_backend_device *clpar_backend_device_append(clpar_backend_device **devs, int *count);

/* ---- trusted cache files (src/runtime/trusted_file.c) ----
 * For what a backend keeps on disk and later obeys (compiled kernels, tuning parameters):
 * anyone who can write the directory or swap a file could make the process run their code.
 * Each call sets the error message and returns CLPAR_ERROR_IO saying why it refused. */

/* The user's cache directory: CLPAR_CACHE_DIR, else $XDG_CACHE_HOME/clpar, else
 * $HOME/.cache/clpar (path, path_size bytes, receives it), opened with
 * clpar_trusted_dir_open. On failure it also logs one warning per distinct reason. */
clpar_status clpar_cache_dir_open(char *path, size_t path_size, int *dirfd);
/* *dirfd: an open descriptor (close it) of path, a directory created 0700 (parents too) if
 * missing. Refused: a symbolic link, not a directory, owned by another user, writable by
 * group or others. */
clpar_status clpar_trusted_dir_open(const char *path, int *dirfd);
/* The whole file name (one path component) in dirfd: *data (malloc'ed, free it) and *size.
 * A missing file is CLPAR_OK with *data NULL. Refused without following or blocking: a
 * symbolic link, a FIFO or anything not a regular file, a file of another user or writable by
 * group or others, more than max_bytes. */
clpar_status clpar_trusted_file_read(int dirfd, const char *name, size_t max_bytes, void **data,
                                     size_t *size);
/* Replaces name in dirfd atomically: a new file (O_EXCL, mode 0600) in the same directory,
 * written, fsync'ed and renamed over name (a link at name is replaced, not followed). */
clpar_status clpar_trusted_file_write(int dirfd, const char *name, const void *data, size_t size);

/* linear_act_backward as the core composes it (bias_act_backward into scratch, then the two
 * GEMMs, in that order and with the same arguments, so the bits are the composition's) through
 * a backend's own bias_act_backward and gemm: for a backend that posts the Linear's backward as
 * one command (host, CUDA) without a kernel of its own for it. who names the backend in
 * errors. */
typedef clpar_status (*clpar_be_bias_act_backward_fn)(void *dev, clpar_act_kind act, size_t rows,
                                                      size_t cols, clpar_bref g, clpar_bref y,
                                                      clpar_bref out, clpar_bref db,
                                                      int accumulate);
typedef clpar_status (*clpar_be_gemm_fn)(void *dev, int trans_a, int trans_b, size_t m, size_t n,
                                         size_t k, float alpha, clpar_bref a, size_t lda,
                                         clpar_bref b, size_t ldb, float beta, clpar_bref c,
                                         size_t ldc);
static inline clpar_status clpar_be_linear_act_backward(
    const char *who, clpar_be_bias_act_backward_fn bias_act_backward, clpar_be_gemm_fn gemm,
    void *dev, clpar_act_kind act, size_t m, size_t n, size_t k, clpar_bref g, clpar_bref y,
    clpar_bref x, clpar_bref w, clpar_bref scratch, clpar_bref dx, clpar_bref dw, clpar_bref db,
    int accumulate) {
  clpar_bref none = {NULL, 0}, d = act == CLPAR_ACT_NONE ? g : scratch;
  clpar_status s = CLPAR_OK;
  if ((int)act < CLPAR_ACT_NONE || act > CLPAR_ACT_TANH)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s linear_act_backward: activation %d",
                           who, (int)act);
  if (act != CLPAR_ACT_NONE && !scratch.buf)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s linear_act_backward: no scratch", who);
  if (act != CLPAR_ACT_NONE || db.buf)
    s = bias_act_backward(dev, act, m, n, g, y, act != CLPAR_ACT_NONE ? d : none, db,
                          (accumulate & CLPAR_ACC_DB) != 0);
  if (s == CLPAR_OK && dw.buf)
    s = gemm(dev, 1, 0, n, k, m, 1.0f, d, n, x, k, accumulate & CLPAR_ACC_DW ? 1.0f : 0.0f, dw, k);
  if (s == CLPAR_OK && dx.buf)
    s = gemm(dev, 0, 0, m, k, n, 1.0f, d, n, w, k, accumulate & CLPAR_ACC_DX ? 1.0f : 0.0f, dx, k);
  return s;
}

#endif
