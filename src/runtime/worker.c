/* worker.c — one worker thread per device, the only thread that drives the device's queue,
 * and the dispatch through which the core reaches every backend entry.
 *
 * The core posts commands (a backend entry and its arguments, a wait for another device's
 * event, the recording of an event, a host function) into the device's ring; the worker runs
 * them in order. So the thread that calls an op only checks arguments, takes memory from the
 * cache and posts: it blocks only to read a value back or to synchronize. Devices overlap by
 * construction, and PoCL's `basic` devices, which run a kernel in the thread that enqueues
 * it, run in parallel (DESIGN.md: one thread per queue).
 *
 * A command that fails on the worker cannot report to its caller, who has moved on: its
 * error is kept (the first one) and returned, naming the entry, by the next call on that
 * device. The dispatch functions are generated from backend.h's list of entries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* ---- commands (clpar_command, runtime.h) ---- */

#define ARGS_ALIAS_(name, kind, required) typedef clpar_args_##name args_##name;
CLPAR_BACKEND_ENTRIES(ARGS_ALIAS_)
#undef ARGS_ALIAS_
typedef clpar_command command;

enum {
#define OP_ENUM_(name, kind, required) OP_##name = CLPAR_ENTRY_##name,
  CLPAR_BACKEND_ENTRIES(OP_ENUM_)
#undef OP_ENUM_
      OP_WAIT = CLPAR_OP_WAIT,
  OP_SIGNAL = CLPAR_OP_SIGNAL,
  OP_PREPARED = CLPAR_OP_PREPARED,
  OP_HOST_CALL = CLPAR_OP_HOST_CALL,
  OP_GATE = CLPAR_OP_GATE
};

static const char *const op_names[] = {
#define OP_NAME_(name, kind, required) #name,
    CLPAR_BACKEND_ENTRIES(OP_NAME_)
#undef OP_NAME_
        "wait",
    "signal", "prepared launches", "host call", "gate"};

const char *clpar_op_name(int op) {
  return op >= 0 && op <= OP_GATE ? op_names[op] : "unknown";
}

/* Where a posted-and-waited command puts its result. */
struct clpar_sync_result {
  clpar_status status;
  char message[512];
};
typedef clpar_sync_result sync_result;

struct clpar_worker {
  clpar_device *dev;
  void (*thread_init)(void); /* the layers above's, run first on the thread */
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t work; /* commands arrived, or stop */
  pthread_cond_t ran;  /* a command ran */
  command *ring;
  size_t capacity, head, count; /* head: next to run */
  uint64_t posted, executed;
  int stop;
  clpar_status error; /* the first asynchronous failure, not yet reported */
  char error_message[1024];
};

static _Thread_local const clpar_device *current_device; /* the worker's own device */
/* The device whose backend entry this thread is running (the worker: always its own). */
static _Thread_local clpar_device *entry_device;

void clpar_backend_waited(void) {
  clpar_device *dev = entry_device;
  if (!dev) return;
  __atomic_add_fetch(&dev->host_waits, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&dev->backend_waits, 1, __ATOMIC_RELAXED);
}

int clpar_worker_is_current(const clpar_device *dev) {
  return current_device == dev;
}

/* ---- running ---- */

static clpar_status run_entry(clpar_device *dev, command *cmd_) {
  const clpar_backend_iface *f = dev->bd.iface;
  void *ctx = dev->bd.ctx;
#define CLPAR_BE_ARG_(type, field) , args_->field
#define RUN_CASE_(name, kind, required)                                               \
  case OP_##name: {                                                                   \
    args_##name *args_ = &cmd_->u.name;                                               \
    (void)args_;                                                                      \
    if (!f->name)                                                                     \
      return clpar_set_error(CLPAR_ERROR_UNSUPPORTED, "the %s backend has no " #name, \
                             dev->bd.info.backend);                                   \
    return f->name(ctx CLPAR_BE_ARGS_##name(CLPAR_BE_ARG_));                          \
  }
  switch (cmd_->op) {
    CLPAR_BACKEND_ENTRIES(RUN_CASE_)
    default:
      return clpar_set_error(CLPAR_ERROR_INTERNAL, "worker: unknown command %d", cmd_->op);
  }
#undef RUN_CASE_
}

static void signal_done(void *user, clpar_status status) {
  clpar_event_complete(user, status);
}

/* Records a backend event and completes ev when it completes; on failure, at once. */
static clpar_status run_signal(clpar_device *dev, clpar_event *ev) {
  void *bev = NULL;
  clpar_status s = dev->bd.iface->event_record(dev->bd.ctx, &bev);
  if (s == CLPAR_OK && !bev) {
    clpar_event_complete(ev, CLPAR_OK);
  } else if (s == CLPAR_OK) {
    s = dev->bd.iface->event_then(dev->bd.ctx, bev, signal_done, ev);
    if (s != CLPAR_OK) { /* cannot be told: wait here */
      dev->bd.iface->finish(dev->bd.ctx);
      clpar_event_complete(ev, CLPAR_OK);
    }
    dev->bd.iface->event_free(dev->bd.ctx, bev);
  } else {
    clpar_event_complete(ev, s);
  }
  return s;
}

static clpar_status run_command(clpar_device *dev, command *c) {
  switch (c->op) {
    case OP_WAIT:
      clpar_event_block(c->u.event, dev);
      clpar_event_release(c->u.event);
      return CLPAR_OK;
    case OP_SIGNAL: {
      clpar_status s = run_signal(dev, c->u.event);
      clpar_event_release(c->u.event);
      return s;
    }
    case OP_PREPARED: /* a replay's */
      return clpar_prepared_run(dev, c->u.prepared_run.launch, c->u.prepared_run.n);
    case OP_HOST_CALL:
      return clpar_host_call_run(dev, c->u.host_call);
    case OP_GATE:
      return clpar_gate_pass(dev, c->u.gate);
    default:
      if (c->capture_index) return clpar_prepared_record(dev, c, run_entry);
      return run_entry(dev, c);
  }
}

/* Commands the worker takes from the ring per acquisition of its lock. */
enum { CHUNK = 32 };

/* After command c ran with s: its caller's result (a _sync post), or the device's first
 * asynchronous error; under the lock. */
static void finish_locked(clpar_worker *w, const command *c, clpar_status s) {
  if (c->result) {
    c->result->status = s;
    if (s != CLPAR_OK)
      snprintf(c->result->message, sizeof c->result->message, "%s", clpar_last_error());
  } else if (s != CLPAR_OK && w->error == CLPAR_OK) {
    w->error = s;
    snprintf(w->error_message, sizeof w->error_message, "%s failed on the device's queue: %s",
             op_names[c->op], clpar_last_error());
  }
}

/* Runs up to CHUNK commands taken under one lock. A _sync post's result and a failure are
 * published (and the executed count with them) as soon as the command ran, so a caller waiting
 * for it, or for an event signalled after a failed command, sees them as before; the others'
 * count at the chunk's end. Called and returning with the lock held. */
static void run_chunk(clpar_worker *w, command *chunk) {
  size_t k = w->count < CHUNK ? w->count : CHUNK, done = 0;
  for (size_t i = 0; i < k; i++) chunk[i] = w->ring[(w->head + i) % w->capacity];
  w->head = (w->head + k) % w->capacity;
  w->count -= k;
  pthread_mutex_unlock(&w->lock);
  for (size_t i = 0; i < k; i++) {
    clpar_clear_error();
    clpar_status s = run_command(w->dev, &chunk[i]);
    if (!chunk[i].result && s == CLPAR_OK) continue;
    pthread_mutex_lock(&w->lock);
    finish_locked(w, &chunk[i], s);
    w->executed += i + 1 - done;
    done = i + 1;
    pthread_cond_broadcast(&w->ran);
    pthread_mutex_unlock(&w->lock);
  }
  pthread_mutex_lock(&w->lock);
  if (done < k) {
    w->executed += k - done;
    pthread_cond_broadcast(&w->ran);
  }
}

static void *worker_main(void *arg) {
  clpar_worker *w = arg;
  current_device = w->dev;
  entry_device = w->dev;
  if (w->thread_init) w->thread_init();
  command chunk[CHUNK];
  pthread_mutex_lock(&w->lock);
  for (;;) {
    while (w->count == 0 && !w->stop) pthread_cond_wait(&w->work, &w->lock);
    if (w->count == 0) break;
    run_chunk(w, chunk);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

/* ---- posting ---- */

static clpar_status ring_grow(clpar_worker *w) {
  size_t cap = w->capacity ? 2 * w->capacity : 256;
  command *grown = malloc(cap * sizeof *grown);
  if (!grown) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "worker: out of host memory");
  for (size_t i = 0; i < w->count; i++) grown[i] = w->ring[(w->head + i) % w->capacity];
  free(w->ring);
  w->ring = grown;
  w->capacity = cap;
  w->head = 0;
  return CLPAR_OK;
}

/* Appends c; *ticket is its number (the worker has run it once executed >= ticket). */
static clpar_status post(clpar_device *dev, const command *c, uint64_t *ticket) {
  clpar_worker *w = dev->worker;
  if (!w)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s has no worker (shut down?)",
                           dev->bd.info.id);
  pthread_mutex_lock(&w->lock);
  clpar_status s = w->count == w->capacity ? ring_grow(w) : CLPAR_OK;
  if (s == CLPAR_OK) {
    command *slot = &w->ring[(w->head + w->count) % w->capacity];
    *slot = *c;
    w->count++;
    *ticket = ++w->posted;
    clpar_capture *cap = __atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE);
    size_t index = cap ? clpar_capture_record(cap, c) : SIZE_MAX; /* in the order run */
    if (index < UINT32_MAX && clpar_prepared_wanted(dev)) slot->capture_index = 1 + (uint32_t)index;
    pthread_cond_signal(&w->work);
  }
  pthread_mutex_unlock(&w->lock);
  return s;
}

clpar_status clpar_worker_take_error(clpar_device *dev) {
  clpar_worker *w = dev->worker;
  if (!w || __atomic_load_n(&w->error, __ATOMIC_RELAXED) == CLPAR_OK) return CLPAR_OK;
  pthread_mutex_lock(&w->lock);
  clpar_status s = w->error;
  if (s != CLPAR_OK) clpar_set_error(s, "%s: %s", dev->bd.info.id, w->error_message);
  w->error = CLPAR_OK;
  pthread_mutex_unlock(&w->lock);
  return s;
}

/* Posts c and returns at once: an earlier asynchronous failure is returned instead. */
static clpar_status post_async(clpar_device *dev, const command *c) {
  clpar_status s = clpar_capture_check_op(dev, c->op);
  if (s == CLPAR_OK) s = clpar_worker_take_error(dev);
  uint64_t ticket;
  return s != CLPAR_OK ? s : post(dev, c, &ticket);
}

clpar_status clpar_worker_post(clpar_device *dev, const clpar_command *c) {
  return post_async(dev, c);
}

/* Posts c and waits until the worker has run it (on the worker itself: runs it at once). */
static clpar_status post_sync(clpar_device *dev, command *c) {
  clpar_status s =
      clpar_capture_refuse(dev, op_names[c->op], "a wait for the device (a _sync entry)");
  if (s == CLPAR_OK) s = clpar_worker_take_error(dev);
  if (s != CLPAR_OK) return s;
  if (clpar_worker_is_current(dev)) return run_command(dev, c);
  sync_result result = {CLPAR_OK, ""};
  c->result = &result;
  uint64_t ticket;
  s = post(dev, c, &ticket);
  if (s != CLPAR_OK) return s;
  __atomic_add_fetch(&dev->host_waits, 1, __ATOMIC_RELAXED);
  clpar_worker *w = dev->worker;
  pthread_mutex_lock(&w->lock);
  while (w->executed < ticket) pthread_cond_wait(&w->ran, &w->lock);
  pthread_mutex_unlock(&w->lock);
  if (result.status != CLPAR_OK)
    return clpar_set_error(result.status, "%s: %s", dev->bd.info.id, result.message);
  return CLPAR_OK;
}

clpar_status clpar_worker_post_event(clpar_device *dev, clpar_event *ev, int wait) {
  command c = {.op = wait ? OP_WAIT : OP_SIGNAL};
  c.u.event = ev;
  clpar_status s = clpar_capture_refuse(dev, wait ? "clpar_event_wait" : "clpar_event_record",
                                        "an event (a wait on the host or between devices)");
  if (s != CLPAR_OK) return s;
  uint64_t ticket;
  return post(dev, &c, &ticket); /* never refused for an earlier error: events must flow */
}

/* Grows the ring until n more commands fit. */
static clpar_status ring_fit(clpar_worker *w, size_t n) {
  clpar_status s = CLPAR_OK;
  while (s == CLPAR_OK && w->capacity - w->count < n) s = ring_grow(w);
  return s;
}

clpar_status clpar_worker_post_batch(clpar_device *dev, const command *cmds, size_t n) {
  clpar_worker *w = dev->worker;
  clpar_status s = clpar_capture_refuse(dev, "clpar_graph_replay", "a replay of another graph");
  if (s == CLPAR_OK) s = clpar_worker_take_error(dev);
  if (s != CLPAR_OK || n == 0) return s;
  if (!w)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s has no worker (shut down?)",
                           dev->bd.info.id);
  pthread_mutex_lock(&w->lock);
  s = ring_fit(w, n);
  if (s == CLPAR_OK) {
    size_t tail = (w->head + w->count) % w->capacity, first = w->capacity - tail;
    if (first > n) first = n;
    memcpy(w->ring + tail, cmds, first * sizeof *cmds);
    memcpy(w->ring, cmds + first, (n - first) * sizeof *cmds);
    w->count += n;
    w->posted += n;
    pthread_cond_signal(&w->work);
  }
  pthread_mutex_unlock(&w->lock);
  return s;
}

clpar_status clpar_worker_drain(clpar_device *dev) {
  clpar_event *ev;
  clpar_status s = clpar_event_record(dev, &ev);
  if (s != CLPAR_OK) return s;
  s = clpar_event_sync(ev);
  clpar_event_release(ev);
  if (s == CLPAR_OK) s = clpar_worker_take_error(dev);
  return s;
}

/* ---- the buffers a command names (a graph's, src/runtime/capture.c) ---- */

/* The buffer a command's argument names, if any (by its type). */
static void *bref_buf(const void *p) {
  return ((const clpar_bref *)p)->buf;
}
static void *ptr_buf(const void *p) {
  return *(void *const *)p;
}
static void *cptr_buf(const void *p) {
  return (void *)*(const void *const *)p;
}
static void *no_buf(const void *p) {
  (void)p;
  return NULL;
}

size_t clpar_command_buffers(const clpar_command *c, void **list) {
  size_t n = 0;
#define BUF_OF_(type, field)                                                                     \
  list[n] = _Generic(a_->field, clpar_bref: bref_buf, void *: ptr_buf, const void *: cptr_buf, \
                     default: no_buf)(&a_->field); \
  n += list[n] != NULL && n < 15;
#define BUF_CASE_(name, kind, required)       \
  case CLPAR_ENTRY_##name: {                  \
    const clpar_args_##name *a_ = &c->u.name; \
    (void)a_;                                 \
    CLPAR_BE_ARGS_##name(BUF_OF_) break;      \
  }
  switch (c->op) {
    CLPAR_BACKEND_ENTRIES(BUF_CASE_)
    default:
      break;
  }
#undef BUF_CASE_
#undef BUF_OF_
  return n;
}

/* ---- the dispatch, generated ---- */

/* Every backend entry the core calls goes through these: QUEUE entries are posted to the
 * device's worker (run_entry calls them there, with entry_device set for the thread's
 * life), DIRECT entries are called here with entry_device set, so that a backend's
 * clpar_backend_waited is counted on the right device. An optional QUEUE entry whose bit is
 * set in dev->composed is composed from primitives instead (src/runtime/compose.c). */
#define DISPATCH_(name, kind, required) DISPATCH_##kind##_##required(name)
#define DISPATCH_DIRECT_0(name) DISPATCH_DIRECT(name)
#define DISPATCH_DIRECT_1(name) DISPATCH_DIRECT(name)

#define DISPATCH_DIRECT(name)                                                               \
  clpar_status clpar_dev_##name(clpar_device *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_)) {  \
    if (!dev->bd.iface->name)                                                               \
      return clpar_set_error(CLPAR_ERROR_UNSUPPORTED, "%s: the %s backend has no " #name,   \
                             dev->bd.info.id, dev->bd.info.backend);                        \
    clpar_device *outer_ = entry_device;                                                    \
    entry_device = dev;                                                                     \
    clpar_status s = dev->bd.iface->name(dev->bd.ctx CLPAR_BE_ARGS_##name(CLPAR_BE_NAME_)); \
    entry_device = outer_;                                                                  \
    return s == CLPAR_OK ? s : clpar_device_fail(dev, s);                                   \
  }
#define CLPAR_BE_NAME_(type, field) , field

/* Composed when the device lacks the entry or a test forced it; the _sync form then waits
 * for the composition's last primitive. */
#define DISPATCH_QUEUE_1(name) DISPATCH_QUEUE(name, 0, 0)
#define DISPATCH_QUEUE_0(name)                               \
  DISPATCH_QUEUE(name, compose_now(dev, CLPAR_ENTRY_##name), \
                 clpar_compose_##name(dev CLPAR_BE_ARGS_##name(CLPAR_BE_NAME_)))

/* Whether entry is composed on dev (counted in dev->composed_calls when it is). */
static int compose_now(clpar_device *dev, int entry) {
  if (!clpar_entry_set(dev->composed, entry)) return 0;
  __atomic_add_fetch(&dev->composed_calls, 1, __ATOMIC_RELAXED);
  return 1;
}

#define DISPATCH_QUEUE(name, composed, compose)                                                   \
  static void pack_##name(command *cmd_ CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_)) {                  \
    cmd_->op = OP_##name;                                                                         \
    cmd_->result = NULL;                                                                          \
    cmd_->capture_index = 0;                                                                      \
    args_##name *args_ = &cmd_->u.name;                                                           \
    (void)args_;                                                                                  \
    CLPAR_BE_ARGS_##name(CLPAR_BE_STORE_)                                                         \
  }                                                                                               \
  clpar_status clpar_dev_##name(clpar_device *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_)) {        \
    if (composed) return (compose);                                                               \
    command cmd_;                                                                                 \
    pack_##name(&cmd_ CLPAR_BE_ARGS_##name(CLPAR_BE_NAME_));                                      \
    return post_async(dev, &cmd_);                                                                \
  }                                                                                               \
  clpar_status clpar_dev_##name##_sync(clpar_device *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_)) { \
    if (composed) {                                                                               \
      clpar_status s_ = (compose);                                                                \
      return s_ == CLPAR_OK ? clpar_worker_drain(dev) : s_;                                       \
    }                                                                                             \
    command cmd_;                                                                                 \
    pack_##name(&cmd_ CLPAR_BE_ARGS_##name(CLPAR_BE_NAME_));                                      \
    return post_sync(dev, &cmd_);                                                                 \
  }
#define CLPAR_BE_STORE_(type, field) args_->field = field;

CLPAR_BACKEND_ENTRIES(DISPATCH_)

/* ---- life ---- */

clpar_status clpar_worker_start(clpar_device *dev, void (*thread_init)(void)) {
  clpar_worker *w = calloc(1, sizeof *w);
  if (!w) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "worker: out of host memory");
  w->dev = dev;
  w->thread_init = thread_init;
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->work, NULL);
  pthread_cond_init(&w->ran, NULL);
  if (ring_grow(w) != CLPAR_OK || pthread_create(&w->thread, NULL, worker_main, w) != 0) {
    free(w->ring);
    pthread_cond_destroy(&w->ran);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->lock);
    free(w);
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "%s: cannot start its worker thread",
                           dev->bd.info.id);
  }
  dev->worker = w;
  return CLPAR_OK;
}

void clpar_worker_stop(clpar_device *dev) {
  clpar_worker *w = dev->worker;
  if (!w) return;
  pthread_mutex_lock(&w->lock);
  w->stop = 1;
  pthread_cond_signal(&w->work);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL);
  if (w->error != CLPAR_OK)
    clpar_log(CLPAR_LOG_WARN, "%s: an error was never reported: %s", dev->bd.info.id,
              w->error_message);
  free(w->ring);
  pthread_cond_destroy(&w->ran);
  pthread_cond_destroy(&w->work);
  pthread_mutex_destroy(&w->lock);
  free(w);
  dev->worker = NULL;
}
