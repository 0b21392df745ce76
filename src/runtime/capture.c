/* capture.c — a step's commands recorded once and replayed (clpar/graph.h).
 *
 * While a device captures, the worker's post appends each command to the graph's list for the
 * device (clpar_capture_record) and the command runs as ever, so the capture run is an eager
 * step. A replay hands the whole list to the worker at once (clpar_worker_post_batch): no
 * autograd, no allocation, no per-op host work except the patches, which rewrite the scalars
 * that change per step (the learning rate, Adam's bias corrections, dropout's RNG offset) as
 * the eager step would compute them.
 *
 * Memory is planned once: buffers allocated on a capturing device come from the graph's pool
 * (or the shared cache, then owned by the graph), and buffers freed there go back to the pool,
 * to be reused by later allocations of the same capture. So a replay touches the same buffers
 * in the same order as the capture run. Blocks still in use when the capture ends (the loss,
 * gradients made in the step) stay the graph's: freed later they return to its pool, never to
 * the shared cache, until the graph is destroyed. Buffers the commands use that the graph does
 * not own (parameters, inputs: made before the capture) are listed; freeing one later makes
 * the graph refuse to replay, as do clpar_module_to and clpar_module_flatten
 * (clpar_graph_invalidate_all). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/graph.h"
#include "runtime.h"

typedef struct {
  size_t index; /* of the command in its device's list */
  clpar_patch_fn fn;
  void *user;
  void (*free_user)(void *);
} patch;

struct clpar_capture { /* one device's recording */
  clpar_graph *graph;
  clpar_device *dev;
  clpar_command *cmds;
  size_t n, cap;
  patch *patches;
  size_t n_patches, cap_patches;
  clpar_fused *fused;       /* the chains its ew_chain commands run (capture_fuse.c) */
  clpar_prepared_list prep; /* the backend's prepared launches for cmds (capture_prepared.c) */
  clpar_host_call end;      /* counts its replays in flight; fn NULL: not counted */
};

typedef struct {
  void *buf;
  size_t size;
  clpar_device *dev;
  int in_use;
} pool_block;

#define MAX_DEVICES 8

/* An OP_WAIT or OP_SIGNAL command of the graph: each replay gives it a fresh event. */
typedef struct {
  int dev; /* in recs */
  size_t index;
  int id; /* the event's number in the graph; -1: an event from before the capture */
} event_use;

struct clpar_graph {
  clpar_capture recs[MAX_DEVICES];
  int n_recs;
  clpar_host_writes *writes; /* small writes from host memory (capture_writes.c) */
  void **stage;              /* host memory of copies between devices */
  size_t n_stage, cap_stage;
  event_use *uses;
  size_t n_uses;
  int n_events, events_held; /* held: the captured commands' events are still referenced */
  int *ev_dev;               /* the device that signals event id */
  clpar_event **fresh;       /* a replay's events, by id */
  clpar_event *done_ev;      /* completed: what waits for an event from before the capture get */
  /* the last replay's end on each device, when replays wait for it (their host memory of
   * writes and copies is reused) */
  clpar_event *done[MAX_DEVICES];
  pool_block *pool; /* sorted by buf once the capture ended */
  size_t n_pool, cap_pool;
  void **ext; /* the buffers the commands use that the pool does not hold, sorted */
  size_t n_ext;
  int capturing;
  clpar_status error; /* the capture's first failure */
  char message[1024];
  int stale; /* 1: refuses to replay, for why */
  char why[512];
  clpar_graph *next; /* live graphs */
};

/* Guards every graph's pool, list and the live list. Taken without the allocator's lock held,
 * and the allocator's lock is not taken under it. */
static pthread_mutex_t graphs_lock = PTHREAD_MUTEX_INITIALIZER;
static clpar_graph *live;
static int n_live; /* atomic: graphs alive, capturing ones included */

static void fail_locked(clpar_graph *g, clpar_status s, const char *message) {
  if (g->error != CLPAR_OK) return;
  g->error = s;
  snprintf(g->message, sizeof g->message, "%s", message);
}

/* ---- recording (the worker's post, under the ring's lock) ---- */

static _Thread_local int allowed; /* the runtime's own captured writes, reads and events */

void clpar_capture_allow(int on) {
  allowed = on;
}

size_t clpar_capture_record(clpar_capture *c, const clpar_command *cmd) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 256;
    clpar_command *grown = realloc(c->cmds, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_lock(&graphs_lock);
      fail_locked(c->graph, CLPAR_ERROR_OUT_OF_MEMORY,
                  "clpar_graph_capture: out of host memory for the commands");
      pthread_mutex_unlock(&graphs_lock);
      return SIZE_MAX;
    }
    c->cmds = grown;
    c->cap = cap;
  }
  c->cmds[c->n++] = *cmd;
  if (cmd->op == CLPAR_OP_WAIT || cmd->op == CLPAR_OP_SIGNAL) /* ids are given by address */
    clpar_event_retain(cmd->u.event);
  return c->n - 1;
}

int clpar_capture_active(const clpar_device *dev) {
  return dev && __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE) != NULL;
}

int clpar_graph_any_live(void) {
  return __atomic_load_n(&n_live, __ATOMIC_ACQUIRE) != 0;
}

clpar_status clpar_capture_refuse(clpar_device *dev, const char *fn, const char *what) {
  clpar_capture *c = dev ? __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE) : NULL;
  if (!c || allowed) return CLPAR_OK;
  clpar_status s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                                   "clpar_graph_capture: %s on %s inside a capture: %s; a "
                                   "replay does no host work, so the step cannot hold it",
                                   fn, dev->bd.info.id, what);
  pthread_mutex_lock(&graphs_lock);
  fail_locked(c->graph, s, clpar_last_error());
  pthread_mutex_unlock(&graphs_lock);
  return s;
}

clpar_status clpar_capture_check_op(clpar_device *dev, int op) {
  if (!clpar_capture_active(dev) ||
      (allowed && (op == CLPAR_ENTRY_write || op == CLPAR_ENTRY_read)))
    return CLPAR_OK;
  switch (op) {
    case CLPAR_ENTRY_host_alloc:
    case CLPAR_ENTRY_host_free:
    case CLPAR_ENTRY_write:
    case CLPAR_ENTRY_read:
    case CLPAR_ENTRY_finish:
    case CLPAR_ENTRY_event_record:
    case CLPAR_ENTRY_profile:
    case CLPAR_ENTRY_profile_read:
    case CLPAR_ENTRY_tune_gemm:
      return clpar_capture_refuse(dev, clpar_op_name(op), "host memory or a host wait");
    case CLPAR_ENTRY_copy_peer:
    case CLPAR_ENTRY_comm_allreduce:
      return clpar_capture_refuse(dev, clpar_op_name(op), "a copy between devices or processes");
    default:
      return CLPAR_OK;
  }
}

/* ---- the pool ---- */

static clpar_graph *capturing_graph(const clpar_device *dev) {
  clpar_capture *c = __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE);
  return c ? c->graph : NULL;
}

static int pool_add_locked(clpar_graph *g, clpar_device *dev, void *buf, size_t size, int in_use) {
  if (g->n_pool == g->cap_pool) {
    size_t cap = g->cap_pool ? 2 * g->cap_pool : 64;
    pool_block *grown = realloc(g->pool, cap * sizeof *grown);
    if (!grown) return 0;
    g->pool = grown;
    g->cap_pool = cap;
  }
  g->pool[g->n_pool++] = (pool_block){buf, size, dev, in_use};
  return 1;
}

int clpar_capture_take(clpar_device *dev, size_t size, void **buf, size_t *capacity) {
  if (!clpar_capture_active(dev)) return 0;
  if (clpar_memory_category_current() == CLPAR_MEM_OPTIMIZER) /* made once, not per step */
    clpar_capture_refuse(dev, "clpar_optimizer_step",
                         "the optimizer's state made on its first step (a replay would make it "
                         "again each step): run one step eagerly before the capture, as "
                         "clpar_step_compile does");
  pthread_mutex_lock(&graphs_lock);
  clpar_graph *g = capturing_graph(dev);
  pool_block *best = NULL;
  for (size_t i = 0; g && i < g->n_pool; i++) {
    pool_block *b = &g->pool[i];
    if (b->in_use || b->dev != dev || b->size < size || b->size > size + size / 4) continue;
    if (!best || b->size < best->size) best = b;
  }
  if (best) {
    best->in_use = 1;
    *buf = best->buf;
    *capacity = best->size;
  }
  pthread_mutex_unlock(&graphs_lock);
  return best != NULL;
}

void clpar_capture_own(clpar_device *dev, void *buf, size_t capacity) {
  if (!clpar_capture_active(dev)) return;
  pthread_mutex_lock(&graphs_lock);
  clpar_graph *g = capturing_graph(dev);
  if (g && !pool_add_locked(g, dev, buf, capacity, 1))
    fail_locked(g, CLPAR_ERROR_OUT_OF_MEMORY, "clpar_graph_capture: out of host memory (pool)");
  pthread_mutex_unlock(&graphs_lock);
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const pool_block *)a)->buf,
            y = (uintptr_t)((const pool_block *)b)->buf;
  return x < y ? -1 : x > y;
}

static int cmp_voidp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* The pool's block for buf (the pool is sorted once the capture ended). */
static pool_block *pool_find_locked(clpar_graph *g, const void *buf) {
  if (!g->capturing) {
    pool_block key = {(void *)buf, 0, NULL, 0};
    return g->n_pool ? bsearch(&key, g->pool, g->n_pool, sizeof *g->pool, cmp_ptr) : NULL;
  }
  for (size_t i = 0; i < g->n_pool; i++)
    if (g->pool[i].buf == buf) return &g->pool[i];
  return NULL;
}

static void mark_stale_locked(clpar_graph *g, const char *why) {
  if (g->stale) return;
  g->stale = 1;
  snprintf(g->why, sizeof g->why, "%s", why);
}

int clpar_capture_give(clpar_device *dev, void *buf, size_t capacity, clpar_busy *busy) {
  if (__atomic_load_n(&n_live, __ATOMIC_ACQUIRE) == 0) return 0;
  int taken = 0;
  pthread_mutex_lock(&graphs_lock);
  for (clpar_graph *g = live; g && !taken; g = g->next) {
    pool_block *b = pool_find_locked(g, buf);
    if (b) {
      b->in_use = 0;
      taken = 1;
    }
  }
  clpar_graph *cg = taken ? NULL : capturing_graph(dev);
  if (cg) /* made before the capture, freed in it: the graph's from now on */
    taken = pool_add_locked(cg, dev, buf, capacity, 0);
  for (clpar_graph *g = live; g && !taken; g = g->next)
    if (!g->capturing && g->n_ext && bsearch(&buf, g->ext, g->n_ext, sizeof *g->ext, cmp_voidp))
      mark_stale_locked(g,
                        "a buffer its commands use (a parameter, an input, optimizer state) "
                        "was freed after the capture");
  pthread_mutex_unlock(&graphs_lock);
  if (taken && busy) { /* single-device graphs: other devices' work on it is waited for */
    clpar_busy_sync(busy);
    clpar_busy_free(busy);
  }
  return taken;
}

/* ---- patches ---- */

/* The last command of entry recorded on c (the capturing thread is the one that posts). */
static int last_of(const clpar_capture *c, int entry, size_t *index) {
  for (size_t i = c->n; i-- > 0;)
    if (c->cmds[i].op == entry) {
      *index = i;
      return 1;
    }
  return 0;
}

static clpar_status patch_fail(clpar_capture *c, clpar_status s, void *user,
                               void (*free_user)(void *)) {
  if (free_user) free_user(user);
  pthread_mutex_lock(&graphs_lock);
  fail_locked(c->graph, s, clpar_last_error());
  pthread_mutex_unlock(&graphs_lock);
  return s;
}

clpar_status clpar_capture_patch(clpar_device *dev, int entry, clpar_patch_fn fn, void *user,
                                 void (*free_user)(void *)) {
  clpar_capture *c = dev ? __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE) : NULL;
  if (!c || !fn) {
    if (free_user) free_user(user);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_capture_patch: no capture on the device, or no function");
  }
  size_t index = 0;
  if ((entry != CLPAR_ENTRY_sgd_step && entry != CLPAR_ENTRY_adam_step &&
       entry != CLPAR_ENTRY_dropout_mask) ||
      !last_of(c, entry, &index))
    return patch_fail(c,
                      clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                                      "clpar_graph_capture: no %s command recorded on %s to patch "
                                      "(composed from other entries?); the step cannot be replayed",
                                      clpar_op_name(entry), dev->bd.info.id),
                      user, free_user);
  if (c->n_patches == c->cap_patches) {
    size_t cap = c->cap_patches ? 2 * c->cap_patches : 16;
    patch *grown = realloc(c->patches, cap * sizeof *grown);
    if (!grown)
      return patch_fail(c,
                        clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                                        "clpar_graph_capture: out of host memory (patches)"),
                        user, free_user);
    c->patches = grown;
    c->cap_patches = cap;
  }
  c->patches[c->n_patches++] = (patch){index, fn, user, free_user};
  return CLPAR_OK;
}

clpar_status clpar_capture_host_write(clpar_device *dev, void *buf, size_t off_bytes, size_t bytes,
                                      clpar_value_fn fn, void *user, void (*free_user)(void *)) {
  clpar_capture *c = dev ? __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE) : NULL;
  void *value = NULL;
  pthread_mutex_lock(&graphs_lock);
  if (c && fn)
    value = clpar_host_writes_add(&c->graph->writes, dev, (int)(c - c->graph->recs), bytes, fn,
                                  user, free_user);
  else if (free_user)
    free_user(user);
  pthread_mutex_unlock(&graphs_lock);
  allowed = 1;
  clpar_status s = value ? clpar_dev_write(dev, buf, off_bytes, value, bytes) : CLPAR_OK;
  allowed = 0;
  if (value && s == CLPAR_OK && clpar_host_writes_bind(c->graph->writes, c->cmds, c->n))
    return CLPAR_OK;
  if (s == CLPAR_OK) /* each replay points the write's command at a value of its own */
    s = clpar_set_error(value || c ? CLPAR_ERROR_OUT_OF_MEMORY : CLPAR_ERROR_INVALID_ARGUMENT,
                        "clpar_capture_host_write: no capture on the device, a value over 16 "
                        "bytes, or no memory");
  return c ? patch_fail(c, s, NULL, NULL) : s;
}

/* ---- capture ---- */

static clpar_graph *current; /* the graph being captured (one at a time), under graphs_lock */

static clpar_status check_devices(const char *fn, clpar_device *const *devs, int n) {
  if (!devs || n < 1) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: no device", fn);
  if (n > MAX_DEVICES)
    return clpar_set_error(CLPAR_ERROR_UNSUPPORTED, "%s: %d devices; at most %d", fn, n,
                           MAX_DEVICES);
  for (int i = 0; i < n; i++) {
    if (!devs[i])
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: device %d is NULL", fn, i);
    for (int j = 0; j < i; j++)
      if (devs[j] == devs[i])
        return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %s given twice", fn,
                               devs[i]->bd.info.id);
    clpar_status s = clpar_device_synchronize(devs[i]); /* from idle queues */
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

clpar_status clpar_graph_capture_begin(clpar_device *const *devs, int n) {
  const char *fn = "clpar_graph_capture_begin";
  clpar_status s = check_devices(fn, devs, n);
  if (s != CLPAR_OK) return s;
  clpar_graph *g = calloc(1, sizeof *g);
  if (!g) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  g->n_recs = n;
  for (int i = 0; i < n; i++) {
    g->recs[i].graph = g;
    g->recs[i].dev = devs[i];
  }
  g->capturing = 1;
  g->events_held = 1;
  pthread_mutex_lock(&graphs_lock);
  int busy = current != NULL;
  for (int i = 0; i < n; i++) busy |= clpar_capture_active(devs[i]);
  if (busy) {
    pthread_mutex_unlock(&graphs_lock);
    free(g);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: a capture is in progress already (end it first)", fn);
  }
  current = g;
  g->next = live;
  live = g;
  __atomic_add_fetch(&n_live, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < n; i++) {
    __atomic_store_n(&devs[i]->preparing, &g->recs[i].prep, __ATOMIC_RELEASE);
    __atomic_store_n(&devs[i]->capture, &g->recs[i], __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&graphs_lock);
  return CLPAR_OK;
}

int clpar_capture_between(const clpar_device *a, const clpar_device *b) {
  clpar_capture *ca = __atomic_load_n(&a->capture, __ATOMIC_ACQUIRE);
  clpar_capture *cb = __atomic_load_n(&b->capture, __ATOMIC_ACQUIRE);
  return ca && cb && ca->graph == cb->graph;
}

void *clpar_capture_host_memory(clpar_device *dev, size_t bytes) {
  clpar_capture *c = __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE);
  if (!c) return NULL;
  clpar_graph *g = c->graph;
  void *mem = malloc(bytes ? bytes : 1);
  pthread_mutex_lock(&graphs_lock);
  if (mem && g->n_stage == g->cap_stage) {
    size_t cap = g->cap_stage ? 2 * g->cap_stage : 16;
    void **grown = realloc(g->stage, cap * sizeof *grown);
    if (grown) {
      g->stage = grown;
      g->cap_stage = cap;
    }
  }
  if (mem && g->n_stage < g->cap_stage) {
    g->stage[g->n_stage++] = mem;
  } else {
    free(mem);
    mem = NULL;
    fail_locked(g, CLPAR_ERROR_OUT_OF_MEMORY, "clpar_graph_capture: out of host memory (copies)");
  }
  pthread_mutex_unlock(&graphs_lock);
  return mem;
}

static int push_ext(void ***ext, size_t *n, size_t *cap, void *buf) {
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    void **grown = realloc(*ext, *cap * sizeof *grown);
    if (!grown) return 0;
    *ext = grown;
  }
  (*ext)[(*n)++] = buf;
  return 1;
}

/* g->ext: the buffers its commands use that its pool does not hold, sorted, once. */
static clpar_status list_external_locked(clpar_graph *g) {
  size_t cap = 0, n = 0;
  void **ext = NULL, *bufs[16];
  for (int d = 0; d < g->n_recs; d++)
    for (size_t i = 0; i < g->recs[d].n; i++) {
      size_t k = clpar_command_buffers(&g->recs[d].cmds[i], bufs);
      for (size_t j = 0; j < k; j++)
        if (!pool_find_locked(g, bufs[j]) && !push_ext(&ext, &n, &cap, bufs[j])) {
          free(ext);
          return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                                 "clpar_graph_capture_end: out of host memory");
        }
    }
  if (n) qsort(ext, n, sizeof *ext, cmp_voidp);
  size_t u = 0;
  for (size_t i = 0; i < n; i++)
    if (u == 0 || ext[u - 1] != ext[i]) ext[u++] = ext[i];
  g->ext = ext;
  g->n_ext = u;
  return CLPAR_OK;
}

/* Drops the references the recorded commands hold on their events (taken at recording). */
static void release_captured_events(clpar_graph *g) {
  if (!g->events_held) return;
  g->events_held = 0;
  for (int d = 0; d < g->n_recs; d++)
    for (size_t i = 0; i < g->recs[d].n; i++) {
      clpar_command *c = &g->recs[d].cmds[i];
      if (c->op == CLPAR_OP_WAIT || c->op == CLPAR_OP_SIGNAL) clpar_event_release(c->u.event);
    }
}

/* Numbers the events the graph's commands signal and lists every wait and signal: each
 * replay makes fresh events for them; a wait for an event from before the capture (done by
 * then) gets an event made complete. */
static clpar_status number_events(clpar_graph *g) {
  size_t n = 0;
  for (int d = 0; d < g->n_recs; d++)
    for (size_t i = 0; i < g->recs[d].n; i++)
      n += g->recs[d].cmds[i].op == CLPAR_OP_WAIT || g->recs[d].cmds[i].op == CLPAR_OP_SIGNAL;
  if (n == 0) return CLPAR_OK;
  g->uses = calloc(n, sizeof *g->uses);
  g->ev_dev = calloc(n, sizeof *g->ev_dev);
  g->fresh = calloc(n, sizeof *g->fresh);
  clpar_event **ids = calloc(n, sizeof *ids);
  g->done_ev = clpar_event_new(g->recs[0].dev);
  if (!g->uses || !g->ev_dev || !g->fresh || !ids || !g->done_ev) {
    free(ids);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_graph_capture_end: out of memory");
  }
  clpar_event_complete(clpar_event_retain(g->done_ev), CLPAR_OK);
  for (int pass = 0; pass < 2; pass++) /* the signals first, then the waits */
    for (int d = 0; d < g->n_recs; d++)
      for (size_t i = 0; i < g->recs[d].n; i++) {
        clpar_command *c = &g->recs[d].cmds[i];
        if (c->op != (pass ? CLPAR_OP_WAIT : CLPAR_OP_SIGNAL)) continue;
        int id = -1;
        for (int k = 0; k < g->n_events && id < 0; k++)
          if (ids[k] == c->u.event) id = k;
        if (!pass) {
          ids[g->n_events] = c->u.event;
          g->ev_dev[g->n_events] = d;
          id = g->n_events++;
        }
        g->uses[g->n_uses++] = (event_use){d, i, id};
      }
  free(ids);
  return CLPAR_OK;
}

/* Takes g off the live list and gives its free blocks back to the shared cache. */
static void graph_release(clpar_graph *g) {
  pthread_mutex_lock(&graphs_lock);
  for (clpar_graph **p = &live; *p; p = &(*p)->next)
    if (*p == g) {
      *p = g->next;
      __atomic_sub_fetch(&n_live, 1, __ATOMIC_RELEASE);
      break;
    }
  pthread_mutex_unlock(&graphs_lock);
  for (size_t i = 0; i < g->n_pool; i++) /* in use: its owner frees it to the cache later */
    if (!g->pool[i].in_use)
      clpar_allocator_recache(g->pool[i].dev, g->pool[i].buf, g->pool[i].size);
  g->n_pool = 0;
}

static void graph_free(clpar_graph *g) {
  release_captured_events(g);
  clpar_host_writes_free(g->writes);
  for (int d = 0; d < MAX_DEVICES; d++) clpar_event_release(g->done[d]);
  for (int d = 0; d < g->n_recs; d++) {
    clpar_capture *c = &g->recs[d];
    for (size_t i = 0; i < c->n_patches; i++)
      if (c->patches[i].free_user) c->patches[i].free_user(c->patches[i].user);
    free(c->patches);
    clpar_prepared_release(&c->prep, c->dev);
    free(c->cmds);
    clpar_capture_fused_free(c->fused);
  }
  for (size_t i = 0; i < g->n_stage; i++) free(g->stage[i]);
  clpar_event_release(g->done_ev);
  free(g->stage);
  free(g->uses);
  free(g->ev_dev);
  free(g->fresh);
  free(g->pool);
  free(g->ext);
  free(g);
}

/* Fuses each device's element-wise runs (capture_fuse.c); patches, waits, signals follow. */
static void fuse_commands(clpar_graph *g) {
  for (int d = 0; d < g->n_recs; d++) {
    clpar_capture *c = &g->recs[d];
    size_t *map = NULL, i;
    clpar_capture_fuse(c->dev, c->cmds, &c->n, &map, &c->fused);
    for (i = 0; map && i < c->n_patches; i++) c->patches[i].index = map[c->patches[i].index];
    clpar_host_writes_remap(g->writes, d, map);
    for (i = 0; map && i < g->n_uses; i++)
      if (g->uses[i].dev == d) g->uses[i].index = map[g->uses[i].index];
    if (map) clpar_prepared_remap(&c->prep, c->dev, map, c->cmds);
    free(map);
  }
}

/* After the capture run: the pool sorted, the external buffers and the events listed. */
static void finish_locked(clpar_graph *g) {
  g->capturing = 0;
  for (int d = 0; d < g->n_recs; d++) /* patched commands keep the entry: their args change */
    for (size_t i = 0; i < g->recs[d].n_patches; i++)
      clpar_prepared_drop(&g->recs[d].prep, g->recs[d].dev, g->recs[d].patches[i].index);
  if (g->n_pool) qsort(g->pool, g->n_pool, sizeof *g->pool, cmp_ptr); /* NULL when empty */
  clpar_status s = list_external_locked(g);
  if (s == CLPAR_OK) s = number_events(g);
  if (s != CLPAR_OK) fail_locked(g, s, clpar_last_error());
}

clpar_status clpar_graph_capture_end(clpar_graph **out) {
  if (!out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_graph_capture_end: out is NULL");
  *out = NULL;
  pthread_mutex_lock(&graphs_lock);
  clpar_graph *g = current;
  current = NULL;
  for (int d = 0; g && d < g->n_recs; d++)
    __atomic_store_n(&g->recs[d].dev->capture, NULL, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&graphs_lock);
  if (!g)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_graph_capture_end: no capture in progress");
  for (int d = 0; d < g->n_recs; d++) { /* the capture run, and its errors */
    clpar_status s = clpar_device_synchronize(g->recs[d].dev);
    __atomic_store_n(&g->recs[d].dev->preparing, NULL, __ATOMIC_RELEASE); /* all prepared */
    pthread_mutex_lock(&graphs_lock);
    if (s != CLPAR_OK) fail_locked(g, s, clpar_last_error());
    pthread_mutex_unlock(&graphs_lock);
  }
  for (int d = 0; d < g->n_recs; d++) /* the replays in flight (capture_host.c) */
    clpar_replay_end_add(&g->recs[d], g->recs[d].dev, g->recs[d].cmds, g->recs[d].n,
                         &g->recs[d].end);
  pthread_mutex_lock(&graphs_lock);
  if (g->error == CLPAR_OK) finish_locked(g);
  clpar_status s = g->error;
  char message[sizeof g->message];
  memcpy(message, g->message, sizeof message);
  pthread_mutex_unlock(&graphs_lock);
  release_captured_events(g);
  if (s == CLPAR_OK) fuse_commands(g);
  if (s != CLPAR_OK) {
    graph_release(g);
    graph_free(g);
    return clpar_set_error(s, "%s", message);
  }
  *out = g;
  return CLPAR_OK;
}

/* ---- replay ---- */

/* Orders this replay after the previous one where it reuses the graph's host memory of copies
 * between devices: each device's queue waits for the other devices' previous replay (their
 * copies' memory is read and written again, by the queues). The host does not wait. */
static clpar_status after_last(clpar_graph *g) {
  clpar_status s = CLPAR_OK;
  for (int d = 0; d < g->n_recs; d++) {
    if (!g->done[d]) continue;
    for (int e = 0; s == CLPAR_OK && e < g->n_recs; e++)
      if (e != d) s = clpar_event_wait(g->recs[e].dev, g->done[d]);
    clpar_event_release(g->done[d]);
    g->done[d] = NULL;
  }
  return s;
}

static clpar_status run_patches(clpar_graph *g) {
  clpar_command *cmds[MAX_DEVICES];
  for (int d = 0; d < g->n_recs; d++) cmds[d] = g->recs[d].cmds;
  clpar_status ws = clpar_host_writes_prepare(g->writes, cmds); /* each replay's own values */
  if (ws != CLPAR_OK) return ws;
  for (int d = 0; d < g->n_recs; d++) {
    clpar_capture *c = &g->recs[d];
    for (size_t i = 0; i < c->n_patches; i++) {
      patch *p = &c->patches[i];
      clpar_patch_args a;
      clpar_capture_patch_get(&c->cmds[p->index], &a);
      clpar_status s = p->fn(p->user, &a);
      if (s != CLPAR_OK) {
        pthread_mutex_lock(&graphs_lock);
        mark_stale_locked(g, "a patch refused at an earlier replay (nothing was posted)");
        pthread_mutex_unlock(&graphs_lock);
        return s;
      }
      clpar_capture_patch_set(&c->cmds[p->index], &a);
    }
  }
  return CLPAR_OK;
}

/* Fresh events into the waits and signals (each command holds a reference, which the worker
 * drops; a fresh event's own is dropped by its completion). */
static clpar_status fresh_events(clpar_graph *g) {
  for (int k = 0; k < g->n_events; k++) {
    g->fresh[k] = clpar_event_new(g->recs[g->ev_dev[k]].dev);
    if (g->fresh[k]) continue;
    while (k-- > 0) clpar_event_release(g->fresh[k]);
    return CLPAR_ERROR_OUT_OF_MEMORY;
  }
  for (size_t i = 0; i < g->n_uses; i++) {
    event_use *u = &g->uses[i];
    clpar_event *ev = u->id >= 0 ? g->fresh[u->id] : g->done_ev;
    g->recs[u->dev].cmds[u->index].u.event = clpar_event_retain(ev);
  }
  return CLPAR_OK;
}

/* A batch not posted: its commands' references and its count in flight go, and its signals
 * complete with s (so that the other devices' waits end). */
static void unposted(clpar_graph *g, int d, clpar_status s) {
  if (g->recs[d].end.fn) __atomic_sub_fetch(&g->recs[d].dev->replays, 1, __ATOMIC_ACQ_REL);
  for (size_t i = 0; i < g->n_uses; i++)
    if (g->uses[i].dev == d) clpar_event_release(g->recs[d].cmds[g->uses[i].index].u.event);
  for (int k = 0; k < g->n_events; k++)
    if (g->ev_dev[k] == d) clpar_event_complete(g->fresh[k], s); /* its own reference */
}

static clpar_status post_all(clpar_graph *g) {
  clpar_status s = CLPAR_OK;
  for (int d = 0; d < g->n_recs && s == CLPAR_OK; d++) s = clpar_worker_take_error(g->recs[d].dev);
  if (s == CLPAR_OK) s = fresh_events(g);
  if (s != CLPAR_OK) return s;
  for (int d = 0; d < g->n_recs; d++) {
    clpar_capture *c = &g->recs[d];
    const clpar_command *cmds;
    size_t n = clpar_prepared_pack(&c->prep, c->cmds, c->n, &cmds);
    if (c->end.fn) __atomic_add_fetch(&c->dev->replays, 1, __ATOMIC_ACQ_REL); /* until it ran */
    clpar_status e = s == CLPAR_OK ? clpar_worker_post_batch(c->dev, cmds, n) : s;
    if (e != CLPAR_OK) unposted(g, d, e);
    s = e;
  }
  return s;
}

clpar_status clpar_graph_replay(clpar_graph *g) {
  if (!g) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_graph_replay: graph is NULL");
  pthread_mutex_lock(&graphs_lock);
  clpar_status s = CLPAR_OK;
  if (g->stale)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "clpar_graph_replay: the graph is stale: %s; capture the step again",
                        g->why);
  pthread_mutex_unlock(&graphs_lock);
  if (s == CLPAR_OK) s = after_last(g);
  if (s == CLPAR_OK) s = run_patches(g);
  if (s == CLPAR_OK) {
    s = post_all(g);
    clpar_status w = clpar_host_writes_posted(g->writes); /* a partial post's values too */
    if (s == CLPAR_OK) s = w;
  }
  int reuses = g->n_stage != 0; /* copies' host memory, which the next replay writes again */
  for (int d = 0; s == CLPAR_OK && reuses && d < g->n_recs; d++)
    s = clpar_event_record(g->recs[d].dev, &g->done[d]);
  return s;
}

size_t clpar_graph_command_count(const clpar_graph *g) {
  size_t n = 0;
  for (int d = 0; g && d < g->n_recs; d++) n += g->recs[d].n;
  return n;
}

void clpar_graph_destroy(clpar_graph *g) {
  if (!g) return;
  pthread_mutex_lock(&graphs_lock);
  int detached = g->recs[0].dev == NULL; /* clpar_shutdown took its memory already */
  pthread_mutex_unlock(&graphs_lock);
  for (int d = 0; !detached && d < g->n_recs; d++) /* no replay may still use the pool */
    clpar_device_synchronize(g->recs[d].dev);
  graph_release(g);
  graph_free(g);
}

void clpar_graph_invalidate_all(const char *why) {
  char text[256];
  snprintf(text, sizeof text, "%s was called after the capture", why);
  pthread_mutex_lock(&graphs_lock);
  for (clpar_graph *g = live; g; g = g->next) {
    if (!g->capturing) {
      mark_stale_locked(g, text);
      continue;
    }
    clpar_status s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                                     "clpar_graph_capture: %s inside a capture (it moves or "
                                     "re-makes the buffers the step uses)",
                                     why);
    fail_locked(g, s, clpar_last_error());
  }
  pthread_mutex_unlock(&graphs_lock);
}

void clpar_capture_shutdown(void) {
  pthread_mutex_lock(&graphs_lock);
  clpar_graph *all = live;
  live = NULL;
  __atomic_store_n(&n_live, 0, __ATOMIC_RELEASE);
  for (int d = 0; current && d < current->n_recs; d++)
    __atomic_store_n(&current->recs[d].dev->capture, NULL, __ATOMIC_RELEASE);
  current = NULL;
  for (clpar_graph *g = all; g; g = g->next) mark_stale_locked(g, "clpar_shutdown was called");
  pthread_mutex_unlock(&graphs_lock);
  for (clpar_graph *g = all; g; g = g->next) {
    for (size_t i = 0; i < g->n_pool; i++)
      if (!g->pool[i].in_use)
        clpar_allocator_recache(g->pool[i].dev, g->pool[i].buf, g->pool[i].size);
    g->n_pool = 0;
    for (int d = 0; d < g->n_recs; d++) { /* stale: the commands are never posted again */
      clpar_prepared_release(&g->recs[d].prep, g->recs[d].dev);
      g->recs[d].dev = NULL;
    }
  }
}
