/* test_dist_fault.c — a job whose ranks fall out of step, run through mpirun by
 * tests/dist_fault.sh, which checks what every rank printed and that the job ended within
 * its deadline. One scenario per run (the first argument):
 *   exit     rank 1 _exits after 2 DistributedDataParallel steps; the others go on training
 *            (mpirun ends the job, or with --enable-recovery the others time out);
 *   skip     rank 1 skips a clpar_dist_all_reduce_sum that the others make;
 *   debug    with CLPAR_DIST_DEBUG=1, rank 1 skips an all-reduce and calls a barrier: every
 *            rank fails naming both, and the ranks stay in step (a last all-reduce works);
 *   zero     as exit, with a ZeRO-2 module (clpar_ddp_options.zero_stage) and its optimizer:
 *            the others time out in the step's reduce-scatter;
 *   zero3    as zero with ZeRO-3: the others time out in the forward's all-gather;
 *   zero3bwd rank 1 _exits after the forward of its third ZeRO-3 step: the others time out in
 *            backward's collectives, which run on the communication thread (the prefetched
 *            all-gather of the parameters or the reduce-scatter of the gradients);
 *   badenv   CLPAR_DIST_TIMEOUT is not a number: clpar_dist_init must fail, naming it.
 * A rank that gets the error it should prints "RESULT rank R: <status>: <message>" and ends
 * the job with clpar_dist_abort; the script then finds those lines in mpirun's output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clpar/clpar.h"

enum { IN = 8, OUT = 2, ROWS = 4 };

static void die(const char *what, clpar_status s) {
  fprintf(stderr, "FAIL rank %d: %s: %s: %s\n", clpar_dist_rank(), what, clpar_status_name(s),
          clpar_last_error());
  fflush(stderr);
  _exit(2);
}

#define OK(call)                        \
  do {                                  \
    clpar_status s_ = (call);           \
    if (s_ != CLPAR_OK) die(#call, s_); \
  } while (0)

/* The error this rank expected: report it and end the job. */
static void got(clpar_status s) {
  printf("RESULT rank %d: %s: %s\n", clpar_dist_rank(), clpar_status_name(s), clpar_last_error());
  fflush(stdout);
  /* the other survivors reach their deadline within about a second: let them report too */
  struct timespec ts = {2, 0};
  nanosleep(&ts, NULL);
  clpar_dist_abort(3);
  _exit(4); /* only if MPI could not abort */
}

/* Not in any collective for up to 60 s (mpirun or the others end the job before). */
static void linger(void) {
  for (int i = 0; i < 600; i++) {
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "FAIL rank %d: nobody ended the job\n", clpar_dist_rank());
  _exit(5);
}

static void scenario_exit(void) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *lin, *ddp;
  OK(clpar_linear_create(IN, OUT, 1, dev, &lin));
  OK(clpar_ddp_create(lin, NULL, &ddp));
  float x[ROWS * IN];
  for (int i = 0; i < ROWS * IN; i++) x[i] = (float)(i % 7) - 3.0f;
  for (int step = 0; step < 5; step++) {
    if (step == 2 && clpar_dist_rank() == 1) {
      fprintf(stderr, "rank 1: exiting after 2 steps\n");
      fflush(stderr);
      _exit(0);
    }
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *xt, *out, *loss;
    OK(clpar_tensor_from_host(dev, 2, (int64_t[]){ROWS, IN}, x, &xt));
    clpar_status s = clpar_module_forward(ddp, xt, &out);
    if (s != CLPAR_OK) got(s);
    OK(clpar_mean(out, &loss));
    OK(clpar_backward(loss));
    clpar_scope_end(scope);
    s = clpar_ddp_synchronize(ddp);
    if (s != CLPAR_OK) got(s);
    printf("rank %d: step %d done\n", clpar_dist_rank(), step);
    fflush(stdout);
  }
  fprintf(stderr, "FAIL rank %d: all steps completed without rank 1\n", clpar_dist_rank());
  _exit(6);
}

/* stop: 0, rank 1 exits before the third step; 1, after the third step's forward. */
static void scenario_zero(int stage, int stop) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *lin, *ddp;
  clpar_zero_optimizer *opt;
  clpar_ddp_options o = {.zero_stage = stage};
  OK(clpar_linear_create(IN, OUT, 1, dev, &lin));
  OK(clpar_ddp_create(lin, &o, &ddp));
  OK(clpar_zero_adam_create(ddp, NULL, &opt));
  float x[ROWS * IN];
  for (int i = 0; i < ROWS * IN; i++) x[i] = (float)(i % 7) - 3.0f;
  for (int step = 0; step < 5; step++) {
    if (step == 2 && clpar_dist_rank() == 1 && !stop) {
      fprintf(stderr, "rank 1: exiting after 2 steps\n");
      fflush(stderr);
      _exit(0);
    }
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *xt, *out, *loss;
    OK(clpar_tensor_from_host(dev, 2, (int64_t[]){ROWS, IN}, x, &xt));
    clpar_status s = clpar_module_forward(ddp, xt, &out); /* stage 3 gathers here */
    if (s != CLPAR_OK) got(s);
    if (step == 2 && clpar_dist_rank() == 1) {
      fprintf(stderr, "rank 1: exiting after 2 steps and a forward\n");
      fflush(stderr);
      _exit(0);
    }
    OK(clpar_mean(out, &loss));
    s = clpar_backward(loss); /* stage 3 gathers and reduce-scatters on the thread */
    if (s != CLPAR_OK) got(s);
    clpar_scope_end(scope);
    s = clpar_zero_optimizer_step(opt);
    if (s != CLPAR_OK) got(s);
    printf("rank %d: step %d done\n", clpar_dist_rank(), step);
    fflush(stdout);
  }
  fprintf(stderr, "FAIL rank %d: all steps completed without rank 1\n", clpar_dist_rank());
  _exit(6);
}

static void scenario_skip(void) {
  float v = 1;
  OK(clpar_dist_all_reduce_sum(&v, 1)); /* collective #1: everybody */
  OK(clpar_dist_barrier());             /* #2 */
  if (clpar_dist_rank() == 1) linger(); /* skips #3 */
  clpar_status s = clpar_dist_all_reduce_sum(&v, 1);
  if (s == CLPAR_OK) {
    fprintf(stderr, "FAIL rank %d: the all-reduce completed without rank 1\n", clpar_dist_rank());
    _exit(6);
  }
  got(s);
}

static void scenario_debug(void) {
  float v = 1;
  OK(clpar_dist_all_reduce_sum(&v, 1)); /* #1 */
  clpar_status s = clpar_dist_rank() == 1 ? clpar_dist_barrier() : clpar_dist_all_reduce_sum(&v, 1);
  printf("RESULT rank %d: %s: %s\n", clpar_dist_rank(), clpar_status_name(s),
         s ? clpar_last_error() : "");
  fflush(stdout);
  v = 1;
  OK(clpar_dist_all_reduce_sum(&v, 1)); /* #3: still in step */
  if (v != (float)clpar_dist_world_size()) {
    fprintf(stderr, "FAIL rank %d: the last all-reduce gave %g\n", clpar_dist_rank(), v);
    _exit(6);
  }
  printf("rank %d: in step after the mismatch\n", clpar_dist_rank());
  fflush(stdout);
  clpar_dist_finalize();
  exit(0);
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "";
  clpar_status s = clpar_dist_init();
  if (!strcmp(which, "badenv")) {
    printf("RESULT init: %s: %s\n", clpar_status_name(s), s ? clpar_last_error() : "");
    if (s == CLPAR_OK) clpar_dist_finalize();
    return 0;
  }
  if (s != CLPAR_OK) die("clpar_dist_init", s);
  fprintf(stderr, "rank %d of %d, timeout %g s\n", clpar_dist_rank(), clpar_dist_world_size(),
          clpar_dist_timeout());
  if (!strcmp(which, "exit")) scenario_exit();
  if (!strcmp(which, "skip")) scenario_skip();
  if (!strcmp(which, "zero")) scenario_zero(2, 0);
  if (!strcmp(which, "zero3")) scenario_zero(3, 0);
  if (!strcmp(which, "zero3bwd")) scenario_zero(3, 1);
  if (!strcmp(which, "debug")) scenario_debug();
  fprintf(stderr, "usage: test_dist_fault exit|zero|zero3|zero3bwd|skip|debug|badenv\n");
  clpar_dist_finalize();
  return 2;
}
