/* capture_host.c — host calls and gates: commands through which a device's queue hands work
 * to a host thread and waits for it, recorded by a capture and replayed like any other command
 * (CUDA graphs' host nodes; runtime.h). DistributedDataParallel's buckets use them in a
 * captured step: a host call after the bucket's read tells the communication thread that the
 * bucket is in host memory, and a gate before the write of the averages waits for its
 * all-reduce. */
#include <stdio.h>
#include <stdlib.h>

#include "runtime.h"

struct clpar_gate {
  pthread_mutex_t lock;
  pthread_cond_t cv;
  uint64_t opened, passed;
  clpar_status status; /* the first opening with an error, kept */
  char message[768];
};

clpar_status clpar_dev_host_call(clpar_device *dev, clpar_host_call *call) {
  if (!call || !call->fn)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_dev_host_call: no function");
  clpar_command c = {.op = CLPAR_OP_HOST_CALL};
  c.u.host_call = call;
  return clpar_worker_post(dev, &c);
}

/* On the worker: a backend event after the work before, whose completion calls the function;
 * a backend without events (its work done when posted) calls it here. */
clpar_status clpar_host_call_run(clpar_device *dev, clpar_host_call *call) {
  void *bev = NULL;
  clpar_status s = dev->bd.iface->event_record(dev->bd.ctx, &bev);
  if (s != CLPAR_OK) {
    call->fn(call->user, s);
    return s;
  }
  if (!bev) {
    call->fn(call->user, CLPAR_OK);
    return CLPAR_OK;
  }
  s = dev->bd.iface->event_then(dev->bd.ctx, bev, call->fn, call->user);
  if (s != CLPAR_OK) { /* cannot be told: wait here */
    clpar_status f = dev->bd.iface->finish(dev->bd.ctx);
    call->fn(call->user, f);
  }
  dev->bd.iface->event_free(dev->bd.ctx, bev);
  return s;
}

clpar_gate *clpar_gate_new(void) {
  clpar_gate *g = calloc(1, sizeof *g);
  if (!g) {
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_gate_new: out of host memory");
    return NULL;
  }
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cv, NULL);
  return g;
}

void clpar_gate_open(clpar_gate *g, clpar_status status, const char *message) {
  pthread_mutex_lock(&g->lock);
  if (status != CLPAR_OK && g->status == CLPAR_OK) {
    g->status = status;
    snprintf(g->message, sizeof g->message, "%s", message ? message : "");
  }
  g->opened++;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->lock);
}

clpar_status clpar_dev_gate_wait(clpar_device *dev, clpar_gate *g) {
  if (!g) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_dev_gate_wait: no gate");
  clpar_command c = {.op = CLPAR_OP_GATE};
  c.u.gate = g;
  return clpar_worker_post(dev, &c);
}

/* On the worker: waits for the opening that matches this pass (a queue wait when it had to). */
clpar_status clpar_gate_pass(clpar_device *dev, clpar_gate *g) {
  pthread_mutex_lock(&g->lock);
  if (g->opened <= g->passed) __atomic_add_fetch(&dev->queue_waits, 1, __ATOMIC_RELAXED);
  while (g->opened <= g->passed) pthread_cond_wait(&g->cv, &g->lock);
  g->passed++;
  clpar_status s = g->status;
  if (s != CLPAR_OK) clpar_set_error(s, "%s", g->message);
  pthread_mutex_unlock(&g->lock);
  return s;
}

void clpar_gate_free(clpar_gate *g) {
  if (!g) return;
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->lock);
  free(g);
}

/* ---- replays in flight ---- */

static void replay_ended(void *user, clpar_status status) {
  (void)status; /* a failed replay ended too: its error is the queue's */
  clpar_device *dev = user;
  __atomic_sub_fetch(&dev->replays, 1, __ATOMIC_ACQ_REL);
}

void clpar_replay_end_add(clpar_capture *c, clpar_device *dev, const clpar_command *cmds, size_t n,
                          clpar_host_call *end) {
  size_t i = 0;
  while (i < n && cmds[i].op != CLPAR_OP_HOST_CALL && cmds[i].op != CLPAR_OP_GATE) i++;
  if (i == n) return; /* its replays hand nothing to a host thread: not counted */
  *end = (clpar_host_call){replay_ended, dev};
  clpar_command m = {.op = CLPAR_OP_HOST_CALL};
  m.u.host_call = end;
  clpar_capture_record(c, &m); /* out of host memory: the capture fails */
}

clpar_status clpar_replays_wait(clpar_device *dev) {
  if (!dev || __atomic_load_n(&dev->replays, __ATOMIC_ACQUIRE) == 0) return CLPAR_OK;
  __atomic_add_fetch(&dev->replay_drains, 1, __ATOMIC_RELAXED);
  return clpar_worker_drain(dev);
}
