/* capture_prepared.c — prepared launches for a captured graph's commands.
 *
 * A replay posts the graph's commands to the worker as they were recorded; for each command
 * the backend could prepare during the capture run (its kernels made with their arguments
 * already set: backend.h's prepare_* entries), the worker runs the prepared launch instead of
 * calling the entry, which would set every argument again. Ordering is unchanged: the
 * prepared launch takes its command's place in the list. Commands the backend cannot prepare
 * (CLBlast's GEMMs, transfers, events) and patched ones run through their entry as ever. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER; /* every capture's list */
static int forced_off;                                        /* atomic */

void clpar_prepared_force_off(int off) {
  __atomic_store_n(&forced_off, off != 0, __ATOMIC_RELAXED);
}

int clpar_prepared_wanted(const clpar_device *dev) {
  const clpar_backend_iface *f = dev->bd.iface;
  return !__atomic_load_n(&forced_off, __ATOMIC_RELAXED) && f->prepare_begin && f->prepare_end &&
         f->prepare_run && f->prepare_free;
}

static int list_add(clpar_prepared_list *l, size_t index, void *launch) {
  pthread_mutex_lock(&list_lock);
  int ok = l->n < l->cap;
  if (!ok) {
    size_t cap = l->cap ? 2 * l->cap : 256;
    size_t *grown_i = realloc(l->index, cap * sizeof *grown_i);
    if (grown_i) l->index = grown_i;
    void **grown_l = grown_i ? realloc(l->launch, cap * sizeof *grown_l) : NULL;
    if (grown_l) {
      l->launch = grown_l;
      l->cap = cap;
      ok = 1;
    }
  }
  if (ok) {
    l->index[l->n] = index;
    l->launch[l->n++] = launch;
  }
  pthread_mutex_unlock(&list_lock);
  return ok;
}

clpar_status clpar_prepared_record(clpar_device *dev, clpar_command *c,
                                   clpar_status (*run)(clpar_device *, clpar_command *)) {
  const clpar_backend_iface *f = dev->bd.iface;
  if (f->prepare_begin(dev->bd.ctx) != CLPAR_OK) return run(dev, c);
  clpar_status s = run(dev, c);
  void *launch = NULL;
  clpar_status e = f->prepare_end(dev->bd.ctx, clpar_op_name(c->op), &launch);
  clpar_prepared_list *l = __atomic_load_n(&dev->preparing, __ATOMIC_ACQUIRE);
  if (launch &&
      (s != CLPAR_OK || e != CLPAR_OK || !l || !list_add(l, c->capture_index - 1, launch)))
    f->prepare_free(dev->bd.ctx, launch); /* the replay calls the entry */
  return s;
}

clpar_status clpar_prepared_run(clpar_device *dev, void *const *launch, size_t n) {
  __atomic_add_fetch(&dev->prepared_runs, n, __ATOMIC_RELAXED);
  clpar_status s = CLPAR_OK;
  for (size_t i = 0; i < n && s == CLPAR_OK; i++)
    s = dev->bd.iface->prepare_run(dev->bd.ctx, launch[i]);
  return s;
}

void clpar_prepared_drop(clpar_prepared_list *l, clpar_device *dev, size_t index) {
  pthread_mutex_lock(&list_lock);
  for (size_t i = 0; i < l->n; i++)
    if (l->index[i] == index) {
      dev->bd.iface->prepare_free(dev->bd.ctx, l->launch[i]);
      memmove(l->index + i, l->index + i + 1, (l->n - i - 1) * sizeof *l->index);
      memmove(l->launch + i, l->launch + i + 1, (l->n - i - 1) * sizeof *l->launch);
      l->n--;
      break;
    }
  pthread_mutex_unlock(&list_lock);
}

void clpar_prepared_remap(clpar_prepared_list *l, clpar_device *dev, const size_t *map,
                          const clpar_command *cmds) {
  pthread_mutex_lock(&list_lock);
  size_t k = 0;
  for (size_t i = 0; i < l->n; i++) {
    size_t at = map[l->index[i]];
    if (cmds[at].op == CLPAR_ENTRY_ew_chain) { /* fused into a chain: its launch is not run */
      dev->bd.iface->prepare_free(dev->bd.ctx, l->launch[i]);
      continue;
    }
    l->index[k] = at;
    l->launch[k++] = l->launch[i];
  }
  l->n = k;
  pthread_mutex_unlock(&list_lock);
}

size_t clpar_prepared_pack(clpar_prepared_list *l, const clpar_command *cmds, size_t n,
                           const clpar_command **out) {
  *out = cmds;
  if (l->n == 0) return n;
  if (!l->packed && !(l->packed = malloc(n * sizeof *l->packed))) return n;
  size_t k = 0, j = 0; /* l->index[j]: the next prepared command */
  for (size_t i = 0; i < n; k++) {
    l->packed[k] = cmds[i];
    if (j == l->n || l->index[j] != i) {
      i++;
      continue;
    }
    size_t run = 1; /* consecutive commands' launches are consecutive in the list */
    while (i + run < n && j + run < l->n && l->index[j + run] == i + run) run++;
    l->packed[k].op = CLPAR_OP_PREPARED;
    l->packed[k].u.prepared_run.launch = &l->launch[j];
    l->packed[k].u.prepared_run.n = run;
    i += run;
    j += run;
  }
  *out = l->packed;
  return k;
}

void clpar_prepared_release(clpar_prepared_list *l, clpar_device *dev) {
  pthread_mutex_lock(&list_lock);
  for (size_t i = 0; dev && i < l->n; i++) dev->bd.iface->prepare_free(dev->bd.ctx, l->launch[i]);
  free(l->index);
  free(l->launch);
  free(l->packed);
  *l = (clpar_prepared_list){NULL, NULL, 0, 0, NULL};
  pthread_mutex_unlock(&list_lock);
}
