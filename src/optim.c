/* optim.c — SGD, Adam and AdamW with PyTorch's update rules (torch.optim). Each step is one
 * fused backend kernel per parameter on the parameter's device; the state (momentum buffer,
 * Adam's moments) lives next to the parameter, is made on the first step, and moves with the
 * parameter when it was moved to another device (clpar_module_to, DataParallel).
 *
 * Flat groups (clpar_module_flatten): when the optimizer holds every member of a group, the
 * group is stepped with one kernel over the flat buffer, its flat gradient and a flat state
 * of the same layout; each parameter's state tensors are then views of the flat state at the
 * parameter's offset, so the state stays readable per parameter (param_state). The update is
 * element-wise, so this gives the same bits as one kernel per parameter. A group whose members
 * disagree (one without a gradient, different step counts, state made apart) is stepped per
 * parameter, as is a parameter outside any group or in a group the optimizer holds part of.
 *
 * Parameter groups: each parameter has the index of its group, whose options its kernels get;
 * a flat group is stepped whole only when all its members are in one parameter group. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef enum { OPT_SGD, OPT_ADAM, OPT_ADAMW } opt_kind;

typedef struct {
  clpar_tensor *param;
  int group;              /* its parameter group: the options it is stepped with */
  clpar_tensor *state[2]; /* SGD: momentum buffer; Adam: m, v (views of a flat_state's when the
                           * parameter's group is stepped whole) */
  int64_t steps;
} param_state;

/* The state of a flat group stepped whole: tensors of the flat leaf's numel, on its device. */
typedef struct {
  clpar_tensor *leaf; /* retained */
  clpar_tensor *state[2];
} flat_state;

struct clpar_optimizer {
  opt_kind kind;
  /* each parameter group's options (torch.optim's param_groups), n_groups entries; the
   * other kind's array holds its defaults */
  clpar_sgd_options *sgd;
  clpar_adam_options *adam;
  int n_groups;
  param_state *params;
  int n;
  flat_state *flats;
  int n_flats;
  /* scratch for clpar_flat_whole_groups, n entries each */
  clpar_tensor **ptrs, **leaves;
  int *group_of, *counts;
  int64_t live_at_step; /* live tensors at the previous step, for clpar_debug_step */
  int live_grew;        /* steps in a row at which they grew */
};

/* A field that must be >= 0 (NaN is not). */
static clpar_status check_nonneg(const char *fn, const char *name, float v) {
  if (v >= 0.0f) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: options.%s is %g; it must be >= 0", fn,
                         name, (double)v);
}

/* Checks resolved options (defaults filled in, CLPAR_ZERO made 0). */
static clpar_status check_sgd(const char *fn, const clpar_sgd_options *o) {
  clpar_status s = check_nonneg(fn, "lr", o->lr);
  if (s == CLPAR_OK) s = check_nonneg(fn, "momentum", o->momentum);
  if (s == CLPAR_OK) s = check_nonneg(fn, "dampening", o->dampening);
  if (s == CLPAR_OK) s = check_nonneg(fn, "weight_decay", o->weight_decay);
  if (s == CLPAR_OK && o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f))
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "%s: options.nesterov needs momentum > 0 and dampening 0 (momentum %g, "
                        "dampening %g), as in PyTorch",
                        fn, (double)o->momentum, (double)o->dampening);
  return s;
}

static clpar_status check_adam(const char *fn, const clpar_adam_options *o) {
  clpar_status s = check_nonneg(fn, "lr", o->lr);
  if (s == CLPAR_OK) s = check_nonneg(fn, "eps", o->eps);
  if (s == CLPAR_OK) s = check_nonneg(fn, "weight_decay", o->weight_decay);
  const char *beta = !(o->beta1 >= 0.0f && o->beta1 < 1.0f)   ? "beta1"
                     : !(o->beta2 >= 0.0f && o->beta2 < 1.0f) ? "beta2"
                                                              : NULL;
  if (s == CLPAR_OK && beta)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "%s: options.%s is %g; betas must be in [0, 1) (0 is written CLPAR_ZERO, "
                        "since 0 means PyTorch's default)",
                        fn, beta, (double)(beta[4] == '1' ? o->beta1 : o->beta2));
  return s;
}

/* PyTorch's defaults in the fields left 0 (status.h's convention); NULL: all of them. */
static clpar_sgd_options sgd_resolved(const clpar_sgd_options *o) {
  clpar_sgd_options r = o ? *o : (clpar_sgd_options){0};
  r.lr = clpar_opt_float(r.lr, 1e-3f);
  r.momentum = clpar_opt_float(r.momentum, 0.0f);
  r.dampening = clpar_opt_float(r.dampening, 0.0f);
  r.weight_decay = clpar_opt_float(r.weight_decay, 0.0f);
  return r;
}

static clpar_adam_options adam_resolved(const clpar_adam_options *o, int adamw) {
  clpar_adam_options r = o ? *o : (clpar_adam_options){0};
  r.lr = clpar_opt_float(r.lr, 1e-3f);
  r.beta1 = clpar_opt_float(r.beta1, 0.9f);
  r.beta2 = clpar_opt_float(r.beta2, 0.999f);
  r.eps = clpar_opt_float(r.eps, 1e-8f);
  r.weight_decay = clpar_opt_float(r.weight_decay, adamw ? 1e-2f : 0.0f);
  return r;
}

typedef struct {
  uintptr_t tensor;
  int index;
} param_ref;

static int param_ref_cmp(const void *a, const void *b) {
  const param_ref *x = a, *y = b;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

/* A parameter given twice would be stepped twice per step: finds the first repeat (the
 * smallest index that repeats an earlier one). 1 when there is one, 0 when not, -1 when out
 * of memory. */
static int find_repeat(clpar_tensor *const *params, int n, int *first, int *again) {
  param_ref *refs = malloc((size_t)n * sizeof *refs);
  if (!refs) return -1;
  for (int i = 0; i < n; i++) refs[i] = (param_ref){(uintptr_t)params[i], i};
  qsort(refs, (size_t)n, sizeof *refs, param_ref_cmp);
  int found = 0;
  for (int i = 1; i < n; i++) {
    if (refs[i].tensor != refs[i - 1].tensor || (found && refs[i].index >= *again)) continue;
    *first = refs[i - 1].index;
    *again = refs[i].index;
    found = 1;
  }
  free(refs);
  return found;
}

/* One parameter group as the create functions take it: options is a clpar_sgd_options or a
 * clpar_adam_options by the optimizer's kind, NULL for every default. */
typedef struct {
  clpar_tensor *const *params;
  int n;
  const void *options;
} group_in;

/* Resolves and checks each group's options into sgd and adam (n_groups entries each), and
 * counts the parameters in *total. */
static clpar_status check_groups(const char *fn, opt_kind kind, const group_in *g, int n_groups,
                                 clpar_sgd_options *sgd, clpar_adam_options *adam, int *total) {
  *total = 0;
  for (int k = 0; k < n_groups; k++) {
    if (g[k].n < 0 || (g[k].n > 0 && !g[k].params) || g[k].n > INT32_MAX - *total)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: group %d has %d parameters (params %s)", fn, k, g[k].n,
                             g[k].params ? "given" : "NULL");
    *total += g[k].n;
    sgd[k] = sgd_resolved(kind == OPT_SGD ? g[k].options : NULL);
    adam[k] = adam_resolved(kind == OPT_SGD ? NULL : g[k].options, kind == OPT_ADAMW);
    clpar_status s = kind == OPT_SGD ? check_sgd(fn, &sgd[k]) : check_adam(fn, &adam[k]);
    if (s != CLPAR_OK) return s;
    for (int i = 0; i < g[k].n; i++)
      if (!g[k].params[i] || g[k].params[i]->node)
        return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                               "%s: parameter %d (of group %d) is NULL or not a leaf", fn,
                               *total - g[k].n + i, k);
      else if (g[k].params[i]->dtype != CLPAR_FLOAT32)
        return clpar_check_float(fn, "a parameter", g[k].params[i]);
  }
  if (*total < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: need at least 1 parameter (got 0)",
                           fn);
  return CLPAR_OK;
}

static clpar_status create_groups(const char *fn, opt_kind kind, const group_in *g, int n_groups,
                                  clpar_optimizer **out) {
  if (!g || n_groups < 1 || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: need n_groups >= 1 (got %d), the groups and out", fn, n_groups);
  clpar_optimizer *o = calloc(1, sizeof *o);
  clpar_sgd_options *sgd = calloc((size_t)n_groups, sizeof *sgd);
  clpar_adam_options *adam = calloc((size_t)n_groups, sizeof *adam);
  int n = 0;
  clpar_status s = o && sgd && adam
                       ? check_groups(fn, kind, g, n_groups, sgd, adam, &n)
                       : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  param_state *ps = s == CLPAR_OK ? calloc((size_t)n, sizeof *ps) : NULL;
  clpar_tensor **ptrs = s == CLPAR_OK ? malloc((size_t)n * sizeof *ptrs) : NULL,
               **leaves = s == CLPAR_OK ? malloc((size_t)n * sizeof *leaves) : NULL;
  int *group_of = s == CLPAR_OK ? malloc((size_t)n * sizeof *group_of) : NULL,
      *counts = s == CLPAR_OK ? malloc((size_t)n * sizeof *counts) : NULL;
  if (s == CLPAR_OK && (!ps || !ptrs || !leaves || !group_of || !counts))
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  for (int k = 0, at = 0; s == CLPAR_OK && k < n_groups; k++)
    for (int i = 0; i < g[k].n; i++, at++) ptrs[at] = g[k].params[i];
  int first = 0, again = 0, repeat = s == CLPAR_OK ? find_repeat(ptrs, n, &first, &again) : 0;
  if (repeat < 0) s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  if (repeat > 0)
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "%s: parameter %d is parameter %d again; give each tensor once", fn, again,
                        first);
  if (s != CLPAR_OK) {
    free(o);
    free(sgd);
    free(adam);
    free(ps);
    free(ptrs);
    free(leaves);
    free(group_of);
    free(counts);
    return s;
  }
  *o = (clpar_optimizer){.kind = kind, .sgd = sgd, .adam = adam, .n_groups = n_groups};
  o->ptrs = ptrs;
  o->leaves = leaves;
  o->group_of = group_of;
  o->counts = counts;
  for (int k = 0, at = 0; k < n_groups; k++)
    for (int i = 0; i < g[k].n; i++, at++) {
      ps[at].param = clpar_tensor_retain(ptrs[at]);
      ps[at].group = k;
    }
  o->params = ps;
  o->n = n;
  *out = o;
  return CLPAR_OK;
}

static clpar_status create(const char *fn, opt_kind kind, clpar_tensor *const *params, int n,
                           const void *options, clpar_optimizer **out) {
  if (!params || n < 1 || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: need n >= 1 parameters (got %d, params %s) and out", fn, n,
                           params ? "given" : "NULL");
  group_in g = {params, n, options};
  return create_groups(fn, kind, &g, 1, out);
}

clpar_status clpar_sgd_create(clpar_tensor *const *params, int n, const clpar_sgd_options *options,
                              clpar_optimizer **out) {
  return create("clpar_sgd_create", OPT_SGD, params, n, options, out);
}

clpar_status clpar_adam_create(clpar_tensor *const *params, int n,
                               const clpar_adam_options *options, clpar_optimizer **out) {
  return create("clpar_adam_create", OPT_ADAM, params, n, options, out);
}

clpar_status clpar_adamw_create(clpar_tensor *const *params, int n,
                                const clpar_adam_options *options, clpar_optimizer **out) {
  return create("clpar_adamw_create", OPT_ADAMW, params, n, options, out);
}

/* The module's parameters as an array, for the *_create_for functions. */
static clpar_status create_for(const char *fn, opt_kind kind, clpar_module *m, const void *options,
                               clpar_optimizer **out) {
  if (!m) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the module is NULL", fn);
  int n = clpar_module_parameter_count(m);
  if (n < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the module (%s) has no parameters",
                           fn, m->type);
  clpar_tensor **params = malloc((size_t)n * sizeof *params);
  if (!params) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < n; i++)
    s = clpar_module_parameter_at(m, i, NULL, &params[i]);
  if (s == CLPAR_OK) s = create(fn, kind, params, n, options, out);
  free(params);
  return s;
}

clpar_status clpar_sgd_create_for(clpar_module *m, const clpar_sgd_options *o,
                                  clpar_optimizer **out) {
  return create_for("clpar_sgd_create_for", OPT_SGD, m, o, out);
}

clpar_status clpar_adam_create_for(clpar_module *m, const clpar_adam_options *o,
                                   clpar_optimizer **out) {
  return create_for("clpar_adam_create_for", OPT_ADAM, m, o, out);
}

clpar_status clpar_adamw_create_for(clpar_module *m, const clpar_adam_options *o,
                                    clpar_optimizer **out) {
  return create_for("clpar_adamw_create_for", OPT_ADAMW, m, o, out);
}

/* Each kind's groups as group_in, for create_groups; the array is the caller's to free. */
static clpar_status groups_in(const char *fn, int n_groups, group_in **out) {
  *out = n_groups > 0 ? calloc((size_t)n_groups, sizeof **out) : NULL;
  if (n_groups > 0 && !*out)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  return CLPAR_OK;
}

clpar_status clpar_sgd_create_groups(const clpar_sgd_group *groups, int n_groups,
                                     clpar_optimizer **out) {
  const char *fn = "clpar_sgd_create_groups";
  group_in *g;
  clpar_status s = groups ? groups_in(fn, n_groups, &g) : CLPAR_OK;
  if (!groups || s != CLPAR_OK)
    return s != CLPAR_OK ? s
                         : clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: groups is NULL", fn);
  for (int k = 0; k < n_groups; k++)
    g[k] = (group_in){groups[k].params, groups[k].n, &groups[k].options};
  s = create_groups(fn, OPT_SGD, g, n_groups, out);
  free(g);
  return s;
}

static clpar_status adam_groups(const char *fn, opt_kind kind, const clpar_adam_group *groups,
                                int n_groups, clpar_optimizer **out) {
  group_in *g;
  clpar_status s = groups ? groups_in(fn, n_groups, &g) : CLPAR_OK;
  if (!groups || s != CLPAR_OK)
    return s != CLPAR_OK ? s
                         : clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: groups is NULL", fn);
  for (int k = 0; k < n_groups; k++)
    g[k] = (group_in){groups[k].params, groups[k].n, &groups[k].options};
  s = create_groups(fn, kind, g, n_groups, out);
  free(g);
  return s;
}

clpar_status clpar_adam_create_groups(const clpar_adam_group *groups, int n_groups,
                                      clpar_optimizer **out) {
  return adam_groups("clpar_adam_create_groups", OPT_ADAM, groups, n_groups, out);
}

clpar_status clpar_adamw_create_groups(const clpar_adam_group *groups, int n_groups,
                                       clpar_optimizer **out) {
  return adam_groups("clpar_adamw_create_groups", OPT_ADAMW, groups, n_groups, out);
}

/* nanoGPT's configure_optimizers: the module's parameters of 2 or more dimensions in group 0
 * with the options as given, the others in group 1 with weight_decay 0. */
static clpar_status decay_groups(const char *fn, opt_kind kind, clpar_module *m,
                                 const void *options, clpar_optimizer **out) {
  if (!m) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the module is NULL", fn);
  int n = clpar_module_parameter_count(m);
  if (n < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the module (%s) has no parameters",
                           fn, m->type);
  clpar_tensor **params = malloc((size_t)n * sizeof *params);
  if (!params) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  int n_decay = 0;
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < n; i++) { /* the decayed first, each set in module order */
    clpar_tensor *p;
    s = clpar_module_parameter_at(m, i, NULL, &p);
    if (s == CLPAR_OK && p->ndim >= 2) params[n_decay++] = p;
  }
  for (int i = 0, at = n_decay; s == CLPAR_OK && i < n; i++) {
    clpar_tensor *p;
    s = clpar_module_parameter_at(m, i, NULL, &p);
    if (s == CLPAR_OK && p->ndim < 2) params[at++] = p;
  }
  clpar_sgd_options sgd[2];
  clpar_adam_options adam[2];
  if (kind == OPT_SGD) {
    sgd[0] = options ? *(const clpar_sgd_options *)options : (clpar_sgd_options){0};
    sgd[1] = sgd[0];
    sgd[1].weight_decay = CLPAR_ZERO;
  } else {
    adam[0] = options ? *(const clpar_adam_options *)options : (clpar_adam_options){0};
    adam[1] = adam[0];
    adam[1].weight_decay = CLPAR_ZERO;
  }
  const void *o0 = kind == OPT_SGD ? (const void *)&sgd[0] : &adam[0];
  const void *o1 = kind == OPT_SGD ? (const void *)&sgd[1] : &adam[1];
  group_in g[2] = {{params, n_decay, o0}, {params + n_decay, n - n_decay, o1}};
  if (s == CLPAR_OK) s = create_groups(fn, kind, g, 2, out);
  free(params);
  return s;
}

clpar_status clpar_sgd_create_decay_groups(clpar_module *m, const clpar_sgd_options *options,
                                           clpar_optimizer **out) {
  return decay_groups("clpar_sgd_create_decay_groups", OPT_SGD, m, options, out);
}

clpar_status clpar_adam_create_decay_groups(clpar_module *m, const clpar_adam_options *options,
                                            clpar_optimizer **out) {
  return decay_groups("clpar_adam_create_decay_groups", OPT_ADAM, m, options, out);
}

clpar_status clpar_adamw_create_decay_groups(clpar_module *m, const clpar_adam_options *options,
                                             clpar_optimizer **out) {
  return decay_groups("clpar_adamw_create_decay_groups", OPT_ADAMW, m, options, out);
}

int clpar_optimizer_group_count(const clpar_optimizer *o) {
  return o ? o->n_groups : 0;
}

int clpar_optimizer_group_size(const clpar_optimizer *o, int group) {
  int n = 0;
  for (int i = 0; o && i < o->n; i++) n += o->params[i].group == group;
  return n;
}

float clpar_optimizer_lr(const clpar_optimizer *o, int group) {
  if (!o || group < 0 || group >= o->n_groups) return NAN;
  return o->kind == OPT_SGD ? o->sgd[group].lr : o->adam[group].lr;
}

clpar_status clpar_optimizer_set_lr(clpar_optimizer *o, int group, float lr) {
  const char *fn = "clpar_optimizer_set_lr";
  if (!o) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: optimizer is NULL", fn);
  if (group < -1 || group >= o->n_groups)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: group is %d; the optimizer has groups 0 to %d (-1: all)", fn, group,
                           o->n_groups - 1);
  if (!(lr >= 0.0f) || isinf(lr))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: lr is %g; it must be finite and >= 0",
                           fn, (double)lr);
  for (int k = group < 0 ? 0 : group; k < (group < 0 ? o->n_groups : group + 1); k++) {
    if (o->kind == OPT_SGD)
      o->sgd[k].lr = lr;
    else
      o->adam[k].lr = lr;
  }
  return CLPAR_OK;
}

/* A state tensor like p, on p's device, outside any scope; zeros when asked. */
static clpar_status make_state(const clpar_tensor *p, int zero, clpar_tensor **out) {
  clpar_device *dev = p->storage->dev;
  int was = clpar_memory_category_set(CLPAR_MEM_OPTIMIZER);
  clpar_status s = zero ? clpar_tensor_zeros(dev, p->ndim, p->shape, out)
                        : clpar_tensor_empty(dev, p->ndim, p->shape, out);
  clpar_memory_category_set(was);
  if (s == CLPAR_OK) clpar_tensor_unscope(*out);
  return s;
}

/* The state follows its parameter: clpar_module_to and DataParallel move parameters in place
 * after the optimizer was made, and a backend must never see another backend's memory. */
static clpar_status follow_param(param_state *ps, clpar_device *dev) {
  for (int i = 0; i < 2; i++) {
    if (!ps->state[i] || ps->state[i]->storage->dev == dev) continue;
    clpar_status s = clpar_tensor_move(ps->state[i], dev);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

/* The fused step's arguments from the optimizer's options: SGD's, with first set on the step
 * that starts the momentum buffer, and Adam's for step t (1-based), bias corrections included. */
static clpar_sgd_args sgd_args(const clpar_optimizer *o, int group, int first) {
  const clpar_sgd_options *sg = &o->sgd[group];
  clpar_sgd_args a = {sg->lr, sg->momentum, sg->dampening, sg->weight_decay, sg->nesterov, first};
  return a;
}

/* The double a hyper-parameter was most likely written as: the shortest decimal that rounds to
 * x (0.999f is 0.999, not 0.99900001287). PyTorch holds its hyper-parameters as Python floats
 * (doubles) and computes bias corrections and 1 - beta from them; clpar's options are floats
 * of the same decimals. */
static double as_written(float x) {
  char text[32];
  for (int digits = 1; digits <= 9; digits++) {
    snprintf(text, sizeof text, "%.*g", digits, (double)x);
    if (strtof(text, NULL) == x) return strtod(text, NULL);
  }
  return x;
}

static clpar_adam_args adam_args(const clpar_optimizer *o, int group, int64_t t) {
  const clpar_adam_options *ad = &o->adam[group];
  double lr = as_written(ad->lr), beta1 = as_written(ad->beta1), beta2 = as_written(ad->beta2);
  double wd = as_written(ad->weight_decay);
  clpar_adam_args a = {ad->lr,
                       ad->beta1,
                       ad->beta2,
                       ad->eps,
                       ad->weight_decay,
                       (float)(1.0 - beta1),
                       (float)(1.0 - beta2),
                       (float)(lr / (1.0 - pow(beta1, (double)t))),
                       (float)sqrt(1.0 - pow(beta2, (double)t)),
                       (float)(1.0 - lr * wd),
                       o->kind == OPT_ADAMW};
  return a;
}

static clpar_status step_one(clpar_optimizer *o, param_state *ps) {
  clpar_tensor *p = ps->param, *g = p->grad;
  clpar_device *dev = p->storage->dev;
  if (g->storage->dev != dev)
    return clpar_set_error(CLPAR_ERROR_DEVICE_MISMATCH,
                           "optimizer: a parameter is on %s and its gradient on %s",
                           dev->bd.info.id, g->storage->dev->bd.info.id);
  clpar_status s = follow_param(ps, dev);
  if (s != CLPAR_OK) return s;
  if (o->kind == OPT_SGD) {
    int first = ps->state[0] == NULL;
    if (first && o->sgd[ps->group].momentum != 0.0f)
      s = make_state(p, 0, &ps->state[0]); /* buf = g on the first step */
    if (s != CLPAR_OK) return s;
    clpar_sgd_args a = sgd_args(o, ps->group, first);
    clpar_bref buf = ps->state[0] ? clpar_tensor_bref(ps->state[0]) : clpar_tensor_bref(p);
    s = clpar_dev_sgd_step(dev, (size_t)p->numel, clpar_tensor_bref(p), clpar_tensor_bref(g), buf,
                           a);
  } else {
    if (!ps->state[0]) s = make_state(p, 1, &ps->state[0]);
    if (s == CLPAR_OK && !ps->state[1]) s = make_state(p, 1, &ps->state[1]);
    if (s != CLPAR_OK) return s;
    clpar_adam_args a = adam_args(o, ps->group, ps->steps + 1);
    s = clpar_dev_adam_step(dev, (size_t)p->numel, clpar_tensor_bref(p), clpar_tensor_bref(g),
                            clpar_tensor_bref(ps->state[0]), clpar_tensor_bref(ps->state[1]), a);
  }
  clpar_tensor_touch(p);
  if (s != CLPAR_OK) return clpar_device_fail(dev, s);
  s = clpar_optimizer_capture(o, dev, ps->group, &(int){(int)(ps - o->params)}, 1, p);
  if (s != CLPAR_OK) return s;
  ps->steps++;
  return CLPAR_OK;
}

void clpar_optimizer_replay_args(clpar_optimizer *o, int group, const int *members, int n,
                                 clpar_patch_args *a) {
  if (o->kind == OPT_SGD) /* the buffer exists after the capture: first only without one */
    a->sgd = sgd_args(o, group, o->sgd[group].momentum == 0.0f);
  else
    a->adam = adam_args(o, group, o->params[members[0]].steps + 1);
  for (int i = 0; i < n; i++) o->params[members[i]].steps++;
}

/* The number of state tensors a step keeps per parameter of group. */
static int n_states(const clpar_optimizer *o, int group) {
  return o->kind == OPT_SGD ? (o->sgd[group].momentum != 0.0f) : 2;
}

/* The record of leaf's flat state, made (empty) when there is none; NULL when out of memory. */
static flat_state *flat_state_for(clpar_optimizer *o, clpar_tensor *leaf) {
  for (int k = 0; k < o->n_flats; k++)
    if (o->flats[k].leaf == leaf) return &o->flats[k];
  flat_state *f = realloc(o->flats, (size_t)(o->n_flats + 1) * sizeof *f);
  if (!f) return NULL;
  o->flats = f;
  f += o->n_flats++;
  *f = (flat_state){clpar_tensor_retain(leaf), {NULL, NULL}};
  return f;
}

/* The element offset of member p in its flat leaf. */
static size_t rel(const clpar_tensor *p) {
  return p->offset - p->flat->offset;
}

/* Makes fs->state[j] anew (F's numel, on dev) and every member's state[j] a view of it; with
 * copy, the members' own state is copied into it first. Nothing changes on error. */
static clpar_status flat_state_build(clpar_optimizer *o, flat_state *fs, int j, const int *members,
                                     int n, clpar_device *dev, int copy) {
  clpar_tensor *f = fs->leaf, *st = NULL;
  int zero = o->kind != OPT_SGD && !copy; /* Adam's moments start at zero */
  int was = clpar_memory_category_set(CLPAR_MEM_OPTIMIZER);
  clpar_status s = zero ? clpar_tensor_zeros(dev, 1, &f->numel, &st)
                        : clpar_tensor_empty(dev, 1, &f->numel, &st);
  clpar_memory_category_set(was);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(st);
  clpar_tensor **views = calloc((size_t)n, sizeof *views);
  if (!views) s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "optimizer: out of host memory");
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    param_state *ps = &o->params[members[i]];
    clpar_tensor *p = ps->param, *old = ps->state[j];
    if (copy)
      s = clpar_transfer(dev, st->storage, rel(p) * sizeof(float), old->storage->dev, old->storage,
                         old->offset * sizeof(float), (size_t)p->numel * sizeof(float));
    if (s == CLPAR_OK) s = clpar_tensor_view_at(st, rel(p), p->ndim, p->shape, &views[i]);
  }
  if (s != CLPAR_OK) {
    for (int i = 0; views && i < n; i++) clpar_tensor_free(views[i]);
    free(views);
    clpar_tensor_free(st);
    return s;
  }
  for (int i = 0; i < n; i++) {
    param_state *ps = &o->params[members[i]];
    clpar_tensor_free(ps->state[j]);
    ps->state[j] = views[i];
  }
  free(views);
  clpar_tensor_free(fs->state[j]);
  fs->state[j] = st;
  return CLPAR_OK;
}

/* Steps the flat group `leaf`, whose members are o->params[members[0..n)], with one kernel
 * when they agree (the same parameter group, a gradient each, the same step count); *done
 * tells whether it did (else they are stepped one by one). */
static clpar_status step_group(clpar_optimizer *o, clpar_tensor *leaf, const int *members, int n,
                               int *done) {
  *done = 0;
  clpar_device *dev = leaf->storage->dev;
  if (leaf->grad->storage->dev != dev) return CLPAR_OK; /* step_one names the error */
  int64_t steps = o->params[members[0]].steps;
  int pg = o->params[members[0]].group;
  for (int i = 0; i < n; i++)
    if (!clpar_tensor_has_grad(o->params[members[i]].param) ||
        o->params[members[i]].steps != steps || o->params[members[i]].group != pg)
      return CLPAR_OK;
  flat_state *fs = flat_state_for(o, leaf);
  if (!fs) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "optimizer: out of host memory");
  int first = o->kind == OPT_SGD && n_states(o, pg) == 0; /* as step_one: no buffer, first */
  for (int j = 0; j < n_states(o, pg); j++) {
    /* the members' state[j]: none yet, views of fs->state[j] in place, or their own */
    int none = 0, viewed = 0;
    for (int i = 0; i < n; i++) {
      param_state *ps = &o->params[members[i]];
      clpar_tensor *t = ps->state[j], *ft = fs->state[j];
      none += t == NULL;
      viewed += t && ft && t->storage == ft->storage && t->offset == ft->offset + rel(ps->param);
    }
    if (none != 0 && none != n) return CLPAR_OK; /* some have state, some not: one by one */
    clpar_status s = CLPAR_OK;
    if (none == n && o->kind == OPT_SGD) first = 1; /* buf = g on the first step */
    if (viewed == n && fs->state[j]->storage->dev != dev) {
      s = clpar_tensor_move(fs->state[j], dev); /* the state follows the group's moves */
      for (int i = 0; s == CLPAR_OK && i < n; i++) {
        param_state *ps = &o->params[members[i]];
        clpar_tensor_repoint(ps->state[j], fs->state[j]->storage,
                             fs->state[j]->offset + rel(ps->param));
      }
    } else if (viewed != n) {
      if (none == 0) /* state made apart (a step before flattening): gathered onto dev */
        for (int i = 0; s == CLPAR_OK && i < n; i++) s = follow_param(&o->params[members[i]], dev);
      if (s == CLPAR_OK) s = flat_state_build(o, fs, j, members, n, dev, none == 0);
    }
    if (s != CLPAR_OK) return s;
  }
  clpar_status s;
  clpar_bref p = clpar_tensor_bref(leaf), g = clpar_tensor_bref(leaf->grad);
  if (o->kind == OPT_SGD) {
    clpar_sgd_args a = sgd_args(o, pg, first);
    s = clpar_dev_sgd_step(dev, (size_t)leaf->numel, p, g,
                           fs->state[0] && n_states(o, pg) ? clpar_tensor_bref(fs->state[0]) : p,
                           a);
  } else {
    clpar_adam_args a = adam_args(o, pg, steps + 1);
    s = clpar_dev_adam_step(dev, (size_t)leaf->numel, p, g, clpar_tensor_bref(fs->state[0]),
                            clpar_tensor_bref(fs->state[1]), a);
  }
  clpar_tensor_touch(leaf);
  if (s != CLPAR_OK) return clpar_device_fail(dev, s);
  s = clpar_optimizer_capture(o, dev, pg, members, n, leaf);
  if (s != CLPAR_OK) return s;
  for (int i = 0; i < n; i++) o->params[members[i]].steps++;
  *done = 1;
  return CLPAR_OK;
}

clpar_status clpar_optimizer_step(clpar_optimizer *o) {
  if (!o)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_optimizer_step: optimizer is NULL");
  clpar_debug_step(&o->live_at_step, &o->live_grew);
  for (int i = 0; i < o->n; i++) { /* all or nothing: none may be freed or outlive shutdown */
    clpar_status alive = clpar_check_alive("clpar_optimizer_step", o->params[i].param);
    if (alive != CLPAR_OK) return alive;
  }
  for (int i = 0; i < o->n; i++) /* a count from a checkpoint: the next one must fit */
    if (o->params[i].steps == INT64_MAX)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "clpar_optimizer_step: parameter %d has taken %lld steps, the most "
                             "that can be counted (its checkpoint's optimizer.state.%d.step?)",
                             i, (long long)INT64_MAX, i);
  /* A group flattened again (clpar_module_flatten) left its old leaf without members: its
   * record goes (the members' views keep what they use of the old flat state). */
  for (int k = 0; k < o->n_flats; k++)
    if (__atomic_load_n(&o->flats[k].leaf->flat_members, __ATOMIC_RELAXED) == 0) {
      clpar_tensor_release(o->flats[k].leaf);
      clpar_tensor_free(o->flats[k].state[0]);
      clpar_tensor_free(o->flats[k].state[1]);
      o->flats[k--] = o->flats[--o->n_flats];
    }
  /* Whole flat groups first, one kernel each; o->counts is reused for the members' indices. */
  int n_groups = clpar_flat_whole_groups(o->ptrs, o->n, o->group_of, o->leaves, o->counts);
  for (int k = 0; k < n_groups; k++) {
    int n = 0;
    for (int i = 0; i < o->n; i++)
      if (o->group_of[i] == k) o->counts[n++] = i;
    if (n == 0) continue;
    int done;
    clpar_status s = step_group(o, o->leaves[k], o->counts, n, &done);
    if (s != CLPAR_OK) return s;
    for (int i = 0; !done && i < n; i++) o->group_of[o->counts[i]] = -1; /* one by one below */
  }
  for (int i = 0; i < o->n; i++) {
    if (o->group_of[i] >= 0) continue; /* stepped with its group */
    if (!clpar_tensor_has_grad(o->params[i].param))
      continue; /* as PyTorch: no gradient, no update */
    clpar_status s = step_one(o, &o->params[i]);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

clpar_status clpar_optimizer_zero_grad(clpar_optimizer *o) {
  if (!o)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_optimizer_zero_grad: optimizer is NULL");
  return clpar_zero_grads("clpar_optimizer_zero_grad", o->ptrs, o->n, o->group_of, o->leaves,
                          o->counts);
}

void clpar_optimizer_free(clpar_optimizer *o) {
  if (!o) return;
  clpar_graph_invalidate_all("clpar_optimizer_free"); /* a graph's patches use o */
  for (int i = 0; i < o->n; i++) {
    clpar_tensor_release(o->params[i].param);
    clpar_tensor_free(o->params[i].state[0]);
    clpar_tensor_free(o->params[i].state[1]);
  }
  for (int k = 0; k < o->n_flats; k++) {
    clpar_tensor_release(o->flats[k].leaf);
    clpar_tensor_free(o->flats[k].state[0]);
    clpar_tensor_free(o->flats[k].state[1]);
  }
  free(o->flats);
  free(o->sgd);
  free(o->adam);
  free(o->params);
  free(o->ptrs);
  free(o->leaves);
  free(o->group_of);
  free(o->counts);
  free(o);
}

/* ---- what a training checkpoint saves and restores (src/io/checkpoint.c) ---- */

const char *clpar_optimizer_kind(const clpar_optimizer *o) {
  return o->kind == OPT_SGD ? "SGD" : o->kind == OPT_ADAM ? "Adam" : "AdamW";
}

int clpar_optimizer_size(const clpar_optimizer *o) {
  return o->n;
}

clpar_tensor *clpar_optimizer_param_at(const clpar_optimizer *o, int i) {
  return o->params[i].param;
}

clpar_tensor *clpar_optimizer_state_at(const clpar_optimizer *o, int i, int k) {
  return o->params[i].state[k];
}

int64_t clpar_optimizer_steps_at(const clpar_optimizer *o, int i) {
  return o->params[i].steps;
}

void clpar_optimizer_options(const clpar_optimizer *o, clpar_sgd_options *sgd,
                             clpar_adam_options *adam) {
  clpar_optimizer_group_options(o, 0, sgd, adam);
}

void clpar_optimizer_group_options(const clpar_optimizer *o, int g, clpar_sgd_options *sgd,
                                   clpar_adam_options *adam) {
  *sgd = o->sgd[g];
  *adam = o->adam[g];
}

void clpar_optimizer_restore(clpar_optimizer *o, int i, clpar_tensor *s0, clpar_tensor *s1,
                             int64_t steps) {
  param_state *ps = &o->params[i];
  clpar_tensor_free(ps->state[0]);
  clpar_tensor_free(ps->state[1]);
  ps->state[0] = s0;
  ps->state[1] = s1;
  ps->steps = steps;
}

clpar_status clpar_optimizer_set_options(clpar_optimizer *o, const clpar_sgd_options *sgd,
                                         const clpar_adam_options *adam, int apply) {
  return clpar_optimizer_set_group_options(o, 0, sgd, adam, apply);
}

clpar_status clpar_optimizer_set_group_options(clpar_optimizer *o, int g,
                                               const clpar_sgd_options *sgd,
                                               const clpar_adam_options *adam, int apply) {
  const char *fn = "the checkpoint's optimizer options";
  clpar_status s = o->kind == OPT_SGD ? check_sgd(fn, sgd) : check_adam(fn, adam);
  if (s != CLPAR_OK || !apply) return s;
  if (o->kind == OPT_SGD)
    o->sgd[g] = *sgd;
  else
    o->adam[g] = *adam;
  return CLPAR_OK;
}
