/* dnnl_prim.c — oneDNN primitives as clpar's backends keep and run them (dnnl_prim.h): the
 * per-engine cache, the operands and their reorders, and the run of an entry, with its memory
 * made by the backend. Nothing here knows whether the engine is a CPU or an OpenCL device.
 *
 * Making a primitive costs milliseconds, so each is kept (with its reorders) in a cache keyed
 * by its kind and the bytes of its key (the shape and the options), most recently used first,
 * at most HD_CACHE_MAX of them. */
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl_debug.h>

#include "dnnl_prim.h"

clpar_status hd_fail(const char *what, dnnl_status_t st) {
  return clpar_set_error(CLPAR_ERROR_BACKEND, "oneDNN %s failed: %s", what, dnnl_status2str(st));
}

static void entry_free(hd_entry *e) {
  if (!e) return;
  if (e->prim) dnnl_primitive_destroy(e->prim);
  for (int i = 0; i < e->n_ops; i++)
    if (e->ops[i].reorder) dnnl_primitive_destroy(e->ops[i].reorder);
  free(e);
}

void hd_cache_clear(hd_cache *c) {
  while (c->head) {
    hd_entry *e = c->head;
    c->head = e->next;
    entry_free(e);
  }
  c->len = 0;
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
  if (!op) return clpar_set_error(CLPAR_ERROR_BACKEND, "oneDNN: too many operands");
  op->arg = arg;
  op->out = out;
  op->user = *user;
  op->inner = q == dnnl_query_undef ? *user : *dnnl_primitive_desc_query_md(pd, q, 0);
  if (dnnl_memory_desc_equal(&op->user, &op->inner)) return CLPAR_OK;
  const dnnl_memory_desc_t *from = out ? &op->inner : &op->user, *to = out ? &op->user : &op->inner;
  dnnl_primitive_desc_t rpd = NULL;
  HD_TRY("reorder_primitive_desc_create",
         dnnl_reorder_primitive_desc_create(&rpd, from, e->engine, to, e->engine, NULL));
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
  if (!op) return clpar_set_error(CLPAR_ERROR_BACKEND, "oneDNN: too many operands");
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

/* Moves e to the front of c; drops the last entry past HD_CACHE_MAX. pp: where e is linked
 * now, NULL for a new entry. */
static void put_first(hd_cache *c, hd_entry **pp, hd_entry *e) {
  if (pp) *pp = e->next; /* unlinked from where it was */
  e->next = c->head;
  c->head = e;
  if (pp || ++c->len <= HD_CACHE_MAX) return;
  hd_entry **last = &c->head;
  while ((*last)->next) last = &(*last)->next;
  entry_free(*last);
  *last = NULL;
  c->len--;
}

clpar_status hd_cache_lookup(hd_cache *c, dnnl_engine_t engine, int kind, const void *key,
                             size_t key_len, hd_build_fn build, hd_entry **out) {
  if (key_len > HD_KEY_BYTES)
    return clpar_set_error(CLPAR_ERROR_BACKEND, "oneDNN: a key of %zu bytes", key_len);
  hd_entry **pp = &c->head;
  for (hd_entry *e = c->head; e; pp = &e->next, e = e->next)
    if (e->kind == kind && e->key_len == key_len && memcmp(e->key, key, key_len) == 0) {
      put_first(c, pp, e);
      *out = e;
      return CLPAR_OK;
    }
  hd_entry *e = calloc(1, sizeof *e);
  if (!e) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "oneDNN: out of host memory");
  e->engine = engine;
  e->kind = kind;
  e->key_len = key_len;
  memcpy(e->key, key, key_len);
  clpar_status st = build(key, kind, e);
  if (st != CLPAR_OK) {
    entry_free(e);
    return st;
  }
  put_first(c, NULL, e);
  *out = e;
  return CLPAR_OK;
}

/* Executes p on io's stream (a reorder from `from` to `to` when args is NULL). */
static clpar_status execute(hd_io *io, dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args,
                            dnnl_memory_t from, dnnl_memory_t to, const char *what) {
  dnnl_exec_arg_t two[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  dnnl_status_t ds = dnnl_primitive_execute(p, io->stream, args ? n : 2, args ? args : two);
  if (ds == dnnl_success && io->wait) ds = dnnl_stream_wait(io->stream);
  return ds == dnnl_success ? CLPAR_OK : hd_fail(what, ds);
}

/* Makes the memory objects of e's run: um[i] over the user's handle (none for a scratch
 * operand), wm[i] over work buffer i (reordered and scratch operands only). */
static clpar_status make_memory(const hd_entry *e, hd_io *io, void *const *handles,
                                dnnl_memory_t *um, dnnl_memory_t *wm) {
  clpar_status st = CLPAR_OK;
  for (int i = 0; st == CLPAR_OK && i < e->n_ops; i++) {
    const hd_operand *op = &e->ops[i];
    if (!op->scratch) st = io->user(io, &op->user, handles[i], &um[i]);
    if (st == CLPAR_OK && (op->reorder || op->scratch)) st = io->work(io, i, &op->inner, &wm[i]);
  }
  return st;
}

clpar_status hd_exec(const hd_entry *e, hd_io *io, void *const *handles, int have_first) {
  dnnl_memory_t um[HD_MAX_ARGS] = {0}, wm[HD_MAX_ARGS] = {0};
  clpar_status st = make_memory(e, io, handles, um, wm);
  for (int i = 0; st == CLPAR_OK && i < e->n_ops; i++) {
    const hd_operand *op = &e->ops[i];
    if (op->reorder && !op->out && !(i == 0 && have_first))
      st = execute(io, op->reorder, 0, NULL, um[i], wm[i], "reorder");
  }
  if (st == CLPAR_OK) {
    dnnl_exec_arg_t args[HD_MAX_ARGS];
    for (int i = 0; i < e->n_ops; i++) {
      args[i].arg = e->ops[i].arg;
      args[i].memory = wm[i] ? wm[i] : um[i];
    }
    st = execute(io, e->prim, e->n_ops, args, NULL, NULL, "primitive_execute");
  }
  for (int i = 0; st == CLPAR_OK && i < e->n_ops; i++)
    if (e->ops[i].reorder && e->ops[i].out)
      st = execute(io, e->ops[i].reorder, 0, NULL, wm[i], um[i], "reorder");
  for (int i = 0; i < e->n_ops; i++) {
    if (um[i]) dnnl_memory_destroy(um[i]);
    if (wm[i]) dnnl_memory_destroy(wm[i]);
  }
  return st;
}
