/* amp.c — the dynamic loss scaler (amp.h), torch.cuda.amp.GradScaler's rules.
 *
 * The inf/NaN check runs on each gradient's device, composed from the backend's primitives:
 * g - g is 0 for a finite element and NaN for an inf or a NaN, and a sum of those is 0 exactly
 * when every element is finite (NaN propagates through every add). Each gradient piece (a flat
 * group's whole gradient, or one parameter's) is checked CHUNK elements at a time into one
 * partial sum per chunk, the partial sums of a device are summed into one float, and that
 * float is read back; then every piece is multiplied in place by the inverse scale, after its
 * check on the same queue (PyTorch checks the scaled values, then multiplies). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/amp.h"
#include "internal.h"

#define CHUNK ((int64_t)1 << 20) /* elements checked at a time: the scratch buffer's size */

enum { STAGE_READY = 0, STAGE_UNSCALED = 1, STAGE_STEPPED = 2 };

/* What one optimizer did since the last update (PyTorch's _per_optimizer_states). */
typedef struct {
  const clpar_optimizer *opt;
  int stage;
  int found; /* an inf or a NaN in its gradients (agreed across ranks) */
} opt_record;

struct clpar_grad_scaler {
  int enabled;
  float scale;
  double growth_factor, backoff_factor;
  int64_t growth_interval, growth_tracker;
  opt_record *records;
  int n_records, cap_records;
  /* an unscale's work arrays, one entry per parameter, grown to the largest optimizer */
  clpar_tensor **ts, **leaves, **grads;
  int *group_of, *counts;
  struct dev_work *work;
  size_t cap_work;
};

typedef struct dev_work {
  clpar_device *dev;
  int64_t chunks, largest;
  clpar_tensor *partial, *scratch, *total;
} dev_work;

/* A field left 0 takes its default; CLPAR_ZERO is a literal 0 (refused by the checks). */
static double opt_double(double v, double def) {
  if (v == 0.0) return def;
  return v == (double)CLPAR_ZERO ? 0.0 : v;
}

/* what: the fields' prefix ("options.", "state."); scale_name: the scale's field. */
static clpar_status check_state(const char *fn, const char *what, const char *scale_name,
                                double scale, double growth, double backoff, int64_t interval) {
  const char *bad = !(scale > 0.0 && scale <= FLT_MAX)    ? scale_name
                    : !(growth > 1.0 && isfinite(growth)) ? "growth_factor"
                    : !(backoff > 0.0 && backoff < 1.0)   ? "backoff_factor"
                    : interval < 1                        ? "growth_interval"
                                                          : NULL;
  if (!bad) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "%s: %s%s is out of range (%s %g must be > 0 and fit a float, "
                         "growth_factor %g > 1, backoff_factor %g in (0, 1), growth_interval "
                         "%lld >= 1)",
                         fn, what, bad, scale_name, scale, growth, backoff, (long long)interval);
}

clpar_status clpar_grad_scaler_create(const clpar_grad_scaler_options *options,
                                      clpar_grad_scaler **out) {
  const char *fn = "clpar_grad_scaler_create";
  if (!out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  clpar_grad_scaler_options o = options ? *options : (clpar_grad_scaler_options){0};
  double init = opt_double(o.init_scale, 65536.0);
  double growth = opt_double(o.growth_factor, 2.0), backoff = opt_double(o.backoff_factor, 0.5);
  int64_t interval = o.growth_interval == 0 ? 2000 : o.growth_interval;
  clpar_status st = check_state(fn, "options.", "init_scale", init, growth, backoff, interval);
  if (st != CLPAR_OK) return st;
  clpar_grad_scaler *s = calloc(1, sizeof *s);
  if (!s) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  s->enabled = !o.disabled;
  s->scale = (float)init;
  s->growth_factor = growth;
  s->backoff_factor = backoff;
  s->growth_interval = interval;
  *out = s;
  return CLPAR_OK;
}

void clpar_grad_scaler_free(clpar_grad_scaler *s) {
  if (!s) return;
  free(s->records);
  free(s->ts), free(s->leaves), free(s->grads), free(s->group_of), free(s->counts);
  free(s->work);
  free(s);
}

clpar_status clpar_grad_scaler_scale(clpar_grad_scaler *s, const clpar_tensor *loss,
                                     clpar_tensor **scaled) {
  if (!s || !loss || !scaled)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_grad_scaler_scale: NULL %s",
                           !s      ? "scaler"
                           : !loss ? "loss"
                                   : "out");
  return clpar_scale(loss, s->enabled ? s->scale : 1.0f, scaled);
}

/* The record of opt, made READY when new; NULL when out of memory. */
static opt_record *record_for(clpar_grad_scaler *s, const clpar_optimizer *opt) {
  for (int i = 0; i < s->n_records; i++)
    if (s->records[i].opt == opt) return &s->records[i];
  if (s->n_records == s->cap_records) {
    int cap = s->cap_records ? 2 * s->cap_records : 4;
    opt_record *r = realloc(s->records, (size_t)cap * sizeof *r);
    if (!r) return NULL;
    s->records = r;
    s->cap_records = cap;
  }
  s->records[s->n_records] = (opt_record){.opt = opt, .stage = STAGE_READY};
  return &s->records[s->n_records++];
}

/* The gradient pieces of the optimizer's parameters: a flat group all of whose members are
 * held with a gradient each is one piece (its leaf's gradient), any other gradient its own.
 * ts, group_of, leaves, counts and grads hold n entries each. */
static int collect(clpar_tensor **ts, int n, int *group_of, clpar_tensor **leaves, int *counts,
                   clpar_tensor **grads) {
  int n_groups = clpar_flat_whole_groups(ts, n, group_of, leaves, counts);
  for (int k = 0; k < n_groups; k++) counts[k] = 1; /* 1: every member has a gradient */
  for (int i = 0; i < n; i++)
    if (group_of[i] >= 0 && !clpar_tensor_has_grad(ts[i])) counts[group_of[i]] = 0;
  int np = 0;
  for (int i = 0; i < n; i++) {
    int k = group_of[i];
    if (k >= 0 && counts[k] == 1 && leaves[k]->grad && leaves[k]->numel > 0)
      grads[np++] = leaves[k]->grad;
    if (k >= 0 && counts[k] >= 1) {
      counts[k] = 2; /* its piece is in */
      continue;
    }
    if (clpar_tensor_has_grad(ts[i]) && ts[i]->grad->numel > 0) grads[np++] = ts[i]->grad;
  }
  return np;
}

static dev_work *work_for(dev_work *w, int *nw, clpar_device *dev) {
  for (int k = 0; k < *nw; k++)
    if (w[k].dev == dev) return &w[k];
  w[*nw] = (dev_work){.dev = dev};
  return &w[(*nw)++];
}

/* One piece's check: a partial sum of (g - g) per chunk into d->partial. */
static clpar_status check_piece(dev_work *d, clpar_tensor *g) {
  clpar_bref gb = clpar_tensor_bref(g), sb = clpar_tensor_bref(d->scratch);
  for (int64_t at = 0; at < g->numel; at += CHUNK) {
    size_t len = (size_t)(g->numel - at < CHUNK ? g->numel - at : CHUNK);
    clpar_bref c = {gb.buf, gb.off + (size_t)at}, out = clpar_tensor_bref(d->partial);
    out.off += (size_t)d->chunks++;
    clpar_status s = clpar_dev_binary(d->dev, CLPAR_BINARY_SUB, len, 1, c, c, len, sb);
    if (s == CLPAR_OK) s = clpar_dev_reduce_sum(d->dev, 1, len, 1, sb, out);
    if (s != CLPAR_OK) return clpar_device_fail(d->dev, s);
  }
  return CLPAR_OK;
}

/* Checks and unscales the pieces; *found is 1 when a device's sum is not 0. */
static clpar_status check_and_unscale(clpar_tensor **grads, int np, dev_work *w, float inv,
                                      int *found) {
  int nw = 0;
  int64_t one = 1;
  for (int i = 0; i < np; i++) {
    dev_work *d = work_for(w, &nw, grads[i]->storage->dev);
    d->chunks += (grads[i]->numel + CHUNK - 1) / CHUNK;
    if (grads[i]->numel > d->largest)
      d->largest = grads[i]->numel < CHUNK ? grads[i]->numel : CHUNK;
  }
  clpar_status s = CLPAR_OK;
  for (int k = 0; s == CLPAR_OK && k < nw; k++) {
    s = clpar_tensor_empty(w[k].dev, 1, &w[k].chunks, &w[k].partial);
    if (s == CLPAR_OK) s = clpar_tensor_empty(w[k].dev, 1, &w[k].largest, &w[k].scratch);
    if (s == CLPAR_OK) s = clpar_tensor_empty(w[k].dev, 1, &one, &w[k].total);
    w[k].chunks = 0; /* counts the partial sums written */
  }
  for (int i = 0; s == CLPAR_OK && i < np; i++)
    s = check_piece(work_for(w, &nw, grads[i]->storage->dev), grads[i]);
  for (int k = 0; s == CLPAR_OK && k < nw; k++) {
    s = clpar_dev_reduce_sum(w[k].dev, 1, (size_t)w[k].chunks, 1, clpar_tensor_bref(w[k].partial),
                             clpar_tensor_bref(w[k].total));
    if (s != CLPAR_OK) s = clpar_device_fail(w[k].dev, s);
  }
  for (int i = 0; s == CLPAR_OK && i < np; i++) {
    clpar_bref gb = clpar_tensor_bref(grads[i]);
    clpar_device *dev = grads[i]->storage->dev;
    s = clpar_dev_scale(dev, (size_t)grads[i]->numel, inv, gb, gb);
    clpar_tensor_touch(grads[i]);
    if (s != CLPAR_OK) s = clpar_device_fail(dev, s);
  }
  for (int k = 0; s == CLPAR_OK && k < nw; k++) {
    float v = 0.0f;
    s = clpar_tensor_read(w[k].total, &v, 1);
    if (!(v == 0.0f)) *found = 1;
  }
  for (int k = 0; k < nw; k++) {
    clpar_tensor_free(w[k].partial);
    clpar_tensor_free(w[k].scratch);
    clpar_tensor_free(w[k].total);
  }
  return s;
}

static clpar_status no_memory(const char *fn) {
  return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
}

/* Every rank's finding, agreed (MAX) when this process is one rank of an MPI job of 2+. */
static clpar_status agree(int *found) {
  if (clpar_dist_world_size() < 2) return CLPAR_OK;
  float f = *found ? 1.0f : 0.0f;
  clpar_status s = clpar_dist_all_reduce_max(&f, 1);
  if (s == CLPAR_OK) *found = f != 0.0f;
  return s;
}

/* The work arrays hold m entries at least (grown by realloc; kept on failure). */
static clpar_status reserve(const char *fn, clpar_grad_scaler *s, size_t m) {
  if (m <= s->cap_work) return CLPAR_OK;
  void **slots[] = {(void **)&s->ts,       (void **)&s->leaves, (void **)&s->grads,
                    (void **)&s->group_of, (void **)&s->counts, (void **)&s->work};
  size_t sizes[] = {sizeof *s->ts,       sizeof *s->leaves, sizeof *s->grads,
                    sizeof *s->group_of, sizeof *s->counts, sizeof *s->work};
  for (int k = 0; k < 6; k++) {
    void *p = realloc(*slots[k], m * sizes[k]);
    if (!p) return no_memory(fn);
    *slots[k] = p;
  }
  s->cap_work = m;
  return CLPAR_OK;
}

/* The optimizer's gradients, checked for a float dtype, as pieces (collect) into s->grads. */
static clpar_status gather(const char *fn, clpar_grad_scaler *s, const clpar_optimizer *opt,
                           int *np) {
  int n = clpar_optimizer_size(opt);
  clpar_status st = reserve(fn, s, n > 0 ? (size_t)n : 1);
  for (int i = 0; st == CLPAR_OK && i < n; i++) {
    s->ts[i] = clpar_optimizer_param_at(opt, i);
    if (clpar_tensor_has_grad(s->ts[i])) st = clpar_check_float(fn, "a gradient", s->ts[i]->grad);
  }
  if (st == CLPAR_OK) *np = collect(s->ts, n, s->group_of, s->leaves, s->counts, s->grads);
  return st;
}

/* Unscales and checks; the record's found and stage are set only when all went well. */
static clpar_status unscale(const char *fn, clpar_grad_scaler *s, clpar_optimizer *opt,
                            opt_record *r) {
  int np = 0, found = 0;
  clpar_status st = gather(fn, s, opt, &np);
  if (st == CLPAR_OK) memset(s->work, 0, s->cap_work * sizeof *s->work);
  /* PyTorch takes the reciprocal in double: float division may be inexact on some builds */
  float inv = (float)(1.0 / (double)s->scale);
  if (st == CLPAR_OK && np > 0) st = check_and_unscale(s->grads, np, s->work, inv, &found);
  if (st == CLPAR_OK) st = agree(&found);
  if (st != CLPAR_OK) return st;
  r->found = found;
  r->stage = STAGE_UNSCALED;
  return CLPAR_OK;
}

static clpar_status check_call(const char *fn, clpar_grad_scaler *s, clpar_optimizer *opt) {
  if (s && opt) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL %s", fn,
                         !s ? "scaler" : "optimizer");
}

clpar_status clpar_grad_scaler_unscale(clpar_grad_scaler *s, clpar_optimizer *opt) {
  const char *fn = "clpar_grad_scaler_unscale";
  clpar_status st = check_call(fn, s, opt);
  if (st != CLPAR_OK || !s->enabled) return st;
  opt_record *r = record_for(s, opt);
  if (!r) return no_memory(fn);
  if (r->stage != STAGE_READY)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: %s for this optimizer since the last clpar_grad_scaler_update", fn,
                           r->stage == STAGE_UNSCALED ? "already called" : "called after the step");
  return unscale(fn, s, opt, r);
}

clpar_status clpar_grad_scaler_step(clpar_grad_scaler *s, clpar_optimizer *opt, int *skipped) {
  const char *fn = "clpar_grad_scaler_step";
  if (skipped) *skipped = 0;
  clpar_status st = check_call(fn, s, opt);
  if (st != CLPAR_OK) return st;
  if (!s->enabled) return clpar_optimizer_step(opt);
  opt_record *r = record_for(s, opt);
  if (!r) return no_memory(fn);
  if (r->stage == STAGE_STEPPED)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: already called for this optimizer since the last "
                           "clpar_grad_scaler_update",
                           fn);
  if (r->stage == STAGE_READY) st = unscale(fn, s, opt, r);
  if (st == CLPAR_OK && !r->found) st = clpar_optimizer_step(opt);
  if (st != CLPAR_OK) return st;
  r->stage = STAGE_STEPPED;
  if (skipped) *skipped = r->found;
  return CLPAR_OK;
}

/* PyTorch's amp_update_scale kernel: float * double products rounded to float. */
clpar_status clpar_grad_scaler_update(clpar_grad_scaler *s) {
  const char *fn = "clpar_grad_scaler_update";
  if (!s) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL scaler", fn);
  if (!s->enabled) return CLPAR_OK;
  int found = 0, checked = 0;
  for (int i = 0; i < s->n_records; i++) {
    if (s->records[i].stage == STAGE_READY) continue;
    checked = 1;
    found |= s->records[i].found;
  }
  if (!checked)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: no gradients were unscaled since the last update (call "
                           "clpar_grad_scaler_step or clpar_grad_scaler_unscale first)",
                           fn);
  if (found) {
    s->scale = (float)((double)s->scale * s->backoff_factor);
    s->growth_tracker = 0;
  } else if (s->growth_tracker + 1 == s->growth_interval) {
    /* a product that rounds to inf is not taken (and not converted: that would be UB) */
    double grown = (double)s->scale * s->growth_factor;
    if (grown < 0x1.ffffffp+127) s->scale = (float)grown;
    s->growth_tracker = 0;
  } else {
    s->growth_tracker++;
  }
  s->n_records = 0;
  return CLPAR_OK;
}

float clpar_grad_scaler_get_scale(const clpar_grad_scaler *s) {
  return s && s->enabled ? s->scale : 1.0f;
}

int clpar_grad_scaler_is_enabled(const clpar_grad_scaler *s) {
  return s && s->enabled;
}

clpar_status clpar_grad_scaler_set_scale(clpar_grad_scaler *s, float scale) {
  const char *fn = "clpar_grad_scaler_set_scale";
  if (!s) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL scaler", fn);
  if (!(scale > 0.0f && isfinite(scale)))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: scale is %g; it must be finite and > 0", fn, (double)scale);
  if (s->enabled) s->scale = scale;
  return CLPAR_OK;
}

clpar_status clpar_grad_scaler_state_get(const clpar_grad_scaler *s, clpar_grad_scaler_state *out) {
  const char *fn = "clpar_grad_scaler_state_get";
  if (!s || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL %s", fn, !s ? "scaler" : "out");
  if (!s->enabled)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: the scaler is disabled and has no state (PyTorch's empty "
                           "state_dict)",
                           fn);
  *out = (clpar_grad_scaler_state){s->scale, s->growth_factor, s->backoff_factor,
                                   s->growth_interval, s->growth_tracker};
  return CLPAR_OK;
}

static clpar_status check_loaded(const char *fn, const char *what,
                                 const clpar_grad_scaler_state *st) {
  clpar_status s = check_state(fn, what, "scale", st->scale, st->growth_factor, st->backoff_factor,
                               st->growth_interval);
  if (s == CLPAR_OK && !(st->growth_tracker >= 0 && st->growth_tracker < st->growth_interval))
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "%s: %sgrowth_tracker is %lld; it must be in [0, growth_interval %lld)", fn,
                        what, (long long)st->growth_tracker, (long long)st->growth_interval);
  return s;
}

clpar_status clpar_grad_scaler_state_set(clpar_grad_scaler *s, const clpar_grad_scaler_state *st) {
  const char *fn = "clpar_grad_scaler_state_set";
  if (!s || !st)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL %s", fn,
                           !s ? "scaler" : "state");
  if (!s->enabled) return CLPAR_OK;
  clpar_status e = check_loaded(fn, "state.", st);
  if (e != CLPAR_OK) return e;
  s->scale = st->scale;
  s->growth_factor = st->growth_factor;
  s->backoff_factor = st->backoff_factor;
  s->growth_interval = st->growth_interval;
  s->growth_tracker = st->growth_tracker;
  return CLPAR_OK;
}
