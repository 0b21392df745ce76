/* test_opencl_cache.c — the kernel cache trusts only what no other user can have planted
 * (src/runtime/trusted_file.c, used by backends/opencl/ocl_program.c).
 *
 * First the trusted-file API on its own: a missing directory is created 0700; a directory
 * that is group- or world-writable, a symbolic link, a regular file or another user's is
 * refused with a message that says which; an entry that is a FIFO (without blocking), a
 * symbolic link, writable by others, another user's or too large is refused; a write
 * replaces a link at its path and leaves no temporary file. Then the OpenCL program cache on
 * a device: a forged entry (a valid entry whose binary computes something else) is loaded
 * from a trusted directory, which shows that it is well formed, and not from a group-writable
 * one; a FIFO at an entry's path does not hang the build; a symbolic link at an entry's path
 * is not followed; a cache path that is a regular file is reported as such. Tests of another
 * user's files need root (chown) and skip otherwise; the device tests skip without OpenCL. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "internal.h"
#include "ocl_test_util.h"
#include "opencl/ocl_internal.h"

#define OTHER_UID 65534 /* nobody */

static char base[256];      /* a fresh directory per test, removed afterwards */
static char saved_env[512]; /* CLPAR_CACHE_DIR as the group set-up left it */

/* ---- helpers ---- */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static int test_setup(void **state) {
  (void)state;
  snprintf(base, sizeof base, "/tmp/clpar-test-trust-XXXXXX");
  if (!mkdtemp(base)) return -1;
  const char *e = getenv("CLPAR_CACHE_DIR");
  snprintf(saved_env, sizeof saved_env, "%s", e ? e : "");
  return 0;
}

static int test_teardown(void **state) {
  (void)state;
  chmod(base, 0700);
  nftw(base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  if (saved_env[0])
    setenv("CLPAR_CACHE_DIR", saved_env, 1);
  else
    unsetenv("CLPAR_CACHE_DIR");
  return 0;
}

static void path_in(char *out, size_t size, const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  assert_true(a + 1 + b < size);
  memcpy(out, dir, a);
  out[a] = '/';
  memcpy(out + a + 1, name, b + 1);
}

static void write_file(const char *path, const void *data, size_t n, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, data, n), (ssize_t)n);
  assert_int_equal(fchmod(fd, mode), 0); /* not subject to the umask */
  close(fd);
}

/* The whole file, malloc'ed, its size in *n. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc(size > 0 ? (size_t)size : 1);
  assert_non_null(p);
  assert_int_equal(fread(p, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  *n = (size_t)size;
  return p;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

/* Warnings logged while capturing, and the last one. */
static int warnings;
static char last_warning[1024];

static void capture(clpar_log_level level, const char *msg, void *user) {
  (void)user;
  if (level != CLPAR_LOG_WARN) return;
  warnings++;
  snprintf(last_warning, sizeof last_warning, "%s", msg);
}

static void capture_start(void) {
  warnings = 0;
  last_warning[0] = '\0';
  clpar_log_set_level(CLPAR_LOG_WARN);
  clpar_log_set_callback(capture, NULL);
}

static void capture_stop(void) {
  clpar_log_set_callback(NULL, NULL);
}

static void expect_error(clpar_status s, clpar_status want, const char *needle) {
  assert_int_equal(s, want);
  if (!strstr(clpar_last_error(), needle))
    fail_msg("the message \"%s\" does not say \"%s\"", clpar_last_error(), needle);
  if (strstr(clpar_last_error(), "Permission denied"))
    fail_msg("the message \"%s\" says Permission denied", clpar_last_error());
}

/* ---- the trusted-file API ---- */

static void test_missing_dir_created_private(void **state) {
  (void)state;
  char path[512], parent[512];
  snprintf(parent, sizeof parent, "%s/a", base);
  snprintf(path, sizeof path, "%s/a/b/cache", base);
  int fd = -1;
  tu_ok(clpar_trusted_dir_open(path, &fd));
  assert_true(fd >= 0);
  close(fd);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0700);
  assert_int_equal(stat(parent, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0700);
  tu_ok(clpar_trusted_dir_open(path, &fd)); /* and it is trusted once it exists */
  close(fd);
}

static void test_untrusted_dirs_refused(void **state) {
  (void)state;
  char dir[512], file[512], link[512];
  int fd = -1;
  path_in(dir, sizeof dir, base, "shared");
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_int_equal(chmod(dir, 0770), 0);
  expect_error(clpar_trusted_dir_open(dir, &fd), CLPAR_ERROR_IO, "writable by group or others");
  assert_non_null(strstr(clpar_last_error(), "0770"));
  assert_int_equal(chmod(dir, 01777), 0); /* like /tmp: sticky, still writable by all */
  expect_error(clpar_trusted_dir_open(dir, &fd), CLPAR_ERROR_IO, "writable by group or others");
  assert_int_equal(chmod(dir, 0700), 0);
  tu_ok(clpar_trusted_dir_open(dir, &fd));
  close(fd);

  path_in(link, sizeof link, base, "link");
  assert_int_equal(symlink(dir, link), 0);
  expect_error(clpar_trusted_dir_open(link, &fd), CLPAR_ERROR_IO, "symbolic link");

  path_in(file, sizeof file, base, "plain");
  write_file(file, "x", 1, 0600);
  fd = -1;
  expect_error(clpar_trusted_dir_open(file, &fd), CLPAR_ERROR_IO,
               "is a regular file, not a directory");
  assert_int_equal(fd, -1); /* untouched on error */
}

static void test_cache_path_regular_file_message(void **state) {
  (void)state;
  char file[512], dir[64];
  path_in(file, sizeof file, base, "not-a-dir");
  write_file(file, "x", 1, 0600);
  setenv("CLPAR_CACHE_DIR", file, 1);
  capture_start();
  int fd = -1;
  expect_error(clpar_cache_dir_open(dir, sizeof dir, &fd), CLPAR_ERROR_IO,
               "is a regular file, not a directory");
  capture_stop();
  assert_int_equal(warnings, 1); /* and the user hears of it */
  assert_non_null(strstr(last_warning, "is a regular file, not a directory"));
  assert_non_null(strstr(last_warning, "without the disk cache"));
}

static void test_other_users_dir_refused(void **state) {
  (void)state;
  if (geteuid() != 0) {
    print_message("not root: cannot give a directory to another user; skipping\n");
    skip();
  }
  char dir[512];
  int fd = -1;
  path_in(dir, sizeof dir, base, "theirs");
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_int_equal(chown(dir, OTHER_UID, OTHER_UID), 0);
  expect_error(clpar_trusted_dir_open(dir, &fd), CLPAR_ERROR_IO, "owned by uid 65534");
}

static void test_entry_reads(void **state) {
  (void)state;
  int dirfd = -1;
  tu_ok(clpar_trusted_dir_open(base, &dirfd));
  void *data = (void *)1;
  size_t n = 7;
  char path[512], elsewhere[512];

  tu_ok(clpar_trusted_file_read(dirfd, "missing", 100, &data, &n)); /* absent: no entry */
  assert_null(data);
  assert_int_equal(n, 0);

  path_in(path, sizeof path, base, "good");
  write_file(path, "0123456789", 10, 0600);
  tu_ok(clpar_trusted_file_read(dirfd, "good", 10, &data, &n));
  assert_int_equal(n, 10);
  assert_memory_equal(data, "0123456789", 10);
  free(data);
  expect_error(clpar_trusted_file_read(dirfd, "good", 9, &data, &n), CLPAR_ERROR_IO,
               "more than the 9 allowed");
  assert_null(data);

  path_in(path, sizeof path, base, "shared");
  write_file(path, "0123456789", 10, 0620);
  expect_error(clpar_trusted_file_read(dirfd, "shared", 100, &data, &n), CLPAR_ERROR_IO,
               "writable by group or others");
  path_in(path, sizeof path, base, "world");
  write_file(path, "0123456789", 10, 0602);
  expect_error(clpar_trusted_file_read(dirfd, "world", 100, &data, &n), CLPAR_ERROR_IO,
               "writable by group or others");

  /* A link to a good file is still refused: whoever made the link chose what it reads. */
  path_in(elsewhere, sizeof elsewhere, base, "good");
  path_in(path, sizeof path, base, "link");
  assert_int_equal(symlink(elsewhere, path), 0);
  expect_error(clpar_trusted_file_read(dirfd, "link", 100, &data, &n), CLPAR_ERROR_IO,
               "symbolic link");

  path_in(path, sizeof path, base, "fifo");
  assert_int_equal(mkfifo(path, 0600), 0);
  alarm(60); /* opening a FIFO without O_NONBLOCK waits for a writer forever */
  clpar_status s = clpar_trusted_file_read(dirfd, "fifo", 100, &data, &n);
  alarm(0);
  expect_error(s, CLPAR_ERROR_IO, "is a FIFO, not a regular file");

  path_in(path, sizeof path, base, "subdir");
  assert_int_equal(mkdir(path, 0700), 0);
  expect_error(clpar_trusted_file_read(dirfd, "subdir", 100, &data, &n), CLPAR_ERROR_IO,
               "is a directory, not a regular file");
  expect_error(clpar_trusted_file_read(dirfd, "../good", 100, &data, &n),
               CLPAR_ERROR_INVALID_ARGUMENT, "not a file name");

  if (geteuid() == 0) {
    path_in(path, sizeof path, base, "theirs");
    write_file(path, "0123456789", 10, 0600);
    assert_int_equal(chown(path, OTHER_UID, OTHER_UID), 0);
    expect_error(clpar_trusted_file_read(dirfd, "theirs", 100, &data, &n), CLPAR_ERROR_IO,
                 "owned by uid 65534");
  }
  assert_null(data);
  close(dirfd);
}

static void test_entry_write_replaces_atomically(void **state) {
  (void)state;
  char dir[512], outside[512], path[512];
  path_in(dir, sizeof dir, base, "cache");
  path_in(outside, sizeof outside, base, "victim");
  write_file(outside, "keep me", 7, 0600);
  int dirfd = -1;
  tu_ok(clpar_trusted_dir_open(dir, &dirfd));
  path_in(path, sizeof path, dir, "entry");
  assert_int_equal(symlink(outside, path), 0); /* a link planted at the entry's path */
  tu_ok(clpar_trusted_file_write(dirfd, "entry", "new contents", 12));
  struct stat st;
  assert_int_equal(lstat(path, &st), 0);
  assert_true(S_ISREG(st.st_mode)); /* the link was replaced, not written through */
  assert_int_equal(st.st_mode & 07777, 0600);
  size_t n;
  unsigned char *p = slurp(outside, &n);
  assert_int_equal(n, 7);
  assert_memory_equal(p, "keep me", 7);
  free(p);
  void *data;
  tu_ok(clpar_trusted_file_read(dirfd, "entry", 100, &data, &n));
  assert_int_equal(n, 12);
  assert_memory_equal(data, "new contents", 12);
  free(data);
  tu_ok(clpar_trusted_file_write(dirfd, "entry", "", 0)); /* replaced again, even empty */
  assert_int_equal(count_entries(dir), 1);                /* no temporary file left behind */
  close(dirfd);
}

/* ---- the OpenCL program cache ---- */

static void cache_file(clpar_ocl_device *d, const char *src, char *path, size_t size) {
  tu_ok(clpar_ocl_cache_file(d, src, strlen(src), CLPAR_OCL_BUILD_OPTIONS, path, size));
}

/* An entry made as an attacker would: the genuine header of the victim's key with the size,
 * checksum and binary of another program (x*5+7 instead of x*3-1). Every check but trust
 * passes; the first half of the test shows it, by running it from a trusted directory. */
static void test_planted_entry_not_loaded(void **state) {
  (void)state;
  NEED_DEVICE(d);
  char dir[512], victim[512], other[512], vpath[1024], opath[1024], spare[512], spath[1024];
  path_in(dir, sizeof dir, base, "cache");
  setenv("CLPAR_CACHE_DIR", dir, 1);
  tu_ocl_twice_plus_source(victim, sizeof victim, "planted victim", 3.0f, -1.0f);
  tu_ocl_twice_plus_source(other, sizeof other, "planted payload", 5.0f, 7.0f);
  (void)tu_ocl_get(d, "victim", victim);
  (void)tu_ocl_get(d, "payload", other);
  cache_file(d, victim, vpath, sizeof vpath);
  cache_file(d, other, opath, sizeof opath);
  size_t vn, on;
  unsigned char *v = slurp(vpath, &vn), *o = slurp(opath, &on);
  assert_true(vn > 88 && on > 88);
  memcpy(o, v, 48); /* magic, format, header size and the victim's key */
  write_file(vpath, o, on, 0600);
  free(v);

  clpar_ocl_program_cache_clear(d);
  clpar_ocl_program_stats s0 = tu_ocl_stats();
  tu_ocl_check_twice_plus(d, tu_ocl_get(d, "victim", victim), 5.0f,
                          7.0f); /* trusted directory: the entry runs */
  assert_int_equal(tu_ocl_stats().disk_loads, s0.disk_loads + 1);

  assert_int_equal(chmod(dir, 0770), 0); /* now anyone in the group could have planted it */
  clpar_ocl_program_cache_clear(d);
  capture_start();
  clpar_ocl_program_stats s1 = tu_ocl_stats();
  cl_program p = tu_ocl_get(d, "victim", victim);
  tu_ocl_twice_plus_source(spare, sizeof spare, "planted spare", 2.0f, 2.0f);
  (void)tu_ocl_get(d, "spare", spare);
  capture_stop();
  clpar_ocl_program_stats s2 = tu_ocl_stats();
  tu_ocl_check_twice_plus(d, p, 3.0f, -1.0f); /* compiled from source, not the planted binary */
  assert_int_equal(s2.disk_loads, s1.disk_loads);
  assert_int_equal(s2.source_builds, s1.source_builds + 2);
  assert_int_equal(warnings, 1); /* once, not per program */
  assert_non_null(strstr(last_warning, dir));
  assert_non_null(strstr(last_warning, "writable by group or others"));
  size_t now_n; /* nothing written into a directory that is not trusted */
  unsigned char *now = slurp(vpath, &now_n);
  assert_int_equal(now_n, on);
  assert_memory_equal(now, o, on);
  free(now);
  free(o);
  assert_int_equal(chmod(dir, 0700), 0);
  cache_file(d, spare, spath, sizeof spath);
  assert_int_equal(access(spath, F_OK), -1);
}

static void test_fifo_at_entry_path(void **state) {
  (void)state;
  NEED_DEVICE(d);
  char dir[512], src[512], path[1024];
  path_in(dir, sizeof dir, base, "cache");
  setenv("CLPAR_CACHE_DIR", dir, 1);
  tu_ocl_twice_plus_source(src, sizeof src, "fifo", 4.0f, 1.0f);
  cache_file(d, src, path, sizeof path); /* creates the directory */
  assert_int_equal(mkfifo(path, 0600), 0);
  clpar_ocl_program_stats s0 = tu_ocl_stats();
  capture_start();
  alarm(120); /* before the fix the build blocked forever opening the FIFO */
  cl_program p = tu_ocl_get(d, "fifo", src);
  alarm(0);
  capture_stop();
  tu_ocl_check_twice_plus(d, p, 4.0f, 1.0f);
  clpar_ocl_program_stats s1 = tu_ocl_stats();
  assert_int_equal(s1.source_builds, s0.source_builds + 1);
  assert_int_equal(s1.disk_rejects, s0.disk_rejects + 1);
  assert_true(warnings >= 1);
  assert_non_null(strstr(last_warning, "FIFO"));
  struct stat st; /* replaced by a good entry, which the next process loads */
  assert_int_equal(lstat(path, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  clpar_ocl_program_cache_clear(d);
  tu_ocl_check_twice_plus(d, tu_ocl_get(d, "fifo", src), 4.0f, 1.0f);
  assert_int_equal(tu_ocl_stats().disk_loads, s1.disk_loads + 1);
}

static void test_symlink_at_entry_path(void **state) {
  (void)state;
  NEED_DEVICE(d);
  char dir[512], src[512], path[1024], target[512];
  path_in(dir, sizeof dir, base, "cache");
  path_in(target, sizeof target, base, "elsewhere.clbin");
  setenv("CLPAR_CACHE_DIR", dir, 1);
  tu_ocl_twice_plus_source(src, sizeof src, "symlink", 6.0f, 0.0f);
  (void)tu_ocl_get(d, "symlink", src);
  cache_file(d, src, path, sizeof path);
  /* The genuine entry moves out, and a link to it takes its place: a valid entry, reached by
   * a link that whoever can write there could point anywhere. */
  assert_int_equal(rename(path, target), 0);
  assert_int_equal(symlink(target, path), 0);
  size_t n0;
  unsigned char *before = slurp(target, &n0);
  clpar_ocl_program_cache_clear(d);
  clpar_ocl_program_stats s0 = tu_ocl_stats();
  capture_start();
  cl_program p = tu_ocl_get(d, "symlink", src);
  capture_stop();
  clpar_ocl_program_stats s1 = tu_ocl_stats();
  tu_ocl_check_twice_plus(d, p, 6.0f, 0.0f);
  assert_int_equal(s1.disk_loads, s0.disk_loads); /* not followed */
  assert_int_equal(s1.source_builds, s0.source_builds + 1);
  assert_int_equal(s1.disk_rejects, s0.disk_rejects + 1);
  assert_non_null(strstr(last_warning, "symbolic link"));
  struct stat st;
  assert_int_equal(lstat(path, &st), 0);
  assert_true(S_ISREG(st.st_mode)); /* the link is replaced, its target left as it was */
  size_t n1;
  unsigned char *after = slurp(target, &n1);
  assert_int_equal(n1, n0);
  assert_memory_equal(after, before, n0);
  free(before);
  free(after);
}

static void test_other_users_entry_not_loaded(void **state) {
  (void)state;
  NEED_DEVICE(d);
  if (geteuid() != 0) {
    print_message("not root: cannot give a file to another user; skipping\n");
    skip();
  }
  char dir[512], src[512], path[1024];
  path_in(dir, sizeof dir, base, "cache");
  setenv("CLPAR_CACHE_DIR", dir, 1);
  tu_ocl_twice_plus_source(src, sizeof src, "chowned", 1.0f, 9.0f);
  (void)tu_ocl_get(d, "chowned", src);
  cache_file(d, src, path, sizeof path);
  assert_int_equal(chown(path, OTHER_UID, OTHER_UID), 0);
  clpar_ocl_program_cache_clear(d);
  clpar_ocl_program_stats s0 = tu_ocl_stats();
  capture_start();
  cl_program p = tu_ocl_get(d, "chowned", src);
  capture_stop();
  tu_ocl_check_twice_plus(d, p, 1.0f, 9.0f);
  assert_int_equal(tu_ocl_stats().disk_loads, s0.disk_loads);
  assert_non_null(strstr(last_warning, "owned by uid 65534"));
}

static void test_cache_path_is_regular_file(void **state) {
  (void)state;
  NEED_DEVICE(d);
  char file[512], src[512], path[1024];
  path_in(file, sizeof file, base, "cache-is-a-file");
  write_file(file, "not a directory", 15, 0600);
  setenv("CLPAR_CACHE_DIR", file, 1);
  tu_ocl_twice_plus_source(src, sizeof src, "regular file", 2.0f, 3.0f);
  clpar_ocl_program_stats s0 = tu_ocl_stats();
  capture_start();
  cl_program p = tu_ocl_get(d, "regular_file", src); /* still works, compiled */
  capture_stop();
  tu_ocl_check_twice_plus(d, p, 2.0f, 3.0f);
  assert_int_equal(tu_ocl_stats().source_builds, s0.source_builds + 1);
  assert_int_equal(warnings, 1);
  assert_non_null(strstr(last_warning, "is a regular file, not a directory"));
  assert_null(strstr(last_warning, "Permission denied"));
  expect_error(
      clpar_ocl_cache_file(d, src, strlen(src), CLPAR_OCL_BUILD_OPTIONS, path, sizeof path),
      CLPAR_ERROR_IO, "is a regular file, not a directory");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_missing_dir_created_private, test_setup, test_teardown),
      cmocka_unit_test_setup_teardown(test_untrusted_dirs_refused, test_setup, test_teardown),
      cmocka_unit_test_setup_teardown(test_cache_path_regular_file_message, test_setup,
                                      test_teardown),
      cmocka_unit_test_setup_teardown(test_other_users_dir_refused, test_setup, test_teardown),
      cmocka_unit_test_setup_teardown(test_entry_reads, test_setup, test_teardown),
      cmocka_unit_test_setup_teardown(test_entry_write_replaces_atomically, test_setup,
                                      test_teardown),
      cmocka_unit_test_setup_teardown(test_planted_entry_not_loaded, test_setup, test_teardown),
      cmocka_unit_test_setup_teardown(test_fifo_at_entry_path, test_setup, test_teardown),
      cmocka_unit_test_setup_teardown(test_symlink_at_entry_path, test_setup, test_teardown),
      cmocka_unit_test_setup_teardown(test_other_users_entry_not_loaded, test_setup, test_teardown),
      cmocka_unit_test_setup_teardown(test_cache_path_is_regular_file, test_setup, test_teardown),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
