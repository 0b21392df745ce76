/* autograd.h — gradients. Ops record what backward needs when an input requires a gradient
 * (and recording is enabled on the thread); clpar_backward on a one-element loss computes the
 * gradient of every tensor that requires one, on the device where its forward ran, and adds
 * it into that tensor's grad: gradients accumulate across backward calls until zeroed. */
#ifndef CLPAR_AUTOGRAD_H
#define CLPAR_AUTOGRAD_H

#include "export.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Marks a leaf tensor (one no op produced) as needing a gradient, or not. */
CLPAR_API clpar_status clpar_tensor_set_requires_grad(clpar_tensor *t, int requires_grad);
CLPAR_API int clpar_tensor_requires_grad(const clpar_tensor *t);
/* The accumulated gradient, owned by t (do not free); NULL before the first backward. */
CLPAR_API clpar_tensor *clpar_tensor_grad(const clpar_tensor *t);
/* Sets t's gradient to zeros (keeps its memory); nothing to do when it has none. */
CLPAR_API clpar_status clpar_tensor_zero_grad(clpar_tensor *t);

/* Backpropagates from a tensor of one element, from a 1 of its dtype (torch's
 * ones_like(loss): a bfloat16 or float16 loss starts from a 16-bit 1); any other numel is
 * CLPAR_ERROR_SHAPE_MISMATCH. CLPAR_ERROR_NO_GRADIENT when it does not require a gradient. Enqueues
 * work and returns; the graph can be backpropagated again. */
CLPAR_API clpar_status clpar_backward(clpar_tensor *loss);

/* Gradient hooks: fn(t, user) runs on the thread that called clpar_backward as soon as t's
 * gradient is final in that backward (every op that uses t has delivered its share; the
 * additions are posted to the device, not necessarily done). DistributedDataParallel's
 * buckets start their all-reduce from these. t must be a leaf that requires a gradient. */
typedef void (*clpar_grad_hook_fn)(clpar_tensor *t, void *user);
CLPAR_API clpar_status clpar_tensor_add_grad_hook(clpar_tensor *t, clpar_grad_hook_fn fn,
                                                  void *user);
/* Removes the first hook registered with this fn and user; CLPAR_ERROR_INVALID_ARGUMENT if
 * there is none. */
CLPAR_API clpar_status clpar_tensor_remove_grad_hook(clpar_tensor *t, clpar_grad_hook_fn fn,
                                                     void *user);
/* Recording on this thread (on by default); off is PyTorch's torch.no_grad(). Returns the
 * previous setting. */
CLPAR_API int clpar_set_grad_enabled(int enabled);
CLPAR_API int clpar_is_grad_enabled(void);

#ifdef __cplusplus
}
#endif
#endif
