/* csv.c — a dataset from a CSV file of numbers, one sample per line, optionally gzip-compressed
 * (zlib's gzread reads a plain file unchanged, so both go through it). The file is decompressed
 * into memory and parsed in place; every field is checked (a number, a label that is an int32,
 * the same count of columns on every line) and an error names the file, line and column. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "internal.h"
#include "io/dataset.h"

/* The whole (decompressed) file, NUL-terminated, in *text. */
static clpar_status slurp(const char *path, char **text, size_t *len) {
  gzFile g = gzopen(path, "rb");
  if (!g) return clpar_set_error(CLPAR_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  clpar_status s =
      buf ? CLPAR_OK : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: no memory", path);
  while (s == CLPAR_OK) {
    if (cap - n < (1 << 15) + 1) {
      char *more = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
      if (!more) {
        s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory at %zu bytes", path,
                            n);
        break;
      }
      buf = more;
      cap *= 2;
    }
    int got = gzread(g, buf + n, 1 << 15);
    if (got < 0) {
      int code;
      const char *msg = gzerror(g, &code);
      s = clpar_set_error(code == Z_ERRNO ? CLPAR_ERROR_IO : CLPAR_ERROR_CORRUPT,
                          "%s: read failed after %zu bytes of text: %s", path, n,
                          code == Z_ERRNO ? strerror(errno) : msg);
      break;
    }
    if (got == 0) break;
    n += (size_t)got;
  }
  int code = Z_OK;
  if (s == CLPAR_OK) {
    const char *msg = gzerror(g, &code);
    if (code != Z_OK)
      s = clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: bad gzip data after %zu bytes of text: %s",
                          path, n, msg);
  }
  gzclose(g);
  if (s != CLPAR_OK) {
    free(buf);
    return s;
  }
  buf[n] = '\0';
  *text = buf;
  *len = n;
  return CLPAR_OK;
}

typedef struct csv_out {
  int64_t rows, cap;
  int cols; /* columns per line, from the first data line */
  float *x;
  int32_t *y;
} csv_out;

static clpar_status grow(const char *path, csv_out *o) {
  if (o->rows < o->cap) return CLPAR_OK;
  int64_t cap = o->cap ? o->cap * 2 : 256;
  if (cap > INT64_MAX / 8 / (o->cols + 1))
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "%s: too many rows", path);
  float *x = realloc(o->x, (size_t)cap * (size_t)(o->cols - 1) * sizeof *x + 1);
  if (x) o->x = x;
  int32_t *y = x ? realloc(o->y, (size_t)cap * sizeof *y) : NULL;
  if (y) o->y = y;
  if (!x || !y) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
  o->cap = cap;
  return CLPAR_OK;
}

/* Parses one line (NUL-terminated, no newline) of number lineno into row o->rows. */
static clpar_status parse_line(const char *path, int64_t lineno, char *line, int label_col,
                               csv_out *o) {
  int col = 0, f = 0;
  for (char *field = line;; col++) {
    char *comma = strchr(field, ',');
    if (comma) *comma = '\0';
    if (col >= o->cols)
      return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: line %lld has more than %d columns", path,
                             (long long)lineno, o->cols);
    char *end;
    errno = 0;
    if (col == label_col) {
      long v = strtol(field, &end, 10);
      while (*end == ' ' || *end == '\t') end++;
      if (end == field || *end || errno || v < INT32_MIN || v > INT32_MAX) {
        /* a label written as a float ("3.0") is accepted when it is an exact integer */
        double d = strtod(field, &end);
        while (*end == ' ' || *end == '\t') end++;
        if (end == field || *end || !(d >= INT32_MIN && d <= INT32_MAX) || d != (double)(int32_t)d)
          return clpar_set_error(CLPAR_ERROR_CORRUPT,
                                 "%s: line %lld, column %d: label '%s' is not an int32", path,
                                 (long long)lineno, col + 1, field);
        v = (long)d;
      }
      o->y[o->rows] = (int32_t)v;
    } else {
      float v = strtof(field, &end);
      while (*end == ' ' || *end == '\t') end++;
      if (end == field || *end)
        return clpar_set_error(CLPAR_ERROR_CORRUPT,
                               "%s: line %lld, column %d: '%s' is not a number", path,
                               (long long)lineno, col + 1, field);
      o->x[o->rows * (o->cols - 1) + f++] = v;
    }
    if (!comma) break;
    field = comma + 1;
  }
  if (col + 1 != o->cols)
    return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: line %lld has %d columns, line 1 of data %d",
                           path, (long long)lineno, col + 1, o->cols);
  o->rows++;
  return CLPAR_OK;
}

static int count_cols(const char *line) {
  int n = 1;
  for (; *line; line++) n += *line == ',';
  return n;
}

clpar_status clpar_dataset_from_csv(const char *path, int label_column, int skip_header,
                                    clpar_dataset **out) {
  if (!path || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_dataset_from_csv: NULL argument");
  char *text = NULL;
  size_t len = 0;
  clpar_status s = slurp(path, &text, &len);
  if (s != CLPAR_OK) return s;
  csv_out o = {0};
  int64_t lineno = 0;
  int label_col = -1;
  const char *nul = memchr(text, '\0', len);
  if (nul)
    s = clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: a NUL byte at byte %zu of the text (not CSV)",
                        path, (size_t)(nul - text));
  for (char *line = text; s == CLPAR_OK && line < text + len;) {
    char *nl = strchr(line, '\n');
    char *next = nl ? nl + 1 : text + len;
    if (nl) *nl = '\0';
    size_t l = strlen(line);
    if (l && line[l - 1] == '\r') line[l - 1] = '\0';
    lineno++;
    if ((lineno == 1 && skip_header) || line[strspn(line, " \t")] == '\0')
      ; /* the column names, or a blank line */
    else {
      if (!o.cols) {
        o.cols = count_cols(line);
        label_col = label_column < 0 ? o.cols + label_column : label_column;
        if (o.cols < 2 || label_col < 0 || label_col >= o.cols)
          s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                              "%s: label column %d does not fit line %lld's %d columns (a "
                              "label and at least one feature are needed)",
                              path, label_column, (long long)lineno, o.cols);
      }
      if (s == CLPAR_OK) s = grow(path, &o);
      if (s == CLPAR_OK) s = parse_line(path, lineno, line, label_col, &o);
    }
    line = next;
  }
  free(text);
  if (s == CLPAR_OK && o.rows == 0)
    s = clpar_set_error(CLPAR_ERROR_EMPTY, "%s: no data lines", path);
  if (s != CLPAR_OK) {
    free(o.x);
    free(o.y);
    return s;
  }
  int64_t shape[1] = {o.cols - 1};
  return clpar_dataset_adopt(o.rows, 1, shape, o.x, o.y, out);
}
