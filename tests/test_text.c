/* test_text.c — the character-level corpus (include/clpar/text.h): the shipped Shakespeare
 * corpus loads, the tokenizer round-trips, and the window loader is reproducible from its
 * seed, gives x and y shifted by one, and keeps train and validation windows apart. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifndef CLPAR_DATA_DIR
#error "CLPAR_DATA_DIR must name the repository's data directory"
#endif

static clpar_text *corpus(void) {
  clpar_text *t;
  tu_ok(clpar_text_load(CLPAR_DATA_DIR "/shakespeare.txt.gz", 0, &t));
  return t;
}

static void test_corpus_and_round_trip(void **state) {
  (void)state;
  clpar_text *t = corpus();
  int64_t n = clpar_text_length(t);
  assert_int_equal(n, 1158233); /* data/README.md */
  assert_int_equal(clpar_text_vocab_size(t), 73);
  char *text = malloc((size_t)n + 1);
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  assert_non_null(text);
  assert_non_null(ids);
  tu_ok(clpar_text_decode(t, clpar_text_tokens(t), (size_t)n, text));
  assert_int_equal(strncmp(text, "HAMLET, PRINCE OF DENMARK\n", 26), 0);
  assert_int_equal(strlen(text), (size_t)n);
  tu_ok(clpar_text_encode(t, text, (size_t)n, ids));
  assert_memory_equal(ids, clpar_text_tokens(t), (size_t)n * sizeof *ids);
  /* the ids are the ranks of the bytes: '\n' first, then ' ', 'A' before 'a' */
  int32_t nl, sp, big, small;
  tu_ok(clpar_text_encode(t, "\n", 1, &nl));
  tu_ok(clpar_text_encode(t, " ", 1, &sp));
  tu_ok(clpar_text_encode(t, "A", 1, &big));
  tu_ok(clpar_text_encode(t, "a", 1, &small));
  assert_int_equal(nl, 0);
  assert_int_equal(sp, 1);
  assert_true(big < small);
  /* a byte outside the vocabulary, an id outside it */
  assert_int_equal(clpar_text_encode(t, "ok~", 3, ids), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "byte 2"));
  int32_t bad[2] = {0, 73};
  assert_int_equal(clpar_text_decode(t, bad, 2, text), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "ids[1]"));
  free(text);
  free(ids);
  clpar_text_free(t);
}

static void test_from_memory(void **state) {
  (void)state;
  clpar_text *t;
  tu_ok(clpar_text_from_memory("hello", 5, &t));
  assert_int_equal(clpar_text_vocab_size(t), 4); /* e h l o */
  const int32_t want[5] = {1, 0, 2, 2, 3};
  assert_memory_equal(clpar_text_tokens(t), want, sizeof want);
  char out[6];
  tu_ok(clpar_text_decode(t, want, 5, out));
  assert_string_equal(out, "hello");
  clpar_text_free(t);
  assert_int_equal(clpar_text_from_memory("x", 1, &t), CLPAR_ERROR_EMPTY);
  assert_int_equal(clpar_text_load(CLPAR_DATA_DIR "/no-such-file", 0, &t), CLPAR_ERROR_IO);
  assert_int_equal(clpar_text_load(CLPAR_DATA_DIR "/shakespeare.txt.gz", 1000, &t),
                   CLPAR_ERROR_TOO_LARGE);
}

enum { B = 4, T = 16, BATCHES = 300 };

/* The starts of the next batch, checking that x and y are the corpus at them, shifted. */
static void next_checked(clpar_text_loader *l, const clpar_text *t, int64_t *starts) {
  clpar_tensor *x, *y;
  tu_ok(clpar_text_loader_next(l, &x, &y, starts));
  assert_int_equal(clpar_tensor_dtype(x), CLPAR_INT32);
  assert_int_equal(clpar_tensor_dim(x, 0), B);
  assert_int_equal(clpar_tensor_dim(y, 1), T);
  int32_t xs[B * T], ys[B * T];
  tu_ok(clpar_tensor_read_raw(x, xs, sizeof xs));
  tu_ok(clpar_tensor_read_raw(y, ys, sizeof ys));
  const int32_t *tok = clpar_text_tokens(t);
  for (int b = 0; b < B; b++) {
    assert_memory_equal(xs + b * T, tok + starts[b], T * sizeof(int32_t));
    assert_memory_equal(ys + b * T, tok + starts[b] + 1, T * sizeof(int32_t));
  }
  clpar_tensor_free(x);
  clpar_tensor_free(y);
}

static void test_loader(void **state) {
  (void)state;
  clpar_text *t = corpus();
  int64_t n = clpar_text_length(t), cut = (int64_t)((double)n * 0.9);
  clpar_device *dev = clpar_device_get(0);
  clpar_text_loader_options o = {.block_size = T, .batch_size = B, .seed = 1337};
  clpar_text_loader *a, *b, *c, *val;
  tu_ok(clpar_text_loader_create(t, CLPAR_TEXT_TRAIN, dev, &o, &a));
  tu_ok(clpar_text_loader_create(t, CLPAR_TEXT_TRAIN, tu_host(), &o, &b));
  tu_ok(clpar_text_loader_create(t, CLPAR_TEXT_VAL, dev, &o, &val));
  o.seed = 1338;
  tu_ok(clpar_text_loader_create(t, CLPAR_TEXT_TRAIN, dev, &o, &c));
  assert_int_equal(clpar_text_loader_part_start(a), 0);
  assert_int_equal(clpar_text_loader_part_length(a), cut);
  assert_int_equal(clpar_text_loader_part_start(val), cut);
  assert_int_equal(clpar_text_loader_part_length(val), n - cut);
  int64_t sa[B], sb[B], sc[B], sv[B], first[B];
  int differ = 0;
  for (int k = 0; k < BATCHES; k++) {
    next_checked(a, t, sa);
    next_checked(b, t, sb);
    next_checked(c, t, sc);
    next_checked(val, t, sv);
    if (k == 0) memcpy(first, sa, sizeof first);
    assert_memory_equal(sa, sb, sizeof sa); /* the same seed: the same windows anywhere */
    differ += memcmp(sa, sc, sizeof sa) != 0;
    for (int i = 0; i < B; i++) { /* train windows end before the validation part begins */
      assert_true(sa[i] >= 0 && sa[i] + T + 1 <= cut);
      assert_true(sv[i] >= cut && sv[i] + T + 1 <= n);
    }
  }
  assert_true(differ > BATCHES / 2); /* another seed, other windows */
  assert_int_equal(clpar_text_loader_position(a), BATCHES);
  tu_ok(clpar_text_loader_set_position(a, 0)); /* a resumed run sees the same batches */
  next_checked(a, t, sa);
  assert_memory_equal(sa, first, sizeof sa);
  clpar_text_loader_free(a);
  clpar_text_loader_free(b);
  clpar_text_loader_free(c);
  clpar_text_loader_free(val);
  /* a window that does not fit the validation part */
  o.block_size = n - cut;
  assert_int_equal(clpar_text_loader_create(t, CLPAR_TEXT_VAL, dev, &o, &a), CLPAR_ERROR_EMPTY);
  assert_non_null(strstr(clpar_last_error(), "validation"));
  clpar_text_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_corpus_and_round_trip),
      cmocka_unit_test(test_from_memory),
      cmocka_unit_test(test_loader),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
