/* amp.h — dynamic loss scaling for mixed-precision training, with the rules of PyTorch's
 * torch.cuda.amp.GradScaler:
 *
 *   clpar_grad_scaler_scale(s, loss, &scaled);  clpar_backward(scaled);
 *   clpar_grad_scaler_unscale(s, opt);          (optional: clip the real gradients here)
 *   clpar_grad_scaler_step(s, opt, &skipped);   (unscales if not done, steps unless inf/NaN)
 *   clpar_grad_scaler_update(s);                (backoff or growth of the scale)
 *
 * The loss is multiplied by the scale, so its gradients are too; unscaling multiplies every
 * gradient of the optimizer's parameters by (float)(1 / (double)scale) in place and checks it
 * for inf and NaN on its device (one small reduction per gradient or per flat group, then one
 * float per device read back: a step waits for the gradients, as PyTorch's does). A step
 * whose gradients hold an inf or a NaN is skipped: parameters and optimizer state untouched.
 * update() then multiplies the scale by backoff_factor and resets the count of clean steps;
 * after growth_interval clean steps in a row it multiplies the scale by growth_factor (each
 * product taken in double and rounded to float, as PyTorch's kernel does; a growth that would
 * reach inf is not made). Several optimizers may share a scaler: update() backs off when any
 * of them found an inf or a NaN since the last update.
 *
 * In an MPI job of two or more ranks (clpar_dist_init), the finding is agreed across ranks
 * (one all-reduce of one float, MAX) in the unscale, so every rank skips the same steps and
 * keeps the same scale; every rank must then unscale (or step) in the same order. Under
 * DataParallel give the optimizer of the wrapper: its gradients are the reduced ones. */
#ifndef CLPAR_AMP_H
#define CLPAR_AMP_H

#include <stdint.h>

#include "export.h"
#include "nn.h"
#include "optim.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clpar_grad_scaler clpar_grad_scaler;

/* GradScaler's arguments. A field left 0 takes PyTorch's default (status.h's convention):
 *   init_scale 0 means 65536 (2^16), growth_factor 0 means 2, backoff_factor 0 means 0.5,
 *   growth_interval 0 means 2000; disabled 0 is PyTorch's enabled=True.
 * growth_factor must be > 1, backoff_factor in (0, 1), init_scale finite and > 0,
 * growth_interval >= 1. A disabled scaler changes nothing: scale gives the loss times 1, step
 * is the optimizer's step, the other calls do nothing and the scale reads 1. */
typedef struct clpar_grad_scaler_options {
  double init_scale;
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int disabled;
} clpar_grad_scaler_options;

/* options NULL means every default. A value out of range is CLPAR_ERROR_INVALID_ARGUMENT
 * naming the field. */
CLPAR_API clpar_status clpar_grad_scaler_create(const clpar_grad_scaler_options *options,
                                                clpar_grad_scaler **out);
CLPAR_API void clpar_grad_scaler_free(clpar_grad_scaler *s);

/* *scaled = loss * scale, a new tensor that backward goes through (clpar_scale). */
CLPAR_API clpar_status clpar_grad_scaler_scale(clpar_grad_scaler *s, const clpar_tensor *loss,
                                               clpar_tensor **scaled);
/* Unscales and checks opt's gradients (above). Once per optimizer between updates, and
 * before its step: a second call, or one after the step, is CLPAR_ERROR_INVALID_ARGUMENT, as
 * PyTorch's RuntimeError. A gradient that is not float32 is CLPAR_ERROR_DTYPE. */
CLPAR_API clpar_status clpar_grad_scaler_unscale(clpar_grad_scaler *s, clpar_optimizer *opt);
/* Unscales when not done, then clpar_optimizer_step unless an inf or a NaN was found;
 * *skipped (may be NULL) is 1 when the step was skipped, else 0. Once per optimizer between
 * updates. */
CLPAR_API clpar_status clpar_grad_scaler_step(clpar_grad_scaler *s, clpar_optimizer *opt,
                                              int *skipped);
/* Backoff or growth from what the unscales since the last update found; at least one must
 * have been made (else CLPAR_ERROR_INVALID_ARGUMENT). Starts the next iteration. */
CLPAR_API clpar_status clpar_grad_scaler_update(clpar_grad_scaler *s);

/* The scale (1 for a disabled scaler), and setting it (PyTorch's update(new_scale), which
 * leaves the count of clean steps as it is); scale must be finite and > 0. */
CLPAR_API float clpar_grad_scaler_get_scale(const clpar_grad_scaler *s);
CLPAR_API clpar_status clpar_grad_scaler_set_scale(clpar_grad_scaler *s, float scale);
CLPAR_API int clpar_grad_scaler_is_enabled(const clpar_grad_scaler *s);

/* GradScaler's state_dict(): the same five entries, under PyTorch's names. */
typedef struct clpar_grad_scaler_state {
  float scale;
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int64_t growth_tracker; /* _growth_tracker: clean steps in a row since the last change */
} clpar_grad_scaler_state;
/* A disabled scaler has no state (PyTorch's empty dict): CLPAR_ERROR_INVALID_ARGUMENT. */
CLPAR_API clpar_status clpar_grad_scaler_state_get(const clpar_grad_scaler *s,
                                                   clpar_grad_scaler_state *out);
/* load_state_dict(): checked as the options are (growth_tracker in [0, growth_interval));
 * does nothing for a disabled scaler, as PyTorch's. */
CLPAR_API clpar_status clpar_grad_scaler_state_set(clpar_grad_scaler *s,
                                                   const clpar_grad_scaler_state *state);

/* clpar_checkpoint_save / clpar_checkpoint_load (checkpoint.h) with the scaler's state in
 * the file's metadata as "scaler.scale", "scaler.growth_factor", "scaler.backoff_factor",
 * "scaler.growth_interval" and "scaler._growth_tracker" (decimal text; floats with enough
 * digits to read back exactly). s may be NULL (a plain checkpoint); a disabled scaler writes
 * no entries and loads none. The load is all or nothing: a file without the scaler's entries,
 * or with one malformed or out of range, is an error (CLPAR_ERROR_INVALID_ARGUMENT or
 * CLPAR_ERROR_CORRUPT naming the entry) and nothing is loaded. */
CLPAR_API clpar_status clpar_checkpoint_save_scaler(const char *path, const clpar_module *m,
                                                    const clpar_optimizer *opt,
                                                    const clpar_grad_scaler *s, int64_t step,
                                                    int64_t epoch);
CLPAR_API clpar_status clpar_checkpoint_load_scaler(const char *path, clpar_module *m,
                                                    clpar_optimizer *opt, clpar_grad_scaler *s,
                                                    int64_t *step, int64_t *epoch);

#ifdef __cplusplus
}
#endif
#endif
