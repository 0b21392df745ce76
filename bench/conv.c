/* conv.c — clpar_conv2d forward + backward on ResNet-50's convolution shapes, against the raw
 * GEMMs the same im2col shapes reduce to, on one device.
 *
 * For each shape (torchvision's ResNet-50, v1.5: the stride in the 3x3; spatial sizes scaled
 * from 224 to the image size given), at a small batch: one training pass of the layer (conv
 * forward, a sum as the loss, backward to the input and the weight; the sum and its backward
 * are memory-bound and small beside the GEMMs) against the three GEMMs of the im2col
 * formulation through clpar_gemm on the same device (forward O x NP x K, weight gradient
 * O x K x NP, column gradient K x NP x O; N batch, P output pixels, K = C kh kw). Both are
 * timed in alternating rounds after a warm-up; the best round of each counts. Prints one JSON
 * object per shape (GFLOP/s of the convolution, of the GEMMs, their ratio) and a total.
 *
 * On an OpenCL device (built with OpenCL) the forward alone is also timed against CLBlast's
 * CLBlastSconvgemm (im2col + batched GEMM in one call; x NCHW, weight [O, C kh kw], y NCHW, as
 * PyTorch) on a context of the bench's own on the same cl_device_id, on the same data, in the
 * same alternating rounds: "fwd_ms" (clpar_conv2d, no bias, synchronized), "convgemm_ms",
 * "convgemm_speedup" (fwd_ms / convgemm_ms: above 1, Xconvgemm is faster) and
 * "convgemm_err" (max |y_convgemm - y_clpar| / max |y_clpar|). Before the shapes, one small
 * odd case (stride, padding and dilation differing per axis) checks Xconvgemm's layouts against
 * clpar_conv2d the same way ({"check": "convgemm", ...}).
 *
 * The forward lines name the OpenCL forward's algorithm ("ocl_conv": CLPAR_OCL_CONV's im2col,
 * implicit, winograd or convgemm, "auto" when chosen per shape by measurement;
 * backends/opencl/ocl_conv_algo.c).
 *
 * Each backward pass is also timed alone ("pass": "backward"): the graph of conv + sum built
 * once with only x (backward data, "bwd_data_ms") or only w ("bwd_weight_ms") needing a gradient,
 * then clpar_backward on it, synchronized, best of three after one warm-up; that includes the
 * sum's backward and the addition into the gradient (memory-bound, small beside the
 * convolution). "ocl_conv_bwd" names CLPAR_OCL_CONV_BWD (OpenCL's backward algorithms;
 * backends/opencl/ocl_conv_bwd.c).
 *
 * On a CUDA device (built with cuDNN's headers and library found) each shape is also run through
 * cuDNN called directly (bench/conv_cudnn.c: the algorithms cudnnFind picks, as PyTorch's
 * benchmark mode; full fp32 unless CLPAR_CUDA_TF32=1): a "pass": "cudnn" line puts clpar's
 * forward (as above, timed whatever the backend), backward data and backward weight beside
 * cuDNN's, with "ratio" = clpar's three / cuDNN's three (above 1, cuDNN is faster). Set
 * CLPAR_CUDA_CUDNN=1 to compare clpar's own cuDNN path with the library it calls.
 *
 * On the host device built with oneDNN, clpar_conv2d is oneDNN's convolution and the GEMMs
 * are what the plain path runs; CLPAR_HOST_DNNL=0 times the plain path itself ("name" says
 * which: "... + oneDNN" or not).
 *
 *   POCL_DEVICES=pthread ./bench_conv [device-index] [batch] [image]
 *   CLPAR_DEVICES=host ./bench_conv 0 2 112
 *   CLPAR_DEVICES=host CLPAR_HOST_DNNL=0 ./bench_conv 0 16 64 */
#ifdef BENCH_HAVE_OPENCL
#include <CL/cl.h>
#include <clblast_c.h>
#endif
#include <clpar/clpar.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#ifdef BENCH_HAVE_CUDNN
#include "conv_cudnn.h"
#endif

#ifdef BENCH_HAVE_OPENCL

/* CLBlastSconvgemm on x [n, c, h, w] and w [o, c, kh, kw] copied from clpar tensors into
 * buffers of our own context; y [n, o, oh, ow]. */
typedef struct {
  cl_context ctx;
  cl_command_queue q;
  cl_mem x, w, y;
  size_t n, c, h, wd, o, kh, kw, ph, pw, sh, sw, dh, dw, ylen;
} cg_raw;

static void cg_release(cg_raw *r) {
  if (r->x) clReleaseMemObject(r->x);
  if (r->w) clReleaseMemObject(r->w);
  if (r->y) clReleaseMemObject(r->y);
  if (r->q) clReleaseCommandQueue(r->q);
  if (r->ctx) clReleaseContext(r->ctx);
  *r = (cg_raw){0};
}

static cl_mem cg_upload(cl_context ctx, const clpar_tensor *t, cl_int *err) {
  size_t n = (size_t)clpar_tensor_numel(t);
  float *h = malloc(n * sizeof *h);
  cl_mem m = NULL;
  if (!h || !bench_ok(clpar_tensor_read(t, h, n), "read"))
    *err = CL_OUT_OF_HOST_MEMORY;
  else
    m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof *h, h, err);
  free(h);
  return m;
}

static int cg_setup(cg_raw *r, cl_device_id dev, const clpar_tensor *x, const clpar_tensor *w,
                    const clpar_conv2d_options *o) {
  int64_t xs[4], ws[4];
  for (int i = 0; i < 4; i++) xs[i] = clpar_tensor_dim(x, i), ws[i] = clpar_tensor_dim(w, i);
  *r = (cg_raw){.n = (size_t)xs[0],
                .c = (size_t)xs[1],
                .h = (size_t)xs[2],
                .wd = (size_t)xs[3],
                .o = (size_t)ws[0],
                .kh = (size_t)ws[2],
                .kw = (size_t)ws[3],
                .ph = (size_t)o->padding[0],
                .pw = (size_t)o->padding[1],
                .sh = (size_t)o->stride[0],
                .sw = (size_t)o->stride[1],
                .dh = (size_t)o->dilation[0],
                .dw = (size_t)o->dilation[1]};
  size_t oh = (r->h + 2 * r->ph - r->dh * (r->kh - 1) - 1) / r->sh + 1;
  size_t ow = (r->wd + 2 * r->pw - r->dw * (r->kw - 1) - 1) / r->sw + 1;
  r->ylen = r->n * r->o * oh * ow;
  cl_int err = CL_SUCCESS;
  r->ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (err == CL_SUCCESS) r->q = clCreateCommandQueue(r->ctx, dev, 0, &err);
  if (err == CL_SUCCESS) r->x = cg_upload(r->ctx, x, &err);
  if (err == CL_SUCCESS) r->w = cg_upload(r->ctx, w, &err);
  if (err == CL_SUCCESS)
    r->y = clCreateBuffer(r->ctx, CL_MEM_READ_WRITE, r->ylen * sizeof(float), NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "convgemm setup: OpenCL error %d\n", (int)err);
    cg_release(r);
    return 0;
  }
  return 1;
}

static int cg_run(cg_raw *r) {
  CLBlastStatusCode st = CLBlastSconvgemm(CLBlastKernelModeCrossCorrelation, r->c, r->h, r->wd,
                                          r->kh, r->kw, r->ph, r->pw, r->sh, r->sw, r->dh, r->dw,
                                          r->o, r->n, r->x, 0, r->w, 0, r->y, 0, &r->q, NULL);
  if (st != CLBlastSuccess) fprintf(stderr, "CLBlastSconvgemm: status %d\n", (int)st);
  return st == CLBlastSuccess && clFinish(r->q) == CL_SUCCESS;
}

/* max |y_convgemm - y| / max |y| against clpar's y; -1 on failure. */
static double cg_error(cg_raw *r, const clpar_tensor *y) {
  float *a = malloc(r->ylen * sizeof *a), *b = malloc(r->ylen * sizeof *b);
  double d = 0, m = 0;
  int ok = a && b && (size_t)clpar_tensor_numel(y) == r->ylen &&
           bench_ok(clpar_tensor_read(y, a, r->ylen), "read") &&
           clEnqueueReadBuffer(r->q, r->y, CL_TRUE, 0, r->ylen * sizeof *b, b, 0, NULL, NULL) ==
               CL_SUCCESS;
  for (size_t i = 0; ok && i < r->ylen; i++)
    d = fmax(d, fabs((double)a[i] - b[i])), m = fmax(m, fabs((double)a[i]));
  free(a), free(b);
  return ok ? d / (m > 0 ? m : 1) : -1;
}

/* The small odd case: Xconvgemm against clpar_conv2d on the device. */
static int cg_check(clpar_device *dev, cl_device_id cl) {
  int64_t xs[4] = {3, 5, 11, 9}, ws[4] = {7, 5, 3, 2};
  clpar_conv2d_options o = {{2, 1}, {1, 2}, {2, 3}, 1};
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *w, *y;
  cg_raw r = {0};
  int ok = bench_ok(clpar_tensor_rand_uniform(dev, 4, xs, 11, -1, 1, &x), "x") &&
           bench_ok(clpar_tensor_rand_uniform(dev, 4, ws, 12, -1, 1, &w), "w") &&
           bench_ok(clpar_conv2d(x, w, NULL, &o, &y), "conv2d") && cg_setup(&r, cl, x, w, &o) &&
           cg_run(&r);
  double err = ok ? cg_error(&r, y) : -1;
  printf(
      "{\"bench\": \"conv\", \"check\": \"convgemm\", \"x\": [3, 5, 11, 9], "
      "\"w\": [7, 5, 3, 2], \"stride\": [2, 1], \"padding\": [1, 2], "
      "\"dilation\": [2, 3], \"convgemm_err\": %.3g}\n",
      err);
  cg_release(&r);
  clpar_scope_end(sc);
  return ok && err >= 0 && err < 1e-4;
}
#endif

typedef struct {
  const char *name;
  int64_t c, o, k, stride, pad, in224; /* input side at 224 */
} conv_shape;

static const conv_shape shapes[] = {
    {"conv1 7x7/2 3->64", 3, 64, 7, 2, 3, 224},
    {"layer1 1x1 64->64", 64, 64, 1, 1, 0, 56},
    {"layer1 3x3 64->64", 64, 64, 3, 1, 1, 56},
    {"layer1 1x1 64->256", 64, 256, 1, 1, 0, 56},
    {"layer1 1x1 256->64", 256, 64, 1, 1, 0, 56},
    {"layer2 3x3/2 128->128", 128, 128, 3, 2, 1, 56},
    {"layer2 downsample 1x1/2 256->512", 256, 512, 1, 2, 0, 56},
    {"layer2 1x1 512->128", 512, 128, 1, 1, 0, 28},
    {"layer3 3x3 256->256", 256, 256, 3, 1, 1, 14},
    {"layer3 1x1 1024->256", 1024, 256, 1, 1, 0, 14},
    {"layer3 1x1 256->1024", 256, 1024, 1, 1, 0, 14},
    {"layer4 3x3 512->512", 512, 512, 3, 1, 1, 7},
    {"layer4 1x1 2048->512", 2048, 512, 1, 1, 0, 7},
    {"layer4 1x1 512->2048", 512, 2048, 1, 1, 0, 7},
};

typedef struct {
  clpar_tensor *x, *w;     /* the layer */
  clpar_tensor *a, *b, *c; /* forward GEMM: c [O, NP] = a [O, K] @ b [K, NP] */
  clpar_tensor *dw, *col;  /* dw [O, K] = c @ b^T; col [K, NP] = a^T @ c */
  clpar_conv2d_options opt;
} bench_case;

static int conv_pass(bench_case *bc, clpar_device *dev) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *y, *l;
  int ok = bench_ok(clpar_conv2d(bc->x, bc->w, NULL, &bc->opt, &y), "conv2d") &&
           bench_ok(clpar_sum(y, &l), "sum") && bench_ok(clpar_backward(l), "backward");
  clpar_scope_end(sc);
  return ok && bench_ok(clpar_device_synchronize(dev), "synchronize");
}

/* The forward alone, no graph recorded (torch.no_grad), synchronized; *y kept when y. */
static int fwd_pass(bench_case *bc, clpar_device *dev, clpar_tensor **y) {
  int was = clpar_set_grad_enabled(0);
  clpar_tensor *out = NULL;
  int ok = bench_ok(clpar_conv2d(bc->x, bc->w, NULL, &bc->opt, &out), "conv2d forward") &&
           bench_ok(clpar_device_synchronize(dev), "synchronize");
  clpar_set_grad_enabled(was);
  if (ok && y)
    *y = out;
  else
    clpar_tensor_free(out);
  return ok;
}

/* Seconds of one backward pass of the layer to x alone (data) or w alone, as the header says;
 * negative on failure. */
static double bwd_time(bench_case *bc, clpar_device *dev, int data) {
  clpar_tensor *frozen = data ? bc->w : bc->x, *y, *l;
  clpar_scope *sc = clpar_scope_begin();
  double best = INFINITY;
  int ok = bench_ok(clpar_tensor_set_requires_grad(frozen, 0), "grad") &&
           bench_ok(clpar_conv2d(bc->x, bc->w, NULL, &bc->opt, &y), "conv2d") &&
           bench_ok(clpar_sum(y, &l), "sum");
  for (int r = 0; ok && r < 4; r++) {
    double t0 = now_seconds();
    ok = bench_ok(clpar_backward(l), "backward") &&
         bench_ok(clpar_device_synchronize(dev), "synchronize");
    if (r > 0) best = fmin(best, now_seconds() - t0);
  }
  clpar_scope_end(sc);
  ok = bench_ok(clpar_tensor_set_requires_grad(frozen, 1), "grad") && ok;
  return ok ? best : -1;
}

static int gemm_pass(bench_case *bc, clpar_device *dev) {
  return bench_ok(clpar_gemm(0, 0, 1, bc->a, bc->b, 0, bc->c), "gemm forward") &&
         bench_ok(clpar_gemm(0, 1, 1, bc->c, bc->b, 0, bc->dw), "gemm weight") &&
         bench_ok(clpar_gemm(1, 0, 1, bc->a, bc->c, 0, bc->col), "gemm columns") &&
         bench_ok(clpar_device_synchronize(dev), "synchronize");
}

static void free_case(bench_case *bc) {
  clpar_tensor *t[] = {bc->x, bc->w, bc->a, bc->b, bc->c, bc->dw, bc->col};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) clpar_tensor_free(t[i]);
}

/* The shape's tensors on dev: x and w for the convolution (both needing gradients), and a,
 * b, c, dw, col for its three GEMMs as the im2col path sizes them (o x K by K x NP). */
static int case_init(bench_case *bc, clpar_device *dev, const conv_shape *s, int64_t batch,
                     int64_t side, int64_t K, int64_t NP) {
  int64_t k = s->k;
  bc->opt = (clpar_conv2d_options){{s->stride, s->stride}, {s->pad, s->pad}, {1, 1}, 1};
  int64_t xs[4] = {batch, s->c, side, side}, ws[4] = {s->o, s->c, k, k};
  int64_t as[2] = {s->o, K}, bs[2] = {K, NP}, cs[2] = {s->o, NP};
  return bench_ok(clpar_tensor_rand_uniform(dev, 4, xs, 1, -1, 1, &bc->x), "x") &&
         bench_ok(clpar_tensor_rand_uniform(dev, 4, ws, 2, -0.1f, 0.1f, &bc->w), "w") &&
         bench_ok(clpar_tensor_set_requires_grad(bc->x, 1), "grad") &&
         bench_ok(clpar_tensor_set_requires_grad(bc->w, 1), "grad") &&
         bench_ok(clpar_tensor_rand_uniform(dev, 2, as, 3, -1, 1, &bc->a), "a") &&
         bench_ok(clpar_tensor_rand_uniform(dev, 2, bs, 4, -1, 1, &bc->b), "b") &&
         bench_ok(clpar_tensor_zeros(dev, 2, cs, &bc->c), "c") &&
         bench_ok(clpar_tensor_zeros(dev, 2, as, &bc->dw), "dw") &&
         bench_ok(clpar_tensor_zeros(dev, 2, bs, &bc->col), "col");
}

/* The sums over the shapes, in seconds and floating-point operations. */
typedef struct {
  double conv, gemm, flop, fwd, cg, bdata, bweight;
  double dnn_fwd, dnn_data, dnn_filter; /* cuDNN called directly */
} totals;

#ifdef BENCH_HAVE_CUDNN
/* The shape through cuDNN called directly, beside clpar's forward and backward passes of the
 * same shape (seconds); 0 on failure. */
static int cudnn_case(const clpar_device_info *info, const conv_shape *s, int64_t batch,
                      int64_t side, double fwd, double bdata, double bweight, totals *tot) {
  const char *colon = strchr(info->id, ':'), *tf = getenv("CLPAR_CUDA_TF32");
  int tf32 = tf && strcmp(tf, "1") == 0;
  cudnn_shape cs = {(int)batch, (int)s->c,      (int)side,  (int)s->o,
                    (int)s->k,  (int)s->stride, (int)s->pad};
  cudnn_times t;
  if (!cudnn_ref_time(colon ? atoi(colon + 1) : 0, &cs, tf32, &t)) return 0;
  tot->dnn_fwd += t.fwd, tot->dnn_data += t.bwd_data, tot->dnn_filter += t.bwd_filter;
  printf(
      "{\"bench\": \"conv\", \"device\": \"%s\", \"shape\": \"%s\", \"pass\": \"cudnn\", "
      "\"batch\": %lld, \"input\": %lld, \"tf32\": %d, \"fwd_ms\": %.3f, "
      "\"cudnn_fwd_ms\": %.3f, \"bwd_data_ms\": %.3f, \"cudnn_bwd_data_ms\": %.3f, "
      "\"bwd_weight_ms\": %.3f, \"cudnn_bwd_filter_ms\": %.3f, \"cudnn_algos\": [%d, %d, %d], "
      "\"ratio\": %.3f}\n",
      info->id, s->name, (long long)batch, (long long)side, tf32, 1e3 * fwd, 1e3 * t.fwd,
      1e3 * bdata, 1e3 * t.bwd_data, 1e3 * bweight, 1e3 * t.bwd_filter, t.algo_fwd, t.algo_data,
      t.algo_filter, (fwd + bdata + bweight) / (t.fwd + t.bwd_data + t.bwd_filter));
  return 1;
}
#endif

/* One shape's best seconds: conv + sum + backward, its three GEMMs, each backward alone. */
typedef struct {
  double conv, gemm, bdata, bweight;
} shape_times;

/* The shape's backward line and its conv-against-GEMMs line. */
static void print_shape(const clpar_device_info *info, const conv_shape *s, const char *ocl_bwd,
                        int64_t batch, int64_t side, int64_t NP, int64_t K, const shape_times *t) {
  double flop = 3.0 * 2.0 * (double)s->o * (double)NP * (double)K;
  printf(
      "{\"bench\": \"conv\", \"device\": \"%s\", \"shape\": \"%s\", \"pass\": "
      "\"backward\", \"ocl_conv_bwd\": \"%s\", \"batch\": %lld, \"input\": %lld, "
      "\"bwd_data_ms\": %.3f, \"bwd_weight_ms\": %.3f, \"bwd_data_gflops\": %.2f, "
      "\"bwd_weight_gflops\": %.2f}\n",
      info->id, s->name, ocl_bwd, (long long)batch, (long long)side, 1e3 * t->bdata,
      1e3 * t->bweight, flop / 3 / t->bdata * 1e-9, flop / 3 / t->bweight * 1e-9);
  printf(
      "{\"bench\": \"conv\", \"device\": \"%s\", \"shape\": \"%s\", \"batch\": %lld, "
      "\"input\": %lld, \"gemm_mnk\": [%lld, %lld, %lld], \"conv_ms\": %.3f, "
      "\"gemm_ms\": %.3f, \"conv_gflops\": %.2f, \"gemm_gflops\": %.2f, "
      "\"ratio\": %.3f}\n",
      info->id, s->name, (long long)batch, (long long)side, (long long)s->o, (long long)NP,
      (long long)K, 1e3 * t->conv, 1e3 * t->gemm, flop / t->conv * 1e-9, flop / t->gemm * 1e-9,
      t->gemm / t->conv);
}

static void print_totals(const clpar_device_info *info, int64_t batch, int64_t image,
                         const totals *tot, int convgemm, const char *bwd) {
  printf(
      "{\"bench\": \"conv\", \"device\": \"%s\", \"shape\": \"total\", \"pass\": "
      "\"backward\", \"ocl_conv_bwd\": \"%s\", \"batch\": %lld, \"image\": %lld, "
      "\"bwd_data_ms\": %.3f, \"bwd_weight_ms\": %.3f}\n",
      info->id, bwd, (long long)batch, (long long)image, 1e3 * tot->bdata, 1e3 * tot->bweight);
  printf(
      "{\"bench\": \"conv\", \"device\": \"%s\", \"name\": \"%s\", \"shape\": \"total\", "
      "\"batch\": %lld, \"image\": %lld, \"conv_ms\": %.3f, \"gemm_ms\": %.3f, "
      "\"conv_gflops\": %.2f, \"gemm_gflops\": %.2f, \"ratio\": %.3f}\n",
      info->id, info->name, (long long)batch, (long long)image, 1e3 * tot->conv, 1e3 * tot->gemm,
      tot->flop / tot->conv * 1e-9, tot->flop / tot->gemm * 1e-9, tot->gemm / tot->conv);
  double dnn = tot->dnn_fwd + tot->dnn_data + tot->dnn_filter;
  if (dnn > 0)
    printf(
        "{\"bench\": \"conv\", \"device\": \"%s\", \"shape\": \"total\", \"pass\": "
        "\"cudnn\", \"batch\": %lld, \"image\": %lld, \"fwd_ms\": %.3f, \"cudnn_fwd_ms\": "
        "%.3f, \"bwd_data_ms\": %.3f, \"cudnn_bwd_data_ms\": %.3f, \"bwd_weight_ms\": %.3f, "
        "\"cudnn_bwd_filter_ms\": %.3f, \"ratio\": %.3f}\n",
        info->id, (long long)batch, (long long)image, 1e3 * tot->fwd, 1e3 * tot->dnn_fwd,
        1e3 * tot->bdata, 1e3 * tot->dnn_data, 1e3 * tot->bweight, 1e3 * tot->dnn_filter,
        (tot->fwd + tot->bdata + tot->bweight) / dnn);
  if (convgemm)
    printf(
        "{\"bench\": \"conv\", \"device\": \"%s\", \"shape\": \"total\", \"pass\": "
        "\"forward\", \"batch\": %lld, \"image\": %lld, \"fwd_ms\": %.3f, "
        "\"convgemm_ms\": %.3f, \"convgemm_speedup\": %.3f}\n",
        info->id, (long long)batch, (long long)image, 1e3 * tot->fwd, 1e3 * tot->cg,
        tot->fwd / tot->cg);
}

int main(int argc, char **argv) {
  int index = argc > 1 ? atoi(argv[1]) : 0;
  int64_t batch = argc > 2 ? atoll(argv[2]) : 2, image = argc > 3 ? atoll(argv[3]) : 112;
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  if (index < 0 || index >= clpar_device_count() || batch < 1 || image < 32) {
    fprintf(stderr, "usage: %s [device-index < %d] [batch >= 1] [image >= 32]\n", argv[0],
            clpar_device_count());
    clpar_shutdown();
    return 2;
  }
  clpar_device *dev = clpar_device_get(index);
  clpar_device_info info;
  clpar_device_get_info(dev, &info);
  totals tot = {0};
  int failed = 0, convgemm = 0, cudnn = 0;
#ifdef BENCH_HAVE_CUDNN
  cudnn = strcmp(info.backend, "cuda") == 0; /* cuDNN called directly beside each shape */
#endif
  /* the OpenCL forward's algorithm (CLPAR_OCL_CONV: im2col, implicit, winograd, convgemm; unset:
   * chosen) */
  const char *ocl_conv = getenv("CLPAR_OCL_CONV") ? getenv("CLPAR_OCL_CONV") : "auto";
  const char *ocl_bwd = getenv("CLPAR_OCL_CONV_BWD") ? getenv("CLPAR_OCL_CONV_BWD") : "auto";
#ifdef BENCH_HAVE_OPENCL
  cl_device_id cl = NULL;
  if (strcmp(info.backend, "opencl") == 0) {
    const char *colon = strchr(info.id, ':');
    cl = bench_cl_device(colon ? atoi(colon + 1) : 0);
    convgemm = cl != NULL;
    if (!cl) fprintf(stderr, "no cl_device_id for %s: Xconvgemm skipped\n", info.id);
  }
  if (convgemm && !cg_check(dev, cl)) {
    fprintf(stderr, "CLBlastSconvgemm disagrees with clpar_conv2d or failed\n");
    clpar_shutdown();
    return 1;
  }
#endif
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && !failed; i++) {
    const conv_shape *s = &shapes[i];
    int64_t side = s->in224 * image / 224, k = s->k;
    int64_t out = (side + 2 * s->pad - k) / s->stride + 1, P = out * out, NP = batch * P;
    int64_t K = s->c * k * k;
    bench_case bc = {0};
    int ok = case_init(&bc, dev, s, batch, side, K, NP);
    ok = ok && conv_pass(&bc, dev) && gemm_pass(&bc, dev); /* warm-up */
    double best_conv = INFINITY, best_gemm = INFINITY, best_fwd = INFINITY, best_cg = INFINITY;
    double cg_err = -1;
#ifdef BENCH_HAVE_OPENCL
    cg_raw raw = {0};
    clpar_tensor *y = NULL;
    if (ok && convgemm) { /* warm-up (compiles CLBlast's kernels) and the check */
      ok = cg_setup(&raw, cl, bc.x, bc.w, &bc.opt) && cg_run(&raw) && fwd_pass(&bc, dev, &y);
      cg_err = ok ? cg_error(&raw, y) : -1;
      clpar_tensor_free(y);
      ok = ok && cg_err >= 0;
    }
#endif
    for (int r = 0; ok && r < 3; r++) {
      double t0 = now_seconds();
      ok = conv_pass(&bc, dev);
      double t1 = now_seconds();
      ok = ok && gemm_pass(&bc, dev);
      double t2 = now_seconds();
      best_conv = fmin(best_conv, t1 - t0);
      best_gemm = fmin(best_gemm, t2 - t1);
      if (ok && (convgemm || cudnn)) {
        t0 = now_seconds();
        ok = fwd_pass(&bc, dev, NULL);
        best_fwd = fmin(best_fwd, now_seconds() - t0);
      }
#ifdef BENCH_HAVE_OPENCL
      if (ok && convgemm) {
        t1 = now_seconds();
        ok = cg_run(&raw);
        best_cg = fmin(best_cg, now_seconds() - t1);
      }
#endif
    }
#ifdef BENCH_HAVE_OPENCL
    cg_release(&raw);
#endif
    double bdata = ok ? bwd_time(&bc, dev, 1) : -1, bweight = ok ? bwd_time(&bc, dev, 0) : -1;
    ok = ok && bdata >= 0 && bweight >= 0;
    free_case(&bc);
    if (!ok) {
      failed = 1;
      break;
    }
    double flop = 3.0 * 2.0 * (double)s->o * (double)NP * (double)K;
    tot.conv += best_conv, tot.gemm += best_gemm, tot.flop += flop;
    tot.bdata += bdata, tot.bweight += bweight;
    shape_times t = {best_conv, best_gemm, bdata, bweight};
    print_shape(&info, s, ocl_bwd, batch, side, NP, K, &t);
#ifdef BENCH_HAVE_CUDNN
    if (cudnn && !cudnn_case(&info, s, batch, side, best_fwd, bdata, bweight, &tot)) {
      failed = 1;
      break;
    }
#endif
    if (convgemm || cudnn) tot.fwd += best_fwd;
    if (convgemm) {
      tot.cg += best_cg;
      printf(
          "{\"bench\": \"conv\", \"device\": \"%s\", \"shape\": \"%s\", \"pass\": \"forward\", "
          "\"ocl_conv\": \"%s\", "
          "\"batch\": %lld, \"input\": %lld, \"fwd_ms\": %.3f, \"convgemm_ms\": %.3f, "
          "\"fwd_gflops\": %.2f, \"convgemm_gflops\": %.2f, \"convgemm_speedup\": %.3f, "
          "\"convgemm_err\": %.3g}\n",
          info.id, s->name, ocl_conv, (long long)batch, (long long)side, 1e3 * best_fwd,
          1e3 * best_cg, flop / 3 / best_fwd * 1e-9, flop / 3 / best_cg * 1e-9, best_fwd / best_cg,
          cg_err);
    }
    fflush(stdout);
  }
  if (!failed) print_totals(&info, batch, image, &tot, convgemm, ocl_bwd);
  clpar_shutdown();
  return failed;
}
