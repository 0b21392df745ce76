/* amp_checkpoint.c — the loss scaler's state in a training checkpoint: GradScaler's
 * state_dict() entries as metadata strings "scaler.<name>" beside the model and optimizer
 * (src/io/checkpoint.c writes and loads those). The scale is written with 9 significant
 * digits and the factors with 17, so that each reads back to the same float or double. */
#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/amp.h"
#include "internal.h"
#include "io/safetensors.h"

enum { N_KEYS = 5 };
static const char *const keys[N_KEYS] = {"scaler.scale", "scaler.growth_factor",
                                         "scaler.backoff_factor", "scaler.growth_interval",
                                         "scaler._growth_tracker"};

clpar_status clpar_checkpoint_save_scaler(const char *path, const clpar_module *m,
                                          const clpar_optimizer *opt, const clpar_grad_scaler *s,
                                          int64_t step, int64_t epoch) {
  if (!s || !clpar_grad_scaler_is_enabled(s))
    return clpar_checkpoint_save_meta(path, m, opt, step, epoch, NULL, NULL, 0);
  clpar_grad_scaler_state st;
  clpar_status e = clpar_grad_scaler_state_get(s, &st);
  if (e != CLPAR_OK) return e;
  char text[N_KEYS][40];
  const char *values[N_KEYS];
  snprintf(text[0], sizeof text[0], "%.9g", (double)st.scale);
  snprintf(text[1], sizeof text[1], "%.17g", st.growth_factor);
  snprintf(text[2], sizeof text[2], "%.17g", st.backoff_factor);
  snprintf(text[3], sizeof text[3], "%lld", (long long)st.growth_interval);
  snprintf(text[4], sizeof text[4], "%lld", (long long)st.growth_tracker);
  for (int i = 0; i < N_KEYS; i++) values[i] = text[i];
  return clpar_checkpoint_save_meta(path, m, opt, step, epoch, keys, values, N_KEYS);
}

/* Entry i of the file's metadata as a number: *d for the first three, *n the last two. */
static clpar_status read_entry(const clpar_st_file *f, const char *path, int i, double *d,
                               int64_t *n) {
  size_t len = 0;
  const char *v = clpar_st_meta_len(f, keys[i], &len);
  if (!v)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_checkpoint_load_scaler: %s holds no loss scaler state (no "
                           "metadata \"%s\": saved without a scaler, or with a disabled one)",
                           path, keys[i]);
  char *end = NULL, esc[CLPAR_ESC_SIZE];
  errno = 0;
  if (i < 3)
    *d = strtod(v, &end);
  else
    *n = strtoll(v, &end, 10);
  if (!*v || *end || errno || strlen(v) != len)
    return clpar_set_error(
        CLPAR_ERROR_CORRUPT, "clpar_checkpoint_load_scaler: %s: metadata \"%s\" is \"%s\", not %s",
        path, keys[i], clpar_escape(v, len, esc, sizeof esc), i < 3 ? "a number" : "an integer");
  return CLPAR_OK;
}

static clpar_status read_state(const char *path, clpar_grad_scaler_state *st) {
  clpar_st_file f;
  clpar_status e = clpar_st_read(path, &f);
  if (e != CLPAR_OK) return e;
  double d[N_KEYS] = {0};
  int64_t n[N_KEYS] = {0};
  for (int i = 0; e == CLPAR_OK && i < N_KEYS; i++) e = read_entry(&f, path, i, &d[i], &n[i]);
  clpar_st_free(&f);
  if (e != CLPAR_OK) return e;
  if (!(d[0] <= FLT_MAX))
    return clpar_set_error(CLPAR_ERROR_CORRUPT,
                           "clpar_checkpoint_load_scaler: %s: metadata \"%s\" is %g, beyond a "
                           "float",
                           path, keys[0], d[0]);
  *st = (clpar_grad_scaler_state){(float)d[0], d[1], d[2], n[3], n[4]};
  clpar_grad_scaler *check = NULL;
  e = clpar_grad_scaler_create(NULL, &check);
  if (e == CLPAR_OK) e = clpar_grad_scaler_state_set(check, st);
  clpar_grad_scaler_free(check);
  if (e != CLPAR_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", clpar_last_error());
    return clpar_set_error(CLPAR_ERROR_CORRUPT, "clpar_checkpoint_load_scaler: %s: %s", path, why);
  }
  return CLPAR_OK;
}

clpar_status clpar_checkpoint_load_scaler(const char *path, clpar_module *m, clpar_optimizer *opt,
                                          clpar_grad_scaler *s, int64_t *step, int64_t *epoch) {
  clpar_grad_scaler_state st;
  int take = s && clpar_grad_scaler_is_enabled(s) && path;
  clpar_status e = take ? read_state(path, &st) : CLPAR_OK;
  if (e == CLPAR_OK) e = clpar_checkpoint_load(path, m, opt, step, epoch);
  if (e == CLPAR_OK && take) e = clpar_grad_scaler_state_set(s, &st);
  return e;
}
