#!/usr/bin/env bash
# ddp.sh [BUILD_DIR] [STEPS] [REPEATS] — bench_ddp on 1 and 2 ranks (one PoCL "basic" device
# and one thread each), the scaling efficiency samples/s(2) / (2 x samples/s(1)), and a sweep
# of bucket_cap_mb on 2 ranks. Each set-up runs REPEATS times (default 3) and its best run is
# printed: on a shared machine the others' load only ever slows a run down. JSON lines only.
set -euo pipefail
build=${1:-build} steps=${2:-10} repeats=${3:-3}
export POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sps() { sed -E 's/.*"samples_per_s": ([0-9.]+).*/\1/' <<<"$1"; }
best() { # best RANKS CAP: the run with the most samples/s
  local out top="" top_sps=0
  for _ in $(seq "$repeats"); do
    out=$(mpirun --oversubscribe -np "$1" "$build/bench/bench_ddp" "$steps" "$2")
    if awk -v a="$(sps "$out")" -v b="$top_sps" 'BEGIN { exit !(a > b) }'; then
      top=$out top_sps=$(sps "$out")
    fi
  done
  echo "$top"
}
one=$(best 1 0) two=$(best 2 0)
echo "$one"
echo "$two"
awk -v a="$(sps "$one")" -v b="$(sps "$two")" \
  'BEGIN { printf "{\"bench\": \"ddp_scaling\", \"ranks\": 2, \"efficiency\": %.3f}\n", b / (2 * a) }'
for cap in 0.5 1 2 4; do best 2 "$cap"; done
