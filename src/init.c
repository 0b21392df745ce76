/* init.c — clpar_init and clpar_shutdown: the runtime (src/runtime/registry.c) started and
 * stopped with what the layers above it do then, handed down as hooks so that the runtime
 * never calls up: CLPAR_DEBUG's freed-tensor checks read at the start and their quarantine
 * freed at the end (src/debug.c), and grad mode off on each device's worker thread, so that
 * nothing run there (an event's callback) records autograd nodes. */
#include "internal.h"

static void worker_thread(void) {
  clpar_set_grad_enabled(0);
}

static const clpar_runtime_hooks layer_hooks = {
    .start = clpar_debug_init_from_env,
    .stop = clpar_debug_shutdown,
    .worker_thread = worker_thread,
};

clpar_status clpar_init(void) {
  return clpar_runtime_init(&layer_hooks);
}

void clpar_shutdown(void) {
  clpar_runtime_shutdown();
}
