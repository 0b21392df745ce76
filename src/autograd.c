/* autograd.c — the graph and the backward engine.
 *
 * An op whose input requires a gradient attaches a node to its result: the inputs (retained),
 * what backward needs, and a backward function. clpar_backward orders the nodes reachable from
 * the loss, counts each node's consumers, and runs a node once every consumer has delivered
 * its gradient. The engine only walks the graph and posts work (the devices' workers do it),
 * so it runs on the calling thread. Gradients reach leaves by accumulation into their grad,
 * which persists across steps until zeroed; a leaf's hooks run when its last share arrived. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static _Thread_local int grad_disabled; /* 0: recording is on (the default) */

int clpar_set_grad_enabled(int enabled) {
  int was = !grad_disabled;
  grad_disabled = !enabled;
  return was;
}

int clpar_is_grad_enabled(void) {
  return !grad_disabled;
}

int clpar_needs_grad(clpar_tensor *const *inputs, int n) {
  if (grad_disabled) return 0;
  for (int i = 0; i < n; i++)
    if (inputs[i] && inputs[i]->requires_grad) return 1;
  return 0;
}

clpar_node *clpar_record(clpar_tensor *result, const char *op, clpar_backward_fn backward,
                         clpar_tensor *const *inputs, int n) {
  clpar_node *node = calloc(1, sizeof *node);
  clpar_tensor **in = calloc((size_t)n, sizeof *in);
  if (!node || !in) {
    free(node);
    free(in);
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory recording the graph", op);
    return NULL;
  }
  node->refcount = 1;
  node->op = op;
  node->backward = backward;
  node->n_inputs = n;
  node->inputs = in;
  node->partial_offset = -1;
  node->dev = result->storage->dev;
  for (int i = 0; i < n; i++) in[i] = clpar_tensor_retain(inputs[i]);
  result->node = node;
  result->requires_grad = 1;
  return node;
}

clpar_status clpar_record_op(clpar_tensor *result, const char *op, clpar_backward_fn backward,
                             clpar_tensor *const *inputs, int n, clpar_node **node) {
  clpar_node *made = NULL;
  if (clpar_needs_grad(inputs, n) && !(made = clpar_record(result, op, backward, inputs, n))) {
    clpar_tensor_free(result);
    return CLPAR_ERROR_OUT_OF_MEMORY;
  }
  if (node) *node = made;
  return CLPAR_OK;
}

clpar_status clpar_record_op_keep(clpar_tensor *result, const char *op, clpar_backward_fn backward,
                                  clpar_tensor *const *inputs, int n, void *ctx,
                                  clpar_tensor *const *saved, int n_saved, clpar_node **node,
                                  clpar_tensor **out) {
  clpar_node *made = NULL;
  clpar_status s = clpar_record_op(result, op, backward, inputs, n, &made);
  if (made) {
    if (ctx) {
      made->ctx = ctx;
      made->ctx_free = free;
    }
    for (int i = 0; i < n_saved; i++) {
      made->saved[i] = saved[i];
      clpar_tensor_unscope(saved[i]);
    }
  } else {
    free(ctx);
    for (int i = 0; i < n_saved; i++) clpar_tensor_free(saved[i]);
  }
  if (node) *node = made;
  if (s == CLPAR_OK) *out = result;
  return s;
}

/* Releasing a node releases its inputs, whose nodes may go too: a graph of 400,000 ops would
 * recurse that deep. The first release on a thread runs a loop instead, and the releases it
 * sets off queue their nodes for it. */
static _Thread_local clpar_node **release_queue;
static _Thread_local size_t release_count, release_capacity;
static _Thread_local int releasing;

static void node_destroy(clpar_node *node) {
  for (int i = 0; i < node->n_inputs; i++) clpar_tensor_release(node->inputs[i]);
  for (int i = 0; i < CLPAR_NODE_SAVED; i++) clpar_tensor_free(node->saved[i]);
  clpar_tensor_free(node->grad);
  if (node->ctx_free) node->ctx_free(node->ctx);
  free(node->inputs);
  free(node);
}

void clpar_node_release(clpar_node *node) {
  if (!node || __atomic_sub_fetch(&node->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (releasing) {
    if (release_count == release_capacity) {
      size_t cap = release_capacity ? 2 * release_capacity : 256;
      clpar_node **grown = realloc(release_queue, cap * sizeof *grown);
      if (!grown) { /* no room to defer: recurse (deep graphs only) */
        node_destroy(node);
        return;
      }
      release_queue = grown;
      release_capacity = cap;
    }
    release_queue[release_count++] = node;
    return;
  }
  releasing = 1;
  node_destroy(node);
  while (release_count) node_destroy(release_queue[--release_count]);
  free(release_queue);
  release_queue = NULL;
  release_capacity = 0;
  releasing = 0;
}

clpar_status clpar_tensor_set_requires_grad(clpar_tensor *t, int requires_grad) {
  if (!t)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_tensor_set_requires_grad: t is NULL");
  if (t->node && !requires_grad)
    return clpar_set_error(
        CLPAR_ERROR_INVALID_ARGUMENT,
        "clpar_tensor_set_requires_grad: the result of an op (%s) cannot stop requiring a gradient",
        t->node->op);
  if (requires_grad && clpar_check_float("clpar_tensor_set_requires_grad", "t", t) != CLPAR_OK) {
    clpar_append_error(" (only float tensors can require a gradient)");
    return CLPAR_ERROR_DTYPE;
  }
  t->requires_grad = requires_grad != 0;
  return CLPAR_OK;
}

int clpar_tensor_requires_grad(const clpar_tensor *t) {
  return t ? t->requires_grad : 0;
}

int clpar_tensor_has_grad(const clpar_tensor *t) {
  return t && t->grad && (t->grad_defined || (t->flat && t->flat->grad_defined));
}

clpar_tensor *clpar_tensor_grad(const clpar_tensor *t) {
  return clpar_tensor_has_grad(t) ? t->grad : NULL;
}

clpar_status clpar_tensor_zero_grad(clpar_tensor *t) {
  if (!t) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_tensor_zero_grad: t is NULL");
  return t->grad ? clpar_fill(t->grad, 0.0f) : CLPAR_OK;
}

clpar_status clpar_tensor_add_grad_hook(clpar_tensor *t, clpar_grad_hook_fn fn, void *user) {
  if (!t || !fn)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_tensor_add_grad_hook: NULL argument");
  if (t->node || !t->requires_grad)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_tensor_add_grad_hook: the tensor must be a leaf that requires a "
                           "gradient");
  clpar_grad_hook *h = malloc(sizeof *h);
  if (!h)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                           "clpar_tensor_add_grad_hook: out of host memory");
  h->fn = fn;
  h->user = user;
  h->next = NULL;
  clpar_grad_hook **tail = &t->hooks;
  while (*tail) tail = &(*tail)->next;
  *tail = h;
  return CLPAR_OK;
}

clpar_status clpar_tensor_remove_grad_hook(clpar_tensor *t, clpar_grad_hook_fn fn, void *user) {
  for (clpar_grad_hook **p = t ? &t->hooks : NULL; p && *p; p = &(*p)->next)
    if ((*p)->fn == fn && (*p)->user == user) {
      clpar_grad_hook *h = *p;
      *p = h->next;
      free(h);
      return CLPAR_OK;
    }
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "clpar_tensor_remove_grad_hook: no such hook on the tensor");
}

/* ---- the engine ----
 *
 * Backward runs on the calling thread: each node's backward checks shapes, takes memory and
 * posts its ops to the workers of the devices involved, so walking the graph costs host time
 * only, and every device computes its part as soon as its queue gets it — the replicas of a
 * DataParallel step run their backward at once. Nodes that compute are posted before nodes
 * that copy between devices: a copy makes the destination's worker wait for the source, and
 * whatever the destination has queued before that wait is not held up by it; a copy to a
 * device with nothing else ready goes first (next_node). */

typedef struct {
  void **items;
  size_t count, capacity;
} list;

static int list_push(list *l, void *p) {
  if (l->count == l->capacity) {
    size_t cap = l->capacity ? 2 * l->capacity : 64;
    void **grown = realloc(l->items, cap * sizeof *grown);
    if (!grown) return 0;
    l->items = grown;
    l->capacity = cap;
  }
  l->items[l->count++] = p;
  return 1;
}

static clpar_status oom(void) {
  return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "backward: out of host memory");
}

typedef struct {
  list nodes;  /* every node reachable from the root, claimed */
  list leaves; /* every leaf that requires a gradient, claimed */
} graph;

/* A backward marks what it uses with its token: a node or leaf that carries another token
 * belongs to a backward running on another thread. */
static int next_token(void) {
  static int counter;
  int t;
  do t = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  while (t == 0);
  return t;
}

/* 1: newly ours; 0: ours already; -1: another backward's. */
static int claim(int *flag, int token) {
  int expected = 0;
  if (__atomic_compare_exchange_n(flag, &expected, token, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return 1;
  return expected == token ? 0 : -1;
}

static void unclaim_all(graph *g) {
  for (size_t i = 0; i < g->nodes.count; i++)
    __atomic_store_n(&((clpar_node *)g->nodes.items[i])->claimed, 0, __ATOMIC_RELEASE);
  for (size_t i = 0; i < g->leaves.count; i++)
    __atomic_store_n(&((clpar_tensor *)g->leaves.items[i])->claimed, 0, __ATOMIC_RELEASE);
}

static clpar_status busy(const char *what) {
  return clpar_set_error(CLPAR_ERROR_BUSY,
                         "clpar_backward: another thread is running backward through this graph "
                         "(at %s); one backward at a time may use a graph and its leaves",
                         what);
}

/* Claims every node reachable from root and counts each node's consumers (pending) and each
 * leaf's gradients to come (grad_pending). */
static clpar_status collect(clpar_node *root, graph *g) {
  int token = next_token();
  if (claim(&root->claimed, token) != 1) return busy(root->op);
  root->pending = 0;
  list stack = {0};
  clpar_status s = list_push(&g->nodes, root) && list_push(&stack, root) ? CLPAR_OK : oom();
  while (s == CLPAR_OK && stack.count) {
    clpar_node *n = stack.items[--stack.count];
    for (int i = 0; s == CLPAR_OK && i < n->n_inputs; i++) {
      clpar_tensor *t = n->inputs[i];
      if (!t) continue;
      if (t->node) {
        int c = claim(&t->node->claimed, token);
        if (c < 0) {
          s = busy(t->node->op);
        } else if (c == 1) {
          t->node->pending = 0;
          if (!list_push(&g->nodes, t->node) || !list_push(&stack, t->node)) s = oom();
        }
        if (s == CLPAR_OK) t->node->pending++;
      } else if (t->requires_grad) {
        int c = claim(&t->claimed, token);
        if (c < 0) {
          s = busy("a leaf");
        } else if (c == 1) {
          t->grad_pending = 0;
          if (!list_push(&g->leaves, t)) s = oom();
        }
        if (s == CLPAR_OK) t->grad_pending++;
      }
    }
  }
  free(stack.items);
  return s;
}

/* 1 when t's grad memory held no gradient (clpar_grad_set_stale): the caller's write replaces
 * it. The mark is taken, so that only the first write of a backward replaces. */
static int take_stale(clpar_tensor *t) {
  return __atomic_exchange_n(&t->grad_stale, 0, __ATOMIC_ACQ_REL);
}

/* t's grad zeroed if it was stale, for a write that adds into it (or into part of it). */
static clpar_status unstale(clpar_tensor *t) {
  return take_stale(t) && t->grad ? clpar_fill(t->grad, 0.0f) : CLPAR_OK;
}

void clpar_grad_set_stale(clpar_tensor *t) {
  if (!t->grad) return;
  t->grad_defined = 0;
  __atomic_store_n(&t->grad_stale, 1, __ATOMIC_RELEASE);
}

/* Adds g into [offset, offset + g->numel) of acc in place (acc and g on one device). */
static clpar_status add_into(clpar_tensor *acc, int64_t offset, clpar_tensor *g) {
  clpar_device *dev = acc->storage->dev;
  clpar_bref slice = clpar_tensor_bref(acc);
  slice.off += (size_t)offset;
  return clpar_dev_binary(dev, CLPAR_BINARY_ADD, 1, (size_t)g->numel, slice, clpar_tensor_bref(g),
                          1, slice);
}

/* Zeros like t (its dtype), on t's device, outside any scope. */
static clpar_status zeros_like(const clpar_tensor *t, clpar_tensor **out) {
  clpar_status s = clpar_tensor_zeros_dtype(t->storage->dev, t->dtype, t->ndim, t->shape, out);
  if (s == CLPAR_OK) clpar_tensor_unscope(*out);
  return s;
}

/* add_into for a 16-bit acc: g (16-bit or float32) added to the slice of acc at offset (in
 * words, as 16-bit views count it), summed in float32 and rounded back, as 16-bit gradients
 * from several consumers are. */
static clpar_status half_add_into(clpar_tensor *acc, int64_t offset, clpar_tensor *g) {
  clpar_tensor *slice = NULL;
  clpar_status s = clpar_tensor_view_at(acc, (size_t)offset, g->ndim, g->shape, &slice);
  if (s == CLPAR_OK) s = clpar_half_add_into(slice, g);
  clpar_tensor_free(slice);
  return s;
}

/* 1 when leaf t may keep g as its gradient instead of a copy (PyTorch's AccumulateGrad steals
 * a gradient nobody else holds): g is the only tensor of its storage, held only by the caller
 * (a scope's creation reference is the caller's too: clpar_tensor_free forgets it), of t's dtype,
 * shape and device, and its storage is about the size a new gradient would take. A gradient that
 * shares memory with anything else (the same tensor handed to two inputs, a view of a buffer) is
 * copied. */
static int adoptable(const clpar_tensor *t, const clpar_tensor *g) {
  size_t bytes = (size_t)g->numel * clpar_dtype_size(g->dtype);
  if (g->dtype != t->dtype || g->ndim != t->ndim || g->offset != 0 || g->node || g->requires_grad ||
      g->grad || g->flat || g->hooks || g->storage->dev != t->storage->dev ||
      g->storage->capacity > bytes + bytes / 4 + ((size_t)64 << 10))
    return 0;
  for (int d = 0; d < t->ndim; d++)
    if (g->shape[d] != t->shape[d]) return 0;
  return __atomic_load_n(&g->refcount, __ATOMIC_ACQUIRE) == 1 &&
         __atomic_load_n(&g->flat_members, __ATOMIC_ACQUIRE) == 0 &&
         __atomic_load_n(&g->storage->refcount, __ATOMIC_ACQUIRE) == 1;
}

/* Adds g (a reference the caller gives up) into what t accumulates: its node's gradient, or,
 * for a leaf, its grad (its own memory, kept across steps: g itself when adoptable, else a
 * copy). offset >= 0: g is the gradient of the slice of t starting at that element. */
static clpar_status deliver(clpar_tensor *t, clpar_tensor *g, int64_t offset) {
  clpar_node *n = t->node;
  clpar_tensor **acc = n ? &n->grad : &t->grad;
  clpar_status s = CLPAR_OK;
  if (offset >= 0) {
    if (!n) s = unstale(t);
    if (s == CLPAR_OK && !*acc) {
      int was = clpar_memory_category_set(n ? CLPAR_MEM_ACTIVATIONS : CLPAR_MEM_GRADIENTS);
      s = zeros_like(t, acc);
      clpar_memory_category_set(was);
    }
    if (s == CLPAR_OK)
      s = clpar_dtype_is_half((*acc)->dtype) ? half_add_into(*acc, offset, g)
                                             : add_into(*acc, offset, g);
  } else if (n) {
    if (!n->grad) {
      n->grad = g;
      return CLPAR_OK;
    }
    clpar_tensor *sum;
    /* Out of place: either side may be a view of another. A 16-bit activation with several
     * consumers (autocast) gets 16-bit gradients, summed in float32 and rounded back. */
    s = clpar_dtype_is_half(g->dtype) ? clpar_half_add(n->grad, g, &sum)
                                      : clpar_add(n->grad, g, &sum);
    if (s == CLPAR_OK) {
      clpar_tensor_unscope(sum);
      clpar_tensor_free(n->grad);
      n->grad = sum;
    }
  } else if (!t->grad && adoptable(t, g)) {
    clpar_tensor_unscope(g);
    clpar_storage_tag(g->storage, CLPAR_MEM_GRADIENTS);
    t->grad = g;
    g = NULL;
  } else if (!t->grad) {
    clpar_tensor *own;
    int was = clpar_memory_category_set(CLPAR_MEM_GRADIENTS);
    s = clpar_tensor_empty_dtype(t->storage->dev, t->dtype, t->ndim, t->shape, &own);
    clpar_memory_category_set(was);
    if (s == CLPAR_OK) {
      clpar_tensor_unscope(own);
      s = clpar_copy_elements(own, g); /* accumulated flat, as add_into does */
      if (s == CLPAR_OK)
        t->grad = own;
      else
        clpar_tensor_free(own);
    }
  } else if (clpar_dtype_is_half(t->dtype)) {
    s = unstale(t);
    if (s == CLPAR_OK) /* a 16-bit parameter's (clpar_master_weights) */
      s = clpar_half_add_into(t->grad, g);
  } else if (take_stale(t)) {
    s = clpar_copy_elements(t->grad, g);
  } else {
    /* Memory set aside by clpar_module_flatten holds zeros until a backward fills it. */
    s = add_into(t->grad, 0, g);
  }
  if (s == CLPAR_OK && !n) t->grad_defined = 1;
  clpar_tensor_free(g);
  return s;
}

clpar_status clpar_grad_slot(clpar_node *n, int i, clpar_tensor **slot) {
  int replace = 0;
  clpar_status s = clpar_grad_slot_replace(n, i, slot, &replace);
  if (s == CLPAR_OK && replace && (s = clpar_fill(*slot, 0.0f)) != CLPAR_OK) {
    clpar_tensor_free(*slot);
    *slot = NULL;
    n->slotted &= ~(1u << i);
  }
  return s;
}

clpar_status clpar_grad_slot_replace(clpar_node *n, int i, clpar_tensor **slot, int *replace) {
  *slot = NULL;
  *replace = 0;
  clpar_tensor *t = i >= 0 && i < n->n_inputs && i < 32 ? n->inputs[i] : NULL;
  if (!t || !t->requires_grad || clpar_dtype_is_half(t->dtype))
    return CLPAR_OK; /* no 16-bit GEMMs */
  clpar_tensor *acc = NULL;
  size_t offset = 0;
  clpar_status s = CLPAR_OK;
  if (!t->node) {
    acc = t->grad; /* a leaf's first gradient comes through deliver: no slot yet */
    *replace = acc && take_stale(t);
  } else if (t->node->partial_offset >= 0 && t->node->n_inputs == 1 && t->node->inputs[0]) {
    clpar_tensor *base = t->node->inputs[0];
    clpar_tensor **bacc = base->node ? &base->node->grad : base->requires_grad ? &base->grad : NULL;
    if (!base->node) s = unstale(base); /* the slice adds into part of it */
    if (s == CLPAR_OK && bacc && !*bacc) s = zeros_like(base, bacc); /* as deliver does */
    acc = bacc ? *bacc : NULL;
    offset = (size_t)t->node->partial_offset;
  }
  if (s != CLPAR_OK || !acc) return s;
  s = clpar_tensor_view_at(acc, offset, t->ndim, t->shape, slot);
  if (s == CLPAR_OK) n->slotted |= 1u << i;
  return s;
}

static void run_hooks(clpar_tensor *leaf) {
  for (clpar_grad_hook *h = leaf->hooks; h; h = h->next) h->fn(leaf, h->user);
}

/* Runs one node's backward and hands each input its gradient; input nodes that then have all
 * their gradients go to ready (computing) or ready_copy (copying between devices). */
static clpar_status run_node(clpar_node *n, list *ready, list *ready_copy) {
  clpar_tensor *grad_in_small[4] = {0}, **grad_in = grad_in_small;
  if (n->n_inputs > 4 && !(grad_in = calloc((size_t)n->n_inputs, sizeof *grad_in))) return oom();
  clpar_tensor *g = n->grad;
  n->grad = NULL;
  n->slotted = 0;
  clpar_status s = g ? n->backward(n, g, grad_in) : CLPAR_OK;
  clpar_tensor_free(g);
  for (int i = 0; s == CLPAR_OK && i < n->n_inputs && i < 32 && n->slotted; i++) {
    clpar_tensor *in = n->inputs[i];
    if (!((n->slotted >> i) & 1)) continue;
    if (!in->node) /* a leaf has a gradient now, as after deliver; so has a view's base leaf */
      in->grad_defined = 1;
    else if (!in->node->inputs[0]->node)
      in->node->inputs[0]->grad_defined = 1;
  }
  for (int i = 0; i < n->n_inputs; i++) {
    clpar_tensor *in = n->inputs[i];
    if (s == CLPAR_OK && grad_in[i] && in && (in->node || in->requires_grad))
      s = deliver(in, grad_in[i], n->partial_offset);
    else
      clpar_tensor_free(grad_in[i]);
    if (!in) continue;
    if (in->node && --in->node->pending == 0) {
      if (!list_push(in->node->transfer ? ready_copy : ready, in->node)) s = oom();
    } else if (!in->node && in->requires_grad && --in->grad_pending == 0 && s == CLPAR_OK) {
      run_hooks(in);
    }
  }
  if (grad_in != grad_in_small) free(grad_in);
  return s;
}

/* The next node to run. A copy goes first when no computation is ready on the device it
 * copies to: its read is posted on the source's queue as early as possible and the
 * destination, which has nothing else to do, starts sooner (DataParallel: the gradient of a
 * replica's output reaches the replica before the main device's own backward is posted).
 * A copy to a device with computation ready waits until that was posted, so that the
 * destination's queue does not wait for the copy in front of work it can do meanwhile (the
 * replica's flat gradient is added on the main device after its own backward). Otherwise
 * computation, last ready first, so that a chain is followed to its end. */
static clpar_node *next_node(list *ready, list *ready_copy) {
  for (size_t i = ready_copy->count; i-- > 0;) {
    clpar_node *c = ready_copy->items[i];
    clpar_device *dst = c->n_inputs > 0 && c->inputs[0] ? c->inputs[0]->storage->dev : NULL;
    int busy = 0;
    for (size_t j = 0; j < ready->count && !busy; j++)
      busy = ((clpar_node *)ready->items[j])->dev == dst;
    if (busy) continue;
    memmove(&ready_copy->items[i], &ready_copy->items[i + 1],
            (ready_copy->count - i - 1) * sizeof *ready_copy->items);
    ready_copy->count--;
    return c;
  }
  return ready->count ? ready->items[--ready->count] : ready_copy->items[--ready_copy->count];
}

static clpar_status run_graph(clpar_node *root) {
  list ready = {0}, ready_copy = {0};
  clpar_status s = list_push(&ready, root) ? CLPAR_OK : oom();
  while (s == CLPAR_OK && (ready.count || ready_copy.count)) {
    clpar_node *n = next_node(&ready, &ready_copy);
    s = run_node(n, &ready, &ready_copy);
  }
  free(ready.items);
  free(ready_copy.items);
  return s;
}

/* Backpropagates from root, whose gradient is seed (a reference this takes over). */
static clpar_status backward_from(clpar_tensor *root, clpar_tensor *seed) {
  graph g = {{0}, {0}};
  clpar_status s = root->node ? collect(root->node, &g) : CLPAR_OK;
  int was = clpar_set_grad_enabled(0);
  if (s == CLPAR_OK && !root->node) { /* a leaf root: its gradient is the seed */
    s = deliver(root, seed, -1);
    seed = NULL;
    if (s == CLPAR_OK) run_hooks(root);
  } else if (s == CLPAR_OK) {
    root->node->grad = seed;
    seed = NULL;
    s = run_graph(root->node);
  }
  clpar_tensor_free(seed);
  if (s != CLPAR_OK) /* a later backward starts clean */
    for (size_t i = 0; i < g.nodes.count; i++) {
      clpar_node *n = g.nodes.items[i];
      clpar_tensor_free(n->grad);
      n->grad = NULL;
    }
  unclaim_all(&g);
  free(g.nodes.items);
  free(g.leaves.items);
  clpar_set_grad_enabled(was);
  return s;
}

/* Whether root can start a backward: alive, requiring a gradient (as PyTorch's "element 0 of
 * tensors does not require grad"). */
static clpar_status check_root(const char *fn, const clpar_tensor *root) {
  clpar_status s = clpar_check_alive(fn, root);
  if (s == CLPAR_OK && !root->requires_grad)
    s = clpar_set_error(CLPAR_ERROR_NO_GRADIENT,
                        "%s: the tensor does not require a gradient (no input of the ops that "
                        "made it requires one)",
                        fn);
  return s;
}

/* A new tensor of ones of t's dtype, shape and device, outside any scope: torch's
 * ones_like(loss), the seed of loss.backward(). A 16-bit one is filled in float32 and
 * converted (clpar_fill writes 16-bit zeros only). */
static clpar_status ones_like(const clpar_tensor *t, clpar_tensor **out) {
  clpar_tensor *ones = NULL;
  *out = NULL;
  clpar_status s = clpar_tensor_empty(t->storage->dev, t->ndim, t->shape, &ones);
  if (s == CLPAR_OK) s = clpar_fill(ones, 1.0f);
  if (s == CLPAR_OK && t->dtype != CLPAR_FLOAT32) {
    s = clpar_convert_dtype(ones, t->dtype, out);
    clpar_tensor_free(ones);
  } else if (s == CLPAR_OK) {
    *out = ones;
  } else {
    clpar_tensor_free(ones);
  }
  if (*out) clpar_tensor_unscope(*out);
  return s;
}

clpar_status clpar_backward(clpar_tensor *loss) {
  if (!loss) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_backward: loss is NULL");
  clpar_status s = check_root("clpar_backward", loss);
  if (s != CLPAR_OK) return s;
  if (loss->numel != 1) {
    char b[128];
    return clpar_set_error(
        CLPAR_ERROR_SHAPE_MISMATCH,
        "clpar_backward: the loss is %s; backward starts from a tensor of one element",
        clpar_tensor_shape_str(loss, b, sizeof b));
  }
  clpar_tensor *seed = NULL;
  s = ones_like(loss, &seed);
  return s == CLPAR_OK ? backward_from(loss, seed) : s;
}

/* grad's elements (int32 or int64, on root's device) as a new tensor of root's float dtype:
 * through float32 on the host, as torch's int-to-float cast rounds (to nearest). */
static clpar_status int_grad(const clpar_tensor *root, const clpar_tensor *grad,
                             clpar_tensor **seed) {
  size_t n = (size_t)grad->numel, bytes = n * clpar_dtype_size(grad->dtype);
  void *raw = malloc(bytes ? bytes : 1);
  float *f = malloc((n ? n : 1) * sizeof *f);
  clpar_status s = raw && f ? clpar_tensor_read_raw(grad, raw, bytes)
                            : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                                              "clpar_backward_grad: out of host memory");
  for (size_t i = 0; s == CLPAR_OK && i < n; i++)
    f[i] = grad->dtype == CLPAR_INT64 ? (float)((const int64_t *)raw)[i]
                                      : (float)((const int32_t *)raw)[i];
  if (s == CLPAR_OK)
    s = clpar_tensor_from_floats(root->storage->dev, root->dtype, root->ndim, root->shape, f, seed);
  free(raw);
  free(f);
  return s;
}

/* Backward from root with grad as root's gradient, as torch.autograd.backward(root, grad):
 * grad must have root's shape and device, and is taken in root's dtype (converted when it has
 * another, an int one included). */
clpar_status clpar_backward_grad(clpar_tensor *root, const clpar_tensor *grad) {
  const char *fn = "clpar_backward_grad";
  if (!root || !grad)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: root or grad is NULL", fn);
  clpar_status s = check_root(fn, root);
  if (s == CLPAR_OK) s = clpar_check_alive(fn, grad);
  if (s != CLPAR_OK) return s;
  int same = grad->ndim == root->ndim;
  for (int d = 0; same && d < root->ndim; d++) same = grad->shape[d] == root->shape[d];
  char a[128], b[128];
  if (!same)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: mismatch in shape: grad has a shape of %s and root has a shape "
                           "of %s",
                           fn, clpar_tensor_shape_str(grad, a, sizeof a),
                           clpar_tensor_shape_str(root, b, sizeof b));
  if (grad->storage->dev != root->storage->dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH,
                           "%s: grad is on %s and root on %s; the gradient must be on root's "
                           "device",
                           fn, clpar_device_id(grad->storage->dev),
                           clpar_device_id(root->storage->dev));
  clpar_tensor *seed = NULL;
  if (grad->dtype == root->dtype)
    s = clpar_tensor_alias(grad, &seed);
  else if (grad->dtype == CLPAR_INT32 || grad->dtype == CLPAR_INT64)
    s = int_grad(root, grad, &seed);
  else
    s = clpar_convert_dtype(grad, root->dtype, &seed);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(seed);
  return backward_from(root, seed);
}
