/* test_device.c — device discovery, CLPAR_DEVICES selection and ordering, and the errors of
 * an unknown device; init/shutdown pairing. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static char *saved_devices;

static int save_env(void **state) {
  (void)state;
  const char *v = getenv("CLPAR_DEVICES");
  saved_devices = v ? strdup(v) : NULL;
  return 0;
}

static int restore_env(void **state) {
  (void)state;
  if (saved_devices)
    setenv("CLPAR_DEVICES", saved_devices, 1);
  else
    unsetenv("CLPAR_DEVICES");
  free(saved_devices);
  return 0;
}

static void test_before_init(void **state) {
  (void)state;
  assert_int_equal(clpar_device_count(), 0);
  assert_null(clpar_device_get(0));
  clpar_device *d;
  assert_int_equal(clpar_device_find("host", &d), CLPAR_ERROR_NOT_INITIALIZED);
  clpar_shutdown(); /* harmless when not initialized */
}

static void test_default_list(void **state) {
  (void)state;
  unsetenv("CLPAR_DEVICES");
  tu_ok(clpar_init());
  tu_ok(clpar_init()); /* counted: needs two shutdowns */
  int n = clpar_device_count();
  assert_true(n >= 1);
  int saw_host = 0, last_gpu = -1, first_other = n;
  for (int i = 0; i < n; i++) {
    clpar_device_info in;
    tu_ok(clpar_device_get_info(clpar_device_get(i), &in));
    assert_true(strlen(in.id) > 0 && strlen(in.name) > 0 && strlen(in.backend) > 0);
    assert_true(in.global_mem_bytes > 0 && in.max_alloc_bytes > 0 && in.compute_units > 0);
    assert_int_equal(clpar_device_index(clpar_device_get(i)), i);
    clpar_device *found;
    tu_ok(clpar_device_find(in.id, &found));
    assert_ptr_equal(found, clpar_device_get(i));
    saw_host |= strcmp(in.id, "host") == 0;
    if (in.type == CLPAR_DEVICE_GPU)
      last_gpu = i;
    else if (first_other == n)
      first_other = i;
  }
  assert_true(last_gpu < first_other); /* GPUs first */
  if (n > 1) assert_false(saw_host);   /* host joins only when named or alone */
  clpar_shutdown();
  assert_true(clpar_device_count() >= 1);
  clpar_shutdown();
  assert_int_equal(clpar_device_count(), 0);
}

static void test_select_host(void **state) {
  (void)state;
  setenv("CLPAR_DEVICES", " host ", 1);
  tu_ok(clpar_init());
  assert_int_equal(clpar_device_count(), 1);
  assert_string_equal(clpar_device_id(clpar_device_get(0)), "host");
  assert_null(clpar_device_get(1));
  assert_non_null(strstr(clpar_last_error(), "1 devices"));
  clpar_shutdown();
}

static void test_select_and_order_opencl(void **state) {
  (void)state;
  unsetenv("CLPAR_DEVICES");
  tu_ok(clpar_init());
  int opencl = 0;
  for (int i = 0; i < clpar_device_count(); i++) {
    clpar_device_info in;
    tu_ok(clpar_device_get_info(clpar_device_get(i), &in));
    opencl += strcmp(in.backend, "opencl") == 0;
  }
  clpar_shutdown();
  if (opencl < 2) skip();
  setenv("CLPAR_DEVICES", "opencl:1,opencl:0,host", 1);
  tu_ok(clpar_init());
  assert_int_equal(clpar_device_count(), 3);
  assert_string_equal(clpar_device_id(clpar_device_get(0)), "opencl:1");
  assert_string_equal(clpar_device_id(clpar_device_get(1)), "opencl:0");
  assert_string_equal(clpar_device_id(clpar_device_get(2)), "host");
  clpar_shutdown();
}

static void test_unknown_device(void **state) {
  (void)state;
  setenv("CLPAR_DEVICES", "host,opencl:99", 1);
  assert_int_equal(clpar_init(), CLPAR_ERROR_DEVICE_NOT_FOUND);
  const char *msg = clpar_last_error();
  assert_non_null(strstr(msg, "opencl:99"));
  assert_non_null(strstr(msg, "the devices are: host")); /* lists what there is */
  assert_int_equal(clpar_device_count(), 0);             /* nothing half-made */
  setenv("CLPAR_DEVICES", "host,host", 1);
  assert_int_equal(clpar_init(), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "more than once"));
  setenv("CLPAR_DEVICES", ",", 1);
  assert_int_equal(clpar_init(), CLPAR_ERROR_DEVICE_NOT_FOUND);
  setenv("CLPAR_DEVICES", "host", 1);
  tu_ok(clpar_init());
  clpar_device *d = (clpar_device *)(uintptr_t)0x1;
  assert_int_equal(clpar_device_find("cuda:7", &d), CLPAR_ERROR_DEVICE_NOT_FOUND);
  assert_non_null(strstr(clpar_last_error(), "selected devices are: host"));
  assert_ptr_equal(d, (clpar_device *)(uintptr_t)0x1);
  assert_null(clpar_device_get(-1));
  assert_int_equal(clpar_device_get_info(NULL, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_shutdown();
}

/* An entry longer than the message could hold pushed the list of devices out of it. */
static void test_long_unknown_entry(void **state) {
  (void)state;
  size_t n = 10000;
  char *spec = malloc(n + 6);
  assert_non_null(spec);
  memcpy(spec, "host,", 5);
  memset(spec + 5, 'x', n);
  spec[5 + n] = '\0';
  setenv("CLPAR_DEVICES", spec, 1);
  assert_int_equal(clpar_init(), CLPAR_ERROR_DEVICE_NOT_FOUND);
  const char *msg = clpar_last_error();
  assert_non_null(strstr(msg, "xxxxxxxx...\" (10000 characters) matches no device"));
  assert_non_null(strstr(msg, "the devices are: host"));
  assert_true(strlen(msg) < 4096);
  assert_int_equal(clpar_device_count(), 0);
  free(spec);
}

/* CLPAR_DEVICE_MEMORY_LIMIT is checked: anything but a positive size makes clpar_init fail
 * and leaves nothing behind; a valid one caps every device's allocator. */
static void test_memory_limit_env(void **state) {
  (void)state;
  static const char *bad[] = {
      "abc", "0", "12X", "1.5G", "-1", "64MB", "99999999999999999999", "17179869184G"};
  setenv("CLPAR_DEVICES", "host", 1);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("CLPAR_DEVICE_MEMORY_LIMIT", bad[i], 1);
    assert_int_equal(clpar_init(), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "CLPAR_DEVICE_MEMORY_LIMIT"));
    assert_int_equal(clpar_device_count(), 0);
  }
  setenv("CLPAR_DEVICE_MEMORY_LIMIT", "4m", 1); /* 4 MiB */
  tu_ok(clpar_init());
  clpar_tensor *t = NULL;
  int64_t fits = (3 << 20) / 4, too_big = (5 << 20) / 4;
  tu_ok(clpar_tensor_zeros(clpar_device_get(0), 1, &fits, &t));
  clpar_tensor_free(t);
  t = NULL;
  assert_int_equal(clpar_tensor_zeros(clpar_device_get(0), 1, &too_big, &t),
                   CLPAR_ERROR_OUT_OF_MEMORY);
  assert_null(t);
  assert_non_null(strstr(clpar_last_error(), "CLPAR_DEVICE_MEMORY_LIMIT"));
  clpar_shutdown();
  unsetenv("CLPAR_DEVICE_MEMORY_LIMIT");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_before_init),      cmocka_unit_test(test_default_list),
      cmocka_unit_test(test_select_host),      cmocka_unit_test(test_select_and_order_opencl),
      cmocka_unit_test(test_unknown_device),   cmocka_unit_test(test_long_unknown_entry),
      cmocka_unit_test(test_memory_limit_env),
  };
  return cmocka_run_group_tests(tests, save_env, restore_env);
}
