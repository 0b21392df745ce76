/* test_ddp_graph_util.h — what the MPI captured-step tests (test_ddp_graph*.c,
 * test_zero*_graph.c) share: each rank's inputs, the DDP and ZeRO steps and their training
 * loops, the check that every rank holds the same floats, a forward refused at capture, and
 * the "timeout" scenario in which one rank stops replaying. */
#ifndef CLPAR_TEST_DDP_GRAPH_UTIL_H
#define CLPAR_TEST_DDP_GRAPH_UTIL_H

#include "clpar/zero.h"
#include "test_graph_util.h"

typedef enum { TDG_SGD, TDG_ADAM } tdg_opt;

/* Step i's inputs on this rank (each rank its own): x = tu_rand(numel, seed) and
 * y = tu_rand(numel, seed + 500), seed = 1000 * (rank + 1) + i; with spread, each x element
 * times rank + 1, plus 0.5 (so the ranks' batch statistics differ). */
void tdg_write_inputs(clpar_tensor *x, clpar_tensor *y, int i, int spread);

/* v[0 .. n) the same on every rank: the maximum over the ranks of v and of -v is v; else fails
 * "<what> <i> differs across the ranks". */
void tdg_expect_same_on_every_rank(const char *what, const float *v, size_t n);

/* A DDP step of a tgu_train: zero_grad, forward, MSE, backward, the optimizer's step. */
clpar_status tdg_step(void *ctx);

/* Gradient accumulation: two forward-backwards on the batch, the first without the
 * all-reduce (clpar_ddp_set_sync(0)), the second with it, then the step. */
clpar_status tdg_accumulating_step(void *ctx);

/* What the replays of tdg_ddp_train did (from its third step on). */
typedef struct {
  uint64_t waits;      /* host waits on the calling thread (the loss reads apart) */
  uint64_t reductions; /* buckets all-reduced */
  int backward_waited; /* the DDP's wait time grew */
} tdg_replays;

/* A DDP test's run: its steps, the step at which the learning rate is multiplied by 0.3, and
 * tdg_write_inputs' spread. */
typedef struct {
  int steps, lr_change, spread;
} tdg_ddp_run;

/* run's steps of fn on t, eagerly or compiled (eager warm-up, capture, replays), each after
 * its inputs (tdg_write_inputs); the losses into losses. Compiled: the step has a graph, the
 * DDP at least 3 buckets, and what the replays did into r. */
void tdg_ddp_train(tgu_train *t, clpar_step_fn fn, const tdg_ddp_run *run, int compiled,
                   float *losses, tdg_replays *r);

/* Once no replay is in flight on the rank's device (each one's end call ran), an eager fn(ctx)
 * waits for none: the device's count of replay drains does not move (capture_host.c). */
void tdg_expect_eager_without_drain(clpar_step_fn fn, void *ctx);

/* Ends the capture begun before a call that returned s: the call and the capture's end
 * refused with CLPAR_ERROR_INVALID_ARGUMENT, no graph, the message holding want and (unless
 * NULL) want2. */
void tdg_expect_refused(clpar_status s, const char *want, const char *want2);

/* Trains eager (eagerly) and replayed (compiled) by tdg_ddp_train: the same losses bit for
 * bit and the same parameters (with buffers, and the float buffers) bit for bit, a difference
 * named "<what> <i>"; it trained. What the replays did into r. */
void tdg_ddp_expect_equal_runs(tgu_train *eager, tgu_train *replayed, clpar_step_fn fn,
                               const tdg_ddp_run *run, int buffers, const char *what,
                               tdg_replays *r);

/* A forward of ddp (freed here) on a zero [rows, in] input under capture: refused with
 * CLPAR_ERROR_INVALID_ARGUMENT, the message naming DistributedDataParallel's forward and want. */
void tdg_expect_forward_refused(clpar_module *ddp, int64_t rows, int64_t in, const char *want);

/* ---- ZeRO ---- */

/* A ZeRO test run's model, optimizer, static inputs and last loss. */
typedef struct {
  clpar_module *m;
  clpar_zero_optimizer *opt;
  clpar_tensor *x, *y, *loss;
  int stage;
  int zero_grad_late; /* the step calls zero_grad between backward and the optimizer's step */
} tdg_zero_train;

/* The BatchNorm tests' model (seed 7), a Sequential not yet wrapped: conv 3x3 from TDG_BN_C to
 * TDG_BN_FEAT channels, BatchNorm2d, ReLU, a ResNet BasicBlock (two more BatchNorm2d), flatten,
 * linear to TDG_BN_OUT, on [rows, TDG_BN_C, TDG_BN_HW, TDG_BN_HW] inputs. */
enum { TDG_BN_C = 3, TDG_BN_HW = 5, TDG_BN_OUT = 4, TDG_BN_FEAT = 4 };
clpar_module *tdg_bn_net(void);

/* The num_batches_tracked of tdg_bn_net's three BatchNorm2d in eager and in replayed: each
 * module has three, all equal (every one runs in each forward) and equal to the other
 * module's; returns that count. */
int64_t tdg_bn_counters_alike(clpar_module *eager, clpar_module *replayed);

/* A ZeRO test's model: made under DDP with a stage, its inputs' shape, its steps. */
typedef struct {
  clpar_module *(*make_ddp)(int stage);
  int64_t rows, in, out;
  int steps, lr_change;
  size_t numel; /* its parameters */
} tdg_zero_model;

/* steps of tdg_zero_step on t, eagerly or compiled (eager warm-up, capture, replays), each
 * after its inputs (tdg_write_inputs with spread), the learning rate times 0.3 at lr_change;
 * the losses into losses. */
void tdg_zero_train_run(tdg_zero_train *t, int steps, int lr_change, int spread, int compiled,
                        float *losses);

/* t: md's model at stage with a ZeRO SGD (lr 0.05, momentum 0.9) or Adam (lr 0.01) and zero
 * inputs. */
void tdg_zero_make(tdg_zero_train *t, const tdg_zero_model *md, int stage, tdg_opt ok);

/* Frees all of t's (any may be NULL). */
void tdg_zero_free(tdg_zero_train *t);

/* A ZeRO step: zero_grad (after backward with zero_grad_late), forward, MSE, backward, step. */
clpar_status tdg_zero_step(void *ctx);

/* The module's parameters (stage 3: gathered, then released again), *n floats, malloc'ed. */
float *tdg_zero_params(tdg_zero_train *t, size_t *n);

/* A ZeRO test case (its cmocka prestate): the model, its stage, the optimizer. */
typedef struct {
  const tdg_zero_model *md;
  int stage;
  tdg_opt opt;
} tdg_zero_case;

/* A cmocka test: tdg_zero_check_replay_equals_eager of the tdg_zero_case in *state. */
void tdg_zero_test_replay_equals_eager(void **state);

/* md's steps compiled (an eager warm-up, the capture, replays, the inner optimizer's learning
 * rate times 0.3 at lr_change) against the same steps eagerly on a second copy: losses and
 * parameters bit for bit, md->numel parameters, it trained, every rank the same parameters. */
void tdg_zero_check_replay_equals_eager(const tdg_zero_model *md, int stage, tdg_opt ok);

/* An eager step right after replays were posted (nothing waited for) equals an eager step
 * there (parameters), one more with no replay in flight waits for none
 * (tdg_expect_eager_without_drain) and equals it too, and freeing the ZeRO optimizer makes the
 * graph stale with a message holding stale_want. The two runs' losses of the step right after
 * the replays into *le (eager) and *lm (mixed). */
void tdg_zero_eager_after_replays_then_stale(const tdg_zero_model *md, int stage,
                                             const char *stale_want, float *le, float *lm);

/* ---- the timeout scenario ---- */

/* clpar_dist_init, or the rank fails the scenario. */
void tdg_timeout_init(void);

/* The scenario: fn (on ctx, its loss in *loss) compiled and run 4 times on every rank
 * (warm-up, capture, two replays); then rank stopper stops (in no collective until the job
 * ends) and every other rank replays once more and prints "RESULT rank R: STATUS: message";
 * the lowest of them ends the job once the others printed. */
int tdg_timeout_run(clpar_step_fn fn, void *ctx, clpar_tensor *const *loss, int stopper);

#endif
