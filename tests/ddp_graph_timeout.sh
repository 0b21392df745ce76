#!/bin/sh
# ddp_graph_timeout.sh — a captured DistributedDataParallel step whose peer stops replaying
# (tests/test_ddp_graph.c, argument "timeout"; ctest: test_ddp_graph_timeout, label mpi): rank 0
# must end its replay with CLPAR_ERROR_TIMEOUT naming the bucket's all-reduce and rank 1 within
# the deadline (CLPAR_DIST_TIMEOUT=3 s), and `timeout` makes a hang a failure.
# Usage: ddp_graph_timeout.sh TEST_BINARY MPIEXEC [MPIEXEC FLAGS...]
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
grep -q 'rank 1: 4 steps done' "$out" || fail "rank 1 did not run the steps before it stopped"
grep -Eq "^RESULT rank 0: CLPAR_ERROR_TIMEOUT: .*all-reduce of bucket 0 .*collective #[0-9]+, did not complete within 3 s.*not arrived.*: rank 1[;.]" "$out" ||
  fail "rank 0 did not time out naming the bucket and rank 1"
echo "rank 0 timed out naming rank 1 (mpirun exited with $rc)"
grep '^RESULT' "$out"
