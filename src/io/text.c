/* text.c — a character-level corpus (include/clpar/text.h): the text read whole through zlib
 * (which reads a plain file unchanged), its byte vocabulary, and a loader of random windows.
 * The window starts come from splitmix64 over (seed, batch, row), so they depend on nothing
 * but the loader's options and the batch's index. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "internal.h"

struct clpar_text {
  int64_t length;
  int32_t *tokens;
  int vocab;
  unsigned char bytes[256]; /* id -> byte */
  int16_t id_of[256];       /* byte -> id, -1 when absent */
};

struct clpar_text_loader {
  const clpar_text *text;
  clpar_device *dev;
  int64_t start, length; /* the part, in tokens of the corpus */
  int64_t block, batch;
  uint64_t seed;
  int64_t position;
  int32_t *host; /* the batch's x rows, then its y rows: 2 * batch * block tokens */
};

/* Builds t from data (len bytes): the vocabulary, then the tokens. */
static clpar_status build(const char *fn, const unsigned char *data, size_t len, clpar_text **out) {
  if (len < 2)
    return clpar_set_error(CLPAR_ERROR_EMPTY, "%s: the text has %zu bytes; need at least 2", fn,
                           len);
  clpar_text *t = calloc(1, sizeof *t);
  int32_t *tokens = malloc(len * sizeof *tokens);
  if (!t || !tokens) {
    free(t);
    free(tokens);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory for %zu bytes", fn,
                           len);
  }
  int seen[256] = {0};
  for (size_t i = 0; i < len; i++) seen[data[i]] = 1;
  for (int b = 0; b < 256; b++) {
    t->id_of[b] = (int16_t)(seen[b] ? t->vocab : -1);
    if (seen[b]) t->bytes[t->vocab++] = (unsigned char)b;
  }
  for (size_t i = 0; i < len; i++) tokens[i] = t->id_of[data[i]];
  t->tokens = tokens;
  t->length = (int64_t)len;
  *out = t;
  return CLPAR_OK;
}

clpar_status clpar_text_from_memory(const char *data, size_t len, clpar_text **out) {
  if (!data || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_text_from_memory: data and out are needed");
  return build("clpar_text_from_memory", (const unsigned char *)data, len, out);
}

/* Reads all of g (at most max bytes) into *buf, *len. */
static clpar_status read_all(const char *path, gzFile g, int64_t max, unsigned char **buf,
                             size_t *len) {
  size_t cap = 1 << 16, n = 0;
  unsigned char *b = malloc(cap);
  clpar_status s =
      b ? CLPAR_OK : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
  while (s == CLPAR_OK) {
    if (cap - n < (1 << 15)) {
      unsigned char *more = cap < SIZE_MAX / 2 ? realloc(b, cap * 2) : NULL;
      if (!more) {
        s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory at %zu bytes", path,
                            n);
        break;
      }
      b = more;
      cap *= 2;
    }
    int got = gzread(g, b + n, 1 << 15);
    int code = Z_OK;
    const char *msg = got < 0 ? gzerror(g, &code) : NULL;
    if (got < 0)
      s = clpar_set_error(code == Z_ERRNO ? CLPAR_ERROR_IO : CLPAR_ERROR_CORRUPT,
                          "%s: read failed after %zu bytes of text: %s", path, n,
                          code == Z_ERRNO ? strerror(errno) : msg);
    if (got <= 0) break;
    n += (size_t)got;
    if ((uint64_t)n > (uint64_t)max)
      s = clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                          "%s: the text (decompressed) is longer than the %lld bytes allowed "
                          "(max_bytes); refused at %zu bytes",
                          path, (long long)max, n);
  }
  if (s != CLPAR_OK) {
    free(b);
    return s;
  }
  *buf = b;
  *len = n;
  return CLPAR_OK;
}

clpar_status clpar_text_load(const char *path, int64_t max_bytes, clpar_text **out) {
  const char *fn = "clpar_text_load";
  if (!path || !out || max_bytes < 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: path and out are needed and max_bytes >= 0 (got %lld)", fn,
                           (long long)max_bytes);
  int fd;
  int64_t size;
  clpar_status s = clpar_open_regular(path, &fd, &size);
  if (s != CLPAR_OK) return s;
  gzFile g = gzdopen(fd, "rb");
  if (!g) {
    close(fd);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: %s: out of host memory", fn, path);
  }
  unsigned char *buf = NULL;
  size_t len = 0;
  s = read_all(path, g, max_bytes ? max_bytes : CLPAR_TEXT_MAX_BYTES_DEFAULT, &buf, &len);
  int code = Z_OK;
  const char *msg = gzerror(g, &code);
  if (s == CLPAR_OK && code != Z_OK)
    s = clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: bad gzip data after %zu bytes of text: %s", path,
                        len, msg);
  gzclose(g);
  if (s == CLPAR_OK) {
    s = build(fn, buf, len, out);
    if (s != CLPAR_OK) clpar_prefix_error("%s: ", path);
  }
  free(buf);
  return s;
}

void clpar_text_free(clpar_text *t) {
  if (!t) return;
  free(t->tokens);
  free(t);
}

int clpar_text_vocab_size(const clpar_text *t) {
  return t ? t->vocab : 0;
}

int64_t clpar_text_length(const clpar_text *t) {
  return t ? t->length : 0;
}

const int32_t *clpar_text_tokens(const clpar_text *t) {
  return t ? t->tokens : NULL;
}

clpar_status clpar_text_encode(const clpar_text *t, const char *s, size_t len, int32_t *ids) {
  if (!t || (len && (!s || !ids)))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_text_encode: the text, s and ids are needed");
  for (size_t i = 0; i < len; i++) {
    int id = t->id_of[(unsigned char)s[i]];
    if (id < 0)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "clpar_text_encode: byte %zu (0x%02x) is not in the vocabulary", i,
                             (unsigned char)s[i]);
    ids[i] = id;
  }
  return CLPAR_OK;
}

clpar_status clpar_text_decode(const clpar_text *t, const int32_t *ids, size_t n, char *out) {
  if (!t || !out || (n && !ids))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_text_decode: the text, ids and out are needed");
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->vocab) {
      out[i] = '\0';
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "clpar_text_decode: ids[%zu] is %d; the vocabulary has ids 0 to %d", i,
                             ids[i], t->vocab - 1);
    }
    out[i] = (char)t->bytes[ids[i]];
  }
  out[n] = '\0';
  return CLPAR_OK;
}

/* splitmix64's output function over x. */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A start uniform in [0, n) for row b of batch k (rejection sampling: no modulo bias). */
static int64_t draw(uint64_t seed, int64_t k, int64_t b, int64_t n) {
  uint64_t un = (uint64_t)n, limit = UINT64_MAX - UINT64_MAX % un;
  uint64_t key = mix(mix(seed) + mix((uint64_t)k)) + (uint64_t)b * 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0;; i++) {
    uint64_t r = mix(key + i * 0xd1342543de82ef95ull);
    if (r < limit) return (int64_t)(r % un);
  }
}

/* The options with their defaults, checked. */
static clpar_status resolve(const clpar_text_loader_options *opt, clpar_text_loader_options *r) {
  const char *fn = "clpar_text_loader_create";
  *r = opt ? *opt : (clpar_text_loader_options){0};
  if (r->block_size == 0) r->block_size = 64;
  if (r->batch_size == 0) r->batch_size = 12;
  if (r->train_fraction == 0.0) r->train_fraction = 0.9;
  if (r->block_size < 1 || r->batch_size < 1 || r->block_size > INT32_MAX ||
      r->batch_size > INT32_MAX)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: options.block_size is %lld and batch_size %lld; each must be in 1 "
                           "to 2^31 - 1",
                           fn, (long long)r->block_size, (long long)r->batch_size);
  if (!(r->train_fraction > 0.0 && r->train_fraction < 1.0))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: options.train_fraction is %g; it must be in (0, 1)", fn,
                           r->train_fraction);
  return CLPAR_OK;
}

clpar_status clpar_text_loader_create(const clpar_text *t, clpar_text_split split,
                                      clpar_device *dev, const clpar_text_loader_options *opt,
                                      clpar_text_loader **out) {
  const char *fn = "clpar_text_loader_create";
  if (!t || !dev || !out || (split != CLPAR_TEXT_TRAIN && split != CLPAR_TEXT_VAL))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: the text, the device and out are needed, and split TRAIN or VAL",
                           fn);
  clpar_text_loader_options r;
  clpar_status s = resolve(opt, &r);
  if (s != CLPAR_OK) return s;
  int64_t cut = (int64_t)((double)t->length * r.train_fraction);
  int64_t start = split == CLPAR_TEXT_TRAIN ? 0 : cut;
  int64_t length = split == CLPAR_TEXT_TRAIN ? cut : t->length - cut;
  if (length < r.block_size + 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY,
                           "%s: the %s part has %lld tokens; a window of block_size + 1 = %lld "
                           "does not fit",
                           fn, split == CLPAR_TEXT_TRAIN ? "train" : "validation",
                           (long long)length, (long long)r.block_size + 1);
  if (r.batch_size > INT64_MAX / 8 / r.block_size)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: batch_size * block_size is too large", fn);
  clpar_text_loader *l = calloc(1, sizeof *l);
  int32_t *host = malloc((size_t)(2 * r.batch_size * r.block_size) * sizeof *host);
  if (!l || !host) {
    free(l);
    free(host);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  *l = (clpar_text_loader){t, dev, start, length, r.block_size, r.batch_size, r.seed, 0, host};
  *out = l;
  return CLPAR_OK;
}

clpar_status clpar_text_loader_next(clpar_text_loader *l, clpar_tensor **x, clpar_tensor **y,
                                    int64_t *starts) {
  if (!l || !x || !y)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_text_loader_next: the loader, x and y are needed");
  int64_t T = l->block, B = l->batch;
  int32_t *xs = l->host, *ys = l->host + B * T; /* x rows, then y rows */
  for (int64_t b = 0; b < B; b++) {
    int64_t at = l->start + draw(l->seed, l->position, b, l->length - T);
    if (starts) starts[b] = at;
    memcpy(xs + b * T, l->text->tokens + at, (size_t)T * sizeof *xs);
    memcpy(ys + b * T, l->text->tokens + at + 1, (size_t)T * sizeof *ys);
  }
  int64_t shape[2] = {B, T};
  clpar_tensor *tx = NULL, *ty = NULL;
  clpar_status s = clpar_tensor_from_host_dtype(l->dev, CLPAR_INT32, 2, shape, xs, &tx);
  if (s == CLPAR_OK) s = clpar_tensor_from_host_dtype(l->dev, CLPAR_INT32, 2, shape, ys, &ty);
  if (s != CLPAR_OK) {
    clpar_tensor_free(tx);
    return s;
  }
  l->position++;
  *x = tx;
  *y = ty;
  return CLPAR_OK;
}

int64_t clpar_text_loader_position(const clpar_text_loader *l) {
  return l ? l->position : -1;
}

clpar_status clpar_text_loader_set_position(clpar_text_loader *l, int64_t batch) {
  if (!l || batch < 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_text_loader_set_position: loader %s, batch %lld (must be >= 0)",
                           l ? "given" : "NULL", (long long)batch);
  l->position = batch;
  return CLPAR_OK;
}

int64_t clpar_text_loader_part_start(const clpar_text_loader *l) {
  return l ? l->start : -1;
}

int64_t clpar_text_loader_part_length(const clpar_text_loader *l) {
  return l ? l->length : -1;
}

void clpar_text_loader_free(clpar_text_loader *l) {
  if (!l) return;
  free(l->host);
  free(l);
}
