/* test_io_limits.c — the data readers and the loader against hostile input: paths that are not
 * regular files (a FIFO nobody writes, a link to a character device) refused before they are
 * read, CSV fields of only blanks refused like empty ones, text from a file escaped in messages,
 * the loader's sizes checked without overflow, and a gzip-compressed CSV (one stream or several
 * concatenated) refused past the cap on its decompressed text, naming the cap. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "test_util.h"

static char dir[64];

static void path_in(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", dir, name);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  assert_int_equal(fclose(f), 0);
}

/* ---- paths that are not regular files ---- */

/* Opens the FIFO for writing and closes it (so a reader blocked on it sees end of file) unless
 * the test finishes first: a reader that waits on the FIFO fails the test instead of hanging. */
typedef struct {
  const char *fifo;
  int done;
  int unblocked;
  pthread_mutex_t mu;
} unblocker;

static void *unblock(void *arg) {
  unblocker *u = arg;
  for (int i = 0; i < 300; i++) { /* 3 s */
    pthread_mutex_lock(&u->mu);
    int done = u->done;
    pthread_mutex_unlock(&u->mu);
    if (done) return NULL;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  for (int i = 0; i < 100; i++) {
    int fd = open(u->fifo, O_WRONLY | O_NONBLOCK);
    if (fd >= 0) {
      close(fd);
      u->unblocked = 1;
      return NULL;
    }
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  return NULL;
}

static clpar_status read_fifo(const char *fifo, int csv) {
  unblocker u = {fifo, 0, 0, PTHREAD_MUTEX_INITIALIZER};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, unblock, &u), 0);
  clpar_npy_array a;
  clpar_dataset *ds = NULL;
  clpar_status s = csv ? clpar_dataset_from_csv(fifo, -1, 0, &ds) : clpar_npy_read(fifo, &a);
  pthread_mutex_lock(&u.mu);
  u.done = 1;
  pthread_mutex_unlock(&u.mu);
  pthread_join(t, NULL);
  if (u.unblocked) fail_msg("the reader of %s waited on the FIFO until it was written", fifo);
  clpar_dataset_free(ds);
  return s;
}

static void test_fifo_refused_before_open(void **state) {
  (void)state;
  char fifo[128];
  path_in(fifo, sizeof fifo, "fifo");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  for (int csv = 0; csv < 2; csv++) {
    assert_int_equal(read_fifo(fifo, csv), CLPAR_ERROR_IO);
    assert_non_null(strstr(clpar_last_error(), "a FIFO, not a regular file"));
    assert_non_null(strstr(clpar_last_error(), fifo));
  }
  clpar_dataset *ds;
  assert_int_equal(clpar_dataset_from_npy(fifo, NULL, &ds), CLPAR_ERROR_IO);
  unlink(fifo);
}

static void test_link_to_device_refused(void **state) {
  (void)state;
  char link[128];
  path_in(link, sizeof link, "dev.csv");
  /* /dev/null first: the old reader took it as an empty file; /dev/zero never ends */
  const char *devs[2] = {"/dev/null", "/dev/zero"};
  for (int i = 0; i < 2; i++) {
    unlink(link);
    assert_int_equal(symlink(devs[i], link), 0);
    clpar_dataset *ds = NULL;
    clpar_npy_array a;
    assert_int_equal(clpar_dataset_from_csv(link, -1, 0, &ds), CLPAR_ERROR_IO);
    assert_non_null(strstr(clpar_last_error(), "a character device, not a regular file"));
    assert_int_equal(clpar_npy_read(link, &a), CLPAR_ERROR_IO);
    assert_non_null(strstr(clpar_last_error(), "a character device, not a regular file"));
  }
  unlink(link);
}

/* ---- CSV fields ---- */

static void test_csv_blank_field_refused(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "blank.csv");
  const char *cases[][2] = {
      {"1,2,0\n1, ,0\n", "line 2, column 2: ' ' is not a number"},
      {"1,2,0\n1,\t ,0\n", "line 2, column 2: '\\x09 ' is not a number"},
      {"1,2,0\n1,,0\n", "line 2, column 2: '' is not a number"},
      {"1,2,0\n1,2,  \n", "line 2, column 3: label '  ' is not an int32"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_text(p, cases[i][0]);
    clpar_dataset *ds = NULL;
    clpar_status s = clpar_dataset_from_csv(p, -1, 0, &ds);
    clpar_dataset_free(ds);
    if (s != CLPAR_ERROR_CORRUPT)
      fail_msg("case %zu: %s (%s)", i, clpar_status_name(s), s ? clpar_last_error() : "");
    if (!strstr(clpar_last_error(), cases[i][1]))
      fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, clpar_last_error(), cases[i][1]);
  }
}

/* A .npy whose dtype string holds an escape character: shown escaped in the message. */
static void test_npy_dtype_escaped(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "esc.npy");
  char h[128] = "\x93NUMPY\x01\x00";
  const char *dict = "{'descr': '<\x1b[2J', 'fortran_order': False, 'shape': (1,), }";
  size_t len = strlen(dict), padded = (10 + len + 1 + 63) / 64 * 64 - 10;
  h[8] = (char)padded;
  h[9] = 0;
  memcpy(h + 10, dict, len);
  memset(h + 10 + len, ' ', padded - len - 1);
  h[10 + padded - 1] = '\n';
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(h, 1, 10 + padded, f), 10 + padded);
  assert_int_equal(fclose(f), 0);
  clpar_npy_array a;
  assert_int_equal(clpar_npy_read(p, &a), CLPAR_ERROR_CORRUPT);
  assert_non_null(strstr(clpar_last_error(), "dtype '<\\x1b[2J'"));
}

/* ---- the loader's sizes ---- */

static void test_loader_huge_batch_size(void **state) {
  (void)state;
  float x[5] = {0, 1, 2, 3, 4};
  clpar_dataset *ds;
  tu_ok(clpar_dataset_from_arrays(5, 1, (int64_t[]){1}, x, NULL, &ds));
  clpar_loader *l = NULL;
  clpar_loader_options o = {.batch_size = INT64_MAX};
  /* as PyTorch's DataLoader: one batch of every row */
  clpar_status s = clpar_loader_create(ds, tu_host(), &o, &l);
  if (s != CLPAR_OK) fail_msg("batch_size INT64_MAX: %s", clpar_last_error());
  assert_int_equal(clpar_loader_batches(l), 1);
  clpar_tensor *t;
  int64_t rows;
  tu_ok(clpar_loader_next(l, &t, NULL, &rows));
  assert_int_equal(rows, 5);
  clpar_tensor_free(t);
  clpar_loader_free(l);
  o.drop_last = 1;
  assert_int_equal(clpar_loader_create(ds, tu_host(), &o, &l), CLPAR_ERROR_EMPTY);
  assert_non_null(strstr(clpar_last_error(), "batch_size 9223372036854775807"));
  assert_non_null(strstr(clpar_last_error(), "drop_last"));
  o.batch_size = INT64_MIN;
  o.drop_last = 0;
  assert_int_equal(clpar_loader_create(ds, tu_host(), &o, &l), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "batch_size"));
  assert_null(strstr(clpar_last_error(), "drop_last"));
  clpar_dataset_free(ds);
}

/* ---- the cap on a CSV's text ---- */

/* n bytes of "1,2,0\n" lines, compressed as parts concatenated gzip streams into path. */
static void write_gz_streams(const char *path, size_t n, int parts) {
  char *text = malloc(n);
  for (size_t i = 0; i < n; i++) text[i] = "1,2,0\n"[i % 6];
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  for (int k = 0; k < parts; k++) {
    size_t from = n / (size_t)parts * (size_t)k, to = k + 1 == parts ? n : from + n / (size_t)parts;
    uLongf cap = compressBound((uLong)(to - from)) + 64;
    unsigned char *z = malloc(cap);
    z_stream zs = {0};
    assert_int_equal(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
    zs.next_in = (unsigned char *)text + from;
    zs.avail_in = (uInt)(to - from);
    zs.next_out = z;
    zs.avail_out = (uInt)cap;
    assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
    assert_int_equal(fwrite(z, 1, zs.total_out, f), zs.total_out);
    deflateEnd(&zs);
    free(z);
  }
  assert_int_equal(fclose(f), 0);
  free(text);
}

static void test_csv_gz_text_cap(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "bomb.csv.gz");
  const size_t n = 6 << 20; /* 6 MiB of text, a few KiB compressed */
  clpar_csv_options o = {.max_text_bytes = 4 << 20};
  for (int parts = 1; parts <= 3; parts += 2) {
    write_gz_streams(p, n, parts);
    clpar_dataset *ds = NULL;
    assert_int_equal(clpar_dataset_from_csv_opts(p, -1, 0, &o, &ds), CLPAR_ERROR_TOO_LARGE);
    assert_non_null(strstr(clpar_last_error(), "4194304"));
    assert_non_null(strstr(clpar_last_error(), "max_text_bytes"));
    o.max_text_bytes = n; /* exactly the text: read whole, every stream */
    tu_ok(clpar_dataset_from_csv_opts(p, -1, 0, &o, &ds));
    assert_int_equal(clpar_dataset_size(ds), (int64_t)(n / 6));
    clpar_dataset_free(ds);
    o.max_text_bytes = 4 << 20;
  }
  /* the default cap is far above this file, and a negative cap is an argument error */
  clpar_dataset *ds = NULL;
  tu_ok(clpar_dataset_from_csv_opts(p, -1, 0, NULL, &ds));
  clpar_dataset_free(ds);
  o.max_text_bytes = -1;
  assert_int_equal(clpar_dataset_from_csv_opts(p, -1, 0, &o, &ds), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "max_text_bytes"));
}

static int make_dir(void **state) {
  snprintf(dir, sizeof dir, "/tmp/clpar-iolim-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  return tu_setup(state);
}

static int remove_dir(void **state) {
  tu_remove_dir(dir);
  return tu_teardown(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fifo_refused_before_open),
      cmocka_unit_test(test_link_to_device_refused),
      cmocka_unit_test(test_csv_blank_field_refused),
      cmocka_unit_test(test_npy_dtype_escaped),
      cmocka_unit_test(test_loader_huge_batch_size),
      cmocka_unit_test(test_csv_gz_text_cap),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
