#!/bin/sh
# graph_timeout.sh — a captured distributed step (DDP, DDP with buffers, ZeRO) whose rank
# STOPPER stops replaying (the test binary's "timeout" scenario: tests/test_ddp_graph.c,
# test_ddp_graph_bn.c, test_zero_graph.c, test_zero3_graph.c; ctest: test_*graph*_timeout*,
# label mpi), on NP ranks: every other rank must end its replay with CLPAR_ERROR_TIMEOUT, its
# message matching .*PATTERN (an extended regular expression) and naming rank STOPPER, within
# the deadline (CLPAR_DIST_TIMEOUT=3 s); `timeout` (30 s a rank) makes a hang a failure.
# Usage: graph_timeout.sh NP STOPPER WHAT PATTERN TEST_BINARY [ARG...] -- MPIEXEC [FLAGS...]
#   WHAT names PATTERN's collective in the failure message; ARG... follow "timeout".
np=$1
stopper=$2
what=$3
pattern=$4
shift 4
bin=$1
shift
args=
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  args="$args $1"
  shift
done
[ "$1" = "--" ] || { echo "usage: $0 NP STOPPER WHAT PATTERN TEST_BINARY [ARG...] -- MPIEXEC"; exit 2; }
shift
limit=$((30 * np))
out=$(mktemp)
trap 'rm -f "$out"' EXIT
export CLPAR_DIST_TIMEOUT=3
# shellcheck disable=SC2086 # args: the binary's words, split on purpose
timeout $limit "$@" -np "$np" "$bin" timeout $args >"$out" 2>&1
rc=$?
fail() {
  echo "FAILED: $*"
  echo "---- job output ----"
  cat "$out"
  exit 1
}
[ $rc -ne 124 ] || fail "the job hung (killed after $limit s)"
grep -q '^FAIL' "$out" && fail "a rank failed"
grep -q "rank $stopper: 4 steps done" "$out" ||
  fail "rank $stopper did not run the steps before it stopped"
r=0
while [ $r -lt "$np" ]; do
  if [ $r -ne "$stopper" ]; then
    grep -Eq "^RESULT rank $r: CLPAR_ERROR_TIMEOUT: .*$pattern.*: rank ${stopper}[;.]" "$out" ||
      fail "rank $r did not time out naming $what and rank $stopper"
  fi
  r=$((r + 1))
done
echo "every rank but $stopper timed out naming rank $stopper (mpirun exited with $rc)"
grep '^RESULT' "$out"
