/* host_dnnl_core.c — the machinery the host backend's oneDNN entries share (host_dnnl.c: the
 * convolutions; host_dnnl_norm.c: batch norm; host_dnnl_pool.c: average pooling): the CPU
 * engine, its stream, the host's cache of primitives (dnnl_prim.c) and the work buffers.
 *
 * The cache, the engine and the stream are made at the first call
 * and freed by the device's destroy (clpar_host_dnnl_release). One mutex guards all of it
 * and is held while a primitive runs: the work buffers are shared, and a oneDNN primitive
 * with its own scratchpad must not run twice at once. The host backend has one device whose
 * worker thread makes every call, so the lock is never contended in practice. The work
 * buffers' bytes are counted in own_bytes (atomic: the core reads them from any thread, through
 * the workspace_bytes entry, without waiting for a primitive); workspace_trim frees them.
 *
 * oneDNN's Debian build threads with OpenMP, as the host backend does: both use the worker
 * thread's OpenMP team (OMP_NUM_THREADS). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl_debug.h>

#include "host/host_dnnl.h"
#include "host/host_dnnl_core.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static hd_cache cache;
static void *work[HD_MAX_ARGS]; /* one work buffer per operand slot, grown as needed */
static size_t work_bytes[HD_MAX_ARGS];
static float *ones_buf, *temp_buf; /* hd_ones, hd_temp */
static size_t ones_n, temp_n;
static uint64_t own_bytes; /* work, ones_buf and temp_buf; __atomic */

/* own_bytes goes from had to now bytes. */
static void count(size_t had, size_t now) {
  __atomic_sub_fetch(&own_bytes, (uint64_t)had, __ATOMIC_RELAXED);
  __atomic_add_fetch(&own_bytes, (uint64_t)now, __ATOMIC_RELAXED);
}

/* Frees the work buffers, ones_buf and temp_buf; lock held. */
static void free_buffers(void) {
  for (int i = 0; i < HD_MAX_ARGS; i++) {
    free(work[i]);
    count(work_bytes[i], 0);
    work[i] = NULL;
    work_bytes[i] = 0;
  }
  free(ones_buf);
  free(temp_buf);
  count((ones_n + temp_n) * sizeof(float), 0);
  ones_buf = temp_buf = NULL;
  ones_n = temp_n = 0;
}

clpar_status clpar_host_dnnl_workspace_bytes(void *dev, uint64_t *bytes) {
  (void)dev;
  *bytes = __atomic_load_n(&own_bytes, __ATOMIC_RELAXED);
  return CLPAR_OK;
}

/* On the worker, between entries: nothing uses the buffers (the next call grows them again). */
clpar_status clpar_host_dnnl_workspace_trim(void *dev) {
  (void)dev;
  pthread_mutex_lock(&lock);
  free_buffers();
  pthread_mutex_unlock(&lock);
  return CLPAR_OK;
}

void hd_lock(void) {
  pthread_mutex_lock(&lock);
}

void hd_unlock(void) {
  pthread_mutex_unlock(&lock);
}

dnnl_engine_t hd_engine(void) {
  return engine;
}

int hd_channel_block(void) {
  return (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core ? 16
                                                                                               : 8;
}

void clpar_host_dnnl_release(void) {
  pthread_mutex_lock(&lock);
  hd_cache_clear(&cache);
  free_buffers();
  if (stream) dnnl_stream_destroy(stream);
  if (engine) dnnl_engine_destroy(engine);
  stream = NULL;
  engine = NULL;
  pthread_mutex_unlock(&lock);
}

static clpar_status ensure_engine(void) {
  dnnl_status_t st = dnnl_success;
  if (!engine && (st = dnnl_engine_create(&engine, dnnl_cpu, 0)) != dnnl_success) {
    engine = NULL;
    return hd_fail("engine_create", st);
  }
  if (!stream &&
      (st = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags)) != dnnl_success) {
    stream = NULL;
    return hd_fail("stream_create", st);
  }
  return CLPAR_OK;
}

clpar_status hd_lookup(int kind, const void *key, size_t key_len, hd_build_fn build,
                       hd_entry **out) {
  clpar_status st = ensure_engine();
  return st == CLPAR_OK ? hd_cache_lookup(&cache, engine, kind, key, key_len, build, out) : st;
}

static clpar_status grow_work(int i, size_t bytes) {
  if (work_bytes[i] >= bytes) return CLPAR_OK;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                           "host backend: a oneDNN work buffer of %zu bytes could not be allocated",
                           bytes);
  free(work[i]);
  count(work_bytes[i], bytes);
  work[i] = p;
  work_bytes[i] = bytes;
  return CLPAR_OK;
}

/* *buf holding at least n floats (its contents kept when it need not grow). */
static clpar_status grow_floats(float **buf, size_t *have, size_t n) {
  if (*have >= n) return CLPAR_OK;
  float *p = malloc((n ? n : 1) * sizeof *p);
  if (!p)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                           "host backend: %zu floats for oneDNN could not be allocated", n);
  free(*buf);
  count(*have * sizeof *p, n * sizeof *p);
  *buf = p;
  *have = n;
  return CLPAR_OK;
}

clpar_status hd_ones(size_t n, float **ones) {
  size_t had = ones_n;
  clpar_status st = grow_floats(&ones_buf, &ones_n, n);
  if (st != CLPAR_OK) return st;
  if (ones_n != had)
    for (size_t i = 0; i < ones_n; i++) ones_buf[i] = 1.0f;
  *ones = ones_buf;
  return CLPAR_OK;
}

clpar_status hd_temp(size_t n, float **temp) {
  clpar_status st = grow_floats(&temp_buf, &temp_n, n);
  if (st == CLPAR_OK) *temp = temp_buf;
  return st;
}

static clpar_status user_memory(hd_io *io, const dnnl_memory_desc_t *md, void *ptr,
                                dnnl_memory_t *m) {
  (void)io;
  HD_TRY("memory_create", dnnl_memory_create(m, md, engine, ptr));
  return CLPAR_OK;
}

static clpar_status work_memory(hd_io *io, int i, const dnnl_memory_desc_t *md, dnnl_memory_t *m) {
  clpar_status st = grow_work(i, dnnl_memory_desc_get_size(md));
  return st == CLPAR_OK ? user_memory(io, md, work[i], m) : st;
}

static clpar_status zero(hd_io *io, void *ptr, size_t bytes) {
  (void)io;
  memset(ptr, 0, bytes);
  return CLPAR_OK;
}

clpar_status hd_host_io(hd_io *io) {
  clpar_status st = ensure_engine();
  if (st != CLPAR_OK) return st;
  memset(io, 0, sizeof *io);
  io->engine = engine;
  io->stream = stream;
  io->cache = &cache;
  io->wait = 1;
  io->user = user_memory;
  io->work = work_memory;
  io->zero = zero;
  return CLPAR_OK;
}

clpar_status hd_run(const hd_entry *e, void *const *ptrs, int have_first) {
  hd_io io;
  clpar_status st = hd_host_io(&io);
  return st == CLPAR_OK ? hd_exec(e, &io, ptrs, have_first) : st;
}
