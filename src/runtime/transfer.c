/* transfer.c — copies between devices and between host memory and devices, none of which
 * blocks the calling thread (except a read back, which is what it is for).
 *
 * Between two devices the data goes through pinned host memory (the backend's host_alloc:
 * OpenCL CL_MEM_ALLOC_HOST_PTR, CUDA cudaMallocHost) in chunks of CHUNK bytes, two staging
 * blocks taking turns: the source's worker reads chunk i into one block while the
 * destination's worker writes chunk i-1 from the other, each after waiting for the event
 * the other recorded. Copies into the host device's memory skip staging: the source reads
 * straight into it. Two devices of one backend whose driver copies between them directly (CUDA
 * peer copies: the backend's peer_access and copy_peer) skip staging too: the source's queue
 * copies into the destination's buffer. Staging blocks are kept per device and reused; when
 * none is free, the transfer uses plain host memory and the worker allocates one more pinned
 * block in the background, so no caller waits for a worker; once the device has KEEP pinned
 * blocks, a copy to another device instead reuses the oldest busy one, its source's queue
 * waiting for that block's last write (a queue wait). Transfers of up to 16 KiB always use
 * plain host memory. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

#define CHUNK ((size_t)4 << 20)
#define MIN_BLOCK ((size_t)64 << 10)
#define SMALL ((size_t)16 << 10)

/* Pinned blocks at most per device before a copy to another device waits for a busy block of
 * the pool (on the source's queue) rather than going through plain memory. */
#define KEEP 8

struct clpar_staging_block {
  clpar_device *dev;
  void *handle, *ptr;
  size_t size;
  clpar_staging_block *next;
  /* pinned blocks, under dev->staging_lock: */
  clpar_event *free_at; /* the last write from the block that another device posted */
  int callbacks;        /* completion callbacks of free_at and earlier ones still to run */
  int busy;             /* in dev->staging_busy */
};

static size_t block_size(size_t bytes) {
  size_t size = MIN_BLOCK;
  while (size < bytes) size *= 2;
  return size;
}

static clpar_status plain_block(clpar_device *dev, size_t bytes, clpar_staging_block **out) {
  clpar_staging_block *b = malloc(sizeof *b + bytes);
  if (!b) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "transfer: out of host memory");
  b->dev = dev;
  b->handle = NULL;
  b->ptr = b + 1;
  b->size = bytes;
  *out = b;
  return CLPAR_OK;
}

static void staging_put(void *user);

/* Gives staging block b back to its pool once the work posted to dev so far (which uses b) has
 * completed, without waiting; if that cannot be arranged, waits for the worker first, so that b
 * is never reused while queued work still reads or writes it. */
static clpar_status put_when_done(clpar_device *dev, clpar_staging_block *b) {
  clpar_event *done = NULL;
  clpar_status s = clpar_event_record(dev, &done);
  if (s == CLPAR_OK) s = clpar_event_then(done, staging_put, b);
  if (s != CLPAR_OK) {
    if (done)
      clpar_event_sync(done);
    else
      clpar_worker_drain(dev);
    staging_put(b);
  }
  clpar_event_release(done);
  return s;
}

/* Asks dev's worker for a pinned block of size for the pool, without waiting: the block joins
 * the pool when the allocation ran. If the allocation fails on the worker, that error shows
 * at the next call on the device. */
static clpar_status refill(clpar_device *dev, size_t size) {
  clpar_staging_block *b = calloc(1, sizeof *b);
  if (!b) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "transfer: out of host memory");
  b->dev = dev;
  b->size = size;
  clpar_status s = clpar_dev_host_alloc(dev, size, &b->handle, &b->ptr);
  if (s != CLPAR_OK) { /* an earlier asynchronous error of the device: the caller's to report */
    free(b);
    return s;
  }
  pthread_mutex_lock(&dev->staging_lock);
  dev->staging_blocks++;
  pthread_mutex_unlock(&dev->staging_lock);
  return put_when_done(dev, b);
}

/* A staging block of at least bytes: small ones are plain host memory (a transfer of a few
 * KiB gains nothing from pinning); larger ones come from dev's pool of pinned blocks. When the
 * pool has none free (the first transfers of a size, or the caller running ahead of the
 * device), this transfer goes through plain host memory and the worker is asked for one more
 * pinned block: the caller never waits for the worker to allocate. With wait (a copy to another
 * device) and KEEP pinned blocks made, the oldest busy block that fits is taken instead and
 * *wait is set to the event its last write completes with: the source's queue must wait for it
 * before using the block (the caller releases it). */
static clpar_status staging_get(clpar_device *dev, size_t bytes, clpar_staging_block **out,
                                clpar_event **wait) {
  if (bytes <= SMALL) return plain_block(dev, bytes, out);
  size_t size = block_size(bytes);
  pthread_mutex_lock(&dev->staging_lock);
  clpar_staging_block **best = NULL;
  for (clpar_staging_block **p = &dev->staging_free; *p; p = &(*p)->next)
    if ((*p)->size >= size && (!best || (*p)->size < (*best)->size)) best = p;
  if (!best && wait && dev->staging_blocks >= KEEP)
    for (clpar_staging_block **p = &dev->staging_busy; *p && !best; p = &(*p)->next)
      if ((*p)->size >= size) best = p; /* the oldest busy block that fits */
  clpar_staging_block *b = best ? *best : NULL;
  if (b) *best = b->next;
  if (b && b->busy) { /* the caller's queue waits for its last write (a queue wait) */
    b->busy = 0;
    *wait = clpar_event_retain(b->free_at);
  }
  pthread_mutex_unlock(&dev->staging_lock);
  if (b) {
    *out = b;
    return CLPAR_OK;
  }
  clpar_status s = refill(dev, size);
  return s != CLPAR_OK ? s : plain_block(dev, bytes, out);
}

/* The pool takes back a block whose last write (ev, on another device) is posted: it is busy
 * until ev completes, and then free (staging_done), unless a later copy took it again. */
static void staging_done(void *user);
static void staging_busy(clpar_staging_block *b, clpar_event *ev) {
  clpar_device *dev = b->dev;
  pthread_mutex_lock(&dev->staging_lock);
  clpar_event *old = b->free_at;
  b->free_at = clpar_event_retain(ev);
  b->callbacks++;
  b->busy = 1;
  b->next = NULL;
  clpar_staging_block **p = &dev->staging_busy;
  while (*p) p = &(*p)->next;
  *p = b;
  pthread_mutex_unlock(&dev->staging_lock);
  clpar_event_release(old); /* not the callback's event: free_at held it until now */
  if (clpar_event_then(ev, staging_done, b) != CLPAR_OK) {
    clpar_event_sync(ev);
    staging_done(b);
  }
}

/* Back to its pool; runs when the last transfer through it completed (any thread). A block
 * whose earlier write to another device may still run goes back busy (staging_done frees it). */
static void staging_put(void *user) {
  clpar_staging_block *b = user;
  if (!b->handle) { /* plain memory */
    free(b);
    return;
  }
  clpar_device *dev = b->dev;
  pthread_mutex_lock(&dev->staging_lock);
  if (b->callbacks > 0) {
    b->busy = 1;
    b->next = NULL;
    clpar_staging_block **p = &dev->staging_busy;
    while (*p) p = &(*p)->next;
    *p = b;
  } else {
    b->next = dev->staging_free;
    dev->staging_free = b;
  }
  pthread_mutex_unlock(&dev->staging_lock);
}

/* free_at of a busy block completed (any thread): the block is free once the last of its
 * callbacks ran and no copy took it in between. */
static void staging_done(void *user) {
  clpar_staging_block *b = user;
  clpar_device *dev = b->dev;
  pthread_mutex_lock(&dev->staging_lock);
  if (--b->callbacks == 0 && b->busy) {
    clpar_staging_block **p = &dev->staging_busy;
    while (*p != b) p = &(*p)->next;
    *p = b->next;
    b->busy = 0;
    b->next = dev->staging_free;
    dev->staging_free = b;
  }
  pthread_mutex_unlock(&dev->staging_lock);
}

clpar_status clpar_staging_reserve(clpar_device *dev, int transfers, size_t bytes) {
  if (bytes <= SMALL) return CLPAR_OK; /* plain host memory: nothing to reserve */
  size_t size = block_size(bytes < CHUNK ? bytes : CHUNK);
  int per = bytes > CHUNK ? 2 : 1;
  int n = transfers * per < 8 ? transfers * per : 8;
  for (int i = 0; i < n; i++) {
    clpar_staging_block *b = calloc(1, sizeof *b);
    if (!b) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "transfer: out of host memory");
    clpar_status s = clpar_dev_host_alloc_sync(dev, size, &b->handle, &b->ptr);
    if (s != CLPAR_OK) {
      free(b);
      return s;
    }
    b->dev = dev;
    b->size = size;
    pthread_mutex_lock(&dev->staging_lock);
    dev->staging_blocks++;
    pthread_mutex_unlock(&dev->staging_lock);
    staging_put(b);
  }
  return CLPAR_OK;
}

void clpar_staging_destroy(clpar_device *dev) {
  pthread_mutex_lock(&dev->staging_lock);
  while (dev->staging_busy) { /* all queues are drained: their last callbacks are due */
    clpar_event *ev = clpar_event_retain(dev->staging_busy->free_at);
    pthread_mutex_unlock(&dev->staging_lock);
    clpar_event_sync(ev);
    clpar_event_release(ev);
    sched_yield();
    pthread_mutex_lock(&dev->staging_lock);
  }
  clpar_staging_block *b = dev->staging_free;
  dev->staging_free = NULL;
  pthread_mutex_unlock(&dev->staging_lock);
  while (b) {
    clpar_staging_block *next = b->next;
    clpar_dev_host_free_sync(dev, b->handle);
    clpar_event_release(b->free_at);
    free(b);
    b = next;
  }
}

static void count(clpar_device *dst, clpar_device *src, size_t bytes) {
  if (dst) {
    __atomic_add_fetch(&dst->transfers_in, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&dst->bytes_in, bytes, __ATOMIC_RELAXED);
  }
  if (src) {
    __atomic_add_fetch(&src->transfers_out, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&src->bytes_out, bytes, __ATOMIC_RELAXED);
  }
}

/* Marks st as used by another device's queue until ev completes. */
static clpar_status mark_busy(clpar_storage *st, clpar_event *ev) {
  return st ? clpar_busy_mark(&st->busy, ev) : CLPAR_OK;
}

/* dst's worker waits for what src's worker did so far. */
static clpar_status order_after(clpar_device *dst, clpar_device *src, clpar_event **ev_out) {
  clpar_event *ev;
  clpar_status s = clpar_event_record(src, &ev);
  if (s == CLPAR_OK) s = clpar_event_wait(dst, ev);
  if (s == CLPAR_OK && ev_out)
    *ev_out = ev;
  else
    clpar_event_release(ev);
  return s;
}

/* The source reads straight into the host device's memory. */
static clpar_status to_host(clpar_device *host, clpar_storage *dst_st, size_t dst_off,
                            clpar_device *src, const void *src_buf, size_t src_off, size_t bytes) {
  clpar_status s = order_after(src, host, NULL); /* the host's earlier work on dst is done */
  if (s == CLPAR_OK)
    s = clpar_dev_read(src, src_buf, src_off, (char *)dst_st->buf + dst_off, bytes);
  clpar_event *done = NULL;
  if (s == CLPAR_OK) s = order_after(host, src, &done);
  if (s == CLPAR_OK) s = mark_busy(dst_st, done);
  clpar_event_release(done);
  return s;
}

/* Whether src's backend copies straight into dst's memory (both of one backend). */
static int peer_ok(clpar_device *dst, clpar_device *src) {
  const clpar_backend_iface *f = src->bd.iface;
  if (f != dst->bd.iface || !f->peer_access || !f->copy_peer ||
      clpar_entry_set(src->composed, CLPAR_ENTRY_copy_peer))
    return 0;
  int yes = 0;
  if (clpar_dev_peer_access(src, dst->bd.ctx, &yes) != CLPAR_OK) {
    clpar_log(CLPAR_LOG_WARN, "%s", clpar_last_error()); /* staging works regardless */
    return 0;
  }
  return yes;
}

/* The source's queue copies into dst's buffer once dst's earlier work is done; dst's later
 * work waits for the copy, and the buffer is busy (for dst's cache) until it completes. */
static clpar_status peer_copy(clpar_device *dst, clpar_storage *dst_st, size_t dst_off,
                              clpar_device *src, const void *src_buf, size_t src_off,
                              size_t bytes) {
  clpar_status s = order_after(src, dst, NULL);
  if (s == CLPAR_OK)
    s = clpar_dev_copy_peer(src, dst->bd.ctx, dst_st->buf, dst_off, src_buf, src_off, bytes);
  clpar_event *done = NULL;
  if (s == CLPAR_OK) s = order_after(dst, src, &done);
  if (s == CLPAR_OK) s = mark_busy(dst_st, done);
  clpar_event_release(done);
  if (s == CLPAR_OK) {
    __atomic_add_fetch(&dst->peer_copies, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&src->peer_copies, 1, __ATOMIC_RELAXED);
  }
  return s;
}

/* Two staging blocks of src's pool take turns; chunk i + 2 reuses chunk i's block once the
 * destination has written it. */
static clpar_status through_staging(clpar_device *dst, void *dst_buf, size_t dst_off,
                                    clpar_device *src, const void *src_buf, size_t src_off,
                                    size_t bytes) {
  clpar_staging_block *slot[2] = {NULL, NULL};
  clpar_event *written[2] = {NULL, NULL};
  size_t chunk = bytes < CHUNK ? bytes : CHUNK;
  int nslots = bytes > CHUNK ? 2 : 1;
  clpar_status s = CLPAR_OK;
  for (int i = 0; i < nslots && s == CLPAR_OK; i++) {
    clpar_event *busy = NULL; /* a busy block: its last write must complete first */
    s = staging_get(src, chunk, &slot[i], &busy);
    if (busy) {
      if (s == CLPAR_OK) s = clpar_event_wait(src, busy);
      clpar_event_release(busy);
    }
  }
  for (size_t at = 0, i = 0; s == CLPAR_OK && at < bytes; at += chunk, i++) {
    size_t n = bytes - at < chunk ? bytes - at : chunk;
    int k = (int)(i % 2);
    if (written[k]) s = clpar_event_wait(src, written[k]);
    if (s == CLPAR_OK) s = clpar_dev_read(src, src_buf, src_off + at, slot[k]->ptr, n);
    if (s == CLPAR_OK) s = order_after(dst, src, NULL);
    if (s == CLPAR_OK) s = clpar_dev_write(dst, dst_buf, dst_off + at, slot[k]->ptr, n);
    clpar_event_release(written[k]);
    written[k] = NULL;
    if (s == CLPAR_OK) s = clpar_event_record(dst, &written[k]);
  }
  if (s != CLPAR_OK) { /* what was posted may still use the blocks */
    clpar_worker_drain(src);
    clpar_worker_drain(dst);
  }
  for (int k = 0; k < 2; k++) {
    if (!slot[k]) continue;
    /* Back to the pool: a pinned block busy until its last write completed; plain memory
     * freed then (at once if no write was made). */
    if (written[k] && slot[k]->handle) {
      staging_busy(slot[k], written[k]);
    } else if (!written[k] || clpar_event_then(written[k], staging_put, slot[k]) != CLPAR_OK) {
      if (written[k]) clpar_event_sync(written[k]);
      staging_put(slot[k]);
    }
    clpar_event_release(written[k]);
  }
  return s;
}

/* A copy between two devices that capture into one graph: through host memory the graph owns
 * (at each replay the queues first wait for the previous replay, which used that memory); the
 * events between the two queues are recorded with the commands and made fresh at each replay. */
static clpar_status captured_copy(clpar_device *dst, void *dst_buf, size_t dst_off,
                                  clpar_device *src, const void *src_buf, size_t src_off,
                                  size_t bytes) {
  void *mem = clpar_capture_host_memory(src, bytes);
  if (!mem) return CLPAR_ERROR_OUT_OF_MEMORY;
  count(dst, src, bytes);
  clpar_capture_allow(1);
  clpar_status s = clpar_dev_read(src, src_buf, src_off, mem, bytes);
  if (s == CLPAR_OK) s = order_after(dst, src, NULL);
  if (s == CLPAR_OK) s = clpar_dev_write(dst, dst_buf, dst_off, mem, bytes);
  clpar_capture_allow(0);
  return s;
}

/* A copy between two devices inside a capture that does not hold both. */
static clpar_status refuse_between(const char *fn, clpar_device *a, clpar_device *b) {
  const char *what = "a copy between a capturing device and one outside the capture";
  clpar_status s = clpar_capture_refuse(a, fn, what);
  return s != CLPAR_OK || a == b ? s : clpar_capture_refuse(b, fn, what);
}

clpar_status clpar_transfer(clpar_device *dst_dev, clpar_storage *dst_st, size_t dst_off,
                            clpar_device *src_dev, clpar_storage *src_st, size_t src_off,
                            size_t bytes) {
  if (bytes == 0) return CLPAR_OK;
  if (dst_dev == src_dev)
    return clpar_dev_copy(dst_dev, dst_st->buf, dst_off, src_st->buf, src_off, bytes);
  if (clpar_capture_between(dst_dev, src_dev))
    return captured_copy(dst_dev, dst_st->buf, dst_off, src_dev, src_st->buf, src_off, bytes);
  clpar_status s = refuse_between("clpar_transfer", dst_dev, src_dev);
  if (s != CLPAR_OK) return s;
  count(dst_dev, src_dev, bytes);
  if (dst_dev == clpar_device_host())
    return to_host(dst_dev, dst_st, dst_off, src_dev, src_st->buf, src_off, bytes);
  if (peer_ok(dst_dev, src_dev))
    return peer_copy(dst_dev, dst_st, dst_off, src_dev, src_st->buf, src_off, bytes);
  return through_staging(dst_dev, dst_st->buf, dst_off, src_dev, src_st->buf, src_off, bytes);
}

/* ---- a transfer posted in two halves ---- */

/* Up to this many bytes a staged transfer is split (one block); larger ones, and those that
 * need no staging, are posted whole at clpar_transfer_finish. */
#define SPLIT_MAX ((size_t)256 << 20)

struct clpar_transfer_half {
  clpar_device *src;
  clpar_storage *src_st; /* the caller keeps it alive until finish or cancel */
  size_t src_off, bytes;
  clpar_staging_block *block; /* NULL: posted whole at finish */
  clpar_event *read;          /* the source's read into block */
};

clpar_status clpar_transfer_begin(clpar_device *dst_dev, clpar_device *src_dev,
                                  clpar_storage *src_st, size_t src_off, size_t bytes,
                                  clpar_transfer_half **out) {
  int captured = clpar_capture_between(dst_dev, src_dev); /* posted whole at finish */
  clpar_status refused =
      captured ? CLPAR_OK : refuse_between("clpar_transfer_begin", dst_dev, src_dev);
  if (refused != CLPAR_OK) return refused;
  clpar_transfer_half *h = calloc(1, sizeof *h);
  if (!h) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "transfer: out of host memory");
  h->src = src_dev;
  h->src_st = src_st;
  h->src_off = src_off;
  h->bytes = bytes;
  clpar_status s = CLPAR_OK;
  if (!captured && bytes > 0 && bytes <= SPLIT_MAX && dst_dev != src_dev &&
      dst_dev != clpar_device_host() && !peer_ok(dst_dev, src_dev)) {
    clpar_event *busy = NULL;
    s = staging_get(src_dev, bytes, &h->block, &busy);
    if (busy) {
      if (s == CLPAR_OK) s = clpar_event_wait(src_dev, busy);
      clpar_event_release(busy);
    }
    if (s == CLPAR_OK) s = clpar_dev_read(src_dev, src_st->buf, src_off, h->block->ptr, bytes);
    if (s == CLPAR_OK) s = clpar_event_record(src_dev, &h->read);
  }
  if (s != CLPAR_OK) {
    clpar_transfer_cancel(h);
    return s;
  }
  *out = h;
  return CLPAR_OK;
}

/* Frees h; its block goes back to the pool once the work posted with it has completed. */
static void half_free(clpar_transfer_half *h, clpar_event *last) {
  if (h->block) {
    if (last && h->block->handle) {
      staging_busy(h->block, last);
    } else if (!last || clpar_event_then(last, staging_put, h->block) != CLPAR_OK) {
      if (last)
        clpar_event_sync(last);
      else
        clpar_worker_drain(h->src); /* a read may have been posted without its event */
      staging_put(h->block);
    }
  }
  clpar_event_release(h->read);
  free(h);
}

clpar_status clpar_transfer_finish(clpar_transfer_half *h, clpar_device *dst_dev,
                                   clpar_storage *dst_st, size_t dst_off) {
  if (!h->block) {
    clpar_status s =
        clpar_transfer(dst_dev, dst_st, dst_off, h->src, h->src_st, h->src_off, h->bytes);
    half_free(h, NULL);
    return s;
  }
  count(dst_dev, h->src, h->bytes);
  clpar_event *written = NULL;
  clpar_status s = clpar_event_wait(dst_dev, h->read);
  if (s == CLPAR_OK) s = clpar_dev_write(dst_dev, dst_st->buf, dst_off, h->block->ptr, h->bytes);
  if (s == CLPAR_OK) s = clpar_event_record(dst_dev, &written);
  if (s != CLPAR_OK) clpar_worker_drain(dst_dev); /* a write may have been posted */
  half_free(h, written ? written : h->read);
  clpar_event_release(written);
  return s;
}

void clpar_transfer_cancel(clpar_transfer_half *h) {
  if (h) half_free(h, h->read);
}

clpar_status clpar_upload_fill(clpar_device *dev, void *buf, size_t off_bytes, size_t bytes,
                               clpar_fill_fn fill, void *user) {
  clpar_status refused =
      clpar_capture_refuse(dev, "clpar_upload",
                           "an upload from host memory (write inputs and labels into tensors made "
                           "before the capture, before each replay)");
  if (refused != CLPAR_OK) return refused;
  count(dev, NULL, bytes);
  for (size_t at = 0; at < bytes; at += CHUNK) {
    size_t n = bytes - at < CHUNK ? bytes - at : CHUNK;
    clpar_staging_block *b;
    clpar_status s = staging_get(dev, n, &b, NULL);
    if (s != CLPAR_OK) return s;
    s = fill(user, at, b->ptr, n);
    if (s != CLPAR_OK) { /* nothing posted reads the block: straight back to the pool */
      staging_put(b);
      return s;
    }
    s = clpar_dev_write(dev, buf, off_bytes + at, b->ptr, n);
    clpar_status put = put_when_done(dev, b);
    if (s == CLPAR_OK) s = put;
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

static clpar_status copy_from(void *user, size_t at, void *dst, size_t n) {
  memcpy(dst, (const char *)user + at, n);
  return CLPAR_OK;
}

clpar_status clpar_upload(clpar_device *dev, void *buf, size_t off_bytes, const void *src,
                          size_t bytes) {
  return clpar_upload_fill(dev, buf, off_bytes, bytes, copy_from, (void *)src);
}

clpar_status clpar_download(clpar_device *dev, const void *buf, size_t off_bytes, void *dst,
                            size_t bytes) {
  clpar_status refused =
      clpar_capture_refuse(dev, "clpar_download",
                           "a read into host memory (clpar_tensor_read, clpar_tensor_item): "
                           "read after clpar_graph_replay instead");
  if (refused != CLPAR_OK) return refused;
  count(NULL, dev, bytes);
  clpar_event *done;
  clpar_status s = clpar_dev_read(dev, buf, off_bytes, dst, bytes);
  if (s == CLPAR_OK) s = clpar_event_record(dev, &done);
  if (s != CLPAR_OK) {
    clpar_worker_drain(dev); /* dst must not be written after we return */
    return s;
  }
  s = clpar_event_sync(done);
  clpar_event_release(done);
  if (s == CLPAR_OK) s = clpar_worker_take_error(dev);
  return s;
}
