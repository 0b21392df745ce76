/* ocl_conv_cache.c — the OpenCL convolution's choices per layer shape and the implicit
 * GEMM's tiles, per device: in memory, and in a trusted file of the cache directory
 * (src/runtime/trusted_file.c) named conv-<hash of the header>.txt:
 *
 *   clpar-conv 1
 *   device NAME / driver VERSION / platform NAME VERSION    (one line each, as the GEMM entry)
 *   tiles TM TN TK WM WN                                     (optional)
 *   bwd-tiles data|weights TM TN TK WM WN       (optional: a backward pass's implicit GEMM;
 *                                                without, it takes the forward's tiles)
 *   shape N C H W O GROUPS KH KW SH SW PH PW DH DW ALGO      (any number: ALGO im2col,
 *                          winograd, convgemm, or implicit TM TN TK WM WN)
 *   bwd N C H W O GROUPS KH KW SH SW PH PW DH DW DATA WEIGHTS   (any number: the backward
 *        passes' algorithms, DATA im2col, implicit, winograd (where ocl_conv_bwd.c can run it)
 *        or auto, WEIGHTS im2col, implicit or auto; auto: not measured yet, not both)
 *   end
 *
 * What the file says only selects between clpar's own kernels and sizes their tiles, but it is
 * checked all the same: an entry of another format, device or driver, a line that does not
 * parse, a size out of range, tiles the device cannot run or a missing "end" make the whole
 * entry ignored with a warning (counted in disk_rejects); the device then measures again.
 * An entry written before the bwd lines existed loads as it did (its backward shapes are
 * measured); a program that predates them refuses an entry holding them and measures. The same
 * holds for convgemm and for bwd-tiles lines, the last added: older programs refuse an entry
 * holding them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ocl_conv_algo.h"

#define CONV_FORMAT "clpar-conv 1"
#define CONV_MAX_FILE ((size_t)1 << 18)
#define CONV_MAX_SHAPES 4096
#define CONV_MAX_DIM ((int64_t)1 << 31)
#define CONV_MAX_KERNELS 24

typedef struct {
  clpar_conv2d_shape s;
  int algo;                   /* the forward's; CLPAR_OCL_CONV_AUTO: not chosen yet */
  clpar_ocl_conv_tiles tiles; /* the implicit GEMM's, when it is the algorithm */
  int bdata, bweight;         /* the backward passes' (ocl_conv_bwd.c); AUTO likewise */
} conv_choice;

struct clpar_ocl_conv_state {
  int read;                                          /* the entry on disk was looked at */
  int has_tiles[CLPAR_OCL_TILED_KINDS];              /* tiles came from the entry or a tuner */
  clpar_ocl_conv_tiles tiles[CLPAR_OCL_TILED_KINDS]; /* per tiled kernel (CLPAR_OCL_TILES_*) */
  conv_choice *choices;
  size_t n, cap;
  clpar_ocl_conv_stats stats;
  /* the implicit GEMM's kernels built so far, by tiles (kept across forget) */
  int nk;
  int kkind[CONV_MAX_KERNELS]; /* 0: the forward's conv_implicit_f32; else conv_bwd.cl's */
  clpar_ocl_conv_tiles ktiles[CONV_MAX_KERNELS];
  cl_kernel kernels[CONV_MAX_KERNELS];
};

/* Guards every device's state (convolutions take it briefly, once per call). */
static pthread_mutex_t conv_lock = PTHREAD_MUTEX_INITIALIZER;

/* d's state, made on first use; NULL when out of memory. Called with conv_lock held. */
static struct clpar_ocl_conv_state *state_of(clpar_ocl_device *d) {
  if (!d->conv) d->conv = calloc(1, sizeof *d->conv);
  return d->conv;
}

static int same_shape(const clpar_conv2d_shape *a, const clpar_conv2d_shape *b) {
  return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->o == b->o &&
         a->groups == b->groups && a->kh == b->kh && a->kw == b->kw && a->sh == b->sh &&
         a->sw == b->sw && a->ph == b->ph && a->pw == b->pw && a->dh == b->dh && a->dw == b->dw;
}

/* s's choice, added (nothing chosen) when new; NULL when out of memory or full. */
static conv_choice *choice_of(struct clpar_ocl_conv_state *st, const clpar_conv2d_shape *s) {
  for (size_t i = 0; i < st->n; i++)
    if (same_shape(&st->choices[i].s, s)) return &st->choices[i];
  if (st->n == CONV_MAX_SHAPES) return NULL;
  if (st->n == st->cap) {
    size_t cap = st->cap ? 2 * st->cap : 32;
    conv_choice *grown = realloc(st->choices, cap * sizeof *grown);
    if (!grown) return NULL;
    st->choices = grown;
    st->cap = cap;
  }
  conv_choice *c = &st->choices[st->n++];
  memset(c, 0, sizeof *c);
  c->s = *s;
  return c;
}

/* Sets s's forward choice; 0, or -1 when out of memory or full. */
static int put_choice(struct clpar_ocl_conv_state *st, const clpar_conv2d_shape *s, int algo,
                      const clpar_ocl_conv_tiles *t) {
  conv_choice *c = choice_of(st, s);
  if (!c) return -1;
  c->algo = algo;
  c->tiles = *t;
  return 0;
}

/* Sets s's backward choices (those not CLPAR_OCL_CONV_AUTO); 0, or -1 as put_choice. */
static int put_bwd(struct clpar_ocl_conv_state *st, const clpar_conv2d_shape *s, int data,
                   int weight) {
  conv_choice *c = choice_of(st, s);
  if (!c) return -1;
  if (data != CLPAR_OCL_CONV_AUTO) c->bdata = data;
  if (weight != CLPAR_OCL_CONV_AUTO) c->bweight = weight;
  return 0;
}

/* ---- the entry's header and name ---- */

static void entry_header(clpar_ocl_device *d, char *out, size_t size) {
  char lines[960]; /* the device lines are at most 919 bytes */
  clpar_ocl_entry_device_lines(d, lines, sizeof lines);
  snprintf(out, size, "%s\n%s", CONV_FORMAT, lines);
}

static void entry_name(clpar_ocl_device *d, char *name, size_t size) {
  char header[1024];
  entry_header(d, header, sizeof header);
  clpar_ocl_entry_name("conv", header, name, size);
}

int clpar_ocl_conv_path(clpar_ocl_device *d, char *path, size_t size) {
  char name[64];
  entry_name(d, name, sizeof name);
  return clpar_ocl_entry_path(name, path, size);
}

/* ---- parsing ---- */

/* count decimal numbers from *p into v, each at most max; 0, or -1. */
static int parse_numbers(char **p, int64_t *v, int count, int64_t max) {
  for (int i = 0; i < count; i++) {
    char *end;
    errno = 0;
    long long x = strtoll(*p, &end, 10);
    if (errno || end == *p || (*end != ' ' && *end != '\0') || x < 0 || x > max) return -1;
    v[i] = x;
    *p = end;
  }
  return 0;
}

/* Five tile sizes from *p into t, which d must be able to run; 0, or -1. */
static int parse_tiles(clpar_ocl_device *d, char **p, clpar_ocl_conv_tiles *t) {
  int64_t v[5];
  const char *bad;
  if (parse_numbers(p, v, 5, 1 << 16) != 0 || **p) return -1;
  clpar_ocl_conv_tiles r = {(unsigned)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3],
                            (unsigned)v[4]};
  if (clpar_ocl_conv_tiles_check(d, &r, &bad) != 0) return -1;
  *t = r;
  return 0;
}

/* The 14 sizes of a geometry a convolution can have, from *p into *out (*p then at the space
 * after them); 0, or -1. */
static int parse_geom(char **pp, clpar_conv2d_shape *out) {
  int64_t v[14];
  char *p = *pp;
  if (parse_numbers(&p, v, 14, CONV_MAX_DIM) != 0 || *p != ' ') return -1;
  clpar_conv2d_shape r = {v[0], v[1], v[2],  v[3],  v[4],  v[5],  v[6], v[7],
                          v[8], v[9], v[10], v[11], v[12], v[13], 0,    0};
  if (r.n < 1 || r.c < 1 || r.h < 1 || r.w < 1 || r.o < 1 || r.groups < 1 || r.c % r.groups ||
      r.o % r.groups || r.kh < 1 || r.kw < 1 || r.sh < 1 || r.sw < 1 || r.dh < 1 || r.dw < 1)
    return -1;
  int64_t ekh = r.dh * (r.kh - 1) + 1, ekw = r.dw * (r.kw - 1) + 1;
  if (ekh > r.h + 2 * r.ph || ekw > r.w + 2 * r.pw) return -1;
  r.oh = (r.h + 2 * r.ph - ekh) / r.sh + 1;
  r.ow = (r.w + 2 * r.pw - ekw) / r.sw + 1;
  *out = r;
  *pp = p;
  return 0;
}

/* A shape line's fields (after "shape "): the geometry, then the algorithm's name, then for the
 * implicit GEMM its tiles; convgemm only where CLBlast can run the geometry. */
static int parse_shape(clpar_ocl_device *d, char *p, conv_choice *c) {
  if (parse_geom(&p, &c->s) != 0) return -1;
  p++;
  c->tiles = (clpar_ocl_conv_tiles){0, 0, 0, 0, 0};
  if (strcmp(p, "im2col") == 0) return c->algo = CLPAR_OCL_CONV_IM2COL, 0;
  if (strcmp(p, "winograd") == 0) return c->algo = CLPAR_OCL_CONV_WINOGRAD, 0;
  if (strcmp(p, "convgemm") == 0)
    return c->algo = CLPAR_OCL_CONV_CONVGEMM, clpar_ocl_conv_convgemm_fits(&c->s) ? 0 : -1;
  if (strncmp(p, "implicit ", 9) != 0) return -1;
  p += 8;
  c->algo = CLPAR_OCL_CONV_IMPLICIT;
  return parse_tiles(d, &p, &c->tiles);
}

/* A bwd line's fields (after "bwd "): the geometry, then the backward data and backward weights
 * algorithms (each one ocl_conv_bwd.c can run on the geometry, or auto; not both auto). */
static int parse_bwd(char *p, conv_choice *c) {
  if (parse_geom(&p, &c->s) != 0) return -1;
  char *weight = strchr(++p, ' ');
  if (!weight) return -1;
  *weight++ = '\0';
  c->bdata = c->bweight = -1;
  for (int a = CLPAR_OCL_CONV_AUTO; a < CLPAR_OCL_CONV_BWD_ALGOS; a++) {
    if (strcmp(p, clpar_ocl_conv_algo_name(a)) == 0) c->bdata = a;
    if (strcmp(weight, clpar_ocl_conv_algo_name(a)) == 0) c->bweight = a;
  }
  if (c->bdata < 0 || c->bweight < 0 || c->bweight == CLPAR_OCL_CONV_WINOGRAD) return -1;
  if (c->bdata == CLPAR_OCL_CONV_AUTO && c->bweight == CLPAR_OCL_CONV_AUTO) return -1;
  if (c->bdata == CLPAR_OCL_CONV_WINOGRAD && !clpar_ocl_conv_bwd_winograd_fits(&c->s)) return -1;
  return 0;
}

static const char *const bwd_pass_name[CLPAR_OCL_TILED_KINDS] = {NULL, "data", "weights"};

/* A bwd-tiles line's fields (after "bwd-tiles "): the pass, then its tiles, into st. */
static int parse_bwd_tiles(clpar_ocl_device *d, char *p, struct clpar_ocl_conv_state *st) {
  for (int k = CLPAR_OCL_TILES_DATA; k < CLPAR_OCL_TILED_KINDS; k++) {
    size_t len = strlen(bwd_pass_name[k]);
    if (strncmp(p, bwd_pass_name[k], len) != 0 || p[len] != ' ') continue;
    p += len;
    if (parse_tiles(d, &p, &st->tiles[k]) != 0) return -1;
    st->has_tiles[k] = 1;
    return 0;
  }
  return -1;
}

/* Parses an entry's text (NUL-terminated) into st; NULL, or why it is refused. */
static const char *entry_parse(clpar_ocl_device *d, char *text, struct clpar_ocl_conv_state *st) {
  char header[1024];
  entry_header(d, header, sizeof header);
  if (strncmp(text, "clpar-conv ", 11) != 0) return "not a clpar convolution entry";
  if (strncmp(text, CONV_FORMAT "\n", strlen(CONV_FORMAT) + 1) != 0)
    return "stale: written by another format";
  if (strncmp(text, header, strlen(header)) != 0) return "stale: made for another device or driver";
  int ended = 0;
  char *save = NULL;
  for (char *line = strtok_r(text + strlen(header), "\n", &save); line && !ended;
       line = strtok_r(NULL, "\n", &save)) {
    conv_choice c;
    char *p = line + strcspn(line, " ");
    if (strcmp(line, "end") == 0) {
      ended = 1;
    } else if (strncmp(line, "tiles ", 6) == 0) {
      if (parse_tiles(d, &p, &st->tiles[CLPAR_OCL_TILES_FWD]) != 0)
        return "corrupt: a tiles line does not parse or names tiles this device cannot run";
      st->has_tiles[CLPAR_OCL_TILES_FWD] = 1;
    } else if (strncmp(line, "bwd-tiles ", 10) == 0) {
      if (parse_bwd_tiles(d, p + 1, st) != 0)
        return "corrupt: a bwd-tiles line does not parse or names tiles this device cannot run";
    } else if (strncmp(line, "bwd ", 4) == 0) {
      if (parse_bwd(p + 1, &c) != 0)
        return "corrupt: a bwd line does not parse or names an algorithm its shape cannot run";
      if (put_bwd(st, &c.s, c.bdata, c.bweight) != 0) return "corrupt: too many shapes";
    } else if (strncmp(line, "shape ", 6) != 0 || parse_shape(d, p + 1, &c) != 0) {
      return "corrupt: a line does not parse or names tiles this device cannot run";
    } else if (put_choice(st, &c.s, c.algo, &c.tiles) != 0) {
      return "corrupt: too many shapes";
    }
  }
  return ended ? NULL : "corrupt: truncated (no end line)";
}

/* Reads d's entry into st (once). Called with conv_lock held. */
static void entry_read(clpar_ocl_device *d, struct clpar_ocl_conv_state *st) {
  st->read = 1;
  const char *tune = getenv("CLPAR_TUNE");
  if (tune && strcmp(tune, "off") == 0) return;
  char dir[4096], name[64], why_buf[512];
  int fd;
  if (clpar_cache_dir_open(dir, sizeof dir, &fd) != CLPAR_OK) return;
  entry_name(d, name, sizeof name);
  void *data = NULL;
  size_t size = 0;
  const char *why = NULL;
  clpar_status s = clpar_trusted_file_read(fd, name, CONV_MAX_FILE, &data, &size);
  close(fd);
  if (s != CLPAR_OK) {
    snprintf(why_buf, sizeof why_buf, "%s", clpar_last_error());
    why = why_buf;
  }
  char *text = data ? malloc(size + 1) : NULL;
  if (data && !text) why = "out of memory";
  if (text) {
    memcpy(text, data, size);
    text[size] = '\0';
    struct clpar_ocl_conv_state parsed = {0};
    why = strlen(text) != size ? "corrupt: a NUL byte in the text" : entry_parse(d, text, &parsed);
    if (!why) {
      free(st->choices);
      st->choices = parsed.choices, st->n = parsed.n, st->cap = parsed.cap;
      memcpy(st->tiles, parsed.tiles, sizeof st->tiles);
      memcpy(st->has_tiles, parsed.has_tiles, sizeof st->has_tiles);
      st->stats.disk_loads++;
    } else {
      free(parsed.choices);
    }
  }
  free(text);
  free(data);
  if (why) {
    st->stats.disk_rejects++;
    clpar_log(CLPAR_LOG_WARN, "opencl: %s: ignoring convolution entry %s/%s: %s", d->dev_name, dir,
              name, why);
  }
}

/* "what" and s's 14 sizes into out; the characters written. */
static size_t geom_write(char *out, size_t size, const char *what, const clpar_conv2d_shape *s) {
  return (size_t)snprintf(
      out, size, "%s %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", what,
      (long long)s->n, (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->o,
      (long long)s->groups, (long long)s->kh, (long long)s->kw, (long long)s->sh, (long long)s->sw,
      (long long)s->ph, (long long)s->pw, (long long)s->dh, (long long)s->dw);
}

/* Writes st as d's entry. Called with conv_lock held. */
static void entry_write(clpar_ocl_device *d, const struct clpar_ocl_conv_state *st) {
  size_t cap = 1024 + 320 * (st->n + 1), len;
  char *text = malloc(cap), dir[4096], name[64];
  int fd;
  if (!text || clpar_cache_dir_open(dir, sizeof dir, &fd) != CLPAR_OK) {
    free(text);
    return;
  }
  entry_header(d, text, cap);
  len = strlen(text);
  for (int k = 0; k < CLPAR_OCL_TILED_KINDS; k++) {
    const clpar_ocl_conv_tiles *t = &st->tiles[k];
    if (!st->has_tiles[k]) continue;
    if (k == CLPAR_OCL_TILES_FWD)
      len += (size_t)snprintf(text + len, cap - len, "tiles");
    else
      len += (size_t)snprintf(text + len, cap - len, "bwd-tiles %s", bwd_pass_name[k]);
    len += (size_t)snprintf(text + len, cap - len, " %u %u %u %u %u\n", t->tm, t->tn, t->tk, t->wm,
                            t->wn);
  }
  for (size_t i = 0; i < st->n; i++) {
    const conv_choice *c = &st->choices[i];
    if (c->algo != CLPAR_OCL_CONV_AUTO) {
      len += geom_write(text + len, cap - len, "shape", &c->s);
      len += (size_t)snprintf(text + len, cap - len, " %s", clpar_ocl_conv_algo_name(c->algo));
      const clpar_ocl_conv_tiles *ct = &c->tiles;
      if (c->algo == CLPAR_OCL_CONV_IMPLICIT)
        len += (size_t)snprintf(text + len, cap - len, " %u %u %u %u %u", ct->tm, ct->tn, ct->tk,
                                ct->wm, ct->wn);
      len += (size_t)snprintf(text + len, cap - len, "\n");
    }
    if (c->bdata != CLPAR_OCL_CONV_AUTO || c->bweight != CLPAR_OCL_CONV_AUTO) {
      len += geom_write(text + len, cap - len, "bwd", &c->s);
      len += (size_t)snprintf(text + len, cap - len, " %s %s\n", clpar_ocl_conv_algo_name(c->bdata),
                              clpar_ocl_conv_algo_name(c->bweight));
    }
  }
  len += (size_t)snprintf(text + len, cap - len, "end\n");
  entry_name(d, name, sizeof name);
  if (clpar_trusted_file_write(fd, name, text, len) != CLPAR_OK)
    clpar_log(CLPAR_LOG_WARN, "opencl: %s: convolution choices not saved: %s", d->dev_name,
              clpar_last_error());
  close(fd);
  free(text);
}

/* ---- the cache's interface ---- */

int clpar_ocl_conv_cached(clpar_ocl_device *d, const clpar_conv2d_shape *s,
                          clpar_ocl_conv_tiles *tiles) {
  int algo = CLPAR_OCL_CONV_AUTO;
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && !st->read) entry_read(d, st);
  for (size_t i = 0; st && i < st->n; i++)
    if (same_shape(&st->choices[i].s, s)) {
      algo = st->choices[i].algo;
      if (algo == CLPAR_OCL_CONV_IMPLICIT) *tiles = st->choices[i].tiles;
    }
  pthread_mutex_unlock(&conv_lock);
  return algo;
}

void clpar_ocl_conv_remember(clpar_ocl_device *d, const clpar_conv2d_shape *s, int algo,
                             const clpar_ocl_conv_tiles *tiles, int save) {
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && !st->read) entry_read(d, st);
  if (st && put_choice(st, s, algo, tiles) == 0 && save) entry_write(d, st);
  pthread_mutex_unlock(&conv_lock);
}

void clpar_ocl_conv_bwd_cached(clpar_ocl_device *d, const clpar_conv2d_shape *s, int *data,
                               int *weight) {
  *data = *weight = CLPAR_OCL_CONV_AUTO;
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && !st->read) entry_read(d, st);
  for (size_t i = 0; st && i < st->n; i++)
    if (same_shape(&st->choices[i].s, s))
      *data = st->choices[i].bdata, *weight = st->choices[i].bweight;
  pthread_mutex_unlock(&conv_lock);
}

void clpar_ocl_conv_bwd_remember(clpar_ocl_device *d, const clpar_conv2d_shape *s, int data,
                                 int weight, int save) {
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && !st->read) entry_read(d, st);
  if (st && put_bwd(st, s, data, weight) == 0 && save) entry_write(d, st);
  pthread_mutex_unlock(&conv_lock);
}

clpar_status clpar_ocl_conv_set_tiles(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t,
                                      int save) {
  return clpar_ocl_conv_set_kind_tiles(d, CLPAR_OCL_TILES_FWD, t, save);
}

clpar_status clpar_ocl_conv_set_kind_tiles(clpar_ocl_device *d, int kind,
                                           const clpar_ocl_conv_tiles *t, int save) {
  const char *bad = NULL;
  if (kind < 0 || kind >= CLPAR_OCL_TILED_KINDS)
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl conv: no tiled kernel kind %d", kind);
  if (clpar_ocl_conv_tiles_check(d, t, &bad) != 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "opencl conv tiles %u %u %u %u %u: %s does not fit this device", t->tm,
                           t->tn, t->tk, t->wm, t->wn, bad);
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && !st->read) entry_read(d, st);
  if (st) {
    st->tiles[kind] = *t;
    st->has_tiles[kind] = 1;
    if (save) entry_write(d, st);
  }
  pthread_mutex_unlock(&conv_lock);
  return st ? CLPAR_OK : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl conv: out of memory");
}

clpar_ocl_conv_tiles clpar_ocl_conv_tiles_of(clpar_ocl_device *d) {
  return clpar_ocl_conv_kind_tiles_of(d, CLPAR_OCL_TILES_FWD);
}

/* A backward pass without tiles of its own takes the forward's. Defaults: 64 x 64 tiles of
 * 4 x 4 per work-item (256 work-items, 8 KiB of local memory) where the device allows, else
 * 32 x 32 (64 work-items). */
clpar_ocl_conv_tiles clpar_ocl_conv_kind_tiles_of(clpar_ocl_device *d, int kind) {
  clpar_ocl_conv_tiles t = CLPAR_OCL_CONV_DEFAULT_TILES, small = {32, 32, 8, 4, 4};
  const char *bad;
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && !st->read) entry_read(d, st);
  if (kind < 0 || kind >= CLPAR_OCL_TILED_KINDS) kind = CLPAR_OCL_TILES_FWD;
  if (st && !st->has_tiles[kind]) kind = CLPAR_OCL_TILES_FWD;
  if (st && st->has_tiles[kind]) t = st->tiles[kind];
  pthread_mutex_unlock(&conv_lock);
  return clpar_ocl_conv_tiles_check(d, &t, &bad) == 0 ? t : small;
}

void clpar_ocl_conv_forget(clpar_ocl_device *d) {
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = d->conv;
  if (st) {
    free(st->choices);
    st->choices = NULL;
    st->n = st->cap = 0;
    st->read = 0;
    memset(st->has_tiles, 0, sizeof st->has_tiles);
  }
  pthread_mutex_unlock(&conv_lock);
}

static int same_tiles(const clpar_ocl_conv_tiles *a, const clpar_ocl_conv_tiles *b) {
  return a->tm == b->tm && a->tn == b->tn && a->tk == b->tk && a->wm == b->wm && a->wn == b->wn;
}

cl_kernel clpar_ocl_conv_kernel_find(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t) {
  return clpar_ocl_conv_kernel_find_kind(d, 0, t);
}

cl_kernel clpar_ocl_conv_kernel_find_kind(clpar_ocl_device *d, int kind,
                                          const clpar_ocl_conv_tiles *t) {
  cl_kernel k = NULL;
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  for (int i = 0; st && i < st->nk && !k; i++)
    if (st->kkind[i] == kind && same_tiles(&st->ktiles[i], t)) k = st->kernels[i];
  pthread_mutex_unlock(&conv_lock);
  return k;
}

void clpar_ocl_conv_kernel_keep_kind(clpar_ocl_device *d, int kind, const clpar_ocl_conv_tiles *t,
                                     cl_kernel k) {
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && st->nk == CONV_MAX_KERNELS) { /* the oldest goes */
    clReleaseKernel(st->kernels[0]);
    memmove(st->kernels, st->kernels + 1, (CONV_MAX_KERNELS - 1) * sizeof st->kernels[0]);
    memmove(st->ktiles, st->ktiles + 1, (CONV_MAX_KERNELS - 1) * sizeof st->ktiles[0]);
    memmove(st->kkind, st->kkind + 1, (CONV_MAX_KERNELS - 1) * sizeof st->kkind[0]);
    st->nk--;
  }
  if (st) {
    st->ktiles[st->nk] = *t;
    st->kkind[st->nk] = kind;
    st->kernels[st->nk++] = k;
  } else {
    clReleaseKernel(k);
  }
  pthread_mutex_unlock(&conv_lock);
}

void clpar_ocl_conv_stats_get(clpar_ocl_device *d, clpar_ocl_conv_stats *out) {
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st)
    *out = st->stats;
  else
    memset(out, 0, sizeof *out);
  pthread_mutex_unlock(&conv_lock);
}

void clpar_ocl_conv_count(clpar_ocl_device *d, int algo, int measured) {
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && measured) st->stats.measured++;
  if (st && !measured && algo > 0 && algo < CLPAR_OCL_CONV_ALGOS) st->stats.runs[algo]++;
  pthread_mutex_unlock(&conv_lock);
}

void clpar_ocl_conv_count_timed(clpar_ocl_device *d, int algo) {
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && algo > 0 && algo < CLPAR_OCL_CONV_ALGOS) st->stats.timed[algo]++;
  pthread_mutex_unlock(&conv_lock);
}

void clpar_ocl_conv_bwd_count(clpar_ocl_device *d, int pass, int algo, int measured) {
  pthread_mutex_lock(&conv_lock);
  struct clpar_ocl_conv_state *st = state_of(d);
  if (st && measured) st->stats.bwd_measured++;
  if (st && !measured && (pass == 0 || pass == 1) && algo > 0 && algo < CLPAR_OCL_CONV_ALGOS)
    st->stats.bwd_runs[pass][algo]++;
  pthread_mutex_unlock(&conv_lock);
}

void clpar_ocl_conv_state_free(clpar_ocl_device *d) {
  pthread_mutex_lock(&conv_lock);
  if (d->conv) {
    free(d->conv->choices);
    for (int i = 0; i < d->conv->nk; i++) clReleaseKernel(d->conv->kernels[i]);
  }
  free(d->conv);
  d->conv = NULL;
  pthread_mutex_unlock(&conv_lock);
}
