/* checkpoint.c — what a module and an optimizer keep in a safetensors file: parameters and
 * buffers under PyTorch's state_dict names, in state_dict order (clpar_module_state_at; with or
 * without DataParallel's "module." prefix), and for a
 * training checkpoint the optimizer's state under the names of PyTorch's optimizer state_dict,
 * the generator's state and the step counters in the metadata. A load checks the whole file
 * (its header) against the module before it changes anything, then reads the data tensor by
 * tensor. Parameters are read and written through the public tensor API (clpar_tensor_read_raw
 * / write_raw / from_host), whatever memory they live in.
 *
 * Dtypes: an entry carries the safetensors dtype of its tensor's clpar_dtype (F32, I32, I64:
 * clpar_st_dtype_of); check_entry accepts a file tensor only of the module tensor's dtype
 * and shape, and reports anything else as mismatched, naming both dtypes. Values travel as
 * raw bytes (clpar_tensor_read_raw / write_raw), little endian as the format's. Module
 * buffers become more named entries, added by add_module and matched by plan_make next to
 * the parameters. A training checkpoint carries a crc32 per tensor in its metadata, checked
 * before a load changes anything (checkpoint_meta.c). Names and values from a file are escaped
 * (clpar_escape) before they go into a message. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "io/checkpoint_internal.h"

#define TRAIN_FORMAT "clpar.train.v1"
#define NOMEM(what) clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what)

/* ---- a growing, comma-separated list of names ---- */

typedef struct {
  char *s;
  size_t len, cap;
  int oom;
} name_list;

static void list_add(name_list *l, const char *fmt, ...) CLPAR_PRINTF(2, 3);
static void list_add(name_list *l, const char *fmt, ...) {
  char item[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(item, sizeof item, fmt, ap);
  va_end(ap);
  size_t need = l->len + strlen(item) + 3;
  if (need > l->cap) {
    size_t cap = need * 2;
    char *s = realloc(l->s, cap);
    if (!s) {
      l->oom = 1;
      return;
    }
    l->s = s;
    l->cap = cap;
  }
  l->len += (size_t)sprintf(l->s + l->len, "%s%s", l->len ? ", " : "", item);
}

static const char *list_str(const name_list *l) {
  return l->len ? l->s : "";
}

/* The list as a malloc'ed string ("" when empty); NULL when out of memory. */
static char *list_take(name_list *l) {
  char *s = l->len ? l->s : strdup("");
  if (!l->len) free(l->s);
  l->s = NULL;
  l->len = l->cap = 0;
  return s;
}

void clpar_load_report_free(clpar_load_report *r) {
  if (!r) return;
  free(r->missing);
  free(r->unexpected);
  free(r->mismatched);
  r->missing = r->unexpected = r->mismatched = NULL;
}

/* ---- a set of tensors to write ---- */

typedef clpar_ckpt_set write_set;

static void set_free(write_set *w) {
  for (int i = 0; i < w->n; i++) free((void *)w->e[i].name);
  for (int i = 0; i < w->n_meta; i++) {
    free(w->keys[i]);
    free(w->values[i]);
  }
  free(w->e);
  free(w->shapes);
  free(w->keys);
  free(w->values);
}

clpar_st_dtype clpar_st_dtype_of(clpar_dtype d) {
  switch (d) {
    case CLPAR_INT32:
      return CLPAR_ST_I32;
    case CLPAR_INT64:
      return CLPAR_ST_I64;
    case CLPAR_BFLOAT16:
      return CLPAR_ST_BF16;
    case CLPAR_FLOAT16:
      return CLPAR_ST_F16;
    default:
      return CLPAR_ST_F32;
  }
}

clpar_status clpar_st_tensor_fill(const void *tensor, void *dst, size_t bytes) {
  return clpar_tensor_read_raw(tensor, dst, bytes);
}

/* Adds t under prefix + name; its values are read from its device as the file is written. */
static clpar_status set_add(write_set *w, const char *prefix, const char *name,
                            const clpar_tensor *t) {
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 16;
    clpar_st_entry *e = realloc(w->e, (size_t)cap * sizeof *e);
    if (e) w->e = e;
    int64_t(*sh)[CLPAR_MAX_DIMS] = realloc(w->shapes, (size_t)cap * sizeof *sh);
    if (sh) w->shapes = sh;
    if (!e || !sh) return NOMEM("checkpoint");
    w->cap = cap;
  }
  char *full = malloc(strlen(prefix) + strlen(name) + 1);
  if (!full) return NOMEM("checkpoint");
  sprintf(full, "%s%s", prefix, name);
  int nd = clpar_tensor_ndim(t);
  for (int k = 0; k < nd; k++) w->shapes[w->n][k] = clpar_tensor_dim(t, k);
  w->e[w->n] = (clpar_st_entry){
      full, clpar_st_dtype_of(clpar_tensor_dtype(t)), nd, NULL, NULL, clpar_st_tensor_fill, t};
  w->n++;
  return CLPAR_OK;
}

static clpar_status meta_add(write_set *w, const char *key, const char *fmt, ...)
    CLPAR_PRINTF(3, 4);
static clpar_status meta_add(write_set *w, const char *key, const char *fmt, ...) {
  if (w->n_meta == w->cap_meta) {
    int cap = w->cap_meta ? 2 * w->cap_meta : 16;
    char **k = realloc(w->keys, (size_t)cap * sizeof *k);
    if (k) w->keys = k;
    char **v = realloc(w->values, (size_t)cap * sizeof *v);
    if (v) w->values = v;
    if (!k || !v) return NOMEM("checkpoint");
    w->cap_meta = cap;
  }
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *value = len >= 0 ? malloc((size_t)len + 1) : NULL;
  if (value) vsnprintf(value, (size_t)len + 1, fmt, ap2);
  va_end(ap2);
  if (!value) return NOMEM("checkpoint");
  char *kk = strdup(key), *vv = value;
  if (!kk) {
    free(vv);
    return NOMEM("checkpoint");
  }
  w->keys[w->n_meta] = kk;
  w->values[w->n_meta] = vv;
  w->n_meta++;
  return CLPAR_OK;
}

static clpar_status set_write(write_set *w, const char *path) {
  for (int i = 0; i < w->n; i++) w->e[i].shape = w->shapes[i]; /* shapes may have moved */
  return clpar_st_write(path, w->e, w->n, (const char *const *)w->keys,
                        (const char *const *)w->values, w->n_meta);
}

/* m's state_dict: its parameters and buffers, in PyTorch's order. */
static clpar_status add_module(write_set *w, const clpar_module *m, const char *prefix) {
  int n = clpar_module_state_count(m);
  for (int i = 0; i < n; i++) {
    const char *name;
    clpar_tensor *p;
    clpar_status s = clpar_module_state_at(m, i, &name, &p, NULL);
    if (s == CLPAR_OK) s = set_add(w, prefix, name, p);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

clpar_status clpar_safetensors_save(const clpar_module *m, const char *path,
                                    const char *const *keys, const char *const *values,
                                    int n_metadata) {
  if (!m || !path || n_metadata < 0 || (n_metadata > 0 && (!keys || !values)))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_safetensors_save: NULL module or path, or bad metadata");
  write_set w = {0};
  clpar_status s = add_module(&w, m, "");
  for (int i = 0; s == CLPAR_OK && i < n_metadata; i++) {
    if (!keys[i] || !values[i])
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: metadata pair %d is NULL", path, i);
    else
      s = meta_add(&w, keys[i], "%s", values[i]);
  }
  if (s == CLPAR_OK) s = set_write(&w, path);
  set_free(&w);
  return s;
}

/* ---- matching a file against a module ---- */

static int same_shape(const clpar_st_tensor *e, const clpar_tensor *t) {
  if (e->ndim != clpar_tensor_ndim(t)) return 0;
  for (int k = 0; k < e->ndim; k++)
    if (e->shape[k] != (uint64_t)clpar_tensor_dim(t, k)) return 0;
  return 1;
}

static void shape_str(const clpar_st_tensor *e, char *buf, size_t size) {
  size_t at = (size_t)snprintf(buf, size, "[");
  for (int k = 0; k < e->ndim && at < size; k++)
    at += (size_t)snprintf(buf + at, size - at, "%s%llu", k ? ", " : "",
                           (unsigned long long)e->shape[k]);
  if (at < size) snprintf(buf + at, size - at, "]");
}

/* Whether file tensor idx can be loaded into t (t's dtype and shape); adds it to bad if not. */
static int check_entry(const clpar_st_file *f, int idx, const clpar_tensor *t, name_list *bad) {
  const clpar_st_tensor *e = &f->tensors[idx];
  clpar_st_dtype want = clpar_st_dtype_of(clpar_tensor_dtype(t));
  if (e->dtype == want && same_shape(e, t)) return 1;
  char fs[160], ms[160];
  shape_str(e, fs, sizeof fs);
  clpar_tensor_shape_str(t, ms, sizeof ms);
  char esc[CLPAR_ESC_SIZE];
  list_add(bad, "%s (%s %s in the file, %s %s in the module)", CLPAR_ESC(e->name, esc),
           clpar_st_dtype_name(e->dtype), fs, clpar_st_dtype_name(want), ms);
  return 0;
}

static int starts_with(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* The file tensor for a module name under prefix: the name itself, else the other form of
 * DataParallel's "module." prefix (with it dropped, or added). -1 when none, -2 when out of
 * memory. */
static int find_for(const clpar_st_file *f, const char *prefix, const char *name) {
  size_t len = strlen(prefix) + strlen("module.") + strlen(name) + 1;
  char *buf = malloc(len);
  if (!buf) return -2;
  snprintf(buf, len, "%s%s", prefix, name);
  int idx = clpar_st_find(f, buf);
  if (idx < 0 && starts_with(name, "module.")) {
    snprintf(buf, len, "%s%s", prefix, name + strlen("module."));
    idx = clpar_st_find(f, buf);
  } else if (idx < 0) {
    snprintf(buf, len, "%smodule.%s", prefix, name);
    idx = clpar_st_find(f, buf);
  }
  free(buf);
  return idx;
}

typedef struct {
  int n; /* the module's state_dict entries: parameters and buffers */
  clpar_tensor **params;
  int *entry; /* per entry: the file tensor to load, or -1 */
  char *used; /* per file tensor: claimed by an entry */
  name_list missing, unexpected, mismatched;
  int loaded;
} plan;

static void plan_free(plan *p) {
  free(p->params);
  free(p->entry);
  free(p->used);
  free(p->missing.s);
  free(p->unexpected.s);
  free(p->mismatched.s);
}

/* Which file tensor (named under prefix) goes into which parameter or buffer of m. */
static clpar_status plan_make(const clpar_module *m, const clpar_st_file *f, const char *prefix,
                              plan *p) {
  memset(p, 0, sizeof *p);
  p->n = clpar_module_state_count(m);
  p->params = calloc((size_t)p->n + 1, sizeof *p->params);
  p->entry = calloc((size_t)p->n + 1, sizeof *p->entry);
  p->used = calloc((size_t)f->n + 1, 1);
  if (!p->params || !p->entry || !p->used) return NOMEM("load");
  for (int i = 0; i < p->n; i++) {
    const char *name;
    clpar_status s = clpar_module_state_at(m, i, &name, &p->params[i], NULL);
    if (s != CLPAR_OK) return s;
    int idx = find_for(f, prefix, name);
    if (idx == -2) return NOMEM("load");
    p->entry[i] = -1;
    if (idx >= 0 && p->used[idx]) idx = -1; /* both forms in the module: the first has it */
    if (idx < 0) {
      list_add(&p->missing, "%s%s", prefix, name);
      continue;
    }
    p->used[idx] = 1;
    if (check_entry(f, idx, p->params[i], &p->mismatched)) p->entry[i] = idx;
  }
  char esc[CLPAR_ESC_SIZE];
  for (int j = 0; j < f->n; j++)
    if (!p->used[j] && starts_with(f->tensors[j].name, prefix))
      list_add(&p->unexpected, "%s", CLPAR_ESC(f->tensors[j].name, esc));
  if (p->missing.oom || p->unexpected.oom || p->mismatched.oom) return NOMEM("load");
  return CLPAR_OK;
}

static int plan_clean(const plan *p) {
  return !p->missing.len && !p->unexpected.len && !p->mismatched.len;
}

static clpar_status plan_error(const char *path, const plan *p) {
  return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                         "%s does not match the module (nothing was loaded): missing: [%s]; "
                         "unexpected: [%s]; mismatched: [%s]",
                         path, list_str(&p->missing), list_str(&p->unexpected),
                         list_str(&p->mismatched));
}

typedef struct {
  const clpar_st_file *f;
  int idx;
} part_source;

/* Reads a tensor's bytes from the file straight into the upload's staging memory. */
static clpar_status read_part(void *user, size_t at, void *dst, size_t n) {
  const part_source *src = user;
  return clpar_st_tensor_read_part(src->f, src->idx, at, dst, n);
}

/* Each tensor goes from the file into pinned staging memory and from there to its device,
 * chunk by chunk (clpar_tensor_write_fill): one host copy, the device's write of a chunk
 * overlapping the read of the next, and no buffer as large as a tensor. */
static clpar_status plan_apply(const clpar_st_file *f, plan *p) {
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < p->n; i++) {
    if (p->entry[i] < 0) continue;
    part_source src = {f, p->entry[i]};
    s = clpar_tensor_write_fill(p->params[i], read_part, &src);
    if (s == CLPAR_OK) p->loaded++;
  }
  return s;
}

clpar_status clpar_safetensors_load(clpar_module *m, const char *path, int strict,
                                    clpar_load_report *report) {
  if (report) memset(report, 0, sizeof *report);
  if (!m || !path)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_safetensors_load: NULL module or path");
  clpar_st_file f;
  clpar_status s = clpar_st_read(path, &f);
  if (s != CLPAR_OK) return s;
  plan p;
  s = plan_make(m, &f, "", &p);
  if (s == CLPAR_OK && strict && !plan_clean(&p)) s = plan_error(path, &p);
  if (s == CLPAR_OK) s = plan_apply(&f, &p);
  if (s == CLPAR_OK && report) {
    report->loaded = p.loaded;
    report->missing = list_take(&p.missing);
    report->unexpected = list_take(&p.unexpected);
    report->mismatched = list_take(&p.mismatched);
    if (!report->missing || !report->unexpected || !report->mismatched) {
      clpar_load_report_free(report);
      s = NOMEM(path);
    }
  }
  plan_free(&p);
  clpar_st_free(&f);
  return s;
}

/* ---- training checkpoints ---- */

/* PyTorch's names for an optimizer's state k of parameter i. */
static const char *state_name(const char *kind, int k) {
  if (strcmp(kind, "SGD") == 0) return k == 0 ? "momentum_buffer" : NULL;
  return k == 0 ? "exp_avg" : "exp_avg_sq";
}

/* Group g's options under "optimizer." (group 0, the keys of files without groups) or
 * "optimizer.group.<g>.", and its parameter count. */
static clpar_status add_options(write_set *w, const clpar_optimizer *o, int g) {
  clpar_sgd_options sgd;
  clpar_adam_options ad;
  clpar_optimizer_group_options(o, g, &sgd, &ad);
  char p[48], k[96];
  snprintf(p, sizeof p, g ? "optimizer.group.%d." : "optimizer.", g);
#define KEY(name) (snprintf(k, sizeof k, "%s%s", p, name), k)
  clpar_status s = meta_add(w, KEY("lr"), "%.9g",
                            (double)(strcmp(clpar_optimizer_kind(o), "SGD") ? ad.lr : sgd.lr));
  if (s == CLPAR_OK && strcmp(clpar_optimizer_kind(o), "SGD") == 0) {
    s = meta_add(w, KEY("momentum"), "%.9g", (double)sgd.momentum);
    if (s == CLPAR_OK) s = meta_add(w, KEY("dampening"), "%.9g", (double)sgd.dampening);
    if (s == CLPAR_OK) s = meta_add(w, KEY("weight_decay"), "%.9g", (double)sgd.weight_decay);
    if (s == CLPAR_OK) s = meta_add(w, KEY("nesterov"), "%d", sgd.nesterov);
  } else if (s == CLPAR_OK) {
    s = meta_add(w, KEY("beta1"), "%.9g", (double)ad.beta1);
    if (s == CLPAR_OK) s = meta_add(w, KEY("beta2"), "%.9g", (double)ad.beta2);
    if (s == CLPAR_OK) s = meta_add(w, KEY("eps"), "%.9g", (double)ad.eps);
    if (s == CLPAR_OK) s = meta_add(w, KEY("weight_decay"), "%.9g", (double)ad.weight_decay);
  }
  snprintf(k, sizeof k, "optimizer.group.%d.params", g);
#undef KEY
  return s == CLPAR_OK ? meta_add(w, k, "%d", clpar_optimizer_group_size(o, g)) : s;
}

static clpar_status add_optimizer(write_set *w, const clpar_optimizer *o) {
  const char *kind = clpar_optimizer_kind(o);
  int n = clpar_optimizer_size(o), groups = clpar_optimizer_group_count(o);
  clpar_status s = meta_add(w, "optimizer.kind", "%s", kind);
  if (s == CLPAR_OK) s = meta_add(w, "optimizer.params", "%d", n);
  if (s == CLPAR_OK) s = meta_add(w, "optimizer.groups", "%d", groups);
  for (int g = 0; s == CLPAR_OK && g < groups; g++) s = add_options(w, o, g);
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    char key[96];
    snprintf(key, sizeof key, "optimizer.state.%d.step", i);
    s = meta_add(w, key, "%lld", (long long)clpar_optimizer_steps_at(o, i));
    for (int k = 0; s == CLPAR_OK && k < 2; k++) {
      const clpar_tensor *t = clpar_optimizer_state_at(o, i, k);
      if (!t) continue;
      snprintf(key, sizeof key, "optimizer.state.%d.%s", i, state_name(kind, k));
      s = set_add(w, "", key, t);
    }
  }
  return s;
}

clpar_status clpar_ckpt_collect(write_set *w, const clpar_module *m, const clpar_optimizer *opt,
                                int64_t step, int64_t epoch) {
  uint64_t seed, counter;
  clpar_rng_state_get(&seed, &counter);
  clpar_status s = meta_add(w, "format", "%s", TRAIN_FORMAT);
  if (s == CLPAR_OK) s = meta_add(w, "step", "%lld", (long long)step);
  if (s == CLPAR_OK) s = meta_add(w, "epoch", "%lld", (long long)epoch);
  if (s == CLPAR_OK) s = meta_add(w, "rng.seed", "%llu", (unsigned long long)seed);
  if (s == CLPAR_OK) s = meta_add(w, "rng.counter", "%llu", (unsigned long long)counter);
  if (s == CLPAR_OK) s = add_module(w, m, "model.");
  if (s == CLPAR_OK && opt) s = add_optimizer(w, opt);
  return s;
}

void clpar_ckpt_set_free(write_set *w) {
  set_free(w);
}

clpar_status clpar_ckpt_meta_add(write_set *w, const char *key, const char *value) {
  return meta_add(w, key, "%s", value);
}

clpar_status clpar_ckpt_write(write_set *w, const char *path) {
  return set_write(w, path);
}

clpar_status clpar_ckpt_add(write_set *w, const char *name, const clpar_tensor *t) {
  return set_add(w, "", name, t);
}

clpar_status clpar_checkpoint_save(const char *path, const clpar_module *m,
                                   const clpar_optimizer *opt, int64_t step, int64_t epoch) {
  return clpar_checkpoint_save_meta(path, m, opt, step, epoch, NULL, NULL, 0);
}

clpar_status clpar_checkpoint_save_meta(const char *path, const clpar_module *m,
                                        const clpar_optimizer *opt, int64_t step, int64_t epoch,
                                        const char *const *keys, const char *const *values,
                                        int n_extra) {
  if (!path || !m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_checkpoint_save: NULL path or module");
  write_set w = {0};
  clpar_status s = clpar_ckpt_collect(&w, m, opt, step, epoch);
  for (int i = 0; s == CLPAR_OK && i < n_extra; i++) s = meta_add(&w, keys[i], "%s", values[i]);
  if (s == CLPAR_OK) s = clpar_ckpt_add_checksums(&w);
  if (s == CLPAR_OK) s = set_write(&w, path);
  set_free(&w);
  return s;
}

/* Group g's options (add_options' keys). */
static clpar_status read_options(const clpar_st_file *f, const char *path, const char *kind, int g,
                                 clpar_sgd_options *sgd, clpar_adam_options *ad) {
  memset(sgd, 0, sizeof *sgd);
  memset(ad, 0, sizeof *ad);
  char p[48], k[96];
  snprintf(p, sizeof p, g ? "optimizer.group.%d." : "optimizer.", g);
#define KEY(name) (snprintf(k, sizeof k, "%s%s", p, name), k)
  clpar_status s;
  if (strcmp(kind, "SGD") == 0) {
    int64_t nesterov = 0;
    s = clpar_ckpt_meta_float(f, path, KEY("lr"), &sgd->lr);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_float(f, path, KEY("momentum"), &sgd->momentum);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_float(f, path, KEY("dampening"), &sgd->dampening);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_float(f, path, KEY("weight_decay"), &sgd->weight_decay);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_i64(f, path, KEY("nesterov"), 0, &nesterov);
    sgd->nesterov = nesterov != 0;
  } else {
    s = clpar_ckpt_meta_float(f, path, KEY("lr"), &ad->lr);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_float(f, path, KEY("beta1"), &ad->beta1);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_float(f, path, KEY("beta2"), &ad->beta2);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_float(f, path, KEY("eps"), &ad->eps);
    if (s == CLPAR_OK) s = clpar_ckpt_meta_float(f, path, KEY("weight_decay"), &ad->weight_decay);
  }
#undef KEY
  return s;
}

/* The optimizer's part of a checkpoint, checked whole: the state tensors (made on each
 * parameter's device, not yet given to the optimizer) and step counts. */
typedef struct {
  int n;
  clpar_tensor *(*state)[2];
  int64_t *steps;
  int groups;             /* the file's groups (1 in a file without them) */
  clpar_sgd_options *sgd; /* each group's options */
  clpar_adam_options *adam;
} opt_plan;

static void opt_plan_free(opt_plan *q) {
  for (int i = 0; q->state && i < q->n; i++) {
    clpar_tensor_free(q->state[i][0]);
    clpar_tensor_free(q->state[i][1]);
  }
  free(q->state);
  free(q->steps);
  free(q->sgd);
  free(q->adam);
}

/* Each group's options into q, checked: a file without groups (older) gives group 0's only;
 * one with groups must have o's, of the same sizes. */
static clpar_status read_groups(const clpar_st_file *f, const char *path, const clpar_optimizer *o,
                                opt_plan *q) {
  int n = clpar_optimizer_group_count(o);
  int64_t fg = 1, size = 0;
  size_t len;
  int has = clpar_st_meta_len(f, "optimizer.groups", &len) != NULL;
  clpar_status s = has ? clpar_ckpt_meta_i64(f, path, "optimizer.groups", 1, &fg) : CLPAR_OK;
  if (s == CLPAR_OK && has && fg != n)
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        "%s holds an optimizer of %lld parameter groups; this one has %d", path,
                        (long long)fg, n);
  q->groups = (int)fg;
  q->sgd = s == CLPAR_OK ? calloc((size_t)fg, sizeof *q->sgd) : NULL;
  q->adam = s == CLPAR_OK ? calloc((size_t)fg, sizeof *q->adam) : NULL;
  if (s == CLPAR_OK && (!q->sgd || !q->adam)) s = NOMEM(path);
  for (int g = 0; s == CLPAR_OK && g < q->groups; g++) {
    char key[64];
    snprintf(key, sizeof key, "optimizer.group.%d.params", g);
    if (has) s = clpar_ckpt_meta_i64(f, path, key, 0, &size);
    if (s == CLPAR_OK && has && size != clpar_optimizer_group_size(o, g))
      s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                          "%s: parameter group %d holds %lld parameters; this optimizer's %d", path,
                          g, (long long)size, clpar_optimizer_group_size(o, g));
    if (s == CLPAR_OK)
      s = read_options(f, path, clpar_optimizer_kind(o), g, &q->sgd[g], &q->adam[g]);
    if (s == CLPAR_OK)
      s = clpar_optimizer_set_group_options((clpar_optimizer *)o, g, &q->sgd[g], &q->adam[g], 0);
  }
  return s;
}

static clpar_status opt_plan_make(const clpar_st_file *f, const char *path,
                                  const clpar_optimizer *o, opt_plan *q) {
  memset(q, 0, sizeof *q);
  char shown[CLPAR_ESC_SIZE + 2];
  const char *kind = clpar_optimizer_kind(o),
             *fkind = clpar_ckpt_meta_text(f, "optimizer.kind", shown, sizeof shown);
  int n = clpar_optimizer_size(o);
  int64_t fn = 0;
  if (!fkind)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s holds no optimizer state", path);
  if (strcmp(fkind, kind) != 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s holds the state of %s, not of %s",
                           path, shown, kind);
  clpar_status s = clpar_ckpt_meta_i64(f, path, "optimizer.params", 0, &fn);
  if (s == CLPAR_OK && fn != n)
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        "%s holds an optimizer of %lld parameters; this one has %d", path,
                        (long long)fn, n);
  if (s == CLPAR_OK) s = read_groups(f, path, o, q);
  if (s != CLPAR_OK) return s;
  q->state = calloc((size_t)n + 1, sizeof *q->state);
  q->steps = calloc((size_t)n + 1, sizeof *q->steps);
  char *used = calloc((size_t)f->n + 1, 1);
  if (!q->state || !q->steps || !used) s = NOMEM(path);
  q->n = n;
  name_list bad = {0};
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    char key[96];
    snprintf(key, sizeof key, "optimizer.state.%d.step", i);
    s = clpar_ckpt_meta_i64(f, path, key, 0, &q->steps[i]);
    clpar_tensor *p = clpar_optimizer_param_at(o, i);
    for (int k = 0; s == CLPAR_OK && k < 2 && state_name(kind, k); k++) {
      snprintf(key, sizeof key, "optimizer.state.%d.%s", i, state_name(kind, k));
      int idx = clpar_st_find(f, key);
      if (idx < 0) continue; /* not made yet when saved: made at the next step */
      used[idx] = 1;
      if (!check_entry(f, idx, p, &bad)) continue;
      float *v = malloc((size_t)clpar_tensor_numel(p) * sizeof *v);
      int64_t shape[CLPAR_MAX_DIMS];
      int nd = clpar_tensor_ndim(p);
      for (int d = 0; d < nd; d++) shape[d] = clpar_tensor_dim(p, d);
      s = v ? clpar_st_tensor_read(f, idx, v) : NOMEM(path);
      if (s == CLPAR_OK)
        s = clpar_tensor_from_host(clpar_tensor_device(p), nd, shape, v, &q->state[i][k]);
      if (s == CLPAR_OK) clpar_tensor_unscope(q->state[i][k]);
      free(v);
    }
  }
  char esc[CLPAR_ESC_SIZE];
  for (int j = 0; s == CLPAR_OK && j < f->n; j++)
    if (!used[j] && starts_with(f->tensors[j].name, "optimizer."))
      list_add(&bad, "%s (unexpected)", CLPAR_ESC(f->tensors[j].name, esc));
  if (s == CLPAR_OK && bad.len)
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        "%s: the optimizer's state does not match (nothing was loaded): %s", path,
                        bad.s);
  free(bad.s);
  free(used);
  return s;
}

static clpar_status read_counters(const clpar_st_file *f, const char *path, int64_t *step,
                                  int64_t *epoch, uint64_t *seed, uint64_t *counter) {
  char shown[CLPAR_ESC_SIZE + 2];
  const char *format = clpar_ckpt_meta_text(f, "format", shown, sizeof shown);
  if (!format || strcmp(format, TRAIN_FORMAT) != 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s is not a clpar training checkpoint (metadata format %s, "
                           "expected \"%s\")",
                           path, shown, TRAIN_FORMAT);
  clpar_status s = clpar_ckpt_meta_i64(f, path, "step", INT64_MIN, step);
  if (s == CLPAR_OK) s = clpar_ckpt_meta_i64(f, path, "epoch", INT64_MIN, epoch);
  if (s == CLPAR_OK) s = clpar_ckpt_meta_u64(f, path, "rng.seed", seed);
  if (s == CLPAR_OK) s = clpar_ckpt_meta_u64(f, path, "rng.counter", counter);
  return s;
}

clpar_status clpar_ckpt_load_file(const clpar_st_file *f, const char *path, clpar_module *m,
                                  clpar_optimizer *opt, int64_t *step, int64_t *epoch) {
  int64_t st = 0, ep = 0;
  uint64_t seed = 0, counter = 0;
  plan p;
  opt_plan q = {0};
  memset(&p, 0, sizeof p);
  clpar_status s = read_counters(f, path, &st, &ep, &seed, &counter);
  if (s == CLPAR_OK) s = clpar_ckpt_verify(f, path);
  if (s == CLPAR_OK) s = plan_make(m, f, "model.", &p);
  if (s == CLPAR_OK && !plan_clean(&p)) s = plan_error(path, &p);
  if (s == CLPAR_OK && opt) s = opt_plan_make(f, path, opt, &q);
  if (s == CLPAR_OK) s = plan_apply(f, &p);
  if (s == CLPAR_OK && opt) {
    for (int g = 0; s == CLPAR_OK && g < q.groups; g++)
      s = clpar_optimizer_set_group_options(opt, g, &q.sgd[g], &q.adam[g], 1);
    for (int i = 0; s == CLPAR_OK && i < q.n; i++) {
      clpar_optimizer_restore(opt, i, q.state[i][0], q.state[i][1], q.steps[i]);
      q.state[i][0] = q.state[i][1] = NULL;
    }
  }
  if (s == CLPAR_OK) {
    clpar_rng_state_set(seed, counter);
    if (step) *step = st;
    if (epoch) *epoch = ep;
  }
  opt_plan_free(&q);
  plan_free(&p);
  return s;
}

clpar_status clpar_ckpt_read_options(const clpar_st_file *f, const char *path, const char *kind,
                                     clpar_sgd_options *sgd, clpar_adam_options *adam) {
  return read_options(f, path, kind, 0, sgd, adam); /* group 0: a ZeRO optimizer has one */
}

clpar_status clpar_checkpoint_load(const char *path, clpar_module *m, clpar_optimizer *opt,
                                   int64_t *step, int64_t *epoch) {
  if (!path || !m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_checkpoint_load: NULL path or module");
  clpar_st_file f;
  clpar_status s = clpar_st_read(path, &f);
  if (s != CLPAR_OK) return s;
  s = clpar_ckpt_load_file(&f, path, m, opt, step, epoch);
  clpar_st_free(&f);
  return s;
}
