/* capture_writes.h — a graph's small writes from host memory (capture_writes.c), for capture.c:
 * values the host computes before each replay (BatchNorm's num_batches_tracked), each replay's
 * in memory of its own, so that a replay never waits for the previous one. */
#ifndef CLPAR_RUNTIME_CAPTURE_WRITES_H
#define CLPAR_RUNTIME_CAPTURE_WRITES_H

#include "runtime.h"

typedef struct clpar_host_writes clpar_host_writes;

/* Adds a write of bytes (at most 16) on device d (dev) to *ws (made on first use), fn(user,
 * value) filling the value now and before each replay: the value's memory for the capture
 * run's write, or NULL (user freed) when out of memory or bytes is over 16. */
void *clpar_host_writes_add(clpar_host_writes **ws, clpar_device *dev, int d, size_t bytes,
                            clpar_value_fn fn, void *user, void (*free_user)(void *));
/* Finds the last added write's command in its device's list cmds[0 .. n), once posted: 1, or
 * 0 when it is not there. */
int clpar_host_writes_bind(clpar_host_writes *ws, const clpar_command *cmds, size_t n);
/* The commands of device d moved: old index i is map[i] now. */
void clpar_host_writes_remap(clpar_host_writes *ws, int d, const size_t *map);
/* Before a replay: takes memory no posted replay still reads (or new memory), fills each
 * write's value there and points its command (cmds[d][index]) at it. ws may be NULL. */
clpar_status clpar_host_writes_prepare(clpar_host_writes *ws, clpar_command *const *cmds);
/* After a replay was posted: records on each device with writes the event after which its
 * values' memory may be reused. ws may be NULL. */
clpar_status clpar_host_writes_posted(clpar_host_writes *ws);
/* Frees ws (the devices ran every replay), its users' data with it. */
void clpar_host_writes_free(clpar_host_writes *ws);

#endif
