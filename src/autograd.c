/* autograd.c — the graph and the backward engine.
 *
 * An op whose input requires a gradient attaches a node to its result: the inputs (retained),
 * what backward needs, and a backward function. clpar_backward orders the nodes reachable from
 * the loss, counts each node's consumers, and runs a node once every consumer has delivered
 * its gradient. Nodes on different devices that are ready together run in parallel, one host
 * thread per device (PoCL's basic devices, and any in-order queue, only overlap that way);
 * nodes of one device run in order on its thread. Gradients reach leaves by accumulation into
 * their grad, which persists across steps until zeroed. */
#include <omp.h>
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

void clpar_node_release(clpar_node *node) {
  if (!node || __atomic_sub_fetch(&node->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
  for (int i = 0; i < node->n_inputs; i++) clpar_tensor_release(node->inputs[i]);
  for (int i = 0; i < CLPAR_NODE_SAVED; i++) clpar_tensor_free(node->saved[i]);
  clpar_tensor_free(node->grad);
  free(node->inputs);
  free(node);
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
  t->requires_grad = requires_grad != 0;
  return CLPAR_OK;
}

int clpar_tensor_requires_grad(const clpar_tensor *t) {
  return t ? t->requires_grad : 0;
}

clpar_tensor *clpar_tensor_grad(const clpar_tensor *t) {
  return t ? t->grad : NULL;
}

clpar_status clpar_tensor_zero_grad(clpar_tensor *t) {
  if (!t) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_tensor_zero_grad: t is NULL");
  return t->grad ? clpar_fill(t->grad, 0.0f) : CLPAR_OK;
}

/* ---- the engine ---- */

typedef struct {
  clpar_node **items;
  size_t count, capacity;
} node_list;

static int list_push(node_list *l, clpar_node *n) {
  if (l->count == l->capacity) {
    size_t cap = l->capacity ? 2 * l->capacity : 64;
    clpar_node **grown = realloc(l->items, cap * sizeof *grown);
    if (!grown) return 0;
    l->items = grown;
    l->capacity = cap;
  }
  l->items[l->count++] = n;
  return 1;
}

/* Every node reachable from root, each once, with pending = its number of consumers. */
static clpar_status collect(clpar_node *root, node_list *all) {
  static uint64_t generation;
  uint64_t visit = __atomic_add_fetch(&generation, 1, __ATOMIC_RELAXED);
  node_list stack = {0};
  int ok = list_push(&stack, root);
  root->visit = visit;
  root->pending = 0;
  while (ok && stack.count) {
    clpar_node *n = stack.items[--stack.count];
    ok = list_push(all, n);
    for (int i = 0; ok && i < n->n_inputs; i++) {
      clpar_node *in = n->inputs[i] ? n->inputs[i]->node : NULL;
      if (!in) continue;
      if (in->visit != visit) {
        in->visit = visit;
        in->pending = 0;
        ok = list_push(&stack, in);
      }
      in->pending++;
    }
  }
  free(stack.items);
  return ok ? CLPAR_OK : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "backward: out of host memory");
}

/* Adds g (a reference the caller gives up) into what t accumulates: its node's gradient, or,
 * for a leaf, its grad (its own memory, kept across steps). */
static clpar_status deliver(clpar_tensor *t, clpar_tensor *g) {
  clpar_node *n = t->node;
  clpar_status s = CLPAR_OK;
  if (n) {
    if (!n->grad) {
      n->grad = g;
      return CLPAR_OK;
    }
    clpar_tensor *sum;
    s = clpar_add(n->grad, g, &sum); /* out of place: either side may be a view of another */
    if (s == CLPAR_OK) {
      clpar_tensor_unscope(sum);
      clpar_tensor_free(n->grad);
      n->grad = sum;
    }
  } else if (!t->grad) {
    clpar_tensor *own;
    s = clpar_tensor_empty(t->storage->dev, t->ndim, t->shape, &own);
    if (s == CLPAR_OK) {
      clpar_tensor_unscope(own);
      s = clpar_copy(own, g);
      if (s == CLPAR_OK)
        t->grad = own;
      else
        clpar_tensor_free(own);
    }
  } else {
    clpar_device *dev = t->storage->dev;
    s = dev->bd.iface->binary(dev->bd.ctx, CLPAR_BINARY_ADD, 1, (size_t)t->numel,
                              clpar_tensor_bref(t->grad), clpar_tensor_bref(g), 1,
                              clpar_tensor_bref(t->grad));
    if (s != CLPAR_OK) clpar_device_fail(dev, s);
  }
  clpar_tensor_free(g);
  return s;
}

static pthread_mutex_t deliver_lock = PTHREAD_MUTEX_INITIALIZER;

/* Runs one node's backward and hands each input its gradient; inputs whose node then has all
 * its gradients are appended to ready. */
static clpar_status run_node(clpar_node *n, node_list *ready) {
  clpar_tensor *grad_in_small[4] = {0}, **grad_in = grad_in_small;
  if (n->n_inputs > 4 && !(grad_in = calloc((size_t)n->n_inputs, sizeof *grad_in)))
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "backward: out of host memory");
  clpar_tensor *g = n->grad;
  n->grad = NULL;
  clpar_status s = g ? n->backward(n, g, grad_in) : CLPAR_OK;
  clpar_tensor_free(g);
  for (int i = 0; i < n->n_inputs; i++) {
    clpar_tensor *in = n->inputs[i];
    /* A gradient lives on the running node's device or on the host (copies between devices
     * hop through the host), so this thread may add it up; the lock orders the several
     * workers that feed one input. */
    pthread_mutex_lock(&deliver_lock);
    if (s == CLPAR_OK && grad_in[i] && in && (in->node || in->requires_grad))
      s = deliver(in, grad_in[i]);
    else
      clpar_tensor_free(grad_in[i]);
    if (in && in->node && --in->node->pending == 0 && !list_push(ready, in->node))
      s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "backward: out of host memory");
    pthread_mutex_unlock(&deliver_lock);
  }
  if (grad_in != grad_in_small) free(grad_in);
  return s;
}

/* ---- running the graph: one worker per device ----
 *
 * A node runs on the worker of its device, as soon as its gradient is complete; what it makes
 * ready goes to the queue of that node's device and wakes its worker. So the replicas of a
 * DataParallel step run their backward at the same time, and each device's queue is driven
 * by one thread (PyTorch's engine works the same way). */

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int n_devices;
  clpar_device *devices[64];
  node_list queues[64];
  size_t remaining; /* nodes not yet run */
  clpar_status status;
  char message[1024];
} engine;

static int device_slot(engine *e, clpar_device *dev) {
  for (int i = 0; i < e->n_devices; i++)
    if (e->devices[i] == dev) return i;
  if (e->n_devices == 64) return 0; /* more devices than workers: the first takes the rest */
  e->devices[e->n_devices] = dev;
  return e->n_devices++;
}

/* The first non-empty queue among the worker's slots (first, first + stride, ...), or NULL. */
static node_list *ready_queue(engine *e, int first, int stride) {
  for (int slot = first; slot < e->n_devices; slot += stride)
    if (e->queues[slot].count) return &e->queues[slot];
  return NULL;
}

/* A worker: runs the ready nodes of its devices until every node has run or one failed. With
 * as many workers as devices (the usual case), each serves exactly one device. */
static void engine_worker(engine *e, int first, int stride) {
  int was = clpar_set_grad_enabled(0);
  node_list newly = {0}, *q;
  pthread_mutex_lock(&e->lock);
  for (;;) {
    while (!(q = ready_queue(e, first, stride)) && e->remaining > 0 && e->status == CLPAR_OK)
      pthread_cond_wait(&e->wake, &e->lock);
    if (e->remaining == 0 || e->status != CLPAR_OK) break;
    clpar_node *n = q->items[--q->count];
    pthread_mutex_unlock(&e->lock);
    clpar_status s = run_node(n, &newly);
    pthread_mutex_lock(&e->lock);
    e->remaining--;
    for (size_t i = 0; s == CLPAR_OK && i < newly.count; i++) {
      if (!list_push(&e->queues[device_slot(e, newly.items[i]->dev)], newly.items[i]))
        s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "backward: out of host memory");
    }
    newly.count = 0;
    if (s != CLPAR_OK && e->status == CLPAR_OK) {
      e->status = s;
      snprintf(e->message, sizeof e->message, "%s", clpar_last_error());
    }
    pthread_cond_broadcast(&e->wake);
  }
  pthread_mutex_unlock(&e->lock);
  free(newly.items);
  clpar_set_grad_enabled(was);
}

/* Runs every node of all, starting from root, one worker thread per device involved. */
static clpar_status run_graph(node_list *all, clpar_node *root) {
  engine *e = calloc(1, sizeof *e);
  if (!e) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "backward: out of host memory");
  pthread_mutex_init(&e->lock, NULL);
  pthread_cond_init(&e->wake, NULL);
  for (size_t i = 0; i < all->count; i++) device_slot(e, all->items[i]->dev);
  e->remaining = all->count;
  clpar_status s = list_push(&e->queues[device_slot(e, root->dev)], root)
                       ? CLPAR_OK
                       : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "backward: out of host memory");
  if (s == CLPAR_OK) {
    int workers = e->n_devices;
#pragma omp parallel num_threads(workers) if (workers > 1)
    engine_worker(e, omp_get_thread_num(), omp_get_num_threads());
    s = e->status;
    if (s != CLPAR_OK) clpar_set_error(s, "%s", e->message);
  }
  for (int i = 0; i < 64; i++) free(e->queues[i].items);
  pthread_cond_destroy(&e->wake);
  pthread_mutex_destroy(&e->lock);
  free(e);
  return s;
}

/* After a failure, the gradients half-accumulated in the graph's nodes are dropped so that a
 * later backward starts clean. */
static void drop_node_grads(node_list *all) {
  for (size_t i = 0; i < all->count; i++) {
    clpar_tensor_free(all->items[i]->grad);
    all->items[i]->grad = NULL;
  }
}

clpar_status clpar_backward(clpar_tensor *loss) {
  if (!loss) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_backward: loss is NULL");
  if (!loss->requires_grad)
    return clpar_set_error(
        CLPAR_ERROR_NO_GRADIENT,
        "clpar_backward: the tensor does not require a gradient (no input of the ops "
        "that made it requires one)");
  if (loss->numel != 1) {
    char b[128];
    return clpar_set_error(
        CLPAR_ERROR_SHAPE_MISMATCH,
        "clpar_backward: the loss is %s; backward starts from a tensor of one element",
        clpar_tensor_shape_str(loss, b, sizeof b));
  }
  clpar_tensor *seed;
  int was = clpar_set_grad_enabled(0);
  clpar_status s = clpar_tensor_empty(loss->storage->dev, loss->ndim, loss->shape, &seed);
  if (s == CLPAR_OK) {
    clpar_tensor_unscope(seed);
    s = clpar_fill(seed, 1.0f);
    if (s != CLPAR_OK) clpar_tensor_free(seed);
  }
  if (s != CLPAR_OK || !loss->node) {
    if (s == CLPAR_OK) s = deliver(loss, seed); /* a leaf loss: its gradient is 1 */
    clpar_set_grad_enabled(was);
    return s;
  }
  node_list all = {0};
  s = collect(loss->node, &all);
  clpar_node *root = loss->node;
  root->grad = seed;
  if (s == CLPAR_OK) s = run_graph(&all, root);
  if (s != CLPAR_OK) drop_node_grads(&all);
  free(all.items);
  clpar_set_grad_enabled(was);
  return s;
}
