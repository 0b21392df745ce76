/* internal.h — what the layers above the runtime (tensor, autograd, ops, nn, parallel, dist,
 * io) share: the tensor, node and module structs and their helpers, over the runtime's own
 * header (runtime/runtime.h). Not installed. */
#ifndef CLPAR_INTERNAL_H
#define CLPAR_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "clpar/clpar.h"
#include "runtime/runtime.h"

/* ---- transfers of tensors (src/tensor.c) ---- */

/* clpar_tensor_to in two halves over clpar_transfer_begin/finish (src/tensor.c): begin posts
 * the source's read now, finish makes the copy on dev (one autograd node, as clpar_tensor_to)
 * when it is needed; either ends the move, and cancel drops one unfinished. */
typedef struct clpar_tensor_transit clpar_tensor_transit;
clpar_status clpar_tensor_to_begin(const clpar_tensor *t, clpar_device *dev,
                                   clpar_tensor_transit **out);
clpar_status clpar_tensor_to_finish(clpar_tensor_transit *m, clpar_tensor **out);
void clpar_tensor_to_cancel(clpar_tensor_transit *m);
/* Overwrites all of t's bytes (any dtype) with what fill produces (clpar_upload_fill). */
clpar_status clpar_tensor_write_fill(clpar_tensor *t, clpar_fill_fn fill, void *user);

/* ---- 16-bit floats (src/half.c, src/autocast.c) ---- */

/* x converted to dtype on x's device (float32 and the 16-bit types, either way), with no
 * node: the conversion clpar_to_dtype records. */
clpar_status clpar_convert_dtype(const clpar_tensor *x, clpar_dtype dtype, clpar_tensor **y);
/* clpar_copy of the elements in order, whatever the two shapes: same numel and dtype (both
 * tensors alive). For memory seen flat: gradients the engine accumulates, conversions. */
clpar_status clpar_copy_elements(clpar_tensor *dst, const clpar_tensor *src);
/* x converted into out (same numel, any float dtypes; a copy when they match), no node. */
clpar_status clpar_convert_into(const clpar_tensor *x, clpar_tensor *out);
/* acc += g for 16-bit acc and g of one shape (through float32; src/half.c). */
clpar_status clpar_half_add_into(clpar_tensor *acc, const clpar_tensor *g);
/* a + b for two 16-bit tensors of one dtype and shape: summed in float32 and rounded to their
 * dtype, into a new tensor (outside any scope, no node). */
clpar_status clpar_half_add(const clpar_tensor *a, const clpar_tensor *b, clpar_tensor **out);
/* clpar_check_float that also lets a 16-bit t through inside an autocast region; outside, its
 * error says how to pass one. */
clpar_status clpar_check_float_autocast(const char *fn, const char *name, const clpar_tensor *t);
/* 1 when t is 16-bit and an autocast region is open: an op that runs in float32 (a loss)
 * takes clpar_to_dtype(t, CLPAR_FLOAT32) instead. */
int clpar_autocast_widens(const clpar_tensor *t);
/* clpar_matmul inside an autocast region (src/autocast.c). */
clpar_status clpar_autocast_matmul(const clpar_tensor *a, const clpar_tensor *b, int trans_a,
                                   int trans_b, clpar_tensor **out);
/* a op b (op one of clpar_add, clpar_sub, clpar_mul, clpar_div) inside an autocast region
 * when a or b is 16-bit: both widened to float32 by clpar_to_dtype (so gradients go back in
 * their dtypes), op in float32, the result rounded to the inputs' dtype when they share one
 * (PyTorch's type promotion: bfloat16 + bfloat16 is bfloat16, bfloat16 + float32 float32). */
clpar_status clpar_autocast_binary(clpar_status (*op)(const clpar_tensor *, const clpar_tensor *,
                                                      clpar_tensor **),
                                   const clpar_tensor *a, const clpar_tensor *b,
                                   clpar_tensor **out);
/* 1 when x (alive and not NULL) is 16-bit inside an autocast region: ops that run in float32
 * then widen x with clpar_autocast_widen, run on that, and round with clpar_autocast_round. */
int clpar_autocast_takes(const char *fn, const clpar_tensor *x);
/* x as float32 through clpar_to_dtype (its gradient goes back in x's dtype). */
clpar_status clpar_autocast_widen(const clpar_tensor *x, clpar_tensor **x32);
/* Given s, the status of the float32 op that made y32 from x32: *out = y32 rounded to dtype
 * (recorded), then y32 and x32 dropped (the graph holds them); s or the rounding's status. */
clpar_status clpar_autocast_round(clpar_status s, clpar_tensor *x32, clpar_tensor *y32,
                                  clpar_dtype dtype, clpar_tensor **out);
/* clpar_conv2d inside an autocast region (src/autocast.c). */
clpar_status clpar_autocast_conv2d(const clpar_tensor *x, const clpar_tensor *weight,
                                   const clpar_tensor *bias, const clpar_conv2d_options *options,
                                   clpar_tensor **out);
/* The float32 gradients of clpar_conv2d(x, weight, bias, options) for gy that want[] asks
 * for (dx, dw, db) into gin[0..2], NULL where not asked; no node (src/nn/conv.c). */
clpar_status clpar_conv2d_grads(const clpar_tensor *x, const clpar_tensor *weight,
                                const clpar_conv2d_options *options, const clpar_tensor *gy,
                                const int want[3], clpar_tensor **gin);
/* *c = op(a) op(b) in float32 (new, outside any scope, no node), op(a) [m, k], op(b) [k, n],
 * through dev's gemm_half when a and b are 16-bit of one dtype and dev has it: then *done = 1.
 * Otherwise *done = 0 and the caller widens them and calls gemm (src/autocast_gemm.c). */
clpar_status clpar_autocast_gemm_half(clpar_device *dev, int ta, int tb, int64_t m, int64_t n,
                                      int64_t k, const clpar_tensor *a, const clpar_tensor *b,
                                      clpar_tensor **c, int *done);
/* clpar_linear_act inside an autocast region, its arguments checked (src/autocast.c). */
clpar_status clpar_autocast_linear(const clpar_tensor *x, const clpar_tensor *weight,
                                   const clpar_tensor *bias, clpar_act_kind act,
                                   clpar_tensor **out);

/* ---- tensors (src/tensor.c) ---- */

/* CLPAR_ERROR_INVALID_ARGUMENT naming fn when t was freed (reliable under CLPAR_DEBUG=1, see
 * src/debug.c), CLPAR_ERROR_NOT_INITIALIZED when t outlived clpar_shutdown. */
clpar_status clpar_check_alive(const char *fn, const clpar_tensor *t);

/* ---- CLPAR_DEBUG and the live-tensor watch (src/debug.c) ---- */

/* t->magic of a tensor in use, and of one freed (poisoned before it is quarantined). */
#define CLPAR_TENSOR_LIVE 0x7e45011eu
#define CLPAR_TENSOR_FREED 0xdeadf7eeu
/* Reads CLPAR_DEBUG at clpar_init: unset, empty or "0" off, "1" on, anything else an error. */
clpar_status clpar_debug_init_from_env(void);
int clpar_debug_enabled(void);
/* Takes over a tensor struct whose last reference went: poisons it, then frees it, or, under
 * CLPAR_DEBUG=1, keeps it (up to a bound) so that a later use is recognized. */
void clpar_debug_discard(clpar_tensor *t);
/* The error for a use of a freed tensor by fn. */
clpar_status clpar_debug_freed_error(const char *fn, const clpar_tensor *t);
/* Frees the quarantine and turns debug mode off (clpar_shutdown). */
void clpar_debug_shutdown(void);
/* Live tensor structs, counted as they are made and discarded. */
void clpar_debug_tensor_made(void);
int64_t clpar_debug_live_tensors(void);
/* One training step of an optimizer: compares the live-tensor count with the one at that
 * optimizer's previous step (*last, *streak its state) and warns once per clpar_init when it
 * grew at each of CLPAR_LEAK_STEPS steps in a row. */
#define CLPAR_LEAK_STEPS 10
void clpar_debug_step(int64_t *last, int *streak);
/* Nonzero while this thread's clpar_scope_end releases its tensors. */
int clpar_scope_ending(void);

/* Records an in-place change of t's memory. */
static inline void clpar_tensor_touch(clpar_tensor *t);

/* Offsets (t->offset, clpar_bref.off, partial_offset, view_at) count 4-byte words whatever
 * the dtype, so that every backend entry keeps its float-element offsets: an int64 element is
 * two words, and an int64 tensor's offset is always even (its views start at whole elements).
 * Bytes are words * 4. A 16-bit element (bfloat16, float16) is half a word: such a tensor
 * starts at a whole word (its views start at even elements, src/tensor.c) and its storage is
 * rounded up to whole words. */
#define CLPAR_WORD_BYTES 4
static inline size_t clpar_dtype_words(clpar_dtype d) {
  return d == CLPAR_INT64 ? 2 : 1;
}
/* 1 for the 16-bit float dtypes (storage only: src/half.c converts them). */
static inline int clpar_dtype_is_half(clpar_dtype d) {
  return d == CLPAR_BFLOAT16 || d == CLPAR_FLOAT16;
}

struct clpar_tensor {
  uint32_t magic;     /* CLPAR_TENSOR_LIVE; CLPAR_TENSOR_FREED once freed */
  uint32_t freed_how; /* freed: 1 by a clpar_scope_end, 0 otherwise */
  int refcount;       /* atomic */
  clpar_storage *storage;
  size_t offset; /* in 4-byte words (floats), into storage */
  clpar_dtype dtype;
  int ndim;
  int64_t shape[CLPAR_MAX_DIMS];
  int64_t numel;
  clpar_scope *scope; /* the scope that holds the creation reference, or NULL */
  size_t scope_slot;  /* where in that scope */
  /* autograd (src/autograd.c) */
  int requires_grad;
  clpar_tensor *grad; /* leaves only: the accumulated gradient, owned */
  int grad_defined;   /* 0 while grad is memory set aside (zeros) that no backward filled */
  int grad_stale; /* atomic, 1: a zero_grad left grad's memory as it was (clpar_grads_set_stale):
                   * the next gradient written there replaces it instead of adding */
  clpar_tensor *flat;      /* a flattened parameter: the group's flat leaf (clpar_module_flatten),
                            * retained; its storage is the parameter's, its grad the grad's */
  int flat_members;        /* a flat leaf: the parameters that are views of it (atomic) */
  struct clpar_node *node; /* the op that produced this tensor, or NULL for a leaf */
  /* leaves: gradients still to come in the running backward, the hooks to run when none is
   * left, and the backward that holds the leaf */
  int grad_pending;
  int claimed; /* atomic */
  struct clpar_grad_hook *hooks;
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
  void *ctx; /* an op's own context, released with ctx_free (may be NULL) */
  void (*ctx_free)(void *ctx);
  /* >= 0: the node's output is a slice of its one input starting at this element, and its
   * backward's gradient is added into that slice of the input's gradient (views, scatter) */
  int64_t partial_offset;
  int transfer;     /* backward copies between devices: run after the nodes that compute */
  unsigned slotted; /* bit i: this backward added input i's gradient into its slot itself */
  /* backward bookkeeping */
  clpar_device *dev;  /* where the output lives */
  clpar_tensor *grad; /* the output's gradient being accumulated */
  int pending;        /* consumers that have not delivered their gradient yet */
  int claimed;        /* atomic: a backward is running through the node */
};

/* For a backward function: where input i (< 32) of n accumulates its gradient, when the
 * backward may add its share there itself (acc += grad, e.g. a GEMM with beta 1) instead of
 * returning it in grad_in[i]: a leaf's grad memory once it has some (a flat group's slice
 * included), or the slice of the base's gradient that a view (a partial node, whose backward
 * passes the gradient through) stands for. *slot is then a new view of that memory with the
 * input's shape, outside any scope, and grad_in[i] must stay NULL; otherwise *slot is NULL
 * and the gradient goes through grad_in[i] as usual. (src/autograd.c) */
clpar_status clpar_grad_slot(clpar_node *n, int i, clpar_tensor **slot);
/* clpar_grad_slot for a backward that can also write its share without adding (a GEMM with
 * beta 0): *replace is 1 when the slot's memory holds no gradient (a leaf's stale grad), which
 * the backward must then overwrite; else 0 and it adds as clpar_grad_slot's caller does. */
clpar_status clpar_grad_slot_replace(clpar_node *n, int i, clpar_tensor **slot, int *replace);
/* zero_grad of leaf t without the fill (PyTorch's set_to_none, the memory kept): t's grad
 * memory stays as it is, marked stale, so that the next gradient written there replaces it
 * (a copy, a GEMM with beta 0; a write into part of it zeroes it first), and t has no
 * gradient until then (clpar_tensor_grad gives NULL). Not where a graph is alive: a replay's
 * recorded adds would find the old values (clpar_graph_any_live). (src/autograd.c) */
void clpar_grad_set_stale(clpar_tensor *t);

/* clpar_linear followed by an activation (none, relu, sigmoid, tanh) as one node: a GEMM and
 * a fused bias-and-activation kernel forward, gradients straight into their slots backward;
 * errors name clpar_linear (src/nn/functional.c). Sequential runs a Linear followed by a ReLU
 * through it. */
clpar_status clpar_linear_act(const clpar_tensor *x, const clpar_tensor *weight,
                              const clpar_tensor *bias, clpar_act_kind act, clpar_tensor **out);

/* Runs when a leaf's gradient is final in a backward (src/autograd.c). */
typedef struct clpar_grad_hook {
  clpar_grad_hook_fn fn;
  void *user;
  struct clpar_grad_hook *next;
} clpar_grad_hook;
/* 1 when the leaf has a gradient a backward delivered (directly, or to its flat group). */
int clpar_tensor_has_grad(const clpar_tensor *t);

void clpar_node_release(clpar_node *node);
/* Backpropagates from root (any shape), whose gradient is grad (not taken over), as
 * torch.autograd.backward(root, grad): the recompute of activation checkpointing. grad must
 * have root's shape and device (else CLPAR_ERROR_SHAPE_MISMATCH, CLPAR_ERROR_DEVICE_MISMATCH)
 * and is taken in root's dtype: converted from another float or int dtype. */
clpar_status clpar_backward_grad(clpar_tensor *root, const clpar_tensor *grad);
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
/* A unary entry's op (activation.c): the result of clpar_dev_unary, with a node that keeps x
 * and, except for relu, an alias of the output; backward NULL is the unary_backward entry. */
clpar_status clpar_unary_op(const char *fn, clpar_unary_kind kind, const clpar_tensor *x,
                            clpar_backward_fn backward, clpar_tensor **out);
/* clpar_record_op, then what an op with a context or saved tensors does next: a node made
 * takes ctx (malloc'ed, freed with free; may be NULL) and saved[0..n_saved) as its
 * saved[0..n_saved) (out of the scope); without a node they are freed. *out = result on
 * success; *node (node may be NULL) the node or NULL. */
clpar_status clpar_record_op_keep(clpar_tensor *result, const char *op, clpar_backward_fn backward,
                                  clpar_tensor *const *inputs, int n, void *ctx,
                                  clpar_tensor *const *saved, int n_saved, clpar_node **node,
                                  clpar_tensor **out);
/* A view of t's memory, t's shape, with no node: for saving an op's output in its node
 * without a reference cycle. */
clpar_status clpar_tensor_alias(const clpar_tensor *t, clpar_tensor **out);
/* Moves a leaf tensor's memory (and its grad) to dev in place: the tensor object stays the
 * same, as PyTorch's module.to() keeps parameter objects. */
clpar_status clpar_tensor_move(clpar_tensor *t, clpar_device *dev);
/* The tensor created (like every tensor) in the current scope is taken out of it. */
void clpar_tensor_unscope(clpar_tensor *t);
/* A view of t's memory at word offset (from t's start) with another shape (numel within
 * t), t's dtype, no node, outside any scope. */
clpar_status clpar_tensor_view_at(const clpar_tensor *t, size_t offset, int ndim,
                                  const int64_t *shape, clpar_tensor **out);
/* Makes t a view of st at element offset (the storage it held is released). */
void clpar_tensor_repoint(clpar_tensor *t, clpar_storage *st, size_t offset);

/* The flat groups (clpar_module_flatten) that ts[0..n) cover whole, each tensor given at most
 * once (src/nn/flat_groups.c): the groups' leaves in leaves[0..return value), and group_of[i] the
 * group of ts[i] when ts[i] is a member in place (a view of the leaf's memory, its grad the
 * same slice of the leaf's grad) of a group all of whose members are among ts, else -1.
 * group_of, leaves and counts (scratch) hold n entries each. Cannot fail. */
int clpar_flat_whole_groups(clpar_tensor *const *ts, int n, int *group_of, clpar_tensor **leaves,
                            int *counts);
/* Zeroes the gradients of ts[0..n) (each given once): one fill over a flat group's gradient
 * when every member of the group is among them, one fill per other tensor. group_of, leaves
 * and counts: scratch of n entries each (an optimizer's, so a step allocates nothing), or
 * NULL for the call to allocate its own. */
clpar_status clpar_zero_grads(const char *fn, clpar_tensor *const *ts, int n, int *group_of,
                              clpar_tensor **leaves, int *counts);

static inline void clpar_tensor_touch(clpar_tensor *t) {
  __atomic_add_fetch(&t->storage->version, 1, __ATOMIC_RELAXED);
}

/* ---- modules (src/nn/module.c), for the parallel wrappers ---- */

/* Drops one reference; the last one frees the module and drops its children's. */
void clpar_module_release(clpar_module *m);
/* What a function that takes ownership does with a module it cannot keep: the creator's
 * reference is dropped; a module that a parent holds is left to it. */
void clpar_module_drop_given(clpar_module *m);
/* The name under which the module whose forward runs self on this thread holds it as a child,
 * or NULL (self at the top, not its child, or nested too deep), for error messages. */
const char *clpar_module_running_name(const clpar_module *self);
/* The built-in modules' forwards (linear.c, relu.c): Sequential fuses a Linear followed by a
 * ReLU (sequential.c). */
clpar_status clpar_linear_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                  void *user);
clpar_status clpar_relu_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *user);
/* The seed of the next parameter's initialization (clpar_manual_seed's stream; src/nn/seed.c). */
uint64_t clpar_param_seed_next(void);
/* Adds "weight" (wshape, ndim dims) and, when bias, "bias" ([wshape[0]]) to m, uniform in
 * [-bound, bound) from the next seeds, as nn.Linear and nn.Conv2d initialize them
 * (src/nn/linear.c). */
clpar_status clpar_module_add_uniform_params(clpar_module *m, clpar_device *dev, int ndim,
                                             const int64_t *wshape, int bias, float bound);
/* The floats a convolution's column buffer may take per chunk of images (src/nn/conv.c;
 * 64 MiB): tests lower it to run the chunked path over several chunks. */
extern int64_t clpar_conv_chunk_floats;

typedef struct {
  char *name;
  void *item;    /* clpar_module * or clpar_tensor * */
  int is_buffer; /* in a module's flat state list: the tensor is a buffer */
} clpar_named;

/* A module tree's parameters, buffers, or state_dict entries (a module's parameters, then its
 * buffers, then its children's), each tensor once, under the first name met. */
typedef enum {
  CLPAR_LIST_PARAMS = 0,
  CLPAR_LIST_BUFFERS = 1,
  CLPAR_LIST_STATE = 2
} clpar_listing_kind;
typedef struct {
  clpar_named *items;
  int n;
  uint64_t generation;
  int names_lent;
} clpar_listing;

struct clpar_module {
  char *type;
  clpar_forward_fn forward;
  void *user;
  void (*free_user)(void *);
  clpar_named *children, *params, *buffers;
  int n_children, n_params, n_buffers;
  int training; /* clpar_module_train; 1 when made, as PyTorch's */
  /* references: one per place it is a child of, plus the creator's until a parent adopts it
   * (atomic); a module may be a child of several modules, or twice of one */
  int refs;
  int adopted;
  /* the flattened lists of parameter_at, buffer_at and state_at (clpar_listing_kind), each
   * rebuilt when some tree changed; names they lent out stay allocated until the module is
   * freed */
  clpar_listing lists[3];
  char **retired;
  int n_retired;
  /* DataParallel, Pipeline: the wrapper's state (its type says which; freed by free_user) */
  void *parallel;
  /* a DataParallel replica on another device than the wrapped module (src/parallel): its
   * buffers are overwritten from the module's before each forward, so what a forward writes
   * to them in place (BatchNorm2d's counter) is never seen */
  int replica;
};

/* Writes the formatted text (at most 511 bytes) in front of the thread's error message, as
 * context for a failure of something the caller ran. */
void clpar_prefix_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Called by clpar_module_forward before m's forward: inside the forward of a DataParallel
 * replica on another device, remembers a module that is not the replica's (src/parallel), so
 * that the error it causes says what is wrong. */
void clpar_data_parallel_note_forward(const clpar_module *m);

/* A module buffer's bytes and their byte offset in its storage: buffers are moved, copied
 * between replicas and broadcast as bytes, whatever their dtype (offsets count 4-byte words). */
static inline size_t clpar_tensor_nbytes(const clpar_tensor *t) {
  return (size_t)t->numel * clpar_dtype_size(t->dtype);
}
static inline size_t clpar_tensor_byte_offset(const clpar_tensor *t) {
  return t->offset * CLPAR_WORD_BYTES;
}

/* The parameter entries of m's tree counted at every place they appear (as a walk of params
 * and children meets them), up to INT_MAX; more than clpar_module_parameter_count when a
 * parameter, or a submodule with parameters, is shared. */
int clpar_module_entry_count(const clpar_module *m);

/* Drops a reference taken with clpar_tensor_retain (by a node, an optimizer, a module),
 * leaving any scope alone; clpar_tensor_free drops the creation reference, which a scope may
 * hold. Internal holders must use this one: a scope's reference is not theirs to take. */
void clpar_tensor_release(clpar_tensor *t);

/* A new contiguous float32 tensor with uninitialized contents, registered with the current
 * scope; _dtype: of any dtype. */
clpar_status clpar_tensor_empty(clpar_device *dev, int ndim, const int64_t *shape,
                                clpar_tensor **out);
clpar_status clpar_tensor_empty_dtype(clpar_device *dev, clpar_dtype dtype, int ndim,
                                      const int64_t *shape, clpar_tensor **out);
/* The one check every float op makes of its tensor inputs: CLPAR_ERROR_DTYPE naming fn, the
 * argument's name and its dtype unless t is float32 (t must not be NULL). */
clpar_status clpar_check_float(const char *fn, const char *name, const clpar_tensor *t);
/* An options field (status.h's convention) whose PyTorch default is def: 0 gives def,
 * CLPAR_ZERO gives 0, anything else itself. */
static inline float clpar_opt_float(float v, float def) {
  return v == CLPAR_ZERO ? 0.0f : v == 0.0f ? def : v;
}
/* Bytes of t's elements, and the words (4 bytes) they occupy (a 16-bit tensor of odd numel
 * rounded up). */
static inline size_t clpar_tensor_bytes(const clpar_tensor *t) {
  return (size_t)t->numel * clpar_dtype_size(t->dtype);
}
static inline size_t clpar_tensor_words(const clpar_tensor *t) {
  return (clpar_tensor_bytes(t) + CLPAR_WORD_BYTES - 1) / CLPAR_WORD_BYTES;
}
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
/* clpar_check_shape, and that one buffer of that many floats fits dev (CLPAR_ERROR_TOO_LARGE
 * naming fn otherwise): for callers that would do work (fill host memory) before allocating. */
clpar_status clpar_check_size(const char *fn, const clpar_device *dev, int ndim,
                              const int64_t *shape, int64_t *numel);
/* Registers a new tensor with the innermost scope of this thread, if any. */
void clpar_scope_adopt(clpar_tensor *t);
void clpar_scope_forget(clpar_tensor *t);

/* Rows split in proportion to n (1..64) weights, each > 0 and finite: the floor of each exact
 * share, then one more row each to the largest remainders (ties to the first). The sizes add
 * up to rows exactly, with no overflow even for INT64_MAX rows (src/ops.c). */
void clpar_weighted_sizes(int64_t rows, const float *weights, int n, int64_t *sizes);

/* Counter-based generator shared by every backend: the value for (seed, index). */
float clpar_rng_uniform01(uint64_t seed, uint64_t index);
/* The (seed, offset) of a random op in a module's forward (Dropout): seed and *counter, which
 * advances by n; inside activation checkpointing the forward's draws are recorded and its
 * recompute replays them, so it sees the same masks (src/nn/recompute.c). */
void clpar_rng_draw(uint64_t seed, uint64_t *counter, uint64_t n, uint64_t *seed_out,
                    uint64_t *offset_out);
/* 1 when this thread's last clpar_rng_draw replayed a recorded draw (a recompute's). */
int clpar_rng_draw_replayed(void);
/* The same tape for another recompute (ZeRO-3's units, src/dist/zero3.c): start records this
 * thread's draws into t (replay 0; t emptied first; inside a replay, the replayed draws) or
 * replays them (1), keeping the outer state in saved; stop restores it and returns 0 when
 * recording kept every draw, or the replay used exactly the draws recorded. */
typedef struct clpar_rng_tape clpar_rng_tape;
clpar_rng_tape *clpar_rng_tape_new(void);
void clpar_rng_tape_free(clpar_rng_tape *t);
void clpar_rng_tape_start(clpar_rng_tape *t, int replay, clpar_rng_tape *saved[2]);
int clpar_rng_tape_stop(clpar_rng_tape *t, int replay, clpar_rng_tape *const saved[2]);

/* The parameter generator's state (clpar_manual_seed), for training checkpoints. */
void clpar_rng_state_get(uint64_t *seed, uint64_t *counter);
void clpar_rng_state_set(uint64_t seed, uint64_t counter);

/* An optimizer's state, for training checkpoints (src/optim.c): "SGD", "Adam" or "AdamW"; the
 * parameters in creation order; state k of parameter i (SGD: 0 the momentum buffer; Adam: 0
 * and 1 the moments), NULL until the first step makes it. restore takes s0 and s1 (unscoped,
 * on the parameter's device, or NULL) and frees the state they replace. */
const char *clpar_optimizer_kind(const clpar_optimizer *o);
int clpar_optimizer_size(const clpar_optimizer *o);
clpar_tensor *clpar_optimizer_param_at(const clpar_optimizer *o, int i);
clpar_tensor *clpar_optimizer_state_at(const clpar_optimizer *o, int i, int k);
int64_t clpar_optimizer_steps_at(const clpar_optimizer *o, int i);
/* options and set_options: those of parameter group 0. */
void clpar_optimizer_options(const clpar_optimizer *o, clpar_sgd_options *sgd,
                             clpar_adam_options *adam);
void clpar_optimizer_restore(clpar_optimizer *o, int i, clpar_tensor *s0, clpar_tensor *s1,
                             int64_t steps);
/* clpar_checkpoint_save with n_extra more metadata pairs (src/amp_checkpoint.c: the loss
 * scaler's state). */
clpar_status clpar_checkpoint_save_meta(const char *path, const clpar_module *m,
                                        const clpar_optimizer *opt, int64_t step, int64_t epoch,
                                        const char *const *keys, const char *const *values,
                                        int n_extra);
/* Checks the options for o's kind and, when apply, sets them. */
clpar_status clpar_optimizer_set_options(clpar_optimizer *o, const clpar_sgd_options *sgd,
                                         const clpar_adam_options *adam, int apply);
/* The same for parameter group g (0 <= g < clpar_optimizer_group_count). */
void clpar_optimizer_group_options(const clpar_optimizer *o, int g, clpar_sgd_options *sgd,
                                   clpar_adam_options *adam);
clpar_status clpar_optimizer_set_group_options(clpar_optimizer *o, int g,
                                               const clpar_sgd_options *sgd,
                                               const clpar_adam_options *adam, int apply);
/* Inside a capture on x's device (src/nn/dropout_graph.c): patches the dropout_mask command
 * just posted for a draw (seed, offset) of the module whose stream is (stream, *cursor), so each
 * replay draws the next mask as the eager forward would; CLPAR_OK outside a capture. */
clpar_status clpar_dropout_capture(uint64_t stream, uint64_t *cursor, const clpar_tensor *x,
                                   uint64_t seed, uint64_t offset);
/* Inside a capture on dev (src/optim_graph.c): patches the sgd_step or adam_step command just
 * posted for group's members o->params[members[0 .. n)] (touched: the tensor it stepped) so that
 * each replay computes its scalars as an eager step would and advances the step counts. */
clpar_status clpar_optimizer_capture(clpar_optimizer *o, clpar_device *dev, int group,
                                     const int *members, int n, clpar_tensor *touched);
/* At a replay: the step's scalars for group from the current options (learning rate) and the
 * members' step counts, which it advances (src/optim.c). */
void clpar_optimizer_replay_args(clpar_optimizer *o, int group, const int *members, int n,
                                 clpar_patch_args *a);

#endif
