#!/usr/bin/env bash
# readme_program.sh BUILD_DIR — checks that the README's first program compiles as copied and
# runs: extracts the first ```c block of README.md, compiles it (C11, -Wall -Wextra -Werror)
# against the headers in include/ and BUILD_DIR/include and the libclpar.so built in
# BUILD_DIR, and runs it on one PoCL CPU device (POCL_DEVICES=pthread). Exits non-zero when
# the block is missing, does not compile, or the program fails or runs past 300 s.
# CC chooses the compiler (default cc).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: scripts/readme_program.sh BUILD_DIR" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
if [ ! -e "$build/libclpar.so" ]; then
  echo "readme_program: $build/libclpar.so not found: build the library first" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The lines between the first line that is exactly ```c and the next ``` line.
awk '!found && /^```c[[:space:]]*$/ { inside = 1; found = 1; next }
     inside && /^```/ { exit }
     inside { print }' "$root/README.md" >"$work/first.c"
if [ ! -s "$work/first.c" ]; then
  echo "readme_program: README.md has no \`\`\`c block" >&2
  exit 1
fi
echo "readme_program: $(wc -l <"$work/first.c") lines from README.md's first C block"

if ! "${CC:-cc}" -std=c11 -Wall -Wextra -Werror -I"$root/include" -I"$build/include" \
  "$work/first.c" -o "$work/first" -L"$build" -lclpar -Wl,-rpath,"$build"; then
  echo "readme_program: FAILED: README.md's first program does not compile" >&2
  exit 1
fi

status=0
POCL_DEVICES=pthread timeout 300 "$work/first" || status=$?
if [ "$status" -ne 0 ]; then
  echo "readme_program: FAILED: README.md's first program exited with status $status" >&2
  exit 1
fi
echo "readme_program: README.md's first program compiled and ran"
