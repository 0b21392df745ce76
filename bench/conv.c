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
 *   POCL_DEVICES=pthread ./bench_conv [device-index] [batch] [image]
 *   CLPAR_DEVICES=host ./bench_conv 0 2 112 */
#include <clpar/clpar.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

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
  double total_conv = 0, total_gemm = 0, total_flop = 0;
  int failed = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && !failed; i++) {
    const conv_shape *s = &shapes[i];
    int64_t side = s->in224 * image / 224, k = s->k;
    int64_t out = (side + 2 * s->pad - k) / s->stride + 1, P = out * out, NP = batch * P;
    int64_t K = s->c * k * k;
    bench_case bc = {0};
    bc.opt = (clpar_conv2d_options){{s->stride, s->stride}, {s->pad, s->pad}, {1, 1}, 1};
    int64_t xs[4] = {batch, s->c, side, side}, ws[4] = {s->o, s->c, k, k};
    int64_t as[2] = {s->o, K}, bs[2] = {K, NP}, cs[2] = {s->o, NP};
    int ok = bench_ok(clpar_tensor_rand_uniform(dev, 4, xs, 1, -1, 1, &bc.x), "x") &&
             bench_ok(clpar_tensor_rand_uniform(dev, 4, ws, 2, -0.1f, 0.1f, &bc.w), "w") &&
             bench_ok(clpar_tensor_set_requires_grad(bc.x, 1), "grad") &&
             bench_ok(clpar_tensor_set_requires_grad(bc.w, 1), "grad") &&
             bench_ok(clpar_tensor_rand_uniform(dev, 2, as, 3, -1, 1, &bc.a), "a") &&
             bench_ok(clpar_tensor_rand_uniform(dev, 2, bs, 4, -1, 1, &bc.b), "b") &&
             bench_ok(clpar_tensor_zeros(dev, 2, cs, &bc.c), "c") &&
             bench_ok(clpar_tensor_zeros(dev, 2, as, &bc.dw), "dw") &&
             bench_ok(clpar_tensor_zeros(dev, 2, bs, &bc.col), "col");
    ok = ok && conv_pass(&bc, dev) && gemm_pass(&bc, dev); /* warm-up */
    double best_conv = INFINITY, best_gemm = INFINITY;
    for (int r = 0; ok && r < 3; r++) {
      double t0 = bench_now();
      ok = conv_pass(&bc, dev);
      double t1 = bench_now();
      ok = ok && gemm_pass(&bc, dev);
      double t2 = bench_now();
      best_conv = fmin(best_conv, t1 - t0);
      best_gemm = fmin(best_gemm, t2 - t1);
    }
    free_case(&bc);
    if (!ok) {
      failed = 1;
      break;
    }
    double flop = 3.0 * 2.0 * (double)s->o * (double)NP * (double)K;
    total_conv += best_conv, total_gemm += best_gemm, total_flop += flop;
    printf(
        "{\"bench\": \"conv\", \"device\": \"%s\", \"shape\": \"%s\", \"batch\": %lld, "
        "\"input\": %lld, \"gemm_mnk\": [%lld, %lld, %lld], \"conv_ms\": %.3f, "
        "\"gemm_ms\": %.3f, \"conv_gflops\": %.2f, \"gemm_gflops\": %.2f, "
        "\"ratio\": %.3f}\n",
        info.id, s->name, (long long)batch, (long long)side, (long long)s->o, (long long)NP,
        (long long)K, 1e3 * best_conv, 1e3 * best_gemm, flop / best_conv * 1e-9,
        flop / best_gemm * 1e-9, best_gemm / best_conv);
    fflush(stdout);
  }
  if (!failed)
    printf(
        "{\"bench\": \"conv\", \"device\": \"%s\", \"name\": \"%s\", \"shape\": \"total\", "
        "\"batch\": %lld, \"image\": %lld, \"conv_ms\": %.3f, \"gemm_ms\": %.3f, "
        "\"conv_gflops\": %.2f, \"gemm_gflops\": %.2f, \"ratio\": %.3f}\n",
        info.id, info.name, (long long)batch, (long long)image, 1e3 * total_conv, 1e3 * total_gemm,
        total_flop / total_conv * 1e-9, total_flop / total_gemm * 1e-9, total_gemm / total_conv);
  clpar_shutdown();
  return failed;
}
