/* optim.h — optimizers with PyTorch's update rules: SGD (momentum, dampening, nesterov,
 * weight decay), Adam and AdamW. A step enqueues one fused kernel per parameter on the
 * parameter's device and does not wait; when the optimizer holds every parameter of a flat
 * buffer (clpar_module_flatten, DataParallel), one kernel over the whole buffer, with the same
 * result. An optimizer stays valid when its parameters move (clpar_module_to,
 * clpar_data_parallel_create): its state moves with them at the next step. */
#ifndef CLPAR_OPTIM_H
#define CLPAR_OPTIM_H

#include "export.h"
#include "nn.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clpar_optimizer clpar_optimizer;

/* torch.optim.SGD. A field left 0 takes PyTorch's default (status.h's convention): lr 0 means
 * 1e-3 (CLPAR_ZERO for a literal 0); momentum, dampening and weight_decay default to 0, so 0
 * is literal there. */
typedef struct clpar_sgd_options {
  float lr;           /* 0: 1e-3 */
  float momentum;     /* 0 */
  float dampening;    /* 0 */
  float weight_decay; /* 0 */
  int nesterov;       /* 0; needs momentum > 0 and dampening 0, as in PyTorch */
} clpar_sgd_options;

/* torch.optim.Adam and torch.optim.AdamW. A field left 0 takes PyTorch's default (status.h's
 * convention); write CLPAR_ZERO for a literal 0 (beta1 = CLPAR_ZERO: no momentum;
 * weight_decay = CLPAR_ZERO: AdamW without decay):
 *   lr 0 means 1e-3; beta1 0 means 0.9; beta2 0 means 0.999; eps 0 means 1e-8;
 *   weight_decay 0 means 0 for Adam (L2 added to the gradient) and 1e-2 for AdamW (decoupled
 *   decay), PyTorch's defaults for each. */
typedef struct clpar_adam_options {
  float lr;
  float beta1, beta2; /* each in [0, 1) */
  float eps;
  float weight_decay;
} clpar_adam_options;

/* The optimizer keeps a reference to each parameter; a tensor given twice is refused
 * (CLPAR_ERROR_INVALID_ARGUMENT), since it would be stepped twice. options NULL means every
 * default. A value out of range (negative, NaN, a beta of 1) is CLPAR_ERROR_INVALID_ARGUMENT
 * naming the function and the field. */
CLPAR_API clpar_status clpar_sgd_create(clpar_tensor *const *params, int n,
                                        const clpar_sgd_options *options, clpar_optimizer **out);
CLPAR_API clpar_status clpar_adam_create(clpar_tensor *const *params, int n,
                                         const clpar_adam_options *options, clpar_optimizer **out);
CLPAR_API clpar_status clpar_adamw_create(clpar_tensor *const *params, int n,
                                          const clpar_adam_options *options, clpar_optimizer **out);
/* The same for every parameter of a module. */
CLPAR_API clpar_status clpar_sgd_create_for(clpar_module *m, const clpar_sgd_options *options,
                                            clpar_optimizer **out);
CLPAR_API clpar_status clpar_adam_create_for(clpar_module *m, const clpar_adam_options *options,
                                             clpar_optimizer **out);
CLPAR_API clpar_status clpar_adamw_create_for(clpar_module *m, const clpar_adam_options *options,
                                              clpar_optimizer **out);

/* One update of every parameter that has a gradient. */
CLPAR_API clpar_status clpar_optimizer_step(clpar_optimizer *opt);
CLPAR_API clpar_status clpar_optimizer_zero_grad(clpar_optimizer *opt);
CLPAR_API void clpar_optimizer_free(clpar_optimizer *opt);

#ifdef __cplusplus
}
#endif
#endif
