/* test_tune.c — CLBlast GEMM tuning (clpar_device_tune_gemm, backends/opencl/ocl_tune.c): bad
 * arguments are refused and a device without CLBlast says so; a real tuning run on a small
 * grid (one candidate per kernel, two tiny shapes) writes an entry that is applied when the
 * device is opened (all six kernels' parameters, the pad and transpose kernels' included, in
 * force as written), after which GEMMs still match the host, also with other pad and
 * transpose values and every GEMM forced through the indirect path that runs them;
 * CLPAR_TUNE=off ignores it; and a corrupt, truncated, stale, out-of-range, unrunnable
 * (a zero divisor, a bad vector width, too large a work-group), linked or group-writable
 * entry is ignored with a warning, never applied, never a crash. Skips the OpenCL parts without an
 * OpenCL device. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ocl_test_util.h"
#include "test_util.h"
#include "internal.h"
#include "opencl/ocl_internal.h"
#include "opencl/ocl_tune.h"

static char cache_dir[256];

static int setup(void **state) {
  if (tu_ocl_cache_dir_make(cache_dir, sizeof cache_dir, "tune") != 0) return -1;
  unsetenv("CLPAR_TUNE");
  return tu_setup(state);
}

static int teardown(void **state) {
  int r = tu_teardown(state);
  tu_remove_dir(cache_dir);
  return r;
}

static void test_tune_arguments(void **state) {
  (void)state;
  clpar_gemm_shape ok = {16, 16, 16, 0, 0}, bad[] = {
                                                {0, 16, 16, 0, 0},
                                                {16, 16, 1 << 20, 0, 0},
                                                {16, 16, 16, 2, 0},
                                            };
  clpar_tune_result r;
  assert_int_equal(clpar_device_tune_gemm(NULL, &ok, 1, NULL, &r), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_device_tune_gemm(tu_host(), &ok, 1, NULL, &r), CLPAR_ERROR_UNSUPPORTED);
  assert_non_null(strstr(clpar_last_error(), "OpenCL"));
  clpar_device *dev = tu_ocl_device() ? tu_ocl_device() : tu_host();
  assert_int_equal(clpar_device_tune_gemm(dev, NULL, 1, NULL, &r), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_device_tune_gemm(dev, &ok, 0, NULL, &r), CLPAR_ERROR_INVALID_ARGUMENT);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    assert_int_equal(clpar_device_tune_gemm(dev, &bad[i], 1, NULL, &r),
                     CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_tune_options neg = {.candidates = -1};
  assert_int_equal(clpar_device_tune_gemm(dev, &ok, 1, &neg, &r), CLPAR_ERROR_INVALID_ARGUMENT);
  /* on a CPU device, shapes that all take clpar's own small kernel leave nothing to tune */
  clpar_device_info info;
  tu_ok(clpar_device_get_info(dev, &info));
  if (tu_ocl_device() && info.type == CLPAR_DEVICE_CPU) {
    clpar_gemm_shape small[] = {{16, 16, 16, 0, 0}, {512, 1024, 1024, 0, 1}};
    assert_int_equal(clpar_device_tune_gemm(dev, small, 2, NULL, &r), CLPAR_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(clpar_last_error(), "nothing to tune"));
  }
}

/* GEMMs on dev in all four transposes match the host's: at m n k, and (when indirect) at a
 * size CLBlast pads (so runs Pad and Padtranspose) and one it does not (Transpose). */
static void expect_gemms_match_host_at(clpar_device *dev, int64_t m, int64_t n, int64_t k) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n};
      clpar_tensor *a = tu_make(dev, 2, sa, 11 + ta), *b = tu_make(dev, 2, sb, 13 + tb);
      clpar_tensor *ha = tu_make(tu_host(), 2, sa, 11 + ta),
                   *hb = tu_make(tu_host(), 2, sb, 13 + tb);
      clpar_tensor *c = NULL, *hc = NULL;
      tu_ok(clpar_matmul(a, b, ta, tb, &c));
      tu_ok(clpar_matmul(ha, hb, ta, tb, &hc));
      tu_expect_equal(c, hc, 1e-4f, 1e-4f, "tuned GEMM vs host");
      clpar_tensor_free(a);
      clpar_tensor_free(b);
      clpar_tensor_free(ha);
      clpar_tensor_free(hb);
      clpar_tensor_free(c);
      clpar_tensor_free(hc);
    }
}

static void expect_gemms_match_host(clpar_device *dev) {
  expect_gemms_match_host_at(dev, 37, 29, 41);
  expect_gemms_match_host_at(dev, 128, 128, 128);
}

typedef struct {
  int calls, last_done, last_total;
} progress_seen;

static void on_progress(void *user, int done, int total, const char *what) {
  progress_seen *p = user;
  assert_non_null(what);
  p->calls++;
  p->last_done = done;
  p->last_total = total;
}

static int warnings;
static void count_warnings(clpar_log_level level, const char *msg, void *user) {
  (void)user;
  if (level == CLPAR_LOG_WARN && strstr(msg, "ignoring GEMM tuning entry")) warnings++;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char *buf = calloc(1, 65536);
  assert_non_null(buf);
  size_t n = fread(buf, 1, 65535, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void put(const char *path, const char *text, mode_t mode) {
  unlink(path);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(chmod(path, mode), 0);
}

/* A copy of text with kernel's name=value (the parameter must be on that kernel's line). */
static char *with_value(const char *text, const char *kernel, const char *name, const char *value) {
  char key[64];
  snprintf(key, sizeof key, "\n%s ", kernel);
  const char *line = strstr(text, key);
  assert_non_null(line);
  const char *eol = strchr(line + 1, '\n');
  assert_non_null(eol);
  snprintf(key, sizeof key, " %s=", name);
  const char *at = strstr(line, key);
  assert_true(at && at < eol);
  at += strlen(key);
  const char *rest = at + strcspn(at, " \n");
  size_t head = (size_t)(at - text);
  char *out = malloc(strlen(text) + strlen(value) + 1);
  assert_non_null(out);
  memcpy(out, text, head);
  strcpy(out + head, value);
  strcat(out, rest);
  return out;
}

/* with_value, freeing text. */
static char *set_value(char *text, const char *kernel, const char *name, const char *value) {
  char *out = with_value(text, kernel, name, value);
  free(text);
  return out;
}

/* CLBlast's parameters for kernel on d are those on kernel's line of text, all of them. */
static void expect_in_force(clpar_ocl_device *d, const char *text, const char *kernel) {
  clpar_ocl_params p;
  assert_int_equal(clpar_ocl_clblast_params(d->device, kernel, &p), 0);
  assert_true(p.n > 0);
  char key[64];
  snprintf(key, sizeof key, "\n%s ", kernel);
  const char *line = strstr(text, key);
  assert_non_null(line);
  const char *eol = strchr(line + 1, '\n');
  int on_line = 0;
  for (const char *q = strchr(line + 1, ' '); q && q < eol; q = strchr(q + 1, ' ')) on_line++;
  assert_int_equal(on_line, p.n);
  for (int i = 0; i < p.n; i++) {
    char want[64];
    snprintf(want, sizeof want, " %s=%zu", p.name[i], p.value[i]);
    const char *at = strstr(line, want);
    if (!at || at > eol || (at[strlen(want)] != ' ' && at[strlen(want)] != '\n'))
      fail_msg("%s: %s=%zu in force, not what the entry says", kernel, p.name[i], p.value[i]);
  }
}

/* Applies the entry at path as an open device would: expect what it did, and one warning
 * exactly when it was ignored. */
static void expect_apply(clpar_ocl_device *d, clpar_ocl_tune_applied want, const char *what) {
  warnings = 0;
  clpar_ocl_tune_applied got = clpar_ocl_tune_apply(d);
  if (got != want) fail_msg("%s: apply gave %d, expected %d", what, (int)got, (int)want);
  assert_int_equal(warnings, want == CLPAR_OCL_TUNE_IGNORED ? 1 : 0);
}

static void test_tune_run_and_entries(void **state) {
  (void)state;
  clpar_device *dev = tu_ocl_device();
  if (!dev) {
    print_message("no OpenCL device: skipping\n");
    skip();
  }
  clpar_ocl_device *d = dev->bd.ctx;
  clpar_gemm_shape shapes[] = {{40, 24, 33, 0, 1}, {17, 9, 40, 1, 0}};
  progress_seen seen = {0};
  clpar_tune_options opt = {.quick = 1, .candidates = 1, .progress = on_progress, .user = &seen};
  clpar_tune_result r;
  tu_ok(clpar_device_tune_gemm(dev, shapes, 2, &opt, &r));
  assert_true(r.candidates_tried >= 2); /* CLBlast's own and one more, per kernel */
  assert_true(seen.calls >= 4);
  assert_int_equal(seen.last_done, seen.last_total);
  struct stat st;
  assert_int_equal(lstat(r.path, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  assert_int_equal(st.st_mode & 0777, 0600);
  char path[4300];
  assert_int_equal(clpar_ocl_tune_path(d, path, sizeof path), 0);
  assert_string_equal(path, r.path);
  expect_gemms_match_host(dev);

  clpar_log_set_callback(count_warnings, NULL);
  char *good = slurp(path);
  assert_int_equal(strncmp(good, "clpar-tune 2\n", 13), 0);
  static const char *const kernels[] = {"Xgemm", "XgemmDirect", "GemmRoutine",
                                        "Pad",   "Transpose",   "Padtranspose"};
  static const char *const helper_params[] = {
      " PAD_DIMX=", " PAD_DIMY=",    " PAD_WPTX=",    " PAD_WPTY=",   " TRA_DIM=",   " TRA_WPT=",
      " TRA_PAD=",  " TRA_SHUFFLE=", " PADTRA_TILE=", " PADTRA_WPT=", " PADTRA_PAD="};
  for (size_t i = 0; i < sizeof helper_params / sizeof *helper_params; i++)
    assert_non_null(strstr(good, helper_params[i]));
  expect_apply(d, CLPAR_OCL_TUNE_APPLIED, "the entry just written");
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++)
    expect_in_force(d, good, kernels[i]);
  expect_gemms_match_host(dev);

  /* The pad and transpose kernels with other values, and every GEMM through the indirect
   * path that runs them: applied as written, and still right. */
  char *other = with_value(good, "GemmRoutine", "XGEMM_MIN_INDIRECT_SIZE", "1");
  other = set_value(other, "Transpose", "TRA_DIM", "4");
  other = set_value(other, "Transpose", "TRA_WPT", "8");
  other = set_value(other, "Transpose", "TRA_PAD", "1");
  other = set_value(other, "Transpose", "TRA_SHUFFLE", "0");
  other = set_value(other, "Padtranspose", "PADTRA_TILE", "8");
  other = set_value(other, "Padtranspose", "PADTRA_WPT", "2");
  other = set_value(other, "Padtranspose", "PADTRA_PAD", "1");
  other = set_value(other, "Pad", "PAD_DIMX", "8");
  other = set_value(other, "Pad", "PAD_DIMY", "8");
  other = set_value(other, "Pad", "PAD_WPTX", "4");
  other = set_value(other, "Pad", "PAD_WPTY", "2");
  put(path, other, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_APPLIED, "other pad and transpose values");
  for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++)
    expect_in_force(d, other, kernels[i]);
  expect_gemms_match_host(dev);
  free(other);
  setenv("CLPAR_TUNE", "off", 1);
  expect_apply(d, CLPAR_OCL_TUNE_OFF, "CLPAR_TUNE=off");
  unsetenv("CLPAR_TUNE");

  /* Each a copy of the good entry with one thing wrong. */
  char *bad = calloc(1, 65536);
  assert_non_null(bad);
  put(path, "garbage\n", 0600);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "garbage");
  snprintf(bad, 65536, "%s", good);
  *strstr(bad, "end\n") = '\0';
  put(path, bad, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "truncated");
  snprintf(bad, 65536, "%s", good);
  memcpy(strstr(bad, "\ndriver ") + 8, "0.0-old", 7);
  put(path, bad, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "stale driver");
  snprintf(bad, 65536, "%s", good);
  char *eq = strstr(strstr(bad, "\nXgemm "), "=");
  memcpy(eq, "=99999999", 9);
  put(path, bad, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "value out of range");
  snprintf(bad, 65536, "%s", good);
  memcpy(strstr(bad, "\nXgemmDirect ") + 1, "XgemmDiXect", 11);
  put(path, bad, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "unknown kernel");
  /* values the pad and transpose kernels cannot run with: each ignored, never applied */
  static const char *const corrupt[][3] = {
      {"Transpose", "TRA_WPT", "3"},           /* not a vector width */
      {"Transpose", "TRA_DIM", "0"},           /* a divisor */
      {"Transpose", "TRA_SHUFFLE", "2"},       /* a flag */
      {"Transpose", "TRA_DIM", "99999999"},    /* out of range */
      {"Padtranspose", "PADTRA_TILE", "4096"}, /* a work-group of 16M */
      {"Padtranspose", "PADTRA_WPT", "0"},
      {"Padtranspose", "PADTRA_WPT", "x"},
      {"Pad", "PAD_WPTX", "0"},
      {"Pad", "PAD_DIMY", "-8"},
  };
  for (size_t i = 0; i < sizeof corrupt / sizeof *corrupt; i++) {
    char *c = with_value(good, corrupt[i][0], corrupt[i][1], corrupt[i][2]);
    put(path, c, 0600);
    char what[128];
    snprintf(what, sizeof what, "%s %s=%s", corrupt[i][0], corrupt[i][1], corrupt[i][2]);
    expect_apply(d, CLPAR_OCL_TUNE_IGNORED, what);
    free(c);
  }
  snprintf(bad, 65536, "%s", good);
  *strstr(bad, "\nPadtranspose ") = '\0'; /* and end gone with it */
  strcat(bad, "\nend\n");
  put(path, bad, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "no Padtranspose line");
  snprintf(bad, 65536, "%s", good);
  memcpy(strstr(bad, "\nPad ") + 1, "Pxd", 3);
  put(path, bad, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "unknown kernel Pxd");
  snprintf(bad, 65536, "%s", good);
  memcpy(bad, "clpar-tune 1", 12);
  put(path, bad, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "the previous format");
  put(path, good, 0620);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "group-writable");
  char target[4400];
  snprintf(target, sizeof target, "%s.real", path);
  put(target, good, 0600);
  unlink(path);
  assert_int_equal(symlink(target, path), 0);
  expect_apply(d, CLPAR_OCL_TUNE_IGNORED, "symbolic link");
  unlink(path);
  unlink(target);
  expect_apply(d, CLPAR_OCL_TUNE_NONE, "no entry");
  expect_gemms_match_host(dev);
  put(path, good, 0600);
  expect_apply(d, CLPAR_OCL_TUNE_APPLIED, "the good entry again");
  clpar_log_set_callback(NULL, NULL);
  free(bad);
  free(good);
}

/* A cache directory that cannot be used fails the tuning with the reason in the message
 * (the reason was formatted into the buffer it was read from, and lost, before). */
static void test_tune_unusable_cache_dir(void **state) {
  (void)state;
  clpar_device *dev = tu_ocl_device();
  if (!dev) {
    print_message("no OpenCL device: skipping\n");
    skip();
  }
  char file[300];
  snprintf(file, sizeof file, "%s/not-a-directory", cache_dir);
  put(file, "x", 0600);
  setenv("CLPAR_CACHE_DIR", file, 1);
  clpar_gemm_shape shape = {17, 9, 40, 1, 0};
  clpar_tune_options opt = {.quick = 1, .candidates = 1};
  clpar_tune_result r;
  clpar_status s = clpar_device_tune_gemm(dev, &shape, 1, &opt, &r);
  setenv("CLPAR_CACHE_DIR", cache_dir, 1);
  assert_int_equal(s, CLPAR_ERROR_IO);
  const char *msg = clpar_last_error();
  if (!strstr(msg, "no usable cache directory") || !strstr(msg, file))
    fail_msg("the message does not name the directory's fault: %s", msg);
  unlink(file);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tune_arguments),
      cmocka_unit_test(test_tune_run_and_entries),
      cmocka_unit_test(test_tune_unusable_cache_dir),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
