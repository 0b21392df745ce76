#!/bin/sh
# Sharded checkpoints across world sizes (tests/test_checkpoint_sharded.c): a 2-rank DDP job
# saves one; jobs of 1, 2, 3 and 4 ranks load it; one process outside MPI consolidates it
# (the library, and the clpar-checkpoint tool: each equal byte for byte to the unsharded save)
# and loads damaged copies.
#   checkpoint_sharded.sh TEST TOOL MPIEXEC NUMPROC_FLAG [MPIEXEC_FLAGS...]
set -eu
test_exe=$1 tool=$2 mpiexec=$3 np_flag=$4
shift 4
dir=$(mktemp -d "${TMPDIR:-/tmp}/clpar-sharded.XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$mpiexec" "$@" "$np_flag" 2 "$test_exe" save "$dir"
for np in 1 2 3 4; do
  "$mpiexec" "$@" "$np_flag" "$np" "$test_exe" load "$dir"
done
"$test_exe" hostile "$dir"
"$tool" consolidate "$dir/sharded" "$dir/tool.safetensors"
cmp "$dir/tool.safetensors" "$dir/full.ckpt"
if "$tool" consolidate "$dir/missing" "$dir/x.safetensors" 2>"$dir/err"; then
  echo "clpar-checkpoint consolidate of a missing directory succeeded" >&2
  exit 1
fi
grep -q "CLPAR_ERROR_IO" "$dir/err"
echo "checkpoint_sharded: all passed"
