/* sequential.c — the built-in Sequential module (PyTorch's nn.Sequential): its children run
 * in order; a Linear followed by a ReLU runs as one fused node (clpar_linear_act). */
#include <stdio.h>

#include "internal.h"

/* Child i of the Sequential self failed: the message says which, with self's name in the
 * module whose forward ran it (when that module holds it as a child). */
static clpar_status sequential_fail(const clpar_module *self, int i, clpar_status s) {
  const char *name = clpar_module_running_name(self);
  const clpar_module *child = self->children[i].item;
  clpar_prefix_error("Sequential %s%s%schild %d (%s): ", name ? "\"" : "", name ? name : "",
                     name ? "\" " : "", i, child->type);
  return s;
}

static clpar_status sequential_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                       void *user) {
  (void)user;
  clpar_tensor *cur = x;
  for (int i = 0; i < self->n_children; i++) {
    clpar_tensor *next;
    clpar_module *m = self->children[i].item;
    clpar_module *after = i + 1 < self->n_children ? self->children[i + 1].item : NULL;
    clpar_status s;
    int at = i;
    if (m->forward == clpar_linear_forward && after && after->forward == clpar_relu_forward) {
      /* Linear then ReLU: one node, the bias and the relu in one kernel (clpar_linear_act) */
      s = clpar_check_alive("clpar_module_forward", cur);
      if (s == CLPAR_OK)
        s = clpar_linear_act(cur, clpar_module_parameter(m, "weight"),
                             clpar_module_parameter(m, "bias"), CLPAR_ACT_RELU, &next);
      i++;
    } else {
      s = clpar_module_forward(m, cur, &next);
    }
    if (cur != x) clpar_tensor_free(cur); /* the graph keeps what backward needs */
    if (s != CLPAR_OK) return sequential_fail(self, at, s);
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
  if (s != CLPAR_OK) {              /* the children not added yet are owned even on error */
    int failed = i > 0 ? i - 1 : 0; /* add_child already dropped children[failed] */
    for (int j = failed + (i > 0); children && j < n; j++) {
      int again = 0; /* the same module given twice is dropped once */
      for (int k = failed; k < j; k++) again |= children[k] == children[j];
      if (!again) clpar_module_drop_given(children[j]);
    }
    if (m) clpar_module_release(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}
