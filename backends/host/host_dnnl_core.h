/* host_dnnl_core.h — what the host backend's oneDNN entries share (host_dnnl_core.c): the
 * engine and the stream, a cache of primitives keyed by kind and bytes, each primitive's
 * operands with their reorders between clpar's layout and the primitive's, and the work
 * buffers the reorders and the primitives' scratch outputs use. Built with CLPAR_HAVE_DNNL. */
#ifndef CLPAR_HOST_DNNL_CORE_H
#define CLPAR_HOST_DNNL_CORE_H

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
  int kind;
  size_t key_len;
  unsigned char key[HD_KEY_BYTES];
  dnnl_primitive_t prim;
  hd_operand ops[HD_MAX_ARGS];
  int n_ops;
  int aux; /* the builder's own flag (the convolutions: x is read only in part) */
} hd_entry;

/* Fills a new entry of kind for key (e's kind and key are set): its primitive and operands. */
typedef clpar_status (*hd_build_fn)(const void *key, int kind, hd_entry *e);

clpar_status hd_fail(const char *what, dnnl_status_t st);
#define HD_TRY(what, call)                              \
  do {                                                  \
    dnnl_status_t st_ = (call);                         \
    if (st_ != dnnl_success) return hd_fail(what, st_); \
  } while (0)

/* One mutex over everything below; held while a primitive runs (the work buffers are shared
 * and a primitive with its own scratchpad must not run twice at once). */
void hd_lock(void);
void hd_unlock(void);
dnnl_engine_t hd_engine(void); /* made by hd_lookup */

/* The cached entry for (kind, key), made by build and put first when missing. Lock held. */
clpar_status hd_lookup(int kind, const void *key, size_t key_len, hd_build_fn build,
                       hd_entry **out);

/* Appends an operand: the primitive's layout for the query q (the user's for
 * dnnl_query_undef), and a reorder from (or to, for an output) user where they differ. */
clpar_status hd_add_operand(hd_entry *e, const_dnnl_primitive_desc_t pd, int arg, int out,
                            dnnl_query_t q, const dnnl_memory_desc_t *user);
/* Appends an output that lives in its work buffer only, in the primitive's layout for q. */
clpar_status hd_add_scratch(hd_entry *e, const_dnnl_primitive_desc_t pd, int arg, dnnl_query_t q);
/* Makes e's primitive from pd. */
clpar_status hd_make_prim(hd_entry *e, const_dnnl_primitive_desc_t pd);

/* Runs e on the user's pointers (one per operand, in the order they were added; scratch
 * ones are not read): inputs reordered into work buffers (operand 0 is there already when
 * have_first), the primitive, outputs reordered back. Lock held. */
clpar_status hd_run(const hd_entry *e, void *const *ptrs, int have_first);

/* n floats of 1 (*ones) and n floats of scratch (*temp), each kept until the next call that
 * asks for more, or the release. Lock held. */
clpar_status hd_ones(size_t n, float **ones);
clpar_status hd_temp(size_t n, float **temp);

/* The channel block of the layouts oneDNN's JIT kernels want on this CPU (16 with AVX-512,
 * else 8). */
int hd_channel_block(void);

#endif
