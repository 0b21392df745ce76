/* test_cuda_cudnn.c — the CUDA backend's convolutions through cuDNN (backends/cuda/cuda_cudnn.c)
 * against the same device's plain path (im2col, cuBLAS GEMMs, col2im) on the same inputs:
 * forward with and without bias, the gradients of input, weight and bias, over stride,
 * padding, dilation, groups (depthwise too), odd sizes, batch 1 and ResNet-50's layer shapes
 * (batch 16 of 64x64 images, as bench_train_step runs it); and CLPAR_CUDA_CUDNN and
 * CLPAR_CUDA_TF32, read at clpar_init. Built with cuDNN's headers (CLPAR_HAVE_CUDNN); the
 * comparisons skip, saying why, without a CUDA device or where cuDNN does not load, and the
 * variables' refusals run everywhere. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

/* backends/cuda/cuda_cudnn.h: opens cuDNN (once per process); 1 when it can be used. */
int clpar_cudnn_load(const char **why);

#define OPT TU_CONV_OPT

static const tu_conv_case cases[] = {
    {"3x3 pad 1", 2, 3, 7, 6, 4, 3, 3, OPT(1, 1, 1, 1, 1, 1, 1), 1},
    {"stride (2,1) pad (1,0) dilation (2,1) groups 2", 3, 4, 9, 8, 6, 3, 2,
     OPT(2, 1, 1, 0, 2, 1, 2), 1},
    {"depthwise 3x3 stride 2", 2, 5, 6, 7, 5, 3, 3, OPT(2, 2, 1, 1, 1, 1, 5), 0},
    {"depthwise 5x5 channel multiplier 2", 1, 4, 11, 9, 8, 5, 5, OPT(1, 1, 2, 2, 1, 1, 4), 1},
    {"5x5 stride 3 pad 2", 1, 2, 11, 13, 3, 5, 5, OPT(3, 3, 2, 2, 1, 1, 1), 1},
    {"3x3 stride 2 no pad, odd sizes: the last row and column unread", 1, 3, 10, 8, 5, 3, 3,
     OPT(2, 2, 0, 0, 1, 1, 1), 1},
    {"3x3 dilation 2 pad 3", 2, 2, 4, 5, 3, 3, 3, OPT(1, 2, 3, 3, 2, 2, 1), 1},
    {"1x1 stride 2", 2, 6, 7, 5, 4, 1, 1, OPT(2, 2, 0, 0, 1, 1, 1), 0},
    {"1x1 groups 3", 1, 6, 16, 16, 9, 1, 1, OPT(1, 1, 0, 0, 1, 1, 3), 1},
    {"3x3 groups 4 dilation 3 on 1x1 output", 1, 8, 7, 7, 8, 3, 3, OPT(1, 1, 0, 0, 3, 3, 4), 1},
    {"resnet50 conv1 7x7 stride 2 pad 3", 16, 3, 64, 64, 64, 7, 7, OPT(2, 2, 3, 3, 1, 1, 1), 0},
    {"resnet50 layer1 1x1 64->64", 16, 64, 16, 16, 64, 1, 1, OPT(1, 1, 0, 0, 1, 1, 1), 0},
    {"resnet50 layer1 3x3 64", 16, 64, 16, 16, 64, 3, 3, OPT(1, 1, 1, 1, 1, 1, 1), 0},
    {"resnet50 layer1 1x1 64->256", 16, 64, 16, 16, 256, 1, 1, OPT(1, 1, 0, 0, 1, 1, 1), 0},
    {"resnet50 layer2 1x1 256->128", 16, 256, 16, 16, 128, 1, 1, OPT(1, 1, 0, 0, 1, 1, 1), 0},
    {"resnet50 layer2 3x3 128 stride 2", 16, 128, 16, 16, 128, 3, 3, OPT(2, 2, 1, 1, 1, 1, 1), 0},
    {"resnet50 layer2 downsample 1x1 stride 2", 16, 256, 16, 16, 512, 1, 1,
     OPT(2, 2, 0, 0, 1, 1, 1), 0},
    {"resnet50 layer3 3x3 256", 16, 256, 4, 4, 256, 3, 3, OPT(1, 1, 1, 1, 1, 1, 1), 0},
    {"resnet50 layer3 1x1 256->1024", 16, 256, 4, 4, 1024, 1, 1, OPT(1, 1, 0, 0, 1, 1, 1), 0},
    {"resnet50 layer4 3x3 512 stride 2", 16, 512, 4, 4, 512, 3, 3, OPT(2, 2, 1, 1, 1, 1, 1), 0},
    {"resnet50 layer4 1x1 2048->512", 16, 2048, 2, 2, 512, 1, 1, OPT(1, 1, 0, 0, 1, 1, 1), 1},
};
#define N_CASES (sizeof cases / sizeof cases[0])

#define MAX_CUDA 16
static clpar_device *cudnn_devs[MAX_CUDA]; /* selected CUDA devices on the cuDNN path */
static int cudnn_count;
static char skip_reason[512];

static int is_cuda(const clpar_device *d) {
  return strcmp(d->bd.iface->name, "cuda") == 0;
}

static void find_devices(void) {
  int cuda = 0;
  cudnn_count = 0;
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_device *d = clpar_device_get(i);
    if (!is_cuda(d)) continue;
    cuda++;
    if (d->bd.iface->conv2d && cudnn_count < MAX_CUDA) cudnn_devs[cudnn_count++] = d;
  }
  const char *why = "";
  if (cuda == 0)
    snprintf(skip_reason, sizeof skip_reason,
             "no CUDA device selected (CLPAR_DEVICES=%s; CLPAR_LOG_LEVEL=info tells why)",
             getenv("CLPAR_DEVICES") ? getenv("CLPAR_DEVICES") : "(unset)");
  else if (cudnn_count == 0 && !clpar_cudnn_load(&why))
    snprintf(skip_reason, sizeof skip_reason, "cuDNN could not be loaded: %s", why);
  else if (cudnn_count == 0)
    snprintf(skip_reason, sizeof skip_reason, "the CUDA devices run the plain path");
}

/* One case on both paths; the tolerance scales with the largest value (the sums run over up
 * to 2048 terms, in a different order on each path, and cuDNN may pick Winograd or FFT). */
static void compare(clpar_device *dev, const tu_conv_case *c, int grads) {
  tu_conv_result got, want;
  tu_conv_run(dev, c, grads, &got);
  tu_conv_run_plain(dev, c, grads, &want);
  for (int k = 0; k < 4; k++) {
    assert_true(!got.v[k] == !want.v[k]);
    if (!want.v[k]) continue;
    char what[200];
    snprintf(what, sizeof what, "%s on %s (gradients 0x%x): %s", c->name, dev->bd.info.id, grads,
             tu_conv_part[k]);
    assert_int_equal(got.n[k], want.n[k]);
    float big = 1.0f;
    for (size_t i = 0; i < want.n[k]; i++) big = fmaxf(big, fabsf(want.v[k][i]));
    tu_assert_close(got.v[k], want.v[k], want.n[k], 1e-3f, 2e-4f * big, what);
  }
  tu_conv_result_free(&got), tu_conv_result_free(&want);
}

#define NEED_CUDNN()                                         \
  do {                                                       \
    if (cudnn_count == 0) {                                  \
      fprintf(stderr, "test_cuda_cudnn: %s\n", skip_reason); \
      skip();                                                \
    }                                                        \
  } while (0)

static void test_against_plain_path(void **state) {
  (void)state;
  NEED_CUDNN();
  for (int d = 0; d < cudnn_count; d++) {
    for (size_t i = 0; i < N_CASES; i++) compare(cudnn_devs[d], &cases[i], 7);
    /* some gradients only: dx alone, the bias's alone (dw made and dropped), dw without dx */
    for (int grads = 1; grads <= 6; grads++) compare(cudnn_devs[d], &cases[5], grads);
  }
}

/* A second run of every case finds the cached algorithms: the same results within the
 * tolerance, and the cache's entries stay valid across a batch of other shapes. */
static void test_cached_choices(void **state) {
  (void)state;
  NEED_CUDNN();
  for (size_t i = 0; i < N_CASES; i += 3) compare(cudnn_devs[0], &cases[i], 7);
}

/* After clpar_init: 1 when every CUDA device has the conv2d entry (want) or none has (!want);
 * without CUDA devices, 1. */
static int all_cudnn(int want) {
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_device *d = clpar_device_get(i);
    if (is_cuda(d) && !d->bd.iface->conv2d != !want) return 0;
  }
  return 1;
}

/* Whether cuDNN loads, asked only where a CUDA device is (as the probe asks). */
static int cudnn_loads(void) {
  const char *why = "";
  for (int i = 0; i < clpar_device_count(); i++)
    if (is_cuda(clpar_device_get(i))) return clpar_cudnn_load(&why);
  return 0;
}

/* CLPAR_CUDA_CUDNN and CLPAR_CUDA_TF32 are read at clpar_init: "0" and "1" only, anything
 * else an error naming the variable (whether or not a GPU is present); CLPAR_CUDA_CUDNN=0
 * leaves every CUDA device on the plain path. */
static void test_env(void **state) {
  (void)state;
  const char *vars[2] = {"CLPAR_CUDA_CUDNN", "CLPAR_CUDA_TF32"};
  const char *bad[] = {"2", "", "yes", "1 ", "01", "true"};
  clpar_shutdown();
  for (int v = 0; v < 2; v++) {
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      setenv(vars[v], bad[i], 1);
      assert_int_equal(clpar_init(), CLPAR_ERROR_INVALID_ARGUMENT);
      assert_non_null(strstr(clpar_last_error(), vars[v]));
    }
    unsetenv(vars[v]);
  }
  setenv("CLPAR_CUDA_CUDNN", "0", 1);
  setenv("CLPAR_CUDA_TF32", "1", 1);
  tu_ok(clpar_init());
  assert_true(all_cudnn(0));
  clpar_shutdown();
  unsetenv("CLPAR_CUDA_TF32");
  unsetenv("CLPAR_CUDA_CUDNN"); /* unset is the default: the plain path */
  tu_ok(clpar_init());
  assert_true(all_cudnn(0));
  clpar_shutdown();
  setenv("CLPAR_CUDA_CUDNN", "1", 1); /* cuDNN where it loads, as the other tests run */
  tu_ok(clpar_init());
  assert_true(all_cudnn(cudnn_loads()));
  find_devices();
}

static int group_setup(void **state) {
  int rc = tu_setup(state);
  if (rc == 0) find_devices();
  return rc;
}

int main(void) {
  setenv("CLPAR_CUDA_CUDNN", "1", 1); /* cuDNN is opt-in; these tests are about it */
  unsetenv("CLPAR_CUDA_TF32");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_against_plain_path),
      cmocka_unit_test(test_cached_choices),
      cmocka_unit_test(test_env),
  };
  return cmocka_run_group_tests(tests, group_setup, tu_teardown);
}
