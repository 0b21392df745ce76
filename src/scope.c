/* scope.c — scopes release every tensor a step created at once, so a training loop does not
 * free each intermediate. A scope holds the creation reference of each tensor made on its
 * thread while it is the innermost open scope (like an autorelease pool). Freeing such a
 * tensor by hand is still allowed: the caller takes over the scope's reference.
 *
 * Ending a scope also ends the scopes still open inside it, so a scope may end out of order
 * (an error path that returns past an inner scope): the inner handles are then stale. A
 * handle is therefore not the scope's address but a number that is never reused, looked up
 * among the open scopes: ending a stale handle (or one ended twice) does nothing, where
 * freed memory, or a newer scope at the same address, would otherwise be touched. */
#include <stdlib.h>

#include "internal.h"

struct clpar_scope {
  clpar_scope *parent;                /* the next outer open scope of the same thread */
  clpar_scope *open_prev, *open_next; /* every open scope of every thread */
  uint64_t id;                        /* the handle given out */
  pthread_t owner;
  pthread_mutex_t lock;
  clpar_tensor **items; /* NULL where a tensor was freed by hand */
  size_t count, capacity;
};

static _Thread_local clpar_scope *current;
static _Thread_local int ending; /* end_current is releasing a scope's tensors */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static clpar_scope *open_scopes;
static uint64_t last_id;

static clpar_scope *handle_of(uint64_t id) {
  return (clpar_scope *)(uintptr_t)id;
}

clpar_scope *clpar_scope_begin(void) {
  clpar_scope *s = calloc(1, sizeof *s);
  if (!s) {
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_scope_begin: out of host memory");
    return NULL;
  }
  pthread_mutex_init(&s->lock, NULL);
  s->owner = pthread_self();
  pthread_mutex_lock(&open_lock);
  s->id = ++last_id;
  s->open_next = open_scopes;
  if (open_scopes) open_scopes->open_prev = s;
  open_scopes = s;
  pthread_mutex_unlock(&open_lock);
  s->parent = current;
  current = s;
  return handle_of(s->id);
}

void clpar_scope_adopt(clpar_tensor *t) {
  clpar_scope *s = current;
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  if (s->count == s->capacity) {
    size_t cap = s->capacity ? 2 * s->capacity : 64;
    clpar_tensor **grown = realloc(s->items, cap * sizeof *grown);
    if (!grown) { /* the caller keeps the reference instead, as outside any scope */
      pthread_mutex_unlock(&s->lock);
      clpar_log(CLPAR_LOG_WARN, "scope: out of host memory; a tensor was not added to the scope");
      return;
    }
    s->items = grown;
    s->capacity = cap;
  }
  t->scope = s;
  t->scope_slot = s->count;
  s->items[s->count++] = t;
  pthread_mutex_unlock(&s->lock);
}

void clpar_scope_forget(clpar_tensor *t) {
  clpar_scope *s = t ? t->scope : NULL;
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  s->items[t->scope_slot] = NULL;
  t->scope = NULL;
  pthread_mutex_unlock(&s->lock);
}

/* Ends the innermost open scope of this thread: releases its tensors and frees it. */
static void end_current(void) {
  clpar_scope *s = current;
  current = s->parent;
  pthread_mutex_lock(&open_lock);
  if (s->open_prev)
    s->open_prev->open_next = s->open_next;
  else
    open_scopes = s->open_next;
  if (s->open_next) s->open_next->open_prev = s->open_prev;
  pthread_mutex_unlock(&open_lock);
  ending++;
  for (size_t i = 0; i < s->count; i++) {
    clpar_tensor *t = s->items[i];
    if (t) clpar_tensor_free(t); /* forgets itself from the scope first */
  }
  ending--;
  free(s->items);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

int clpar_scope_ending(void) {
  return ending > 0;
}

void clpar_scope_end(clpar_scope *handle) {
  if (!handle) return;
  uint64_t id = (uint64_t)(uintptr_t)handle;
  pthread_mutex_lock(&open_lock);
  clpar_scope *s = open_scopes;
  while (s && s->id != id) s = s->open_next;
  int mine = s && pthread_equal(s->owner, pthread_self());
  pthread_mutex_unlock(&open_lock);
  if (!s) {
    clpar_log(CLPAR_LOG_DEBUG, "clpar_scope_end: scope %llu had already ended",
              (unsigned long long)id);
    return;
  }
  if (!mine) { /* its thread's stack is not ours to change */
    clpar_log(CLPAR_LOG_ERROR,
              "clpar_scope_end: scope %llu was begun on another thread and must be ended there; "
              "left open",
              (unsigned long long)id);
    return;
  }
  /* Every open scope of this thread is on its stack: end the inner ones, then s. */
  while (current != s) end_current();
  end_current();
}
