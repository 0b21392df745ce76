/* storage.c — storages: one device buffer from the device's cache, shared by reference by
 * the tensors (views) over it, with the busy list of other devices' work on it. Every storage
 * alive is listed, so that clpar_shutdown can give their memory back before the devices go
 * and say how many the user left behind. */
#include <stdlib.h>

#include "runtime.h"

/* Every storage alive (the list's order does not matter): clpar_shutdown releases their
 * memory and counts them. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static clpar_storage *live_head;

static void live_add(clpar_storage *st) {
  pthread_mutex_lock(&live_lock);
  st->live_prev = NULL;
  st->live_next = live_head;
  if (live_head) live_head->live_prev = st;
  live_head = st;
  pthread_mutex_unlock(&live_lock);
}

/* Unlinks st; its device, or NULL when clpar_shutdown has taken its memory already. */
static clpar_device *live_remove(clpar_storage *st) {
  pthread_mutex_lock(&live_lock);
  clpar_device *dev = st->dev;
  if (dev) {
    if (st->live_prev)
      st->live_prev->live_next = st->live_next;
    else
      live_head = st->live_next;
    if (st->live_next) st->live_next->live_prev = st->live_prev;
  }
  pthread_mutex_unlock(&live_lock);
  return dev;
}

void clpar_storage_orphan_all(void) {
  uint64_t tensors = 0, bytes = 0, storages = 0;
  pthread_mutex_lock(&live_lock);
  for (clpar_storage *st = live_head, *next; st; st = next) {
    next = st->live_next;
    tensors += (uint64_t)__atomic_load_n(&st->refcount, __ATOMIC_ACQUIRE);
    bytes += st->capacity;
    storages++;
    clpar_free_buffer(st->dev, st->buf, st->capacity, st->busy); /* freed with the device */
    st->dev = NULL;
    st->buf = NULL;
    st->busy = NULL;
    st->live_prev = st->live_next = NULL;
  }
  live_head = NULL;
  pthread_mutex_unlock(&live_lock);
  if (storages)
    clpar_log(CLPAR_LOG_WARN,
              "clpar_shutdown: %llu tensors were still alive (%llu buffers, %llu bytes of device "
              "memory); the memory is released, and the tensors can only be freed now",
              (unsigned long long)tensors, (unsigned long long)storages, (unsigned long long)bytes);
}

clpar_status clpar_storage_new(clpar_device *dev, size_t bytes, clpar_storage **out) {
  clpar_storage *st = calloc(1, sizeof *st);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  clpar_status s = clpar_alloc_buffer(dev, bytes, &st->buf, &st->capacity);
  if (s != CLPAR_OK) {
    free(st);
    return s;
  }
  st->refcount = 1;
  st->dev = dev;
  st->category = (unsigned char)clpar_memory_category_current();
  clpar_memory_account(dev, st->category, (int64_t)st->capacity);
  live_add(st);
  *out = st;
  return CLPAR_OK;
}

clpar_storage *clpar_storage_retain(clpar_storage *st) {
  __atomic_add_fetch(&st->refcount, 1, __ATOMIC_RELAXED);
  return st;
}

void clpar_storage_release(clpar_storage *st) {
  if (__atomic_sub_fetch(&st->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    clpar_device *dev = live_remove(st);
    if (dev) clpar_memory_account(dev, st->category, -(int64_t)st->capacity);
    if (dev) clpar_free_buffer(dev, st->buf, st->capacity, st->busy); /* takes busy over */
    free(st);
  }
}
