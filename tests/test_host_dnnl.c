/* test_host_dnnl.c — the host backend's convolutions through oneDNN (backends/host/host_dnnl.c)
 * against the plain loops (im2col, GEMMs, col2im) on the same inputs: forward with and without
 * bias, the gradients of input, weight and bias, over stride, padding, dilation, groups
 * (depthwise too), odd sizes, batch 1 and some of ResNet-50's layer shapes; the same bits on a
 * second run; and CLPAR_HOST_DNNL, which selects the path at clpar_init. Built only with
 * oneDNN (CLPAR_HAVE_DNNL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

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
    {"resnet50 conv1 7x7 stride 2 pad 3", 1, 3, 64, 64, 64, 7, 7, OPT(2, 2, 3, 3, 1, 1, 1), 0},
    {"resnet50 layer1 3x3 64", 2, 64, 16, 16, 64, 3, 3, OPT(1, 1, 1, 1, 1, 1, 1), 0},
    {"resnet50 layer1 1x1 64->256", 2, 64, 16, 16, 256, 1, 1, OPT(1, 1, 0, 0, 1, 1, 1), 0},
    {"resnet50 layer2 3x3 128 stride 2", 2, 128, 16, 16, 128, 3, 3, OPT(2, 2, 1, 1, 1, 1, 1), 0},
    {"resnet50 layer2 downsample 1x1 stride 2", 2, 256, 16, 16, 512, 1, 1, OPT(2, 2, 0, 0, 1, 1, 1),
     0},
    {"resnet50 layer4 3x3 512 stride 2", 2, 256, 4, 4, 256, 3, 3, OPT(2, 2, 1, 1, 1, 1, 1), 1},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* One case on both paths, and twice on oneDNN: the same bits. */
static void compare(clpar_device *dev, const tu_conv_case *c, int grads) {
  tu_conv_result got, again, want;
  tu_conv_run(dev, c, grads, &got);
  tu_conv_run(dev, c, grads, &again);
  tu_conv_run_plain(dev, c, grads, &want);
  for (int k = 0; k < 4; k++) {
    assert_true(!got.v[k] == !want.v[k]);
    if (!want.v[k]) continue;
    char what[160];
    snprintf(what, sizeof what, "%s (gradients 0x%x): %s", c->name, grads, tu_conv_part[k]);
    assert_int_equal(got.n[k], want.n[k]);
    tu_assert_close(got.v[k], want.v[k], want.n[k], 1e-4f, 1e-4f, what);
    if (memcmp(got.v[k], again.v[k], got.n[k] * sizeof(float)) != 0)
      fail_msg("%s differs between two runs on the same inputs", what);
  }
  tu_conv_result_free(&got), tu_conv_result_free(&again), tu_conv_result_free(&want);
}

static void test_against_plain_loops(void **state) {
  (void)state;
  clpar_device *dev = tu_host();
  assert_non_null(dev->bd.iface->conv2d); /* main selects the oneDNN path */
  for (size_t i = 0; i < N_CASES; i++) compare(dev, &cases[i], 7);
  /* some gradients only: dx alone, the bias's alone (dw made and dropped), dw without dx */
  for (int grads = 1; grads <= 6; grads++) compare(dev, &cases[5], grads);
}

/* CLPAR_HOST_DNNL chooses the path at clpar_init: 0 the plain loops, 1 oneDNN, anything else
 * an error naming the variable. */
static void test_env(void **state) {
  (void)state;
  clpar_shutdown();
  setenv("CLPAR_HOST_DNNL", "0", 1);
  tu_ok(clpar_init());
  assert_null(tu_host()->bd.iface->conv2d);
  clpar_shutdown();
  const char *bad[] = {"2", "", "yes", "1 ", "01"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("CLPAR_HOST_DNNL", bad[i], 1);
    assert_int_equal(clpar_init(), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "CLPAR_HOST_DNNL"));
  }
  unsetenv("CLPAR_HOST_DNNL"); /* the default: oneDNN */
  tu_ok(clpar_init());
  assert_non_null(tu_host()->bd.iface->conv2d);
  clpar_shutdown();
  setenv("CLPAR_HOST_DNNL", "1", 1);
  tu_ok(clpar_init());
  assert_non_null(tu_host()->bd.iface->conv2d);
}

int main(void) {
  unsetenv("CLPAR_HOST_DNNL"); /* the default is oneDNN, whatever the caller's environment */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_against_plain_loops),
      cmocka_unit_test(test_env),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
