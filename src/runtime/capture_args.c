/* capture_args.c — the scalar arguments of a captured command that a patch rewrites before
 * each replay (src/runtime/capture.c): an optimizer step's or a dropout mask's. */
#include "runtime.h"

void clpar_capture_patch_get(const clpar_command *c, clpar_patch_args *a) {
  if (c->op == CLPAR_ENTRY_sgd_step)
    a->sgd = c->u.sgd_step.args;
  else if (c->op == CLPAR_ENTRY_adam_step)
    a->adam = c->u.adam_step.args;
  else {
    a->rng.seed = c->u.dropout_mask.seed;
    a->rng.offset = c->u.dropout_mask.offset;
  }
}

void clpar_capture_patch_set(clpar_command *c, const clpar_patch_args *a) {
  if (c->op == CLPAR_ENTRY_sgd_step)
    c->u.sgd_step.args = a->sgd;
  else if (c->op == CLPAR_ENTRY_adam_step)
    c->u.adam_step.args = a->adam;
  else {
    c->u.dropout_mask.seed = a->rng.seed;
    c->u.dropout_mask.offset = a->rng.offset;
  }
}
