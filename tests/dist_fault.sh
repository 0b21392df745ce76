#!/bin/sh
# dist_fault.sh — runs tests/test_dist_fault.c's scenarios through mpirun and checks what the
# job printed (ctest: test_dist_fault_<scenario>, label mpi). Each survivor prints
# "RESULT rank R: <status>: <message>"; CLPAR_DIST_TIMEOUT is 3 s, so a run takes seconds,
# and `timeout` makes a hang a failure rather than a stuck ctest.
# Usage: dist_fault.sh exit|zero|zero3|zero3bwd|skip|debug|badenv TEST_BINARY MPIEXEC [MPIEXEC FLAGS...]
scenario=$1 bin=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
export CLPAR_DIST_TIMEOUT=3

fail() {
  echo "FAILED ($scenario): $*"
  echo "---- job output ----"
  cat "$out"
  exit 1
}

# has PATTERN: the job printed a line matching the (grep -E) pattern
has() { grep -Eq -- "$1" "$out"; }

run() { # run NP [mpirun flags]: the job, at most 60 s
  np=$1
  shift
  timeout 60 "$@" -np "$np" "$bin" "$scenario" >"$out" 2>&1
  rc=$?
  [ $rc -ne 124 ] || fail "the job hung (killed after 60 s)"
  echo "mpirun $* exited with $rc"
  has '^FAIL' && fail "a rank failed"
  return 0
}

case $scenario in
exit)
  # Open MPI's default: mpirun itself tears the job down when a rank ends without
  # MPI_Finalize, so the survivors never reach the deadline.
  run 3 "$@"
  [ $rc -ne 0 ] || fail "mpirun exited 0 although rank 1 died"
  has 'rank 1: exiting after 2 steps' || fail "rank 1 did not exit as planned"
  has 'exiting improperly' || fail "mpirun did not report rank 1's improper exit"
  has 'step [234] done' && fail "a rank trained past the step rank 1 left"
  # With --enable-recovery the job survives the death: every other rank must time out in
  # the bucket's all-reduce naming rank 1.
  run 3 "$@" --enable-recovery
  for r in 0 2; do
    has "^RESULT rank $r: CLPAR_ERROR_TIMEOUT: .*all-reduce of bucket 0 .*collective #[0-9]+, did not complete within 3 s.*not arrived.*: rank 1[;.]" ||
      fail "rank $r did not time out naming the bucket and rank 1"
  done
  ;;
zero)
  # a ZeRO-2 step: the survivors time out in the gradients' reduce-scatter, naming rank 1
  run 3 "$@" --enable-recovery
  has 'rank 1: exiting after 2 steps' || fail "rank 1 did not exit as planned"
  has 'step [234] done' && fail "a rank trained past the step rank 1 left"
  for r in 0 2; do
    has "^RESULT rank $r: CLPAR_ERROR_TIMEOUT: .*reduce-scatter of the gradients.*collective #[0-9]+, did not complete within 3 s.*not arrived.*: rank 1[;.]" ||
      fail "rank $r did not time out naming the reduce-scatter and rank 1"
  done
  ;;
zero3)
  # a ZeRO-3 forward: the survivors time out in the unit's all-gather, naming rank 1
  run 3 "$@" --enable-recovery
  has 'rank 1: exiting after 2 steps' || fail "rank 1 did not exit as planned"
  has 'step [234] done' && fail "a rank trained past the step rank 1 left"
  for r in 0 2; do
    has "^RESULT rank $r: CLPAR_ERROR_TIMEOUT: .*FSDPUnit forward: all-gather of the parameters.*collective #[0-9]+, did not complete within 3 s.*not arrived.*: rank 1[;.]" ||
      fail "rank $r did not time out naming the all-gather and rank 1"
  done
  ;;
zero3bwd)
  # rank 1 leaves after a ZeRO-3 forward: the survivors time out in backward's all-gather or
  # reduce-scatter (on the communication thread; whichever rank 1 did not reach), naming rank 1
  run 3 "$@" --enable-recovery
  has 'rank 1: exiting after 2 steps and a forward' || fail "rank 1 did not exit as planned"
  has 'step [234] done' && fail "a rank trained past the step rank 1 left"
  for r in 0 2; do
    has "^RESULT rank $r: CLPAR_ERROR_TIMEOUT: .*FSDPUnit backward: (all-gather of the parameters|reduce-scatter of the gradients).*collective #[0-9]+, did not complete within 3 s.*not arrived.*: rank 1[;.]" ||
      fail "rank $r did not time out naming backward's collective and rank 1"
  done
  ;;
skip)
  run 3 "$@"
  for r in 0 2; do
    has "^RESULT rank $r: CLPAR_ERROR_TIMEOUT: rank $r: clpar_dist_all_reduce_sum \(1 floats\), collective #3, did not complete within 3 s .*not arrived.*: rank 1; rank $((2 - r)) waits in it too" ||
      fail "rank $r did not time out naming the all-reduce, #3 and rank 1"
    has "rank $r: still waiting after [0-9]+ s in clpar_dist_all_reduce_sum" ||
      fail "rank $r logged no stall warning"
  done
  ;;
debug)
  CLPAR_DIST_DEBUG=1 run 3 "$@"
  [ $rc -eq 0 ] || fail "mpirun exited with $rc"
  for r in 0 1 2; do
    has "^RESULT rank $r: CLPAR_ERROR_INVALID_ARGUMENT: CLPAR_DIST_DEBUG: the ranks are not running the same collective: rank 0 runs clpar_dist_all_reduce_sum \(1 floats\) \(collective #2, 4 bytes\) but rank 1 runs clpar_dist_barrier \(collective #2, 0 bytes\)" ||
      fail "rank $r did not name the mismatch"
    has "^rank $r: in step after the mismatch" || fail "rank $r fell out of step"
  done
  ;;
badenv)
  CLPAR_DIST_DEBUG=yes run 1 "$@"
  has '^RESULT init: CLPAR_ERROR_INVALID_ARGUMENT: clpar_dist_init: CLPAR_DIST_DEBUG="yes": give 0 or 1' ||
    fail "CLPAR_DIST_DEBUG=yes was not refused"
  for bad in abc 0 -1 1e99 nan; do
    CLPAR_DIST_TIMEOUT=$bad run 1 "$@"
    has "^RESULT init: CLPAR_ERROR_INVALID_ARGUMENT: clpar_dist_init: CLPAR_DIST_TIMEOUT=\"$bad\" is not a timeout" ||
      fail "CLPAR_DIST_TIMEOUT=$bad was not refused"
  done
  CLPAR_DIST_TIMEOUT=0.5 run 1 "$@"
  has '^RESULT init: CLPAR_OK' || fail "CLPAR_DIST_TIMEOUT=0.5 was refused"
  CLPAR_DIST_BACKEND=gloo run 1 "$@"
  has '^RESULT init: CLPAR_ERROR_INVALID_ARGUMENT: clpar_dist_init: CLPAR_DIST_BACKEND="gloo": give auto' ||
    fail "CLPAR_DIST_BACKEND=gloo was not refused"
  CLPAR_DIST_BACKEND=MPI run 1 "$@"
  has '^RESULT init: CLPAR_OK' || fail "CLPAR_DIST_BACKEND=MPI was refused"
  ;;
*) fail "unknown scenario" ;;
esac
echo "passed ($scenario)"
