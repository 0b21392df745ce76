/* test_checkpoint.c — safetensors checkpoints: round trips on every selected device, files
 * from PyTorch (tests/reference/make_safetensors.py) loaded value by value and clpar's own
 * file byte-identical to PyTorch's, DataParallel's "module." prefix both ways, strict and
 * non-strict loads, every corrupt-file case of the reference reader, and resumable training
 * (2N steps equal N, save, a fresh clpar_init, load, N more, bit for bit). */
#include <fcntl.h>
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

/* The weights make_safetensors.py sets: tensor j of the state_dict, flat index k. */
static float value(int j, int64_t k) {
  return (float)((k * 7 + j * 3) % 11 - 5) / 8.0f;
}

/* Sequential(Linear(3, 4), ReLU(), Linear(4, 2)) on dev. */
static clpar_module *make_seq(clpar_device *dev) {
  clpar_module *l1, *relu, *l2, *seq;
  tu_ok(clpar_linear_create(3, 4, 1, dev, &l1));
  tu_ok(clpar_relu_create(&relu));
  tu_ok(clpar_linear_create(4, 2, 1, dev, &l2));
  tu_ok(clpar_sequential_create((clpar_module *[]){l1, relu, l2}, 3, &seq));
  return seq;
}

static void set_formula(clpar_module *m) {
  for (int j = 0; j < clpar_module_parameter_count(m); j++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, j, NULL, &p));
    int64_t n = clpar_tensor_numel(p);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t k = 0; k < n; k++) v[k] = value(j, k);
    tu_ok(clpar_tensor_write(p, v, (size_t)n));
    free(v);
  }
}

static void expect_formula(const clpar_module *m) {
  assert_int_equal(clpar_module_parameter_count(m), 4);
  for (int j = 0; j < 4; j++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, j, NULL, &p));
    float *v = tu_read(p);
    for (int64_t k = 0; k < clpar_tensor_numel(p); k++)
      if (v[k] != value(j, k))
        fail_msg("parameter %d element %lld: %g, want %g", j, (long long)k, v[k], value(j, k));
    free(v);
  }
}

/* Every parameter of m, concatenated (malloc'ed), and the count in *n. */
static float *read_all(const clpar_module *m, size_t *n) {
  size_t total = 0;
  for (int j = 0; j < clpar_module_parameter_count(m); j++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, j, NULL, &p));
    total += (size_t)clpar_tensor_numel(p);
  }
  float *all = malloc(total * sizeof *all), *at = all;
  for (int j = 0; j < clpar_module_parameter_count(m); j++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, j, NULL, &p));
    tu_ok(clpar_tensor_read(p, at, (size_t)clpar_tensor_numel(p)));
    at += clpar_tensor_numel(p);
  }
  *n = total;
  return all;
}

static uint8_t *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)n + 1);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return buf;
}

static void spit(const char *path, const void *data, size_t size) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, size, f), size);
  fclose(f);
}

/* Save and load on every selected device: the values, the names and the dtype survive. */
static void test_round_trip_every_device(void **state) {
  (void)state;
  char path[128];
  path_in(path, sizeof path, "round_trip.safetensors");
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    clpar_manual_seed(11);
    clpar_module *a = make_seq(dev);
    tu_ok(clpar_safetensors_save(a, path, NULL, NULL, 0));
    clpar_manual_seed(12);
    clpar_module *b = make_seq(dev);
    size_t na, nb;
    float *va = read_all(a, &na), *vb = read_all(b, &nb);
    assert_int_equal(na, nb);
    assert_int_not_equal(memcmp(va, vb, na * sizeof *va), 0); /* the load has work to do */
    free(vb);
    clpar_load_report r;
    tu_ok(clpar_safetensors_load(b, path, 1, &r));
    assert_int_equal(r.loaded, 4);
    assert_string_equal(r.missing, "");
    clpar_load_report_free(&r);
    vb = read_all(b, &nb);
    assert_memory_equal(va, vb, na * sizeof *va);
    clpar_st_file f;
    tu_ok(clpar_st_read(path, &f));
    assert_int_equal(f.n, 4);
    const char *names[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    for (int j = 0; j < 4; j++) {
      int idx = clpar_st_find(&f, names[j]);
      assert_true(idx >= 0);
      assert_int_equal(f.tensors[idx].dtype, CLPAR_ST_F32);
    }
    assert_int_equal(f.tensors[clpar_st_find(&f, "0.weight")].shape[1], 3);
    clpar_st_free(&f);
    free(va);
    free(vb);
    clpar_module_free(a);
    clpar_module_free(b);
  }
}

/* PyTorch's file loads value by value; clpar's file of the same weights and metadata is the
 * same bytes as PyTorch's (and make_safetensors.py check loads it: see the README). */
static void test_pytorch_interop(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *m = make_seq(dev);
  tu_ok(clpar_safetensors_load(m, CLPAR_TEST_REFERENCE_DIR "/seq_torch.safetensors", 1, NULL));
  expect_formula(m);
  clpar_module_free(m);

  m = make_seq(dev);
  set_formula(m);
  char path[128];
  path_in(path, sizeof path, "clpar_seq.safetensors");
  const char *k[] = {"format"}, *v[] = {"pt"};
  tu_ok(clpar_safetensors_save(m, path, k, v, 1));
  tu_ok(clpar_safetensors_save(m, CLPAR_TEST_OUT_DIR "/clpar_seq.safetensors", k, v, 1));
  size_t n_ours, n_torch;
  uint8_t *ours = slurp(path, &n_ours),
          *torch = slurp(CLPAR_TEST_REFERENCE_DIR "/seq_torch.safetensors", &n_torch);
  assert_int_equal(n_ours, n_torch);
  assert_memory_equal(ours, torch, n_torch);
  free(ours);
  free(torch);
  clpar_module_free(m);
}

/* A DataParallel file ("module.0.weight") loads into the bare model, a bare file into a
 * DataParallel wrapper, and each saves its own form. */
static void test_data_parallel_prefix(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *m = make_seq(dev);
  tu_ok(clpar_safetensors_load(m, CLPAR_TEST_REFERENCE_DIR "/seq_torch_dp.safetensors", 1, NULL));
  expect_formula(m);
  clpar_module_free(m);

  clpar_module *dp;
  clpar_data_parallel_options o = {0};
  tu_ok(clpar_data_parallel_create(make_seq(dev), &o, &dp));
  const char *name;
  tu_ok(clpar_module_parameter_at(dp, 0, &name, NULL));
  assert_string_equal(name, "module.0.weight");
  clpar_scope *sc = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 2, (int64_t[]){6, 3}, 5), *y_dp, *y_bare;
  tu_ok(clpar_module_forward(dp, x, &y_dp)); /* replicas made with the old weights */
  tu_ok(clpar_safetensors_load(dp, CLPAR_TEST_REFERENCE_DIR "/seq_torch.safetensors", 1, NULL));
  expect_formula(dp);
  /* the replicas see the loaded weights: DataParallel's output is the bare model's */
  clpar_module *bare = make_seq(dev);
  set_formula(bare);
  tu_ok(clpar_module_forward(dp, x, &y_dp));
  tu_ok(clpar_module_forward(bare, x, &y_bare));
  tu_expect_equal(y_dp, y_bare, 1e-5f, 1e-6f, "DataParallel after a load");
  clpar_scope_end(sc);
  clpar_module_free(bare);
  char path[128];
  path_in(path, sizeof path, "dp.safetensors");
  const char *k[] = {"format"}, *v[] = {"pt"};
  tu_ok(clpar_safetensors_save(dp, path, k, v, 1));
  size_t n_ours, n_torch;
  uint8_t *ours = slurp(path, &n_ours),
          *torch = slurp(CLPAR_TEST_REFERENCE_DIR "/seq_torch_dp.safetensors", &n_torch);
  assert_int_equal(n_ours, n_torch);
  assert_memory_equal(ours, torch, n_torch);
  free(ours);
  free(torch);
  clpar_module_free(dp);
}

/* Strict: a file of another architecture is refused naming what is missing, unexpected and
 * mismatched, and nothing changes; not strict: what matches loads and the rest is reported. */
static void test_strict_and_partial(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_module *l1, *relu, *l2, *other;
  tu_ok(clpar_linear_create(3, 4, 1, dev, &l1));
  tu_ok(clpar_relu_create(&relu));
  tu_ok(clpar_linear_create(4, 5, 0, dev, &l2)); /* 2.weight [5, 4], no 2.bias */
  tu_ok(clpar_sequential_create((clpar_module *[]){l1, l2, relu}, 3, &other)); /* 1.weight */
  size_t n0, n1;
  float *before = read_all(other, &n0);
  assert_int_equal(
      clpar_safetensors_load(other, CLPAR_TEST_REFERENCE_DIR "/seq_torch.safetensors", 1, NULL),
      CLPAR_ERROR_SHAPE_MISMATCH);
  const char *msg = clpar_last_error();
  assert_non_null(strstr(msg, "missing: [1.weight]"));
  assert_non_null(strstr(msg, "unexpected: [2.bias, 2.weight]"));
  float *after = read_all(other, &n1);
  assert_memory_equal(before, after, n0 * sizeof *before);
  free(after);
  clpar_module_free(other);

  /* Linear(3, 4) matches; the second layer is another shape */
  clpar_module *seq = make_seq(dev), *bad;
  clpar_tensor *w2;
  tu_ok(clpar_linear_create(4, 2, 1, dev, &l1));
  tu_ok(clpar_relu_create(&relu));
  tu_ok(clpar_linear_create(4, 3, 1, dev, &l2));
  tu_ok(clpar_sequential_create((clpar_module *[]){l1, relu, l2}, 3, &bad));
  clpar_load_report r;
  assert_int_equal(
      clpar_safetensors_load(seq, CLPAR_TEST_REFERENCE_DIR "/seq_torch.safetensors", 0, &r),
      CLPAR_OK);
  assert_int_equal(r.loaded, 4);
  clpar_load_report_free(&r);
  char path[128];
  path_in(path, sizeof path, "wide.safetensors");
  tu_ok(clpar_safetensors_save(bad, path, NULL, NULL, 0));
  tu_ok(clpar_module_parameter_at(seq, 2, NULL, &w2));
  float *w2_before = tu_read(w2);
  tu_ok(clpar_safetensors_load(seq, path, 0, &r));
  assert_int_equal(r.loaded, 0); /* 0.weight [2, 4] vs [4, 3], 0.bias [2] vs [4], ... */
  assert_string_equal(r.missing, "");
  assert_string_equal(r.unexpected, "");
  assert_non_null(
      strstr(r.mismatched, "0.weight (F32 [2, 4] in the file, F32 [4, 3] in the module)"));
  assert_non_null(strstr(r.mismatched, "2.bias"));
  clpar_load_report_free(&r);
  float *w2_after = tu_read(w2);
  assert_memory_equal(w2_before, w2_after, 8 * sizeof(float));
  expect_formula(seq);
  free(w2_before);
  free(w2_after);
  free(before);
  clpar_module_free(seq);
  clpar_module_free(bad);
}

/* A file from parts: the 8-byte size (size_override when not ~0), the header text, then
 * data_bytes bytes of data. */
static void write_case(const char *path, const char *header, uint64_t size_override,
                       size_t data_bytes) {
  size_t hn = strlen(header);
  uint64_t n = size_override != ~(uint64_t)0 ? size_override : hn;
  uint8_t *buf = calloc(8 + hn + data_bytes + 1, 1);
  memcpy(buf, &n, 8);
  memcpy(buf + 8, header, hn);
  spit(path, buf, 8 + hn + data_bytes);
  free(buf);
}

/* Every fault the reference reader refuses is CLPAR_ERROR_CORRUPT naming it, and the module
 * is left as it was. */
static void test_corrupt_files(void **state) {
  (void)state;
  const uint64_t no = ~(uint64_t)0;
  static const struct {
    const char *what, *header;
    uint64_t size;
    size_t data;
    const char *expect;
  } cases[] = {
      {"zero-length file", NULL, 0, 0, "0 bytes, too short"},
      {"truncated header size", "{}", 0, 0, "5 bytes, too short"},
      {"header size past the file", "{}", 400, 0, "runs past the end of the file"},
      {"header over the limit", "{}", 100000001, 0, "over the format's limit of 100000000"},
      {"bad JSON", "{\"a\": {\"dtype\": \"F32\",", no, 0, "not valid JSON"},
      {"invalid UTF-8",
       "{\"a\xff\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", no, 4,
       "not valid JSON"},
      {"not an object", "[1, 2]", no, 0, "does not start with '{'"},
      {"duplicate key",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"a\": {\"dtype\": "
       "\"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
       no, 8, "not valid JSON"},
      {"unknown dtype", "{\"a\": {\"dtype\": \"F31\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
       no, 4, "unknown dtype \"F31\""},
      {"overlapping offsets",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"b\": {\"dtype\": "
       "\"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
       no, 8, "overlaps"},
      {"gapped offsets",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"b\": {\"dtype\": "
       "\"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
       no, 12, "a gap in the data"},
      {"not from 0", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", no,
       8, "a gap in the data"},
      {"end before begin",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 0]}, \"b\": {\"dtype\": "
       "\"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"c\": {\"dtype\": \"F32\", \"shape\": "
       "[1], \"data_offsets\": [4, 2]}}",
       no, 4, "ends (2) before it begins (4)"},
      {"shape/size mismatch",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", no, 8,
       "12 bytes but data_offsets give 8"},
      {"shape overflow",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4], \"data_offsets\": [0, "
       "0]}}",
       no, 0, "overflows"},
      {"negative dimension",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", no, 4,
       "not a non-negative integer"},
      {"data past the tensors",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", no, 12,
       "cover 4 bytes of data but the file has 12"},
      {"data short of the tensors",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", no, 4,
       "cover 8 bytes of data but the file has 4"},
      {"metadata not strings", "{\"__metadata__\": {\"epoch\": 3}}", no, 0,
       "metadata \"epoch\" is not a string"},
      {"no data_offsets", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", no, 4,
       "data_offsets is not two"},
  };
  clpar_module *m = make_seq(clpar_device_get(0));
  set_formula(m);
  char path[128];
  path_in(path, sizeof path, "corrupt.safetensors");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (!cases[i].header)
      spit(path, "", 0);
    else if (strcmp(cases[i].what, "truncated header size") == 0)
      spit(path, "\x02\x00\x00\x00\x00", 5);
    else
      write_case(path, cases[i].header, cases[i].size, cases[i].data);
    clpar_status s = clpar_safetensors_load(m, path, 0, NULL);
    if (s != CLPAR_ERROR_CORRUPT || !strstr(clpar_last_error(), cases[i].expect))
      fail_msg("%s: %s \"%s\", want CLPAR_ERROR_CORRUPT with \"%s\"", cases[i].what,
               clpar_status_name(s), clpar_last_error(), cases[i].expect);
  }
  expect_formula(m);
  /* a valid file with a zero-sized tensor and a scalar of another dtype passes the reader */
  write_case(
      path,
      "{\"__metadata__\": null, \"z\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": "
      "[0, 0]}, \"s\": {\"dtype\": \"I64\", \"shape\": [], \"data_offsets\": [0, 8]}}   ",
      no, 8);
  clpar_load_report r;
  tu_ok(clpar_safetensors_load(m, path, 0, &r));
  assert_int_equal(r.loaded, 0);
  assert_string_equal(r.unexpected, "z, s");
  clpar_load_report_free(&r);
  clpar_module_free(m);
}

/* Saves and loads that cannot be done say why and leave the files as they were. */
static void test_save_and_load_errors(void **state) {
  (void)state;
  clpar_module *m = make_seq(clpar_device_get(0));
  char path[128], sub[160];
  path_in(path, sizeof path, "kept.safetensors");
  tu_ok(clpar_safetensors_save(m, path, NULL, NULL, 0));
  size_t n_before, n_after;
  uint8_t *before = slurp(path, &n_before);
  const char *k[] = {"a", "a"}, *v[] = {"1", "2"};
  assert_int_equal(clpar_safetensors_save(m, path, k, v, 2), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "given twice"));
  uint8_t *after = slurp(path, &n_after);
  assert_int_equal(n_before, n_after);
  assert_memory_equal(before, after, n_before);
  snprintf(sub, sizeof sub, "%s/no/such/dir/x.safetensors", dir);
  assert_int_equal(clpar_safetensors_save(m, sub, NULL, NULL, 0), CLPAR_ERROR_IO);
  snprintf(sub, sizeof sub, "%s/", dir);
  assert_int_equal(clpar_safetensors_save(m, sub, NULL, NULL, 0), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_safetensors_load(m, dir, 1, NULL), CLPAR_ERROR_IO); /* a directory */
  assert_non_null(strstr(clpar_last_error(), "not a regular file"));
  snprintf(sub, sizeof sub, "%s/missing.safetensors", dir);
  assert_int_equal(clpar_safetensors_load(m, sub, 1, NULL), CLPAR_ERROR_IO);
  /* a weights file is not a training checkpoint */
  assert_int_equal(clpar_checkpoint_load(path, m, NULL, NULL, NULL), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "not a clpar training checkpoint"));
  free(before);
  free(after);
  clpar_module_free(m);
}

/* ---- resumable training ---- */

typedef enum { RUN_SGD, RUN_ADAM, RUN_ADAMW } opt_kind;

static clpar_optimizer *make_opt(clpar_module *m, opt_kind k, float lr) {
  clpar_optimizer *o;
  if (k == RUN_SGD) {
    clpar_sgd_options so = {.lr = lr, .momentum = 0.9f, .weight_decay = 1e-3f};
    tu_ok(clpar_sgd_create_for(m, &so, &o));
  } else {
    clpar_adam_options ao = {lr, 0.9f, 0.999f, 1e-8f, 1e-2f};
    tu_ok(k == RUN_ADAM ? clpar_adam_create_for(m, &ao, &o) : clpar_adamw_create_for(m, &ao, &o));
  }
  return o;
}

static void train(clpar_module *m, clpar_optimizer *o, int from, int to) {
  clpar_device *dev = clpar_device_get(0);
  for (int t = from; t < to; t++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *target, *y, *loss;
    tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){8, 3}, 1000 + (uint64_t)t, -1, 1, &x));
    tu_ok(clpar_tensor_rand_uniform(dev, 2, (int64_t[]){8, 2}, 5000 + (uint64_t)t, -1, 1, &target));
    tu_ok(clpar_module_forward(m, x, &y));
    tu_ok(clpar_mse_loss(y, target, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(o));
    tu_ok(clpar_optimizer_zero_grad(o));
    clpar_scope_end(sc);
  }
}

/* The weights of a Linear made now: what the parameter generator's state gives. */
static float *next_init(size_t *n) {
  clpar_module *l;
  tu_ok(clpar_linear_create(3, 3, 0, clpar_device_get(0), &l));
  float *v = read_all(l, n);
  clpar_module_free(l);
  return v;
}

/* The model of the resume test; flat: its parameters in one buffer (clpar_module_flatten), so
 * that the optimizer steps the whole group with flat state. */
static clpar_module *make_resume_model(int flat) {
  clpar_module *m = make_seq(clpar_device_get(0));
  if (flat) tu_ok(clpar_module_flatten(m));
  return m;
}

static void test_resume_bit_exact(void **state) {
  (void)state;
  const int N = 5;
  char path[128];
  path_in(path, sizeof path, "train.safetensors");
  for (int flat = 0; flat < 2; flat++)
    for (opt_kind k = RUN_SGD; k <= RUN_ADAMW; k++) {
      clpar_manual_seed(1);
      clpar_module *a = make_resume_model(flat);
      clpar_optimizer *oa = make_opt(a, k, 0.05f);
      train(a, oa, 0, 2 * N);
      size_t na, ni;
      float *va = read_all(a, &na), *ia = next_init(&ni);
      clpar_optimizer_free(oa);
      clpar_module_free(a);

      clpar_manual_seed(1);
      clpar_module *b = make_resume_model(flat);
      clpar_optimizer *ob = make_opt(b, k, 0.05f);
      train(b, ob, 0, N);
      tu_ok(clpar_checkpoint_save(path, b, ob, N, 7));
      clpar_optimizer_free(ob);
      clpar_module_free(b);
      /* a fresh runtime, a model of other weights and an optimizer of another lr */
      clpar_shutdown();
      tu_ok(clpar_init());
      clpar_manual_seed(99);
      clpar_module *c = make_resume_model(flat);
      clpar_optimizer *oc = make_opt(c, k, 0.5f);
      int64_t step = -1, epoch = -1;
      tu_ok(clpar_checkpoint_load(path, c, oc, &step, &epoch));
      assert_int_equal(step, N);
      assert_int_equal(epoch, 7);
      train(c, oc, (int)step, 2 * N);
      size_t nc, nic;
      float *vc = read_all(c, &nc), *ic = next_init(&nic);
      assert_int_equal(na, nc);
      if (memcmp(va, vc, na * sizeof *va) != 0)
        fail_msg("optimizer %d, flat %d: resumed weights differ", k, flat);
      assert_memory_equal(ia, ic, ni * sizeof *ia); /* the generator's state came back too */
      /* a wrong optimizer kind is refused and changes nothing */
      clpar_optimizer *wrong = make_opt(c, k == RUN_SGD ? RUN_ADAM : RUN_SGD, 0.1f);
      assert_int_equal(clpar_checkpoint_load(path, c, wrong, NULL, NULL),
                       CLPAR_ERROR_INVALID_ARGUMENT);
      free(vc);
      vc = read_all(c, &nc);
      if (memcmp(va, vc, na * sizeof *va) != 0) fail_msg("a refused load changed the model");
      clpar_optimizer_free(wrong);
      free(va);
      free(vc);
      free(ia);
      free(ic);
      clpar_optimizer_free(oc);
      clpar_module_free(c);
    }
}

/* A checkpoint whose step count is the largest int64 loads, and the next step is refused
 * naming it, changing nothing (it overflowed the count, undefined, before). */
static void test_step_count_at_its_most(void **state) {
  (void)state;
  char path[128];
  path_in(path, sizeof path, "most.safetensors");
  for (int flat = 0; flat < 2; flat++)
    for (opt_kind k = RUN_SGD; k <= RUN_ADAM; k++) {
      clpar_module *m = make_resume_model(flat);
      clpar_optimizer *o = make_opt(m, k, 0.05f);
      for (int i = 0; i < clpar_module_parameter_count(m); i++)
        clpar_optimizer_restore(o, i, NULL, NULL, INT64_MAX);
      tu_ok(clpar_checkpoint_save(path, m, o, 1, 0));
      clpar_optimizer_free(o);
      o = make_opt(m, k, 0.05f);
      tu_ok(clpar_checkpoint_load(path, m, o, NULL, NULL));
      assert_true(clpar_optimizer_steps_at(o, 0) == INT64_MAX);
      size_t n, n2;
      float *before = read_all(m, &n);
      clpar_scope *sc = clpar_scope_begin();
      clpar_tensor *x, *y, *loss;
      tu_ok(clpar_tensor_rand_uniform(clpar_device_get(0), 2, (int64_t[]){8, 3}, 1, -1, 1, &x));
      tu_ok(clpar_module_forward(m, x, &y));
      tu_ok(clpar_mean(y, &loss));
      tu_ok(clpar_backward(loss));
      assert_int_equal(clpar_optimizer_step(o), CLPAR_ERROR_INVALID_ARGUMENT);
      assert_non_null(strstr(clpar_last_error(), "optimizer.state.0.step"));
      clpar_scope_end(sc);
      float *after = read_all(m, &n2);
      assert_memory_equal(before, after, n * sizeof *before);
      free(before);
      free(after);
      clpar_optimizer_free(o);
      clpar_module_free(m);
    }
}

/* A sharded checkpoint saved and loaded by a process outside any MPI job (a job of one: one
 * shard): resumes bit for bit as the single file does, and consolidates to that file's bytes. */
static void test_sharded_in_one_process(void **state) {
  (void)state;
  char full[128], sharded[128], merged[128];
  path_in(full, sizeof full, "one.ckpt");
  path_in(sharded, sizeof sharded, "one-sharded");
  path_in(merged, sizeof merged, "one-merged.ckpt");
  clpar_manual_seed(1);
  clpar_module *a = make_resume_model(0);
  clpar_optimizer *oa = make_opt(a, RUN_ADAM, 0.05f);
  train(a, oa, 0, 3);
  tu_ok(clpar_checkpoint_save_sharded(sharded, a, oa, 3, 2));
  tu_ok(clpar_checkpoint_save(full, a, oa, 3, 2));
  tu_ok(clpar_checkpoint_consolidate(sharded, merged));
  size_t n;
  float *va = read_all(a, &n);
  clpar_manual_seed(99);
  clpar_module *b = make_resume_model(0);
  clpar_optimizer *ob = make_opt(b, RUN_ADAM, 0.5f);
  int64_t step = -1, epoch = -1;
  tu_ok(clpar_checkpoint_load_sharded(sharded, b, ob, &step, &epoch));
  assert_true(step == 3 && epoch == 2);
  train(a, oa, 3, 6);
  train(b, ob, 3, 6);
  free(va);
  va = read_all(a, &n);
  float *vb = read_all(b, &n);
  if (memcmp(va, vb, n * sizeof *va) != 0) fail_msg("resumed from a sharded checkpoint: differs");
  FILE *f1 = fopen(full, "rb"), *f2 = fopen(merged, "rb");
  assert_non_null(f1);
  assert_non_null(f2);
  for (int c1, c2;;) {
    c1 = fgetc(f1), c2 = fgetc(f2);
    assert_int_equal(c1, c2);
    if (c1 == EOF) break;
  }
  fclose(f1);
  fclose(f2);
  free(va);
  free(vb);
  clpar_optimizer_free(oa);
  clpar_optimizer_free(ob);
  clpar_module_free(a);
  clpar_module_free(b);
}

static int make_dir(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/clpar-ckpt-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  return tu_setup(state);
}

static int remove_dir(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return tu_teardown(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_every_device), cmocka_unit_test(test_pytorch_interop),
      cmocka_unit_test(test_data_parallel_prefix),    cmocka_unit_test(test_strict_and_partial),
      cmocka_unit_test(test_corrupt_files),           cmocka_unit_test(test_save_and_load_errors),
      cmocka_unit_test(test_resume_bit_exact),        cmocka_unit_test(test_step_count_at_its_most),
      cmocka_unit_test(test_sharded_in_one_process),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
