/* dropout.c — F.dropout and nn.Dropout with a counter-based mask.
 *
 * The mask is made on the device from (seed, offset): element i is dropped when value
 * offset + i of src/rng.c's generator for seed is below p (the others are scaled by
 * 1 / (1 - p)). It is a pure function of those numbers, so a step gives the same mask on
 * every backend and when it is computed again (recompute, a replayed step). The output is
 * x * mask, so the backward is g * mask. A Dropout module keeps a seed (drawn from the
 * parameter seed stream when it is made, so clpar_manual_seed fixes it) and an offset that
 * each training forward advances by the input's numel. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
  float p;
  uint64_t seed;
  uint64_t offset; /* atomic */
} dropout_state;

clpar_status clpar_dropout(const clpar_tensor *x, float p, int training, uint64_t seed,
                           uint64_t offset, clpar_tensor **out) {
  if (!x || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_dropout: input or out is NULL");
  clpar_status s = clpar_check_float("clpar_dropout", "input", x);
  if (s != CLPAR_OK) return s;
  if (!(p >= 0.0f && p <= 1.0f))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_dropout: p is %g; need a probability in [0, 1]", (double)p);
  if (!training || p == 0.0f) /* identity: a view of x, differentiable */
    return clpar_tensor_reshape((clpar_tensor *)x, x->ndim, x->shape, out);
  clpar_device *dev = x->storage->dev;
  clpar_tensor *mask = NULL;
  s = clpar_tensor_empty(dev, x->ndim, x->shape, &mask);
  float scale = p < 1.0f ? (float)(1.0 / (1.0 - (double)p)) : 0.0f;
  if (s == CLPAR_OK)
    s = clpar_dev_dropout_mask(dev, (size_t)x->numel, seed, offset, p, scale,
                               clpar_tensor_bref(mask));
  if (s == CLPAR_OK)
    s = clpar_mul(x, mask, out);
  else if (mask)
    clpar_device_fail(dev, s);
  clpar_tensor_free(mask);
  return s;
}

static clpar_status dropout_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                    void *user) {
  dropout_state *st = user;
  int training = clpar_module_is_training(self);
  uint64_t seed = st->seed, off = 0;
  int draws = training && st->p > 0.0f && x;
  if (draws) clpar_rng_draw(st->seed, &st->offset, (uint64_t)x->numel, &seed, &off);
  clpar_status s = clpar_dropout(x, st->p, training, seed, off, y);
  if (s == CLPAR_OK && draws) s = clpar_dropout_capture(st->seed, &st->offset, x, seed, off);
  if (s != CLPAR_OK && draws && *y) { /* the capture refused: no output */
    clpar_tensor_free(*y);
    *y = NULL;
  }
  return s;
}

/* A captured graph's patch may point at the state: graphs refuse to replay once it is gone. */
static void dropout_state_free(void *user) {
  clpar_graph_invalidate_all("the freeing of a Dropout module");
  free(user);
}

clpar_status clpar_dropout_create(float p, clpar_module **out) {
  const char *fn = "clpar_dropout_create";
  if (!out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  if (!(p >= 0.0f && p <= 1.0f))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: p is %g; need a probability in [0, 1]", fn, (double)p);
  dropout_state *st = calloc(1, sizeof *st);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  st->p = p;
  st->seed = clpar_param_seed_next();
  clpar_status s = clpar_module_create("Dropout", dropout_forward, st, dropout_state_free, out);
  if (s != CLPAR_OK) free(st);
  return s;
}

static clpar_status state_of(const clpar_module *m, const char *fn, dropout_state **st) {
  if (!m || strcmp(clpar_module_type(m), "Dropout") != 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: not a Dropout module (%s)", fn,
                           m ? clpar_module_type(m) : "NULL");
  *st = m->user;
  return CLPAR_OK;
}

clpar_status clpar_dropout_set_state(clpar_module *m, uint64_t seed, uint64_t offset) {
  dropout_state *st;
  clpar_status s = state_of(m, "clpar_dropout_set_state", &st);
  if (s != CLPAR_OK) return s;
  st->seed = seed;
  __atomic_store_n(&st->offset, offset, __ATOMIC_RELAXED);
  return CLPAR_OK;
}

clpar_status clpar_dropout_get_state(const clpar_module *m, uint64_t *seed, uint64_t *offset) {
  dropout_state *st;
  clpar_status s = state_of(m, "clpar_dropout_get_state", &st);
  if (s != CLPAR_OK) return s;
  if (seed) *seed = st->seed;
  if (offset) *offset = __atomic_load_n(&st->offset, __ATOMIC_RELAXED);
  return CLPAR_OK;
}
