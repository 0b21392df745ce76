#!/usr/bin/env bash
# check_house_runtime_test.sh CHECK_HOUSE SOURCE_DIR WORK_DIR — scripts/check_house.sh's rule
# that the runtime never includes a header of the layers above, on a copy of the sources: the
# copy as it is must pass; each include planted in src/runtime/ that reaches up (internal.h
# quoted, a src/ header in <>, a backend's own header) must fail, naming the file and header.
set -euo pipefail
check=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/scripts"
cp -r "$src/src" "$src/backends" "$src/include" "$src/kernels" "$work/"
for d in samples bench tools; do [ -d "$src/$d" ] && cp -r "$src/$d" "$work/"; done
cp "$check" "$work/scripts/check_house.sh"
bash "$work/scripts/check_house.sh" >"$work/clean.log" 2>&1 || {
  echo "FAIL: the unchanged sources do not pass:"
  cat "$work/clean.log"
  exit 1
}
clean() { rm -rf "$work/src" && cp -r "$src/src" "$work/"; }
plant() { # plant FILE LINE: LINE after FILE's include of runtime.h; check_house must fail
  local file=$1 line=$2
  clean
  sed -i "0,/#include \"runtime.h\"/s||#include \"runtime.h\"\\n$line|" "$work/$file"
  grep -qF "$line" "$work/$file" || { echo "FAIL: could not plant $line in $file"; exit 1; }
  if bash "$work/scripts/check_house.sh" >"$work/planted.log" 2>&1; then
    echo "FAIL: check_house passed with $line in $file"
    exit 1
  fi
  grep -q "$file:.*the runtime sees only" "$work/planted.log" || {
    echo "FAIL: check_house did not name $file for $line:"
    cat "$work/planted.log"
    exit 1
  }
  echo "ok: $line in $file refused"
}
plant src/runtime/worker.c '#include "internal.h"'
plant src/runtime/event.c '#include <dist/dist_internal.h>'
plant src/runtime/allocator.c '#include "opencl/ocl_internal.h"'
echo "check_house_runtime: passed"
