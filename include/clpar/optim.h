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

typedef struct clpar_sgd_options {
  float lr;
  float momentum;
  float dampening;
  float weight_decay;
  int nesterov; /* needs momentum > 0 and dampening == 0, as in PyTorch */
} clpar_sgd_options;

typedef struct clpar_adam_options {
  float lr;           /* PyTorch's default 1e-3 */
  float beta1, beta2; /* 0.9, 0.999 */
  float eps;          /* 1e-8 */
  float weight_decay; /* Adam: L2 added to the gradient; AdamW: decoupled decay */
} clpar_adam_options;

/* The optimizer keeps a reference to each parameter; a tensor given twice is refused
 * (CLPAR_ERROR_INVALID_ARGUMENT), since it would be stepped twice. */
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
