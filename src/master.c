/* master.c — 16-bit parameters with float32 master copies (clpar/master_weights.h): the
 * parameters are converted in place (their tensor objects stay, as module.to() keeps them),
 * the masters are plain float32 leaves that any optimizer steps. */
#include <stdlib.h>

#include "internal.h"

struct clpar_master_weights {
  int n;
  clpar_tensor **params;  /* retained: the module's, now 16-bit */
  clpar_tensor **masters; /* owned: float32 leaves that require a gradient */
};

/* t takes the memory and dtype of h (a new 16-bit copy of it); h leaves with t's old memory,
 * freed with h. t's gradient is dropped: it was float32. */
static void take_storage(clpar_tensor *t, clpar_tensor *h) {
  clpar_storage *old = t->storage;
  size_t off = t->offset;
  t->storage = h->storage, t->offset = h->offset, t->dtype = h->dtype;
  h->storage = old, h->offset = off, h->dtype = CLPAR_FLOAT32;
  clpar_tensor_release(h);
  clpar_tensor_free(t->grad);
  t->grad = NULL;
  t->grad_defined = 0;
}

/* The master of p (a float32 copy, a leaf that requires a gradient), then p made 16-bit. */
static clpar_status convert_param(const char *name, clpar_tensor *p, clpar_dtype dtype,
                                  clpar_tensor **master) {
  const char *fn = "clpar_master_weights_create";
  if (p->dtype != CLPAR_FLOAT32 || p->flat || p->node)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: parameter \"%s\" is %s%s; it must be a float32 leaf of its own "
                           "(not in a clpar_module_flatten group)",
                           fn, name, clpar_dtype_name(p->dtype), p->flat ? " in a flat group" : "");
  clpar_tensor *h = NULL;
  clpar_status s = clpar_tensor_empty(p->storage->dev, p->ndim, p->shape, master);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(*master);
  s = clpar_copy(*master, p);
  if (s == CLPAR_OK) s = clpar_tensor_set_requires_grad(*master, 1);
  if (s == CLPAR_OK) s = clpar_convert_dtype(p, dtype, &h);
  if (s != CLPAR_OK) {
    clpar_tensor_release(*master);
    *master = NULL;
    return s;
  }
  clpar_tensor_unscope(h);
  take_storage(p, h);
  return CLPAR_OK;
}

clpar_status clpar_master_weights_create(clpar_module *m, clpar_dtype dtype,
                                         clpar_master_weights **out) {
  const char *fn = "clpar_master_weights_create";
  if (!m || !out) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (!clpar_dtype_is_half(dtype))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: dtype is %s (%d); it must be bfloat16 or float16", fn,
                           clpar_dtype_name(dtype), (int)dtype);
  int n = clpar_module_parameter_count(m);
  clpar_master_weights *mw = calloc(1, sizeof *mw);
  if (mw) mw->params = calloc((size_t)n + 1, sizeof *mw->params);
  if (mw && mw->params) mw->masters = calloc((size_t)n + 1, sizeof *mw->masters);
  if (!mw || !mw->masters) {
    clpar_master_weights_free(mw);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  clpar_status s = CLPAR_OK;
  for (int i = 0; i < n && s == CLPAR_OK; i++) { /* checked whole before any is converted */
    const char *name;
    clpar_tensor *p;
    s = clpar_module_parameter_at(m, i, &name, &p);
    if (s == CLPAR_OK && (p->dtype != CLPAR_FLOAT32 || p->flat || p->node))
      s = convert_param(name, p, dtype, &mw->masters[i]); /* only sets the error */
  }
  for (int i = 0; i < n && s == CLPAR_OK; i++) {
    const char *name;
    s = clpar_module_parameter_at(m, i, &name, &mw->params[i]);
    if (s == CLPAR_OK) s = convert_param(name, mw->params[i], dtype, &mw->masters[i]);
    if (s == CLPAR_OK) clpar_tensor_retain(mw->params[i]), mw->n = i + 1;
  }
  if (s != CLPAR_OK) {
    clpar_master_weights_free(mw);
    return s;
  }
  *out = mw;
  return CLPAR_OK;
}

int clpar_master_weights_count(const clpar_master_weights *mw) {
  return mw ? mw->n : 0;
}

clpar_tensor *clpar_master_weights_at(const clpar_master_weights *mw, int i) {
  return mw && i >= 0 && i < mw->n ? mw->masters[i] : NULL;
}

clpar_status clpar_master_weights_grads(clpar_master_weights *mw) {
  if (!mw)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_master_weights_grads: mw is NULL");
  for (int i = 0; i < mw->n; i++) {
    clpar_tensor *p = mw->params[i], *ms = mw->masters[i];
    if (!clpar_tensor_has_grad(p)) continue;
    if (!ms->grad) {
      clpar_status s = clpar_tensor_empty(ms->storage->dev, ms->ndim, ms->shape, &ms->grad);
      if (s != CLPAR_OK) return s;
      clpar_tensor_unscope(ms->grad);
    }
    clpar_status s = clpar_convert_into(p->grad, ms->grad);
    if (s != CLPAR_OK) return s;
    ms->grad_defined = 1;
  }
  return CLPAR_OK;
}

clpar_status clpar_master_weights_update(clpar_master_weights *mw) {
  if (!mw)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_master_weights_update: mw is NULL");
  for (int i = 0; i < mw->n; i++) {
    clpar_status s = clpar_convert_into(mw->masters[i], mw->params[i]);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

clpar_status clpar_master_weights_zero_grad(clpar_master_weights *mw) {
  if (!mw)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_master_weights_zero_grad: mw is NULL");
  for (int i = 0; i < mw->n; i++) {
    clpar_status s = clpar_tensor_zero_grad(mw->params[i]);
    if (s == CLPAR_OK) s = clpar_tensor_zero_grad(mw->masters[i]);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

void clpar_master_weights_free(clpar_master_weights *mw) {
  if (!mw) return;
  for (int i = 0; mw->masters && i <= mw->n; i++) clpar_tensor_release(mw->masters[i]);
  for (int i = 0; mw->params && i < mw->n; i++) clpar_tensor_release(mw->params[i]);
  free(mw->params);
  free(mw->masters);
  free(mw);
}
