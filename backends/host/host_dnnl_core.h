/* host_dnnl_core.h — what the host backend's oneDNN entries share (host_dnnl_core.c): the
 * CPU engine and its stream, the host's cache of primitives (dnnl_prim.h, shared with the
 * OpenCL backend's oneDNN path), and the work buffers the reorders and the primitives'
 * scratch outputs use. Built with CLPAR_HAVE_DNNL. */
#ifndef CLPAR_HOST_DNNL_CORE_H
#define CLPAR_HOST_DNNL_CORE_H

#include <oneapi/dnnl/dnnl.h>

#include "backend.h"
#include "dnnl_prim.h"

/* One mutex over everything below; held while a primitive runs (the work buffers are shared
 * and a primitive with its own scratchpad must not run twice at once). */
void hd_lock(void);
void hd_unlock(void);
dnnl_engine_t hd_engine(void); /* made by hd_lookup */

/* The host's cache (dnnl_prim.h), with the engine and the stream made first. Lock held. */
clpar_status hd_lookup(int kind, const void *key, size_t key_len, hd_build_fn build,
                       hd_entry **out);
/* The host's memory for hd_exec: pointers, and the work buffers below. Lock held. */
clpar_status hd_host_io(hd_io *io);

/* Runs e on the user's pointers (one per operand, in the order they were added; scratch
 * ones are not read), through hd_exec with the host's io. Lock held. */
clpar_status hd_run(const hd_entry *e, void *const *ptrs, int have_first);

/* n floats of 1 (*ones) and n floats of scratch (*temp), each kept until the next call that
 * asks for more, or the release. Lock held. */
clpar_status hd_ones(size_t n, float **ones);
clpar_status hd_temp(size_t n, float **temp);

/* The channel block of the layouts oneDNN's JIT kernels want on this CPU (16 with AVX-512,
 * else 8). */
int hd_channel_block(void);

#endif
