#!/usr/bin/env bash
# sample_data_parallel.sh SAMPLE — runs samples/data_parallel over 1, 2, 3, 4 and 8 PoCL
# devices and checks that the replicas' input sizes, batch by batch, are the chunk sizes of
# the tables in PyTorch's "Optional: Data Parallelism" (100 rows, batches of 30). Exit 77: skipped.
set -u
sample=$1
declare -A expect=(
  [1]="30 | 30 | 30 | 10"
  [2]="15 15 | 15 15 | 15 15 | 5 5"
  [3]="10 10 10 | 10 10 10 | 10 10 10 | 2 4 4"
  [4]="6 8 8 8 | 6 8 8 8 | 6 8 8 8 | 1 3 3 3"
  [8]="2 4 4 4 4 4 4 4 | 2 4 4 4 4 4 4 4 | 2 4 4 4 4 4 4 4 | 2 2 2 2 2"
)
# The device counts come from POCL_DEVICES: skip where the OpenCL devices are not PoCL's
# (another vendor's platform comes first, or PoCL is missing), as on a GPU machine.
if ! POCL_DEVICES="pthread pthread" CLPAR_DEVICES=opencl "$sample" 2>&1 | grep -q "Let's use 2 GPUs!"; then
  echo "the OpenCL devices here are not PoCL's (POCL_DEVICES sets no count): skipped"; exit 77
fi
fail=0
for n in 1 2 3 4 8; do
  out=$(POCL_DEVICES="$(printf 'pthread %.0s' $(seq 1 "$n"))" CLPAR_DEVICES=opencl "$sample" 2>&1) || {
    echo "$n devices: the sample failed:"; echo "$out"; fail=1; continue; }
  # the rows each replica saw, sorted within each batch (plain bash: mawk has no asort)
  got="" batch=()
  while IFS= read -r line; do
    if [[ $line =~ In\ Model:\ input\ size\ \[([0-9]+), ]]; then
      batch+=("${BASH_REMATCH[1]}")
    elif [[ $line == Outside:* ]]; then
      sorted=$(printf '%s\n' "${batch[@]}" | sort -n | tr '\n' ' ')
      got="${got:+$got | }${sorted% }"
      batch=()
    fi
  done <<<"$out"
  gpus=$(echo "$out" | grep -c "Let's use $n GPUs!")
  if [ "$got" != "${expect[$n]}" ] || { [ "$n" -gt 1 ] && [ "$gpus" -ne 1 ]; }; then
    echo "$n devices: got \"$got\", expected \"${expect[$n]}\""; fail=1
  else
    echo "$n devices: $got"
  fi
done
exit $fail
