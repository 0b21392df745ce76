/* flatten.c — flat parameters (clpar_module_flatten): a module's parameters on each device
 * placed one after another in one buffer, and their gradients in another of the same layout.
 * Every parameter stays the same tensor object (an optimizer, a user's pointer stay valid) but
 * becomes a view of the flat buffer, and its grad a view of the flat gradient.
 *
 * The group is represented by a flat leaf tensor: its storage is the parameters' memory, its
 * grad the gradients' memory (zeros until a backward fills it), and it requires a gradient, so
 * that a graph may lead into it: DataParallel replicates it in one copy and delivers each
 * replica's whole gradient into it with one add (src/parallel/data_parallel.c). Each member
 * retains the leaf (t->flat) and counts itself in flat_members; a member has a gradient when
 * one was delivered to it or to its leaf (clpar_tensor_has_grad). Moving a member moves the
 * whole group (clpar_tensor_move); clpar_module_to refuses to move part of a group. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A group in the making: the members on one device and their new memory. */
typedef struct {
  clpar_device *dev;
  int n;
  clpar_tensor **members; /* borrowed */
  size_t *offsets;        /* elements from the start of the flat buffer */
  clpar_tensor **grad_views;
  clpar_tensor *flat; /* the flat leaf, with its grad */
  int64_t total;
} group;

static void group_free(group *g) {
  for (int i = 0; g->grad_views && i < g->n; i++) clpar_tensor_release(g->grad_views[i]);
  clpar_tensor_release(g->flat);
  free(g->members);
  free(g->offsets);
  free(g->grad_views);
}

/* 1 when the members already are exactly one flat group, in place. */
static int already_flat(const group *g) {
  clpar_tensor *f = g->members[0]->flat;
  if (!f || __atomic_load_n(&f->flat_members, __ATOMIC_RELAXED) != g->n) return 0;
  for (int i = 0; i < g->n; i++)
    if (g->members[i]->flat != f || g->members[i]->storage != f->storage) return 0;
  return 1;
}

/* Allocates the group's buffers and copies the members' values (and gradients) into them. */
static clpar_status group_build(group *g) {
  g->offsets = calloc((size_t)g->n, sizeof *g->offsets);
  g->grad_views = calloc((size_t)g->n, sizeof *g->grad_views);
  if (!g->offsets || !g->grad_views)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_module_flatten: out of host memory");
  g->total = 0;
  for (int i = 0; i < g->n; i++) {
    if (g->members[i]->numel > INT64_MAX / 4 - g->total)
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                             "clpar_module_flatten: the parameters on %s have too many elements",
                             g->dev->bd.info.id);
    g->offsets[i] = (size_t)g->total;
    g->total += g->members[i]->numel;
  }
  clpar_tensor *flat = NULL, *grad = NULL;
  int was = clpar_memory_category_set(CLPAR_MEM_PARAMETERS);
  clpar_status s = clpar_tensor_empty(g->dev, 1, &g->total, &flat);
  clpar_memory_category_set(CLPAR_MEM_GRADIENTS);
  if (s == CLPAR_OK) {
    clpar_tensor_unscope(flat);
    g->flat = flat;
    s = clpar_tensor_zeros(g->dev, 1, &g->total, &grad);
  }
  clpar_memory_category_set(was);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(grad);
  flat->grad = grad;
  for (int i = 0; s == CLPAR_OK && i < g->n; i++) {
    clpar_tensor *p = g->members[i];
    size_t off = g->offsets[i] * sizeof(float);
    s = clpar_transfer(g->dev, flat->storage, off, p->storage->dev, p->storage,
                       p->offset * sizeof(float), (size_t)p->numel * sizeof(float));
    if (s == CLPAR_OK && p->grad)
      s = clpar_transfer(g->dev, grad->storage, off, p->grad->storage->dev, p->grad->storage,
                         p->grad->offset * sizeof(float), (size_t)p->numel * sizeof(float));
    if (s == CLPAR_OK)
      s = clpar_tensor_view_at(grad, g->offsets[i], p->ndim, p->shape, &g->grad_views[i]);
  }
  return s;
}

/* Makes the members views of the group's buffers (cannot fail). */
static void group_commit(group *g) {
  clpar_tensor *f = g->flat;
  f->requires_grad = 1;
  f->grad_defined = 0;
  for (int i = 0; i < g->n; i++) {
    clpar_tensor *p = g->members[i], *old = p->flat;
    int had = clpar_tensor_has_grad(p);
    clpar_tensor_repoint(p, f->storage, f->offset + g->offsets[i]);
    clpar_tensor_touch(p);
    clpar_tensor_free(p->grad);
    p->grad = g->grad_views[i];
    g->grad_views[i] = NULL;
    p->grad_defined = had;
    p->flat = clpar_tensor_retain(f);
    __atomic_add_fetch(&f->flat_members, 1, __ATOMIC_RELAXED);
    if (old) {
      __atomic_sub_fetch(&old->flat_members, 1, __ATOMIC_RELAXED);
      clpar_tensor_release(old);
    }
  }
}

clpar_status clpar_module_flatten(clpar_module *m) {
  if (!m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_flatten: module is NULL");
  clpar_graph_invalidate_all("clpar_module_flatten"); /* it re-makes the parameters' buffers */
  int n = clpar_module_parameter_count(m);
  if (n == 0) return CLPAR_OK;
  group *groups = calloc((size_t)n, sizeof *groups);
  if (!groups)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_module_flatten: out of host memory");
  int n_groups = 0;
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    clpar_tensor *p;
    const char *name;
    s = clpar_module_parameter_at(m, i, &name, &p);
    if (s == CLPAR_OK && p->dtype != CLPAR_FLOAT32) /* the flat buffers are float32 */
      s = clpar_set_error(
          CLPAR_ERROR_DTYPE,
          "clpar_module_flatten: parameter \"%s\" is %s; flat groups (DataParallel, "
          "DistributedDataParallel) need float32 parameters: train them under "
          "clpar_autocast_begin without clpar_master_weights",
          name, clpar_dtype_name(p->dtype));
    if (s != CLPAR_OK) break;
    int k = 0;
    while (k < n_groups && groups[k].dev != p->storage->dev) k++;
    if (k == n_groups) {
      groups[k].dev = p->storage->dev;
      groups[k].members = calloc((size_t)n, sizeof *groups[k].members);
      n_groups++;
      if (!groups[k].members)
        s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_module_flatten: out of host memory");
    }
    if (s == CLPAR_OK) groups[k].members[groups[k].n++] = p;
  }
  for (int k = 0; s == CLPAR_OK && k < n_groups; k++)
    if (!already_flat(&groups[k])) s = group_build(&groups[k]);
  if (s == CLPAR_OK) /* every buffer made and filled: nothing can fail from here */
    for (int k = 0; k < n_groups; k++)
      if (groups[k].flat) group_commit(&groups[k]);
  for (int k = 0; k < n_groups; k++) group_free(&groups[k]);
  free(groups);
  return s;
}
