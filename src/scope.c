/* scope.c — scopes release every tensor a step created at once, so a training loop does not
 * free each intermediate. A scope holds the creation reference of each tensor made on its
 * thread while it is the innermost open scope (like an autorelease pool). Freeing such a
 * tensor by hand is still allowed: the caller takes over the scope's reference. */
#include <stdlib.h>

#include "internal.h"

struct clpar_scope {
  clpar_scope *parent;
  pthread_mutex_t lock;
  clpar_tensor **items; /* NULL where a tensor was freed by hand */
  size_t count, capacity;
};

static _Thread_local clpar_scope *current;

clpar_scope *clpar_scope_begin(void) {
  clpar_scope *s = calloc(1, sizeof *s);
  if (!s) {
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_scope_begin: out of host memory");
    return NULL;
  }
  pthread_mutex_init(&s->lock, NULL);
  s->parent = current;
  current = s;
  return s;
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

void clpar_scope_end(clpar_scope *scope) {
  if (!scope) return;
  /* Ending an outer scope ends the ones still open inside it. */
  int on_stack = 0;
  for (clpar_scope *s = current; s; s = s->parent) on_stack |= s == scope;
  while (on_stack && current != scope) clpar_scope_end(current);
  if (current == scope) current = scope->parent;
  for (size_t i = 0; i < scope->count; i++) {
    clpar_tensor *t = scope->items[i];
    if (t) clpar_tensor_free(t); /* forgets itself from the scope first */
  }
  free(scope->items);
  pthread_mutex_destroy(&scope->lock);
  free(scope);
}
