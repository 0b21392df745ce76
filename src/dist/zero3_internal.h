/* zero3_internal.h — what the files of ZeRO stage 3 share: zero3.c (the units, their forward
 * and backward) and zero3_state.c (what the optimizer, the user and the checkpoints see). */
#ifndef CLPAR_ZERO3_INTERNAL_H
#define CLPAR_ZERO3_INTERNAL_H

#include "dist/ddp_internal.h"

#define UNIT_TYPE "FSDPUnit"

typedef struct {
  clpar_tensor *param; /* the module's tensor, retained */
  int ndim;            /* its shape while it held its values */
  int64_t shape[CLPAR_MAX_DIMS];
  int64_t at; /* its first float in the unit's flat vector */
} z3_param;

typedef struct zero3 zero3;

typedef struct {
  zero3 *z;
  clpar_module *inner; /* the unit, one reference: its forward runs with self = the wrapper */
  clpar_module *wrapper;
  int n_params;
  z3_param *params;
  int64_t numel, shard;
  clpar_tensor *pshard; /* [shard] on the device, a leaf that requires a gradient */
} z3_unit;

struct zero3 {
  ddp_state *st;
  clpar_device *dev;
  int world, rank;
  int n_units;
  z3_unit **units;
  clpar_tensor *placeholder; /* [1] holding NaN: what a released parameter shows */
  float *host, *mine;        /* world * max shard, max shard: the collectives' host memory */
  int64_t max_shard;
  int gathered; /* clpar_zero_gather_parameters gave the parameters their values */
};

/* The unit's full parameters in a new device buffer [numel] (counted as parameters), all-gathered
 * with what as the collective's name. A rank that cannot read its shard still takes part (with
 * zeros) and fails after the collective. */
clpar_status clpar_z3_gather_full(z3_unit *u, const char *what, clpar_tensor **full);
/* Every parameter of every unit gives up its memory: a [1] view of the placeholder. */
void clpar_z3_release_all(zero3 *z);
/* The unit's values from its parameters, in a new host vector of world shards (zero-padded). */
clpar_status clpar_z3_unit_values(z3_unit *u, const char *fn, float **out);

#endif
