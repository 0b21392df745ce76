/* checkpoint_meta.c — a training checkpoint's metadata values read back with checks (integers,
 * unsigned integers, floats, text escaped for messages) and its per-tensor crc32 checksums:
 * added to a set before it is written, verified against a file before a load changes
 * anything. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "io/checkpoint_internal.h"

#define NOMEM(what) clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what)

/* ---- metadata values ---- */

/* Metadata value key as text: NULL when absent, "" when it holds a NUL byte (so that no
 * number or name is read from its first part). shown: the whole value escaped for a message,
 * in quotes, or "missing". */
const char *clpar_ckpt_meta_text(const clpar_st_file *f, const char *key, char *shown,
                                 size_t size) {
  size_t len = 0;
  const char *v = clpar_st_meta_len(f, key, &len);
  if (!v) {
    snprintf(shown, size, "missing");
    return NULL;
  }
  shown[0] = '"';
  clpar_escape(v, len, shown + 1, size - 2);
  strcat(shown, "\"");
  return strlen(v) == len ? v : "";
}

/* ---- checksums ---- */

/* Each tensor of a training checkpoint has its zlib crc32 in the metadata, as 8 hex digits
 * under "crc32.<name>", and "checksums" is "crc32"; strings, so PyTorch's safetensors reads
 * the file as any other. A file without "checksums" (written by PyTorch, or by a clpar from
 * before checksums) loads unchecked. The values are read from their devices once for the
 * checksums and once more as the file is written, so that no host copy of the whole model
 * is needed. */
#define CHECKSUM_KIND "crc32"

clpar_status clpar_ckpt_add_checksums(clpar_ckpt_set *w) {
  size_t most = 1;
  for (int i = 0; i < w->n; i++) {
    size_t bytes = (size_t)clpar_tensor_numel(w->e[i].src) * clpar_st_dtype_size(w->e[i].dtype);
    if (bytes > most) most = bytes;
  }
  uint8_t *buf = malloc(most);
  clpar_status s = buf ? clpar_ckpt_meta_add(w, "checksums", CHECKSUM_KIND) : NOMEM("checkpoint");
  for (int i = 0, n = w->n; s == CLPAR_OK && i < n; i++) {
    size_t bytes = (size_t)clpar_tensor_numel(w->e[i].src) * clpar_st_dtype_size(w->e[i].dtype);
    s = w->e[i].fill(w->e[i].src, buf, bytes);
    char key[600];
    snprintf(key, sizeof key, "crc32.%s", w->e[i].name);
    unsigned long crc = crc32_z(crc32_z(0, Z_NULL, 0), buf, bytes);
    char hex[16];
    snprintf(hex, sizeof hex, "%08lx", crc);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_add(w, key, hex);
  }
  free(buf);
  return s;
}

/* Tensor i's crc32, read from the file in chunks. */
static clpar_status file_crc(const clpar_st_file *f, int i, uint8_t *buf, size_t size,
                             unsigned long *crc) {
  const clpar_st_tensor *t = &f->tensors[i];
  uint64_t total = t->end - t->begin;
  *crc = crc32_z(0, Z_NULL, 0);
  for (uint64_t at = 0; at < total;) {
    size_t n = total - at < size ? (size_t)(total - at) : size;
    clpar_status s = clpar_st_tensor_read_part(f, i, at, buf, n);
    if (s != CLPAR_OK) return s;
    *crc = crc32_z(*crc, buf, n);
    at += n;
  }
  return CLPAR_OK;
}

/* Every tensor's data against its checksum, before anything is loaded. */
clpar_status clpar_ckpt_verify(const clpar_st_file *f, const char *path) {
  char shown[CLPAR_ESC_SIZE + 2], esc[CLPAR_ESC_SIZE];
  const char *kind = clpar_ckpt_meta_text(f, "checksums", shown, sizeof shown);
  if (!kind) return CLPAR_OK;
  if (strcmp(kind, CHECKSUM_KIND) != 0)
    return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: metadata \"checksums\" is %s, not \"%s\"",
                           path, shown, CHECKSUM_KIND);
  enum { CHUNK = 1 << 20 };
  uint8_t *buf = malloc(CHUNK);
  clpar_status s = buf ? CLPAR_OK : NOMEM(path);
  for (int i = 0; s == CLPAR_OK && i < f->n; i++) {
    char key[600];
    snprintf(key, sizeof key, "crc32.%s", f->tensors[i].name);
    const char *v = clpar_ckpt_meta_text(f, key, shown, sizeof shown);
    char *end = NULL;
    unsigned long want = v && strlen(v) == 8 ? strtoul(v, &end, 16) : 0, got = 0;
    if (!v || strlen(v) != 8 || *end)
      s = clpar_set_error(CLPAR_ERROR_CORRUPT,
                          "%s: tensor \"%s\" has no checksum (metadata \"crc32.<name>\" is "
                          "%s, not 8 hex digits)",
                          path, CLPAR_ESC(f->tensors[i].name, esc), shown);
    if (s == CLPAR_OK) s = file_crc(f, i, buf, CHUNK, &got);
    if (s == CLPAR_OK && got != want)
      s = clpar_set_error(CLPAR_ERROR_CORRUPT,
                          "%s: tensor \"%s\" does not match its checksum (crc32 %08lx of its "
                          "data, %08lx in the metadata): the file is damaged; nothing was loaded",
                          path, CLPAR_ESC(f->tensors[i].name, esc), got, want);
  }
  free(buf);
  return s;
}

/* Metadata value key as a number; CLPAR_ERROR_CORRUPT when absent or malformed. */
clpar_status clpar_ckpt_meta_i64(const clpar_st_file *f, const char *path, const char *key,
                                 int64_t lo, int64_t *out) {
  char shown[CLPAR_ESC_SIZE + 2];
  const char *v = clpar_ckpt_meta_text(f, key, shown, sizeof shown);
  char *end = NULL;
  errno = 0;
  long long x = v ? strtoll(v, &end, 10) : 0;
  if (!v || !*v || *end || errno || x < lo)
    return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: metadata \"%s\" is %s, not an integer >= %lld",
                           path, key, shown, (long long)lo);
  *out = x;
  return CLPAR_OK;
}

clpar_status clpar_ckpt_meta_u64(const clpar_st_file *f, const char *path, const char *key,
                                 uint64_t *out) {
  char shown[CLPAR_ESC_SIZE + 2];
  const char *v = clpar_ckpt_meta_text(f, key, shown, sizeof shown);
  char *end = NULL;
  errno = 0;
  unsigned long long x = v && *v != '-' ? strtoull(v, &end, 10) : 0;
  if (!v || !*v || *v == '-' || *end || errno)
    return clpar_set_error(CLPAR_ERROR_CORRUPT,
                           "%s: metadata \"%s\" is %s, not an unsigned integer", path, key, shown);
  *out = x;
  return CLPAR_OK;
}

clpar_status clpar_ckpt_meta_float(const clpar_st_file *f, const char *path, const char *key,
                                   float *out) {
  char shown[CLPAR_ESC_SIZE + 2];
  const char *v = clpar_ckpt_meta_text(f, key, shown, sizeof shown);
  char *end = NULL;
  float x = v ? strtof(v, &end) : 0.0f;
  if (!v || !*v || *end)
    return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: metadata \"%s\" is %s, not a number", path,
                           key, shown);
  *out = x;
  return CLPAR_OK;
}
