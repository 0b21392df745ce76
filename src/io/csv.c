/* csv.c — a dataset from a CSV file of numbers, one sample per line, optionally gzip-compressed
 * (zlib's gzread reads a plain file unchanged, so both go through it). Only a regular file is
 * opened (a FIFO or a device could block or never end), and the text is capped
 * (clpar_csv_options.max_text_bytes: a small .gz can inflate a thousandfold). The file is
 * decompressed into memory and parsed in place; every field is checked (a number, a label that is
 * an int32, the same count of columns on every line) and an error names the file, line and column.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "internal.h"
#include "io/dataset.h"

/* Opens path (a regular file only) for gzread. */
static clpar_status open_text(const char *path, gzFile *g) {
  int fd;
  int64_t size;
  clpar_status s = clpar_open_regular(path, &fd, &size);
  if (s != CLPAR_OK) return s;
  *g = gzdopen(fd, "rb");
  if (!*g) {
    close(fd);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
  }
  return CLPAR_OK;
}

static clpar_status read_error(const char *path, gzFile g, size_t n) {
  int code;
  const char *msg = gzerror(g, &code);
  return clpar_set_error(code == Z_ERRNO ? CLPAR_ERROR_IO : CLPAR_ERROR_CORRUPT,
                         "%s: read failed after %zu bytes of text: %s", path, n,
                         code == Z_ERRNO ? strerror(errno) : msg);
}

/* The whole (decompressed: every gzip stream of the file) text, NUL-terminated, in *text;
 * more than max bytes of it is CLPAR_ERROR_TOO_LARGE, found before more than max + 32 KiB is
 * held. */
static clpar_status slurp(const char *path, int64_t max, char **text, size_t *len) {
  gzFile g;
  clpar_status s = open_text(path, &g);
  if (s != CLPAR_OK) return s;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: no memory", path);
  while (s == CLPAR_OK) {
    if (cap - n < (1 << 15) + 1) {
      /* doubling, but not far past what the cap lets through */
      size_t want = cap < SIZE_MAX / 2 ? cap * 2 : 0;
      if ((uint64_t)want > (uint64_t)max + (1 << 16)) want = (size_t)max + (1 << 16);
      char *more = want > cap ? realloc(buf, want) : NULL;
      if (!more) {
        s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory at %zu bytes", path,
                            n);
        break;
      }
      buf = more;
      cap = want;
    }
    int got = gzread(g, buf + n, 1 << 15);
    if (got < 0) s = read_error(path, g, n);
    if (got <= 0) break;
    n += (size_t)got;
    if ((uint64_t)n > (uint64_t)max)
      s = clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                          "%s: the text (decompressed) is longer than the %lld bytes allowed "
                          "(clpar_csv_options.max_text_bytes); refused at %zu bytes",
                          path, (long long)max, n);
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

/* Whether s is blanks (spaces, tabs) to its end: what may follow a number in a field. A field
 * of only blanks has no number (strto* then leave end at the field's start). */
static int blank_to_end(const char *s) {
  return s[strspn(s, " \t")] == '\0';
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
    char *end, esc[CLPAR_ESC_SIZE];
    errno = 0;
    if (col == label_col) {
      long v = strtol(field, &end, 10);
      if (end == field || !blank_to_end(end) || errno || v < INT32_MIN || v > INT32_MAX) {
        /* a label written as a float ("3.0") is accepted when it is an exact integer */
        double d = strtod(field, &end);
        if (end == field || !blank_to_end(end) || !(d >= INT32_MIN && d <= INT32_MAX) ||
            d != (double)(int32_t)d)
          return clpar_set_error(CLPAR_ERROR_CORRUPT,
                                 "%s: line %lld, column %d: label '%s' is not an int32", path,
                                 (long long)lineno, col + 1, CLPAR_ESC(field, esc));
        v = (long)d;
      }
      o->y[o->rows] = (int32_t)v;
    } else {
      float v = strtof(field, &end);
      if (end == field || !blank_to_end(end))
        return clpar_set_error(CLPAR_ERROR_CORRUPT,
                               "%s: line %lld, column %d: '%s' is not a number", path,
                               (long long)lineno, col + 1, CLPAR_ESC(field, esc));
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
  return clpar_dataset_from_csv_opts(path, label_column, skip_header, NULL, out);
}

clpar_status clpar_dataset_from_csv_opts(const char *path, int label_column, int skip_header,
                                         const clpar_csv_options *opt, clpar_dataset **out) {
  if (!path || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_dataset_from_csv: NULL path or out");
  int64_t max = opt && opt->max_text_bytes ? opt->max_text_bytes : CLPAR_CSV_MAX_TEXT_DEFAULT;
  if (max < 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_dataset_from_csv: options->max_text_bytes is %lld, not >= 0",
                           (long long)max);
  char *text = NULL;
  size_t len = 0;
  clpar_status s = slurp(path, max, &text, &len);
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
