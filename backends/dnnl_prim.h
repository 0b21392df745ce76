/* dnnl_prim.h — oneDNN primitives as clpar's backends keep and run them, whatever the engine
 * (dnnl_prim.c): a cache of primitives keyed by kind and bytes, each primitive's operands
 * with their reorders between clpar's layout and the primitive's, and the run of an entry
 * through memory objects its backend makes (hd_io). The host backend (backends/host) runs them
 * on oneDNN's CPU engine; the OpenCL backend (backends/opencl/ocl_dnnl.c) on an engine made
 * from its own context. Built with CLPAR_HAVE_DNNL. */
#ifndef CLPAR_DNNL_PRIM_H
#define CLPAR_DNNL_PRIM_H

#include <oneapi/dnnl/dnnl.h>

#include "backend.h"

#define HD_MAX_ARGS 9
#define HD_KEY_BYTES 160

/* The kinds of cached primitive, one list for every file (a key is compared only within its
 * kind). */
enum {
  HD_CONV_FWD,
  HD_CONV_BWD_DATA,
  HD_CONV_BWD_WEIGHTS,
  HD_BN_STATS,
  HD_BN_APPLY,
  HD_BN_SUMS,
  HD_BN_BWD,
  HD_BN_BWD_EVAL,
  HD_AVGPOOL_FWD,
  HD_AVGPOOL_BWD
};

/* One operand: its DNNL_ARG_*, whether the primitive writes it, whether it lives only in its
 * work buffer (scratch: an output nobody reads), clpar's layout (user) and the primitive's
 * (inner), and the reorder between them (NULL when they are the same layout). */
typedef struct {
  int arg, out, scratch;
  dnnl_memory_desc_t user, inner;
  dnnl_primitive_t reorder;
} hd_operand;

typedef struct hd_entry {
  struct hd_entry *next;
  dnnl_engine_t engine; /* the cache's: what the builder makes the primitive for */
  int kind;
  size_t key_len;
  unsigned char key[HD_KEY_BYTES];
  dnnl_primitive_t prim;
  hd_operand ops[HD_MAX_ARGS];
  int n_ops;
  int aux; /* the builder's own flag (the convolutions: x is read only in part) */
} hd_entry;

/* Entries most recently used first, at most HD_CACHE_MAX of them, for one engine. The owner
 * serializes every call on it. */
#define HD_CACHE_MAX 256 /* ResNet-50 needs about 120 */
typedef struct {
  hd_entry *head;
  int len;
} hd_cache;

/* Fills a new entry of kind for key (e's engine, kind and key are set): its primitive and
 * operands. */
typedef clpar_status (*hd_build_fn)(const void *key, int kind, hd_entry *e);

clpar_status hd_fail(const char *what, dnnl_status_t st);
#define HD_TRY(what, call)                              \
  do {                                                  \
    dnnl_status_t st_ = (call);                         \
    if (st_ != dnnl_success) return hd_fail(what, st_); \
  } while (0)

/* The entry of c for (kind, key), made for engine by build and put first when missing. */
clpar_status hd_cache_lookup(hd_cache *c, dnnl_engine_t engine, int kind, const void *key,
                             size_t key_len, hd_build_fn build, hd_entry **out);
/* Frees every entry of c. */
void hd_cache_clear(hd_cache *c);

/* Appends an operand: the primitive's layout for the query q (the user's for
 * dnnl_query_undef), and a reorder from (or to, for an output) user where they differ. */
clpar_status hd_add_operand(hd_entry *e, const_dnnl_primitive_desc_t pd, int arg, int out,
                            dnnl_query_t q, const dnnl_memory_desc_t *user);
/* Appends an output that lives in its work buffer only, in the primitive's layout for q. */
clpar_status hd_add_scratch(hd_entry *e, const_dnnl_primitive_desc_t pd, int arg, dnnl_query_t q);
/* Makes e's primitive from pd. */
clpar_status hd_make_prim(hd_entry *e, const_dnnl_primitive_desc_t pd);

/* A backend's engine, stream and cache, and how it gives an entry its memory: a memory
 * object of layout md over the user's handle (a pointer, a cl_mem view...), over work buffer i
 * (at least md's size), and bytes of zeros written at a user's handle; all on stream. wait:
 * whether each execution is waited for (the host), or left to the stream's order (an in-order
 * OpenCL queue). */
typedef struct hd_io {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  hd_cache *cache;
  int wait;
  void *ctx;
  clpar_status (*user)(struct hd_io *io, const dnnl_memory_desc_t *md, void *handle,
                       dnnl_memory_t *m);
  clpar_status (*work)(struct hd_io *io, int i, const dnnl_memory_desc_t *md, dnnl_memory_t *m);
  clpar_status (*zero)(struct hd_io *io, void *handle, size_t bytes);
} hd_io;

/* Runs e on the user's handles (one per operand, in the order they were added; scratch ones
 * are not read): inputs reordered into work buffers (operand 0 is there already when
 * have_first), the primitive, outputs reordered back. Nothing is written to an output's
 * handle before every memory object of the run is made. */
clpar_status hd_exec(const hd_entry *e, hd_io *io, void *const *handles, int have_first);

#endif
