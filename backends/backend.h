/* backend.h — the private interface between clpar's core and a backend (opencl, cuda, host).
 *
 * A backend's probe function reports its devices; each device is a table of function
 * pointers (clpar_backend_iface, shared by every device of that backend) plus the backend's
 * own context pointer. The core never sees cl_mem, CUdeviceptr or a platform id: buffers are
 * opaque void* handles made by alloc, and every op receives buffer + element offset pairs.
 *
 * Rules every backend follows:
 * - Ops enqueue work on the device's one in-order queue (stream) and return without waiting.
 *   read waits for all earlier work; write may return before the copy is done only if it has
 *   copied src first (the caller may reuse src at once).
 * - Every entry returns a clpar_status and, on error, sets the thread-local message with
 *   clpar_set_error (src/internal.h) naming what failed and the driver's error name
 *   ("clEnqueueNDRangeKernel(binary): CL_OUT_OF_RESOURCES"); the core prefixes the device id.
 * - Offsets and counts are in float elements unless the name says bytes.
 * - An entry may be called from any host thread; a backend serializes what its driver needs
 *   serialized (OpenCL kernel arguments, for example) with its own per-device lock.
 * - The core validates shapes before calling: a backend may assume counts >= 1 and buffers
 *   large enough.
 */
#ifndef CLPAR_BACKEND_H
#define CLPAR_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "clpar/device.h"
#include "clpar/status.h"

#define CLPAR_BACKEND_ABI_VERSION 3
/* The oldest ABI a backend may declare: every entry up to it is required. */
#define CLPAR_BACKEND_ABI_REQUIRED 2

/* A buffer and an offset into it, in floats. */
typedef struct clpar_bref {
  void *buf;
  size_t off;
} clpar_bref;

typedef enum clpar_binary_kind {
  CLPAR_BINARY_ADD = 0,
  CLPAR_BINARY_SUB = 1,
  CLPAR_BINARY_MUL = 2
} clpar_binary_kind;

typedef enum clpar_unary_kind {
  CLPAR_UNARY_RELU = 0,
  CLPAR_UNARY_SIGMOID = 1,
  CLPAR_UNARY_TANH = 2
} clpar_unary_kind;

/* One SGD update with PyTorch's rule (torch.optim.SGD), per element:
 *   g = grad + weight_decay * p
 *   if momentum != 0: buf = first ? g : momentum * buf + (1 - dampening) * g
 *                     g = nesterov ? g + momentum * buf : buf
 *   p = p - lr * g */
typedef struct clpar_sgd_args {
  float lr, momentum, dampening, weight_decay;
  int nesterov, first;
} clpar_sgd_args;

/* One Adam/AdamW update with PyTorch's rule, per element (step t >= 1):
 *   decoupled (AdamW): p = p * (1 - lr * weight_decay);  else g = grad + weight_decay * p
 *   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
 *   p = p - (lr / bias1) * m / (sqrt(v) / sqrt(bias2) + eps)
 * with bias1 = 1 - beta1^t and bias2 = 1 - beta2^t computed by the caller. */
typedef struct clpar_adam_args {
  float lr, beta1, beta2, eps, weight_decay;
  float bias1, bias2;
  int decoupled;
} clpar_adam_args;

typedef struct clpar_backend_iface {
  int abi_version;  /* CLPAR_BACKEND_ABI_VERSION */
  const char *name; /* "opencl", "cuda", "host" */

  /* Releases the device context and everything it owns. Buffers are all released first. */
  void (*destroy)(void *dev);

  /* Memory. alloc must not return a buffer smaller than bytes. An allocation the driver
   * refuses for lack of memory returns CLPAR_ERROR_OUT_OF_MEMORY (the core then empties its
   * cache and tries once more). */
  clpar_status (*alloc)(void *dev, size_t bytes, void **buf);
  void (*release)(void *dev, void *buf);
  clpar_status (*write)(void *dev, void *buf, size_t off_bytes, const void *src, size_t bytes);
  clpar_status (*read)(void *dev, const void *buf, size_t off_bytes, void *dst, size_t bytes);
  /* Device-local copy, enqueued. */
  clpar_status (*copy)(void *dev, void *dst, size_t dst_off_bytes, const void *src,
                       size_t src_off_bytes, size_t bytes);
  /* Waits until every enqueued operation has finished. */
  clpar_status (*finish)(void *dev);

  /* out[i] = value, i < n */
  clpar_status (*fill)(void *dev, clpar_bref out, size_t n, float value);
  /* out[r,c] = a[r,c] (op) b[b_rows == 1 ? 0 : r, c], r < rows, c < cols; b_rows is 1 or
   * rows. out may alias a or b exactly. */
  clpar_status (*binary)(void *dev, clpar_binary_kind kind, size_t rows, size_t cols, clpar_bref a,
                         clpar_bref b, size_t b_rows, clpar_bref out);
  /* out[i] = alpha * a[i], i < n; out may alias a. */
  clpar_status (*scale)(void *dev, size_t n, float alpha, clpar_bref a, clpar_bref out);
  /* out[c] = sum over r < rows of a[r, c], c < cols (a row-major, rows x cols). */
  clpar_status (*sum_rows)(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref out);
  /* Row-major SGEMM: C = alpha * op(A) @ op(B) + beta * C, op(A) m x k, op(B) k x n,
   * leading dimensions in elements (row-major: the row stride of the matrix as stored).
   * beta == 0 means C's old contents are ignored (NaN in C must not leak through). */
  clpar_status (*gemm)(void *dev, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                       float alpha, clpar_bref a, size_t lda, clpar_bref b, size_t ldb, float beta,
                       clpar_bref c, size_t ldc);

  /* ---- ABI 2: training ---- */
  /* out[r, c] = a[c], r < rows, c < cols: one row repeated (cols == 1: a scalar). */
  clpar_status (*broadcast_rows)(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref out);
  /* out[i] = f(a[i]), i < n: relu max(x, 0), sigmoid 1/(1+exp(-x)), tanh. out may alias a. */
  clpar_status (*unary)(void *dev, clpar_unary_kind kind, size_t n, clpar_bref a, clpar_bref out);
  /* out[i] = g[i] * f'(.), from saved = the input x for relu (1 where x > 0, else 0) and
   * saved = the output y for sigmoid (y (1 - y)) and tanh (1 - y^2). out may alias g. */
  clpar_status (*unary_backward)(void *dev, clpar_unary_kind kind, size_t n, clpar_bref g,
                                 clpar_bref saved, clpar_bref out);
  /* Row-wise softmax over cols (log == 0) or log-softmax (log == 1), subtracting the row's
   * maximum first so that large inputs do not overflow. */
  clpar_status (*softmax)(void *dev, int log, size_t rows, size_t cols, clpar_bref a,
                          clpar_bref out);
  /* Its gradient from the forward's output y and g, per row:
   *   softmax:     out = y * (g - sum_c(g * y))
   *   log-softmax: out = g - exp(y) * sum_c(g) */
  clpar_status (*softmax_backward)(void *dev, int log, size_t rows, size_t cols, clpar_bref y,
                                   clpar_bref g, clpar_bref out);
  /* out[r] = -a[r, labels[r]]; labels holds one class index per row as a float (exact below
   * 2^24), already checked to be in 0 .. cols-1. */
  clpar_status (*nll)(void *dev, size_t rows, size_t cols, clpar_bref a, clpar_bref labels,
                      clpar_bref out);
  /* out[r, c] = c == labels[r] ? -g[r] : 0 */
  clpar_status (*nll_backward)(void *dev, size_t rows, size_t cols, clpar_bref labels, clpar_bref g,
                               clpar_bref out);
  /* In place, n elements (see clpar_sgd_args); buf is ignored when momentum == 0. */
  clpar_status (*sgd_step)(void *dev, size_t n, clpar_bref param, clpar_bref grad, clpar_bref buf,
                           const clpar_sgd_args *args);
  /* In place, n elements (see clpar_adam_args). */
  clpar_status (*adam_step)(void *dev, size_t n, clpar_bref param, clpar_bref grad, clpar_bref m,
                            clpar_bref v, const clpar_adam_args *args);

  /* ---- ABI 3: profiling; both may be NULL (the device then cannot be profiled) ---- */
  /* Turns recording of device time on or off; either way the totals restart from zero. */
  clpar_status (*profile)(void *dev, int enable);
  /* Waits for the queue, then gives the device time of the ops enqueued since recording was
   * turned on (kernels, GEMMs and device-local copies; not host transfers), and their count. */
  clpar_status (*profile_read)(void *dev, double *seconds, uint64_t *ops);
} clpar_backend_iface;

/* One device as a backend reports it. info.id is left empty: the core numbers devices
 * ("opencl:0", ...) in the order a backend reports them. */
typedef struct clpar_backend_device {
  const clpar_backend_iface *iface;
  void *ctx;
  clpar_device_info info;
} clpar_backend_device;

/* A probe appends the backend's devices to *devs (realloc'ed, *count updated). No devices is
 * not an error (a machine without the driver returns CLPAR_OK and adds none). On error the
 * devices it already added stay valid and owned by the caller. */
typedef clpar_status (*clpar_backend_probe_fn)(clpar_backend_device **devs, int *count);

clpar_status clpar_host_probe(clpar_backend_device **devs, int *count);
#ifdef CLPAR_HAVE_OPENCL
clpar_status clpar_opencl_probe(clpar_backend_device **devs, int *count);
#endif
#ifdef CLPAR_HAVE_CUDA
clpar_status clpar_cuda_probe(clpar_backend_device **devs, int *count);
#endif

/* Helper for probes: grows *devs by one and returns the new, zeroed slot (NULL when out of
 * memory, with the error set). Defined in src/registry.c. */
clpar_backend_device *clpar_backend_device_append(clpar_backend_device **devs, int *count);

#endif
