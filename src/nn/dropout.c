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

/* A captured forward's mask at each replay: the next offset, drawn as the eager forward would.
 * A recompute of that forward in the same capture (activation checkpointing, whose eager
 * recompute replays the forward's draw) takes the draw of the same replay: its patch runs after
 * the forward's, which is earlier on the same device. The forward draws of the capture in
 * progress and of live graphs are listed, so that the recompute can find its forward's. */
typedef struct replay_draw {
  dropout_state *st;
  uint64_t numel;
  const void *capture;   /* the device's recording the draw was captured into */
  uint64_t seed, offset; /* the capture run's draw, then the latest replay's */
  struct replay_draw *next;
} replay_draw;

static pthread_mutex_t draws_lock = PTHREAD_MUTEX_INITIALIZER;
static replay_draw *listed; /* every forward draw of a live graph */

static clpar_status draw_again(void *user, clpar_patch_args *a) {
  replay_draw *r = user;
  clpar_rng_draw(r->st->seed, &r->st->offset, r->numel, &r->seed, &r->offset);
  a->rng.seed = r->seed;
  a->rng.offset = r->offset;
  return CLPAR_OK;
}

static clpar_status same_draw(void *user, clpar_patch_args *a) {
  const replay_draw *r = *(replay_draw *const *)user;
  a->rng.seed = r->seed;
  a->rng.offset = r->offset;
  return CLPAR_OK;
}

static void draw_free(void *user) {
  pthread_mutex_lock(&draws_lock);
  for (replay_draw **p = &listed; *p; p = &(*p)->next)
    if (*p == user) {
      *p = ((replay_draw *)user)->next;
      break;
    }
  pthread_mutex_unlock(&draws_lock);
  free(user);
}

/* The listed forward draw of st captured into capture as (seed, offset), or NULL. */
static replay_draw *forward_draw(const dropout_state *st, const void *capture, uint64_t seed,
                                 uint64_t offset) {
  pthread_mutex_lock(&draws_lock);
  replay_draw *r = listed;
  while (r && !(r->st == st && r->capture == capture && r->seed == seed && r->offset == offset))
    r = r->next;
  pthread_mutex_unlock(&draws_lock);
  return r;
}

/* A recompute's draw (replayed from its forward's): the patch copies its forward's draw. */
static clpar_status capture_recompute(const dropout_state *st, clpar_device *dev, uint64_t seed,
                                      uint64_t offset) {
  replay_draw *fwd =
      forward_draw(st, __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE), seed, offset);
  if (!fwd)
    return clpar_capture_refuse(dev, "Dropout",
                                "a recompute (activation checkpointing) whose forward ran outside "
                                "this capture: capture the forward and the backward together");
  replay_draw **link = malloc(sizeof *link);
  if (!link) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Dropout: out of host memory");
  *link = fwd;
  return clpar_capture_patch(dev, CLPAR_ENTRY_dropout_mask, same_draw, link, free);
}

static clpar_status capture_draw(dropout_state *st, const clpar_tensor *x, uint64_t seed,
                                 uint64_t offset) {
  clpar_device *dev = x->storage->dev;
  if (!clpar_capture_active(dev)) return CLPAR_OK;
  if (clpar_rng_draw_replayed()) return capture_recompute(st, dev, seed, offset);
  replay_draw *r = malloc(sizeof *r);
  if (!r) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Dropout: out of host memory");
  *r = (replay_draw){
      st, (uint64_t)x->numel, __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE), seed, offset, NULL};
  pthread_mutex_lock(&draws_lock);
  r->next = listed;
  listed = r;
  pthread_mutex_unlock(&draws_lock);
  return clpar_capture_patch(dev, CLPAR_ENTRY_dropout_mask, draw_again, r, draw_free);
}

static clpar_status dropout_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                    void *user) {
  dropout_state *st = user;
  int training = clpar_module_is_training(self);
  uint64_t seed = st->seed, off = 0;
  int draws = training && st->p > 0.0f && x;
  if (draws) clpar_rng_draw(st->seed, &st->offset, (uint64_t)x->numel, &seed, &off);
  clpar_status s = clpar_dropout(x, st->p, training, seed, off, y);
  if (s == CLPAR_OK && draws) s = capture_draw(st, x, seed, off);
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
