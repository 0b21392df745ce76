/* master_weights.h — 16-bit parameters with float32 master copies (mixed-precision training
 * as llm.c and apex's O2 do it): the module keeps its parameters in bfloat16 or float16 (half
 * the bytes; its Linear layers run on them inside an autocast region, autocast.h), and any
 * optimizer steps float32 copies of them, so that updates smaller than a 16-bit step are not
 * lost. One step:
 *
 *   clpar_autocast_begin(dtype); forward, loss; clpar_autocast_end();
 *   clpar_backward(loss);                    parameters' gradients, in dtype
 *   clpar_master_weights_grads(mw);          masters' gradients = float32(parameters' ones)
 *   clpar_optimizer_step(opt);               opt made over the masters (clpar_sgd_create, ...)
 *   clpar_master_weights_update(mw);         parameters = masters rounded to dtype
 *   clpar_master_weights_zero_grad(mw);      both sets of gradients to zero
 *
 * A module with flattened parameter groups (clpar_module_flatten) is refused, and
 * clpar_module_flatten (so DataParallel and DistributedDataParallel) refuses 16-bit
 * parameters with CLPAR_ERROR_DTYPE: there, keep float32 parameters and train inside
 * clpar_autocast_begin/end (PyTorch's AMP). The pipeline takes 16-bit parameters. */
#ifndef CLPAR_MASTER_WEIGHTS_H
#define CLPAR_MASTER_WEIGHTS_H

#include "export.h"
#include "nn.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clpar_master_weights clpar_master_weights;

/* Converts every float32 parameter of m to dtype (bfloat16 or float16) in place (the tensor
 * objects stay; their gradients are dropped) and keeps a float32 copy of each, taken before
 * the conversion. */
CLPAR_API clpar_status clpar_master_weights_create(clpar_module *m, clpar_dtype dtype,
                                                   clpar_master_weights **out);
/* The float32 masters, in clpar_module_parameter_at's order (borrowed): give them to the
 * optimizer. */
CLPAR_API int clpar_master_weights_count(const clpar_master_weights *mw);
CLPAR_API clpar_tensor *clpar_master_weights_at(const clpar_master_weights *mw, int i);
/* Each master's gradient set to its parameter's, widened to float32 (a parameter without
 * one leaves its master's as it is). */
CLPAR_API clpar_status clpar_master_weights_grads(clpar_master_weights *mw);
/* Each parameter set to its master rounded to nearest even. */
CLPAR_API clpar_status clpar_master_weights_update(clpar_master_weights *mw);
/* Zeroes the gradients of the parameters and of the masters. */
CLPAR_API clpar_status clpar_master_weights_zero_grad(clpar_master_weights *mw);
/* Frees the masters (the parameters stay in dtype). Accepts NULL. */
CLPAR_API void clpar_master_weights_free(clpar_master_weights *mw);

#ifdef __cplusplus
}
#endif
#endif
