/* capture_writes.c — a graph's small writes from host memory (runtime.h).
 *
 * A captured write reads its value from host memory when the device runs it, which may be
 * after the host has posted the next replay. So each replay writes its values into a slot of
 * its own: a slot is reused once the event recorded after the replay that last used it has
 * completed on every device with writes (the device consumed the values), and a new slot is
 * made while none is free, up to MAX_SLOTS: only a host that runs MAX_SLOTS replays ahead of
 * the devices waits, for the oldest. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

enum { MAX_DEVICES = 8, MAX_SLOTS = 64, VALUE_BYTES = 16 };

typedef struct {
  unsigned char first[VALUE_BYTES]; /* the capture run's value */
  clpar_device *dev;
  int d;        /* the device's index in the graph */
  size_t index; /* of the command in the device's list */
  clpar_value_fn fn;
  void *user;
  void (*free_user)(void *);
} host_write;

typedef struct {
  unsigned char *values;          /* VALUE_BYTES per write */
  clpar_event *done[MAX_DEVICES]; /* after the replay that last used it; NULL: none */
} slot;

struct clpar_host_writes {
  host_write *w;
  size_t n, cap;
  slot slots[MAX_SLOTS];
  int n_slots, next, used; /* next: where the search for a free slot starts; used: the last */
};

void *clpar_host_writes_add(clpar_host_writes **ws, clpar_device *dev, int d, size_t bytes,
                            clpar_value_fn fn, void *user, void (*free_user)(void *)) {
  clpar_host_writes *h = *ws ? *ws : calloc(1, sizeof *h);
  if (h && h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 64;
    host_write *grown = realloc(h->w, cap * sizeof *grown);
    if (grown) {
      h->w = grown;
      h->cap = cap;
    }
  }
  *ws = h;
  if (!h || h->n == h->cap || bytes > VALUE_BYTES || d < 0 || d >= MAX_DEVICES || h->n_slots) {
    if (free_user) free_user(user);
    return NULL;
  }
  host_write *w = &h->w[h->n++];
  *w = (host_write){{0}, dev, d, SIZE_MAX, fn, user, free_user};
  fn(user, w->first);
  return w->first;
}

int clpar_host_writes_bind(clpar_host_writes *ws, const clpar_command *cmds, size_t n) {
  host_write *w = ws && ws->n ? &ws->w[ws->n - 1] : NULL;
  for (size_t i = n; w && i-- > 0;)
    if (cmds[i].op == CLPAR_ENTRY_write && cmds[i].u.write.src == w->first) {
      w->index = i;
      return 1;
    }
  return 0;
}

void clpar_host_writes_remap(clpar_host_writes *ws, int d, const size_t *map) {
  for (size_t i = 0; ws && map && i < ws->n; i++)
    if (ws->w[i].d == d) ws->w[i].index = map[ws->w[i].index];
}

/* Whether no posted replay still reads s's values (its events' references dropped if so). */
static int slot_free(slot *s) {
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (s->done[d] && !clpar_event_done(s->done[d])) return 0;
    clpar_event_release(s->done[d]);
    s->done[d] = NULL;
  }
  return 1;
}

/* A slot no posted replay reads: a free one, a new one, or (MAX_SLOTS in flight) the oldest,
 * waited for. */
static clpar_status take_slot(clpar_host_writes *ws, int *taken) {
  for (int k = 0; k < ws->n_slots; k++) {
    int i = (ws->next + k) % ws->n_slots;
    if (slot_free(&ws->slots[i])) {
      *taken = i;
      return CLPAR_OK;
    }
  }
  if (ws->n_slots < MAX_SLOTS) {
    slot *s = &ws->slots[ws->n_slots];
    s->values = calloc(ws->n, VALUE_BYTES);
    if (!s->values)
      return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                             "clpar_graph_replay: out of host memory (the replay's values)");
    *taken = ws->n_slots++;
    return CLPAR_OK;
  }
  slot *s = &ws->slots[ws->next];
  clpar_status st = CLPAR_OK;
  for (int d = 0; st == CLPAR_OK && d < MAX_DEVICES; d++)
    if (s->done[d]) st = clpar_event_sync(s->done[d]);
  if (st == CLPAR_OK) slot_free(s);
  *taken = ws->next;
  return st;
}

clpar_status clpar_host_writes_prepare(clpar_host_writes *ws, clpar_command *const *cmds) {
  if (!ws) return CLPAR_OK;
  int k = 0;
  clpar_status s = take_slot(ws, &k);
  if (s != CLPAR_OK) return s;
  ws->used = k;
  ws->next = (k + 1) % ws->n_slots;
  for (size_t i = 0; i < ws->n; i++) {
    host_write *w = &ws->w[i];
    unsigned char *value = ws->slots[k].values + i * VALUE_BYTES;
    w->fn(w->user, value);
    cmds[w->d][w->index].u.write.src = value;
  }
  return CLPAR_OK;
}

clpar_status clpar_host_writes_posted(clpar_host_writes *ws) {
  if (!ws || ws->n_slots == 0) return CLPAR_OK;
  slot *s = &ws->slots[ws->used];
  clpar_status st = CLPAR_OK;
  for (size_t i = 0; i < ws->n; i++) {
    host_write *w = &ws->w[i];
    if (s->done[w->d]) continue; /* recorded for an earlier write on the device */
    clpar_status e = clpar_event_record(w->dev, &s->done[w->d]);
    if (st == CLPAR_OK) st = e;
  }
  return st;
}

void clpar_host_writes_free(clpar_host_writes *ws) {
  if (!ws) return;
  for (size_t i = 0; i < ws->n; i++)
    if (ws->w[i].free_user) ws->w[i].free_user(ws->w[i].user);
  for (int k = 0; k < ws->n_slots; k++) {
    for (int d = 0; d < MAX_DEVICES; d++) clpar_event_release(ws->slots[k].done[d]);
    free(ws->slots[k].values);
  }
  free(ws->w);
  free(ws);
}
