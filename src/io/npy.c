/* npy.c — NumPy's .npy format (numpy/lib/format.py): the magic "\x93NUMPY", a version byte
 * pair, a little-endian header length (2 bytes in 1.0, 4 in 2.0 and 3.0), a Python dict
 * literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces to a
 * newline, then the data. Only what clpar trains on is read: little-endian float32, int32 and
 * int64 in C order. Everything in the file is checked before it is used: the header length
 * against a limit and the file's size, the dict's syntax, the shape's product against
 * overflow, and the data's size against what is left of the file, exactly. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "io/dataset.h"
#include <clpar/data.h>

/* numpy's own reader refuses headers over 10,000 bytes unless told otherwise; a shape of
 * CLPAR_NPY_MAX_DIMS dims fits in far less, so 64 KiB (v1's maximum) is plenty for any version. */
enum { NPY_HEADER_MAX = 65535 };

typedef struct npy_parser {
  const char *path;
  const char *s; /* the header text, NUL-terminated */
  size_t at;
  size_t base; /* the header's offset in the file, for messages */
} npy_parser;

static clpar_status npy_bad(const npy_parser *p, const char *what) {
  return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: not a valid .npy header at byte %zu: %s",
                         p->path, p->base + p->at, what);
}

static void skip_ws(npy_parser *p) {
  while (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n') p->at++;
}

static int accept(npy_parser *p, char c) {
  skip_ws(p);
  if (p->s[p->at] != c) return 0;
  p->at++;
  return 1;
}

/* A quoted string (' or ") without escapes, copied into buf. */
static clpar_status parse_string(npy_parser *p, char *buf, size_t size) {
  skip_ws(p);
  char q = p->s[p->at];
  if (q != '\'' && q != '"') return npy_bad(p, "expected a quoted string");
  size_t n = 0;
  for (p->at++; p->s[p->at] != q; p->at++) {
    if (p->s[p->at] == '\0' || p->s[p->at] == '\\' || n + 1 >= size)
      return npy_bad(p, "unterminated, escaped or too long string");
    buf[n++] = p->s[p->at];
  }
  p->at++;
  buf[n] = '\0';
  return CLPAR_OK;
}

static clpar_status parse_shape(npy_parser *p, clpar_npy_array *a) {
  if (!accept(p, '(')) return npy_bad(p, "shape is not a tuple");
  a->ndim = 0;
  while (!accept(p, ')')) {
    skip_ws(p);
    if (p->s[p->at] < '0' || p->s[p->at] > '9') return npy_bad(p, "shape entry is not a number");
    int64_t v = 0;
    while (p->s[p->at] >= '0' && p->s[p->at] <= '9') {
      if (v > (INT64_MAX - 9) / 10) return npy_bad(p, "shape entry too large");
      v = v * 10 + (p->s[p->at++] - '0');
    }
    if (a->ndim == CLPAR_NPY_MAX_DIMS) return npy_bad(p, "more than 8 dimensions");
    a->shape[a->ndim++] = v;
    if (!accept(p, ',')) {
      if (!accept(p, ')')) return npy_bad(p, "expected ',' or ')' in shape");
      break;
    }
  }
  return CLPAR_OK;
}

static clpar_status parse_descr(npy_parser *p, clpar_npy_array *a) {
  char d[16];
  clpar_status s = parse_string(p, d, sizeof d);
  if (s != CLPAR_OK) return s;
  if (!strcmp(d, "<f4"))
    a->dtype = CLPAR_NPY_F32;
  else if (!strcmp(d, "<i4"))
    a->dtype = CLPAR_NPY_I32;
  else if (!strcmp(d, "<i8"))
    a->dtype = CLPAR_NPY_I64;
  else {
    char esc[CLPAR_ESC_SIZE];
    return clpar_set_error(CLPAR_ERROR_CORRUPT,
                           "%s: dtype '%s' at byte %zu is not supported (only '<f4', '<i4' "
                           "and '<i8')",
                           p->path, CLPAR_ESC(d, esc), p->base + p->at);
  }
  return CLPAR_OK;
}

/* The dict: exactly the keys descr, fortran_order and shape, in any order, once each. */
static clpar_status parse_dict(npy_parser *p, clpar_npy_array *a) {
  int seen = 0; /* bits: 1 descr, 2 fortran_order, 4 shape */
  if (!accept(p, '{')) return npy_bad(p, "header is not a dict");
  while (!accept(p, '}')) {
    char key[32];
    clpar_status s = parse_string(p, key, sizeof key);
    if (s != CLPAR_OK) return s;
    if (!accept(p, ':')) return npy_bad(p, "expected ':'");
    int bit = !strcmp(key, "descr")           ? 1
              : !strcmp(key, "fortran_order") ? 2
              : !strcmp(key, "shape")         ? 4
                                              : 0;
    if (!bit || (seen & bit)) return npy_bad(p, "unknown or repeated key");
    seen |= bit;
    if (bit == 1)
      s = parse_descr(p, a);
    else if (bit == 4)
      s = parse_shape(p, a);
    else {
      skip_ws(p);
      if (!strncmp(p->s + p->at, "True", 4))
        return clpar_set_error(CLPAR_ERROR_CORRUPT,
                               "%s: Fortran-order data (byte %zu) is not supported; save a "
                               "C-order array (numpy.ascontiguousarray)",
                               p->path, p->base + p->at);
      if (strncmp(p->s + p->at, "False", 5)) return npy_bad(p, "fortran_order is not a bool");
      p->at += 5;
    }
    if (s != CLPAR_OK) return s;
    if (!accept(p, ',')) {
      if (!accept(p, '}')) return npy_bad(p, "expected ',' or '}'");
      break;
    }
  }
  if (seen != 7) return npy_bad(p, "missing descr, fortran_order or shape");
  skip_ws(p);
  if (p->s[p->at] != '\0') return npy_bad(p, "text after the dict");
  return CLPAR_OK;
}

static size_t item_size(clpar_npy_dtype d) {
  return d == CLPAR_NPY_I64 ? 8 : 4;
}

/* Reads the preamble and the header of f (size bytes long) into a. *data_at: the data's offset. */
static clpar_status read_header(const char *path, FILE *f, int64_t size, clpar_npy_array *a,
                                size_t *data_at) {
  unsigned char pre[12];
  size_t got = fread(pre, 1, 10, f);
  if (got < 10 || memcmp(pre, "\x93NUMPY", 6))
    return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: not a .npy file (bad magic at byte 0)", path);
  size_t hlen, hdr_at;
  if (pre[6] == 1 && pre[7] == 0) {
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    hdr_at = 10;
  } else if ((pre[6] == 2 || pre[6] == 3) && pre[7] == 0) {
    if (fread(pre + 10, 1, 2, f) < 2)
      return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: truncated header length at byte 8", path);
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    hdr_at = 12;
  } else {
    return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: unknown .npy version %u.%u at byte 6", path,
                           pre[6], pre[7]);
  }
  if (hlen > NPY_HEADER_MAX)
    return clpar_set_error(CLPAR_ERROR_CORRUPT,
                           "%s: header length %zu at byte 8 is over the limit of %d bytes", path,
                           hlen, NPY_HEADER_MAX);
  if ((int64_t)(hdr_at + hlen) > size)
    return clpar_set_error(CLPAR_ERROR_CORRUPT,
                           "%s: header length %zu at byte 8 runs past the end of the file "
                           "(%lld bytes)",
                           path, hlen, (long long)size);
  char *text = malloc(hlen + 1);
  if (!text) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
  if (fread(text, 1, hlen, f) != hlen) {
    free(text);
    return clpar_set_error(CLPAR_ERROR_IO, "%s: read failed in the header", path);
  }
  text[hlen] = '\0';
  npy_parser p = {path, text, 0, hdr_at};
  clpar_status s = strlen(text) != hlen ? npy_bad(&p, "NUL byte in the header") : parse_dict(&p, a);
  free(text);
  *data_at = hdr_at + hlen;
  return s;
}

static clpar_status check_data_size(const char *path, clpar_npy_array *a, size_t data_at,
                                    int64_t size) {
  int64_t numel = 1;
  for (int i = 0; i < a->ndim; i++) {
    if (a->shape[i] != 0 && numel > INT64_MAX / 8 / a->shape[i])
      return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: shape's element count overflows", path);
    numel *= a->shape[i];
  }
  a->numel = numel;
  int64_t want = numel * (int64_t)item_size(a->dtype);
  if (want != size - (int64_t)data_at)
    return clpar_set_error(CLPAR_ERROR_CORRUPT,
                           "%s: the shape needs %lld bytes of data from byte %zu, the file has "
                           "%lld",
                           path, (long long)want, data_at, (long long)(size - (int64_t)data_at));
  return CLPAR_OK;
}

clpar_status clpar_npy_read_stream(const char *path, FILE *f, int64_t size, clpar_npy_array *out) {
  memset(out, 0, sizeof *out);
  clpar_npy_array a = {0};
  size_t data_at = 0;
  clpar_status s = read_header(path, f, size, &a, &data_at);
  if (s == CLPAR_OK) s = check_data_size(path, &a, data_at, size);
  size_t bytes = (size_t)a.numel * item_size(a.dtype);
  if (s == CLPAR_OK) {
    a.data = malloc(bytes ? bytes : 1);
    if (!a.data) s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
  }
  if (s == CLPAR_OK && fread(a.data, 1, bytes, f) != bytes)
    s = clpar_set_error(CLPAR_ERROR_IO, "%s: read failed in the data (from byte %zu)", path,
                        data_at);
  if (s != CLPAR_OK) {
    free(a.data);
    return s;
  }
  *out = a;
  return CLPAR_OK;
}

clpar_status clpar_npy_read(const char *path, clpar_npy_array *out) {
  if (!path || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_npy_read: NULL path or out");
  memset(out, 0, sizeof *out);
  int fd;
  int64_t size;
  clpar_status s = clpar_open_regular(path, &fd, &size);
  if (s != CLPAR_OK) return s;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
  }
  s = clpar_npy_read_stream(path, f, size, out);
  fclose(f);
  return s;
}

void clpar_npy_array_free(clpar_npy_array *a) {
  if (!a) return;
  free(a->data);
  a->data = NULL;
}
