#!/usr/bin/env bash
# fuzz.sh [SECONDS] — fuzzes the safetensors reader (tests/fuzz/fuzz_safetensors.c) with
# libFuzzer, ASan and UBSan for SECONDS (default 60). Builds the target with clang from the
# few sources it needs (the generated version.h comes from build/, so build that first, as
# test.sh does). First replays every crash ever found (tests/fuzz/regressions/safetensors/);
# a new crash fails the run and is left in build-fuzz/ as crash-*: fix it, then copy the file
# into tests/fuzz/regressions/safetensors/ so that it is replayed from then on (also by ctest,
# fuzz_safetensors_replay).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
out=$root/build-fuzz
[ -f "$root/build/include/clpar/version.h" ] || { echo "fuzz.sh: build/ first (version.h)"; exit 1; }
command -v clang >/dev/null || { echo "fuzz.sh: needs clang (libFuzzer)"; exit 1; }
mkdir -p "$out/corpus"
cd "$root"
clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude -Ibuild/include -Isrc -Ibackends -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
  -DCLPAR_BUILDING tests/fuzz/fuzz_safetensors.c src/io/safetensors.c src/status.c src/log.c \
  src/trusted_file.c $(pkg-config --cflags --libs jansson) -lpthread -o "$out/fuzz_safetensors"
regressions=(tests/fuzz/regressions/safetensors/*)
if [ -e "${regressions[0]}" ]; then
  echo "== replaying ${#regressions[@]} kept crash(es)"
  "$out/fuzz_safetensors" "${regressions[@]}"
fi
echo "== fuzzing the safetensors reader for ${secs} s"
"$out/fuzz_safetensors" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -dict=tests/fuzz/safetensors.dict -artifact_prefix="$out/" -print_final_stats=1 \
  "$out/corpus" tests/fuzz/corpus/safetensors 2>"$out/fuzz.log" || {
  tail -40 "$out/fuzz.log"
  echo "fuzz.sh: a crash; the input is in $out/crash-*"
  exit 1
}
grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+ *DONE' "$out/fuzz.log" || true
echo "fuzz.sh: no crash in ${secs} s"
