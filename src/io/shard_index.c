/* shard_index.c — reading a sharded checkpoint (src/io/checkpoint_sharded.c writes it) back as
 * one safetensors file, checked whole before anything uses it: the index is JSON of bounded
 * size in Hugging Face's layout; every file it names is a plain name inside the directory, a
 * valid safetensors file (src/io/safetensors.c's checks), of the same save (metadata
 * "shard.id") and with the same metadata as the index (but the generator's state, each
 * rank's own); every tensor of the index is in the file it names and no file holds another;
 * the sizes add up to total_size. The view (a clpar_st_file whose tensors are read from the
 * shards, one at a time) is what clpar_checkpoint_save writes: the index's metadata (less
 * total_size and the "shard." keys), then "checksums" and each tensor's "crc32.<name>" in
 * the index's order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "io/checkpoint_internal.h"

#define INDEX_MAX (64u << 20) /* bytes of JSON an index may hold */
#define CORRUPT(...) clpar_set_error(CLPAR_ERROR_CORRUPT, __VA_ARGS__)
#define NOMEM(what) clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what)

typedef struct {
  const char *dir;
  char path[4200]; /* the index, for messages */
  json_t *root, *meta, *map;
  int n_files;
  const char **names; /* the distinct files, in the order the index first names them */
  clpar_st_file *files;
  uint64_t total;
} shard_set;

static void shard_set_free(shard_set *x) {
  for (int i = 0; x->files && i < x->n_files; i++) clpar_st_free(&x->files[i]);
  free(x->files);
  free(x->names);
  json_decref(x->root);
}

/* The index's JSON, at most INDEX_MAX bytes, from a regular file. */
static clpar_status load_json(shard_set *x) {
  int fd;
  int64_t size;
  clpar_status s = clpar_open_regular(x->path, &fd, &size);
  if (s != CLPAR_OK) return s;
  char *buf = size <= INDEX_MAX ? malloc((size_t)size + 1) : NULL;
  if (size > INDEX_MAX)
    s = clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: %lld bytes, more than an index may hold (%u)",
                        x->path, (long long)size, INDEX_MAX);
  else if (!buf)
    s = NOMEM(x->path);
  int64_t got = 0;
  while (s == CLPAR_OK && got < size) {
    ssize_t r = read(fd, buf + got, (size_t)(size - got));
    if (r <= 0) s = clpar_set_error(CLPAR_ERROR_IO, "%s: read failed or file shrank", x->path);
    got += r > 0 ? r : 0;
  }
  close(fd);
  json_error_t err;
  if (s == CLPAR_OK && !(x->root = json_loadb(buf, (size_t)size, JSON_REJECT_DUPLICATES, &err)))
    s = CORRUPT("%s: not JSON (line %d: %.200s)", x->path, err.line, err.text);
  free(buf);
  return s;
}

/* A file name the index may give: a plain name in the directory (no '/', not "." or "..",
 * no control character, no NUL), at most 255 bytes. */
static int plain_name(const json_t *v) {
  const char *s = json_string_value(v);
  size_t len = json_string_length(v);
  if (!s || len == 0 || len > 255 || strlen(s) != len) return 0;
  if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
  for (size_t i = 0; i < len; i++)
    if (s[i] == '/' || (unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
  return 1;
}

/* The layout: {"metadata": {"total_size": n, "<key>": "<string>", ...}, "weight_map":
 * {"<tensor>": "<file>", ...}}, every value of the types it must have. */
static clpar_status check_layout(shard_set *x) {
  char esc[CLPAR_ESC_SIZE];
  x->meta = json_object_get(x->root, "metadata");
  x->map = json_object_get(x->root, "weight_map");
  json_t *total = json_object_get(x->meta, "total_size");
  if (!json_is_object(x->root) || !json_is_object(x->meta) || !json_is_object(x->map))
    return CORRUPT("%s: not an index (an object with \"metadata\" and \"weight_map\" objects)",
                   x->path);
  if (!json_is_integer(total) || json_integer_value(total) < 0)
    return CORRUPT("%s: metadata \"total_size\" is not an integer >= 0", x->path);
  x->total = (uint64_t)json_integer_value(total);
  const char *key;
  json_t *v;
  json_object_foreach(x->meta, key, v) {
    if (v == total) continue;
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
      return CORRUPT("%s: metadata \"%s\" is not a string", x->path, CLPAR_ESC(key, esc));
  }
  if (!json_is_string(json_object_get(x->meta, "shard.id")))
    return CORRUPT("%s: metadata \"shard.id\" is missing: not a clpar sharded checkpoint", x->path);
  if (json_object_size(x->map) == 0) return CORRUPT("%s: \"weight_map\" is empty", x->path);
  json_object_foreach(x->map, key, v) {
    if (!plain_name(v))
      return CORRUPT(
          "%s: tensor \"%s\" is mapped to a file that is not a plain name inside "
          "the directory",
          x->path, CLPAR_ESC(key, esc));
  }
  return CLPAR_OK;
}

static int file_index(const shard_set *x, const char *name) {
  for (int i = 0; i < x->n_files; i++)
    if (strcmp(x->names[i], name) == 0) return i;
  return -1;
}

static int skipped_key(const char *key) {
  return strcmp(key, "total_size") == 0 || strncmp(key, "shard.", 6) == 0 ||
         strncmp(key, "crc32.", 6) == 0 || strcmp(key, "checksums") == 0;
}

/* Metadata a shard must share with the index: not the generator's state, which is each
 * rank's own (the index keeps rank 0's). */
static int shared_key(const char *key) {
  return !skipped_key(key) && strncmp(key, "rng.", 4) != 0;
}

/* Every file the index names, opened and validated. */
static clpar_status open_files(shard_set *x) {
  size_t n = json_object_size(x->map);
  x->names = calloc(n, sizeof *x->names);
  x->files = calloc(n, sizeof *x->files);
  if (!x->names || !x->files) return NOMEM(x->path);
  const char *key;
  json_t *v;
  json_object_foreach(x->map, key, v) {
    const char *name = json_string_value(v);
    if (file_index(x, name) >= 0) continue;
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", x->dir, name) >= sizeof path)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the directory's name is too long",
                             x->path);
    x->names[x->n_files] = name;
    clpar_status s = clpar_st_read(path, &x->files[x->n_files]);
    x->n_files++; /* freed either way: clpar_st_read leaves a failed file empty */
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

/* File i is of this save, with the index's metadata, and holds only what the index maps to it. */
static clpar_status check_file(const shard_set *x, int i) {
  const clpar_st_file *f = &x->files[i];
  char esc[CLPAR_ESC_SIZE];
  const char *id = clpar_st_meta(f, "shard.id");
  if (!id || strcmp(id, json_string_value(json_object_get(x->meta, "shard.id"))) != 0)
    return CORRUPT(
        "%s/%s: not a shard of the save that wrote the index (metadata \"shard.id\" "
        "differs): the checkpoint mixes two saves",
        x->dir, x->names[i]);
  size_t common = 0, want = 0;
  const char *key;
  json_t *v;
  json_object_foreach(x->meta, key, v) want += shared_key(key);
  for (int k = 0; k < f->n_meta; k++) {
    if (!shared_key(f->meta_keys[k])) continue;
    json_t *iv = json_object_get(x->meta, f->meta_keys[k]);
    if (!json_is_string(iv) || json_string_length(iv) != f->meta_lens[k] ||
        memcmp(json_string_value(iv), f->meta_values[k], f->meta_lens[k]) != 0)
      return CORRUPT("%s/%s: metadata \"%s\" differs from the index's", x->dir, x->names[i],
                     CLPAR_ESC(f->meta_keys[k], esc));
    common++;
  }
  if (common != want)
    return CORRUPT("%s/%s: lacks metadata that the index has", x->dir, x->names[i]);
  int mapped = 0;
  json_object_foreach(x->map, key, v) mapped += strcmp(json_string_value(v), x->names[i]) == 0;
  if (mapped != f->n)
    return CORRUPT("%s/%s: holds %d tensors; the index maps %d to it", x->dir, x->names[i], f->n,
                   mapped);
  return CLPAR_OK;
}

static clpar_status meta_push(clpar_st_file *f, const char *key, const char *value, size_t len) {
  char *k = strdup(key), *v = malloc(len + 1);
  if (!k || !v) {
    free(k);
    free(v);
    return NOMEM("sharded checkpoint");
  }
  memcpy(v, value, len);
  v[len] = 0;
  f->meta_keys[f->n_meta] = k;
  f->meta_values[f->n_meta] = v;
  f->meta_lens[f->n_meta] = len;
  f->n_meta++;
  return CLPAR_OK;
}

/* The merged file's metadata: the index's, then the checksums in the index's order. */
static clpar_status merge_meta(const shard_set *x, clpar_st_file *out, const int *where) {
  size_t n = json_object_size(x->meta) + (size_t)out->n + 1;
  out->meta_keys = calloc(n, sizeof *out->meta_keys);
  out->meta_values = calloc(n, sizeof *out->meta_values);
  out->meta_lens = calloc(n, sizeof *out->meta_lens);
  if (!out->meta_keys || !out->meta_values || !out->meta_lens) return NOMEM(x->path);
  clpar_status s = CLPAR_OK;
  const char *key;
  json_t *v;
  json_object_foreach(x->meta, key, v) {
    if (s == CLPAR_OK && !skipped_key(key))
      s = meta_push(out, key, json_string_value(v), json_string_length(v));
  }
  size_t len = 0;
  const char *kind = clpar_st_meta_len(&x->files[0], "checksums", &len);
  if (s != CLPAR_OK || !kind) return s;
  s = meta_push(out, "checksums", kind, len);
  for (int i = 0; s == CLPAR_OK && i < out->n; i++) {
    char crc_key[600];
    snprintf(crc_key, sizeof crc_key, "crc32.%s", out->tensors[i].name);
    const char *crc = clpar_st_meta_len(&x->files[where[i]], crc_key, &len);
    if (crc) s = meta_push(out, crc_key, crc, len);
  }
  return s;
}

/* Index entry (name, tensor t of file j) into the view out, after the entries before it. */
static clpar_status merge_tensor(const shard_set *x, const char *name, int j, int t,
                                 clpar_st_file *out, clpar_st_source *src, uint64_t *at) {
  const clpar_st_tensor *from = &x->files[j].tensors[t];
  clpar_st_tensor *dst = &out->tensors[out->n];
  uint64_t bytes = from->end - from->begin;
  dst->name = strdup(name);
  dst->shape = from->ndim ? malloc((size_t)from->ndim * sizeof *dst->shape) : NULL;
  src[out->n] = (clpar_st_source){&x->files[j], t};
  out->n++;
  if (!dst->name || (from->ndim && !dst->shape)) return NOMEM(x->path);
  if (from->ndim) memcpy(dst->shape, from->shape, (size_t)from->ndim * sizeof *dst->shape);
  dst->dtype = from->dtype;
  dst->ndim = from->ndim;
  dst->begin = *at;
  dst->end = *at + bytes;
  *at += bytes;
  return CLPAR_OK;
}

/* Where each index entry is (file, tensor), and that the sizes add up to total_size. */
static clpar_status locate(const shard_set *x, int *where, int *which) {
  char esc[CLPAR_ESC_SIZE];
  uint64_t total = 0;
  int i = 0;
  const char *key;
  json_t *v;
  json_object_foreach(x->map, key, v) {
    where[i] = file_index(x, json_string_value(v));
    which[i] = clpar_st_find(&x->files[where[i]], key);
    if (which[i] < 0)
      return CORRUPT("%s: maps tensor \"%s\" to %s, which does not hold it", x->path,
                     CLPAR_ESC(key, esc), x->names[where[i]]);
    const clpar_st_tensor *t = &x->files[where[i]].tensors[which[i]];
    total += t->end - t->begin; /* each below a file's size: no overflow */
    i++;
  }
  if (total != x->total)
    return CORRUPT("%s: the tensors hold %llu bytes; metadata \"total_size\" says %llu", x->path,
                   (unsigned long long)total, (unsigned long long)x->total);
  if (total > SIZE_MAX - 1) return NOMEM(x->path);
  return CLPAR_OK;
}

struct clpar_ckpt_sharded {
  shard_set x;
  clpar_st_file view;
  clpar_st_source *sources;
};

static clpar_status merge(clpar_ckpt_sharded *h) {
  const shard_set *x = &h->x;
  clpar_st_file *out = &h->view;
  size_t n = json_object_size(x->map);
  int *where = calloc(n, sizeof *where), *which = calloc(n, sizeof *which);
  clpar_status s = where && which ? locate(x, where, which) : NOMEM(x->path);
  if (s == CLPAR_OK) {
    out->tensors = calloc(n, sizeof *out->tensors);
    h->sources = calloc(n, sizeof *h->sources);
    out->sources = h->sources;
    out->size = x->total;
    if (!out->tensors || !h->sources) s = NOMEM(x->path);
  }
  uint64_t at = 0;
  size_t i = 0;
  const char *key;
  json_t *v;
  json_object_foreach(x->map, key, v) {
    if (s == CLPAR_OK) s = merge_tensor(x, key, where[i], which[i], out, h->sources, &at);
    i++;
  }
  if (s == CLPAR_OK) s = merge_meta(x, out, where);
  free(where);
  free(which);
  return s;
}

void clpar_ckpt_close_sharded(clpar_ckpt_sharded *h) {
  if (!h) return;
  clpar_st_free(&h->view);
  free(h->sources);
  shard_set_free(&h->x);
  free(h);
}

clpar_status clpar_ckpt_open_sharded(const char *dir, clpar_ckpt_sharded **out,
                                     const clpar_st_file **view) {
  *out = NULL;
  clpar_ckpt_sharded *h = calloc(1, sizeof *h);
  if (!h) return NOMEM(dir);
  h->view.fd = -1;
  shard_set *x = &h->x;
  x->dir = dir;
  clpar_status s = CLPAR_OK;
  if ((size_t)snprintf(x->path, sizeof x->path, "%s/%s", dir, INDEX_NAME) >= sizeof x->path)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the directory's name is too long", dir);
  if (s == CLPAR_OK) s = load_json(x);
  if (s == CLPAR_OK) s = check_layout(x);
  if (s == CLPAR_OK) s = open_files(x);
  for (int i = 0; s == CLPAR_OK && i < x->n_files; i++) s = check_file(x, i);
  if (s == CLPAR_OK) s = merge(h);
  if (s != CLPAR_OK) {
    clpar_ckpt_close_sharded(h);
    return s;
  }
  *out = h;
  *view = &h->view;
  return CLPAR_OK;
}
