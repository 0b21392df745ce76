/* debug.c — making the common misuse of tensors explain itself.
 *
 * Freed handles: every tensor struct carries a magic word, set while it is in use and
 * overwritten when its last reference goes; the ops' argument check (clpar_check_alive)
 * refuses a tensor without it, naming the op. In release mode the struct is then freed, so a
 * later use reads freed memory and is caught only when the allocator happened to overwrite
 * the word. Under CLPAR_DEBUG=1 freed structs are kept (quarantined, the most recent
 * QUARANTINE of them) instead of being returned to malloc, so that a use after free is
 * recognized every time and reads no freed memory.
 *
 * Leaks: the number of live tensor structs is counted; each optimizer step compares it with
 * the count at that optimizer's previous step. A training loop that keeps what every step
 * makes (no clpar_scope around the step, nothing freed) grows it at every step; a loop that
 * releases its temporaries finds the same count step after step. Growth at CLPAR_LEAK_STEPS
 * steps in a row is logged once (a warning through clpar_log, never stdout). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { QUARANTINE = 1 << 18 }; /* freed structs kept under CLPAR_DEBUG=1 (some 50 MB) */

static int debug_on; /* atomic */
static pthread_mutex_t quarantine_lock = PTHREAD_MUTEX_INITIALIZER;
static clpar_tensor **quarantine; /* a ring: the oldest is freed when it is full */
static size_t quarantine_next, quarantine_count;
static int64_t live_tensors;       /* atomic */
static clpar_storage dead_storage; /* a freed tensor's: no device, as after clpar_shutdown */
static int leak_warned;            /* atomic; once per clpar_init */

clpar_status clpar_debug_init_from_env(void) {
  const char *v = getenv("CLPAR_DEBUG");
  int on = 0;
  if (v && *v && strcmp(v, "0") != 0) {
    if (strcmp(v, "1") != 0)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "clpar_init: CLPAR_DEBUG=\"%.64s\": give 1 (checks freed tensors) or "
                             "0 (off)",
                             v);
    on = 1;
  }
  __atomic_store_n(&debug_on, on, __ATOMIC_RELAXED);
  __atomic_store_n(&leak_warned, 0, __ATOMIC_RELAXED);
  if (on) clpar_log(CLPAR_LOG_INFO, "CLPAR_DEBUG=1: freed tensors are kept and checked");
  return CLPAR_OK;
}

int clpar_debug_enabled(void) {
  return __atomic_load_n(&debug_on, __ATOMIC_RELAXED);
}

void clpar_debug_tensor_made(void) {
  __atomic_add_fetch(&live_tensors, 1, __ATOMIC_RELAXED);
}

int64_t clpar_debug_live_tensors(void) {
  return __atomic_load_n(&live_tensors, __ATOMIC_RELAXED);
}

/* Keeps t; frees the oldest kept struct when the ring is full. Returns 0 when t could not be
 * kept (no memory for the ring): the caller frees it. */
static int quarantine_keep(clpar_tensor *t) {
  clpar_tensor *oldest = NULL;
  pthread_mutex_lock(&quarantine_lock);
  if (!quarantine) quarantine = calloc(QUARANTINE, sizeof *quarantine);
  int kept = quarantine != NULL;
  if (kept) {
    if (quarantine_count == QUARANTINE)
      oldest = quarantine[quarantine_next];
    else
      quarantine_count++;
    quarantine[quarantine_next] = t;
    quarantine_next = (quarantine_next + 1) % QUARANTINE;
  }
  pthread_mutex_unlock(&quarantine_lock);
  free(oldest);
  return kept;
}

void clpar_debug_discard(clpar_tensor *t) {
  __atomic_sub_fetch(&live_tensors, 1, __ATOMIC_RELAXED);
  t->magic = CLPAR_TENSOR_FREED;
  t->freed_how = clpar_scope_ending() ? 1 : 0;
  t->storage = &dead_storage;
  t->scope = NULL;
  t->grad = t->flat = NULL;
  t->node = NULL;
  t->hooks = NULL;
  if (!clpar_debug_enabled() || !quarantine_keep(t)) free(t);
}

clpar_status clpar_debug_freed_error(const char *fn, const clpar_tensor *t) {
  if (!clpar_debug_enabled())
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: the tensor is not a live tensor: it was freed (CLPAR_DEBUG=1 "
                           "recognizes every use of a freed tensor and says what freed it)",
                           fn);
  if (t->freed_how == 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: the tensor was freed by the clpar_scope_end of the scope it was "
                           "made in; to use a tensor after its scope, clpar_tensor_retain it "
                           "before clpar_scope_end (and clpar_tensor_free it when done)",
                           fn);
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "%s: the tensor was freed (its last reference went with "
                         "clpar_tensor_free) and is used after that",
                         fn);
}

void clpar_debug_shutdown(void) {
  pthread_mutex_lock(&quarantine_lock);
  for (size_t i = 0; i < quarantine_count; i++) free(quarantine[i]);
  free(quarantine);
  quarantine = NULL;
  quarantine_next = quarantine_count = 0;
  __atomic_store_n(&debug_on, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&quarantine_lock);
}

void clpar_debug_step(int64_t *last, int *streak) {
  int64_t now = clpar_debug_live_tensors();
  if (*last > 0 && now > *last)
    ++*streak;
  else
    *streak = 0;
  int64_t before = *last;
  *last = now;
  if (*streak < CLPAR_LEAK_STEPS || __atomic_exchange_n(&leak_warned, 1, __ATOMIC_RELAXED)) return;
  clpar_log(CLPAR_LOG_WARN,
            "clpar_optimizer_step: the number of live tensors grew at each of the last %d steps "
            "(now %lld, %lld more than one step before): a training loop that keeps what each "
            "step makes leaks; put each step between clpar_scope_begin and clpar_scope_end, or "
            "free the step's tensors (warned once)",
            CLPAR_LEAK_STEPS, (long long)now, (long long)(now - before));
}
