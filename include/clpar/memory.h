/* memory.h — device memory by category, for users to read (PyTorch's
 * torch.cuda.max_memory_allocated, split the way DeepSpeed's ZeRO paper counts it). Every
 * tensor's memory on a device is counted in one category: the parameters (a module's
 * parameters and their flat buffer), their gradients, optimizer state (momentum, Adam's
 * moments), communication buffers (device memory made for collectives; the MPI path of
 * DistributedDataParallel reduces through host memory and makes none), and everything else,
 * counted as activations (what a forward saves for backward, temporaries, inputs). The counts
 * are of the allocator's rounded sizes (clpar_memory_stats.bytes_in_use counts the same, plus
 * the short-lived scratch some ops take outside tensors). The backend's own workspaces (the
 * convolutions' temporaries, cuDNN's workspace, oneDNN's work buffers: kept between ops, outside
 * the allocator) are CLPAR_MEM_WORKSPACE, read from the backend when memory is counted
 * (allocations, frees, these calls); clpar_device_empty_cache releases them.
 *
 * Usage: clpar_memory_mark(dev) before a training step, the step, then
 * clpar_memory_peak(dev, CLPAR_MEM_ACTIVATIONS) and so on: the most bytes each category held
 * at once since the mark, and CLPAR_MEM_TOTAL the most all of them held at once. */
#ifndef CLPAR_MEMORY_H
#define CLPAR_MEMORY_H

#include <stdint.h>

#include "device.h"
#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum clpar_mem_category {
  CLPAR_MEM_ACTIVATIONS = 0, /* and every tensor not in another category */
  CLPAR_MEM_PARAMETERS = 1,
  CLPAR_MEM_GRADIENTS = 2,
  CLPAR_MEM_OPTIMIZER = 3,
  CLPAR_MEM_COMMUNICATION = 4,
  CLPAR_MEM_TOTAL = 5, /* all of them together, the workspaces included */
  /* after TOTAL, so that the values above keep theirs: the backend's workspaces */
  CLPAR_MEM_WORKSPACE = 6,
  CLPAR_MEM_CATEGORIES = 7
} clpar_mem_category;

/* "activations", "parameters", "gradients", "optimizer", "communication", "total",
 * "workspace"; NULL out of range. */
CLPAR_API const char *clpar_memory_category_name(clpar_mem_category c);
/* Starts a new interval on dev: every category's peak becomes what it holds now. */
CLPAR_API clpar_status clpar_memory_mark(clpar_device *dev);
/* Bytes the category holds on dev now, and the most it held at once since the last mark (or
 * since clpar_init). 0 for a NULL device or a category out of range. */
CLPAR_API uint64_t clpar_memory_in_use(const clpar_device *dev, clpar_mem_category c);
CLPAR_API uint64_t clpar_memory_peak(const clpar_device *dev, clpar_mem_category c);

#ifdef __cplusplus
}
#endif
#endif
