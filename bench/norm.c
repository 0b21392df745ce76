/* norm.c — ResNet-50's batch norms and its global average pool on one device: each distinct
 * layer shape of torchvision's ResNet-50 (v1.5) at the image size given, one training pass
 * (clpar_batch_norm in training mode with weight, bias and running statistics, or
 * clpar_adaptive_avg_pool2d to 1x1; a sum as the loss; backward to the input, weight and
 * bias), synchronized, best of R rounds after a warm-up. Prints one JSON object per shape (ms
 * per call, how many layers of the net have it) and a total over the net's layers.
 *
 * On the host device built with oneDNN, CLPAR_HOST_DNNL=1 (the default) and 0 time oneDNN's
 * path and the plain loops; "name" says which ("... + oneDNN" or not).
 *
 *   CLPAR_DEVICES=host ./bench_norm [device-index] [batch] [image] [rounds]
 *   OMP_NUM_THREADS=1 CLPAR_DEVICES=host CLPAR_HOST_DNNL=0 ./bench_norm 0 16 64 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "clpar/clpar.h"

#define MAX_SHAPES 32

static int check(clpar_status s, const char *what) {
  if (s != CLPAR_OK) fprintf(stderr, "bench_norm: %s: %s\n", what, clpar_last_error());
  return s == CLPAR_OK;
}
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
  int64_t c, h, count;
} shape;

static void add(shape *s, int *n, int64_t c, int64_t h) {
  for (int i = 0; i < *n; i++)
    if (s[i].c == c && s[i].h == h) {
      s[i].count++;
      return;
    }
  if (*n < MAX_SHAPES) s[(*n)++] = (shape){c, h, 1};
}

/* The batch norms of ResNet-50 v1.5 (the stride in each first block's 3x3). */
static int resnet50_norms(int64_t image, shape *s) {
  int n = 0, blocks[4] = {3, 4, 6, 3};
  add(s, &n, 64, (image + 1) / 2);
  int64_t hw = ((image + 1) / 2 + 1) / 2; /* after the stem's 7x7/2 and max pool 3x3/2 */
  for (int l = 0; l < 4; l++)
    for (int b = 0; b < blocks[l]; b++) {
      int64_t w = 64 << l, out = l > 0 && b == 0 ? (hw + 1) / 2 : hw;
      add(s, &n, w, hw);
      add(s, &n, w, out);
      add(s, &n, 4 * w, out);
      if (b == 0) add(s, &n, 4 * w, out); /* the downsample's */
      hw = out;
    }
  return n;
}

/* One training pass of batch norm (pool: the global average pool) over [batch, c, h, h]; ms,
 * or -1 on an error. */
static double pass(clpar_device *dev, int64_t batch, int64_t c, int64_t h, int pool,
                   const float *x0, const float *ones) {
  clpar_scope *sc = clpar_scope_begin();
  int64_t shape[4] = {batch, c, h, h};
  clpar_tensor *x, *w, *b, *rm, *rv, *y, *loss;
  clpar_status s = clpar_tensor_from_host(dev, 4, shape, x0, &x);
  if (s == CLPAR_OK) s = clpar_tensor_set_requires_grad(x, 1);
  if (s == CLPAR_OK) s = clpar_tensor_from_host(dev, 1, &c, ones, &w);
  if (s == CLPAR_OK) s = clpar_tensor_zeros(dev, 1, &c, &b);
  if (s == CLPAR_OK) s = clpar_tensor_zeros(dev, 1, &c, &rm);
  if (s == CLPAR_OK) s = clpar_tensor_from_host(dev, 1, &c, ones, &rv);
  if (s == CLPAR_OK) s = clpar_tensor_set_requires_grad(w, 1);
  if (s == CLPAR_OK) s = clpar_tensor_set_requires_grad(b, 1);
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  double t = now();
  if (s == CLPAR_OK)
    s = pool ? clpar_adaptive_avg_pool2d(x, 1, 1, &y)
             : clpar_batch_norm(x, rm, rv, w, b, 1, 0.1f, 1e-5f, &y);
  if (s == CLPAR_OK) s = clpar_sum(y, &loss);
  if (s == CLPAR_OK) s = clpar_backward(loss);
  if (s == CLPAR_OK) s = clpar_device_synchronize(dev);
  t = now() - t;
  check(s, pool ? "adaptive_avg_pool2d pass" : "batch_norm pass");
  clpar_scope_end(sc);
  return s == CLPAR_OK ? 1e3 * t : -1.0;
}

/* The best of rounds passes after one warm-up; -1 on an error. */
static double best_of(clpar_device *dev, int64_t batch, const shape *s, int pool, int rounds) {
  size_t n = (size_t)(batch * s->c * s->h * s->h);
  float *x0 = malloc(n * sizeof *x0), *ones = malloc((size_t)s->c * sizeof *ones);
  double best = -1.0;
  if (x0 && ones) {
    for (size_t i = 0; i < n; i++) x0[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (int64_t i = 0; i < s->c; i++) ones[i] = 1.0f;
    for (int r = 0; r <= rounds; r++) {
      double t = pass(dev, batch, s->c, s->h, pool, x0, ones);
      if (t < 0) {
        best = -1.0;
        break;
      }
      if (r > 0 && (best < 0 || t < best)) best = t;
    }
  }
  free(x0);
  free(ones);
  return best;
}

int main(int argc, char **argv) {
  int index = argc > 1 ? atoi(argv[1]) : 0, rounds = argc > 4 ? atoi(argv[4]) : 8;
  int64_t batch = argc > 2 ? atoll(argv[2]) : 16, image = argc > 3 ? atoll(argv[3]) : 64;
  if (batch < 1 || image < 32 || rounds < 1) {
    fprintf(stderr, "usage: bench_norm [device-index] [batch >= 1] [image >= 32] [rounds >= 1]\n");
    return 2;
  }
  if (!check(clpar_init(), "clpar_init")) return 1;
  if (index < 0 || index >= clpar_device_count()) {
    fprintf(stderr, "bench_norm: no device %d\n", index);
    clpar_shutdown();
    return 1;
  }
  clpar_device *dev = clpar_device_get(index);
  clpar_device_info info;
  if (!check(clpar_device_get_info(dev, &info), "clpar_device_get_info")) return 1;
  const char *name = info.name;
  shape s[MAX_SHAPES + 1];
  int n = resnet50_norms(image, s);
  s[n] = (shape){2048, s[n - 1].h, 1}; /* the global average pool's input */
  double total = 0.0;
  for (int i = 0; i <= n; i++) {
    double ms = best_of(dev, batch, &s[i], i == n, rounds);
    if (ms < 0) {
      clpar_shutdown();
      return 1;
    }
    total += ms * (double)s[i].count;
    printf(
        "{\"bench\": \"norm\", \"device\": \"%s\", \"op\": \"%s\", \"shape\": [%lld, %lld, %lld, "
        "%lld], \"layers\": %lld, \"ms\": %.4f}\n",
        name, i == n ? "adaptive_avg_pool2d" : "batch_norm", (long long)batch, (long long)s[i].c,
        (long long)s[i].h, (long long)s[i].h, (long long)s[i].count, ms);
  }
  printf("{\"bench\": \"norm\", \"device\": \"%s\", \"total_ms\": %.3f}\n", name, total);
  clpar_shutdown();
  return 0;
}
