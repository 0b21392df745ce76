/* runtime.h — the runtime: the device list and the library's lifetime (registry.c), each
 * device's worker thread and the dispatch of backend entries through it (worker.c), entries
 * composed from primitives (compose.c), events between devices and the busy list of a buffer
 * (event.c), the caching allocator (allocator.c), storages (storage.c), transfers (transfer.c),
 * and the services backend.h promises the backends (status.c, log.c, clock.c, trusted_file.c).
 * The layers above (tensor, autograd, ops, nn, parallel, dist, io) call into it; it calls
 * none of them (scripts/check_house.sh keeps its includes to this header, backend.h and the
 * public headers). Not installed. */
#ifndef CLPAR_RUNTIME_H
#define CLPAR_RUNTIME_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "clpar/clpar.h"

/* clpar_set_error, clpar_append_error and clpar_log are declared in backend.h. */
typedef struct clpar_busy clpar_busy;
struct clpar_storage;
void clpar_log_init_from_env(void);

/* ---- the library's lifetime (src/runtime/registry.c) ----
 *
 * What the layers above do at the library's start and end and on each worker thread, given
 * by clpar_init (src/init.c): the runtime calls up only through these. Any may be NULL. */
typedef struct clpar_runtime_hooks {
  /* at the first clpar_init, before the devices are probed; an error fails clpar_init */
  clpar_status (*start)(void);
  /* at the last clpar_shutdown, once every queue drained and every storage's memory went back
   * to its device's cache, before the devices go */
  void (*stop)(void);
  /* first thing on each device's worker thread */
  void (*worker_thread)(void);
} clpar_runtime_hooks;
/* clpar_init and clpar_shutdown under the registry's lock and count: the first init probes the
 * devices and starts their workers (hooks kept, by pointer, until the last shutdown). */
clpar_status clpar_runtime_init(const clpar_runtime_hooks *hooks);
void clpar_runtime_shutdown(void);

/* ---- devices and the caching allocator (src/runtime/registry.c, src/runtime/allocator.c) ---- */

typedef struct clpar_block clpar_block;                 /* a cached buffer */
typedef struct clpar_event clpar_event;                 /* src/runtime/event.c */
typedef struct clpar_worker clpar_worker;               /* src/runtime/worker.c */
typedef struct clpar_staging_block clpar_staging_block; /* src/runtime/transfer.c */

/* The words of a mask with one bit per backend entry (128 entries). */
#define CLPAR_ENTRY_WORDS 2

struct clpar_device {
  clpar_backend_device bd; /* iface, ctx, info (with id) */
  int index;               /* in the selected list */
  pthread_mutex_t alloc_lock;
  clpar_block *free_blocks; /* sorted by size, ascending */
  clpar_memory_stats stats;
  /* bytes by category (include/clpar/memory.h): the tensors', and the backend's workspaces
   * as last read from it; under alloc_lock */
  uint64_t mem_in_use[7], mem_peak[7];
  /* what the allocator lets the driver hold for this device (in use + cached): its global
   * memory, or less with CLPAR_DEVICE_MEMORY_LIMIT (src/runtime/allocator.c) */
  uint64_t mem_limit;
  clpar_worker *worker; /* the one thread that drives the device's queue */
  /* pinned host memory for transfers, by size; guarded by staging_lock */
  pthread_mutex_t staging_lock;
  clpar_staging_block *staging_free;
  clpar_staging_block *staging_busy; /* in use by copies to other devices, oldest first */
  int staging_blocks;                /* pinned blocks made for the pool (asked for) */
  /* atomic counters (clpar_device_counters) */
  uint64_t host_waits;  /* a thread blocked on the device (callers' waits, backend_waits) */
  uint64_t queue_waits; /* the worker waited for another device's event */
  uint64_t transfers_in, transfers_out, bytes_in, bytes_out;
  uint64_t backend_waits; /* of host_waits, those inside a backend entry */
  uint64_t peer_copies;   /* transfers in or out by the backend's copy_peer */
  /* replays posted whose list hands work to a host thread and has not ended yet, and the
   * clpar_replays_wait calls that waited for some (src/runtime/capture_host.c) */
  uint64_t replays, replay_drains;
  /* The fused entries the core composes from primitives (src/runtime/compose.c) instead of calling
   * the backend, and gemm_half where the core widens its operands instead (src/autocast_gemm.c):
   * bit CLPAR_ENTRY_<name>. `natural`: what the backend lacks or refuses
   * (supports_op); `composed`: that plus what a test forced (clpar_compose_force). One bit
   * per entry, entry e at bit e % 64 of word e / 64 (clpar_entry_set). */
  uint64_t natural[CLPAR_ENTRY_WORDS], composed[CLPAR_ENTRY_WORDS];
  uint64_t composed_calls; /* atomic: fused entries composed so far (tests check the path) */
  uint64_t prepared_runs;  /* atomic: a graph's prepared launches run (tests check the path) */
  /* the prepared launches of the capture that commands posted since capture_begin join, until
   * capture_end has waited for them (src/runtime/capture.c); atomic */
  struct clpar_prepared_list *preparing;
  /* the recording this device's posts join while a graph is captured (src/runtime/capture.c),
   * NULL otherwise; atomic */
  struct clpar_capture *capture;
};

/* The entries' numbers, in table order: bit positions in clpar_device.composed. */
enum {
#define CLPAR_ENTRY_ENUM_(name, kind, required) CLPAR_ENTRY_##name,
  CLPAR_BACKEND_ENTRIES(CLPAR_ENTRY_ENUM_)
#undef CLPAR_ENTRY_ENUM_
      CLPAR_ENTRY_COUNT
};
_Static_assert(CLPAR_ENTRY_COUNT <= 64 * CLPAR_ENTRY_WORDS, "an entry mask has a bit per entry");

/* Whether entry's bit is set in one of the device's entry masks (natural, composed). */
static inline int clpar_entry_set(const uint64_t *mask, int entry) {
  return (int)((__atomic_load_n(&mask[entry / 64], __ATOMIC_RELAXED) >> (entry % 64)) & 1);
}

/* ---- the device's worker and the dispatch (src/runtime/worker.c) ----
 *
 * Every QUEUE entry of the backend runs on the device's worker thread, in the order posted;
 * clpar_dev_<entry>(dev, args...) posts one and returns (the error of an earlier command
 * that failed asynchronously comes back first); clpar_dev_<entry>_sync posts it and waits
 * until it has run, counting a host wait. DIRECT entries are called at once. */
#define CLPAR_DISPATCH_DECL_(name, kind, required) CLPAR_DISPATCH_DECL_##kind(name)
#define CLPAR_DISPATCH_DECL_DIRECT(name) \
  clpar_status clpar_dev_##name(clpar_device *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
#define CLPAR_DISPATCH_DECL_QUEUE(name)                                                   \
  clpar_status clpar_dev_##name(clpar_device *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_)); \
  clpar_status clpar_dev_##name##_sync(clpar_device *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
CLPAR_BACKEND_ENTRIES(CLPAR_DISPATCH_DECL_)

/* ---- composition (src/runtime/compose.c) ----
 *
 * For each optional QUEUE entry, clpar_compose_<entry>(dev, args...) posts the same result
 * from primitive entries (softmax_backward, nll, nll_backward, sgd_step, adam_step; the
 * others refuse and are never composed); the dispatch calls it instead of the backend when the
 * entry's bit is set in dev->composed. */
#define CLPAR_COMPOSE_DECL_(name, kind, required) CLPAR_COMPOSE_DECL_##kind##_##required(name)
#define CLPAR_COMPOSE_DECL_DIRECT_0(name)
#define CLPAR_COMPOSE_DECL_DIRECT_1(name)
#define CLPAR_COMPOSE_DECL_QUEUE_1(name)
#define CLPAR_COMPOSE_DECL_QUEUE_0(name) \
  clpar_status clpar_compose_##name(clpar_device *dev CLPAR_BE_ARGS_##name(CLPAR_BE_PARAM_));
CLPAR_BACKEND_ENTRIES(CLPAR_COMPOSE_DECL_)
/* Sets dev->natural and dev->composed from the backend's table and supports_op (at
 * clpar_init, before the device's worker starts). */
void clpar_compose_init(clpar_device *dev);
/* For tests only (not in the public headers): composes the optional entries in mask (bits
 * 1 << CLPAR_ENTRY_<name>) on dev even where the backend has them (gemm_half: the core widens
 * its operands instead); 0 restores the backend's own. CLPAR_ERROR_INVALID_ARGUMENT for a bit
 * of an entry that cannot be composed. */
clpar_status clpar_compose_force(clpar_device *dev, uint64_t mask);

/* ---- commands: what the worker runs (src/runtime/worker.c) and a graph holds (capture.c) ---- */

#define CLPAR_BE_FIELD_(type, field) type field;
#define CLPAR_ARGS_STRUCT_(name, kind, required) \
  typedef struct {                               \
    char unused_;                                \
    CLPAR_BE_ARGS_##name(CLPAR_BE_FIELD_)        \
  } clpar_args_##name;
CLPAR_BACKEND_ENTRIES(CLPAR_ARGS_STRUCT_)
#undef CLPAR_ARGS_STRUCT_

/* A command's op: a backend entry (CLPAR_ENTRY_<name>), or one of these. */
enum {
  CLPAR_OP_WAIT = CLPAR_ENTRY_COUNT, /* u.event: wait for another device's event */
  CLPAR_OP_SIGNAL,    /* u.event: record, complete the core event when the device has */
  CLPAR_OP_PREPARED,  /* u.prepared_run: a replay's run of consecutive prepared launches */
  CLPAR_OP_HOST_CALL, /* u.host_call: a host function once the work before it completed */
  CLPAR_OP_GATE       /* u.gate: wait until a host thread opens the gate (capture_host.c) */
};

typedef struct clpar_sync_result clpar_sync_result; /* where a waited-for command reports */
typedef struct clpar_command {
  int op;
  /* The ring's copy of a command posted while its device captures: 1 + its index in the
   * graph's list, whose launch the worker asks the backend to prepare (capture_prepared.c);
   * 0 otherwise. */
  uint32_t capture_index;
  clpar_sync_result *result; /* NULL: errors go to the device's first error */
  union {
#define CLPAR_ARGS_MEMBER_(name, kind, required) clpar_args_##name name;
    CLPAR_BACKEND_ENTRIES(CLPAR_ARGS_MEMBER_)
#undef CLPAR_ARGS_MEMBER_
    clpar_event *event;
    struct {
      void **launch;
      size_t n;
    } prepared_run;
    struct clpar_host_call *host_call;
    struct clpar_gate *gate;
  } u;
} clpar_command;

/* Appends cmds[0..n) to dev's ring under one lock with one wake-up (a graph's replay). An
 * earlier asynchronous failure is returned instead. */
clpar_status clpar_worker_post_batch(clpar_device *dev, const clpar_command *cmds, size_t n);
/* Posts c to dev's worker as the dispatch posts an entry (an earlier asynchronous failure is
 * returned instead); recorded when dev captures. */
clpar_status clpar_worker_post(clpar_device *dev, const clpar_command *c);
/* Puts into list (room for 16) the buffers c's arguments name: its clpar_bref and void
 * pointer arguments (some may be host memory); returns how many. */
size_t clpar_command_buffers(const clpar_command *c, void **list);
/* The entry's name for a command's op ("wait", "signal" for the two others). */
const char *clpar_op_name(int op);

/* Starts dev's worker thread, which calls thread_init (may be NULL) first. */
clpar_status clpar_worker_start(clpar_device *dev, void (*thread_init)(void));
/* Runs everything posted, then ends the thread (at shutdown). */
void clpar_worker_stop(clpar_device *dev);
/* The first error of a command that failed on the worker, taken (cleared); CLPAR_OK if none. */
clpar_status clpar_worker_take_error(clpar_device *dev);
/* Posts the recording of ev (wait == 0) or a wait for it (wait == 1); src/runtime/event.c's record
 * and wait do this, each handing the command a reference. Never refused for an earlier error. */
clpar_status clpar_worker_post_event(clpar_device *dev, clpar_event *ev, int wait);
/* Waits until every command posted to the device so far has run and completed on the device. */
clpar_status clpar_worker_drain(clpar_device *dev);
int clpar_worker_is_current(const clpar_device *dev);

/* ---- events (src/runtime/event.c): the completion of the work posted to a device before it ----
 */

/* Posts the recording of an event on dev: it completes when the work posted before it has. */
clpar_status clpar_event_record(clpar_device *dev, clpar_event **out);
/* Makes dev's queue wait for ev (posted: the worker waits, the caller does not). */
clpar_status clpar_event_wait(clpar_device *dev, clpar_event *ev);
int clpar_event_done(const clpar_event *ev);
/* Blocks the calling thread until ev completed (a host wait on dev); its status. */
clpar_status clpar_event_sync(clpar_event *ev);
/* Calls fn(user) once ev completed (at once if it has). */
clpar_status clpar_event_then(clpar_event *ev, void (*fn)(void *user), void *user);
clpar_event *clpar_event_retain(clpar_event *ev);
void clpar_event_release(clpar_event *ev);
/* The worker side: a new, pending event; completing it runs its callbacks and wakes waiters. */
clpar_event *clpar_event_new(clpar_device *dev);
void clpar_event_complete(clpar_event *ev, clpar_status status);
/* Waits (worker side) for ev; counts a queue wait on dev when it had to. */
void clpar_event_block(clpar_event *ev, clpar_device *dev);

/* ---- transfers (src/runtime/transfer.c) ---- */

/* Copies bytes from (src_dev, src buffer) to (dst_dev, dst buffer), both at byte offsets,
 * without blocking the caller: on one device a device copy; else through pinned host memory
 * in double-buffered chunks, or straight from or to the host device's memory. Storages
 * read or written by another device's queue are marked busy until that work completes. */
clpar_status clpar_transfer(clpar_device *dst_dev, struct clpar_storage *dst_st, size_t dst_off,
                            clpar_device *src_dev, struct clpar_storage *src_st, size_t src_off,
                            size_t bytes);
/* clpar_transfer posted in two halves, for a copy whose source is ready long before its
 * destination needs it (the pipeline's copies between stages): begin posts the source's part
 * now (its queue reads into staging; the caller keeps src_st alive until finish or cancel),
 * finish posts the destination's part
 * (its queue waits for that read and writes) and frees the half, cancel frees it unfinished.
 * Where no staging is needed (one device, the host device, a peer copy) or the copy is very
 * large, finish posts the whole transfer: the source must not be written between the two. */
typedef struct clpar_transfer_half clpar_transfer_half;
clpar_status clpar_transfer_begin(clpar_device *dst_dev, clpar_device *src_dev,
                                  struct clpar_storage *src_st, size_t src_off, size_t bytes,
                                  clpar_transfer_half **out);
clpar_status clpar_transfer_finish(clpar_transfer_half *h, clpar_device *dst_dev,
                                   struct clpar_storage *dst_st, size_t dst_off);
void clpar_transfer_cancel(clpar_transfer_half *h);
/* Uploads host memory the caller may reuse at once (copied into staging first). */
clpar_status clpar_upload(clpar_device *dev, void *buf, size_t off_bytes, const void *src,
                          size_t bytes);
/* Fills n bytes of the source, from byte at, into dst (pinned staging memory). */
typedef clpar_status (*clpar_fill_fn)(void *user, size_t at, void *dst, size_t n);
/* clpar_upload with the bytes produced straight into staging, chunk by chunk, by fill (a file
 * read): one host copy fewer, and the device's write of one chunk overlaps the filling of the
 * next. An error of fill is returned; chunks already posted are written. */
clpar_status clpar_upload_fill(clpar_device *dev, void *buf, size_t off_bytes, size_t bytes,
                               clpar_fill_fn fill, void *user);
/* Reads into host memory and waits (one host wait). */
clpar_status clpar_download(clpar_device *dev, const void *buf, size_t off_bytes, void *dst,
                            size_t bytes);
void clpar_staging_destroy(clpar_device *dev);
/* Allocates, up front and waiting for dev's worker, the pinned staging blocks that transfers
 * transfers of bytes each from dev (or uploads of bytes to dev) in flight at once take (at most
 * 8 blocks a call; none for transfers small enough to use plain memory): at clpar_init for
 * small uploads (labels, a batch), at clpar_data_parallel_create for its flat copies. The
 * blocks join dev's pool for any transfer. */
clpar_status clpar_staging_reserve(clpar_device *dev, int transfers, size_t bytes);

/* Gets a buffer of at least bytes from the device's cache or driver; never one that queued
 * work of another device still uses. */
clpar_status clpar_alloc_buffer(clpar_device *dev, size_t bytes, void **buf, size_t *capacity);
/* Returns a buffer to the device's cache; busy (may be NULL): events of other devices' work on
 * it, taken over, after which the buffer may be handed out again. */
void clpar_free_buffer(clpar_device *dev, void *buf, size_t capacity, struct clpar_busy *busy);
void clpar_allocator_destroy(clpar_device *dev);

int clpar_is_initialized(void);
/* Every probed device, selected or not (index 0 .. clpar_device_probed_count()-1), for tests
 * that need a second device; NULL out of range. */
int clpar_device_probed_count(void);
clpar_device *clpar_device_probed(int i);
/* Called by the core when a backend entry fails: prefixes the message with the device id. */
clpar_status clpar_device_fail(const clpar_device *dev, clpar_status s);
/* Sets every device's mem_limit from its global memory and CLPAR_DEVICE_MEMORY_LIMIT
 * (src/runtime/allocator.c); CLPAR_ERROR_INVALID_ARGUMENT when that variable is not a size. */
clpar_status clpar_allocator_set_limits(clpar_device **devs, int count);

/* ---- busy buffers (src/runtime/event.c) ---- */

/* Events of other devices' queued work on a buffer (a transfer reading or writing it). */
typedef struct clpar_busy clpar_busy;
/* Adds ev (retained) to *busy, which it makes on first use (safely against another thread's
 * first use), dropping the events that completed. */
clpar_status clpar_busy_mark(clpar_busy **busy, clpar_event *ev);
/* 1 when every event completed (NULL: none). */
int clpar_busy_idle(clpar_busy *busy);
/* Blocks until every event completed. */
void clpar_busy_sync(clpar_busy *busy);
/* Releases the events and frees the list (NULL: nothing). */
void clpar_busy_free(clpar_busy *busy);

/* ---- storages (src/runtime/storage.c): one device buffer, shared by reference ---- */

typedef struct clpar_storage {
  int refcount; /* atomic */
  clpar_device *dev;
  void *buf;
  size_t capacity;  /* bytes */
  uint64_t version; /* bumped by every in-place write: replicas copy only what changed */
  clpar_busy *busy; /* NULL until another device's queue touches the buffer */
  /* counted in this clpar_mem_category (src/runtime/memory.c) */
  unsigned char category;
  /* every storage alive, for clpar_shutdown; dev is NULL once shut down */
  struct clpar_storage *live_prev, *live_next;
} clpar_storage;

/* ---- memory by category (src/runtime/memory.c; categories: clpar_mem_category) ---- */

/* The category new storages of this thread are counted in; returns the one it replaces. */
int clpar_memory_category_set(int c);
int clpar_memory_category_current(void);
/* Adds delta bytes to category c of dev (its peak follows). */
void clpar_memory_account(clpar_device *dev, int c, int64_t delta);
/* Moves st's bytes to category c (its owner took it over: a parameter, a gradient, ...). */
void clpar_storage_tag(clpar_storage *st, int c);
/* Sets CLPAR_MEM_WORKSPACE to the bytes the backend's workspaces hold now (its
 * workspace_bytes entry; 0 without one); alloc_lock held. */
void clpar_memory_workspace_sync_locked(clpar_device *dev);

/* A new storage of at least bytes on dev (from its cache), one reference, counted alive. */
clpar_status clpar_storage_new(clpar_device *dev, size_t bytes, clpar_storage **out);
clpar_storage *clpar_storage_retain(clpar_storage *st);
/* Drops a reference; the last gives the memory back to the device's cache (with its busy
 * list) and frees st. */
void clpar_storage_release(clpar_storage *st);
/* At clpar_shutdown, after the queues drained: gives every live storage's memory back to its
 * device's cache (released with the device), leaves the tensors unusable except for freeing,
 * and logs one warning with their count. */
void clpar_storage_orphan_all(void);

/* ---- text from files in messages (src/runtime/status.c) ---- */

/* Room for one escaped name or value in a message: longer ones are cut (with "..."). */
#define CLPAR_ESC_SIZE 200
/* s (len bytes, NUL bytes included) made fit for a message or a log line, into buf of size
 * (>= 8) bytes: control bytes (below 0x20, DEL and the UTF-8 C1 controls) as \xNN and the
 * backslash as \\, so that a name or value read from a file cannot move a terminal's cursor,
 * forge a log line or hide text; cut with "..." to fit. Returns buf. */
const char *clpar_escape(const char *s, size_t len, char *buf, size_t size);
/* A NUL-terminated s escaped into buf, a char array of the caller's (CLPAR_ESC_SIZE). */
#define CLPAR_ESC(s, buf) clpar_escape((s), strlen(s), (buf), sizeof(buf))

/* ---- files read and written (src/runtime/trusted_file.c) ---- */

/* Opens path for reading only if it is a regular file: the open cannot block (O_NONBLOCK, so a
 * FIFO nobody writes is refused, not waited on) and the check is made with fstat on the
 * descriptor then read (a link is followed to what it names, and a device or FIFO behind it
 * is refused). *size: the file's size. CLPAR_ERROR_IO naming path and what it is. */
clpar_status clpar_open_regular(const char *path, int *fd, int64_t *size);

/* Part i of a file being written: its bytes, valid until the next call (so a producer can
 * fill one buffer again and again). An error stops the write and is returned. */
typedef clpar_status (*clpar_part_fn)(void *user, int i, const void **data, size_t *size);
/* Writes parts 0 .. n-1 (total bytes in all) one after another to path as one new file: a
 * temporary file in the same directory (".<name>.<16 random hex digits>.tmp", created O_EXCL,
 * so no one can plant or predict it), synced, renamed over path, and the directory synced; a
 * crash at any point leaves either the old file or the new one, whole (a temporary file may
 * be left behind). A regular file at path keeps its permission bits (a 0600 file stays
 * 0600); a new one is 0666 less the umask. A symbolic link at path is replaced by the file,
 * and its target left unchanged. */
clpar_status clpar_file_write_atomic(const char *path, int n, uint64_t total, clpar_part_fn part,
                                     void *user);
/* Test-only: called at each point of an atomic write (NULL outside tests). */
typedef enum clpar_write_stage {
  CLPAR_WRITE_CREATED, /* the temporary file exists, empty */
  CLPAR_WRITE_HALFWAY, /* half the bytes written */
  CLPAR_WRITE_WRITTEN, /* all written, not synced */
  CLPAR_WRITE_SYNCED,  /* synced and closed, not renamed */
  CLPAR_WRITE_RENAMED, /* renamed over the old file, the directory not synced */
  CLPAR_WRITE_STAGE_COUNT
} clpar_write_stage;
extern void (*clpar_atomic_write_hook)(clpar_write_stage stage);

/* ---- capture and replay (src/runtime/capture.c; public API: clpar/graph.h) ----
 *
 * While a device captures, every command posted to its worker is also appended to the graph's
 * list for that device (worker.c calls clpar_capture_record under the ring's lock); what cannot
 * be replayed (a host wait or read, an upload from host memory, an event or a transfer between
 * devices) is refused with a message and fails the capture. Buffers allocated on a capturing
 * device come from the graph's pool, and buffers freed there go back to it (allocator.c asks
 * clpar_capture_take and clpar_capture_give first). */
typedef struct clpar_capture clpar_capture;
/* Appends cmd to c's list; its index there, or SIZE_MAX when out of memory (the capture fails). */
size_t clpar_capture_record(clpar_capture *c, const clpar_command *cmd);
/* CLPAR_OK when dev is not capturing or op may be recorded; else the refusal (the capture
 * fails with it). */
clpar_status clpar_capture_check_op(clpar_device *dev, int op);
/* When dev captures: refuses what (a host wait, a read, an upload...) naming fn, fails the
 * capture and returns the error; CLPAR_OK otherwise. */
clpar_status clpar_capture_refuse(clpar_device *dev, const char *fn, const char *what);
/* A free block of the capturing graph's pool of at least size bytes (at most size + size / 4):
 * 1 and *buf, *capacity; 0 when dev is not capturing or none fits. */
int clpar_capture_take(clpar_device *dev, size_t size, void **buf, size_t *capacity);
/* Makes a buffer just allocated on a capturing device the graph's (no-op otherwise). */
void clpar_capture_own(clpar_device *dev, void *buf, size_t capacity);
/* A buffer being freed: 1 when a graph took it (its own block, or any buffer freed on a
 * capturing device); 0 when it goes to the shared cache (a live graph that used it goes stale). */
int clpar_capture_give(clpar_device *dev, void *buf, size_t capacity, clpar_busy *busy);
/* Captured copies between devices (src/runtime/transfer.c): 1 when a and b capture into the
 * same graph; host memory the graph owns (NULL: the capture fails); allow (1) lets the
 * calling thread post reads, writes and events on capturing devices until allow (0). */
int clpar_capture_between(const clpar_device *a, const clpar_device *b);
void *clpar_capture_host_memory(clpar_device *dev, size_t bytes);
void clpar_capture_allow(int on);
/* Puts a block back into dev's shared cache (counted as cached already). */
void clpar_allocator_recache(clpar_device *dev, void *buf, size_t capacity);
/* At clpar_shutdown, before the allocators go: every graph gives back its free blocks and can
 * only be destroyed. */
void clpar_capture_shutdown(void);
/* At capture end (capture_fuse.c): replaces each run of element-wise commands of cmds[0 .. *n)
 * by one ew_chain command where dev's backend has it; *map (malloc'ed; NULL when nothing
 * changed) gives each old command's new index, *fused the chains (free with
 * clpar_capture_fused_free). Nothing fails: what cannot be fused (no memory, a kernel that
 * does not build) stays as it is. Test hook: clpar_capture_fuse_disable(1) keeps every command. */
typedef struct clpar_fused clpar_fused;
void clpar_capture_fuse(clpar_device *dev, clpar_command *cmds, size_t *n, size_t **map,
                        clpar_fused **fused);
void clpar_capture_fused_free(clpar_fused *f);
void clpar_capture_fuse_disable(int off);

/* ---- prepared launches (src/runtime/capture_prepared.c) ----
 * On a backend with the prepare_* entries, each command of a capture run is run between
 * prepare_begin and prepare_end, and the launch the backend prepares (its kernels with their
 * arguments set) is kept for the graph's command; a replay runs it instead of the entry.
 * Patched commands (their arguments change per replay) keep the entry path. */
typedef struct clpar_prepared_list {
  size_t *index; /* of the command in its device's list, increasing */
  void **launch;
  size_t n, cap;
  clpar_command *packed; /* what a replay posts (clpar_prepared_pack) */
} clpar_prepared_list;
/* Whether commands posted to dev while it captures are to be prepared. */
int clpar_prepared_wanted(const clpar_device *dev);
/* The worker's run of a command of a capture run: run(dev, c) between the backend's
 * prepare_begin and prepare_end, its launch kept in dev->preparing. */
clpar_status clpar_prepared_record(clpar_device *dev, clpar_command *c,
                                   clpar_status (*run)(clpar_device *, clpar_command *));
/* Runs n prepared launches in order (counted in dev->prepared_runs). */
clpar_status clpar_prepared_run(clpar_device *dev, void *const *launch, size_t n);
/* Drops (releases) the launch of the command at index, if any: it keeps the entry path. */
void clpar_prepared_drop(clpar_prepared_list *l, clpar_device *dev, size_t index);
/* After fusion (capture_fuse.c) rewrote the list: index i is now map[i]; a launch whose command
 * was fused into an ew_chain command is freed (the chain runs instead). */
void clpar_prepared_remap(clpar_prepared_list *l, clpar_device *dev, const size_t *map,
                          const clpar_command *cmds);
/* What a replay posts for cmds[0 .. n): each run of consecutive prepared commands as one
 * CLPAR_OP_PREPARED command (one pass of the worker's loop), the others as they are; *out
 * and the count (cmds itself and n when none is prepared or out of memory). */
size_t clpar_prepared_pack(clpar_prepared_list *l, const clpar_command *cmds, size_t n,
                           const clpar_command **out);
/* Releases the list's launches on dev's backend. */
void clpar_prepared_release(clpar_prepared_list *l, clpar_device *dev);
/* For tests only: 1 captures without prepared launches (replays call every entry), 0 restores. */
void clpar_prepared_force_off(int off);

/* The scalar arguments a patch may rewrite before each replay, by the command's entry. */
typedef union clpar_patch_args {
  clpar_sgd_args sgd;   /* sgd_step */
  clpar_adam_args adam; /* adam_step */
  struct {
    uint64_t seed, offset;
  } rng; /* dropout_mask */
} clpar_patch_args;
/* The scalars of a patched command (sgd_step, adam_step, dropout_mask) into and from a
 * (src/runtime/capture_args.c). */
void clpar_capture_patch_get(const clpar_command *c, clpar_patch_args *a);
void clpar_capture_patch_set(clpar_command *c, const clpar_patch_args *a);
typedef clpar_status (*clpar_patch_fn)(void *user, clpar_patch_args *a);
/* 1 while dev captures (for the layers above, which then register patches). */
int clpar_capture_active(const clpar_device *dev);
/* 1 while any graph is alive (capturing or captured, not yet destroyed). */
int clpar_graph_any_live(void);
/* Binds fn to the last command of entry (CLPAR_ENTRY_sgd_step, adam_step or dropout_mask)
 * recorded on dev: each replay calls fn(user, args) before posting, and fn rewrites the
 * scalars as the eager step would compute them (advancing its own counters). free_user (may
 * be NULL) frees user with the graph. On failure the capture fails; user is freed. */
clpar_status clpar_capture_patch(clpar_device *dev, int entry, clpar_patch_fn fn, void *user,
                                 void (*free_user)(void *));
/* Inside a capture on dev: posts a write of bytes (at most 16) into buf at off_bytes from host
 * memory the graph owns, which fn(user, value) fills now and again before each replay (a host
 * counter kept on the device: BatchNorm's num_batches_tracked); each replay's value in memory
 * of its own, so replays do not wait for each other (capture_writes.c). free_user (may be
 * NULL) frees user with the graph, or at once on failure (then the capture fails). */
typedef void (*clpar_value_fn)(void *user, void *value);
clpar_status clpar_capture_host_write(clpar_device *dev, void *buf, size_t off_bytes, size_t bytes,
                                      clpar_value_fn fn, void *user, void (*free_user)(void *));
/* ---- host calls and gates (src/runtime/capture_host.c) ----
 * What lets a graph hold a hand-off to a host thread (DistributedDataParallel's buckets, which
 * a communication thread all-reduces), as CUDA graphs' host nodes: a host call posted to a
 * device runs fn(user, status) once the work posted before it completed (status: whether it
 * did); a gate posted to a device makes its queue wait until a host thread opens it. Both are
 * plain commands, recorded by a capture and replayed as they are: the objects are the
 * caller's, made once and kept while a graph may replay them, so a replay allocates nothing
 * for them. A gate counts: the n-th wait passes once it was opened n times; an opening with
 * an error makes that wait (and every later one) fail the queue with the opening's message. */
typedef struct clpar_host_call {
  void (*fn)(void *user, clpar_status status);
  void *user;
} clpar_host_call;
typedef struct clpar_gate clpar_gate;
clpar_status clpar_dev_host_call(clpar_device *dev, clpar_host_call *call);
clpar_gate *clpar_gate_new(void);
void clpar_gate_open(clpar_gate *g, clpar_status status, const char *message);
clpar_status clpar_dev_gate_wait(clpar_device *dev, clpar_gate *g);
void clpar_gate_free(clpar_gate *g);
/* The worker's run of the two commands. */
clpar_status clpar_host_call_run(clpar_device *dev, clpar_host_call *call);
clpar_status clpar_gate_pass(clpar_device *dev, clpar_gate *g);
/* Replays in flight. A graph's list for a device that holds a host call or a gate (work handed
 * to a host thread: DistributedDataParallel's communication thread) ends with one more host
 * call, *end, which clpar_replay_end_add records into c at capture end; each replay of the
 * list counts in dev->replays from its post until *end ran (the device completed the replay,
 * every gate of it passed, so the host threads did its work). */
void clpar_replay_end_add(clpar_capture *c, clpar_device *dev, const clpar_command *cmds, size_t n,
                          clpar_host_call *end);
/* Waits for the replays in flight on dev, if any (clpar_worker_drain, counted in
 * dev->replay_drains); CLPAR_OK at once, waiting for nothing, when none is. */
clpar_status clpar_replays_wait(clpar_device *dev);

/* A graph's small writes from host memory (src/runtime/capture_writes.c, for capture.c): each
 * replay's values in memory of its own, so that a replay never waits for the previous one. */
typedef struct clpar_host_writes clpar_host_writes;

/* Adds a write of bytes (at most 16) on device d (dev) to *ws (made on first use), fn(user,
 * value) filling the value now and before each replay: the value's memory for the capture
 * run's write, or NULL (user freed) when out of memory or bytes is over 16. */
void *clpar_host_writes_add(clpar_host_writes **ws, clpar_device *dev, int d, size_t bytes,
                            clpar_value_fn fn, void *user, void (*free_user)(void *));
/* Finds the last added write's command in its device's list cmds[0 .. n), once posted: 1, or
 * 0 when it is not there. */
int clpar_host_writes_bind(clpar_host_writes *ws, const clpar_command *cmds, size_t n);
/* The commands of device d moved: old index i is map[i] now. */
void clpar_host_writes_remap(clpar_host_writes *ws, int d, const size_t *map);
/* Before a replay: takes memory no posted replay still reads (or new memory), fills each
 * write's value there and points its command (cmds[d][index]) at it. ws may be NULL. */
clpar_status clpar_host_writes_prepare(clpar_host_writes *ws, clpar_command *const *cmds);
/* After a replay was posted: records on each device with writes the event after which its
 * values' memory may be reused. ws may be NULL. */
clpar_status clpar_host_writes_posted(clpar_host_writes *ws);
/* Frees ws (the devices ran every replay), its users' data with it. */
void clpar_host_writes_free(clpar_host_writes *ws);

/* Makes every live graph refuse to replay (why: the call that moved or re-made buffers, such
 * as "clpar_module_to"); a capture in progress fails. */
void clpar_graph_invalidate_all(const char *why);

#endif
