/* optim.h — optimizers with PyTorch's update rules: SGD (momentum, dampening, nesterov,
 * weight decay), Adam and AdamW. A step enqueues one fused kernel per parameter on the
 * parameter's device and does not wait; when the optimizer holds every parameter of a flat
 * buffer (clpar_module_flatten, DataParallel), one kernel over the whole buffer, with the same
 * result. An optimizer stays valid when its parameters move (clpar_module_to,
 * clpar_data_parallel_create): its state moves with them at the next step. Parameters may be
 * split into groups with options of their own (torch.optim's param_groups); a flat buffer whose
 * members are in different groups is stepped one parameter at a time. Also here: clip_grad_norm
 * and the learning-rate schedules. */
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

/* Parameter groups (torch.optim's param_groups): each group's parameters are stepped with
 * that group's options, each field resolved as above (for AdamW a weight_decay left 0 means
 * 1e-2: write CLPAR_ZERO for a group without decay). A group may be empty (n 0) as long as
 * the groups hold one parameter in all; a tensor in two groups is refused. Groups are numbered
 * from 0 in the order given. */
typedef struct clpar_sgd_group {
  clpar_tensor *const *params;
  int n;
  clpar_sgd_options options;
} clpar_sgd_group;
typedef struct clpar_adam_group {
  clpar_tensor *const *params;
  int n;
  clpar_adam_options options;
} clpar_adam_group;
CLPAR_API clpar_status clpar_sgd_create_groups(const clpar_sgd_group *groups, int n_groups,
                                               clpar_optimizer **out);
CLPAR_API clpar_status clpar_adam_create_groups(const clpar_adam_group *groups, int n_groups,
                                                clpar_optimizer **out);
CLPAR_API clpar_status clpar_adamw_create_groups(const clpar_adam_group *groups, int n_groups,
                                                 clpar_optimizer **out);
/* nanoGPT's configure_optimizers: two groups over the module's parameters, in module order
 * within each: group 0 the parameters of 2 or more dimensions (Linear and Embedding weights,
 * convolution kernels) with options as given, group 1 the others (biases, norm weights) with
 * weight_decay 0. Either group may be empty. */
CLPAR_API clpar_status clpar_sgd_create_decay_groups(clpar_module *m,
                                                     const clpar_sgd_options *options,
                                                     clpar_optimizer **out);
CLPAR_API clpar_status clpar_adam_create_decay_groups(clpar_module *m,
                                                      const clpar_adam_options *options,
                                                      clpar_optimizer **out);
CLPAR_API clpar_status clpar_adamw_create_decay_groups(clpar_module *m,
                                                       const clpar_adam_options *options,
                                                       clpar_optimizer **out);
/* The number of groups (1 for the create functions above), and the parameters in one. */
CLPAR_API int clpar_optimizer_group_count(const clpar_optimizer *opt);
CLPAR_API int clpar_optimizer_group_size(const clpar_optimizer *opt, int group);
/* A group's learning rate (NaN for a group out of range), and setting it: group -1 sets every
 * group's. lr is literal (0 is 0) and must be finite and >= 0. Takes effect at the next step:
 * the rate is an argument of the step's kernels, so changing it never waits for a device. */
CLPAR_API float clpar_optimizer_lr(const clpar_optimizer *opt, int group);
CLPAR_API clpar_status clpar_optimizer_set_lr(clpar_optimizer *opt, int group, float lr);

/* One update of every parameter that has a gradient. Gradients accumulate: each backward adds
 * into .grad until zero_grad clears it, so gradient accumulation over k micro-steps is
 * zero_grad, then k times (forward, loss scaled by 1/k with clpar_scale, backward), then
 * (clip and) step: the same update as one batch k times as large, with a mean loss. */
CLPAR_API clpar_status clpar_optimizer_step(clpar_optimizer *opt);
CLPAR_API clpar_status clpar_optimizer_zero_grad(clpar_optimizer *opt);
CLPAR_API void clpar_optimizer_free(clpar_optimizer *opt);

/* ---- gradient clipping (torch.nn.utils.clip_grad_norm_, norm_type 2) ----
 * total_norm = the 2-norm of all the gradients together (the parameters without a gradient
 * are skipped), then every gradient is multiplied in place by
 *   clip_coef = min(max_norm / (total_norm + 1e-6), 1)
 * as PyTorch does (always multiplied, so nothing depends on the norm's value on the host).
 * Everything runs on the devices: the norm is reduced on the device of the first parameter with
 * a gradient (the other devices' partial sums are copied there) and the coefficient is copied
 * back to them, so the call does not wait. *total_norm (may be NULL) is a new [1] tensor on
 * that device holding the norm (0 when no parameter has a gradient): reading it is the
 * caller's choice (and waits). A flat group whose members all have gradients is reduced and
 * scaled in one piece. max_norm must be >= 0 (NaN is refused). Under DataParallel, give the
 * wrapper (or the wrapped module): its parameters' gradients are the reduced ones, after
 * backward. */
CLPAR_API clpar_status clpar_clip_grad_norm(clpar_tensor *const *params, int n, float max_norm,
                                            clpar_tensor **total_norm);
/* The same over the module's parameters. */
CLPAR_API clpar_status clpar_clip_grad_norm_module(clpar_module *m, float max_norm,
                                                   clpar_tensor **total_norm);

/* ---- learning-rate schedules (torch.optim.lr_scheduler) ----
 * A scheduler sets its optimizer's learning rate in every group: at creation the rate for
 * epoch 0, then, at each clpar_lr_scheduler_step (call it after clpar_optimizer_step, as in
 * PyTorch), the rate for the next epoch. Each group's base rate is its rate when the scheduler
 * was made (PyTorch's initial_lr). The rates are PyTorch's closed forms, computed in double:
 *   StepLR:            base * gamma^floor(epoch / step_size)
 *   LinearLR:          base * (start + (end - start) * min(epoch, total_iters) / total_iters)
 *   CosineAnnealingLR: eta_min + (base - eta_min) * (1 + cos(pi * epoch / t_max)) / 2
 *   warm-up cosine (nanoGPT's get_lr, with base its learning_rate):
 *     epoch < warmup:      base * (epoch + 1) / (warmup + 1)
 *     epoch > decay_iters: min_lr
 *     else: min_lr + (base - min_lr) * (1 + cos(pi * (epoch - warmup) / (decay_iters - warmup))) /
 * 2 The optimizer must outlive the scheduler. A float argument left 0 takes PyTorch's default
 * (status.h's convention; CLPAR_ZERO for a literal 0): gamma 0.1, start_factor 1/3,
 * end_factor 1; eta_min and min_lr default to 0. */
typedef struct clpar_lr_scheduler clpar_lr_scheduler;
CLPAR_API clpar_status clpar_step_lr_create(clpar_optimizer *opt, int64_t step_size, float gamma,
                                            clpar_lr_scheduler **out);
CLPAR_API clpar_status clpar_linear_lr_create(clpar_optimizer *opt, float start_factor,
                                              float end_factor, int64_t total_iters,
                                              clpar_lr_scheduler **out);
CLPAR_API clpar_status clpar_cosine_lr_create(clpar_optimizer *opt, int64_t t_max, float eta_min,
                                              clpar_lr_scheduler **out);
CLPAR_API clpar_status clpar_warmup_cosine_lr_create(clpar_optimizer *opt, int64_t warmup_iters,
                                                     int64_t decay_iters, float min_lr,
                                                     clpar_lr_scheduler **out);
/* Moves to the next epoch and sets the optimizer's rates. */
CLPAR_API clpar_status clpar_lr_scheduler_step(clpar_lr_scheduler *s);
/* Jumps to epoch (>= 0) and sets the rates, for a resumed run. */
CLPAR_API clpar_status clpar_lr_scheduler_set_epoch(clpar_lr_scheduler *s, int64_t epoch);
CLPAR_API int64_t clpar_lr_scheduler_epoch(const clpar_lr_scheduler *s);
/* The rate the scheduler last set in group (get_last_lr()[group]); NaN out of range. */
CLPAR_API float clpar_lr_scheduler_lr(const clpar_lr_scheduler *s, int group);
CLPAR_API void clpar_lr_scheduler_free(clpar_lr_scheduler *s);

#ifdef __cplusplus
}
#endif
#endif
