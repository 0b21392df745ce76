#!/usr/bin/env bash
# fuzz.sh [SECONDS] [TARGET...] — fuzzes clpar's file readers with libFuzzer, ASan and UBSan:
# the safetensors reader (tests/fuzz/fuzz_safetensors.c) for SECONDS (default 60) and the
# .npy reader (tests/fuzz/fuzz_npy.c) for half as long; TARGET names (safetensors, npy)
# select some. Builds each target with clang from the few sources it needs (the generated
# version.h comes from build/, so build that first, as test.sh does). First replays every
# crash ever found (tests/fuzz/regressions/TARGET/); a new crash fails the run and is left in
# build-fuzz/TARGET/ as crash-*: fix it, then copy the file into tests/fuzz/regressions/TARGET/
# so that it is replayed from then on (also by ctest: fuzz_TARGET_replay).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors npy)
[ -f "$root/build/include/clpar/version.h" ] || { echo "fuzz.sh: build/ first (version.h)"; exit 1; }
command -v clang >/dev/null || { echo "fuzz.sh: needs clang (libFuzzer)"; exit 1; }
cd "$root"

fuzz_one() { # fuzz_one TARGET SECONDS MAX_LEN SOURCES...
  local target=$1 t=$2 max_len=$3
  shift 3
  local out=$root/build-fuzz/$target
  mkdir -p "$out/corpus"
  clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Iinclude -Ibuild/include -Isrc -Ibackends -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
    -DCLPAR_BUILDING "tests/fuzz/fuzz_$target.c" "$@" src/runtime/status.c src/runtime/log.c \
    $(pkg-config --cflags --libs jansson) -lpthread -o "$out/fuzz_$target"
  local regressions=(tests/fuzz/regressions/"$target"/*)
  if [ -e "${regressions[0]}" ]; then
    echo "== replaying ${#regressions[@]} kept crash(es) of the $target reader"
    "$out/fuzz_$target" "${regressions[@]}"
  fi
  echo "== fuzzing the $target reader for ${t} s"
  "$out/fuzz_$target" -max_total_time="$t" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
    -dict="tests/fuzz/$target.dict" -artifact_prefix="$out/" -print_final_stats=1 \
    "$out/corpus" "tests/fuzz/corpus/$target" 2>"$out/fuzz.log" || {
    tail -40 "$out/fuzz.log"
    echo "fuzz.sh: a crash in the $target reader; the input is in $out/crash-*"
    exit 1
  }
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+ *DONE' "$out/fuzz.log" || true
  echo "fuzz.sh: no crash in the $target reader in ${t} s"
}

for target in "${targets[@]}"; do
  case $target in
  safetensors) fuzz_one safetensors "$secs" 4096 src/io/safetensors.c src/runtime/trusted_file.c ;;
  npy) fuzz_one npy $(((secs + 1) / 2)) 1024 src/io/npy.c src/runtime/trusted_file.c ;;
  *) echo "fuzz.sh: unknown target $target (safetensors, npy)"; exit 2 ;;
  esac
done
