/* test_graph_util.h — what the captured-step tests (test_graph*.c) share: the state a training
 * step reads and writes, its eager step's common part, a model's floats to compare, and the
 * bit-for-bit comparison of an eager run with a replayed one. */
#ifndef CLPAR_TEST_GRAPH_UTIL_H
#define CLPAR_TEST_GRAPH_UTIL_H

#include "test_util.h"

/* A test run's model, optimizer, static inputs (written before each step) and last loss. */
typedef struct {
  clpar_module *m;
  clpar_optimizer *opt;
  clpar_tensor *x, *y;
  clpar_tensor *loss; /* the last step's (the capture run's, once captured) */
} tgu_train;

/* Frees all of t's (any may be NULL). */
void tgu_train_free(tgu_train *t);

/* Mean squared error, mean over the elements, as a clpar_pipeline_loss_fn. */
clpar_status tgu_mse(clpar_tensor *out, clpar_tensor *target, int64_t first_row, void *user,
                     clpar_tensor **loss);

/* A step's start: t->loss freed and NULL, a scope begun for the step's temporaries. */
clpar_scope *tgu_step_begin(tgu_train *t);

/* zero_grad, forward, loss, backward; the loss into t->loss. */
clpar_status tgu_forward_backward(tgu_train *t, clpar_pipeline_loss_fn loss);

/* A step's end: t->loss kept out of the scope (read after the step), the scope ended. */
void tgu_step_end(tgu_train *t, clpar_scope *scope);

/* Every float32 parameter of m and, with buffers, every float32 buffer, concatenated
 * (malloc'ed), *n floats. */
float *tgu_floats_of(clpar_module *m, int buffers, size_t *n);

/* eager[0 .. n) and replayed[0 .. n) bit for bit; on a difference fails naming what and the
 * index: "<what> <i>: <replayed> replayed, <eager> eager". */
void tgu_expect_bits(const char *what, const float *eager, const float *replayed, size_t n);

/* steps steps of tu_mlp(dev, 7, 4, widths) (SGD, lr 0.05, momentum 0.9; inputs [batch,
 * widths[0]] and targets [batch, widths[3]] from seeds 100 + i and 200 + i), each through step
 * (which gets the tgu_train) eagerly, or through clpar_step_compile/run when compiled; the
 * losses into losses[0 .. steps), the parameters returned (tgu_floats_of, *n floats). */
float *tgu_mlp_run(clpar_device *dev, const int64_t widths[4], int64_t batch, int steps,
                   clpar_step_fn step, int compiled, float *losses, size_t *n);

/* A cmocka test of fn under name, its prestate a compound literal of type. */
/* clang-format off */
#define TGU_CASE(name, fn, type, ...) {#name, fn, NULL, NULL, &(type){__VA_ARGS__}}
/* clang-format on */

#endif
