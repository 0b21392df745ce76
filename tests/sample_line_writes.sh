#!/usr/bin/env bash
# sample_line_writes.sh N MPIEXEC [FLAGS...] -- SAMPLE [ARGS...] — runs SAMPLE under MPIEXEC
# (which must succeed) with every rank traced by strace, and checks that each of the N ranks
# wrote its line of peak device memory on stderr in one write(2). mpirun forwards each rank's
# stderr as it arrives: a line written in pieces while another rank writes its own comes out
# with the other's spliced into it (sample_memory.sh then counts too few lines). Skips (77)
# without strace or where it cannot trace.
set -u
want=$1
shift
launcher=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
[ $# -gt 1 ] || { echo "usage: $0 N MPIEXEC [FLAGS...] -- SAMPLE [ARGS...]"; exit 2; }
shift
command -v strace >/dev/null || { echo "SKIPPED: no strace (Debian: apt-get install strace)"; exit 77; }
strace -f -o /dev/null true 2>/dev/null || { echo "SKIPPED: strace cannot trace here (ptrace refused)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# -ff: one trace file per process (trace.<pid>); -s: whole strings; writes to stderr only
"${launcher[@]}" strace -ff -qq -s 4096 -e trace=write -e signal=none -o "$tmp/trace" "$@" \
  >"$tmp/out" 2>"$tmp/err" || { echo "FAIL: the traced run failed:"; cat "$tmp/out" "$tmp/err"; exit 1; }
cat "$tmp"/trace.* | grep -E '^write\(2, ' >"$tmp/writes"
grep -F 'peak memory on' "$tmp/writes"
whole='^write\(2, "(rank [0-9]+: )?peak memory on .*, total [0-9.]+ MiB\\n", [0-9]+\) = [0-9]+$'
n=$(grep -cE "$whole" "$tmp/writes")
pieces=$(grep -F 'peak memory on' "$tmp/writes" | grep -cvE "$whole")
[ "$pieces" -eq 0 ] || { echo "FAIL: a line of peak memory written in pieces (above)"; exit 1; }
[ "$n" -eq "$want" ] || { echo "FAIL: $n whole lines of peak memory, want $want"; exit 1; }
echo "peak memory lines, one write each: ok"
