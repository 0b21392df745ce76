/* nn.h — layers, activations and losses, and modules: Linear, ReLU, Sequential and
 * user-defined modules (a forward callback with named children, parameters and buffers, and a
 * training flag), so that PyTorch's nn.Module classes can be written in C. Parameters and
 * buffers have PyTorch-style names ("fc.weight", "seq1.0.bias", "bn1.running_mean"). Every op
 * here is differentiable. */
#ifndef CLPAR_NN_H
#define CLPAR_NN_H

#include <stdint.h>

#include "export.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- functional ops (over the last dimension where it matters) ---- */
CLPAR_API clpar_status clpar_relu(const clpar_tensor *x, clpar_tensor **out);
CLPAR_API clpar_status clpar_sigmoid(const clpar_tensor *x, clpar_tensor **out);
CLPAR_API clpar_status clpar_tanh(const clpar_tensor *x, clpar_tensor **out);
/* nn.GELU(approximate='none'): 0.5 x (1 + erf(x / sqrt 2)) (CLPAR_GELU_NONE, PyTorch's
 * default), or approximate='tanh': 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). */
typedef enum clpar_gelu_approx { CLPAR_GELU_NONE = 0, CLPAR_GELU_TANH = 1 } clpar_gelu_approx;
CLPAR_API clpar_status clpar_gelu(const clpar_tensor *x, clpar_gelu_approx approximate,
                                  clpar_tensor **out);
/* softmax over the last dimension of an N-d x (torch.softmax(x, dim=-1)), each row less its
 * maximum first */
CLPAR_API clpar_status clpar_softmax(const clpar_tensor *x, clpar_tensor **out);
CLPAR_API clpar_status clpar_log_softmax(const clpar_tensor *x, clpar_tensor **out);
/* the sum / mean of every element: shape [1] */
CLPAR_API clpar_status clpar_sum(const clpar_tensor *x, clpar_tensor **out);
CLPAR_API clpar_status clpar_mean(const clpar_tensor *x, clpar_tensor **out);
/* y = x @ weight^T + bias; x [batch, in], weight [out, in], bias [out] or NULL */
CLPAR_API clpar_status clpar_linear(const clpar_tensor *x, const clpar_tensor *weight,
                                    const clpar_tensor *bias, clpar_tensor **out);

/* ---- losses ---- */
typedef enum clpar_reduction { CLPAR_REDUCTION_MEAN = 0, CLPAR_REDUCTION_SUM = 1 } clpar_reduction;

/* mean or sum of (input - target)^2; same shapes */
CLPAR_API clpar_status clpar_mse_loss(const clpar_tensor *input, const clpar_tensor *target,
                                      clpar_reduction reduction, clpar_tensor **out);
/* Cross-entropy from logits [batch, classes] and one class index per row (host memory,
 * n_labels == batch, each in 0 .. classes-1). Mean or sum over the batch. */
CLPAR_API clpar_status clpar_cross_entropy(const clpar_tensor *logits, const int32_t *labels,
                                           int64_t n_labels, clpar_reduction reduction,
                                           clpar_tensor **out);

/* F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction=...) with the
 * targets on the device: logits [..., classes] (for example [N, T, V] or [N, V]) and targets
 * an int32 or int64 tensor of the leading shape ([N, T] or [N]), on the logits' device.
 * Targets equal to ignore_index (PyTorch's default: CLPAR_IGNORE_INDEX, -100) add nothing;
 * MEAN divides the sum by the number of the others (NaN when all are ignored, as torch). A
 * target outside 0 .. classes-1 that is not ignored is not checked on the host (that would
 * wait for the device): it makes the loss NaN. Result [1]; differentiable in logits. */
#define CLPAR_IGNORE_INDEX (-100)
CLPAR_API clpar_status clpar_cross_entropy_targets(const clpar_tensor *logits,
                                                   const clpar_tensor *targets,
                                                   int64_t ignore_index, clpar_reduction reduction,
                                                   clpar_tensor **out);

/* ---- modules ---- */
typedef struct clpar_module clpar_module;

/* A module's forward: output from input. user is what clpar_module_create was given. */
typedef clpar_status (*clpar_forward_fn)(clpar_module *self, clpar_tensor *input,
                                         clpar_tensor **output, void *user);

/* Seeds the generator parameters are initialized from (torch.manual_seed). Initialization is
 * device independent: the same seed gives the same weights on every backend. */
CLPAR_API void clpar_manual_seed(uint64_t seed);

/* nn.Linear: weight [out, in] and bias [out] uniform in +-1/sqrt(in), on dev. */
CLPAR_API clpar_status clpar_linear_create(int64_t in_features, int64_t out_features, int bias,
                                           clpar_device *dev, clpar_module **out);
CLPAR_API clpar_status clpar_relu_create(clpar_module **out);
/* nn.Sequential: children named "0", "1", ...; takes ownership of the children (also on
 * error) as clpar_module_add_child does. A module may appear more than once
 * (Sequential(relu, relu)). */
CLPAR_API clpar_status clpar_sequential_create(clpar_module *const *children, int n,
                                               clpar_module **out);
/* A user-defined module. free_user (may be NULL) is called on user when the module is freed. */
CLPAR_API clpar_status clpar_module_create(const char *type_name, clpar_forward_fn forward,
                                           void *user, void (*free_user)(void *),
                                           clpar_module **out);
/* Registers a child under name. The first parent takes over the creator's reference: do not
 * free the child after that. A module may be a child at several places (twice in one module,
 * or a layer shared by two models): it is reference counted and freed with the last of them.
 * A child that is m itself or contains m is refused (CLPAR_ERROR_INVALID_ARGUMENT) and
 * nothing is freed; on another error a child that no parent holds yet is freed. */
CLPAR_API clpar_status clpar_module_add_child(clpar_module *m, const char *name,
                                              clpar_module *child);
/* Registers a parameter under name; the module takes a reference and marks it as requiring a
 * gradient. */
CLPAR_API clpar_status clpar_module_add_parameter(clpar_module *m, const char *name,
                                                  clpar_tensor *param);
/* Registers a buffer under name (PyTorch's register_buffer): state that is saved, moved and
 * replicated with the module but not trained, such as BatchNorm's running statistics. The
 * module takes a reference. A buffer never requires a gradient: a tensor that requires one,
 * or the result of an op, is refused (CLPAR_ERROR_INVALID_ARGUMENT), as is a name already
 * used by a parameter or buffer of m. Optimizers and zero_grad never see buffers. Ops that
 * update a buffer do it in place (the tensor object stays the one registered). */
CLPAR_API clpar_status clpar_module_add_buffer(clpar_module *m, const char *name,
                                               clpar_tensor *buf);
CLPAR_API clpar_module *clpar_module_child(const clpar_module *m, const char *name);
/* A direct parameter by name (borrowed), NULL when there is none. */
CLPAR_API clpar_tensor *clpar_module_parameter(const clpar_module *m, const char *name);
/* A direct buffer by name (borrowed), NULL when there is none. */
CLPAR_API clpar_tensor *clpar_module_buffer(const clpar_module *m, const char *name);
CLPAR_API const char *clpar_module_type(const clpar_module *m);

CLPAR_API clpar_status clpar_module_forward(clpar_module *m, clpar_tensor *input,
                                            clpar_tensor **output);
/* Every parameter of m and its children, depth first in registration order. A module or a
 * parameter that appears at more than one place is listed once, under the first name met, as
 * PyTorch's parameters() does. */
CLPAR_API int clpar_module_parameter_count(const clpar_module *m);
/* Parameter i of that list with its full name ("seq1.0.weight"); both borrowed, the name
 * valid as long as m is. */
CLPAR_API clpar_status clpar_module_parameter_at(const clpar_module *m, int i, const char **name,
                                                 clpar_tensor **param);
/* Every buffer of m and its children, in PyTorch's named_buffers() order (a module's own
 * buffers, then its children's, depth first in registration order), each once under the first
 * name met ("bn1.running_mean"). A DataParallel or DistributedDataParallel wrapper lists the
 * wrapped module's buffers as "module.<name>", as PyTorch does. */
CLPAR_API int clpar_module_buffer_count(const clpar_module *m);
/* Buffer i of that list with its full name; both borrowed, the name valid as long as m is. */
CLPAR_API clpar_status clpar_module_buffer_at(const clpar_module *m, int i, const char **name,
                                              clpar_tensor **buf);
/* The entries of PyTorch's state_dict(): per module, its own parameters, then its own buffers,
 * then each child's entries, recursively ("w", "b0", "fc.weight", "fc.bias",
 * "bn1.weight", "bn1.bias", "bn1.running_mean", ...). A tensor or module that appears at more
 * than one place is listed once, under the first name met (PyTorch's state_dict repeats it
 * under every name; safetensors' save_model drops the repeats, as here). Checkpoints save and
 * load this list. */
CLPAR_API int clpar_module_state_count(const clpar_module *m);
/* Entry i of the state list: its full name and tensor (borrowed; the name valid as long as m
 * is), and *is_buffer 1 for a buffer, 0 for a parameter. Any of the outputs may be NULL. */
CLPAR_API clpar_status clpar_module_state_at(const clpar_module *m, int i, const char **name,
                                             clpar_tensor **t, int *is_buffer);
/* Training mode (on != 0) or evaluation mode (on == 0) for m and every module in its tree
 * (PyTorch's train() / eval()). Modules are made in training mode. A forward reads its own
 * flag with clpar_module_is_training(self); layers such as BatchNorm use it. DataParallel's
 * replicas take the mode of the wrapped module's tree at each forward. */
CLPAR_API clpar_status clpar_module_train(clpar_module *m, int on);
/* clpar_module_train(m, 0): evaluation mode, PyTorch's eval(). */
CLPAR_API clpar_status clpar_module_eval(clpar_module *m);
CLPAR_API int clpar_module_is_training(const clpar_module *m);
/* Flat parameters: places m's parameters that live on one device one after another in one
 * buffer (per device), and their gradients in another buffer of the same layout. Each
 * parameter stays the same tensor (pointers held by an optimizer stay valid, values and
 * gradients are kept) but becomes a view of the flat buffer, so copying every parameter to
 * another device is one copy, and adding up gradients one add. Optimizers, zero_grad,
 * parameter_at and clpar_module_to work as before; clpar_module_to moves each flat buffer
 * whole, and refuses (CLPAR_ERROR_INVALID_ARGUMENT) to move a submodule whose parameters
 * share a flat buffer with parameters outside it. Flattening again re-packs only what changed
 * (a flat module stays as it is). DataParallel flattens the module it wraps; a gradient it
 * adds into the flat gradient counts as a gradient of every parameter of the buffer (one the
 * step did not use gets zeros, and an optimizer steps it). Module buffers are not flattened:
 * each stays a tensor of its own. On error nothing is changed. */
CLPAR_API clpar_status clpar_module_flatten(clpar_module *m);
/* Moves every parameter and buffer to dev, in place (a differentiable module stays trainable
 * there). A DataParallel wrapper, or a module containing one, is refused
 * (CLPAR_ERROR_INVALID_ARGUMENT): its devices were fixed when it was made. */
CLPAR_API clpar_status clpar_module_to(clpar_module *m, clpar_device *dev);
CLPAR_API clpar_status clpar_module_zero_grad(clpar_module *m);
/* Frees a module that no parent holds, dropping its references to its children and
 * parameters. A module that a parent holds is freed with its parent: freeing it by hand does
 * nothing but log a warning. */
CLPAR_API void clpar_module_free(clpar_module *m);

#ifdef __cplusplus
}
#endif
#endif
