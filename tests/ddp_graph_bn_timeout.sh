#!/bin/sh
# ddp_graph_bn_timeout.sh — a captured DistributedDataParallel step of a module with buffers
# whose rank 0 (the buffers' broadcast root) stops replaying (tests/test_ddp_graph_bn.c,
# argument "timeout"; ctest: test_ddp_graph_bn_timeout, label mpi): rank 1 must end its replay
# with CLPAR_ERROR_TIMEOUT naming the buffers' broadcast and rank 0 within the deadline
# (CLPAR_DIST_TIMEOUT=3 s), and `timeout` makes a hang a failure.
# Usage: ddp_graph_bn_timeout.sh TEST_BINARY MPIEXEC [MPIEXEC FLAGS...]
bin=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
export CLPAR_DIST_TIMEOUT=3
timeout 60 "$@" -np 2 "$bin" timeout >"$out" 2>&1
rc=$?
fail() {
  echo "FAILED: $*"
  echo "---- job output ----"
  cat "$out"
  exit 1
}
[ $rc -ne 124 ] || fail "the job hung (killed after 60 s)"
grep -q '^FAIL' "$out" && fail "a rank failed"
grep -q 'rank 0: 4 steps done' "$out" || fail "rank 0 did not run the steps before it stopped"
grep -Eq "^RESULT rank 1: CLPAR_ERROR_TIMEOUT: .*broadcasting buffers.*collective #[0-9]+, did not complete within 3 s.*not arrived.*: rank 0[;.]" "$out" ||
  fail "rank 1 did not time out naming the buffers' broadcast and rank 0"
echo "rank 1 timed out naming rank 0 (mpirun exited with $rc)"
grep '^RESULT' "$out"
