/* test_dist_hostile.c — what the distributed layer takes from other ranks and from its own
 * state, run by ctest through mpirun on 2 ranks (tests/CMakeLists.txt, label mpi). A peer's
 * misbehaviour is made with MPI's profiling interface: this file defines MPI_Ibcast,
 * MPI_Iallreduce, MPI_Improbe and MPI_Test, which the library (linked statically) calls
 * instead of MPI's; each passes the call on to PMPI_* and, while a hook is set, first damages
 * what one rank sends, as a rank running other code (or other memory) would:
 *   - rank 0 broadcasts a parameter-list size of 0 or of 2^64 - 1 bytes: every rank refuses
 *     it before allocating anything;
 *   - rank 1 sends a NCCL-or-MPI code that clpar never makes (negative): every rank refuses;
 *   - a "where are you?" question is always waiting while rank 0 waits in a barrier, as
 *     from a rank that keeps asking: rank 0 still polls its own collective between rounds of
 *     answers (it answered without end, never reaching its deadline check, before);
 * and, last, as they end the job: a DistributedDataParallel forward after clpar_dist_finalize
 * (the library still initialized) and clpar_dist_init after it, each an error, not a call
 * into a finalized MPI (which aborted every rank). */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { IN = 4, OUT = 3, TAG_ASK = 1 /* src/dist/dist.c's tag of "where are you?" */ };

static enum { HOOK_NONE, HOOK_LIST_SIZE, HOOK_BACKEND_CODE, HOOK_ASKING } hook;
static unsigned long long hook_size; /* HOOK_LIST_SIZE: what rank 0 broadcasts */
static int hook_code;                /* HOOK_BACKEND_CODE: what rank 1 sends */
/* HOOK_ASKING: questions answered since the last poll of the collective, the most of them,
 * the polls so far, and whether rank 1 was told to join the barrier */
static int streak, longest, polls, told;
enum { STREAK_CAP = 1000, POLLS_BEFORE_JOIN = 20, TAG_JOIN = 77 };

int MPI_Ibcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request *req) {
  if (hook == HOOK_LIST_SIZE && count == 1 && type == MPI_UNSIGNED_LONG_LONG) {
    if (clpar_dist_rank() == root) *(unsigned long long *)buf = hook_size;
    hook = HOOK_NONE;
  }
  return PMPI_Ibcast(buf, count, type, root, comm, req);
}

int MPI_Iallreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                   MPI_Comm comm, MPI_Request *req) {
  if (hook == HOOK_BACKEND_CODE && type == MPI_INT && op == MPI_SUM &&
      count == clpar_dist_world_size()) {
    if (clpar_dist_rank() == 1) ((int *)recv)[1] = hook_code; /* in place: its own slot */
    hook = HOOK_NONE;
  }
  return PMPI_Iallreduce(send, recv, count, type, op, comm, req);
}

/* Before each look for a question, one more arrives (from this rank itself): the queue of
 * questions is never empty. Capped, so that the old unbounded loop ends too. */
int MPI_Improbe(int source, int tag, MPI_Comm comm, int *flag, MPI_Message *msg, MPI_Status *st) {
  if (hook == HOOK_ASKING && tag == TAG_ASK && streak < STREAK_CAP) {
    static const int question = 0;
    int me;
    MPI_Request r;
    PMPI_Comm_rank(comm, &me);
    if (PMPI_Isend(&question, 1, MPI_INT, me, TAG_ASK, comm, &r) == MPI_SUCCESS)
      PMPI_Request_free(&r);
    if (++streak > longest) longest = streak;
  }
  return PMPI_Improbe(source, tag, comm, flag, msg, st);
}

/* A poll of the collective: after a few, rank 1 is told to join the barrier. */
int MPI_Test(MPI_Request *req, int *flag, MPI_Status *st) {
  if (hook == HOOK_ASKING) {
    streak = 0;
    if (++polls >= POLLS_BEFORE_JOIN && !told) {
      static const int join = 1;
      told = PMPI_Send(&join, 1, MPI_INT, 1, TAG_JOIN, MPI_COMM_WORLD) == MPI_SUCCESS;
    }
  }
  return PMPI_Test(req, flag, st);
}

static clpar_status make_ddp(const clpar_ddp_options *o, clpar_module **ddp) {
  clpar_module *lin;
  clpar_manual_seed(5);
  tu_ok(clpar_linear_create(IN, OUT, 1, clpar_dist_device(), &lin));
  *ddp = NULL;
  return clpar_ddp_create(lin, o, ddp);
}

static void expect_error(clpar_status got, clpar_status want, const char *text) {
  if (got != want || !strstr(clpar_last_error(), text))
    fail_msg("rank %d: expected %s with \"%s\", got %s: %s", clpar_dist_rank(),
             clpar_status_name(want), text, clpar_status_name(got), clpar_last_error());
}

/* Every rank is still in step: a collective after the refusal works. */
static void expect_in_step(void) {
  float one = 1;
  tu_ok(clpar_dist_all_reduce_sum(&one, 1));
  assert_true(one == (float)clpar_dist_world_size());
}

static void test_list_size_zero_refused(void **state) {
  (void)state;
  clpar_module *ddp;
  hook_size = 0;
  hook = HOOK_LIST_SIZE;
  clpar_status s = make_ddp(NULL, &ddp);
  hook = HOOK_NONE;
  expect_error(s, CLPAR_ERROR_CORRUPT, "rank 0's parameter list is 0 bytes long");
  assert_null(ddp);
  expect_in_step();
}

static void test_list_size_huge_refused(void **state) {
  (void)state;
  clpar_module *ddp;
  hook_size = ULLONG_MAX;
  hook = HOOK_LIST_SIZE;
  clpar_status s = make_ddp(NULL, &ddp);
  hook = HOOK_NONE;
  expect_error(s, CLPAR_ERROR_TOO_LARGE,
               "rank 0's parameter list is 18446744073709551615 bytes long");
  assert_null(ddp);
  expect_in_step();
}

static void test_unknown_backend_code_refused(void **state) {
  (void)state;
  clpar_module *ddp;
  hook_code = -4; /* reason -1: before the table of reasons */
  hook = HOOK_BACKEND_CODE;
  clpar_status s = make_ddp(NULL, &ddp);
  hook = HOOK_NONE;
  expect_error(s, CLPAR_ERROR_CORRUPT, "rank 1 sent code -4, which is no code clpar makes");
  assert_null(ddp);
  expect_in_step();
}

static void test_questions_do_not_starve_the_wait(void **state) {
  (void)state;
  if (clpar_dist_rank() == 1) { /* joins when rank 0 has polled a while under questions */
    int join;
    assert_int_equal(PMPI_Recv(&join, 1, MPI_INT, 0, TAG_JOIN, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                     MPI_SUCCESS);
  }
  if (clpar_dist_rank() == 0) hook = HOOK_ASKING;
  clpar_status s = clpar_dist_barrier();
  hook = HOOK_NONE;
  tu_ok(s);
  expect_in_step();
  if (clpar_dist_rank() == 0) {
    print_message("rank 0: %d polls, at most %d questions answered between two\n", polls, longest);
    if (longest > clpar_dist_world_size())
      fail_msg("rank 0 answered %d questions in a row without polling its collective", longest);
  }
}

/* The library stays initialized (a clpar_init of the test's own) while the job ends. */
static void test_forward_after_finalize_refused(void **state) {
  (void)state;
  clpar_module *kept_ddp;
  tu_ok(clpar_init());
  clpar_ddp_options o = {.uneven_inputs = 1};
  tu_ok(make_ddp(&o, &kept_ddp));
  clpar_device *dev = clpar_dist_device();
  clpar_dist_finalize();
  clpar_tensor *x, *y = NULL;
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){2, IN}, &x));
  expect_error(clpar_module_forward(kept_ddp, x, &y), CLPAR_ERROR_NOT_INITIALIZED,
               "clpar_dist_finalize has ended the job");
  assert_null(y);
  clpar_tensor_free(x);
  clpar_module_free(kept_ddp);
}

static void test_init_after_finalize_refused(void **state) {
  (void)state;
  int finalized = 0;
  MPI_Finalized(&finalized);
  assert_true(finalized); /* by the last clpar_dist_finalize, in the test before */
  expect_error(clpar_dist_init(), CLPAR_ERROR_NOT_INITIALIZED, "cannot start again");
  assert_int_equal(clpar_dist_rank(), -1);
  clpar_shutdown(); /* the test before's clpar_init */
}

static int setup(void **state) {
  if (tu_dist_setup(state) != 0) return -1;
  if (clpar_dist_world_size() != 2) {
    fprintf(stderr, "test_dist_hostile runs on 2 ranks (mpirun -np 2)\n");
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  clpar_dist_finalize(); /* nothing left to do after the last test's finalize */
  return 0;
}

/* An argument runs only the tests that match it (cmocka_set_test_filter's pattern). */
int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_list_size_zero_refused),
      cmocka_unit_test(test_list_size_huge_refused),
      cmocka_unit_test(test_unknown_backend_code_refused),
      cmocka_unit_test(test_questions_do_not_starve_the_wait),
      /* these two end the job: last, in this order */
      cmocka_unit_test(test_forward_after_finalize_refused),
      cmocka_unit_test(test_init_after_finalize_refused),
  };
  return cmocka_run_group_tests_name("dist_hostile", tests, setup, teardown);
}
