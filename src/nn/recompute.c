/* recompute.c — activation checkpointing (include/clpar/recompute.h).
 *
 * The wrapper holds the wrapped module's children, parameters and buffers itself and runs the
 * wrapped module's forward function with self = the wrapper, so names are unchanged and
 * DataParallel's replicas (copies of the tree sharing user data) work as for any module.
 *
 * Forward: the wrapped forward runs with recording off; the output gets one node whose inputs
 * are the input and every parameter of the tree (each once), so that the engine delivers
 * their gradients as it would the module's own ops' (hooks, DDP's buckets, DataParallel's
 * replica parameters, which are not leaves). Backward: every input gets a fresh leaf viewing
 * its memory, the module's parameter entries are pointed at those leaves for the recompute (by
 * position in the tree: DataParallel rebinds a replica's entries after each forward), the
 * forward runs again, recording, and a nested backward from its output with the node's
 * gradient fills the leaves' gradients, which become the node's input gradients.
 *
 * Random draws (Dropout) go through clpar_rng_draw: the forward records each (seed, offset)
 * it drew on a tape of the node's, the recompute replays the tape, so the masks match even
 * when other forwards advanced the Dropout's offset in between (pipeline micro-batches,
 * DataParallel replicas sharing the Dropout's state). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CKPT_TYPE "ActivationCheckpoint"

/* ---- the random draws of a forward, recorded and replayed ---- */

typedef struct clpar_rng_tape {
  uint64_t *items; /* seed, offset, seed, offset, ... */
  size_t n, cap, next;
  int failed; /* recording ran out of memory, or the replay ran past its end */
} rng_tape;

static _Thread_local rng_tape *recording, *replaying;
static _Thread_local int last_replayed; /* the thread's last draw came from a tape */

int clpar_rng_draw_replayed(void) {
  return last_replayed;
}

void clpar_rng_draw(uint64_t seed, uint64_t *counter, uint64_t n, uint64_t *seed_out,
                    uint64_t *offset_out) {
  rng_tape *r = replaying, *w = recording;
  last_replayed = r && r->next + 2 <= r->n;
  if (last_replayed) {
    *seed_out = r->items[r->next++];
    *offset_out = r->items[r->next++];
  } else {
    if (r) r->failed = 1;
    *seed_out = seed;
    *offset_out = __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
  }
  if (!w) return;
  if (w->n + 2 > w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    uint64_t *grown = realloc(w->items, cap * sizeof *grown);
    if (!grown) {
      w->failed = 1;
      return;
    }
    w->items = grown;
    w->cap = cap;
  }
  w->items[w->n++] = *seed_out;
  w->items[w->n++] = *offset_out;
}

clpar_rng_tape *clpar_rng_tape_new(void) {
  return calloc(1, sizeof(rng_tape));
}

void clpar_rng_tape_free(clpar_rng_tape *t) {
  if (t) free(t->items);
  free(t);
}

void clpar_rng_tape_start(clpar_rng_tape *t, int replay, clpar_rng_tape *saved[2]) {
  saved[0] = replaying;
  saved[1] = recording;
  t->next = 0;
  t->failed = 0;
  if (!replay) t->n = 0;
  if (replay) replaying = t; /* recording inside a replay takes the replayed draws */
  recording = replay ? NULL : t;
}

int clpar_rng_tape_stop(clpar_rng_tape *t, int replay, clpar_rng_tape *const saved[2]) {
  replaying = saved[0];
  recording = saved[1];
  return t->failed || (replay && t->next != t->n) ? -1 : 0;
}

/* ---- the wrapper ---- */

typedef struct {
  clpar_module *inner; /* one reference: its forward and user data run on the wrapper */
} ckpt_state;

static void ckpt_state_free(void *p) {
  ckpt_state *st = p;
  if (st && st->inner) clpar_module_release(st->inner);
  free(st);
}

/* A node's context: what the recompute needs. */
typedef struct {
  clpar_module *self;  /* the wrapper (or a replica of it), one reference */
  clpar_module *inner; /* the wrapped module, one reference */
  int n_slots;
  int *slot_input; /* per parameter entry of self's tree, in walk order: its node input */
  rng_tape tape;
} ckpt_ctx;

static void module_retain(clpar_module *m) {
  __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
}

static void ctx_free(void *p) {
  ckpt_ctx *c = p;
  if (!c) return;
  if (c->self) clpar_module_release(c->self);
  if (c->inner) clpar_module_release(c->inner);
  free(c->slot_input);
  free(c->tape.items);
  free(c);
}

/* The parameter entries of m's tree in walk order (its own, then each child's). */
static int collect_slots(clpar_module *m, clpar_named **slots, int at) {
  for (int i = 0; i < m->n_params; i++) slots[at++] = &m->params[i];
  for (int i = 0; i < m->n_children; i++) at = collect_slots(m->children[i].item, slots, at);
  return at;
}

static clpar_status oom(const char *what) {
  return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
}

/* The node's inputs: x, then each parameter of self's tree once; c->slot_input maps the
 * tree's entries to them. */
static clpar_status gather(clpar_module *self, clpar_tensor *x, ckpt_ctx *c, clpar_tensor ***inputs,
                           int *n_inputs) {
  int n = clpar_module_entry_count(self);
  clpar_named **slots = malloc((size_t)(n + 1) * sizeof *slots);
  clpar_tensor **in = malloc((size_t)(n + 1) * sizeof *in);
  c->slot_input = malloc((size_t)(n + 1) * sizeof *c->slot_input);
  if (!slots || !in || !c->slot_input) {
    free(slots);
    free(in);
    return oom(CKPT_TYPE);
  }
  c->n_slots = collect_slots(self, slots, 0);
  int k = 1;
  in[0] = x;
  for (int j = 0; j < c->n_slots; j++) {
    clpar_tensor *p = slots[j]->item;
    int at = 1; /* linear: a module's tree has tens of parameters, not thousands */
    while (at < k && in[at] != p) at++;
    if (at == k) in[k++] = p;
    c->slot_input[j] = at;
  }
  free(slots);
  *inputs = in;
  *n_inputs = k;
  return CLPAR_OK;
}

static clpar_status ckpt_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin);

/* The wrapped forward with recording off, its draws on c's tape; *y a view of its output
 * with the node. */
static clpar_status forward_saving(clpar_module *self, clpar_tensor *x, ckpt_ctx *c,
                                   clpar_tensor *const *inputs, int n_inputs, clpar_tensor **y) {
  clpar_module *inner = c->inner;
  clpar_tensor *y0 = NULL, *out = NULL;
  rng_tape *outer = recording;
  recording = &c->tape;
  int was = clpar_set_grad_enabled(0);
  clpar_status s = inner->forward(self, x, &y0, inner->user);
  clpar_set_grad_enabled(was);
  recording = outer;
  if (s == CLPAR_OK && c->tape.failed) s = oom(CKPT_TYPE " forward");
  if (s == CLPAR_OK && y0->dtype != CLPAR_FLOAT32) { /* not differentiable: as it is */
    *y = y0;
    ctx_free(c);
    return CLPAR_OK;
  }
  if (s == CLPAR_OK) s = clpar_tensor_reshape(y0, y0->ndim, y0->shape, &out);
  clpar_node *node = NULL;
  if (s == CLPAR_OK && !(node = clpar_record(out, CKPT_TYPE, ckpt_backward, inputs, n_inputs))) {
    clpar_tensor_free(out);
    s = CLPAR_ERROR_OUT_OF_MEMORY;
  }
  clpar_tensor_free(y0);
  if (s != CLPAR_OK) {
    ctx_free(c);
    return s;
  }
  node->ctx = c;
  node->ctx_free = ctx_free;
  *y = out;
  return CLPAR_OK;
}

static clpar_status ckpt_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                 void *user) {
  clpar_module *inner = ((ckpt_state *)user)->inner;
  if (!clpar_is_grad_enabled()) return inner->forward(self, x, y, inner->user);
  ckpt_ctx *c = calloc(1, sizeof *c);
  if (!c) return oom(CKPT_TYPE);
  clpar_tensor **inputs = NULL;
  int n_inputs = 0;
  clpar_status s = gather(self, x, c, &inputs, &n_inputs);
  if (s != CLPAR_OK || !clpar_needs_grad(inputs, n_inputs)) { /* nothing to save */
    free(inputs);
    ctx_free(c);
    return s != CLPAR_OK ? s : inner->forward(self, x, y, inner->user);
  }
  c->self = self;
  c->inner = inner;
  module_retain(self);
  module_retain(inner);
  s = forward_saving(self, x, c, inputs, n_inputs, y);
  free(inputs);
  return s;
}

/* The recompute: leaves[i] stands for input i; self's parameter entries point at them while
 * the forward runs again, recording, replaying the tape; *y its output. */
static clpar_status recompute(ckpt_ctx *c, clpar_tensor **leaves, clpar_tensor **y) {
  int n = clpar_module_entry_count(c->self);
  clpar_named **slots = malloc((size_t)(n + 1) * sizeof *slots);
  clpar_tensor **old = malloc((size_t)(n + 1) * sizeof *old);
  if (!slots || !old) {
    free(slots);
    free(old);
    return oom(CKPT_TYPE " backward");
  }
  clpar_status s = CLPAR_OK;
  if (collect_slots(c->self, slots, 0) != c->n_slots)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, CKPT_TYPE
                        " backward: the module was given parameters or children "
                        "between its forward and this backward");
  for (int j = 0; s == CLPAR_OK && j < c->n_slots; j++) {
    old[j] = slots[j]->item;
    slots[j]->item = leaves[c->slot_input[j]];
  }
  if (s == CLPAR_OK) {
    rng_tape *was_replaying = replaying, *was_recording = recording;
    replaying = &c->tape;
    recording = NULL;
    c->tape.next = 0;
    c->tape.failed = 0;
    int was = clpar_set_grad_enabled(1);
    s = c->inner->forward(c->self, leaves[0], y, c->inner->user);
    clpar_set_grad_enabled(was);
    replaying = was_replaying;
    recording = was_recording;
    for (int j = 0; j < c->n_slots; j++) slots[j]->item = old[j];
    if (s == CLPAR_OK && (c->tape.failed || c->tape.next != c->tape.n)) {
      clpar_tensor_free(*y);
      *y = NULL;
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                          CKPT_TYPE
                          " backward: the recompute drew %s random numbers (Dropout) "
                          "than the forward did; was the module's training mode "
                          "changed between forward and backward?",
                          c->tape.failed ? "more" : "fewer");
    }
  }
  free(slots);
  free(old);
  return s;
}

static clpar_status ckpt_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  ckpt_ctx *c = n->ctx;
  clpar_tensor **leaves = calloc((size_t)n->n_inputs, sizeof *leaves), *y = NULL;
  if (!leaves) return oom(CKPT_TYPE " backward");
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < n->n_inputs; i++) {
    const clpar_tensor *in = n->inputs[i];
    s = clpar_tensor_view_at(in, 0, in->ndim, in->shape, &leaves[i]);
    if (s == CLPAR_OK) leaves[i]->requires_grad = in->requires_grad;
    /* An input whose gradient has memory already (a parameter of a flat group, a leaf after
     * an earlier backward, a slice of a tensor whose gradient is being accumulated) gets its
     * gradient added straight into it, in the order the module's own ops would add it: its
     * leaf's grad is that memory (clpar_grad_slot), and nothing is handed back for it. */
    if (s == CLPAR_OK) s = clpar_grad_slot(n, i, &leaves[i]->grad);
  }
  if (s == CLPAR_OK) s = recompute(c, leaves, &y);
  if (s == CLPAR_OK && (y->ndim != g->ndim || y->numel != g->numel)) {
    char a[128], b[128];
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        CKPT_TYPE " backward: the recompute gave %s where the forward gave %s",
                        clpar_tensor_shape_str(y, a, sizeof a),
                        clpar_tensor_shape_str(g, b, sizeof b));
  }
  if (s == CLPAR_OK && y->requires_grad) s = clpar_backward_grad(y, g);
  for (int i = 0; i < n->n_inputs; i++) {
    int slotted = i < 32 && ((n->slotted >> i) & 1);
    if (s == CLPAR_OK && leaves[i] && !slotted && n->inputs[i]->requires_grad &&
        clpar_tensor_has_grad(leaves[i])) {
      gin[i] = leaves[i]->grad; /* the leaf's own memory: handed over */
      leaves[i]->grad = NULL;
    }
    clpar_tensor_release(leaves[i]);
  }
  free(leaves);
  clpar_tensor_free(y);
  if (s != CLPAR_OK) clpar_prefix_error("%s backward: ", CKPT_TYPE);
  return s;
}

/* ---- creating ---- */

/* 1 when m's tree holds a parallel wrapper (DataParallel, Pipeline, DDP). */
static int holds_parallel(const clpar_module *m, int depth) {
  if (m->parallel) return 1;
  for (int i = 0; depth < 256 && i < m->n_children; i++)
    if (holds_parallel(m->children[i].item, depth + 1)) return 1;
  return 0;
}

/* The wrapper of module, taking over one reference to it (released on error). */
static clpar_status wrap(const char *fn, clpar_module *module, clpar_module **out) {
  ckpt_state *st = calloc(1, sizeof *st);
  clpar_module *w = NULL;
  if (!st) {
    clpar_module_release(module);
    return oom(fn);
  }
  st->inner = module;
  clpar_status s = clpar_module_create(CKPT_TYPE, ckpt_forward, st, ckpt_state_free, &w);
  if (s != CLPAR_OK) {
    ckpt_state_free(st);
    return s;
  }
  for (int i = 0; s == CLPAR_OK && i < module->n_params; i++) {
    clpar_tensor *p = module->params[i].item;
    int wanted = p->requires_grad; /* add_parameter sets it: a frozen one stays frozen */
    s = clpar_module_add_parameter(w, module->params[i].name, p);
    p->requires_grad = wanted;
  }
  for (int i = 0; s == CLPAR_OK && i < module->n_buffers; i++)
    s = clpar_module_add_buffer(w, module->buffers[i].name, module->buffers[i].item);
  for (int i = 0; s == CLPAR_OK && i < module->n_children; i++)
    s = clpar_module_add_child(w, module->children[i].name, module->children[i].item);
  if (s != CLPAR_OK) {
    clpar_prefix_error("%s: ", fn);
    clpar_module_release(w);
    return s;
  }
  w->training = module->training;
  *out = w;
  return CLPAR_OK;
}

static clpar_status refuse_parallel(const char *fn, const clpar_module *m) {
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "%s: the %s module %s a DataParallel, Pipeline or "
                         "DistributedDataParallel wrapper; checkpoint the modules inside it",
                         fn, m->type, m->parallel ? "is" : "contains");
}

clpar_status clpar_activation_checkpoint_create(clpar_module *module, clpar_module **out) {
  const char *fn = "clpar_activation_checkpoint_create";
  if (!module || !out) {
    clpar_module_drop_given(module);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                           module ? "out" : "module");
  }
  if (holds_parallel(module, 0)) {
    clpar_status s = refuse_parallel(fn, module);
    clpar_module_drop_given(module);
    return s;
  }
  /* the creator's reference when no parent holds module, else one of our own */
  if (__atomic_exchange_n(&module->adopted, 1, __ATOMIC_ACQ_REL)) module_retain(module);
  return wrap(fn, module, out);
}

clpar_status clpar_activation_checkpoint_children(clpar_module *m) {
  const char *fn = "clpar_activation_checkpoint_children";
  if (!m) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: module is NULL", fn);
  if (holds_parallel(m, 0)) return refuse_parallel(fn, m);
  clpar_module **made = calloc((size_t)m->n_children + 1, sizeof *made);
  if (!made) return oom(fn);
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < m->n_children; i++) {
    clpar_module *child = m->children[i].item;
    if (child->forward == ckpt_forward) continue;
    module_retain(child); /* the wrapper's */
    s = wrap(fn, child, &made[i]);
  }
  for (int i = 0; i < m->n_children; i++) {
    if (!made[i]) continue;
    if (s != CLPAR_OK) {
      clpar_module_release(made[i]);
      continue;
    }
    clpar_module *child = m->children[i].item;
    made[i]->adopted = 1; /* m's reference to the child is now its reference to the wrapper */
    m->children[i].item = made[i];
    clpar_module_release(child);
  }
  free(made);
  return s;
}

clpar_status clpar_gpt_checkpoint_blocks(clpar_module *gpt) {
  const char *fn = "clpar_gpt_checkpoint_blocks";
  clpar_module *h = clpar_module_child(clpar_module_child(gpt, "transformer"), "h");
  if (!gpt || strcmp(gpt->type, "GPT") != 0 || !h)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: not a GPT module (clpar_gpt_create): %s", fn,
                           gpt ? gpt->type : "NULL");
  clpar_status s = clpar_activation_checkpoint_children(h);
  if (s != CLPAR_OK) clpar_prefix_error("%s: ", fn);
  return s;
}
