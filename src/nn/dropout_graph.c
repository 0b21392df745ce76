/* dropout_graph.c — a Dropout module's mask inside a captured graph (clpar/graph.h): the
 * dropout_mask command is patched before each replay with the next draw of the module's
 * (seed, offset) stream, as the eager forward would draw it; a recompute of that forward
 * (activation checkpointing) takes its forward's draw of the same replay. */
#include <stdlib.h>

#include "internal.h"

/* A captured forward's mask at each replay: the next offset, drawn as the eager forward would.
 * A recompute of that forward in the same capture (activation checkpointing, whose eager
 * recompute replays the forward's draw) takes the draw of the same replay: its patch runs after
 * the forward's, which is earlier on the same device. The forward draws of the capture in
 * progress and of live graphs are listed, so that the recompute can find its forward's. */
typedef struct replay_draw {
  uint64_t stream;  /* the module's seed */
  uint64_t *cursor; /* and its offset, which each draw advances (atomic); the module's key */
  uint64_t numel;
  const void *capture;   /* the device's recording the draw was captured into */
  uint64_t seed, offset; /* the capture run's draw, then the latest replay's */
  struct replay_draw *next;
} replay_draw;

static pthread_mutex_t draws_lock = PTHREAD_MUTEX_INITIALIZER;
static replay_draw *listed; /* every forward draw of a live graph */

static clpar_status draw_again(void *user, clpar_patch_args *a) {
  replay_draw *r = user;
  clpar_rng_draw(r->stream, r->cursor, r->numel, &r->seed, &r->offset);
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

/* The listed forward draw of the module at cursor captured into capture as (seed, offset), or
 * NULL. */
static replay_draw *forward_draw(const uint64_t *cursor, const void *capture, uint64_t seed,
                                 uint64_t offset) {
  pthread_mutex_lock(&draws_lock);
  replay_draw *r = listed;
  while (r &&
         !(r->cursor == cursor && r->capture == capture && r->seed == seed && r->offset == offset))
    r = r->next;
  pthread_mutex_unlock(&draws_lock);
  return r;
}

/* A recompute's draw (replayed from its forward's): the patch copies its forward's draw. */
static clpar_status capture_recompute(const uint64_t *cursor, clpar_device *dev, uint64_t seed,
                                      uint64_t offset) {
  replay_draw *fwd =
      forward_draw(cursor, __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE), seed, offset);
  if (!fwd)
    return clpar_capture_refuse(dev, "Dropout",
                                "a recompute (activation checkpointing) whose forward ran outside "
                                "this capture: capture the forward and the backward together");
  replay_draw **link = malloc(sizeof *link);
  if (!link) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Dropout: out of host memory");
  *link = fwd;
  return clpar_capture_patch(dev, CLPAR_ENTRY_dropout_mask, same_draw, link, free);
}

clpar_status clpar_dropout_capture(uint64_t stream, uint64_t *cursor, const clpar_tensor *x,
                                   uint64_t seed, uint64_t offset) {
  clpar_device *dev = x->storage->dev;
  if (!clpar_capture_active(dev)) return CLPAR_OK;
  if (clpar_rng_draw_replayed()) return capture_recompute(cursor, dev, seed, offset);
  replay_draw *r = malloc(sizeof *r);
  if (!r) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Dropout: out of host memory");
  *r = (replay_draw){
      stream, cursor, (uint64_t)x->numel, __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE), seed,
      offset, NULL};
  pthread_mutex_lock(&draws_lock);
  r->next = listed;
  listed = r;
  pthread_mutex_unlock(&draws_lock);
  return clpar_capture_patch(dev, CLPAR_ENTRY_dropout_mask, draw_again, r, draw_free);
}
