/* allocator.c — the per-device caching allocator. Buffers freed by tensors go to a per-device
 * cache instead of the driver, so a training loop in steady state allocates nothing from the
 * driver (driver allocations cost far more than an op, and some drivers synchronize on them).
 *
 * Requests are rounded up (512 bytes below 1 MiB, 64 KiB above) and served best-fit from the
 * cache within 25% of waste. Reuse needs no event for the device's own work, which runs in
 * order on its one queue: work posted after a buffer's reuse runs after the work that used it
 * before. Work of another device's queue on the buffer (a transfer reading or writing it) is
 * another matter: such a buffer comes back with the events of that work (clpar_busy) and is
 * not handed out again before they completed.
 *
 * Out of memory is an error, never an abort. The allocator keeps what the
 * driver holds for a device (bytes in use + bytes cached) within the device's global memory
 * (its info's global_mem_bytes: CL_DEVICE_GLOBAL_MEM_SIZE on OpenCL, the RAM on the host
 * backend), or within CLPAR_DEVICE_MEMORY_LIMIT when that is smaller, counting the
 * backend's workspaces (workspace_bytes) with the tensors and the cache: a request that would
 * not fit first empties the device's cache, then releases the workspaces, then fails with
 * CLPAR_ERROR_OUT_OF_MEMORY naming the device, the request and the bytes in use (a request
 * that cannot fit even with both empty leaves them alone). A workspace's own growth, inside
 * the backend, is not checked against the limit. PoCL's CPU devices never refuse a buffer for
 * their global memory size. A driver that refuses a buffer itself (PoCL when malloc fails,
 * see ocl_alloc; posix_memalign on the host backend) gives the same error, after the same
 * emptying of the cache, a release of the backend's workspaces (workspace_trim: the
 * convolutions' temporaries, cuDNN's workspace) and one retry; clpar_device_empty_cache
 * releases both too. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

struct clpar_block {
  void *buf;
  size_t size;
  clpar_busy *busy; /* other devices' work still on it, or NULL */
  clpar_block *next;
};

static size_t round_size(size_t bytes) {
  size_t quantum = bytes < ((size_t)1 << 20) ? 512 : ((size_t)64 << 10);
  if (bytes == 0) bytes = 1;
  return (bytes + quantum - 1) / quantum * quantum;
}

/* Takes the smallest cached block of at least size bytes and at most size + size/4. */
static clpar_block *take_cached(clpar_device *dev, size_t size) {
  for (clpar_block **p = &dev->free_blocks; *p; p = &(*p)->next) {
    clpar_block *b = *p;
    if (b->size < size) continue;
    if (b->size > size + size / 4) return NULL; /* sorted: nothing closer follows */
    if (b->busy) {
      if (!clpar_busy_idle(b->busy)) continue; /* another queue still works on it */
      clpar_busy_free(b->busy);
      b->busy = NULL;
    }
    *p = b->next;
    return b;
  }
  return NULL;
}

/* The device's queue is drained first: the host backend frees at once, and cached blocks may
 * still be used by work posted before they were freed. */
static void release_all_locked(clpar_device *dev) {
  clpar_block *b = dev->free_blocks;
  if (__atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE)) return; /* a capture cannot wait */
  if (b && dev->worker) clpar_worker_drain(dev);
  while (b) {
    clpar_block *next = b->next;
    if (b->busy) { /* drained: every transfer that touched it completed too */
      clpar_busy_sync(b->busy);
      clpar_busy_free(b->busy);
    }
    clpar_dev_release(dev, b->buf);
    dev->stats.driver_frees++;
    dev->stats.bytes_cached -= b->size;
    free(b);
    b = next;
  }
  dev->free_blocks = NULL;
}

/* Releases the backend's workspaces (its workspace_trim, on the worker after the work posted
 * before it, waited for), unless a capture is on: a capture cannot wait. */
static clpar_status trim_workspaces_locked(clpar_device *dev) {
  if (!dev->bd.iface->workspace_trim || !dev->worker) return CLPAR_OK;
  if (__atomic_load_n(&dev->capture, __ATOMIC_ACQUIRE)) return CLPAR_OK;
  clpar_status s = clpar_dev_workspace_trim_sync(dev);
  clpar_memory_workspace_sync_locked(dev);
  return s;
}

/* The bytes the backend's workspaces hold now (its workspace_bytes: a counter read). */
static uint64_t workspace_bytes_now(clpar_device *dev) {
  uint64_t b = 0;
  const clpar_backend_iface *f = dev->bd.iface;
  if (!f->workspace_bytes || f->workspace_bytes(dev->bd.ctx, &b) != CLPAR_OK) return 0;
  return b;
}

/* Whether the backend's workspaces hold memory that workspace_trim can release. */
static int workspaces_held(clpar_device *dev) {
  return dev->bd.iface->workspace_trim && workspace_bytes_now(dev) > 0;
}

/* CLPAR_DEVICE_MEMORY_LIMIT as set at clpar_init (UINT64_MAX: not set). */
static uint64_t env_limit = UINT64_MAX;

/* "123", "64K", "512M", "2G" (powers of 1024): 1 and *out, or 0 when v is not such a size,
 * is 0 or overflows. */
static int parse_size(const char *v, uint64_t *out) {
  uint64_t n = 0;
  const char *p = v;
  if (!isdigit((unsigned char)*p)) return 0;
  for (; isdigit((unsigned char)*p); p++) {
    if (n > (UINT64_MAX - 9) / 10) return 0;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  unsigned shift = 0;
  if (*p) {
    switch (toupper((unsigned char)*p)) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      default:
        return 0;
    }
    p++;
  }
  if (*p || n == 0 || n > (UINT64_MAX >> shift)) return 0;
  *out = n << shift;
  return 1;
}

clpar_status clpar_allocator_set_limits(clpar_device **devs, int count) {
  uint64_t cap = UINT64_MAX;
  const char *v = getenv("CLPAR_DEVICE_MEMORY_LIMIT");
  if (v && *v && !parse_size(v, &cap))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "CLPAR_DEVICE_MEMORY_LIMIT=\"%.64s\" is not a size: give a positive "
                           "number of bytes, optionally followed by K, M or G",
                           v);
  env_limit = cap;
  for (int i = 0; i < count; i++) {
    uint64_t g = devs[i]->bd.info.global_mem_bytes ? devs[i]->bd.info.global_mem_bytes : UINT64_MAX;
    devs[i]->mem_limit = g < cap ? g : cap;
  }
  return CLPAR_OK;
}

/* 1 when the driver may hold size more bytes for the device: the tensors, the cache and the
 * backend's workspaces together stay within the device's limit. */
static int fits_locked(clpar_device *dev, size_t size) {
  uint64_t held = dev->stats.bytes_in_use + dev->stats.bytes_cached + workspace_bytes_now(dev);
  return held <= dev->mem_limit && (uint64_t)size <= dev->mem_limit - held;
}

/* Makes room for size bytes within the device's limit, emptying the cache, then releasing the
 * backend's workspaces, only when that makes the request fit: one larger than what the
 * tensors leave of the limit is refused with the cache and the workspaces kept. */
static clpar_status reserve_locked(clpar_device *dev, size_t bytes, size_t size) {
  if (fits_locked(dev, size)) return CLPAR_OK;
  uint64_t in_use = dev->stats.bytes_in_use;
  if (in_use <= dev->mem_limit && (uint64_t)size <= dev->mem_limit - in_use) {
    if (dev->free_blocks) {
      clpar_log(CLPAR_LOG_INFO, "%s: %zu bytes do not fit; emptying the cache (%llu bytes)",
                dev->bd.info.id, size, (unsigned long long)dev->stats.bytes_cached);
      release_all_locked(dev);
      if (fits_locked(dev, size)) return CLPAR_OK;
    }
    if (workspaces_held(dev)) {
      clpar_log(CLPAR_LOG_INFO, "%s: %zu bytes do not fit; releasing the backend's workspaces",
                dev->bd.info.id, size);
      if (trim_workspaces_locked(dev) != CLPAR_OK) clpar_clear_error(); /* the check tells */
      if (fits_locked(dev, size)) return CLPAR_OK;
    }
  }
  return clpar_set_error(
      CLPAR_ERROR_OUT_OF_MEMORY,
      "%s: out of memory: a buffer of %zu bytes does not fit; %llu bytes are in use by tensors, "
      "%llu by the backend's workspaces, and the device has %llu (%s)",
      dev->bd.info.id, bytes, (unsigned long long)dev->stats.bytes_in_use,
      (unsigned long long)workspace_bytes_now(dev), (unsigned long long)dev->mem_limit,
      dev->mem_limit == env_limit ? "CLPAR_DEVICE_MEMORY_LIMIT" : "its global memory");
}

static clpar_status driver_alloc_locked(clpar_device *dev, size_t bytes, size_t size, void **buf) {
  clpar_status s = clpar_dev_alloc(dev, size, buf);
  if (s == CLPAR_ERROR_OUT_OF_MEMORY && (dev->free_blocks || workspaces_held(dev))) {
    clpar_log(CLPAR_LOG_INFO,
              "%s: out of memory for %zu bytes; emptying the cache and the backend's workspaces "
              "and retrying",
              dev->bd.info.id, size);
    release_all_locked(dev);
    if (trim_workspaces_locked(dev) != CLPAR_OK) clpar_clear_error(); /* the retry tells */
    s = clpar_dev_alloc(dev, size, buf);
  }
  if (s == CLPAR_ERROR_OUT_OF_MEMORY) {
    char why[512];
    const char *err = clpar_last_error();
    size_t id_len = strlen(dev->bd.info.id); /* the dispatch put "<id>: " in front already */
    if (strncmp(err, dev->bd.info.id, id_len) == 0 && strncmp(err + id_len, ": ", 2) == 0)
      err += id_len + 2;
    snprintf(why, sizeof why, "%s", err);
    return clpar_set_error(s,
                           "%s: out of memory: the driver refused a buffer of %zu bytes with %llu "
                           "bytes in use by tensors: %s",
                           dev->bd.info.id, bytes, (unsigned long long)dev->stats.bytes_in_use,
                           why);
  }
  if (s != CLPAR_OK) return clpar_device_fail(dev, s);
  dev->stats.driver_allocs++;
  return CLPAR_OK;
}

clpar_status clpar_alloc_buffer(clpar_device *dev, size_t bytes, void **buf, size_t *capacity) {
  if (bytes > dev->bd.info.max_alloc_bytes)
    return clpar_set_error(
        CLPAR_ERROR_TOO_LARGE, "%s: a buffer of %zu bytes is larger than the device allows (%llu)",
        dev->bd.info.id, bytes, (unsigned long long)dev->bd.info.max_alloc_bytes);
  size_t size = round_size(bytes);
  if (size > dev->bd.info.max_alloc_bytes) size = bytes;
  clpar_status s = CLPAR_OK;
  int pooled = clpar_capture_take(dev, size, buf, capacity); /* a capturing graph's block */
  pthread_mutex_lock(&dev->alloc_lock);
  clpar_block *b = pooled ? NULL : take_cached(dev, size);
  if (pooled) {
    dev->stats.cache_hits++;
    dev->stats.bytes_cached -= *capacity;
  } else if (b) {
    *buf = b->buf;
    *capacity = b->size;
    dev->stats.cache_hits++;
    dev->stats.bytes_cached -= b->size;
    free(b);
  } else {
    s = reserve_locked(dev, bytes, size);
    if (s == CLPAR_OK) s = driver_alloc_locked(dev, bytes, size, buf);
    *capacity = size;
  }
  if (s == CLPAR_OK) {
    dev->stats.bytes_in_use += *capacity;
    if (dev->stats.bytes_in_use > dev->stats.peak_bytes_in_use)
      dev->stats.peak_bytes_in_use = dev->stats.bytes_in_use;
  }
  pthread_mutex_unlock(&dev->alloc_lock);
  if (s == CLPAR_OK && !pooled) clpar_capture_own(dev, *buf, *capacity);
  return s;
}

void clpar_free_buffer(clpar_device *dev, void *buf, size_t capacity, clpar_busy *busy) {
  if (clpar_capture_give(dev, buf, capacity, busy)) { /* back to a graph's pool */
    pthread_mutex_lock(&dev->alloc_lock);
    dev->stats.bytes_in_use -= capacity;
    dev->stats.bytes_cached += capacity;
    pthread_mutex_unlock(&dev->alloc_lock);
    return;
  }
  if (busy && clpar_busy_idle(busy)) {
    clpar_busy_free(busy);
    busy = NULL;
  }
  clpar_block *b = malloc(sizeof *b);
  pthread_mutex_lock(&dev->alloc_lock);
  dev->stats.bytes_in_use -= capacity;
  if (!b) { /* cannot cache it: give it straight back once nothing uses it */
    if (dev->worker) clpar_worker_drain(dev);
    clpar_busy_sync(busy);
    clpar_busy_free(busy);
    clpar_dev_release(dev, buf);
    dev->stats.driver_frees++;
    pthread_mutex_unlock(&dev->alloc_lock);
    return;
  }
  b->buf = buf;
  b->size = capacity;
  b->busy = busy;
  clpar_block **p = &dev->free_blocks;
  while (*p && (*p)->size < capacity) p = &(*p)->next;
  b->next = *p;
  *p = b;
  dev->stats.bytes_cached += capacity;
  pthread_mutex_unlock(&dev->alloc_lock);
}

void clpar_allocator_recache(clpar_device *dev, void *buf, size_t capacity) {
  clpar_block *b = malloc(sizeof *b);
  pthread_mutex_lock(&dev->alloc_lock);
  if (!b) { /* cannot cache it: give it straight back once nothing uses it */
    if (dev->worker) clpar_worker_drain(dev);
    clpar_dev_release(dev, buf);
    dev->stats.driver_frees++;
    dev->stats.bytes_cached -= capacity;
    pthread_mutex_unlock(&dev->alloc_lock);
    return;
  }
  *b = (clpar_block){buf, capacity, NULL, NULL};
  clpar_block **p = &dev->free_blocks;
  while (*p && (*p)->size < capacity) p = &(*p)->next;
  b->next = *p;
  *p = b;
  pthread_mutex_unlock(&dev->alloc_lock);
}

void clpar_allocator_destroy(clpar_device *dev) {
  pthread_mutex_lock(&dev->alloc_lock);
  if (dev->stats.bytes_in_use)
    clpar_log(CLPAR_LOG_WARN, "%s: %llu bytes still held by tensors at clpar_shutdown",
              dev->bd.info.id, (unsigned long long)dev->stats.bytes_in_use);
  release_all_locked(dev);
  pthread_mutex_unlock(&dev->alloc_lock);
}

clpar_status clpar_device_memory_stats(const clpar_device *dev, clpar_memory_stats *out) {
  if (!dev || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_device_memory_stats: NULL argument");
  clpar_device *d = (clpar_device *)dev;
  pthread_mutex_lock(&d->alloc_lock);
  *out = d->stats;
  pthread_mutex_unlock(&d->alloc_lock);
  return CLPAR_OK;
}

clpar_status clpar_device_memory_reset_peak(clpar_device *dev) {
  if (!dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_device_memory_reset_peak: NULL device");
  pthread_mutex_lock(&dev->alloc_lock);
  dev->stats.peak_bytes_in_use = dev->stats.bytes_in_use;
  pthread_mutex_unlock(&dev->alloc_lock);
  return CLPAR_OK;
}

clpar_status clpar_device_empty_cache(clpar_device *dev) {
  if (!dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_device_empty_cache: NULL device");
  pthread_mutex_lock(&dev->alloc_lock);
  release_all_locked(dev);
  clpar_status s = trim_workspaces_locked(dev);
  pthread_mutex_unlock(&dev->alloc_lock);
  return s;
}
