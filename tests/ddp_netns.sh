#!/usr/bin/env bash
# ddp_netns.sh — test_ddp on two "hosts" (ctest test_ddp_netns, label mpi): two network
# namespaces on this machine joined by a veth pair, each with its own address, one rank in
# each. mpirun runs in the first namespace (that host is local to it) and starts its daemon on
# the second through tests/netns_agent.sh (--mca plm_rsh_agent), as it would through ssh on
# another machine. Open MPI is restricted to TCP (the transport between machines) on the
# veth's subnet, for its own messages (oob) and the ranks' (btl). Each rank records its network
# namespace before it becomes test_ddp: the test fails unless rank 0 ran in the first
# namespace and rank 1 in the second, each the only rank on its host (local 0 of 1), their
# messages crossed the veth, and test_ddp passed on both.
# Needs root and `ip` (iproute2) able to make network namespaces and veth links; otherwise it
# exits 77 (ctest's skip) saying why. Names carry this shell's pid, so runs in parallel cannot
# clash; the namespaces and links are removed on every exit (a hung job is killed after $limit
# seconds, before ctest's TIMEOUT).
# Usage: ddp_netns.sh TEST_BINARY MPIEXEC [MPIEXEC FLAGS...]
set -u
bin=$1 mpiexec=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
ns_a=clpar$$a ns_b=clpar$$b # network namespaces
veth_a=clpv$$a veth_b=clpv$$b # the link's two ends (at most 15 characters)
addr_a=10.77.0.1 addr_b=10.77.0.2 subnet=10.77.0.0/24
limit=240
made=() # namespaces this run created
dir=$(mktemp -d)

cleanup() {
  for ns in "${made[@]}"; do
    # processes left in our namespaces (a daemon of a job killed on timeout) are ours
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    [ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null
  done
  # deleting one end of a veth deletes both; it may still be in this namespace
  ip link del "$veth_a" 2>/dev/null || ip -n "$ns_a" link del "$veth_a" 2>/dev/null
  for ns in "${made[@]}"; do ip netns del "$ns" || echo "warning: could not delete namespace $ns"; done
  rm -rf "$dir"
}
# A signal stops the job (bash runs traps during `wait`, not while a foreground child runs),
# then the exit's cleanup kills what is left in the namespaces.
job=
on_signal() {
  [ -z "$job" ] || kill -TERM "$job" 2>/dev/null
  exit "$1"
}
trap cleanup EXIT
trap 'on_signal 129' HUP
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAILED: $*"
  if [ -s "$dir/out" ]; then
    echo "---- job output ----"
    cat "$dir/out"
  fi
  exit 1
}
# the stderr of a failed command, on one line
err() { tr '\n' ' ' <"$dir/err"; }

# -- what it needs
[ "$(id -u)" -eq 0 ] || skip "not root: network namespaces and veth links need root"
command -v ip >/dev/null || skip "no \`ip\` command (Debian: apt-get install iproute2)"
command -v timeout >/dev/null || skip "no \`timeout\` command (coreutils)"
for ns in "$ns_a" "$ns_b"; do
  ip netns add "$ns" 2>"$dir/err" || skip "cannot make a network namespace (ip netns add): $(err)"
  made+=("$ns")
done
ip link add "$veth_a" type veth peer name "$veth_b" 2>"$dir/err" ||
  skip "cannot make a veth pair (ip link add ... type veth): $(err)"

# -- the two hosts
setup() {
  ip link set "$veth_a" netns "$ns_a" && ip link set "$veth_b" netns "$ns_b" &&
    ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a" &&
    ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b" &&
    ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up
}
setup 2>"$dir/err" || fail "setting up the namespaces' link: $(err)"
want_a=$(ip netns exec "$ns_a" readlink /proc/self/ns/net) || fail "cannot enter $ns_a"
want_b=$(ip netns exec "$ns_b" readlink /proc/self/ns/net) || fail "cannot enter $ns_b"
[ "$want_a" != "$want_b" ] || fail "both namespaces are $want_a"
stat_a() { ip netns exec "$ns_a" cat "/sys/class/net/$veth_a/statistics/$1"; }
tx0=$(stat_a tx_bytes) rx0=$(stat_a rx_bytes)

# -- the job: a rank writes its namespace to $dir/rank.ns.R and its POCL_* and CLPAR_*
# variables to $dir/rank.env.R, then becomes test_ddp
export NETNS_AGENT_HOSTS="$addr_a=$ns_a $addr_b=$ns_b"
echo "hosts: $addr_a in $ns_a ($want_a), $addr_b in $ns_b ($want_b)"
timeout -k 10 "$limit" ip netns exec "$ns_a" "$mpiexec" "$@" -np 2 --host "$addr_a:1,$addr_b:1" \
  --mca plm_rsh_agent "$here/netns_agent.sh" --mca btl tcp,self \
  --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
  bash -c 'r=$OMPI_COMM_WORLD_RANK; readlink /proc/self/ns/net >"$0.ns.$r" &&
    { env | grep -E "^(POCL|CLPAR)_" | sort >"$0.env.$r"; } && exec "$1"' "$dir/rank" "$bin" \
  >"$dir/out" 2>&1 &
job=$!
wait "$job"
rc=$?
job=
[ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "the job hung (killed after $limit s)"
[ $rc -eq 0 ] || fail "mpirun exited with $rc"

# -- where the ranks ran, and what test_ddp said
for r in 0 1; do
  [ -s "$dir/rank.ns.$r" ] || fail "rank $r did not record its namespace"
done
got_a=$(cat "$dir/rank.ns.0") got_b=$(cat "$dir/rank.ns.1")
[ "$got_a" = "$want_a" ] || fail "rank 0 ran in $got_a, not in $ns_a ($want_a)"
[ "$got_b" = "$want_b" ] || fail "rank 1 ran in $got_b, not in $ns_b ($want_b)"
# rank 0 has mpirun's environment; rank 1 what the agent forwarded to the other host
env | grep -E "^(POCL|CLPAR)_" | sort >"$dir/env"
cmp -s "$dir/env" "$dir/rank.env.0" && cmp -s "$dir/env" "$dir/rank.env.1" ||
  fail "the ranks' POCL_* and CLPAR_* variables differ from mpirun's: $(diff "$dir/rank.env.0" "$dir/rank.env.1" | tr '\n' ' ')"
for r in 0 1; do
  grep -q "^rank $r of 2 (local 0 of 1)" "$dir/out" || fail "rank $r was not alone on its host"
done
# Open MPI's own messages (launch, wire-up, shutdown) put about 2.5 kB each way on the veth, a
# job that communicates nothing; test_ddp's broadcasts and all-reduces 0.7-0.9 MB.
tx=$(($(stat_a tx_bytes) - tx0)) rx=$(($(stat_a rx_bytes) - rx0))
echo "the veth carried $tx bytes out of $ns_a and $rx bytes in"
[ $tx -ge 100000 ] && [ $rx -ge 100000 ] || fail "the ranks' traffic did not cross the veth (100 kB each way)"
[ "$(grep -c '^\[  PASSED  \]' "$dir/out")" -eq 2 ] || fail "test_ddp did not pass on both ranks"
grep -q '^\[  FAILED  \]' "$dir/out" && fail "test_ddp failed"
grep -E '^rank [01] of 2|^\[  PASSED  \]' "$dir/out"
echo "passed: rank 0 in $ns_a ($got_a), rank 1 in $ns_b ($got_b)"
