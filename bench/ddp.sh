#!/usr/bin/env bash
# ddp.sh [BUILD_DIR] [STEPS] — bench_ddp on 1 and 2 ranks (one PoCL "basic" device and one
# thread each), the scaling efficiency samples/s(2) / (2 x samples/s(1)), and a sweep of
# bucket_cap_mb on 2 ranks. Prints JSON lines only.
set -euo pipefail
build=${1:-build} steps=${2:-10}
export POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { mpirun --oversubscribe -np "$1" "$build/bench/bench_ddp" "$steps" "$2"; }
one=$(run 1 0) two=$(run 2 0)
echo "$one"; echo "$two"
sps() { sed -E 's/.*"samples_per_s": ([0-9.]+).*/\1/' <<<"$1"; }
awk -v a="$(sps "$one")" -v b="$(sps "$two")" \
  'BEGIN { printf "{\"bench\": \"ddp_scaling\", \"ranks\": 2, \"efficiency\": %.3f}\n", b / (2 * a) }'
for cap in 0.25 1 4 25; do run 2 "$cap"; done
