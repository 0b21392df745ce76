/* ocl_fuse.c — element-wise chains (backend.h: ew_chain_prepare, ew_chain): a captured run of
 * fill, binary, scale, unary, unary_backward and pointwise commands as one generated kernel.
 *
 * Each op is written with the very expression of its own kernel (elementwise.cl, fill.cl,
 * activation.cl, tensor_ops.cl), in a statement of its own, and the program is built with the
 * same options as those files, so an op rounds as its single kernel does. OpenCL's default
 * FP_CONTRACT contracts within an expression only (PoCL), but some compilers also fuse a
 * multiply of one statement with an add of the next (NVIDIA's): on those, probed once per
 * device, each op's result goes through a volatile variable, which no contraction crosses. An
 * op's result stays in a register (or that variable) for the later ops that read it, and is
 * stored as its command stored it. The source depends on the chain's structure only (buffers,
 * offsets and scalars are kernel arguments), so alike chains share one program, built once and
 * kept in the program cache (and its trusted disk cache). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

typedef struct {
  char *p;
  size_t n, cap;
  int failed;
} text;

static void put(text *t, const char *fmt, ...) {
  if (t->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      t->failed = 1;
      return;
    }
    if (t->p && t->n + (size_t)k < t->cap) {
      t->n += (size_t)k;
      return;
    }
    size_t cap = t->cap ? 2 * t->cap : 4096;
    while (cap < t->n + (size_t)k + 1) cap *= 2;
    char *grown = realloc(t->p, cap);
    if (!grown) {
      t->failed = 1;
      return;
    }
    t->p = grown;
    t->cap = cap;
  }
}

/* The expression of input k of op: a load, or an earlier op's result. */
static void put_in(text *t, const clpar_ew_op *op, int k) {
  if (op->in[k] >= 0)
    put(t, "m%d[o%d + i]", op->in[k], op->in[k]);
  else
    put(t, "v%d", -1 - op->in[k]);
}

static const char *binary_expr(int kind) {
  static const char *e[] = {"x + y", "x - y", "x * y", "x / y"};
  return e[kind];
}

static const char *unary_expr(int kind) {
  static const char *e[] = {
      "fmax(x, 0.0f)", "1.0f / (1.0f + exp(-x))", "tanh(x)", "exp(x)", "sqrt(x)", "-x"};
  return e[kind];
}

static const char *unary_backward_expr(int kind) {
  return kind == CLPAR_UNARY_RELU      ? "(s > 0.0f ? gi : 0.0f)"
         : kind == CLPAR_UNARY_SIGMOID ? "gi * (s * (1.0f - s))"
                                       : "gi * (1.0f - s * s)";
}

static const char *pointwise_expr(int kind) {
  return kind == CLPAR_PW_LOG   ? "log(v)"
         : kind == CLPAR_PW_POW ? "pow(v, p)"
         : kind == CLPAR_PW_GELU_TANH
             ? "0.5f * v * (1.0f + tanh(SQRT_2_OVER_PI * (v + GELU_C * v * v * v)))"
             : "0.5f * v * (1.0f + erf(v * 0.7071067811865476f))";
}

static const char *pointwise_d(int kind) {
  return kind == CLPAR_PW_LOG   ? "d = 1.0f / v;"
         : kind == CLPAR_PW_POW ? "d = p == 0.0f ? 0.0f : p * pow(v, p - 1.0f);"
         : kind == CLPAR_PW_GELU_TANH
             ? "float t = tanh(SQRT_2_OVER_PI * (v + GELU_C * v * v * v));\n"
               "    d = 0.5f * (1.0f + t) +\n"
               "        0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * v * "
               "v);"
             : "d = 0.5f * (1.0f + erf(v * 0.7071067811865476f)) +\n"
               "        v * exp(-0.5f * v * v) * 0.3989422804014327f;";
}

/* Op j's statement: v<j> from its inputs, in its kernel's own expression. */
static void put_op(text *t, const clpar_ew_op *op, int j) {
  put(t, "  {\n    const float p = p%d;\n", j);
  switch (op->type) {
    case CLPAR_EW_FILL:
      put(t, "    v%d = p;\n", j);
      break;
    case CLPAR_EW_SCALE:
      put(t, "    v%d = p * ", j), put_in(t, op, 0), put(t, ";\n");
      break;
    case CLPAR_EW_BINARY:
      put(t, "    float x = "), put_in(t, op, 0), put(t, ", y = "), put_in(t, op, 1);
      put(t, ";\n    v%d = %s;\n", j, binary_expr(op->kind));
      break;
    case CLPAR_EW_UNARY:
      put(t, "    float x = "), put_in(t, op, 0);
      put(t, ";\n    v%d = %s;\n", j, unary_expr(op->kind));
      break;
    case CLPAR_EW_UNARY_BACKWARD:
      put(t, "    float s = "), put_in(t, op, 1), put(t, ", gi = "), put_in(t, op, 0);
      put(t, ";\n    v%d = %s;\n", j, unary_backward_expr(op->kind));
      break;
    default: /* CLPAR_EW_POINTWISE */
      put(t, "    float v = "), put_in(t, op, 0), put(t, ";\n");
      if (!op->has_g) {
        put(t, "    v%d = %s;\n", j, pointwise_expr(op->kind));
      } else {
        put(t, "    float d;\n    %s\n    v%d = ", pointwise_d(op->kind), j);
        put_in(t, op, 1), put(t, " * d;\n");
      }
  }
  put(t, "    (void)p;\n  }\n  m%d[o%d + i] = v%d;\n", op->out, op->out, j);
}

static clpar_status check_chain(const clpar_ew_chain *c) {
  static const int kinds[] = {1, 4, 1, 6, 3, 4}; /* kinds per type */
  int ok = c->n > 0 && c->n_ops >= 1 && c->n_ops <= CLPAR_EW_MAX_OPS && c->n_refs >= 1 &&
           c->n_refs <= 3 * CLPAR_EW_MAX_OPS;
  for (int j = 0; ok && j < c->n_ops; j++) {
    const clpar_ew_op *op = &c->ops[j];
    ok = op->type >= 0 && op->type <= CLPAR_EW_POINTWISE && op->kind >= 0 &&
         op->kind < kinds[op->type] && op->out >= 0 && op->out < c->n_refs;
    int ins = op->type == CLPAR_EW_FILL ? 0
              : op->type == CLPAR_EW_BINARY || op->type == CLPAR_EW_UNARY_BACKWARD ||
                      (op->type == CLPAR_EW_POINTWISE && op->has_g)
                  ? 2
                  : 1;
    for (int k = 0; ok && k < ins; k++)
      ok = op->in[k] < c->n_refs && op->in[k] >= -j; /* an earlier op's result, or a ref */
  }
  return ok ? CLPAR_OK
            : clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl ew_chain: a malformed chain");
}

/* t = a0 a1 then t + a2, with a = {1 + 2^-12, 1 + 2^-12, -(1 + 2^-11)}: the product
 * 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11, so the sum is 0 when each statement rounds and 2^-24
 * when the two are fused. The inputs come from a buffer, so that nothing is folded. */
static const char probe_source[] =
    "__kernel void ew_contract_probe(__global const float *a, __global float *r) {\n"
    "  float t = a[0] * a[1];\n"
    "  float u = t + a[2];\n"
    "  r[0] = u;\n"
    "}\n";

/* d->contracts_across, probed on first use (1 no, 2 yes). Called with d->lock held. */
static clpar_status probe_contraction(clpar_ocl_device *d) {
  if (d->contracts_across) return CLPAR_OK;
  cl_kernel k = NULL;
  clpar_status s = clpar_ocl_generated_kernel(d, "ew_contract_probe", probe_source,
                                              sizeof probe_source - 1, "ew_contract_probe", &k);
  if (s != CLPAR_OK) return s;
  float a[4] = {1.0f + 0x1p-12f, 1.0f + 0x1p-12f, -(1.0f + 0x1p-11f), 1.0f}, r = 1.0f;
  cl_int err = CL_SUCCESS;
  cl_mem m =
      clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof a, a, &err);
  cl_mem out = NULL;
  if (err == CL_SUCCESS) out = clCreateBuffer(d->context, CL_MEM_READ_WRITE, sizeof r, NULL, &err);
  if (err == CL_SUCCESS) err = clSetKernelArg(k, 0, sizeof m, &m);
  if (err == CL_SUCCESS) err = clSetKernelArg(k, 1, sizeof out, &out);
  size_t one = 1;
  if (err == CL_SUCCESS)
    err = clEnqueueNDRangeKernel(d->queue, k, 1, NULL, &one, &one, 0, NULL, NULL);
  if (err == CL_SUCCESS)
    err = clEnqueueReadBuffer(d->queue, out, CL_TRUE, 0, sizeof r, &r, 0, NULL, NULL);
  if (out) clReleaseMemObject(out);
  if (m) clReleaseMemObject(m);
  if (err != CL_SUCCESS) return clpar_ocl_fail(err, "the contraction probe", "ew_chain");
  d->contracts_across = r != 0.0f ? 2 : 1;
  clpar_log(CLPAR_LOG_INFO, "opencl ew_chain: the compiler %s across statements (probe %g)",
            r != 0.0f ? "contracts" : "does not contract", (double)r);
  return CLPAR_OK;
}

/* The kernel's source for c's structure; NULL when out of memory. volatile: each op's result
 * goes through a volatile variable (see the top of the file). */
static char *chain_source(const clpar_ew_chain *c, int volatile_results, size_t *size) {
  text t = {0};
  put(&t, "#define SQRT_2_OVER_PI 0.7978845608028654f\n#define GELU_C 0.044715f\n");
  put(&t, "__kernel void ew_chain(ulong n");
  for (int r = 0; r < c->n_refs; r++) put(&t, ", __global float *m%d, ulong o%d", r, r);
  for (int j = 0; j < c->n_ops; j++) put(&t, ", float p%d", j);
  put(&t, ") {\n  ulong i = get_global_id(0);\n  if (i >= n) return;\n");
  for (int j = 0; j < c->n_ops; j++)
    put(&t, "  %sfloat v%d;\n", volatile_results ? "volatile " : "", j);
  for (int j = 0; j < c->n_ops; j++) put_op(&t, &c->ops[j], j);
  put(&t, "}\n");
  if (t.failed) {
    free(t.p);
    return NULL;
  }
  *size = t.n;
  return t.p;
}

clpar_status ocl_ew_chain_prepare(void *dev, clpar_ew_chain *chain) {
  clpar_status s = check_chain(chain);
  if (s != CLPAR_OK) return s;
  clpar_ocl_device *d = dev;
  pthread_mutex_lock(&d->lock);
  s = probe_contraction(d);
  int across = d->contracts_across == 2;
  pthread_mutex_unlock(&d->lock);
  if (s != CLPAR_OK) return s;
  size_t size = 0;
  char *src = chain_source(chain, across, &size);
  if (!src) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl ew_chain: the source");
  cl_kernel k = NULL;
  s = clpar_ocl_generated_kernel(dev, "ew_chain", src, size, "ew_chain", &k);
  free(src);
  if (s == CLPAR_OK) chain->kernel = k;
  return s;
}

clpar_status ocl_ew_chain(void *dev, const clpar_ew_chain *chain) {
  clpar_ocl_device *d = dev;
  cl_kernel k = chain->kernel;
  if (!k) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "opencl ew_chain: not prepared");
  cl_ulong n = chain->n;
  size_t local = d->max_wg_size < CLPAR_OCL_WG_1D ? d->max_wg_size : CLPAR_OCL_WG_1D;
  size_t global = clpar_ocl_round_up(chain->n, local);
  pthread_mutex_lock(&d->lock);
  cl_uint a = 0;
  cl_int err = clSetKernelArg(k, a++, sizeof n, &n);
  for (int r = 0; err == CL_SUCCESS && r < chain->n_refs; r++) {
    cl_mem m = AS_MEM(chain->refs[r].buf);
    cl_ulong off = chain->refs[r].off;
    err = clSetKernelArg(k, a++, sizeof m, &m);
    if (err == CL_SUCCESS) err = clSetKernelArg(k, a++, sizeof off, &off);
  }
  for (int j = 0; err == CL_SUCCESS && j < chain->n_ops; j++)
    err = clSetKernelArg(k, a++, sizeof(float), &chain->ops[j].p);
  clpar_status s = CLPAR_OK;
  if (err != CL_SUCCESS) s = clpar_ocl_fail(err, "clSetKernelArg", "ew_chain");
  cl_event ev;
  if (s == CLPAR_OK) {
    err = clEnqueueNDRangeKernel(d->queue, k, 1, NULL, &global, &local, 0, NULL,
                                 clpar_ocl_profile_slot(d, &ev));
    if (err != CL_SUCCESS) s = clpar_ocl_fail(err, "clEnqueueNDRangeKernel", "ew_chain");
  }
  if (s == CLPAR_OK) clpar_ocl_profile_keep(d, ev);
  pthread_mutex_unlock(&d->lock);
  return s;
}
