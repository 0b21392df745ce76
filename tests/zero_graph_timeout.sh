#!/bin/sh
# zero_graph_timeout.sh — a captured ZeRO step whose peer stops replaying (tests/test_zero_graph.c,
# argument "timeout STAGE"; ctest: test_zero_graph_timeout_stage1/2, label mpi), on 3 ranks:
# rank 1 stops after two replays; ranks 0 and 2 must each end their replay with
# CLPAR_ERROR_TIMEOUT naming rank 1 within the deadline (CLPAR_DIST_TIMEOUT=3 s), and `timeout`
# makes a hang a failure.
# Usage: zero_graph_timeout.sh STAGE TEST_BINARY MPIEXEC [MPIEXEC FLAGS...]
stage=$1
bin=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
export CLPAR_DIST_TIMEOUT=3
timeout 90 "$@" -np 3 "$bin" timeout "$stage" >"$out" 2>&1
rc=$?
fail() {
  echo "FAILED: $*"
  echo "---- job output ----"
  cat "$out"
  exit 1
}
[ $rc -ne 124 ] || fail "the job hung (killed after 90 s)"
grep -q '^FAIL' "$out" && fail "a rank failed"
grep -q 'rank 1: 4 steps done' "$out" || fail "rank 1 did not run the steps before it stopped"
for r in 0 2; do
  grep -Eq "^RESULT rank $r: CLPAR_ERROR_TIMEOUT: .*ZeRO.*did not complete within 3 s.*: rank 1[;.]" "$out" ||
    fail "rank $r did not time out naming ZeRO's collective and rank 1"
done
echo "ranks 0 and 2 timed out naming rank 1 (mpirun exited with $rc)"
grep '^RESULT' "$out"
