/* clpar.h — the whole public API of clpar: neural networks on many devices at once, through
 * OpenCL (any vendor), CUDA and a host reference backend. */
#ifndef CLPAR_H
#define CLPAR_H

#include <clpar/version.h>
#include "export.h"
#include "status.h"
#include "log.h"
#include "device.h"
#include "tensor.h"
#include "ops.h"
#include "autograd.h"
#include "nn.h"
#include "conv.h"
#include "optim.h"
#include "parallel.h"
#include "pipeline.h"
#include "dist.h"
#include "zero.h"
#include "memory.h"
#include "checkpoint.h"
#include "checkpoint_zero.h"
#include "amp.h"
#include "data.h"
#include "text.h"
#include "models.h"
#include "transformer.h"
#include "half.h"
#include "autocast.h"
#include "master_weights.h"
#include "recompute.h"
#include "graph.h"

#endif
