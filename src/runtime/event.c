/* event.c — events between devices: an event marks the completion of the work posted to one
 * device before it was recorded. Another device's queue can wait for it (its worker waits,
 * not the caller), a thread can synchronize on it, and callbacks run when it completes (to
 * give back the staging memory of a transfer, say).
 *
 * Each device has its own OpenCL context, and an OpenCL queue cannot wait for an event of
 * another context; the backend tells the core when its event completed (event_then), and the
 * consumer's worker, which drives the consumer's queue, waits for that before it enqueues
 * what follows. No thread that calls an op ever waits for a transfer. */
#include <stdlib.h>

#include "runtime.h"

typedef struct callback {
  void (*fn)(void *);
  void *user;
  struct callback *next;
} callback;

struct clpar_event {
  int refcount; /* atomic */
  clpar_device *dev;
  int done; /* guarded by event_lock */
  clpar_status status;
  callback *callbacks;
};

/* One lock and condition for every event: completions are rare next to ops, and a waiter
 * rechecks its own event. */
static pthread_mutex_t event_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t event_cond = PTHREAD_COND_INITIALIZER;

clpar_event *clpar_event_new(clpar_device *dev) {
  clpar_event *ev = calloc(1, sizeof *ev);
  if (!ev) {
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "event: out of host memory");
    return NULL;
  }
  ev->refcount = 1;
  ev->dev = dev;
  return ev;
}

clpar_event *clpar_event_retain(clpar_event *ev) {
  if (ev) __atomic_add_fetch(&ev->refcount, 1, __ATOMIC_RELAXED);
  return ev;
}

void clpar_event_release(clpar_event *ev) {
  if (!ev || __atomic_sub_fetch(&ev->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
  for (callback *c = ev->callbacks, *next; c; c = next) { /* never completed: cannot be */
    next = c->next;
    free(c);
  }
  free(ev);
}

void clpar_event_complete(clpar_event *ev, clpar_status status) {
  pthread_mutex_lock(&event_lock);
  callback *list = ev->callbacks;
  ev->callbacks = NULL;
  ev->status = status;
  __atomic_store_n(&ev->done, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&event_cond);
  pthread_mutex_unlock(&event_lock);
  for (callback *c = list, *next; c; c = next) { /* in the order they were added */
    next = c->next;
    c->fn(c->user);
    free(c);
  }
  clpar_event_release(ev); /* the reference the pending completion held */
}

clpar_status clpar_event_record(clpar_device *dev, clpar_event **out) {
  clpar_event *ev = clpar_event_new(dev);
  if (!ev) return CLPAR_ERROR_OUT_OF_MEMORY;
  clpar_event_retain(ev); /* released by the completion */
  clpar_event_retain(ev); /* released by the worker after the command */
  clpar_status s = clpar_worker_post_event(dev, ev, 0);
  if (s != CLPAR_OK) {
    clpar_event_release(ev);
    clpar_event_release(ev);
    clpar_event_release(ev);
    return s;
  }
  *out = ev;
  return CLPAR_OK;
}

clpar_status clpar_event_wait(clpar_device *dev, clpar_event *ev) {
  if (ev->dev == dev) return CLPAR_OK; /* in order on one queue */
  if (clpar_event_done(ev) && !clpar_capture_active(dev)) return CLPAR_OK; /* a replay waits */
  clpar_event_retain(ev);
  clpar_status s = clpar_worker_post_event(dev, ev, 1);
  if (s != CLPAR_OK) clpar_event_release(ev);
  return s;
}

int clpar_event_done(const clpar_event *ev) {
  return __atomic_load_n(&ev->done, __ATOMIC_ACQUIRE);
}

void clpar_event_block(clpar_event *ev, clpar_device *dev) {
  if (clpar_event_done(ev)) return;
  __atomic_add_fetch(&dev->queue_waits, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&event_lock);
  while (!ev->done) pthread_cond_wait(&event_cond, &event_lock);
  pthread_mutex_unlock(&event_lock);
}

clpar_status clpar_event_sync(clpar_event *ev) {
  if (!clpar_event_done(ev)) {
    if (clpar_worker_is_current(ev->dev))
      return clpar_set_error(CLPAR_ERROR_INTERNAL, "%s: its worker would wait for its own queue",
                             ev->dev->bd.info.id);
    __atomic_add_fetch(&ev->dev->host_waits, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&event_lock);
    while (!ev->done) pthread_cond_wait(&event_cond, &event_lock);
    pthread_mutex_unlock(&event_lock);
  }
  if (ev->status != CLPAR_OK)
    return clpar_set_error(ev->status, "%s: recording an event failed", ev->dev->bd.info.id);
  return CLPAR_OK;
}

clpar_status clpar_event_then(clpar_event *ev, void (*fn)(void *), void *user) {
  callback *c = malloc(sizeof *c);
  if (!c) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "event: out of host memory");
  c->fn = fn;
  c->user = user;
  c->next = NULL;
  pthread_mutex_lock(&event_lock);
  if (!ev->done) {
    callback **tail = &ev->callbacks;
    while (*tail) tail = &(*tail)->next;
    *tail = c;
    c = NULL;
  }
  pthread_mutex_unlock(&event_lock);
  if (c) { /* already complete */
    fn(user);
    free(c);
  }
  return CLPAR_OK;
}

/* ---- busy buffers: events of other devices' work on a storage ---- */

struct clpar_busy {
  pthread_mutex_t lock;
  clpar_event **events;
  int count, capacity;
};

static clpar_busy *busy_get(clpar_busy **slot) {
  clpar_busy *b = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (b) return b;
  clpar_busy *fresh = calloc(1, sizeof *fresh);
  if (!fresh) {
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "transfer: out of host memory");
    return NULL;
  }
  pthread_mutex_init(&fresh->lock, NULL);
  clpar_busy *expected = NULL;
  if (__atomic_compare_exchange_n(slot, &expected, fresh, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return fresh;
  pthread_mutex_destroy(&fresh->lock);
  free(fresh);
  return expected;
}

clpar_status clpar_busy_mark(clpar_busy **slot, clpar_event *ev) {
  clpar_busy *b = busy_get(slot);
  if (!b) return CLPAR_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&b->lock);
  int kept = 0;
  for (int i = 0; i < b->count; i++) {
    if (clpar_event_done(b->events[i]))
      clpar_event_release(b->events[i]);
    else
      b->events[kept++] = b->events[i];
  }
  b->count = kept;
  clpar_status s = CLPAR_OK;
  if (b->count == b->capacity) {
    int cap = b->capacity ? 2 * b->capacity : 4;
    clpar_event **grown = realloc(b->events, (size_t)cap * sizeof *grown);
    if (grown) {
      b->events = grown;
      b->capacity = cap;
    } else {
      s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "event: out of host memory");
    }
  }
  if (s == CLPAR_OK) b->events[b->count++] = clpar_event_retain(ev);
  pthread_mutex_unlock(&b->lock);
  return s;
}

int clpar_busy_idle(clpar_busy *b) {
  if (!b) return 1;
  pthread_mutex_lock(&b->lock);
  int idle = 1;
  for (int i = 0; i < b->count && idle; i++) idle = clpar_event_done(b->events[i]);
  pthread_mutex_unlock(&b->lock);
  return idle;
}

void clpar_busy_sync(clpar_busy *b) {
  if (!b) return;
  for (int i = 0; i < b->count; i++) clpar_event_sync(b->events[i]);
}

void clpar_busy_free(clpar_busy *b) {
  if (!b) return;
  for (int i = 0; i < b->count; i++) clpar_event_release(b->events[i]);
  free(b->events);
  pthread_mutex_destroy(&b->lock);
  free(b);
}
