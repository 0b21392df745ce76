/* optim_graph.c — an optimizer step inside a captured graph (clpar/graph.h): the fused step's
 * command is patched before each replay with the scalars the eager step would use (the current
 * learning rate, so schedulers work; Adam's bias corrections for the next step count), and the
 * step counts advance as they would. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
  clpar_optimizer *o;
  clpar_tensor *touched; /* what the step updates: its version moves at each replay */
  int group;
  int momentum; /* SGD: whether the capture's step had a momentum buffer */
  int n;
  int members[];
} step_patch;

static int has_momentum(const clpar_optimizer *o, int group) {
  clpar_sgd_options sgd;
  clpar_adam_options adam;
  clpar_optimizer_group_options(o, group, &sgd, &adam);
  return strcmp(clpar_optimizer_kind(o), "SGD") == 0 && sgd.momentum != 0.0f;
}

static clpar_status replay_step(void *user, clpar_patch_args *a) {
  step_patch *p = user;
  if (has_momentum(p->o, p->group) != p->momentum)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_graph_replay: SGD's momentum of parameter group %d turned %s "
                           "after the capture, which changes the buffers the step uses; capture "
                           "the step again",
                           p->group, p->momentum ? "to 0" : "on");
  clpar_optimizer_replay_args(p->o, p->group, p->members, p->n, a);
  clpar_tensor_touch(p->touched);
  return CLPAR_OK;
}

clpar_status clpar_optimizer_capture(clpar_optimizer *o, clpar_device *dev, int group,
                                     const int *members, int n, clpar_tensor *touched) {
  if (!clpar_capture_active(dev)) return CLPAR_OK;
  step_patch *p = malloc(sizeof *p + (size_t)n * sizeof *p->members);
  if (!p)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_optimizer_step: out of host memory");
  p->o = o;
  p->touched = touched;
  p->group = group;
  p->momentum = has_momentum(o, group);
  p->n = n;
  memcpy(p->members, members, (size_t)n * sizeof *members);
  int sgd = strcmp(clpar_optimizer_kind(o), "SGD") == 0;
  return clpar_capture_patch(dev, sgd ? CLPAR_ENTRY_sgd_step : CLPAR_ENTRY_adam_step, replay_step,
                             p, free);
}
