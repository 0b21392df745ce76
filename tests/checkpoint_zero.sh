#!/bin/sh
# Sharded checkpoints of ZeRO-1, ZeRO-2 and ZeRO-3 (tests/test_checkpoint_zero.c): a 2-rank job saves
# one; jobs of 1, 2, 3 and 4 ranks load it; one process outside MPI consolidates it (the
# library, and the clpar-checkpoint tool: each equal byte for byte to the plain DDP run's file).
#   checkpoint_zero.sh TEST TOOL MPIEXEC NUMPROC_FLAG [MPIEXEC_FLAGS...]
set -eu
test_exe=$1 tool=$2 mpiexec=$3 np_flag=$4
shift 4
dir=$(mktemp -d "${TMPDIR:-/tmp}/clpar-zckpt.XXXXXX")
trap 'rm -rf "$dir"' EXIT
for stage in 1 2 3; do
  "$mpiexec" "$@" "$np_flag" 2 "$test_exe" save "$dir" "$stage"
  for np in 1 2 3 4; do
    "$mpiexec" "$@" "$np_flag" "$np" "$test_exe" load "$dir" "$stage"
  done
  "$test_exe" hostile "$dir" "$stage"
  "$tool" consolidate "$dir/zero$stage" "$dir/tool$stage.safetensors"
  cmp "$dir/tool$stage.safetensors" "$dir/full.ckpt"
done
echo "checkpoint_zero: all passed"
