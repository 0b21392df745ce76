/* flat_groups.c — ops over whole flat groups (clpar_module_flatten): when every member of a
 * group is among the tensors an optimizer steps or zeroes, one op covers the group's flat
 * buffer instead of one per member. It reads the tensors only, so the module code
 * (module.c) and the optimizers (optim.c) call it without a cycle through flatten.c. */
#include <stdlib.h>

#include "internal.h"

/* 1 when t is a member of its flat group in place: a view of the leaf's memory, and its grad
 * the same slice of the leaf's grad. */
static int member_in_place(const clpar_tensor *t) {
  const clpar_tensor *f = t->flat;
  return f && f->grad && t->grad && t->storage == f->storage &&
         t->grad->storage == f->grad->storage && t->offset >= f->offset &&
         t->grad->offset >= f->grad->offset &&
         t->offset - f->offset == t->grad->offset - f->grad->offset;
}

int clpar_flat_whole_groups(clpar_tensor *const *ts, int n, int *group_of, clpar_tensor **leaves,
                            int *counts) {
  int n_groups = 0;
  for (int i = 0; i < n; i++) {
    group_of[i] = -1;
    if (!ts[i] || !member_in_place(ts[i])) continue;
    int k = 0;
    while (k < n_groups && leaves[k] != ts[i]->flat) k++;
    if (k == n_groups) {
      leaves[k] = ts[i]->flat;
      counts[k] = 0;
      n_groups++;
    }
    counts[k]++;
    group_of[i] = k;
  }
  /* Only the groups whose every member is here (each tensor is given once) stay. */
  for (int i = 0; i < n; i++) {
    int k = group_of[i];
    if (k >= 0 && counts[k] != __atomic_load_n(&leaves[k]->flat_members, __ATOMIC_RELAXED))
      group_of[i] = -1;
  }
  return n_groups;
}

clpar_status clpar_zero_grads(const char *fn, clpar_tensor *const *ts, int n, int *group_of,
                              clpar_tensor **leaves, int *counts) {
  if (n < 1) return CLPAR_OK;
  int own = !group_of; /* no scratch given: this call's own */
  if (own) {
    group_of = malloc((size_t)n * sizeof *group_of);
    counts = malloc((size_t)n * sizeof *counts);
    leaves = malloc((size_t)n * sizeof *leaves);
  }
  clpar_status s = CLPAR_OK;
  if (!group_of || !counts || !leaves)
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  int n_groups = s == CLPAR_OK ? clpar_flat_whole_groups(ts, n, group_of, leaves, counts) : 0;
  for (int k = 0; k < n_groups; k++) counts[k] = 0; /* now: 1 when the group was filled */
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    int k = group_of[i];
    if (k < 0)
      s = clpar_tensor_zero_grad(ts[i]);
    else if (!counts[k]) { /* one fill over the whole flat gradient */
      s = clpar_fill(leaves[k]->grad, 0.0f);
      counts[k] = 1;
    }
  }
  if (own) {
    free(group_of);
    free(counts);
    free(leaves);
  }
  return s;
}
