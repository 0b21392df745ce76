/* test_ocl_dnnl.c — the OpenCL backend's convolutions through oneDNN (backends/opencl/ocl_dnnl.c,
 * CLPAR_OCL_DNNL=1). On a device oneDNN does not serve (anything but an Intel GPU: every
 * device this project's CI has), the switch is refused with its reason, logged once, and the
 * convolutions (forward, the gradients of input, weight and bias) are the same bits as with the
 * switch unset; with the vendor check skipped, a device whose oneDNN engine cannot be made
 * refuses the same way. A bad value of CLPAR_OCL_DNNL is an error naming it. On an Intel GPU
 * with oneDNN's OpenCL runtime, the oneDNN results are compared against clpar's kernels
 * (test_intel_gpu_against_kernels, skipped elsewhere). The descriptors and primitives oneDNN
 * runs are the host backend's (backends/dnnl_conv.c), which test_host_dnnl covers. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_test_util.h"
#include "test_ocl_conv_util.h"
#include "test_util.h"

#define OPT TU_CONV_OPT

static const tu_conv_case cases[] = {
    {"3x3 pad 1", 2, 3, 7, 6, 4, 3, 3, OPT(1, 1, 1, 1, 1, 1, 1), 1},
    {"stride (2,1) pad (1,0) dilation (2,1) groups 2", 3, 4, 9, 8, 6, 3, 2,
     OPT(2, 1, 1, 0, 2, 1, 2), 1},
    {"depthwise 3x3 stride 2", 2, 5, 6, 7, 5, 3, 3, OPT(2, 2, 1, 1, 1, 1, 5), 0},
    {"3x3 stride 2 no pad, odd sizes: the last row and column unread", 1, 3, 10, 8, 5, 3, 3,
     OPT(2, 2, 0, 0, 1, 1, 1), 1},
    {"1x1 stride 2", 2, 6, 7, 5, 4, 1, 1, OPT(2, 2, 0, 0, 1, 1, 1), 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int refusals;
static char refusal[512];

static void keep_log(clpar_log_level level, const char *message, void *user) {
  (void)level, (void)user;
  pthread_mutex_lock(&log_lock);
  if (strstr(message, "CLPAR_OCL_DNNL=1 refused")) {
    refusals++;
    snprintf(refusal, sizeof refusal, "%s", message);
  }
  pthread_mutex_unlock(&log_lock);
}

static int setup(void **state) {
  return tcu_setup(state, "ocl-dnnl");
}

/* Every case (all gradients) with CLPAR_OCL_DNNL=1 against the switch unset: the same bits
 * (tol 0) or within tol. */
static void against_unset(clpar_device *dev, float tol) {
  for (size_t i = 0; i < N_CASES; i++) {
    tu_conv_result on, off;
    setenv("CLPAR_OCL_DNNL", "1", 1);
    tu_conv_run(dev, &cases[i], 7, &on);
    unsetenv("CLPAR_OCL_DNNL");
    tu_conv_run(dev, &cases[i], 7, &off);
    for (int k = 0; k < 4; k++) {
      assert_true(!on.v[k] == !off.v[k]);
      if (!on.v[k]) continue;
      char what[160];
      snprintf(what, sizeof what, "%s: %s with CLPAR_OCL_DNNL=1", cases[i].name, tu_conv_part[k]);
      assert_int_equal(on.n[k], off.n[k]);
      if (tol == 0.0f && memcmp(on.v[k], off.v[k], on.n[k] * sizeof(float)) != 0)
        fail_msg("%s: differs", what);
      if (tol != 0.0f) tu_assert_close(on.v[k], off.v[k], on.n[k], tol, tol, what);
    }
    tu_conv_result_free(&on), tu_conv_result_free(&off);
  }
}

/* d's state made again from scratch, the vendor check on (any_vendor 0) or skipped. */
static void fresh_state(clpar_device *dev, clpar_ocl_device *d, int any_vendor) {
  tu_ok(clpar_device_synchronize(dev));
  clpar_ocl_dnnl_free(d);
  clpar_ocl_dnnl_any_vendor = any_vendor;
}

/* Whether d is an Intel GPU (the devices oneDNN's OpenCL kernels serve). */
static int intel_gpu(clpar_ocl_device *d) {
  cl_device_type type = 0;
  cl_uint vendor = 0;
  assert_int_equal(clGetDeviceInfo(d->device, CL_DEVICE_TYPE, sizeof type, &type, NULL), 0);
  assert_int_equal(clGetDeviceInfo(d->device, CL_DEVICE_VENDOR_ID, sizeof vendor, &vendor, NULL),
                   0);
  return (type & CL_DEVICE_TYPE_GPU) && vendor == 0x8086;
}

/* The convolutions themselves find the device refused (logged once), and run clpar's kernels. */
static void test_other_devices_refuse(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  if (intel_gpu(d)) {
    print_message("an Intel GPU: test_intel_gpu_against_kernels covers it\n");
    return;
  }
  fresh_state(dev, d, 0);
  refusals = 0;
  clpar_log_set_callback(keep_log, NULL);
  clpar_log_level level = clpar_log_get_level();
  clpar_log_set_level(CLPAR_LOG_INFO);
  against_unset(dev, 0.0f);
  tu_ok(clpar_device_synchronize(dev));
  clpar_log_set_level(level);
  clpar_log_set_callback(NULL, NULL);
  assert_int_equal(refusals, 1); /* once per device, however many calls */
  const char *why = clpar_ocl_dnnl_why(d);
  assert_non_null(why);
  assert_non_null(strstr(why, "not an Intel GPU"));
  assert_non_null(strstr(refusal, why));
  assert_int_equal(clpar_ocl_dnnl_runs(d), 0);
}

/* Past the vendor check, the engine itself: oneDNN refuses every device but an Intel GPU. */
static void test_engine_refusal_keeps_kernels(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  fresh_state(dev, d, 1);
  const char *why = clpar_ocl_dnnl_why(d);
  if (!why) {
    fresh_state(dev, d, 0);
    print_message("oneDNN made an engine for this device: nothing refused\n");
    return;
  }
#ifdef CLPAR_HAVE_DNNL_OCL
  assert_non_null(strstr(why, "ocl_interop_engine_create"));
#else
  assert_non_null(strstr(why, "OpenCL GPU runtime"));
#endif
  against_unset(dev, 0.0f);
  tu_ok(clpar_device_synchronize(dev));
  assert_int_equal(clpar_ocl_dnnl_runs(d), 0);
  fresh_state(dev, d, 0);
}

/* Anything but unset, "0" or "1" is an error naming the variable; the device works on after. */
static void test_bad_value_refused(void **state) {
  (void)state;
  clpar_device *dev = tcu_need_ocl(NULL);
  const cshape s = {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};
  const char *bad[] = {"2", "", "yes", "1 ", "01", "on"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *w, *y;
    tcu_inputs(dev, &s, 5, &x, &w);
    clpar_conv2d_options opt = tcu_opt_of(&s);
    setenv("CLPAR_OCL_DNNL", bad[i], 1);
    clpar_status st = clpar_conv2d(x, w, NULL, &opt, &y);
    if (st == CLPAR_OK) st = clpar_device_synchronize(dev);
    unsetenv("CLPAR_OCL_DNNL");
    assert_int_equal(st, CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "CLPAR_OCL_DNNL"));
    clpar_scope_end(sc);
  }
  tu_conv_result r;
  tu_conv_run(dev, &cases[0], 7, &r);
  tu_conv_result_free(&r);
}

/* An Intel GPU that oneDNN takes: its results against clpar's kernels on the same device. */
static void test_intel_gpu_against_kernels(void **state) {
  (void)state;
  clpar_ocl_device *d;
  clpar_device *dev = tcu_need_ocl(&d);
  fresh_state(dev, d, 0);
  if (clpar_ocl_dnnl_why(d)) {
    print_message("no Intel GPU with oneDNN's OpenCL runtime: %s; skipping\n",
                  clpar_ocl_dnnl_why(d));
    skip();
  }
  against_unset(dev, 1e-4f);
  tu_ok(clpar_device_synchronize(dev));
  assert_int_equal(clpar_ocl_dnnl_runs(d), 2 * N_CASES); /* none fell back */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_other_devices_refuse),
      cmocka_unit_test(test_engine_refusal_keeps_kernels),
      cmocka_unit_test(test_bad_value_refused),
      cmocka_unit_test(test_intel_gpu_against_kernels),
  };
  return cmocka_run_group_tests(tests, setup, tcu_teardown);
}
