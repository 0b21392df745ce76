/* ddp_unused.c — DistributedDataParallel's find_unused_parameters: a walk of the forward's
 * output graph finds the parameters it does not reach; the first hook of the next backward
 * counts them ready, with zeros. */
#include <stdlib.h>

#include "dist/ddp_internal.h"

/* ---- parameters the forward did not reach (find_unused_parameters) ---- */

int clpar_ddp_cmp_address(const void *a, const void *b) {
  const clpar_tensor *x = (*(ddp_param *const *)a)->param, *y = (*(ddp_param *const *)b)->param;
  return x < y ? -1 : x > y;
}

/* A set of nodes seen (open addressing on the pointer). */
typedef struct {
  const void **slots;
  size_t cap, count;
} ptr_set;

static size_t ptr_hash(const void *p, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 20) & (cap - 1);
}

/* 1 when p was added, 0 when it was there, -1 when out of memory. */
static int ptr_set_add(ptr_set *set, const void *p) {
  if (2 * (set->count + 1) > set->cap) {
    size_t cap = set->cap ? 2 * set->cap : 256;
    const void **slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < set->cap; i++)
      if (set->slots[i]) {
        size_t j = ptr_hash(set->slots[i], cap);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = set->slots[i];
      }
    free(set->slots);
    set->slots = slots;
    set->cap = cap;
  }
  size_t j = ptr_hash(p, set->cap);
  while (set->slots[j]) {
    if (set->slots[j] == p) return 0;
    j = (j + 1) & (set->cap - 1);
  }
  set->slots[j] = p;
  set->count++;
  return 1;
}

static void reached(ddp_state *st, clpar_tensor *leaf) {
  ddp_param key = {.param = leaf}, *k = &key;
  ddp_param **hit =
      bsearch(&k, st->by_address, (size_t)st->n_params, sizeof k, clpar_ddp_cmp_address);
  if (hit) (*hit)->unused = 0;
}

/* Marks unused every parameter that the graph of out does not reach (PyTorch walks the
 * output's graph the same way at the end of forward), and arms the first hook of the coming
 * backward to mark them ready. */
clpar_status clpar_ddp_find_unused(ddp_state *st, clpar_tensor *out) {
  for (int i = 0; i < st->n_params; i++) st->params[i].unused = 1;
  ptr_set seen = {0};
  size_t n = 0, cap = 64;
  clpar_node **stack = malloc(cap * sizeof *stack);
  clpar_status s = stack ? CLPAR_OK : clpar_ddp_oom();
  if (s == CLPAR_OK && out->node) {
    if (ptr_set_add(&seen, out->node) < 0) s = clpar_ddp_oom();
    stack[n++] = out->node;
  } else if (s == CLPAR_OK) {
    reached(st, out);
  }
  while (s == CLPAR_OK && n > 0) {
    clpar_node *node = stack[--n];
    for (int i = 0; s == CLPAR_OK && i < node->n_inputs; i++) {
      clpar_tensor *in = node->inputs[i];
      if (!in) continue;
      if (!in->node) {
        if (in->requires_grad) reached(st, in);
        continue;
      }
      int added = ptr_set_add(&seen, in->node);
      if (added < 0) {
        s = clpar_ddp_oom();
      } else if (added) {
        if (n == cap) {
          clpar_node **bigger = realloc(stack, 2 * cap * sizeof *stack);
          if (!bigger) {
            s = clpar_ddp_oom();
            break;
          }
          stack = bigger;
          cap *= 2;
        }
        stack[n++] = in->node;
      }
    }
  }
  free(stack);
  free(seen.slots);
  int any = 0;
  for (int i = 0; i < st->n_params; i++) {
    if (s != CLPAR_OK) st->params[i].unused = 0;
    any |= st->params[i].unused;
  }
  pthread_mutex_lock(&st->lock);
  st->unused_armed = any;
  pthread_mutex_unlock(&st->lock);
  return s;
}
