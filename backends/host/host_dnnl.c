/* host_dnnl.c — the host backend's whole convolutions (backend.h's conv2d entries) through
 * oneDNN's C API: forward with bias, backward data, backward weights with bias.
 *
 * Tensors stay NCHW / OIHW in clpar's memory. Each primitive is made with its layouts left to
 * oneDNN (format_tag_any: channel-blocked layouts such as nChw16c on AVX-512, for which it
 * has direct JIT kernels), and reorders move the operands between clpar's layout and the
 * primitive's at the edges of the call, through work buffers shared by every primitive.
 * Results are the same bits run to run at a given thread count (tests/test_host_dnnl.c).
 *
 * Making a primitive costs milliseconds, so each is kept (with its reorders) in a cache keyed
 * by the shape and the kind, most recently used first, at most CACHE_MAX of them; the cache,
 * the engine and the stream are made at the first call and freed by the device's destroy.
 * One mutex guards all of it and is held while a primitive runs: the work buffers are
 * shared, and a oneDNN primitive with its own scratchpad must not run twice at once. The host
 * backend has one device whose worker thread makes every call, so the lock is never
 * contended in practice.
 *
 * oneDNN's Debian build threads with OpenMP, as the host backend does: both use the worker
 * thread's OpenMP team (OMP_NUM_THREADS). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "host/host_dnnl.h"

#define CACHE_MAX 256 /* primitives kept; ResNet-50 needs about 60 */
#define MAX_ARGS 4

enum { K_FWD, K_BWD_DATA, K_BWD_WEIGHTS };

/* One operand: its DNNL_ARG_*, whether the primitive reads or writes it, clpar's layout
 * (user) and the primitive's (inner), and the reorder between them (NULL when they are the
 * same layout). */
typedef struct {
  int arg, out;
  dnnl_memory_desc_t user, inner;
  dnnl_primitive_t reorder;
} operand;

typedef struct entry {
  struct entry *next;
  int kind, has_bias;
  clpar_conv2d_shape s;
  dnnl_primitive_t prim;
  operand ops[MAX_ARGS];
  int n_ops;
  int clipped; /* the convolution reads only part of x (see user_src_md) */
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static entry *cache; /* most recently used first */
static int cache_len;
static void *work[MAX_ARGS]; /* one work buffer per operand slot, grown as needed */
static size_t work_bytes[MAX_ARGS];

static clpar_status fail(const char *what, dnnl_status_t st) {
  return clpar_set_error(CLPAR_ERROR_BACKEND, "host conv2d: oneDNN %s failed: %s", what,
                         dnnl_status2str(st));
}

#define TRY(what, call)                              \
  do {                                               \
    dnnl_status_t st_ = (call);                      \
    if (st_ != dnnl_success) return fail(what, st_); \
  } while (0)

static void entry_free(entry *e) {
  if (!e) return;
  if (e->prim) dnnl_primitive_destroy(e->prim);
  for (int i = 0; i < e->n_ops; i++)
    if (e->ops[i].reorder) dnnl_primitive_destroy(e->ops[i].reorder);
  free(e);
}

void clpar_host_dnnl_release(void) {
  pthread_mutex_lock(&lock);
  while (cache) {
    entry *e = cache;
    cache = e->next;
    entry_free(e);
  }
  cache_len = 0;
  for (int i = 0; i < MAX_ARGS; i++) {
    free(work[i]);
    work[i] = NULL;
    work_bytes[i] = 0;
  }
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
    return fail("engine_create", st);
  }
  if (!stream &&
      (st = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags)) != dnnl_success) {
    stream = NULL;
    return fail("stream_create", st);
  }
  return CLPAR_OK;
}

/* The rows (columns) of x the convolution reads: [0, *used), and the padding after them that
 * makes oneDNN's output size oh. Rows past the last window's reach are left out of x's view
 * (oneDNN wants the padding after x to be >= 0). */
static void extent(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d,
                   int64_t *used, int64_t *pad_r) {
  int64_t last = (out - 1) * s - p + (k - 1) * d; /* the last input index read, maybe padding */
  *used = last + 1 < in ? last + 1 : in;
  *pad_r = last + 1 - *used;
}

/* x's view: [n, c, rows used, columns used] with the strides of the whole NCHW tensor. */
static clpar_status user_src_md(const clpar_conv2d_shape *s, dnnl_memory_desc_t *md) {
  int64_t hu, wu, pr;
  extent(s->h, s->oh, s->kh, s->sh, s->ph, s->dh, &hu, &pr);
  extent(s->w, s->ow, s->kw, s->sw, s->pw, s->dw, &wu, &pr);
  dnnl_dims_t dims = {s->n, s->c, hu, wu};
  dnnl_dims_t strides = {s->c * s->h * s->w, s->h * s->w, s->w, 1};
  TRY("memory_desc_init_by_strides",
      dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_f32, strides));
  return CLPAR_OK;
}

static clpar_status weights_md(const clpar_conv2d_shape *s, int any, dnnl_memory_desc_t *md) {
  int64_t g = s->groups;
  dnnl_format_tag_t tag = any ? dnnl_format_tag_any : g > 1 ? dnnl_goihw : dnnl_oihw;
  dnnl_dims_t d1 = {s->o, s->c, s->kh, s->kw}, dg = {g, s->o / g, s->c / g, s->kh, s->kw};
  TRY("memory_desc_init_by_tag",
      dnnl_memory_desc_init_by_tag(md, g > 1 ? 5 : 4, g > 1 ? dg : d1, dnnl_f32, tag));
  return CLPAR_OK;
}

static clpar_status dst_md(const clpar_conv2d_shape *s, int any, dnnl_memory_desc_t *md) {
  dnnl_dims_t dims = {s->n, s->o, s->oh, s->ow};
  TRY("memory_desc_init_by_tag",
      dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw));
  return CLPAR_OK;
}

/* The user layouts of an entry's source, weights, destination and bias. */
typedef struct {
  dnnl_memory_desc_t src, wei, dst, bias, src_any, wei_any, dst_any;
} descs;

static clpar_status make_descs(const clpar_conv2d_shape *s, descs *d) {
  clpar_status st = user_src_md(s, &d->src);
  if (st == CLPAR_OK) st = weights_md(s, 0, &d->wei);
  if (st == CLPAR_OK) st = weights_md(s, 1, &d->wei_any);
  if (st == CLPAR_OK) st = dst_md(s, 0, &d->dst);
  if (st == CLPAR_OK) st = dst_md(s, 1, &d->dst_any);
  if (st != CLPAR_OK) return st;
  dnnl_dims_t src_dims;
  memcpy(src_dims, d->src.dims, sizeof(int64_t) * 4);
  TRY("memory_desc_init_by_tag",
      dnnl_memory_desc_init_by_tag(&d->src_any, 4, src_dims, dnnl_f32, dnnl_format_tag_any));
  dnnl_dims_t bdims = {s->o};
  TRY("memory_desc_init_by_tag",
      dnnl_memory_desc_init_by_tag(&d->bias, 1, bdims, dnnl_f32, dnnl_a));
  return CLPAR_OK;
}

/* The convolution's descriptor of kind k over the layouts src, wei, dst (bias when has_bias). */
static clpar_status conv_desc(const clpar_conv2d_shape *s, int k, int has_bias, const descs *d,
                              dnnl_convolution_desc_t *cd) {
  int64_t hu, wu, prh, prw;
  extent(s->h, s->oh, s->kh, s->sh, s->ph, s->dh, &hu, &prh);
  extent(s->w, s->ow, s->kw, s->sw, s->pw, s->dw, &wu, &prw);
  dnnl_dims_t strides = {s->sh, s->sw}, dil = {s->dh - 1, s->dw - 1};
  dnnl_dims_t pl = {s->ph, s->pw}, pr = {prh, prw};
  const dnnl_memory_desc_t *b = has_bias ? &d->bias : NULL;
  dnnl_alg_kind_t alg = dnnl_convolution_direct;
  if (k == K_FWD)
    TRY("convolution_forward_desc_init", dnnl_dilated_convolution_forward_desc_init(
                                             cd, dnnl_forward_training, alg, &d->src_any,
                                             &d->wei_any, b, &d->dst_any, strides, dil, pl, pr));
  else if (k == K_BWD_DATA)
    TRY("convolution_backward_data_desc_init",
        dnnl_dilated_convolution_backward_data_desc_init(cd, alg, &d->src_any, &d->wei_any,
                                                         &d->dst_any, strides, dil, pl, pr));
  else
    TRY("convolution_backward_weights_desc_init",
        dnnl_dilated_convolution_backward_weights_desc_init(cd, alg, &d->src_any, &d->wei_any, b,
                                                            &d->dst_any, strides, dil, pl, pr));
  return CLPAR_OK;
}

/* Fills op: the primitive's layout for the query q (the user's for dnnl_query_undef: the
 * bias, which the primitive takes as given), and a reorder from (or to, for an output) the
 * user layout where they differ. */
static clpar_status add_operand(entry *e, dnnl_primitive_desc_t pd, int arg, int out,
                                dnnl_query_t q, const dnnl_memory_desc_t *user) {
  operand *op = &e->ops[e->n_ops++];
  op->arg = arg;
  op->out = out;
  op->user = *user;
  op->inner = q == dnnl_query_undef ? *user : *dnnl_primitive_desc_query_md(pd, q, 0);
  op->reorder = NULL;
  if (dnnl_memory_desc_equal(&op->user, &op->inner)) return CLPAR_OK;
  const dnnl_memory_desc_t *from = out ? &op->inner : &op->user, *to = out ? &op->user : &op->inner;
  dnnl_primitive_desc_t rpd = NULL;
  TRY("reorder_primitive_desc_create",
      dnnl_reorder_primitive_desc_create(&rpd, from, engine, to, engine, NULL));
  dnnl_status_t st = dnnl_primitive_create(&op->reorder, rpd);
  dnnl_primitive_desc_destroy(rpd);
  if (st != dnnl_success) {
    op->reorder = NULL;
    return fail("primitive_create (reorder)", st);
  }
  return CLPAR_OK;
}

static clpar_status make_pd(const clpar_conv2d_shape *s, int k, int has_bias, const descs *d,
                            const_dnnl_primitive_desc_t hint, dnnl_primitive_desc_t *pd) {
  dnnl_convolution_desc_t cd;
  clpar_status st = conv_desc(s, k, has_bias, d, &cd);
  if (st != CLPAR_OK) return st;
  TRY("primitive_desc_create", dnnl_primitive_desc_create(pd, &cd, NULL, engine, hint));
  return CLPAR_OK;
}

/* The operands of kind k in execution order (see run_entry's pointers). Both backward kinds
 * take gy (DIFF_DST) first, in work buffer 0, so that one reorder of it serves both. */
static clpar_status add_operands(entry *e, dnnl_primitive_desc_t pd, const descs *d) {
  clpar_status st;
  if (e->kind == K_FWD) {
    st = add_operand(e, pd, DNNL_ARG_SRC, 0, dnnl_query_src_md, &d->src);
    if (st == CLPAR_OK)
      st = add_operand(e, pd, DNNL_ARG_WEIGHTS, 0, dnnl_query_weights_md, &d->wei);
    if (st == CLPAR_OK) st = add_operand(e, pd, DNNL_ARG_DST, 1, dnnl_query_dst_md, &d->dst);
    if (st == CLPAR_OK && e->has_bias)
      st = add_operand(e, pd, DNNL_ARG_BIAS, 0, dnnl_query_undef, &d->bias);
  } else if (e->kind == K_BWD_DATA) {
    st = add_operand(e, pd, DNNL_ARG_DIFF_DST, 0, dnnl_query_diff_dst_md, &d->dst);
    if (st == CLPAR_OK)
      st = add_operand(e, pd, DNNL_ARG_WEIGHTS, 0, dnnl_query_weights_md, &d->wei);
    if (st == CLPAR_OK)
      st = add_operand(e, pd, DNNL_ARG_DIFF_SRC, 1, dnnl_query_diff_src_md, &d->src);
  } else {
    st = add_operand(e, pd, DNNL_ARG_DIFF_DST, 0, dnnl_query_diff_dst_md, &d->dst);
    if (st == CLPAR_OK) st = add_operand(e, pd, DNNL_ARG_SRC, 0, dnnl_query_src_md, &d->src);
    if (st == CLPAR_OK)
      st = add_operand(e, pd, DNNL_ARG_DIFF_WEIGHTS, 1, dnnl_query_diff_weights_md, &d->wei);
    if (st == CLPAR_OK && e->has_bias)
      st = add_operand(e, pd, DNNL_ARG_DIFF_BIAS, 1, dnnl_query_undef, &d->bias);
  }
  return st;
}

/* A new entry of kind k: its primitive (backward ones made with a forward one as their hint)
 * and its operands. */
static clpar_status build_entry(const clpar_conv2d_shape *s, int k, int has_bias, entry **out) {
  descs d;
  clpar_status st = make_descs(s, &d);
  if (st != CLPAR_OK) return st;
  entry *e = calloc(1, sizeof *e);
  if (!e) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "host conv2d: out of host memory");
  e->kind = k;
  e->has_bias = has_bias;
  e->s = *s;
  e->clipped = d.src.dims[2] != s->h || d.src.dims[3] != s->w;
  dnnl_primitive_desc_t fwd = NULL, pd = NULL;
  st = make_pd(s, K_FWD, has_bias, &d, NULL, &fwd);
  if (st == CLPAR_OK && k != K_FWD) st = make_pd(s, k, has_bias, &d, fwd, &pd);
  dnnl_primitive_desc_t use = k == K_FWD ? fwd : pd;
  if (st == CLPAR_OK) st = add_operands(e, use, &d);
  if (st == CLPAR_OK) {
    dnnl_status_t ds = dnnl_primitive_create(&e->prim, use);
    if (ds != dnnl_success) {
      e->prim = NULL;
      st = fail("primitive_create", ds);
    }
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (fwd) dnnl_primitive_desc_destroy(fwd);
  if (st != CLPAR_OK) {
    entry_free(e);
    return st;
  }
  *out = e;
  return CLPAR_OK;
}

static int same_shape(const clpar_conv2d_shape *a, const clpar_conv2d_shape *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

/* The cached entry for (s, k, has_bias), made and put first when missing; the least recently
 * used one is dropped past CACHE_MAX. The lock is held. */
static clpar_status lookup(const clpar_conv2d_shape *s, int k, int has_bias, entry **out) {
  entry **pp = &cache, *last_prev = NULL;
  for (entry *e = cache; e; pp = &e->next, e = e->next) {
    if (e->kind == k && e->has_bias == has_bias && same_shape(&e->s, s)) {
      *pp = e->next; /* move to the front */
      e->next = cache;
      cache = e;
      *out = e;
      return CLPAR_OK;
    }
    if (e->next && !e->next->next) last_prev = e;
  }
  entry *e = NULL;
  clpar_status st = ensure_engine();
  if (st == CLPAR_OK) st = build_entry(s, k, has_bias, &e);
  if (st != CLPAR_OK) return st;
  e->next = cache;
  cache = e;
  if (++cache_len > CACHE_MAX && last_prev) {
    entry_free(last_prev->next);
    last_prev->next = NULL;
    cache_len--;
  }
  *out = e;
  return CLPAR_OK;
}

static clpar_status grow_work(int i, size_t bytes) {
  if (work_bytes[i] >= bytes) return CLPAR_OK;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes) != 0)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                           "host conv2d: a work buffer of %zu bytes could not be allocated", bytes);
  free(work[i]);
  work[i] = p;
  work_bytes[i] = bytes;
  return CLPAR_OK;
}

static clpar_status memory(const dnnl_memory_desc_t *md, void *ptr, dnnl_memory_t *m) {
  TRY("memory_create", dnnl_memory_create(m, md, engine, ptr));
  return CLPAR_OK;
}

/* Runs the reorder of op between the user's memory and work buffer i. */
static clpar_status run_reorder(const operand *op, void *user, int i) {
  dnnl_memory_t um = NULL, wm = NULL;
  clpar_status st = memory(&op->user, user, &um);
  if (st == CLPAR_OK) st = memory(&op->inner, work[i], &wm);
  if (st == CLPAR_OK) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, op->out ? wm : um},
                               {DNNL_ARG_TO, op->out ? um : wm}};
    dnnl_status_t ds = dnnl_primitive_execute(op->reorder, stream, 2, args);
    if (ds == dnnl_success) ds = dnnl_stream_wait(stream);
    if (ds != dnnl_success) st = fail("reorder", ds);
  }
  if (um) dnnl_memory_destroy(um);
  if (wm) dnnl_memory_destroy(wm);
  return st;
}

/* Runs e on the user's pointers (one per operand, in add_operands' order): inputs reordered
 * into work buffers (operand 0 is already there when have_first), the primitive, outputs
 * reordered back. */
static clpar_status run_entry(const entry *e, void *const *ptrs, int have_first) {
  dnnl_exec_arg_t args[MAX_ARGS];
  clpar_status st = CLPAR_OK;
  int made = 0;
  for (int i = 0; st == CLPAR_OK && i < e->n_ops; i++) {
    const operand *op = &e->ops[i];
    void *p = ptrs[i];
    if (op->reorder) {
      st = grow_work(i, dnnl_memory_desc_get_size(&op->inner));
      if (st == CLPAR_OK && !op->out && !(i == 0 && have_first)) st = run_reorder(op, ptrs[i], i);
      p = work[i];
    }
    if (st == CLPAR_OK) st = memory(&op->inner, p, &args[i].memory);
    if (st == CLPAR_OK) args[i].arg = op->arg, made++;
  }
  if (st == CLPAR_OK) {
    dnnl_status_t ds = dnnl_primitive_execute(e->prim, stream, e->n_ops, args);
    if (ds == dnnl_success) ds = dnnl_stream_wait(stream);
    if (ds != dnnl_success) st = fail("convolution", ds);
  }
  for (int i = 0; st == CLPAR_OK && i < e->n_ops; i++)
    if (e->ops[i].reorder && e->ops[i].out) st = run_reorder(&e->ops[i], ptrs[i], i);
  for (int i = 0; i < made; i++) dnnl_memory_destroy(args[i].memory);
  return st;
}

static clpar_status run_forward(const clpar_conv2d_shape *s, int has_bias, void *const *ptrs) {
  pthread_mutex_lock(&lock);
  entry *e = NULL;
  clpar_status st = lookup(s, K_FWD, has_bias, &e);
  if (st == CLPAR_OK) st = run_entry(e, ptrs, 0);
  pthread_mutex_unlock(&lock);
  return st;
}

/* Backward data (dx) then backward weights (dw, db); gy is reordered once when both
 * primitives take it in the same layout. */
static clpar_status run_backward(const clpar_conv2d_shape *s, void *x, void *w, void *gy, void *dx,
                                 void *dw, void *db) {
  pthread_mutex_lock(&lock);
  entry *bd = NULL, *bw = NULL;
  clpar_status st = dx ? lookup(s, K_BWD_DATA, 0, &bd) : CLPAR_OK;
  if (st == CLPAR_OK && dw) st = lookup(s, K_BWD_WEIGHTS, db != NULL, &bw);
  if (st == CLPAR_OK && bd) {
    /* dx is written whole: the rows and columns no window reads get zeros */
    if (bd->clipped) memset(dx, 0, (size_t)(s->n * s->c * s->h * s->w) * sizeof(float));
    void *ptrs[MAX_ARGS] = {gy, w, dx, NULL};
    st = run_entry(bd, ptrs, 0);
  }
  if (st == CLPAR_OK && bw) {
    int have = bd && bd->ops[0].reorder && bw->ops[0].reorder &&
               dnnl_memory_desc_equal(&bd->ops[0].inner, &bw->ops[0].inner);
    void *ptrs[MAX_ARGS] = {gy, x, dw, db};
    st = run_entry(bw, ptrs, have);
  }
  pthread_mutex_unlock(&lock);
  return st;
}

static void *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

clpar_status clpar_host_dnnl_conv2d(void *dev, clpar_conv2d_shape s, clpar_bref x,
                                    clpar_bref weight, clpar_bref bias, clpar_bref y) {
  (void)dev;
  void *ptrs[MAX_ARGS] = {at(x), at(weight), at(y), bias.buf ? at(bias) : NULL};
  return run_forward(&s, bias.buf != NULL, ptrs);
}

clpar_status clpar_host_dnnl_conv2d_backward(void *dev, clpar_conv2d_shape s, clpar_bref x,
                                             clpar_bref weight, clpar_bref gy, clpar_bref dx,
                                             clpar_bref dw, clpar_bref db) {
  (void)dev;
  return run_backward(&s, at(x), at(weight), at(gy), dx.buf ? at(dx) : NULL, dw.buf ? at(dw) : NULL,
                      db.buf ? at(db) : NULL);
}
