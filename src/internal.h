/* internal.h — what the core's files share and backends may use: error and log helpers,
 * the device, storage and tensor structs. Not installed. */
#ifndef CLPAR_INTERNAL_H
#define CLPAR_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "clpar/clpar.h"

#if defined(__GNUC__)
#define CLPAR_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLPAR_PRINTF(f, a)
#endif

/* Sets the thread-local error message and returns status, so that a failure path reads
 * `return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "add: a is [%s], b is [%s]", ...)`. */
clpar_status clpar_set_error(clpar_status status, const char *fmt, ...) CLPAR_PRINTF(2, 3);
/* Appends text to the current error message (a build log, say). */
void clpar_append_error(const char *fmt, ...) CLPAR_PRINTF(1, 2);

void clpar_log(clpar_log_level level, const char *fmt, ...) CLPAR_PRINTF(2, 3);
void clpar_log_init_from_env(void);

/* ---- devices and the caching allocator (src/registry.c, src/allocator.c) ---- */

typedef struct clpar_block clpar_block; /* a cached buffer */

struct clpar_device {
  clpar_backend_device bd; /* iface, ctx, info (with id) */
  int index;               /* in the selected list */
  pthread_mutex_t alloc_lock;
  clpar_block *free_blocks; /* sorted by size, ascending */
  clpar_memory_stats stats;
  uint64_t host_waits; /* atomic: reads back and synchronizations */
};

/* Gets a buffer of at least bytes from the device's cache or driver. */
clpar_status clpar_alloc_buffer(clpar_device *dev, size_t bytes, void **buf, size_t *capacity);
/* Returns a buffer to the device's cache. */
void clpar_free_buffer(clpar_device *dev, void *buf, size_t capacity);
void clpar_allocator_destroy(clpar_device *dev);

int clpar_is_initialized(void);
/* Called by the core when a backend entry fails: prefixes the message with the device id. */
clpar_status clpar_device_fail(const clpar_device *dev, clpar_status s);

/* ---- tensors (src/tensor.c) ---- */

typedef struct clpar_storage {
  int refcount; /* atomic */
  clpar_device *dev;
  void *buf;
  size_t capacity;  /* bytes */
  uint64_t version; /* bumped by every in-place write: replicas copy only what changed */
} clpar_storage;

/* Records an in-place change of t's memory. */
static inline void clpar_tensor_touch(clpar_tensor *t);

struct clpar_tensor {
  int refcount; /* atomic */
  clpar_storage *storage;
  size_t offset; /* in floats, into storage */
  int ndim;
  int64_t shape[CLPAR_MAX_DIMS];
  int64_t numel;
  clpar_scope *scope; /* the scope that holds the creation reference, or NULL */
  size_t scope_slot;  /* where in that scope */
  /* autograd (src/autograd.c) */
  int requires_grad;
  clpar_tensor *grad;      /* leaves only: the accumulated gradient, owned */
  struct clpar_node *node; /* the op that produced this tensor, or NULL for a leaf */
};

/* ---- autograd (src/autograd.c) ---- */

typedef struct clpar_node clpar_node;

/* Computes the gradients of the node's inputs from grad_out (the gradient of its output).
 * grad_in[i] is left NULL for an input that needs none; each one set is a new reference on
 * the input's device, with the input's shape. */
typedef clpar_status (*clpar_backward_fn)(clpar_node *node, clpar_tensor *grad_out,
                                          clpar_tensor **grad_in);

#define CLPAR_NODE_SAVED 3
struct clpar_node {
  int refcount; /* atomic; held by the output tensor (and views' nodes through inputs) */
  const char *op;
  clpar_backward_fn backward;
  int n_inputs;
  clpar_tensor **inputs;                 /* retained */
  clpar_tensor *saved[CLPAR_NODE_SAVED]; /* retained: tensors backward needs */
  float fparam[4];
  int64_t iparam[4];
  void *ctx; /* an op's own context (DataParallel's replicate node: its statistics) */
  /* backward bookkeeping */
  clpar_device *dev;  /* where the output lives: backward runs there */
  clpar_tensor *grad; /* the output's gradient being accumulated */
  int pending;        /* consumers that have not delivered their gradient yet */
  uint64_t visit;
};

void clpar_node_release(clpar_node *node);
/* True when a result of an op with these inputs must record a node. */
int clpar_needs_grad(clpar_tensor *const *inputs, int n);
/* Attaches a new node to result (which then requires a gradient), retaining the inputs.
 * Returns NULL (and sets the error) when out of memory; result is then left a leaf. */
clpar_node *clpar_record(clpar_tensor *result, const char *op, clpar_backward_fn backward,
                         clpar_tensor *const *inputs, int n);
/* The usual way an op records: when an input needs a gradient, attaches a node to result and
 * gives it in *node (NULL otherwise; node may be NULL). Out of memory frees result. */
clpar_status clpar_record_op(clpar_tensor *result, const char *op, clpar_backward_fn backward,
                             clpar_tensor *const *inputs, int n, clpar_node **node);
/* A view of t's memory, t's shape, with no node: for saving an op's output in its node
 * without a reference cycle. */
clpar_status clpar_tensor_alias(const clpar_tensor *t, clpar_tensor **out);
/* Moves a leaf tensor's memory (and its grad) to dev in place: the tensor object stays the
 * same, as PyTorch's module.to() keeps parameter objects. */
clpar_status clpar_tensor_move(clpar_tensor *t, clpar_device *dev);
/* The tensor created (like every tensor) in the current scope is taken out of it. */
void clpar_tensor_unscope(clpar_tensor *t);

static inline void clpar_tensor_touch(clpar_tensor *t) {
  __atomic_add_fetch(&t->storage->version, 1, __ATOMIC_RELAXED);
}

/* ---- modules (src/nn/module.c), for the parallel wrappers ---- */

typedef struct {
  char *name;
  void *item; /* clpar_module * or clpar_tensor * */
} clpar_named;

struct clpar_module {
  char *type;
  clpar_forward_fn forward;
  void *user;
  void (*free_user)(void *);
  clpar_named *children, *params;
  int n_children, n_params;
  /* the flattened parameter list of parameter_at, rebuilt when the tree changed */
  clpar_named *flat;
  int n_flat;
  uint64_t flat_generation;
  /* DataParallel: the wrapper's state, and the hook that frees it */
  void *parallel;
};

/* Drops a reference taken with clpar_tensor_retain (by a node, an optimizer, a module),
 * leaving any scope alone; clpar_tensor_free drops the creation reference, which a scope may
 * hold. Internal holders must use this one: a scope's reference is not theirs to take. */
void clpar_tensor_release(clpar_tensor *t);

/* A new contiguous tensor with uninitialized contents, registered with the current scope. */
clpar_status clpar_tensor_empty(clpar_device *dev, int ndim, const int64_t *shape,
                                clpar_tensor **out);
static inline clpar_bref clpar_tensor_bref(const clpar_tensor *t) {
  clpar_bref r = {t->storage->buf, t->offset};
  return r;
}
static inline const clpar_backend_iface *clpar_tensor_iface(const clpar_tensor *t) {
  return t->storage->dev->bd.iface;
}
static inline void *clpar_tensor_ctx(const clpar_tensor *t) {
  return t->storage->dev->bd.ctx;
}
/* rows = dim 0 (1 for a 0-d tensor), cols = numel / rows */
int64_t clpar_tensor_rows_of(const clpar_tensor *t);
/* Validates a shape for creation; sets the error naming fn. */
clpar_status clpar_check_shape(const char *fn, int ndim, const int64_t *shape, int64_t *numel);
/* Registers a new tensor with the innermost scope of this thread, if any. */
void clpar_scope_adopt(clpar_tensor *t);
void clpar_scope_forget(clpar_tensor *t);

/* Counter-based generator shared by every backend: the value for (seed, index). */
float clpar_rng_uniform01(uint64_t seed, uint64_t index);

#endif
