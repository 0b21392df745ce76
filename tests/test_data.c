/* test_data.c — datasets and the batch loader: every epoch is a permutation reproducible by
 * its seed, drop_last and the last partial batch, resuming at an epoch, and batches whose
 * values equal the source rows on every selected device; .npy files written here by hand to
 * the NumPy format spec and by numpy itself (tests/reference/make_npy.py), every corrupt-file
 * case; CSV plain and gzip-compressed, with errors naming the line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "test_util.h"

static char dir[64];

static void path_in(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", dir, name);
}

/* Sample i of the test datasets: feature k is i * 100 + k, the label is i. */
static clpar_dataset *make_ds(int64_t n, int64_t rows, int64_t cols) {
  float *x = malloc((size_t)(n * rows * cols) * sizeof *x);
  int32_t *y = malloc((size_t)n * sizeof *y);
  for (int64_t i = 0; i < n; i++) {
    y[i] = (int32_t)i;
    for (int64_t k = 0; k < rows * cols; k++) x[i * rows * cols + k] = (float)(i * 100 + k);
  }
  clpar_dataset *ds;
  tu_ok(clpar_dataset_from_arrays(n, 2, (int64_t[]){rows, cols}, x, y, &ds));
  free(x);
  free(y);
  return ds;
}

/* Runs one epoch of l on dev, checking every batch against the dataset and the loader's
 * order, and writes the visited indices to seen (n of them). Returns the batch count. */
static int64_t run_epoch(clpar_loader *l, const clpar_dataset *ds, int64_t bs, int drop_last,
                         int64_t *seen) {
  int64_t n = clpar_dataset_size(ds), row = 1, epoch = clpar_loader_epoch(l), got = 0, b = 0;
  for (int i = 0; i < clpar_dataset_sample_ndim(ds); i++) row *= clpar_dataset_sample_dim(ds, i);
  int64_t *order = malloc((size_t)n * sizeof *order);
  tu_ok(clpar_loader_order(l, epoch, order));
  for (;; b++) {
    clpar_tensor *x;
    const int32_t *y;
    int64_t rows;
    tu_ok(clpar_loader_next(l, &x, &y, &rows));
    if (!x) {
      assert_null(y);
      assert_int_equal(rows, 0);
      break;
    }
    int64_t want = n - got < bs ? n - got : bs;
    assert_int_equal(rows, want);
    assert_int_equal(clpar_tensor_dim(x, 0), rows);
    assert_int_equal(clpar_tensor_ndim(x), 1 + clpar_dataset_sample_ndim(ds));
    float *v = tu_read(x);
    for (int64_t r = 0; r < rows; r++) {
      assert_int_equal(y[r], order[got + r]);
      assert_memory_equal(v + r * row, clpar_dataset_features(ds, y[r]),
                          (size_t)row * sizeof(float));
      seen[got + r] = y[r];
    }
    free(v);
    clpar_tensor_free(x);
    got += rows;
  }
  assert_int_equal(b, clpar_loader_batches(l));
  assert_int_equal(got, drop_last ? b * bs : n);
  assert_int_equal(clpar_loader_epoch(l), epoch + 1);
  free(order);
  return b;
}

static void assert_permutation(const int64_t *seen, int64_t n) {
  char *hit = calloc((size_t)n, 1);
  for (int64_t i = 0; i < n; i++) {
    assert_in_range(seen[i], 0, n - 1);
    assert_int_equal(hit[seen[i]], 0);
    hit[seen[i]] = 1;
  }
  free(hit);
}

static void test_loader_shuffle_every_device(void **state) {
  (void)state;
  enum { N = 23, BS = 5 };
  clpar_dataset *ds = make_ds(N, 2, 3);
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_loader_options o = {.batch_size = BS, .shuffle = 1, .seed = 7, .drop_last = 0};
    clpar_loader *l, *again, *other;
    tu_ok(clpar_loader_create(ds, clpar_device_get(d), &o, &l));
    tu_ok(clpar_loader_create(ds, clpar_device_get(d), &o, &again));
    o.seed = 8;
    tu_ok(clpar_loader_create(ds, clpar_device_get(d), &o, &other));
    int64_t e0[N], e1[N], a0[N], a1[N], o0[N];
    assert_int_equal(run_epoch(l, ds, BS, 0, e0), 5); /* 5 + 5 + 5 + 5 + 3 */
    assert_int_equal(run_epoch(l, ds, BS, 0, e1), 5);
    assert_permutation(e0, N);
    assert_permutation(e1, N);
    assert_memory_not_equal(e0, e1, sizeof e0); /* a new permutation each epoch */
    run_epoch(again, ds, BS, 0, a0);
    run_epoch(again, ds, BS, 0, a1);
    assert_memory_equal(e0, a0, sizeof e0); /* the same seed, the same batches */
    assert_memory_equal(e1, a1, sizeof e1);
    run_epoch(other, ds, BS, 0, o0);
    assert_permutation(o0, N);
    assert_memory_not_equal(e0, o0, sizeof e0);
    int64_t identity = 0;
    for (int i = 0; i < N; i++) identity += e0[i] == i;
    assert_true(identity < N);
    clpar_loader_free(l);
    clpar_loader_free(again);
    clpar_loader_free(other);
  }
  clpar_dataset_free(ds);
}

static void test_loader_drop_last_and_resume(void **state) {
  (void)state;
  enum { N = 23, BS = 5 };
  clpar_dataset *ds = make_ds(N, 1, 4);
  clpar_device *dev = clpar_device_get(0);
  clpar_loader_options o = {.batch_size = BS, .shuffle = 0, .drop_last = 1};
  clpar_loader *l;
  tu_ok(clpar_loader_create(ds, dev, &o, &l));
  int64_t seen[N];
  assert_int_equal(clpar_loader_batches(l), 4);
  assert_int_equal(run_epoch(l, ds, BS, 1, seen), 4);        /* 20 samples; the last 3 dropped */
  for (int i = 0; i < 20; i++) assert_int_equal(seen[i], i); /* in order without shuffle */
  clpar_loader_free(l);

  /* a loader set to epoch 2 gives what an uninterrupted one gives in its third epoch */
  o.shuffle = 1;
  o.seed = 42;
  o.drop_last = 0;
  int64_t e2[N], r2[N], scratch[N];
  tu_ok(clpar_loader_create(ds, dev, &o, &l));
  for (int e = 0; e < 3; e++) run_epoch(l, ds, BS, 0, e == 2 ? e2 : scratch);
  clpar_loader_free(l);
  tu_ok(clpar_loader_create(ds, dev, &o, &l));
  run_epoch(l, ds, BS, 0, scratch);
  clpar_tensor *x;
  tu_ok(clpar_loader_next(l, &x, NULL, NULL)); /* mid-epoch, with the thread ahead */
  clpar_tensor_free(x);
  tu_ok(clpar_loader_set_epoch(l, 2));
  run_epoch(l, ds, BS, 0, r2);
  assert_memory_equal(e2, r2, sizeof e2);
  tu_ok(clpar_loader_next(l, NULL, NULL, NULL)); /* freed mid-epoch below: a clean stop */
  clpar_loader_free(l);

  /* errors */
  o.batch_size = -1; /* 0 means 1, DataLoader's default */
  assert_int_equal(clpar_loader_create(ds, dev, &o, &l), CLPAR_ERROR_INVALID_ARGUMENT);
  o.batch_size = 24;
  o.drop_last = 1;
  assert_int_equal(clpar_loader_create(ds, dev, &o, &l), CLPAR_ERROR_EMPTY);
  o.drop_last = 0; /* one partial batch of all 23 */
  tu_ok(clpar_loader_create(ds, dev, &o, &l));
  assert_int_equal(run_epoch(l, ds, 24, 0, seen), 1);
  clpar_loader_free(l);
  clpar_dataset_free(ds);
}

/* ---- .npy ---- */

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* A .npy file as the spec says: magic, version, header length (2 bytes for 1.0, 4 for 2.0),
 * the dict padded with spaces and a newline so that the data starts at a multiple of 64. */
static void write_npy(const char *path, int major, const char *dict, const void *data,
                      size_t bytes) {
  size_t pre = major == 1 ? 10 : 12, len = strlen(dict) + 1;
  size_t pad = (64 - (pre + len) % 64) % 64, hlen = len + pad;
  unsigned char *buf = calloc(pre + hlen + bytes + 1, 1);
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = 0;
  for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (unsigned char)(hlen >> (8 * i));
  memcpy(buf + pre, dict, strlen(dict));
  memset(buf + pre + strlen(dict), ' ', pad);
  buf[pre + hlen - 1] = '\n';
  if (bytes) memcpy(buf + pre + hlen, data, bytes);
  write_bytes(path, buf, pre + hlen + bytes);
  free(buf);
}

static void test_npy_round_trip(void **state) {
  (void)state;
  char fx[128], fy[128], fy32[128];
  path_in(fx, sizeof fx, "x.npy");
  path_in(fy, sizeof fy, "y64.npy");
  path_in(fy32, sizeof fy32, "y32.npy");
  float x[3 * 2 * 2];
  for (int i = 0; i < 12; i++) x[i] = (float)i * 0.25f - 1.0f;
  int64_t y64[3] = {2, 0, 1};
  int32_t y32[3] = {5, -1, 7};
  write_npy(fx, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2, 2), }", x, sizeof x);
  write_npy(fy, 2, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", y64, sizeof y64);
  write_npy(fy32, 1, "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<i4\"}", y32,
            sizeof y32);
  clpar_npy_array a;
  tu_ok(clpar_npy_read(fx, &a));
  assert_int_equal(a.dtype, CLPAR_NPY_F32);
  assert_int_equal(a.ndim, 3);
  assert_int_equal(a.shape[0], 3);
  assert_int_equal(a.shape[2], 2);
  assert_int_equal(a.numel, 12);
  assert_memory_equal(a.data, x, sizeof x);
  clpar_npy_array_free(&a);
  tu_ok(clpar_npy_read(fy32, &a));
  assert_int_equal(a.dtype, CLPAR_NPY_I32);
  assert_memory_equal(a.data, y32, sizeof y32);
  clpar_npy_array_free(&a);

  clpar_dataset *ds;
  tu_ok(clpar_dataset_from_npy(fx, fy, &ds));
  assert_int_equal(clpar_dataset_size(ds), 3);
  assert_int_equal(clpar_dataset_sample_ndim(ds), 2);
  assert_int_equal(clpar_dataset_label(ds, 0), 2);
  assert_int_equal(clpar_dataset_label(ds, 2), 1);
  assert_memory_equal(clpar_dataset_features(ds, 1), x + 4, 4 * sizeof(float));
  clpar_dataset_free(ds);
  tu_ok(clpar_dataset_from_npy(fx, fy32, &ds));
  assert_int_equal(clpar_dataset_label(ds, 1), -1);
  clpar_dataset_free(ds);

  /* an int64 label outside int32 */
  y64[1] = (int64_t)1 << 40;
  write_npy(fy, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", y64, sizeof y64);
  assert_int_equal(clpar_dataset_from_npy(fx, fy, &ds), CLPAR_ERROR_CORRUPT);
  assert_non_null(strstr(clpar_last_error(), "outside int32"));
  /* labels of another length */
  write_npy(fy, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", y64, 16);
  assert_int_equal(clpar_dataset_from_npy(fx, fy, &ds), CLPAR_ERROR_SHAPE_MISMATCH);
}

/* Files numpy itself wrote (tests/reference/make_npy.py). */
static void test_npy_numpy_fixtures(void **state) {
  (void)state;
  clpar_npy_array a;
  tu_ok(clpar_npy_read(CLPAR_TEST_REFERENCE_DIR "/npy_f32_3x4.npy", &a));
  assert_int_equal(a.dtype, CLPAR_NPY_F32);
  assert_int_equal(a.ndim, 2);
  assert_int_equal(a.shape[0], 3);
  assert_int_equal(a.shape[1], 4);
  for (int i = 0; i < 12; i++) assert_true(((float *)a.data)[i] == (float)i * 0.5f - 2.0f);
  clpar_npy_array_free(&a);
  tu_ok(clpar_npy_read(CLPAR_TEST_REFERENCE_DIR "/npy_i64_3.npy", &a));
  assert_int_equal(a.dtype, CLPAR_NPY_I64);
  assert_int_equal(a.ndim, 1);
  assert_int_equal(a.shape[0], 3);
  int64_t want[3] = {3, -1, 9};
  assert_memory_equal(a.data, want, sizeof want);
  clpar_npy_array_free(&a);
  clpar_dataset *ds;
  tu_ok(clpar_dataset_from_npy(CLPAR_TEST_REFERENCE_DIR "/npy_f32_3x4.npy",
                               CLPAR_TEST_REFERENCE_DIR "/npy_i64_3.npy", &ds));
  assert_int_equal(clpar_dataset_label(ds, 2), 9);
  clpar_dataset_free(ds);
}

static void expect_corrupt(const char *path, const char *words) {
  clpar_npy_array a;
  clpar_status s = clpar_npy_read(path, &a);
  if (s != CLPAR_ERROR_CORRUPT || !strstr(clpar_last_error(), path) ||
      !strstr(clpar_last_error(), words))
    fail_msg("%s: want CLPAR_ERROR_CORRUPT naming the file and '%s', got %s: %s", path, words,
             clpar_status_name(s), clpar_last_error());
  assert_null(a.data);
}

static void test_npy_corrupt(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "bad.npy");
  float x[6] = {0};
  const char *ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  write_npy(p, 1, ok, x, sizeof x);
  clpar_npy_array a;
  tu_ok(clpar_npy_read(p, &a)); /* the good file the bad ones are made from */
  clpar_npy_array_free(&a);

  write_bytes(p, "\x93NUMPZ\x01\x00\x10\x00", 10);
  expect_corrupt(p, "bad magic");
  write_bytes(p, "\x93NUMPY\x01", 7);
  expect_corrupt(p, "bad magic"); /* truncated preamble */
  write_bytes(p, "\x93NUMPY\x02\x00\x10", 9);
  expect_corrupt(p, "byte"); /* truncated in the preamble of a v2 file */
  write_bytes(p, "\x93NUMPY\x01\x00\x40\x00{'descr'", 17);
  expect_corrupt(p, "past the end"); /* header length past the file */
  write_bytes(p, "\x93NUMPY\x02\x00\x00\x00\x10\x00", 12);
  expect_corrupt(p, "over the limit"); /* 1 MiB header */
  write_bytes(p, "\x93NUMPY\x07\x00\x10\x00", 10);
  expect_corrupt(p, "unknown .npy version");
  write_npy(p, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", x, sizeof x);
  expect_corrupt(p, "Fortran");
  write_npy(p, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", x, sizeof x);
  expect_corrupt(p, "'<f8'");
  write_npy(p, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", x, sizeof x);
  expect_corrupt(p, "'>f4'");
  write_npy(p, 1, ok, x, sizeof x - 4);
  expect_corrupt(p, "needs 24 bytes"); /* data shorter than the shape */
  write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", x, sizeof x);
  expect_corrupt(p, "needs 16 bytes"); /* longer */
  write_npy(p, 2,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }", x,
            sizeof x);
  expect_corrupt(p, "overflows");
  write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", x,
            sizeof x);
  expect_corrupt(p, "too large");
  write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False}", x, sizeof x);
  expect_corrupt(p, "missing");
  write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", x, sizeof x);
  expect_corrupt(p, "unknown or repeated key");
  write_npy(p, 1, "{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3), }", x, sizeof x);
  expect_corrupt(p, "expected ',' or '}'");
  write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", x, sizeof x);
  expect_corrupt(p, "not a number");
  write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } extra", x, sizeof x);
  expect_corrupt(p, "text after the dict");
  write_bytes(p, "", 0);
  expect_corrupt(p, "bad magic"); /* a zero-length file */
  path_in(p, sizeof p, "missing.npy");
  assert_int_equal(clpar_npy_read(p, &a), CLPAR_ERROR_IO);
  assert_int_equal(clpar_npy_read(dir, &a), CLPAR_ERROR_IO); /* a directory */
}

/* ---- CSV ---- */

static void write_gz(const char *path, const char *text, size_t n) {
  gzFile g = gzopen(path, "wb");
  assert_non_null(g);
  assert_int_equal(gzwrite(g, text, (unsigned)n), (int)n);
  assert_int_equal(gzclose(g), Z_OK);
}

static void test_csv(void **state) {
  (void)state;
  const char *text = "a,b,label,c\n1.5,-2,3,4e-1\r\n\n0,0.25,1,7\n  8 ,9, 0 ,10\n";
  const float want[9] = {1.5f, -2.0f, 0.4f, 0.0f, 0.25f, 7.0f, 8.0f, 9.0f, 10.0f};
  const int32_t labels[3] = {3, 1, 0};
  char plain[128], gz[128];
  path_in(plain, sizeof plain, "d.csv");
  path_in(gz, sizeof gz, "d.csv.gz");
  write_bytes(plain, text, strlen(text));
  write_gz(gz, text, strlen(text));
  for (int k = 0; k < 2; k++) {
    clpar_dataset *ds;
    tu_ok(clpar_dataset_from_csv(k ? gz : plain, 2, 1, &ds));
    assert_int_equal(clpar_dataset_size(ds), 3);
    assert_int_equal(clpar_dataset_sample_ndim(ds), 1);
    assert_int_equal(clpar_dataset_sample_dim(ds, 0), 3);
    for (int i = 0; i < 3; i++) {
      assert_memory_equal(clpar_dataset_features(ds, i), want + 3 * i, 3 * sizeof(float));
      assert_int_equal(clpar_dataset_label(ds, i), labels[i]);
    }
    clpar_dataset_free(ds);
  }
  clpar_dataset *ds;
  /* the header taken as data: a bad number naming line 1 */
  assert_int_equal(clpar_dataset_from_csv(gz, -1, 0, &ds), CLPAR_ERROR_CORRUPT);
  assert_non_null(strstr(clpar_last_error(), "line 1, column 1"));
  assert_non_null(strstr(clpar_last_error(), gz));
  const char *bad = "1,2,3\n4,x5,6\n";
  write_gz(gz, bad, strlen(bad));
  assert_int_equal(clpar_dataset_from_csv(gz, -1, 0, &ds), CLPAR_ERROR_CORRUPT);
  assert_non_null(strstr(clpar_last_error(), "line 2, column 2: 'x5' is not a number"));
  bad = "1,2,3\n4,5\n";
  write_bytes(plain, bad, strlen(bad));
  assert_int_equal(clpar_dataset_from_csv(plain, -1, 0, &ds), CLPAR_ERROR_CORRUPT);
  assert_non_null(strstr(clpar_last_error(), "line 2 has 2 columns"));
  bad = "1,2,3\n4,5,6.5\n";
  write_bytes(plain, bad, strlen(bad));
  assert_int_equal(clpar_dataset_from_csv(plain, -1, 0, &ds), CLPAR_ERROR_CORRUPT);
  assert_non_null(strstr(clpar_last_error(), "line 2, column 3: label '6.5'"));
  bad = "1,2,3\n4,5,99999999999\n";
  write_bytes(plain, bad, strlen(bad));
  assert_int_equal(clpar_dataset_from_csv(plain, -1, 0, &ds), CLPAR_ERROR_CORRUPT);
  write_bytes(plain, "1,2\0,3\n", 7);
  assert_int_equal(clpar_dataset_from_csv(plain, -1, 0, &ds), CLPAR_ERROR_CORRUPT);
  assert_non_null(strstr(clpar_last_error(), "NUL byte at byte 3"));
  write_bytes(plain, "x,y\n", 4);
  assert_int_equal(clpar_dataset_from_csv(plain, -1, 1, &ds), CLPAR_ERROR_EMPTY);

  /* a truncated gzip file */
  char *big = malloc(200000);
  for (int i = 0; i < 200000; i++) big[i] = i % 8 == 7 ? '\n' : i % 2 ? ',' : (char)('0' + i % 7);
  write_gz(gz, big, 200000);
  free(big);
  tu_ok(clpar_dataset_from_csv(gz, -1, 0, &ds));
  assert_int_equal(clpar_dataset_size(ds), 25000);
  clpar_dataset_free(ds);
  FILE *f = fopen(gz, "rb");
  unsigned char buf[4096];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  assert_true(n > 40);
  write_bytes(gz, buf, n / 2);
  clpar_status s = clpar_dataset_from_csv(gz, -1, 0, &ds);
  if (s != CLPAR_ERROR_CORRUPT)
    fail_msg("truncated gzip: %s: %s", clpar_status_name(s), clpar_last_error());
  assert_non_null(strstr(clpar_last_error(), gz));
}

static int make_dir(void **state) {
  snprintf(dir, sizeof dir, "/tmp/clpar-data-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  return tu_setup(state);
}

static int remove_dir(void **state) {
  tu_remove_dir(dir);
  return tu_teardown(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loader_shuffle_every_device),
      cmocka_unit_test(test_loader_drop_last_and_resume),
      cmocka_unit_test(test_npy_round_trip),
      cmocka_unit_test(test_npy_numpy_fixtures),
      cmocka_unit_test(test_npy_corrupt),
      cmocka_unit_test(test_csv),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
