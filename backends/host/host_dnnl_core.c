/* host_dnnl_core.c — the machinery the host backend's oneDNN entries share (host_dnnl.c: the
 * convolutions; host_dnnl_norm.c: batch norm; host_dnnl_pool.c: average pooling).
 *
 * Making a primitive costs milliseconds, so each is kept (with its reorders) in a cache keyed
 * by its kind and the bytes of its key (the shape and the options), most recently used first,
 * at most CACHE_MAX of them; the cache, the engine and the stream are made at the first call
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

#define CACHE_MAX 256 /* primitives kept; ResNet-50 needs about 120 */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static hd_entry *cache; /* most recently used first */
static int cache_len;
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

clpar_status hd_fail(const char *what, dnnl_status_t st) {
  return clpar_set_error(CLPAR_ERROR_BACKEND, "host backend: oneDNN %s failed: %s", what,
                         dnnl_status2str(st));
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

static void entry_free(hd_entry *e) {
  if (!e) return;
  if (e->prim) dnnl_primitive_destroy(e->prim);
  for (int i = 0; i < e->n_ops; i++)
    if (e->ops[i].reorder) dnnl_primitive_destroy(e->ops[i].reorder);
  free(e);
}

void clpar_host_dnnl_release(void) {
  pthread_mutex_lock(&lock);
  while (cache) {
    hd_entry *e = cache;
    cache = e->next;
    entry_free(e);
  }
  cache_len = 0;
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

static hd_operand *next_operand(hd_entry *e) {
  if (e->n_ops >= HD_MAX_ARGS) return NULL;
  hd_operand *op = &e->ops[e->n_ops++];
  memset(op, 0, sizeof *op);
  return op;
}

clpar_status hd_add_operand(hd_entry *e, const_dnnl_primitive_desc_t pd, int arg, int out,
                            dnnl_query_t q, const dnnl_memory_desc_t *user) {
  hd_operand *op = next_operand(e);
  if (!op) return clpar_set_error(CLPAR_ERROR_BACKEND, "host backend: too many oneDNN operands");
  op->arg = arg;
  op->out = out;
  op->user = *user;
  op->inner = q == dnnl_query_undef ? *user : *dnnl_primitive_desc_query_md(pd, q, 0);
  if (dnnl_memory_desc_equal(&op->user, &op->inner)) return CLPAR_OK;
  const dnnl_memory_desc_t *from = out ? &op->inner : &op->user, *to = out ? &op->user : &op->inner;
  dnnl_primitive_desc_t rpd = NULL;
  HD_TRY("reorder_primitive_desc_create",
         dnnl_reorder_primitive_desc_create(&rpd, from, engine, to, engine, NULL));
  dnnl_status_t st = dnnl_primitive_create(&op->reorder, rpd);
  dnnl_primitive_desc_destroy(rpd);
  if (st != dnnl_success) {
    op->reorder = NULL;
    return hd_fail("primitive_create (reorder)", st);
  }
  return CLPAR_OK;
}

clpar_status hd_add_scratch(hd_entry *e, const_dnnl_primitive_desc_t pd, int arg, dnnl_query_t q) {
  hd_operand *op = next_operand(e);
  if (!op) return clpar_set_error(CLPAR_ERROR_BACKEND, "host backend: too many oneDNN operands");
  op->arg = arg;
  op->out = 1;
  op->scratch = 1;
  op->inner = *dnnl_primitive_desc_query_md(pd, q, 0);
  op->user = op->inner;
  return CLPAR_OK;
}

clpar_status hd_make_prim(hd_entry *e, const_dnnl_primitive_desc_t pd) {
  dnnl_status_t st = dnnl_primitive_create(&e->prim, pd);
  if (st != dnnl_success) {
    e->prim = NULL;
    return hd_fail("primitive_create", st);
  }
  return CLPAR_OK;
}

/* Moves e to the front of the list; drops the last entry past CACHE_MAX. */
static void put_first(hd_entry **pp, hd_entry *e) {
  if (pp) *pp = e->next; /* unlinked from where it was */
  e->next = cache;
  cache = e;
  if (pp || ++cache_len <= CACHE_MAX) return;
  hd_entry **last = &cache;
  while ((*last)->next) last = &(*last)->next;
  entry_free(*last);
  *last = NULL;
  cache_len--;
}

clpar_status hd_lookup(int kind, const void *key, size_t key_len, hd_build_fn build,
                       hd_entry **out) {
  if (key_len > HD_KEY_BYTES)
    return clpar_set_error(CLPAR_ERROR_BACKEND, "host backend: a oneDNN key of %zu bytes", key_len);
  hd_entry **pp = &cache;
  for (hd_entry *e = cache; e; pp = &e->next, e = e->next)
    if (e->kind == kind && e->key_len == key_len && memcmp(e->key, key, key_len) == 0) {
      put_first(pp, e);
      *out = e;
      return CLPAR_OK;
    }
  clpar_status st = ensure_engine();
  if (st != CLPAR_OK) return st;
  hd_entry *e = calloc(1, sizeof *e);
  if (!e) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "host backend: out of host memory");
  e->kind = kind;
  e->key_len = key_len;
  memcpy(e->key, key, key_len);
  st = build(key, kind, e);
  if (st != CLPAR_OK) {
    entry_free(e);
    return st;
  }
  put_first(NULL, e);
  *out = e;
  return CLPAR_OK;
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

static clpar_status memory(const dnnl_memory_desc_t *md, void *ptr, dnnl_memory_t *m) {
  HD_TRY("memory_create", dnnl_memory_create(m, md, engine, ptr));
  return CLPAR_OK;
}

/* Runs the reorder of op between the user's memory and work buffer i. */
static clpar_status run_reorder(const hd_operand *op, void *user, int i) {
  dnnl_memory_t um = NULL, wm = NULL;
  clpar_status st = memory(&op->user, user, &um);
  if (st == CLPAR_OK) st = memory(&op->inner, work[i], &wm);
  if (st == CLPAR_OK) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, op->out ? wm : um},
                               {DNNL_ARG_TO, op->out ? um : wm}};
    dnnl_status_t ds = dnnl_primitive_execute(op->reorder, stream, 2, args);
    if (ds == dnnl_success) ds = dnnl_stream_wait(stream);
    if (ds != dnnl_success) st = hd_fail("reorder", ds);
  }
  if (um) dnnl_memory_destroy(um);
  if (wm) dnnl_memory_destroy(wm);
  return st;
}

clpar_status hd_run(const hd_entry *e, void *const *ptrs, int have_first) {
  dnnl_exec_arg_t args[HD_MAX_ARGS];
  clpar_status st = CLPAR_OK;
  int made = 0;
  for (int i = 0; st == CLPAR_OK && i < e->n_ops; i++) {
    const hd_operand *op = &e->ops[i];
    void *p = ptrs[i];
    if (op->reorder || op->scratch) {
      st = grow_work(i, dnnl_memory_desc_get_size(&op->inner));
      if (st == CLPAR_OK && op->reorder && !op->out && !(i == 0 && have_first))
        st = run_reorder(op, ptrs[i], i);
      p = work[i];
    }
    if (st == CLPAR_OK) st = memory(&op->inner, p, &args[i].memory);
    if (st == CLPAR_OK) args[i].arg = op->arg, made++;
  }
  if (st == CLPAR_OK) {
    dnnl_status_t ds = dnnl_primitive_execute(e->prim, stream, e->n_ops, args);
    if (ds == dnnl_success) ds = dnnl_stream_wait(stream);
    if (ds != dnnl_success) st = hd_fail("primitive_execute", ds);
  }
  for (int i = 0; st == CLPAR_OK && i < e->n_ops; i++)
    if (e->ops[i].reorder && e->ops[i].out) st = run_reorder(&e->ops[i], ptrs[i], i);
  for (int i = 0; i < made; i++) dnnl_memory_destroy(args[i].memory);
  return st;
}
