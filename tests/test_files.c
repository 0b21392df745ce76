/* test_files.c — the safetensors and checkpoint files against damage and hostile input:
 * metadata strings holding NUL (allowed by the format), a checksum per tensor in training
 * checkpoints (a flipped bit is an error naming the tensor; files without checksums, as
 * PyTorch writes them, still load), a header whose parse would cost far more memory than the
 * file holds refused before it is parsed, control characters from a file escaped in
 * messages, and an atomic save that keeps the mode of the file it replaces, replaces a
 * symbolic link rather than writing through it, and cannot be blocked by planted temp names. */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "io/safetensors.h"
#include "test_util.h"

static char dir[64];

static void path_in(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", dir, name);
}

/* A safetensors file of header (padded with spaces to a multiple of 8) and data bytes. */
static void write_st(const char *path, const char *header, size_t hlen, const void *data,
                     size_t n) {
  size_t padded = (hlen + 7) & ~(size_t)7;
  uint64_t hn = padded;
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(&hn, 8, 1, f), 1);
  assert_int_equal(fwrite(header, 1, hlen, f), hlen);
  for (size_t i = hlen; i < padded; i++) fputc(' ', f);
  if (n) assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static void spit_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

/* ---- metadata with NUL ---- */

static void test_metadata_with_nul(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "nul.safetensors");
  const char *h =
      "{\"__metadata__\":{\"note\":\"a\\u0000b\",\"plain\":\"x\"},"
      "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  float one = 1.0f;
  write_st(p, h, strlen(h), &one, 4);
  clpar_st_file f;
  clpar_status s = clpar_st_read(p, &f);
  if (s != CLPAR_OK) fail_msg("a metadata value with \\u0000: %s", clpar_last_error());
  size_t len = 0;
  const char *v = clpar_st_meta_len(&f, "note", &len);
  assert_non_null(v);
  assert_int_equal(len, 3);
  assert_memory_equal(v, "a\0b", 4);
  assert_string_equal(clpar_st_meta(&f, "plain"), "x");
  clpar_st_free(&f);
}

/* ---- checksums in training checkpoints ---- */

static clpar_module *make_model(void) {
  clpar_module *l1, *relu, *l2, *seq;
  clpar_device *dev = clpar_device_get(0);
  tu_ok(clpar_linear_create(8, 16, 1, dev, &l1));
  tu_ok(clpar_relu_create(&relu));
  tu_ok(clpar_linear_create(16, 2, 1, dev, &l2));
  tu_ok(clpar_sequential_create((clpar_module *[]){l1, relu, l2}, 3, &seq));
  return seq;
}

static void one_step(clpar_module *m, clpar_optimizer *o) {
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x, *target, *y, *loss;
  clpar_device *dev = clpar_device_get(0);
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){4, 8}, 1, -1, 1, &x));
  tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){4, 2}, 2, -1, 1, &target));
  tu_ok(clpar_module_forward(m, x, &y));
  tu_ok(clpar_mse_loss(y, target, CLPAR_REDUCTION_MEAN, &loss));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_optimizer_step(o));
  clpar_scope_end(sc);
}

/* Flips bit 3 of the byte in the middle of tensor name's data in the file at path. */
static void flip_in(const char *path, const char *name) {
  clpar_st_file f;
  tu_ok(clpar_st_read(path, &f));
  int idx = clpar_st_find(&f, name);
  assert_true(idx >= 0);
  off_t at = (off_t)(f.data_start + (f.tensors[idx].begin + f.tensors[idx].end) / 2);
  clpar_st_free(&f);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, at), 1);
  b ^= 8;
  assert_int_equal(pwrite(fd, &b, 1, at), 1);
  close(fd);
}

/* The file at from rewritten to to without its checksum metadata: a checkpoint as an older
 * clpar wrote it, or as a PyTorch script that edits one rewrites it. */
static void without_checksums(const char *from, const char *to) {
  clpar_st_file f;
  tu_ok(clpar_st_read(from, &f));
  clpar_st_entry *e = calloc((size_t)f.n, sizeof *e);
  int64_t(*shapes)[8] = calloc((size_t)f.n, sizeof *shapes);
  void **data = calloc((size_t)f.n, sizeof *data);
  for (int i = 0; i < f.n; i++) {
    const clpar_st_tensor *t = &f.tensors[i];
    data[i] = malloc((size_t)(t->end - t->begin) + 1);
    tu_ok(clpar_st_tensor_read(&f, i, data[i]));
    for (int k = 0; k < t->ndim; k++) shapes[i][k] = (int64_t)t->shape[k];
    e[i] = (clpar_st_entry){t->name, t->dtype, t->ndim, shapes[i], data[i], NULL, NULL};
  }
  const char **keys = calloc((size_t)f.n_meta, sizeof *keys);
  const char **values = calloc((size_t)f.n_meta, sizeof *values);
  int n_meta = 0, dropped = 0;
  for (int i = 0; i < f.n_meta; i++) {
    if (strncmp(f.meta_keys[i], "crc32.", 6) == 0 || strcmp(f.meta_keys[i], "checksums") == 0) {
      dropped++;
      continue;
    }
    keys[n_meta] = f.meta_keys[i];
    values[n_meta++] = f.meta_values[i];
  }
  assert_int_equal(dropped, f.n + 1); /* one per tensor and the marker */
  tu_ok(clpar_st_write(to, e, f.n, keys, values, n_meta));
  for (int i = 0; i < f.n; i++) free(data[i]);
  free(data);
  free(shapes);
  free(e);
  free(keys);
  free(values);
  clpar_st_free(&f);
}

static void test_checkpoint_checksums(void **state) {
  (void)state;
  char p[128], old[128];
  path_in(p, sizeof p, "ckpt.safetensors");
  path_in(old, sizeof old, "ckpt_old.safetensors");
  clpar_module *m = make_model();
  clpar_optimizer *o;
  tu_ok(clpar_adam_create_for(m, &(clpar_adam_options){1e-3f, 0.9f, 0.999f, 1e-8f, 0}, &o));
  one_step(m, o);
  tu_ok(clpar_checkpoint_save(p, m, o, 1, 0));
  without_checksums(p, old);
  tu_ok(clpar_checkpoint_load(p, m, o, NULL, NULL));
  tu_ok(clpar_checkpoint_load(old, m, o, NULL, NULL)); /* no checksums: loads unchecked */
  const char *victims[] = {"optimizer.state.2.exp_avg_sq", "model.0.weight"};
  for (int i = 0; i < 2; i++) {
    tu_ok(clpar_checkpoint_save(p, m, o, 1, 0));
    flip_in(p, victims[i]);
    clpar_status s = clpar_checkpoint_load(p, m, o, NULL, NULL);
    if (s != CLPAR_ERROR_CORRUPT)
      fail_msg("a bit flipped in %s: %s %s", victims[i], clpar_status_name(s),
               s ? clpar_last_error() : "");
    assert_non_null(strstr(clpar_last_error(), victims[i]));
    assert_non_null(strstr(clpar_last_error(), "checksum"));
  }
  clpar_optimizer_free(o);
  clpar_module_free(m);
}

/* ---- the header's cost ---- */

static size_t live, peak;

static void *counting_malloc(size_t n) {
  size_t *p = malloc(n + 16);
  if (!p) return NULL;
  *p = n;
  live += n;
  if (live > peak) peak = live;
  return (char *)p + 16;
}

static void counting_free(void *q) {
  if (!q) return;
  size_t *p = (size_t *)((char *)q - 16);
  live -= *p;
  free(p);
}

/* A header of n zero-size tensors (the data block empty) and how many bytes Jansson took at
 * most while it was read. */
static clpar_status read_zero_entries(const char *p, int n, size_t *jansson_peak) {
  size_t cap = (size_t)n * 64 + 16, len = 1;
  char *h = malloc(cap);
  h[0] = '{';
  for (int i = 0; i < n; i++)
    len += (size_t)snprintf(h + len, cap - len,
                            "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                            i ? "," : "", i);
  h[len++] = '}';
  write_st(p, h, len, NULL, 0);
  free(h);
  live = peak = 0;
  json_set_alloc_funcs(counting_malloc, counting_free);
  clpar_st_file f;
  clpar_status s = clpar_st_read(p, &f);
  if (s == CLPAR_OK) clpar_st_free(&f);
  json_set_alloc_funcs(malloc, free);
  *jansson_peak = peak;
  return s;
}

static void test_header_cost_bounded(void **state) {
  (void)state;
  char p[128];
  path_in(p, sizeof p, "bomb.safetensors");
  size_t used;
  /* 150,000 entries: an 8.5 MB header that Jansson alone parses into some 200 MB */
  clpar_status s = read_zero_entries(p, 150000, &used);
  if (s != CLPAR_ERROR_TOO_LARGE)
    fail_msg("a header of 150,000 empty tensors: %s (%s), Jansson used %zu bytes",
             clpar_status_name(s), s ? clpar_last_error() : "", used);
  assert_non_null(strstr(clpar_last_error(), "values"));
  assert_true(used < (16u << 20));
  /* a model's worth of small entries still reads */
  tu_ok(read_zero_entries(p, 2000, &used));
}

/* ---- control characters from files ---- */

static int has_control(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
  return 0;
}

static void test_names_escaped(void **state) {
  (void)state;
  char buf[16];
  assert_string_equal(clpar_escape("a\\b\n\0c", 6, buf, sizeof buf), "a\\\\b\\x0a\\x00c");
  assert_string_equal(clpar_escape("\xc2\x9b"
                                   "2J",
                                   4, buf, sizeof buf),
                      "\\xc2\\x9b2J");
  assert_string_equal(clpar_escape("0123456789abcdefgh", 18, buf, sizeof buf), "0123456789ab...");
  assert_string_equal(clpar_escape("0123456789abcde", 15, buf, sizeof buf), "0123456789abcde");
  assert_string_equal(clpar_escape("0123456789ab\x1b", 13, buf, sizeof buf), "0123456789ab...");
  char p[128];
  path_in(p, sizeof p, "esc.safetensors");
  /* a tensor name with an ANSI escape (clears the screen) and a newline, and bad offsets */
  const char *h = "{\"a\\u001b[2J\\nb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}";
  write_st(p, h, strlen(h), "12345678", 8);
  clpar_st_file f;
  assert_int_equal(clpar_st_read(p, &f), CLPAR_ERROR_CORRUPT);
  if (has_control(clpar_last_error())) fail_msg("raw control bytes in the message");
  assert_non_null(strstr(clpar_last_error(), "a\\x1b[2J\\x0ab"));
  /* a metadata value in a checkpoint's message */
  h = "{\"__metadata__\":{\"format\":\"x\\u001b]0;owned\\u0007\"}}";
  write_st(p, h, strlen(h), NULL, 0);
  clpar_module *m = make_model();
  assert_int_equal(clpar_checkpoint_load(p, m, NULL, NULL, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  if (has_control(clpar_last_error())) fail_msg("raw control bytes in the message");
  assert_non_null(strstr(clpar_last_error(), "x\\x1b]0;owned\\x07"));
  clpar_module_free(m);
}

/* ---- the atomic save ---- */

static void test_save_keeps_mode(void **state) {
  (void)state;
  char p[128], target[128];
  path_in(p, sizeof p, "private.safetensors");
  path_in(target, sizeof target, "target.safetensors");
  clpar_module *m = make_model();
  tu_ok(clpar_safetensors_save(m, p, NULL, NULL, 0));
  assert_int_equal(chmod(p, 0600), 0);
  tu_ok(clpar_safetensors_save(m, p, NULL, NULL, 0));
  struct stat st;
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0600);
  assert_int_equal(chmod(p, 0640), 0);
  tu_ok(clpar_checkpoint_save(p, m, NULL, 0, 0));
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0640);
  /* a link at the path is replaced by the new file; its target is not written */
  spit_text(target, "untouched");
  unlink(p);
  assert_int_equal(symlink(target, p), 0);
  tu_ok(clpar_safetensors_save(m, p, NULL, NULL, 0));
  assert_int_equal(lstat(p, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  assert_int_equal(stat(target, &st), 0);
  assert_int_equal(st.st_size, 9);
  clpar_module_free(m);
}

static void test_temp_names_unpredictable(void **state) {
  (void)state;
  char p[128], planted[256];
  path_in(p, sizeof p, "planted.safetensors");
  /* every name a counter from this process id would give, taken in advance */
  for (int k = 0; k < 400; k++) {
    snprintf(planted, sizeof planted, "%s/.tmp-%ld-%d-planted.safetensors", dir, (long)getpid(), k);
    spit_text(planted, "");
  }
  clpar_module *m = make_model();
  clpar_status s = clpar_safetensors_save(m, p, NULL, NULL, 0);
  if (s != CLPAR_OK) fail_msg("planted temp names block the save: %s", clpar_last_error());
  clpar_module_free(m);
  /* no temp file of the save is left behind: the 400 planted ones and the file */
  DIR *d = opendir(dir);
  int left = 0;
  for (struct dirent *e; (e = readdir(d));) left += strstr(e->d_name, "planted") != NULL;
  closedir(d);
  assert_int_equal(left, 401);
}

static int make_dir(void **state) {
  snprintf(dir, sizeof dir, "/tmp/clpar-files-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  return tu_setup(state);
}

static int remove_dir(void **state) {
  tu_remove_dir(dir);
  return tu_teardown(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_metadata_with_nul),   cmocka_unit_test(test_checkpoint_checksums),
      cmocka_unit_test(test_header_cost_bounded), cmocka_unit_test(test_names_escaped),
      cmocka_unit_test(test_save_keeps_mode),     cmocka_unit_test(test_temp_names_unpredictable),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
