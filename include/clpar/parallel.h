/* parallel.h — DataParallel: one module trained on several devices at once, as PyTorch's
 * nn.DataParallel. Forward splits the batch along dim 0 (torch.chunk sizes, or sizes in
 * proportion to per-device weights), runs one replica per device in parallel (the calling
 * thread issues them all; each device's worker runs its own), and gathers the outputs on the
 * output device, without waiting for any device. Backward sums the replicas' gradients into
 * the wrapped module's parameters, on the first device; after an optimizer step every replica
 * computes with the new parameters. The wrapped module is flattened (clpar_module_flatten):
 * replicas persist between steps, and a forward copies the parameters to a replica in one
 * transfer, only when they changed. */
#ifndef CLPAR_PARALLEL_H
#define CLPAR_PARALLEL_H

#include <stdint.h>

#include "device.h"
#include "export.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clpar_data_parallel_options {
  /* The devices, in order; NULL (with n_devices 0) means every selected device. The module's
   * parameters live on devices[0], where they are moved if they are elsewhere. */
  clpar_device *const *devices;
  int n_devices;
  /* Where the output is gathered; NULL means devices[0]. */
  clpar_device *output_device;
  /* Optional relative speed of each device (n_devices entries, each > 0): weights 3, 1 give
   * 75% and 25% of the rows. NULL means torch.chunk sizes (ceil(N / k) rows each). */
  const float *weights;
} clpar_data_parallel_options;

/* Wraps module (taking ownership of it, also on error) into a module of type "DataParallel"
 * whose only child is "module": its parameters are named "module.<name>", as in PyTorch, and
 * are the wrapped module's own, so an optimizer of either trains the same tensors. Use it
 * with clpar_module_forward; free it with clpar_module_free. options may be NULL. The forward
 * function of a wrapped user module must reach its parameters and children through self
 * (clpar_module_parameter, clpar_module_child), since each replica is another self.
 * One thread at a time trains a wrapper (its gradients, buffers and replicas are shared): a
 * forward that records a graph while a graph of another thread's forward through it is alive
 * returns CLPAR_ERROR_BUSY; once that thread's outputs and losses are freed (clpar_scope_end)
 * any thread may go on. Forwards without a gradient may come from any thread. */
CLPAR_API clpar_status clpar_data_parallel_create(clpar_module *module,
                                                  const clpar_data_parallel_options *options,
                                                  clpar_module **out);

/* Row counts of the split of a batch of rows over the wrapper's devices: as many as there are
 * chunks (devices left without rows get none). Returns the count, or a negative status. */
CLPAR_API int clpar_data_parallel_split(const clpar_module *dp, int64_t rows, int64_t *sizes);

/* Host time the calling thread spent issuing each part of the data-parallel steps since the
 * last reset, in seconds (the devices' work runs on their workers and is not in it: nothing
 * here waits for a device, except where a device's memory had to be allocated). */
typedef struct clpar_data_parallel_stats {
  uint64_t forwards;
  double scatter_seconds;     /* splitting the batch and posting the chunks' copies */
  double replicate_seconds;   /* posting the parameter copies and making the replicas' views */
  double apply_seconds;       /* issuing the replicas' forwards */
  double gather_seconds;      /* posting the outputs' copies and the concatenation */
  double reduce_seconds;      /* backward: posting the replicas' flat gradient copies */
  uint64_t parameters_copied; /* flat parameter copies to replicas: one per replica and forward
                               * after any parameter changed (all parameters in one transfer) */
} clpar_data_parallel_stats;

CLPAR_API clpar_status clpar_data_parallel_stats_get(const clpar_module *dp,
                                                     clpar_data_parallel_stats *out);
CLPAR_API clpar_status clpar_data_parallel_stats_reset(clpar_module *dp);

#ifdef __cplusplus
}
#endif
#endif
