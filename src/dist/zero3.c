/* zero3.c — ZeRO stage 3 (fully sharded data parallel) of a DistributedDataParallel module made
 * with clpar_ddp_options.zero_stage 3 (include/clpar/zero.h).
 *
 * Units: the wrapped module's children that hold parameters (a Sequential's layers, say), or
 * the wrapped module itself when it holds parameters of its own. Each unit is replaced in the
 * tree by a wrapper of type "FSDPUnit" that holds the unit's parameters, buffers and children
 * under their own names (so names and state_dict keys stay), as activation checkpointing's
 * wrapper does. A unit's parameters, in walk order, make one flat vector of numel floats, cut
 * into world shards of ceil(numel / world) (the tail zero-padded); each rank keeps only its
 * shard, a device leaf that requires a gradient. The module's parameter tensors are then
 * released: each becomes a [1] tensor holding NaN until clpar_zero_gather_parameters.
 *
 * Forward of a unit: its shards are all-gathered (MPI_Iallgather through host memory, on the
 * communication thread: zero3_comm.c) into one temporary device buffer, the module's parameter
 * entries point at views of it while the unit's forward runs without recording, and the
 * buffer is freed; the next unit's gather is started before (prefetch); the output gets one
 * node whose inputs are the input and the rank's shard. Backward of that node: the shards are
 * gathered again (prefetched by the unit after it, or by the forward's last unit), the one
 * before's gather starts, the forward runs again recording, on fresh leaves viewing the
 * gathered buffer whose gradients go into one zeroed buffer, a nested backward fills it, and
 * the buffer's read into host memory is posted for the thread to reduce-scatter
 * (MPI_Ireduce_scatter_block) and average into the unit's shard on the host, which the
 * optimizer's step writes into the shard's grad (the node gives the engine none). Both device
 * buffers are freed before the node's backward returns, so a rank holds at most one unit's full
 * parameters and gradients at a time. The optimizer (zero.c) steps the shards. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clpar/zero.h"
#include "internal.h"

#ifdef CLPAR_HAVE_MPI

#include "dist/zero3_internal.h"

#define UNIT_TYPE "FSDPUnit"

static clpar_status oom(const char *fn) {
  return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
}

static void module_retain(clpar_module *m) {
  __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
}

/* ---- the unit's parameter entries pointed elsewhere while its forward runs ---- */

static int count_slots(clpar_module *m) {
  int n = m->n_params;
  for (int i = 0; i < m->n_children; i++) n += count_slots(m->children[i].item);
  return n;
}

static int collect_slots(clpar_module *m, clpar_named **slots, int at) {
  for (int i = 0; i < m->n_params; i++) slots[at++] = &m->params[i];
  for (int i = 0; i < m->n_children; i++) at = collect_slots(m->children[i].item, slots, at);
  return at;
}

/* Views of full, one per parameter of u, each with the parameter's shape; with grad (a buffer
 * like full), each a leaf that requires a gradient going into its slice of grad. */
static clpar_status make_views(z3_unit *u, clpar_tensor *full, clpar_tensor *grad,
                               clpar_tensor **views) {
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < u->n_params; i++) {
    z3_param *p = &u->params[i];
    s = clpar_tensor_view_at(full, (size_t)p->at, p->ndim, p->shape, &views[i]);
    if (s == CLPAR_OK && grad) {
      views[i]->requires_grad = 1;
      s = clpar_tensor_view_at(grad, (size_t)p->at, p->ndim, p->shape, &views[i]->grad);
    }
  }
  return s;
}

/* The unit's forward with its parameter entries pointing at views (recording or not). */
static clpar_status run_on(z3_unit *u, clpar_tensor **views, clpar_tensor *x, int record,
                           clpar_tensor **y) {
  int n = count_slots(u->wrapper);
  clpar_named **slots = malloc((size_t)(n + 1) * sizeof *slots);
  if (!slots) return oom(UNIT_TYPE);
  collect_slots(u->wrapper, slots, 0);
  for (int j = 0; j < n; j++) /* entries of units inside this one stay theirs */
    for (int k = 0; k < u->n_params; k++)
      if (slots[j]->item == u->params[k].param) {
        slots[j]->item = views[k];
        break;
      }
  int was = clpar_set_grad_enabled(record);
  clpar_status s = u->inner->forward(u->wrapper, x, y, u->inner->user);
  clpar_set_grad_enabled(was);
  for (int j = 0; j < n; j++)
    for (int k = 0; k < u->n_params; k++)
      if (slots[j]->item == views[k]) slots[j]->item = u->params[k].param;
  free(slots);
  return s;
}

static void free_views(z3_unit *u, clpar_tensor **views) {
  for (int i = 0; i < u->n_params; i++) clpar_tensor_release(views[i]);
  free(views);
}

/* ---- the node ---- */

typedef struct {
  clpar_module *wrapper; /* one reference */
  clpar_rng_tape *tape;  /* the forward's random draws (Dropout), which the recompute replays */
  int captured;          /* the forward ran inside a capture */
} z3_ctx;

static void ctx_free(void *p) {
  z3_ctx *c = p;
  if (c && c->wrapper) clpar_module_release(c->wrapper);
  if (c) clpar_rng_tape_free(c->tape);
  free(c);
}

/* The recompute and nested backward; *grad the unit's full gradient. */
static clpar_status unit_recompute(z3_unit *u, clpar_node *n, clpar_tensor *g, clpar_tensor *full,
                                   clpar_tensor *grad, clpar_tensor **gx) {
  clpar_rng_tape *tape = ((z3_ctx *)n->ctx)->tape, *saved[2];
  clpar_tensor **views = calloc((size_t)u->n_params + 1, sizeof *views), *xleaf = NULL, *y = NULL;
  if (!views) return oom(UNIT_TYPE " backward");
  const clpar_tensor *x = n->inputs[0];
  clpar_status s = make_views(u, full, grad, views);
  if (s == CLPAR_OK) s = clpar_tensor_view_at(x, 0, x->ndim, x->shape, &xleaf);
  if (s == CLPAR_OK) {
    xleaf->requires_grad = x->requires_grad;
    s = clpar_grad_slot(n, 0, &xleaf->grad);
  }
  if (s == CLPAR_OK) {
    clpar_rng_tape_start(tape, 1, saved);
    s = run_on(u, views, xleaf, 1, &y);
    if (clpar_rng_tape_stop(tape, 1, saved) && s == CLPAR_OK)
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                          "the recompute drew other random numbers (Dropout) than the forward "
                          "did; was the module's training mode changed between forward and "
                          "backward?");
  }
  if (s == CLPAR_OK && (y->ndim != g->ndim || y->numel != g->numel))
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        "the recompute gave an output of another shape than the forward");
  if (s == CLPAR_OK && y->requires_grad) s = clpar_backward_grad(y, g);
  int slotted = (n->slotted & 1u) != 0;
  if (s == CLPAR_OK && xleaf && !slotted && x->requires_grad && clpar_tensor_has_grad(xleaf)) {
    *gx = xleaf->grad;
    xleaf->grad = NULL;
  }
  clpar_tensor_free(y);
  clpar_tensor_release(xleaf);
  free_views(u, views);
  return s;
}

/* ---- prefetch: the unit whose parameters come next ---- */

#define GATHER_FORWARD UNIT_TYPE " forward: all-gather of the parameters"
#define GATHER_BACKWARD UNIT_TYPE " backward: all-gather of the parameters"

/* The unit after u in a forward (the root unit runs the others inside its own: its first
 * child unit), or NULL; the units inside the root are in the order of their container. */
static z3_unit *next_forward(const z3_unit *u) {
  zero3 *z = u->z;
  int k = 0, children = z->root >= 0 ? z->root : z->n_units;
  while (z->units[k] != u) k++;
  if (k == z->root) return children > 0 ? z->units[0] : NULL;
  return k + 1 < children ? z->units[k + 1] : NULL;
}

/* The unit before u in a backward: the one before it in its container (the root unit's
 * gathered already: it holds them while the others run inside its backward), or NULL. */
static z3_unit *next_backward(const z3_unit *u) {
  zero3 *z = u->z;
  int k = 0;
  while (z->units[k] != u) k++;
  return k > 0 && k != z->root ? z->units[k - 1] : NULL;
}

static clpar_status unit_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  z3_unit *u = ((z3_ctx *)n->ctx)->wrapper->user;
  clpar_tensor *full = NULL, *grad = NULL;
  if (clpar_capture_active(u->z->dev) && !((z3_ctx *)n->ctx)->captured)
    return clpar_capture_refuse(u->z->dev, UNIT_TYPE " backward",
                                "a backward whose forward ran before the capture");
  clpar_status s = clpar_z3_gather_full(u, GATHER_BACKWARD, &full);
  z3_unit *before = next_backward(u);
  if (s == CLPAR_OK && before) clpar_z3_prefetch(before, GATHER_BACKWARD);
  if (s == CLPAR_OK) {
    int was = clpar_memory_category_set(CLPAR_MEM_GRADIENTS);
    s = clpar_tensor_zeros(u->z->dev, 1, &u->numel, &grad);
    clpar_memory_category_set(was);
    if (s == CLPAR_OK) clpar_tensor_unscope(grad);
  }
  if (s == CLPAR_OK) s = unit_recompute(u, n, g, full, grad, &gin[0]);
  clpar_tensor_release(full);
  /* every rank reduces (one that failed sends zeros), so that none waits; the reduction runs
   * on the communication thread while the units before this one compute, and the shard's
   * gradient is the step's to take (clpar_zero3_flush), not the engine's */
  if (s != CLPAR_ERROR_TIMEOUT) {
    if (s != CLPAR_OK) {
      clpar_tensor_release(grad);
      grad = NULL;
    }
    clpar_z3_post_scatter(u, grad);
    grad = NULL;
  }
  clpar_tensor_release(grad);
  if (s != CLPAR_OK) clpar_prefix_error("%s backward: ", UNIT_TYPE);
  return s;
}

static clpar_status unit_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                 void *user) {
  z3_unit *u = user;
  clpar_tensor *full = NULL, *y0 = NULL, *out = NULL;
  clpar_tensor **views = calloc((size_t)u->n_params + 1, sizeof *views);
  z3_ctx *c = clpar_is_grad_enabled() ? calloc(1, sizeof *c) : NULL;
  if (c) {
    c->tape = clpar_rng_tape_new();
    c->captured = clpar_capture_active(u->z->dev);
  }
  if (!views || (clpar_is_grad_enabled() && (!c || !c->tape))) {
    free(views);
    ctx_free(c);
    return oom(UNIT_TYPE);
  }
  clpar_status s = clpar_z3_gather_full(u, GATHER_FORWARD, &full);
  /* the next unit's parameters; after the last unit of a recorded forward, its own for the
   * backward, which starts with it */
  z3_unit *after = next_forward(u);
  if (s == CLPAR_OK && (after || c))
    clpar_z3_prefetch(after ? after : u, after ? GATHER_FORWARD : GATHER_BACKWARD);
  if (s == CLPAR_OK) s = make_views(u, full, NULL, views);
  if (s == CLPAR_OK) {
    clpar_rng_tape *saved[2];
    if (c) clpar_rng_tape_start(c->tape, 0, saved);
    s = run_on(u, views, x, 0, &y0);
    if (c && clpar_rng_tape_stop(c->tape, 0, saved) && s == CLPAR_OK) {
      clpar_tensor_free(y0);
      s = oom(UNIT_TYPE " forward");
    }
  }
  free_views(u, views);
  clpar_tensor_release(full);
  if (s != CLPAR_OK || !c || y0->dtype != CLPAR_FLOAT32) {
    if (s == CLPAR_OK) *y = y0;
    ctx_free(c);
    return s;
  }
  s = clpar_tensor_reshape(y0, y0->ndim, y0->shape, &out);
  clpar_tensor_free(y0);
  clpar_tensor *inputs[2] = {x, u->pshard};
  clpar_node *node = NULL;
  if (s == CLPAR_OK && !(node = clpar_record(out, UNIT_TYPE, unit_backward, inputs, 2)))
    s = CLPAR_ERROR_OUT_OF_MEMORY;
  if (s != CLPAR_OK) {
    clpar_tensor_free(out);
    ctx_free(c);
    return s;
  }
  module_retain(self);
  c->wrapper = self;
  node->ctx = c;
  node->ctx_free = ctx_free;
  *y = out;
  return CLPAR_OK;
}

/* ---- making the units ---- */

/* The unit's struct and acc go with the last of its two holders, the wrapper and zero3. A
 * module's children are freed before it, so the wrappers go before the DDP module stops the
 * communication thread, which runs every collective posted before the stop, on every rank
 * alike (so their sequences stay matched); those read the unit (its shard, acc) and must find
 * it there. zero3 lets go once the thread has ended; a wrapper can also outlive zero3 (a failed
 * clpar_ddp_create frees zero3 first), so neither holder waits for or touches the other. */
static void unit_put(z3_unit *u) {
  if (__atomic_sub_fetch(&u->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  free(u->acc);
  free(u);
}

/* The wrapper's free: what the module's tree holds goes now (the thread uses none of it). */
static void unit_free(void *p) {
  z3_unit *u = p;
  if (!u) return;
  for (int i = 0; i < u->n_params; i++) clpar_tensor_release(u->params[i].param);
  free(u->params);
  u->params = NULL;
  u->n_params = 0;
  clpar_tensor_release(u->pshard);
  u->pshard = NULL;
  if (u->inner) clpar_module_release(u->inner);
  u->inner = NULL;
  unit_put(u);
}

/* 1 when t is a parameter of one of the units made so far. */
static int in_units(const zero3 *z, const clpar_tensor *t) {
  for (int k = 0; k < z->n_units; k++)
    for (int i = 0; i < z->units[k]->n_params; i++)
      if (z->units[k]->params[i].param == t) return 1;
  return 0;
}

/* u's parameters: each distinct tensor of the unit's tree once, in walk order, but those of
 * the units made already (inside it: the root unit holds what the others leave). */
static clpar_status unit_params(z3_unit *u, clpar_module *m, const char *fn) {
  int n = count_slots(m);
  clpar_named **slots = malloc((size_t)(n + 1) * sizeof *slots);
  u->params = calloc((size_t)n + 1, sizeof *u->params);
  if (!slots || !u->params) {
    free(slots);
    return oom(fn);
  }
  collect_slots(m, slots, 0);
  clpar_status s = CLPAR_OK;
  for (int j = 0; s == CLPAR_OK && j < n; j++) {
    clpar_tensor *t = slots[j]->item;
    int k = 0;
    while (k < u->n_params && u->params[k].param != t) k++;
    if (k < u->n_params || in_units(u->z, t)) continue;
    if (t->dtype != CLPAR_FLOAT32 || t->numel > INT32_MAX - u->numel)
      s = clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                          "%s: ZeRO stage 3 shards float32 units of fewer than 2^31 floats", fn);
    z3_param *p = &u->params[u->n_params++];
    p->param = clpar_tensor_retain(t);
    p->ndim = t->ndim;
    memcpy(p->shape, t->shape, sizeof p->shape);
    p->at = u->numel;
    u->numel += t->numel;
  }
  free(slots);
  return s;
}

/* The wrapper of m (one reference of ours to m taken over): m's parameters, buffers and
 * children under their own names. */
static clpar_status wrap(zero3 *z, clpar_module *m, const char *fn, z3_unit **out) {
  z3_unit *u = calloc(1, sizeof *u);
  if (!u) {
    clpar_module_release(m);
    return oom(fn);
  }
  u->z = z;
  u->inner = m;
  u->refs = 1; /* the wrapper's; zero3's when it takes the unit */
  clpar_status s = unit_params(u, m, fn);
  if (s != CLPAR_OK) {
    unit_free(u);
    return s;
  }
  clpar_module *w = NULL;
  s = clpar_module_create(UNIT_TYPE, unit_forward, u, unit_free, &w);
  if (s != CLPAR_OK) {
    unit_free(u);
    return s;
  }
  u->wrapper = w;
  for (int i = 0; s == CLPAR_OK && i < m->n_params; i++) {
    clpar_tensor *p = m->params[i].item;
    int wanted = p->requires_grad;
    s = clpar_module_add_parameter(w, m->params[i].name, p);
    p->requires_grad = wanted;
  }
  for (int i = 0; s == CLPAR_OK && i < m->n_buffers; i++)
    s = clpar_module_add_buffer(w, m->buffers[i].name, m->buffers[i].item);
  for (int i = 0; s == CLPAR_OK && i < m->n_children; i++)
    s = clpar_module_add_child(w, m->children[i].name, m->children[i].item);
  if (s != CLPAR_OK) {
    clpar_module_release(w);
    return s;
  }
  w->training = m->training;
  *out = u;
  return CLPAR_OK;
}

/* The rank's shard of u from the unit's values (the same on every rank: broadcast from rank 0
 * when the module was made), and the host memory the collectives need. */
clpar_status clpar_z3_unit_values(z3_unit *u, const char *fn, float **out) {
  float *all = *out = calloc((size_t)(u->shard * u->z->world), sizeof(float));
  if (!all) return oom(fn);
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < u->n_params; i++)
    s = clpar_tensor_read(u->params[i].param, all + u->params[i].at,
                          (size_t)u->params[i].param->numel);
  return s;
}

static clpar_status make_shard(zero3 *z, z3_unit *u) {
  u->shard = (u->numel + z->world - 1) / z->world;
  float *all = NULL;
  clpar_status s = clpar_z3_unit_values(u, "clpar_ddp_create", &all);
  int was = clpar_memory_category_set(CLPAR_MEM_PARAMETERS);
  if (s == CLPAR_OK)
    s = clpar_tensor_from_host(z->dev, 1, &u->shard, all + z->rank * u->shard, &u->pshard);
  clpar_memory_category_set(was);
  free(all);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(u->pshard);
  u->pshard->requires_grad = 1;
  if (u->shard > z->max_shard) z->max_shard = u->shard;
  return CLPAR_OK;
}

/* A parameter gives up its memory (and its flat group's): a [1] view of the placeholder. */
static void release_param(zero3 *z, clpar_tensor *t) {
  clpar_tensor_release(t->grad);
  t->grad = NULL;
  t->grad_defined = 0;
  if (t->flat) {
    __atomic_sub_fetch(&t->flat->flat_members, 1, __ATOMIC_RELAXED);
    clpar_tensor_release(t->flat);
    t->flat = NULL;
  }
  clpar_tensor_repoint(t, z->placeholder->storage, z->placeholder->offset);
  t->ndim = 1;
  t->shape[0] = 1;
  t->numel = 1;
  clpar_tensor_touch(t);
}

void clpar_z3_release_all(zero3 *z) {
  for (int k = 0; k < z->n_units; k++)
    for (int i = 0; i < z->units[k]->n_params; i++) release_param(z, z->units[k]->params[i].param);
  z->gathered = 0;
}

/* The module named path ("transformer.h") under root; root for NULL or "". */
static clpar_module *find_container(clpar_module *root, const char *path) {
  char name[256];
  clpar_module *m = root;
  while (m && path && *path) {
    size_t n = strcspn(path, ".");
    if (n >= sizeof name) return NULL;
    memcpy(name, path, n);
    name[n] = '\0';
    m = clpar_module_child(m, name);
    path += n + (path[n] == '.');
  }
  return m;
}

/* The units inside c: its children that hold parameters, each wrapped (made[i] for child i),
 * refused when two share a parameter, then put in c's place of the child. */
static clpar_status child_units(zero3 *z, clpar_module *c, z3_unit **made) {
  const char *fn = "clpar_ddp_create";
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < c->n_children; i++) {
    clpar_module *child = c->children[i].item;
    if (count_slots(child) == 0) continue;
    module_retain(child);
    s = wrap(z, child, fn, &made[i]); /* every parameter of the child's tree */
  }
  for (int i = 0; s == CLPAR_OK && i < c->n_children; i++) /* a tensor in two units */
    for (int j = 0; made[i] && j < made[i]->n_params; j++)
      for (int k = i + 1; k < c->n_children; k++)
        for (int m = 0; made[k] && m < made[k]->n_params; m++)
          if (made[k]->params[m].param == made[i]->params[j].param)
            s = clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                                "%s: ZeRO stage 3: children %s and %s share a parameter; a "
                                "parameter belongs to one unit (tied weights are not sharded)",
                                fn, c->children[i].name, c->children[k].name);
  for (int i = 0; i < c->n_children; i++) {
    if (!made[i]) continue;
    if (s != CLPAR_OK) {
      clpar_module_release(made[i]->wrapper);
      continue;
    }
    made[i]->wrapper->adopted = 1; /* c's reference to the child is now one to the wrapper */
    c->children[i].item = made[i]->wrapper;
    clpar_module_release(made[i]->inner);
    __atomic_add_fetch(&made[i]->refs, 1, __ATOMIC_RELAXED); /* zero3's */
    z->units[z->n_units++] = made[i];
  }
  return s;
}

/* How many of the n entries hold t. */
static int holds(clpar_named **slots, int n, const clpar_tensor *t) {
  int k = 0;
  for (int j = 0; j < n; j++) k += slots[j]->item == t;
  return k;
}

/* Refuses a unit's parameter that a module outside the unit also holds (a weight tied across
 * units would be gathered by one of them only). */
static clpar_status check_tied(zero3 *z, clpar_module *root) {
  int n = count_slots(root);
  clpar_named **all = malloc((size_t)(n + 1) * sizeof *all), **mine = NULL;
  if (!all) return oom("clpar_ddp_create");
  collect_slots(root, all, 0);
  clpar_status s = CLPAR_OK;
  for (int k = 0; s == CLPAR_OK && k < z->n_units; k++) {
    z3_unit *u = z->units[k];
    int m = count_slots(u->wrapper);
    free(mine);
    if (!(mine = malloc((size_t)(m + 1) * sizeof *mine))) {
      s = oom("clpar_ddp_create");
      break;
    }
    collect_slots(u->wrapper, mine, 0);
    for (int i = 0; s == CLPAR_OK && i < u->n_params; i++)
      if (holds(all, n, u->params[i].param) > holds(mine, m, u->params[i].param))
        s = clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                            "clpar_ddp_create: ZeRO stage 3: a parameter of unit %d is also "
                            "held outside it; a parameter belongs to one unit (tied weights "
                            "are not sharded across units)",
                            k);
  }
  free(mine);
  free(all);
  return s;
}

/* The root unit: root's parameters that no other unit holds (all of them when there is no
 * other), gathered around root's whole forward; root's creator reference becomes the
 * wrapper's, which replaces *module. */
static clpar_status root_unit(zero3 *z, ddp_state *st, clpar_module **module) {
  int left = 0;
  for (int i = 0; i < st->n_params; i++) left += !in_units(z, st->params[i].param);
  clpar_module *root = *module;
  clpar_status s = check_tied(z, root);
  if (s != CLPAR_OK || left == 0) return s;
  z3_unit *u = NULL;
  module_retain(root);
  s = wrap(z, root, "clpar_ddp_create", &u);
  if (s != CLPAR_OK) return s;
  z->root = z->n_units;
  __atomic_add_fetch(&u->refs, 1, __ATOMIC_RELAXED);
  z->units[z->n_units++] = u;
  root->adopted = 1;
  clpar_module_release(root);
  *module = u->wrapper;
  return CLPAR_OK;
}

static void zero3_free(zero3 *z) {
  if (!z) return;
  clpar_tensor_release(z->placeholder);
  clpar_z3_comm_free(z); /* after the communication thread ended */
  for (int k = 0; k < z->n_units; k++) unit_put(z->units[k]);
  free(z->units);
  free(z);
}

void clpar_zero3_free(ddp_state *st) {
  zero3_free(st->zero3);
  st->zero3 = NULL;
}

/* The placeholder a released parameter views: [1] holding NaN. */
static clpar_status make_placeholder(zero3 *z) {
  int was = clpar_memory_category_set(CLPAR_MEM_PARAMETERS);
  clpar_status s = clpar_tensor_empty(z->dev, 1, (int64_t[]){1}, &z->placeholder);
  clpar_memory_category_set(was);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(z->placeholder);
  return clpar_fill(z->placeholder, NAN);
}

clpar_status clpar_zero3_setup(ddp_state *st, clpar_module **module, const char *units) {
  const char *fn = "clpar_ddp_create";
  clpar_module *c = find_container(*module, units);
  if (!c)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: zero_units is \"%s\", which names no module of the model", fn,
                           units);
  zero3 *z = calloc(1, sizeof *z);
  if (z) {
    z->st = st;
    z->gcomm = z->rcomm = MPI_COMM_NULL;
    z->root = -1;
  }
  z3_unit **made = calloc((size_t)c->n_children + 1, sizeof *made);
  if (!z || !made || !(z->units = calloc((size_t)c->n_children + 2, sizeof *z->units))) {
    free(made);
    zero3_free(z);
    return oom(fn);
  }
  z->world = st->world;
  z->rank = clpar_dist_rank();
  z->dev = st->params[0].param->storage->dev;
  clpar_status s = clpar_z3_comm_dup(z); /* first: collective on every rank */
  for (int i = 0; s == CLPAR_OK && i < st->n_params; i++)
    if (st->params[i].param->storage->dev != z->dev)
      s = clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                          "%s: ZeRO shards a module that lives on one device", fn);
  if (s == CLPAR_OK) s = make_placeholder(z);
  /* units inside c when c is below the root or the root holds no parameter itself */
  if (s == CLPAR_OK && (c != *module || c->n_params == 0)) s = child_units(z, c, made);
  free(made);
  if (s == CLPAR_OK) s = root_unit(z, st, module);
  for (int k = 0; s == CLPAR_OK && k < z->n_units; k++) s = make_shard(z, z->units[k]);
  if (s == CLPAR_OK) s = clpar_z3_comm_setup(z);
  if (s != CLPAR_OK) {
    zero3_free(z);
    return s;
  }
  clpar_z3_release_all(z);       /* the flat group's memory goes with its last member */
  pthread_mutex_lock(&st->lock); /* the communication thread looks for ZeRO-3's slots */
  st->zero3 = z;
  pthread_mutex_unlock(&st->lock);
  return CLPAR_OK;
}

#endif
