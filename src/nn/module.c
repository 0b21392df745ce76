/* module.c — modules: a forward function with named children, parameters and buffers, and a
 * training flag, so that PyTorch's nn.Module classes can be written in C (the built-in Linear,
 * ReLU and Sequential are in linear.c, relu.c and sequential.c). Names are PyTorch's
 * ("seq1.0.weight", "bn1.running_mean"). Moving a module to a device moves each parameter and
 * buffer in place, so pointers held elsewhere (an optimizer) stay valid.
 *
 * A module may be used at several places (Sequential(relu, relu), one layer shared by two
 * models), so modules are reference counted: the first parent adopts the creator's reference
 * and every further place adds one (GObject's floating references). Cycles are refused. The
 * flat parameter list, as PyTorch's parameters(), lists each module and each parameter once,
 * under the first name met, so a shared parameter is counted and stepped once; the buffer and
 * state_dict lists do the same (PyTorch's state_dict repeats a shared tensor under each name;
 * safetensors' save_model drops the repeats, as here). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static uint64_t tree_generation = 1; /* bumped by every change to any module tree */

/* ---- a set of pointers, for walking trees whose parts may be shared ---- */

typedef struct {
  const void **slots; /* open addressing; NULL is free */
  size_t cap, count;
} ptr_set;

static size_t ptr_slot(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

/* Adds p: 1 when it is new, 0 when it was there already, -1 when out of memory. */
static int ptr_set_add(ptr_set *s, const void *p) {
  if (2 * (s->count + 1) > s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    const void **slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < s->cap; i++) {
      if (!s->slots[i]) continue;
      size_t j = ptr_slot(s->slots[i], cap);
      while (slots[j]) j = (j + 1) & (cap - 1);
      slots[j] = s->slots[i];
    }
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
  }
  size_t j = ptr_slot(p, s->cap);
  for (; s->slots[j]; j = (j + 1) & (s->cap - 1))
    if (s->slots[j] == p) return 0;
  s->slots[j] = p;
  s->count++;
  return 1;
}

/* ---- creating and freeing ---- */

clpar_status clpar_module_create(const char *type_name, clpar_forward_fn forward, void *user,
                                 void (*free_user)(void *), clpar_module **out) {
  if (!forward || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_module_create: NULL forward or out");
  clpar_module *m = calloc(1, sizeof *m);
  if (m) m->type = strdup(type_name ? type_name : "Module");
  if (!m || !m->type) {
    free(m);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_module_create: out of host memory");
  }
  m->forward = forward;
  m->user = user;
  m->free_user = free_user;
  m->refs = 1;
  m->training = 1;
  *out = m;
  return CLPAR_OK;
}

static void listing_free(clpar_listing *l) {
  for (int i = 0; i < l->n; i++) free(l->items[i].name);
  free(l->items);
  l->items = NULL;
  l->n = 0;
}

/* Drops one reference; the last one frees the module and drops its children's. */
void clpar_module_release(clpar_module *m) {
  if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  for (int i = 0; i < m->n_children; i++) {
    clpar_module_release(m->children[i].item);
    free(m->children[i].name);
  }
  for (int i = 0; i < m->n_params; i++) {
    clpar_tensor_release(m->params[i].item);
    free(m->params[i].name);
  }
  for (int i = 0; i < m->n_buffers; i++) {
    clpar_tensor_release(m->buffers[i].item);
    free(m->buffers[i].name);
  }
  for (int k = 0; k < 3; k++) listing_free(&m->lists[k]);
  for (int i = 0; i < m->n_retired; i++) free(m->retired[i]);
  if (m->free_user) m->free_user(m->user);
  free(m->retired);
  free(m->children);
  free(m->params);
  free(m->buffers);
  free(m->type);
  free(m);
}

/* What a function that takes ownership does with a module it cannot keep: the creator's
 * reference is dropped; a module that a parent holds is left to it. */
void clpar_module_drop_given(clpar_module *m) {
  if (m && !__atomic_load_n(&m->adopted, __ATOMIC_ACQUIRE)) clpar_module_release(m);
}

void clpar_module_free(clpar_module *m) {
  if (!m) return;
  if (__atomic_load_n(&m->adopted, __ATOMIC_ACQUIRE)) {
    clpar_log(CLPAR_LOG_WARN,
              "clpar_module_free: this %s module belongs to a parent module, which frees it; "
              "ignored",
              m->type);
    return;
  }
  clpar_module_release(m);
}

/* Appends (name, item) to a list; the name must be new in it. */
static clpar_status add_named(const char *fn, clpar_named **list, int *count, const char *name,
                              void *item) {
  if (!name || !*name || strchr(name, '.'))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: name \"%s\" must be non-empty and without '.'", fn,
                           name ? name : "(null)");
  for (int i = 0; i < *count; i++)
    if (strcmp((*list)[i].name, name) == 0)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: \"%s\" is already registered", fn,
                             name);
  clpar_named *grown = realloc(*list, (size_t)(*count + 1) * sizeof *grown);
  char *copy = strdup(name);
  if (grown) *list = grown;
  if (!grown || !copy) {
    free(copy);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  grown[*count].name = copy;
  grown[*count].item = item;
  grown[*count].is_buffer = 0; /* meaningful in the flat lists only */
  (*count)++;
  __atomic_add_fetch(&tree_generation, 1, __ATOMIC_RELAXED);
  return CLPAR_OK;
}

/* 1 when target is root or in root's tree, 0 when not, -1 when out of memory. */
static int contains(const clpar_module *root, const clpar_module *target, ptr_set *seen) {
  if (root == target) return 1;
  int r = ptr_set_add(seen, root);
  if (r <= 0) return r; /* met before (and not found then), or out of memory */
  for (int i = 0; i < root->n_children; i++)
    if ((r = contains(root->children[i].item, target, seen)) != 0) return r;
  return 0;
}

clpar_status clpar_module_add_child(clpar_module *m, const char *name, clpar_module *child) {
  if (!m || !child) {
    clpar_module_drop_given(child);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_add_child: NULL module");
  }
  ptr_set seen = {0};
  int cycle = contains(child, m, &seen);
  free(seen.slots);
  if (cycle != 0) /* child is m or holds it: it is the caller's tree, not to be freed */
    return cycle < 0 ? clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                                       "clpar_module_add_child: out of host memory")
                     : clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                                       "clpar_module_add_child: \"%s\" (%s) is the module itself "
                                       "or contains it; a module cannot be its own descendant "
                                       "(nothing was freed: free the module as before)",
                                       name ? name : "(null)", child->type);
  clpar_status s = add_named("clpar_module_add_child", &m->children, &m->n_children, name, child);
  if (s != CLPAR_OK) {
    clpar_module_drop_given(child);
    return s;
  }
  /* The first parent takes over the creator's reference; every further place adds one. */
  if (__atomic_exchange_n(&child->adopted, 1, __ATOMIC_ACQ_REL))
    __atomic_add_fetch(&child->refs, 1, __ATOMIC_RELAXED);
  return CLPAR_OK;
}

static void *find_named(const clpar_named *list, int count, const char *name) {
  for (int i = 0; name && i < count; i++)
    if (strcmp(list[i].name, name) == 0) return list[i].item;
  return NULL;
}

clpar_status clpar_module_add_parameter(clpar_module *m, const char *name, clpar_tensor *param) {
  if (!m || !param)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_module_add_parameter: NULL argument");
  if (param->node)
    return clpar_set_error(
        CLPAR_ERROR_INVALID_ARGUMENT,
        "clpar_module_add_parameter: \"%s\" is the result of an op; a parameter must be a leaf",
        name);
  if (param->dtype != CLPAR_FLOAT32 && !clpar_dtype_is_half(param->dtype)) {
    char b[128];
    return clpar_set_error(CLPAR_ERROR_DTYPE,
                           "clpar_module_add_parameter: \"%s\" is %s %s; parameters are float32 "
                           "(or 16-bit floats; keep an int tensor as a buffer)",
                           name ? name : "(null)", clpar_dtype_name(param->dtype),
                           clpar_tensor_shape_str(param, b, sizeof b));
  }
  if (name && find_named(m->buffers, m->n_buffers, name))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_module_add_parameter: \"%s\" is already registered as a buffer",
                           name);
  clpar_status s = add_named("clpar_module_add_parameter", &m->params, &m->n_params, name, param);
  if (s != CLPAR_OK) return s;
  clpar_tensor_retain(param);
  param->requires_grad = 1;
  clpar_storage_tag(param->storage, CLPAR_MEM_PARAMETERS);
  return CLPAR_OK;
}

clpar_status clpar_module_add_buffer(clpar_module *m, const char *name, clpar_tensor *buf) {
  if (!m || !buf)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_add_buffer: NULL argument");
  clpar_status alive = clpar_check_alive("clpar_module_add_buffer", buf);
  if (alive != CLPAR_OK) return alive;
  if (buf->node || buf->requires_grad)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_module_add_buffer: \"%s\" %s; a buffer is a leaf that needs no "
                           "gradient (running statistics, counters)",
                           name ? name : "(null)",
                           buf->node ? "is the result of an op" : "requires a gradient");
  if (name && find_named(m->params, m->n_params, name))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_module_add_buffer: \"%s\" is already registered as a parameter",
                           name);
  clpar_status s = add_named("clpar_module_add_buffer", &m->buffers, &m->n_buffers, name, buf);
  if (s != CLPAR_OK) return s;
  clpar_tensor_retain(buf);
  return CLPAR_OK;
}

clpar_module *clpar_module_child(const clpar_module *m, const char *name) {
  return m ? find_named(m->children, m->n_children, name) : NULL;
}

clpar_tensor *clpar_module_parameter(const clpar_module *m, const char *name) {
  return m ? find_named(m->params, m->n_params, name) : NULL;
}

clpar_tensor *clpar_module_buffer(const clpar_module *m, const char *name) {
  return m ? find_named(m->buffers, m->n_buffers, name) : NULL;
}

/* Adds every module of m's tree to seen; 0 when out of memory. */
static int collect_modules(const clpar_module *m, ptr_set *seen) {
  int r = ptr_set_add(seen, m);
  if (r <= 0) return r == 0; /* met before: its tree is in already */
  for (int i = 0; i < m->n_children; i++)
    if (!collect_modules(m->children[i].item, seen)) return 0;
  return 1;
}

clpar_status clpar_module_train(clpar_module *m, int on) {
  if (!m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_train: module is NULL");
  ptr_set seen = {0};
  if (!collect_modules(m, &seen)) { /* nothing changed yet */
    free(seen.slots);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_module_train: out of host memory");
  }
  for (size_t i = 0; i < seen.cap; i++)
    if (seen.slots[i]) ((clpar_module *)seen.slots[i])->training = on != 0;
  free(seen.slots);
  return CLPAR_OK;
}

clpar_status clpar_module_eval(clpar_module *m) {
  if (!m) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_eval: module is NULL");
  return clpar_module_train(m, 0);
}

int clpar_module_is_training(const clpar_module *m) {
  return m ? m->training : 0;
}

const char *clpar_module_type(const clpar_module *m) {
  return m ? m->type : NULL;
}

/* The modules whose forwards run on this thread, outermost first (the first FORWARD_STACK of
 * them), so that a Sequential can say under which name the module that ran it holds it. */
#define FORWARD_STACK 32
static _Thread_local const clpar_module *forward_stack[FORWARD_STACK];
static _Thread_local int forward_depth;

const char *clpar_module_running_name(const clpar_module *self) {
  int d = forward_depth - 1; /* self's frame */
  if (d < 1 || d >= FORWARD_STACK || forward_stack[d] != self) return NULL;
  const clpar_module *parent = forward_stack[d - 1];
  for (int k = 0; k < parent->n_children; k++)
    if (parent->children[k].item == self) return parent->children[k].name;
  return NULL;
}

clpar_status clpar_module_forward(clpar_module *m, clpar_tensor *input, clpar_tensor **output) {
  if (!m || !input || !output)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_forward: NULL argument");
  clpar_status alive = clpar_check_alive("clpar_module_forward", input);
  if (alive != CLPAR_OK) return alive;
  clpar_data_parallel_note_forward(m);
  if (forward_depth < FORWARD_STACK) forward_stack[forward_depth] = m;
  forward_depth++;
  clpar_status s = m->forward(m, input, output, m->user);
  forward_depth--;
  return s;
}

/* ---- the flat lists: parameters, buffers, state_dict ---- */

typedef struct {
  clpar_named *list;
  int count, cap;
  ptr_set modules, tensors; /* met so far */
} flat_walk;

static int flat_append(flat_walk *w, char *name, void *item, int is_buffer) {
  if (w->count == w->cap) {
    int c = w->cap ? 2 * w->cap : 16;
    clpar_named *grown = realloc(w->list, (size_t)c * sizeof *grown);
    if (!grown) return 0;
    w->list = grown;
    w->cap = c;
  }
  w->list[w->count].name = name;
  w->list[w->count].is_buffer = is_buffer;
  w->list[w->count++].item = item;
  return 1;
}

/* prefix + "." + name, or name alone at the top; NULL when out of memory. */
static char *full_name(const char *prefix, const char *name) {
  size_t len = strlen(prefix) + strlen(name) + 2;
  char *full = malloc(len);
  if (full) snprintf(full, len, "%s%s%s", prefix, *prefix ? "." : "", name);
  return full;
}

/* Appends the tensors of list (skipping those met before) with prefix + name; 0 when out of
 * memory. */
static int walk_tensors(const clpar_named *items, int n, int is_buffer, const char *prefix,
                        flat_walk *w) {
  for (int i = 0; i < n; i++) {
    int r = ptr_set_add(&w->tensors, items[i].item);
    if (r < 0) return 0;
    if (r == 0) continue; /* met before: listed already */
    char *full = full_name(prefix, items[i].name);
    if (!full || !flat_append(w, full, items[i].item, is_buffer)) {
      free(full);
      return 0;
    }
  }
  return 1;
}

/* Appends m's own tensors of the kind (the state_dict: parameters, then buffers), then its
 * children's, with prefix + name, skipping what was met before (PyTorch's named_parameters,
 * named_buffers and state_dict order). Returns 0 when out of memory. */
static int flatten(const clpar_module *m, const char *prefix, clpar_listing_kind kind,
                   flat_walk *w) {
  int r = ptr_set_add(&w->modules, m);
  if (r <= 0) return r == 0; /* met before: listed already */
  if (kind != CLPAR_LIST_BUFFERS && !walk_tensors(m->params, m->n_params, 0, prefix, w)) return 0;
  if (kind != CLPAR_LIST_PARAMS && !walk_tensors(m->buffers, m->n_buffers, 1, prefix, w)) return 0;
  for (int i = 0; i < m->n_children; i++) {
    char *full = full_name(prefix, m->children[i].name);
    int ok = full && flatten(m->children[i].item, full, kind, w);
    free(full);
    if (!ok) return 0;
  }
  return 1;
}

static void walk_free(flat_walk *w, int keep_list) {
  if (!keep_list) {
    for (int i = 0; i < w->count; i++) free(w->list[i].name);
    free(w->list);
  }
  free(w->modules.slots);
  free(w->tensors.slots);
}

int clpar_module_entry_count(const clpar_module *m) {
  int64_t n = m->n_params;
  for (int i = 0; i < m->n_children && n <= INT_MAX; i++)
    n += clpar_module_entry_count(m->children[i].item);
  return n > INT_MAX ? INT_MAX : (int)n;
}

static int same_list(const clpar_named *a, int na, const clpar_named *b, int nb) {
  if (na != nb) return 0;
  for (int i = 0; i < na; i++)
    if (a[i].item != b[i].item || a[i].is_buffer != b[i].is_buffer ||
        strcmp(a[i].name, b[i].name) != 0)
      return 0;
  return 1;
}

/* Rebuilds a flat list after any tree changed. Names handed out by parameter_at (buffer_at,
 * state_at) stay valid while the module lives: an unchanged list is kept as it is, a changed
 * one retires its names (kept until the module is freed) instead of freeing them. */
static clpar_status refresh_list(clpar_module *m, clpar_listing_kind kind) {
  static const char *const what[3] = {"parameters", "buffers", "the state"};
  clpar_listing *l = &m->lists[kind];
  uint64_t gen = __atomic_load_n(&tree_generation, __ATOMIC_RELAXED);
  if (l->generation == gen) return CLPAR_OK;
  flat_walk w = {0};
  int ok = flatten(m, "", kind, &w);
  if (ok && same_list(w.list, w.count, l->items, l->n)) {
    walk_free(&w, 0);
    l->generation = gen;
    return CLPAR_OK;
  }
  if (ok && l->names_lent) {
    char **grown = realloc(m->retired, (size_t)(m->n_retired + l->n + 1) * sizeof *grown);
    if (grown) {
      m->retired = grown;
      for (int i = 0; i < l->n; i++) m->retired[m->n_retired++] = l->items[i].name;
      l->n = 0; /* the names now belong to retired */
    }
    ok = grown != NULL;
  }
  if (!ok) {
    walk_free(&w, 0);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "listing %s: out of host memory", what[kind]);
  }
  listing_free(l);
  walk_free(&w, 1);
  l->items = w.list;
  l->n = w.count;
  l->names_lent = 0;
  l->generation = gen;
  return CLPAR_OK;
}

static clpar_status refresh_flat(clpar_module *m) {
  return refresh_list(m, CLPAR_LIST_PARAMS);
}

static int list_count(const clpar_module *m, clpar_listing_kind kind) {
  if (!m || refresh_list((clpar_module *)m, kind) != CLPAR_OK) return 0;
  return m->lists[kind].n;
}

static clpar_status list_at(const char *fn, const clpar_module *m, clpar_listing_kind kind, int i,
                            const char **name, clpar_tensor **t, int *is_buffer) {
  static const char *const what[3] = {"parameters", "buffers", "state entries"};
  if (!m) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: module is NULL", fn);
  clpar_status s = refresh_list((clpar_module *)m, kind);
  if (s != CLPAR_OK) return s;
  clpar_listing *l = &((clpar_module *)m)->lists[kind];
  if (i < 0 || i >= l->n)
    return clpar_set_error(CLPAR_ERROR_INDEX, "%s: index %d of %d %s", fn, i, l->n, what[kind]);
  if (name) {
    *name = l->items[i].name;
    l->names_lent = 1;
  }
  if (t) *t = l->items[i].item;
  if (is_buffer) *is_buffer = l->items[i].is_buffer;
  return CLPAR_OK;
}

int clpar_module_parameter_count(const clpar_module *m) {
  return list_count(m, CLPAR_LIST_PARAMS);
}

clpar_status clpar_module_parameter_at(const clpar_module *m, int i, const char **name,
                                       clpar_tensor **param) {
  return list_at("clpar_module_parameter_at", m, CLPAR_LIST_PARAMS, i, name, param, NULL);
}

int clpar_module_buffer_count(const clpar_module *m) {
  return list_count(m, CLPAR_LIST_BUFFERS);
}

clpar_status clpar_module_buffer_at(const clpar_module *m, int i, const char **name,
                                    clpar_tensor **buf) {
  return list_at("clpar_module_buffer_at", m, CLPAR_LIST_BUFFERS, i, name, buf, NULL);
}

int clpar_module_state_count(const clpar_module *m) {
  return list_count(m, CLPAR_LIST_STATE);
}

clpar_status clpar_module_state_at(const clpar_module *m, int i, const char **name,
                                   clpar_tensor **t, int *is_buffer) {
  return list_at("clpar_module_state_at", m, CLPAR_LIST_STATE, i, name, t, is_buffer);
}

/* 1 with *found = the first parallel wrapper (DataParallel, Pipeline) in root's tree (root
 * included), 0 when there is none, -1 when out of memory; each shared submodule is visited once. */
static int find_parallel(const clpar_module *root, ptr_set *seen, const clpar_module **found) {
  if (root->parallel) {
    *found = root;
    return 1;
  }
  int r = ptr_set_add(seen, root);
  if (r <= 0) return r;
  for (int i = 0; i < root->n_children; i++)
    if ((r = find_parallel(root->children[i].item, seen, found)) != 0) return r;
  return 0;
}

clpar_status clpar_module_to(clpar_module *m, clpar_device *dev) {
  if (!m || !dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_to: NULL argument");
  clpar_graph_invalidate_all("clpar_module_to"); /* graphs would use the old buffers */
  /* A wrapper's replicas live on its devices and its parameters on the first of them; moving
   * them under it would leave the replicas reading another device's memory. */
  const clpar_module *dp = NULL;
  ptr_set seen = {0};
  int r = find_parallel(m, &seen, &dp);
  free(seen.slots);
  if (r < 0)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_module_to: out of host memory");
  if (r > 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_module_to: the module %s a %s wrapper, whose "
                           "parameters and replicas stay on the devices it was created with; move "
                           "the module before wrapping it, or make a new wrapper",
                           dp == m ? "is" : "contains", dp->type);
  clpar_status s = refresh_flat(m);
  const clpar_listing *l = &m->lists[CLPAR_LIST_PARAMS];
  /* A flat group (clpar_module_flatten) moves whole: every member must be in m. */
  for (int i = 0; s == CLPAR_OK && i < l->n; i++) {
    clpar_tensor *f = ((clpar_tensor *)l->items[i].item)->flat;
    if (!f || f->storage->dev == dev) continue;
    int here = 0;
    for (int j = 0; j < l->n; j++) here += ((clpar_tensor *)l->items[j].item)->flat == f;
    if (here != __atomic_load_n(&f->flat_members, __ATOMIC_RELAXED))
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                          "clpar_module_to: \"%s\" shares a flat buffer (clpar_module_flatten) "
                          "with %d parameters outside this module; move the module that was "
                          "flattened",
                          l->items[i].name, f->flat_members - here);
  }
  if (s == CLPAR_OK) s = refresh_list(m, CLPAR_LIST_STATE);
  /* the state list is the parameters and the buffers, each once */
  l = &m->lists[CLPAR_LIST_STATE];
  for (int i = 0; s == CLPAR_OK && i < l->n; i++) s = clpar_tensor_move(l->items[i].item, dev);
  return s;
}

clpar_status clpar_module_zero_grad(clpar_module *m) {
  if (!m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_zero_grad: module is NULL");
  clpar_status s = refresh_flat(m);
  const clpar_listing *l = &m->lists[CLPAR_LIST_PARAMS];
  if (s != CLPAR_OK || l->n == 0) return s;
  /* one fill per flat buffer the module covers whole (clpar_module_flatten) */
  clpar_tensor **ts = malloc((size_t)l->n * sizeof *ts);
  if (!ts)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_module_zero_grad: out of host memory");
  for (int i = 0; i < l->n; i++) ts[i] = l->items[i].item;
  s = clpar_zero_grads("clpar_module_zero_grad", ts, l->n, NULL, NULL, NULL);
  free(ts);
  return s;
}
