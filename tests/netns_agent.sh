#!/usr/bin/env bash
# netns_agent.sh — the "ssh" of tests/ddp_netns.sh (mpirun --mca plm_rsh_agent): Open MPI calls
# it as it would call ssh, `netns_agent.sh [OPTIONS] HOST COMMAND...`, to start its daemon on
# HOST. It runs COMMAND inside the network namespace that stands for HOST, as ssh would on
# another machine: the arguments joined into one line for a shell (Open MPI quotes them for
# that), in a fresh environment that holds only PATH, HOME and the variables that matter to the
# job (OMPI_*, POCL_*, CLPAR_*, LD_LIBRARY_PATH; over ssh these need SendEnv/AcceptEnv, or
# mpirun's -x for the ranks).
# The hosts: NETNS_AGENT_HOSTS="ADDRESS=NAMESPACE ADDRESS=NAMESPACE ...".
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done # ssh options Open MPI may add
host=${1:-}
[ -n "$host" ] && shift
ns=
for entry in ${NETNS_AGENT_HOSTS:-}; do
  [ "${entry%%=*}" = "$host" ] && ns=${entry#*=}
done
if [ -z "$ns" ]; then
  echo "netns_agent.sh: unknown host \"$host\" (NETNS_AGENT_HOSTS=\"${NETNS_AGENT_HOSTS:-}\")" >&2
  exit 255 # ssh's status when it cannot reach the host
fi
keep=("PATH=$PATH" "HOME=${HOME:-/}")
for name in $(compgen -e); do
  case $name in
  OMPI_* | POCL_* | CLPAR_* | LD_LIBRARY_PATH) keep+=("$name=${!name}") ;;
  esac
done
exec ip netns exec "$ns" env -i "${keep[@]}" /bin/sh -c "$*"
