#!/usr/bin/env bash
# sample_memory.sh N COMMAND... — runs a sample (COMMAND, which must succeed) and checks that it
# printed N lines of peak device memory per category on stderr (one per device it used, or per
# rank under mpirun), each with parameters and a total over 0.
set -u
want=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$@" >"$tmp/out" 2>"$tmp/err" || { echo "FAIL: $* failed:"; cat "$tmp/out" "$tmp/err"; exit 1; }
mem='peak memory on .*: parameters [0-9.]+ MiB, gradients [0-9.]+ MiB, optimizer [0-9.]+ MiB, '
mem+='activations [0-9.]+ MiB, communication [0-9.]+ MiB, workspace [0-9.]+ MiB, total [0-9.]+ MiB$'
grep -E "$mem" "$tmp/err"
n=$(grep -cE "$mem" "$tmp/err")
[ "$n" -eq "$want" ] || { echo "FAIL: $n lines of peak memory, want $want:"; cat "$tmp/err"; exit 1; }
if grep -E "$mem" "$tmp/err" | grep -qE 'parameters 0\.00 MiB|total 0\.00 MiB'; then
  echo "FAIL: a device with no memory counted"; exit 1
fi
grep -qE "$mem" "$tmp/out" && { echo "FAIL: peak memory on stdout"; exit 1; }
echo "peak memory: ok"
