/* capture_step.c — a step function compiled on first use (clpar/graph.h): the first run is
 * eager (a warm-up: gradients and optimizer state are made), the second is captured while it
 * runs, later ones replay (tinygrad TinyJit's order). */
#include <stdio.h>
#include <stdlib.h>

#include "clpar/graph.h"
#include "runtime.h"

struct clpar_step {
  clpar_step_fn fn;
  void *ctx;
  clpar_device *devs[8];
  int n;
  int runs; /* eager runs done: 0, then 1 until captured */
  clpar_graph *graph;
};

clpar_status clpar_step_compile(clpar_step_fn fn, void *ctx, clpar_device *const *devs, int n,
                                clpar_step **out) {
  if (!fn || !devs || !out || n < 1 || n > 8)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_step_compile: NULL argument, or %d devices (1 to 8)", n);
  clpar_step *st = calloc(1, sizeof *st);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_step_compile: out of memory");
  st->fn = fn;
  st->ctx = ctx;
  st->n = n;
  for (int i = 0; i < n; i++) st->devs[i] = devs[i];
  *out = st;
  return CLPAR_OK;
}

clpar_status clpar_step_run(clpar_step *st) {
  if (!st) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_step_run: step is NULL");
  if (st->graph) return clpar_graph_replay(st->graph);
  if (st->runs == 0) {
    clpar_status s = st->fn(st->ctx);
    if (s == CLPAR_OK) st->runs = 1;
    return s;
  }
  clpar_status s = clpar_graph_capture_begin(st->devs, st->n);
  if (s != CLPAR_OK) return s;
  clpar_status ran = st->fn(st->ctx);
  char message[1024];
  snprintf(message, sizeof message, "%s", clpar_last_error());
  s = clpar_graph_capture_end(&st->graph);
  if (ran != CLPAR_OK) { /* the step's own error first */
    clpar_graph_destroy(st->graph);
    st->graph = NULL;
    return clpar_set_error(ran, "%s", message);
  }
  return s;
}

clpar_graph *clpar_step_graph(const clpar_step *st) {
  return st ? st->graph : NULL;
}

void clpar_step_free(clpar_step *st) {
  if (!st) return;
  clpar_graph_destroy(st->graph);
  free(st);
}
