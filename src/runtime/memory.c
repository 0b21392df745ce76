/* memory.c — device memory by category (include/clpar/memory.h). A storage is counted in the
 * category current on the thread that makes it (clpar_memory_category_set, activations unless
 * set), and moves to another when its owner takes it over (clpar_storage_tag: a parameter, a
 * gradient, optimizer state). The counts live in the device under its allocator lock. The
 * backend's workspaces grow on the device's worker, inside its entries; the core asks the
 * backend for their bytes (workspace_bytes: a counter read, no wait) each time it counts
 * memory (a storage made or freed, a count read, a mark), so that the workspace's peak and
 * the total's are taken at those points. */
#include "clpar/memory.h"

#include "runtime.h"

_Static_assert(CLPAR_MEM_CATEGORIES == 7, "struct clpar_device counts 7 categories");

static _Thread_local int current_category = CLPAR_MEM_ACTIVATIONS;

int clpar_memory_category_set(int c) {
  int old = current_category;
  if (c >= 0 && c < CLPAR_MEM_TOTAL) current_category = c;
  return old;
}

int clpar_memory_category_current(void) {
  return current_category;
}

static void bump_locked(clpar_device *dev, int c, int64_t delta) {
  uint64_t *use = dev->mem_in_use, *peak = dev->mem_peak;
  use[c] += (uint64_t)delta;
  use[CLPAR_MEM_TOTAL] += (uint64_t)delta;
  if (use[c] > peak[c]) peak[c] = use[c];
  if (use[CLPAR_MEM_TOTAL] > peak[CLPAR_MEM_TOTAL]) peak[CLPAR_MEM_TOTAL] = use[CLPAR_MEM_TOTAL];
}

void clpar_memory_workspace_sync_locked(clpar_device *dev) {
  uint64_t now = 0, had = dev->mem_in_use[CLPAR_MEM_WORKSPACE];
  const clpar_backend_iface *f = dev->bd.iface;
  if (f->workspace_bytes && f->workspace_bytes(dev->bd.ctx, &now) != CLPAR_OK) return;
  if (now != had) bump_locked(dev, CLPAR_MEM_WORKSPACE, (int64_t)(now - had));
}

void clpar_memory_account(clpar_device *dev, int c, int64_t delta) {
  if (!dev || c < 0 || c >= CLPAR_MEM_TOTAL) return;
  pthread_mutex_lock(&dev->alloc_lock);
  clpar_memory_workspace_sync_locked(dev);
  bump_locked(dev, c, delta);
  pthread_mutex_unlock(&dev->alloc_lock);
}

void clpar_storage_tag(clpar_storage *st, int c) {
  if (!st || !st->dev || c < 0 || c >= CLPAR_MEM_TOTAL || st->category == c) return;
  pthread_mutex_lock(&st->dev->alloc_lock);
  bump_locked(st->dev, st->category, -(int64_t)st->capacity);
  bump_locked(st->dev, c, (int64_t)st->capacity);
  st->category = (unsigned char)c;
  pthread_mutex_unlock(&st->dev->alloc_lock);
}

const char *clpar_memory_category_name(clpar_mem_category c) {
  static const char *names[CLPAR_MEM_CATEGORIES] = {
      "activations", "parameters", "gradients", "optimizer", "communication", "total", "workspace"};
  return (int)c >= 0 && c < CLPAR_MEM_CATEGORIES ? names[c] : NULL;
}

clpar_status clpar_memory_mark(clpar_device *dev) {
  if (!dev) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_memory_mark: dev is NULL");
  pthread_mutex_lock(&dev->alloc_lock);
  clpar_memory_workspace_sync_locked(dev);
  for (int c = 0; c < CLPAR_MEM_CATEGORIES; c++) dev->mem_peak[c] = dev->mem_in_use[c];
  pthread_mutex_unlock(&dev->alloc_lock);
  return CLPAR_OK;
}

static uint64_t read_count(const clpar_device *dev, clpar_mem_category c, int peak) {
  if (!dev || (int)c < 0 || c >= CLPAR_MEM_CATEGORIES) return 0;
  clpar_device *d = (clpar_device *)dev;
  pthread_mutex_lock(&d->alloc_lock);
  clpar_memory_workspace_sync_locked(d);
  uint64_t v = peak ? d->mem_peak[c] : d->mem_in_use[c];
  pthread_mutex_unlock(&d->alloc_lock);
  return v;
}

uint64_t clpar_memory_in_use(const clpar_device *dev, clpar_mem_category c) {
  return read_count(dev, c, 0);
}

uint64_t clpar_memory_peak(const clpar_device *dev, clpar_mem_category c) {
  return read_count(dev, c, 1);
}
