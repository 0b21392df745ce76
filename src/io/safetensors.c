/* safetensors.c — the safetensors container: an 8-byte little-endian header size, a JSON
 * header (Jansson: UTF-8 checked, duplicate keys refused, NUL allowed in metadata values as
 * the reference allows it) and one data block. The header's cost in memory is bounded
 * before Jansson parses it (check_cost). The reader
 * trusts nothing in the file: it makes every check of the reference implementation (header
 * size limit, JSON, known dtypes, offsets contiguous from 0, shapes that match the byte
 * counts without overflow, data covering the file exactly), and a file that fails one is
 * CLPAR_ERROR_CORRUPT naming the fault. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little endian; a big-endian host needs byte swaps here"
#endif

static const struct {
  const char *name;
  size_t size;
} dtypes[CLPAR_ST_DTYPE_COUNT] = {
    [CLPAR_ST_BOOL] = {"BOOL", 1},       [CLPAR_ST_U8] = {"U8", 1},
    [CLPAR_ST_I8] = {"I8", 1},           [CLPAR_ST_F8_E5M2] = {"F8_E5M2", 1},
    [CLPAR_ST_F8_E4M3] = {"F8_E4M3", 1}, [CLPAR_ST_I16] = {"I16", 2},
    [CLPAR_ST_U16] = {"U16", 2},         [CLPAR_ST_F16] = {"F16", 2},
    [CLPAR_ST_BF16] = {"BF16", 2},       [CLPAR_ST_I32] = {"I32", 4},
    [CLPAR_ST_U32] = {"U32", 4},         [CLPAR_ST_F32] = {"F32", 4},
    [CLPAR_ST_F64] = {"F64", 8},         [CLPAR_ST_I64] = {"I64", 8},
    [CLPAR_ST_U64] = {"U64", 8},
};

const char *clpar_st_dtype_name(clpar_st_dtype d) {
  return (unsigned)d < CLPAR_ST_DTYPE_COUNT ? dtypes[d].name : "?";
}

size_t clpar_st_dtype_size(clpar_st_dtype d) {
  return (unsigned)d < CLPAR_ST_DTYPE_COUNT ? dtypes[d].size : 0;
}

static int dtype_from_name(const char *s) {
  for (int i = 0; i < CLPAR_ST_DTYPE_COUNT; i++)
    if (strcmp(s, dtypes[i].name) == 0) return i;
  return -1;
}

void clpar_st_free(clpar_st_file *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) {
    free(f->tensors[i].name);
    free(f->tensors[i].shape);
  }
  for (int i = 0; i < f->n_meta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->tensors);
  free(f->meta_keys);
  free(f->meta_values);
  free(f->meta_lens);
  free(f->buf);
  if (f->path && f->fd >= 0) close(f->fd); /* a file read from a path has both */
  free(f->path);
  memset(f, 0, sizeof *f);
  f->fd = -1;
}

int clpar_st_find(const clpar_st_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return i;
  return -1;
}

const char *clpar_st_meta(const clpar_st_file *f, const char *key) {
  return clpar_st_meta_len(f, key, NULL);
}

const char *clpar_st_meta_len(const clpar_st_file *f, const char *key, size_t *len) {
  for (int i = 0; i < f->n_meta; i++)
    if (strcmp(f->meta_keys[i], key) == 0) {
      if (len) *len = f->meta_lens[i];
      return f->meta_values[i];
    }
  return NULL;
}

#define CORRUPT(...) clpar_set_error(CLPAR_ERROR_CORRUPT, __VA_ARGS__)
#define NOMEM(what) clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what)

/* A non-negative JSON integer (the reference's usize / u64). */
static int get_u64(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
  *out = (uint64_t)json_integer_value(v);
  return 1;
}

static clpar_status parse_metadata(const char *what, json_t *meta, clpar_st_file *f) {
  if (json_is_null(meta)) return CLPAR_OK; /* the reference's Option: null is none */
  if (!json_is_object(meta))
    return CORRUPT("%s: \"__metadata__\" is not an object of strings", what);
  size_t n = json_object_size(meta);
  f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
  f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
  f->meta_lens = calloc(n ? n : 1, sizeof *f->meta_lens);
  if (!f->meta_keys || !f->meta_values || !f->meta_lens) return NOMEM(what);
  const char *key;
  json_t *v;
  json_object_foreach(meta, key, v) {
    char esc[CLPAR_ESC_SIZE];
    if (!json_is_string(v))
      return CORRUPT("%s: metadata \"%s\" is not a string", what, CLPAR_ESC(key, esc));
    /* a value may hold NUL (\u0000): kept whole, with its length */
    size_t len = json_string_length(v);
    char *copy = malloc(len + 1);
    if (copy) {
      memcpy(copy, json_string_value(v), len);
      copy[len] = '\0';
    }
    f->meta_keys[f->n_meta] = strdup(key);
    f->meta_values[f->n_meta] = copy;
    f->meta_lens[f->n_meta] = len;
    f->n_meta++;
    if (!f->meta_keys[f->n_meta - 1] || !copy) return NOMEM(what);
  }
  return CLPAR_OK;
}

/* One tensor's entry: {"dtype": "F32", "shape": [4, 3], "data_offsets": [0, 48]}. Unknown
 * fields are ignored, as the reference's serde does. */
static clpar_status parse_tensor(const char *what, const char *name, json_t *v,
                                 clpar_st_tensor *t) {
  char esc[CLPAR_ESC_SIZE], esc2[CLPAR_ESC_SIZE];
  const char *shown = CLPAR_ESC(name, esc); /* the name in messages */
  if (!json_is_object(v)) return CORRUPT("%s: tensor \"%s\" is not an object", what, shown);
  t->name = strdup(name);
  if (!t->name) return NOMEM(what);
  json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
         *off = json_object_get(v, "data_offsets");
  if (!json_is_string(dt)) return CORRUPT("%s: tensor \"%s\" has no dtype string", what, shown);
  /* a NUL inside the string ("F32\u0000x", allowed by the parse) is no dtype */
  int d = strlen(json_string_value(dt)) == json_string_length(dt)
              ? dtype_from_name(json_string_value(dt))
              : -1;
  if (d < 0)
    return CORRUPT("%s: tensor \"%s\" has unknown dtype \"%s\"", what, shown,
                   CLPAR_ESC(json_string_value(dt), esc2));
  t->dtype = (clpar_st_dtype)d;
  if (!json_is_array(shape)) return CORRUPT("%s: tensor \"%s\" has no shape array", what, shown);
  size_t nd = json_array_size(shape);
  if (nd > 1024) return CORRUPT("%s: tensor \"%s\" has %zu dimensions", what, shown, nd);
  if (nd > 0) {
    t->shape = malloc(nd * sizeof *t->shape);
    if (!t->shape) return NOMEM(what);
  }
  t->ndim = (int)nd;
  for (size_t i = 0; i < nd; i++)
    if (!get_u64(json_array_get(shape, i), &t->shape[i]))
      return CORRUPT("%s: tensor \"%s\": shape entry %zu is not a non-negative integer", what,
                     shown, i);
  if (!json_is_array(off) || json_array_size(off) != 2 ||
      !get_u64(json_array_get(off, 0), &t->begin) || !get_u64(json_array_get(off, 1), &t->end))
    return CORRUPT("%s: tensor \"%s\": data_offsets is not two non-negative integers", what, shown);
  return CLPAR_OK;
}

static int by_offsets(const void *a, const void *b) {
  const clpar_st_tensor *x = *(clpar_st_tensor *const *)a, *y = *(clpar_st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* Metadata::validate: in offset order each tensor starts where the previous one ended (the
 * first at 0), and holds exactly numel * dtype size bytes. Returns the data block's size. */
static clpar_status validate(const char *what, clpar_st_file *f, uint64_t *data_size) {
  clpar_st_tensor **order = malloc((f->n ? (size_t)f->n : 1) * sizeof *order);
  if (!order) return NOMEM(what);
  for (int i = 0; i < f->n; i++) order[i] = &f->tensors[i];
  qsort(order, (size_t)f->n, sizeof *order, by_offsets);
  uint64_t at = 0;
  clpar_status s = CLPAR_OK;
  char esc[CLPAR_ESC_SIZE];
  for (int i = 0; s == CLPAR_OK && i < f->n; i++) {
    clpar_st_tensor *t = order[i];
    if (t->begin != at || t->end < t->begin) {
      s = t->begin < at ? CORRUPT(
                              "%s: tensor \"%s\" [%llu, %llu) overlaps the tensor before "
                              "it, which ends at %llu",
                              what, CLPAR_ESC(t->name, esc), (unsigned long long)t->begin,
                              (unsigned long long)t->end, (unsigned long long)at)
          : t->begin > at
              ? CORRUPT(
                    "%s: a gap in the data: tensor \"%s\" starts at %llu, the data before "
                    "it ends at %llu",
                    what, CLPAR_ESC(t->name, esc), (unsigned long long)t->begin,
                    (unsigned long long)at)
              : CORRUPT("%s: tensor \"%s\" ends (%llu) before it begins (%llu)", what,
                        CLPAR_ESC(t->name, esc), (unsigned long long)t->end,
                        (unsigned long long)t->begin);
      break;
    }
    uint64_t bytes = clpar_st_dtype_size(t->dtype);
    int overflow = 0;
    for (int k = 0; k < t->ndim; k++)
      overflow |= __builtin_mul_overflow(bytes, t->shape[k], &bytes);
    if (overflow)
      s = CORRUPT("%s: tensor \"%s\": its shape's byte count overflows 64 bits", what,
                  CLPAR_ESC(t->name, esc));
    else if (bytes != t->end - t->begin)
      s = CORRUPT("%s: tensor \"%s\": %s of its shape is %llu bytes but data_offsets give %llu",
                  what, CLPAR_ESC(t->name, esc), clpar_st_dtype_name(t->dtype),
                  (unsigned long long)bytes, (unsigned long long)(t->end - t->begin));
    at = t->end;
  }
  free(order);
  *data_size = at;
  return s;
}

static clpar_status parse_header(const char *what, json_t *root, clpar_st_file *f) {
  if (!json_is_object(root)) return CORRUPT("%s: the header is not a JSON object", what);
  size_t n = json_object_size(root);
  f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
  if (!f->tensors) return NOMEM(what);
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    clpar_status s;
    if (strcmp(key, "__metadata__") == 0) {
      s = parse_metadata(what, v, f);
    } else {
      s = parse_tensor(what, key, v, &f->tensors[f->n]);
      f->n++; /* counted before its checks: clpar_st_free frees what it got */
    }
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

/* The checks on the first 8 bytes: the header's size hn, within the limit and the file. */
static clpar_status check_size(const char *what, const uint8_t *first8, uint64_t size,
                               uint64_t *hn) {
  if (size < 8)
    return CORRUPT("%s: %llu bytes, too short for the 8-byte header size", what,
                   (unsigned long long)size);
  memcpy(hn, first8, 8); /* little endian (checked above) */
  if (*hn > CLPAR_ST_MAX_HEADER)
    return CORRUPT("%s: header of %llu bytes, over the format's limit of %u", what,
                   (unsigned long long)*hn, CLPAR_ST_MAX_HEADER);
  if (*hn > size - 8)
    return CORRUPT("%s: header of %llu bytes runs past the end of the file (%llu bytes)", what,
                   (unsigned long long)*hn, (unsigned long long)size);
  return CLPAR_OK;
}

/* Jansson holds some 60 bytes per value it parses, 20-25 times the text of a header of small
 * entries: a 100 MB header (the format's limit) of empty tensors would take 2.5 GB. So the
 * header's tokens are counted first, in one pass that allocates nothing, against a budget
 * that grows with the tensor data the file holds: ST_BASE_TOKENS for any file (about 14,000
 * tensor entries, some 15 MB parsed), and one more token per ST_BYTES_PER_TOKEN bytes of data
 * (a tensor of 100 floats and its entry of about 18 tokens fit many times over). */
enum { ST_BASE_TOKENS = 1 << 18, ST_BYTES_PER_TOKEN = 16, ST_MAX_DEPTH = 64 };

/* The tokens of the header's JSON that cost memory when parsed (every '{', '[', string, ':'
 * and ','; numbers and literals are bounded by the separators), and its deepest nesting. */
static uint64_t count_tokens(const uint8_t *h, uint64_t n, int *depth) {
  uint64_t tokens = 0;
  int d = 0;
  *depth = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint8_t c = h[i];
    if (c == '"') {
      tokens++;
      for (i++; i < n && h[i] != '"'; i++)
        if (h[i] == '\\') i++;
    } else if (c == '{' || c == '[') {
      tokens++;
      if (++d > *depth) *depth = d;
    } else if (c == '}' || c == ']') {
      d--;
    } else if (c == ':' || c == ',') {
      tokens++;
    }
  }
  return tokens;
}

static clpar_status check_cost(const char *what, const uint8_t *header, uint64_t hn,
                               uint64_t data_bytes) {
  int depth;
  uint64_t tokens = count_tokens(header, hn, &depth);
  uint64_t budget = ST_BASE_TOKENS + data_bytes / ST_BYTES_PER_TOKEN;
  if (depth > ST_MAX_DEPTH)
    return CORRUPT("%s: the header nests %d levels deep, more than the %d allowed", what, depth,
                   ST_MAX_DEPTH);
  if (tokens > budget)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                           "%s: the header has %llu JSON tokens (values, keys and separators), "
                           "more than the %llu allowed for %llu bytes of tensor data (%d, and "
                           "one per %d bytes of data); refused before it is parsed",
                           what, (unsigned long long)tokens, (unsigned long long)budget,
                           (unsigned long long)data_bytes, ST_BASE_TOKENS, ST_BYTES_PER_TOKEN);
  return CLPAR_OK;
}

/* The header's hn bytes, of a file of size bytes: the JSON, the entries, their offsets, and
 * the data block covering the rest of the file exactly. On error f is emptied. */
static clpar_status parse_json(const char *what, const uint8_t *header, uint64_t hn, uint64_t size,
                               clpar_st_file *f) {
  if (hn == 0 || header[0] != '{') return CORRUPT("%s: the header does not start with '{'", what);
  clpar_status cs = check_cost(what, header, hn, size - 8 - hn);
  if (cs != CLPAR_OK) return cs;
  json_error_t err;
  json_t *root =
      json_loadb((const char *)header, (size_t)hn, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
  char esc[CLPAR_ESC_SIZE];
  if (!root)
    return CORRUPT("%s: the header is not valid JSON (UTF-8): %s at byte %d", what,
                   CLPAR_ESC(err.text, esc), err.position);
  uint64_t data_size = 0;
  clpar_status s = parse_header(what, root, f);
  json_decref(root);
  if (s == CLPAR_OK) s = validate(what, f, &data_size);
  if (s == CLPAR_OK && data_size != size - 8 - hn)
    s = CORRUPT(
        "%s: the tensors cover %llu bytes of data but the file has %llu after the "
        "header",
        what, (unsigned long long)data_size, (unsigned long long)(size - 8 - hn));
  if (s != CLPAR_OK) {
    clpar_st_free(f);
    return s;
  }
  f->data_start = 8 + hn;
  f->size = size;
  return CLPAR_OK;
}

clpar_status clpar_st_parse(const char *what, uint8_t *buf, size_t size, clpar_st_file *f) {
  if (!f || (!buf && size > 0))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_st_parse: NULL argument");
  memset(f, 0, sizeof *f);
  f->fd = -1;
  uint64_t hn = 0;
  clpar_status s = check_size(what, buf, size, &hn);
  if (s == CLPAR_OK) s = parse_json(what, buf + 8, hn, size, f);
  if (s != CLPAR_OK) return s;
  for (int i = 0; i < f->n; i++) f->tensors[i].data = buf + 8 + hn + f->tensors[i].begin;
  f->buf = buf;
  return CLPAR_OK;
}

/* n bytes at offset of fd; CLPAR_ERROR_IO when the file is shorter (it changed). */
static clpar_status read_at(int fd, const char *path, void *dst, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (uint8_t *)dst + got, n - got, (off_t)(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return clpar_set_error(CLPAR_ERROR_IO, "%s: read failed: %s", path, strerror(errno));
    if (r == 0)
      return clpar_set_error(CLPAR_ERROR_IO, "%s: shorter than when it was opened; it changed",
                             path);
    got += (size_t)r;
  }
  return CLPAR_OK;
}

clpar_status clpar_st_read(const char *path, clpar_st_file *f) {
  if (!path || !f)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "safetensors read: NULL argument");
  memset(f, 0, sizeof *f);
  f->fd = -1;
  int fd;
  int64_t file_size;
  clpar_status s = clpar_open_regular(path, &fd, &file_size);
  if (s != CLPAR_OK) return s;
  uint64_t size = (uint64_t)file_size, hn = 0;
  uint8_t first8[8] = {0}, *header = NULL;
  if (s == CLPAR_OK && size >= 8) s = read_at(fd, path, first8, 8, 0);
  if (s == CLPAR_OK) s = check_size(path, first8, size, &hn);
  if (s == CLPAR_OK && !(header = malloc((size_t)hn + 1))) s = NOMEM(path);
  if (s == CLPAR_OK) s = read_at(fd, path, header, (size_t)hn, 8);
  if (s == CLPAR_OK) s = parse_json(path, header, hn, size, f);
  free(header);
  if (s == CLPAR_OK && !(f->path = strdup(path))) {
    clpar_st_free(f);
    s = NOMEM(path);
  }
  if (s != CLPAR_OK) {
    close(fd);
    return s;
  }
  f->fd = fd;
  return CLPAR_OK;
}

clpar_status clpar_st_tensor_read(const clpar_st_file *f, int i, void *dst) {
  const clpar_st_tensor *t = &f->tensors[i];
  return clpar_st_tensor_read_part(f, i, 0, dst, (size_t)(t->end - t->begin));
}

clpar_status clpar_st_tensor_read_part(const clpar_st_file *f, int i, uint64_t at, void *dst,
                                       size_t n) {
  const clpar_st_tensor *t = &f->tensors[i];
  char esc[CLPAR_ESC_SIZE];
  if (at > t->end - t->begin || n > t->end - t->begin - at)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "safetensors read: bytes [%llu, +%zu) outside tensor \"%s\"",
                           (unsigned long long)at, n, CLPAR_ESC(t->name, esc));
  if (f->sources)
    return clpar_st_tensor_read_part(f->sources[i].file, f->sources[i].index, at, dst, n);
  if (f->buf) {
    memcpy(dst, t->data + at, n);
    return CLPAR_OK;
  }
  return read_at(f->fd, f->path, dst, n, f->data_start + t->begin + at);
}

/* ---- writing ---- */

static int by_dtype_then_name(const void *a, const void *b) {
  const clpar_st_entry *x = *(const clpar_st_entry *const *)a,
                       *y = *(const clpar_st_entry *const *)b;
  if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
  return strcmp(x->name, y->name);
}

static uint64_t entry_bytes(const clpar_st_entry *e) {
  uint64_t b = clpar_st_dtype_size(e->dtype);
  for (int k = 0; k < e->ndim; k++) b *= (uint64_t)e->shape[k];
  return b;
}

/* The JSON header of the sorted entries, padded with spaces to a multiple of 8. */
static clpar_status build_header(const char *path, const clpar_st_entry *const *order, int n,
                                 const char *const *keys, const char *const *values, int n_meta,
                                 char **out, size_t *out_len) {
  json_t *root = json_object();
  int bad = !root;
  if (!bad && n_meta > 0) {
    json_t *meta = json_object();
    bad = json_object_set_new(root, "__metadata__", meta) != 0;
    for (int i = 0; !bad && i < n_meta; i++)
      bad = json_object_set_new(meta, keys[i], json_string(values[i])) != 0;
    if (!bad && json_object_size(meta) != (size_t)n_meta) {
      json_decref(root);
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: a metadata key is given twice",
                             path);
    }
  }
  uint64_t at = 0;
  for (int i = 0; !bad && i < n; i++) {
    const clpar_st_entry *e = order[i];
    json_t *shape = json_array(), *t = json_object();
    uint64_t end = at + entry_bytes(e);
    bad = json_object_set_new(root, e->name, t) != 0 ||
          json_object_set_new(t, "dtype", json_string(clpar_st_dtype_name(e->dtype))) != 0 ||
          json_object_set_new(t, "shape", shape) != 0;
    for (int k = 0; !bad && k < e->ndim; k++)
      bad = json_array_append_new(shape, json_integer(e->shape[k])) != 0;
    json_t *off = bad ? NULL : json_array();
    bad = bad || json_object_set_new(t, "data_offsets", off) != 0 ||
          json_array_append_new(off, json_integer((json_int_t)at)) != 0 ||
          json_array_append_new(off, json_integer((json_int_t)end)) != 0;
    at = end;
  }
  if (!bad && json_object_size(root) != (size_t)n + (n_meta > 0)) {
    json_decref(root);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: two tensors have the same name",
                           path);
  }
  char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!text)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: cannot make the header (out of memory, or a name or metadata "
                           "string that is not UTF-8)",
                           path);
  size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
  char *h = realloc(text, padded + 1);
  if (!h) {
    free(text);
    return NOMEM(path);
  }
  memset(h + len, ' ', padded - len);
  *out = h;
  *out_len = padded;
  return CLPAR_OK;
}

/* The parts of a file: the 8-byte size, the header, then each tensor in order. */
typedef struct {
  const clpar_st_entry **order;
  uint64_t hsize;
  const char *header;
  void *buf; /* for the entries that fill */
} write_parts;

static clpar_status next_part(void *user, int i, const void **data, size_t *size) {
  write_parts *w = user;
  if (i < 2) {
    *data = i == 0 ? (const void *)&w->hsize : (const void *)w->header;
    *size = i == 0 ? 8 : (size_t)w->hsize;
    return CLPAR_OK;
  }
  const clpar_st_entry *e = w->order[i - 2];
  *size = (size_t)entry_bytes(e);
  if (e->data) {
    *data = e->data;
    return CLPAR_OK;
  }
  *data = w->buf;
  return e->fill(e->src, w->buf, *size);
}

clpar_status clpar_st_write(const char *path, const clpar_st_entry *entries, int n,
                            const char *const *keys, const char *const *values, int n_meta) {
  if (!path || n < 0 || (n > 0 && !entries) || n_meta < 0 || (n_meta > 0 && (!keys || !values)))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "safetensors write: bad arguments");
  for (int i = 0; i < n_meta; i++)
    if (!keys[i] || !values[i] || strcmp(keys[i], "__metadata__") == 0)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: metadata pair %d is NULL or named \"__metadata__\"", path, i);
  write_parts w = {0};
  w.order = malloc((n ? (size_t)n : 1) * sizeof *w.order);
  clpar_status s = w.order ? CLPAR_OK : NOMEM(path);
  uint64_t data_bytes = 0, most = 1;
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    const clpar_st_entry *e = &entries[i];
    w.order[i] = e;
    if (!e->name || strcmp(e->name, "__metadata__") == 0 ||
        (unsigned)e->dtype >= CLPAR_ST_DTYPE_COUNT || (!e->data && !e->fill))
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                          "%s: entry %d has a bad name or dtype, or no data", path, i);
    data_bytes += entry_bytes(e);
    if (!e->data && entry_bytes(e) > most) most = entry_bytes(e);
  }
  if (s == CLPAR_OK && most > SIZE_MAX) s = NOMEM(path);
  if (s == CLPAR_OK && !(w.buf = malloc((size_t)most))) s = NOMEM(path);
  if (s == CLPAR_OK) qsort(w.order, (size_t)n, sizeof *w.order, by_dtype_then_name);
  char *header = NULL;
  size_t hlen = 0;
  if (s == CLPAR_OK) s = build_header(path, w.order, n, keys, values, n_meta, &header, &hlen);
  if (s == CLPAR_OK) {
    w.hsize = hlen; /* little endian (checked above) */
    w.header = header;
    s = clpar_file_write_atomic(path, n + 2, 8 + hlen + data_bytes, next_part, &w);
  }
  free(header);
  free(w.buf);
  free(w.order);
  return s;
}
