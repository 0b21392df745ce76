/* module.c — modules: a forward function with named children and named parameters, so that
 * PyTorch's nn.Module classes can be written in C; and the built-in Linear, ReLU and
 * Sequential. Parameter names are PyTorch's ("seq1.0.weight"). Moving a module to a device
 * moves each parameter in place, so pointers held elsewhere (an optimizer) stay valid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static uint64_t tree_generation = 1; /* bumped by every change to any module tree */
static uint64_t seed_base = 0x5EED;
static uint64_t seed_counter;

void clpar_manual_seed(uint64_t seed) {
  __atomic_store_n(&seed_base, seed, __ATOMIC_RELAXED);
  __atomic_store_n(&seed_counter, 0, __ATOMIC_RELAXED);
}

/* A fresh stream for the next parameter initialization: deterministic after manual_seed. */
static uint64_t next_seed(void) {
  uint64_t c = __atomic_fetch_add(&seed_counter, 1, __ATOMIC_RELAXED);
  return __atomic_load_n(&seed_base, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull + c + 1;
}

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
  *out = m;
  return CLPAR_OK;
}

void clpar_module_free(clpar_module *m) {
  if (!m) return;
  for (int i = 0; i < m->n_children; i++) {
    clpar_module_free(m->children[i].item);
    free(m->children[i].name);
  }
  for (int i = 0; i < m->n_params; i++) {
    clpar_tensor_release(m->params[i].item);
    free(m->params[i].name);
  }
  for (int i = 0; i < m->n_flat; i++) free(m->flat[i].name);
  if (m->free_user) m->free_user(m->user);
  free(m->children);
  free(m->params);
  free(m->flat);
  free(m->type);
  free(m);
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
  (*count)++;
  __atomic_add_fetch(&tree_generation, 1, __ATOMIC_RELAXED);
  return CLPAR_OK;
}

clpar_status clpar_module_add_child(clpar_module *m, const char *name, clpar_module *child) {
  if (!m || !child) {
    clpar_module_free(child);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_add_child: NULL module");
  }
  clpar_status s = add_named("clpar_module_add_child", &m->children, &m->n_children, name, child);
  if (s != CLPAR_OK) clpar_module_free(child);
  return s;
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
  clpar_status s = add_named("clpar_module_add_parameter", &m->params, &m->n_params, name, param);
  if (s != CLPAR_OK) return s;
  clpar_tensor_retain(param);
  param->requires_grad = 1;
  return CLPAR_OK;
}

static void *find_named(const clpar_named *list, int count, const char *name) {
  for (int i = 0; name && i < count; i++)
    if (strcmp(list[i].name, name) == 0) return list[i].item;
  return NULL;
}

clpar_module *clpar_module_child(const clpar_module *m, const char *name) {
  return m ? find_named(m->children, m->n_children, name) : NULL;
}

clpar_tensor *clpar_module_parameter(const clpar_module *m, const char *name) {
  return m ? find_named(m->params, m->n_params, name) : NULL;
}

const char *clpar_module_type(const clpar_module *m) {
  return m ? m->type : NULL;
}

clpar_status clpar_module_forward(clpar_module *m, clpar_tensor *input, clpar_tensor **output) {
  if (!m || !input || !output)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_forward: NULL argument");
  return m->forward(m, input, output, m->user);
}

/* Appends m's parameters, then its children's, with prefix + name, to the flat list. */
static int flatten(const clpar_module *m, const char *prefix, clpar_named **list, int *count,
                   int *cap) {
  for (int pass = 0; pass < 2; pass++) {
    int n = pass == 0 ? m->n_params : m->n_children;
    const clpar_named *items = pass == 0 ? m->params : m->children;
    for (int i = 0; i < n; i++) {
      size_t len = strlen(prefix) + strlen(items[i].name) + 2;
      char *full = malloc(len);
      if (!full) return 0;
      snprintf(full, len, "%s%s%s", prefix, *prefix ? "." : "", items[i].name);
      if (pass == 1) {
        int ok = flatten(items[i].item, full, list, count, cap);
        free(full);
        if (!ok) return 0;
        continue;
      }
      if (*count == *cap) {
        int c = *cap ? 2 * *cap : 16;
        clpar_named *grown = realloc(*list, (size_t)c * sizeof *grown);
        if (!grown) {
          free(full);
          return 0;
        }
        *list = grown;
        *cap = c;
      }
      (*list)[*count].name = full;
      (*list)[(*count)++].item = items[i].item;
    }
  }
  return 1;
}

static clpar_status refresh_flat(clpar_module *m) {
  uint64_t gen = __atomic_load_n(&tree_generation, __ATOMIC_RELAXED);
  if (m->flat_generation == gen && (m->flat || m->n_flat == 0) && m->flat_generation)
    return CLPAR_OK;
  for (int i = 0; i < m->n_flat; i++) free(m->flat[i].name);
  free(m->flat);
  m->flat = NULL;
  m->n_flat = 0;
  int cap = 0;
  if (!flatten(m, "", &m->flat, &m->n_flat, &cap)) {
    for (int i = 0; i < m->n_flat; i++) free(m->flat[i].name);
    free(m->flat);
    m->flat = NULL;
    m->n_flat = 0;
    m->flat_generation = 0;
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "listing parameters: out of host memory");
  }
  m->flat_generation = gen;
  return CLPAR_OK;
}

int clpar_module_parameter_count(const clpar_module *m) {
  if (!m || refresh_flat((clpar_module *)m) != CLPAR_OK) return 0;
  return m->n_flat;
}

clpar_status clpar_module_parameter_at(const clpar_module *m, int i, const char **name,
                                       clpar_tensor **param) {
  if (!m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_module_parameter_at: module is NULL");
  clpar_status s = refresh_flat((clpar_module *)m);
  if (s != CLPAR_OK) return s;
  if (i < 0 || i >= m->n_flat)
    return clpar_set_error(CLPAR_ERROR_INDEX,
                           "clpar_module_parameter_at: index %d of %d parameters", i, m->n_flat);
  if (name) *name = m->flat[i].name;
  if (param) *param = m->flat[i].item;
  return CLPAR_OK;
}

clpar_status clpar_module_to(clpar_module *m, clpar_device *dev) {
  if (!m || !dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_to: NULL argument");
  int n = clpar_module_parameter_count(m);
  for (int i = 0; i < n; i++) {
    clpar_status s = clpar_tensor_move(m->flat[i].item, dev);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

clpar_status clpar_module_zero_grad(clpar_module *m) {
  if (!m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_module_zero_grad: module is NULL");
  int n = clpar_module_parameter_count(m);
  for (int i = 0; i < n; i++) {
    clpar_status s = clpar_tensor_zero_grad(m->flat[i].item);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

/* ---- built-in modules ---- */

static clpar_status linear_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                   void *user) {
  (void)user;
  return clpar_linear(x, clpar_module_parameter(self, "weight"),
                      clpar_module_parameter(self, "bias"), y);
}

/* PyTorch's nn.Linear initialization: weight and bias uniform in +-1/sqrt(in_features). */
clpar_status clpar_linear_create(int64_t in_features, int64_t out_features, int bias,
                                 clpar_device *dev, clpar_module **out) {
  if (in_features < 1 || out_features < 1 || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_linear_create: features must be >= 1 (got %lld, %lld)",
                           (long long)in_features, (long long)out_features);
  float bound = 1.0f / sqrtf((float)in_features);
  int64_t ws[2] = {out_features, in_features};
  clpar_module *m;
  clpar_tensor *w = NULL, *b = NULL;
  clpar_status s = clpar_module_create("Linear", linear_forward, NULL, NULL, &m);
  if (s != CLPAR_OK) return s;
  s = clpar_tensor_rand_uniform(dev, 2, ws, next_seed(), -bound, bound, &w);
  if (s == CLPAR_OK) s = clpar_module_add_parameter(m, "weight", w);
  if (s == CLPAR_OK && bias)
    s = clpar_tensor_rand_uniform(dev, 1, &out_features, next_seed(), -bound, bound, &b);
  if (s == CLPAR_OK && bias) s = clpar_module_add_parameter(m, "bias", b);
  clpar_tensor_free(w);
  clpar_tensor_free(b);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}

static clpar_status relu_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                 void *user) {
  (void)self;
  (void)user;
  return clpar_relu(x, y);
}

clpar_status clpar_relu_create(clpar_module **out) {
  return clpar_module_create("ReLU", relu_forward, NULL, NULL, out);
}

static clpar_status sequential_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                       void *user) {
  (void)user;
  clpar_tensor *cur = x;
  for (int i = 0; i < self->n_children; i++) {
    clpar_tensor *next;
    clpar_status s = clpar_module_forward(self->children[i].item, cur, &next);
    if (cur != x) clpar_tensor_free(cur); /* the graph keeps what backward needs */
    if (s != CLPAR_OK) return s;
    cur = next;
  }
  if (cur == x)
    return clpar_tensor_reshape(x, x->ndim, x->shape, y); /* empty: the input, as a new view */
  *y = cur;
  return CLPAR_OK;
}

clpar_status clpar_sequential_create(clpar_module *const *children, int n, clpar_module **out) {
  clpar_module *m = NULL;
  clpar_status s = (n < 0 || (n > 0 && !children) || !out)
                       ? clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                                         "clpar_sequential_create: bad children or out")
                       : clpar_module_create("Sequential", sequential_forward, NULL, NULL, &m);
  int i = 0;
  for (; s == CLPAR_OK && i < n; i++) {
    char name[16];
    snprintf(name, sizeof name, "%d", i);
    s = clpar_module_add_child(m, name, children[i]);
  }
  if (s != CLPAR_OK) {
    for (; children && i < n; i++) clpar_module_free(children[i]); /* owned even on error */
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}
