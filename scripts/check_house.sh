#!/usr/bin/env bash
# check_house.sh — the shape rules CI keeps, beside the tests. Fails (exit 1, each violation on
# stderr) when:
#
# 1. a source file passes 800 lines (CLPAR_MAX_FILE_LINES): the .c .h .cc .cu .cuh .cl files
#    under src/ backends/ include/ kernels/ samples/ bench/ tools/ (tests/ is exempt: a test
#    file keeps a module's cases together);
# 2. a function in those files passes 120 lines (CLPAR_MAX_FUNCTION_LINES), counted from the
#    line of its opening brace to the line of its closing one. Functions are found by counting
#    braces outside comments, strings and preprocessor lines: a brace opened at file level
#    (extern "C" and namespace blocks do not count as a level) after a header that has a
#    closing parenthesis and no '=' opens a function;
# 3. a backend reaches into the core. A backend (backends/, and its device code in kernels/)
#    sees the core only through backends/backend.h: each #include "..." in those files must
#    name a header under backends/ or kernels/ (the including file's directory, or a path from
#    backends/ or kernels/, like "cuda/cuda_kernels.h"), or a public header "clpar/..."
#    (include/clpar/, and the generated clpar/version.h); a header of src/ ("internal.h",
#    "dist/ddp_internal.h", or any path that resolves into src/) fails, quoted or in <>.
# 4. the runtime calls up into a layer above it. A file of src/runtime/ sees the rest of clpar
#    only through its own header and what the backends see: each #include "..." must be
#    "runtime.h" (src/runtime/runtime.h), "backend.h" (backends/backend.h) or a public header
#    "clpar/..."; a header of src/ outside src/runtime/ ("internal.h", "dist/dist_internal.h"),
#    a backend's own header, or any other quoted name fails; in <> only system headers pass
#    (a name that is a file under src/ or backends/ fails).
# 5. with a build directory given (check_house.sh BUILD_DIR), the README's first program no
#    longer compiles and links against that build: scripts/readme_program.sh BUILD_DIR, which
#    extracts the first ```c block of README.md, does that check (a checkout without that
#    script says so and goes on). Without a build directory
#    this rule is not run (the source rules need no build: .ci/run runs them first, and
#    scripts/test.sh runs all five after its build).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${1:-}
if [ -n "$BUILD_DIR" ]; then
  BUILD_DIR=$(cd "$BUILD_DIR" 2>/dev/null && pwd) || {
    echo "check_house: no build directory $1" >&2
    exit 1
  }
fi
cd "$ROOT"
MAX_FILE=${CLPAR_MAX_FILE_LINES:-800}
MAX_FN=${CLPAR_MAX_FUNCTION_LINES:-120}
fail=0

mapfile -t files < <(find src backends include kernels samples bench tools -type f \
  \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \
  -o -name '*.cl' \) 2>/dev/null | LC_ALL=C sort)
if [ "${#files[@]}" -eq 0 ]; then
  echo "check_house: no source files found under $ROOT" >&2
  exit 1
fi

# 1. files
for f in "${files[@]}"; do
  n=$(wc -l <"$f")
  if [ "$n" -gt "$MAX_FILE" ]; then
    echo "check_house: $f has $n lines (at most $MAX_FILE): split it along its sections" >&2
    fail=1
  fi
done

# 2. functions
if ! awk -v max="$MAX_FN" '
  function start_file() {
    open = 0; eff = 0; header = ""; in_comment = 0; pp = 0
  }
  FNR == 1 { start_file() }
  {
    line = $0
    if (pp || (!in_comment && line ~ /^[ \t]*#/)) { pp = (line ~ /\\$/); next }
    out = ""; n = length(line); i = 1
    while (i <= n) {
      c = substr(line, i, 1)
      if (in_comment) {
        if (c == "*" && substr(line, i + 1, 1) == "/") { in_comment = 0; i += 2 } else i++
        continue
      }
      if (c == "/" && substr(line, i + 1, 1) == "*") { in_comment = 1; i += 2; continue }
      if (c == "/" && substr(line, i + 1, 1) == "/") break
      if (c == "\"" || c == "\047") {
        q = c; i++
        while (i <= n) {
          d = substr(line, i, 1)
          if (d == "\\") { i += 2; continue }
          if (d == q) break
          i++
        }
        i++; out = out " "; continue
      }
      out = out c; i++
    }
    m = length(out)
    for (j = 1; j <= m; j++) {
      c = substr(out, j, 1)
      if (c == "{") {
        kind = "o"
        if (eff == 0) {
          if (header ~ /(extern[ \t]*$|namespace)/) kind = "t"
          else if (header ~ /\)/ && header !~ /=/) {
            kind = "f"; fn_line = FNR; fn_name = header
            if (match(header, /[A-Za-z_][A-Za-z0-9_]*[ \t]*\(/))
              fn_name = substr(header, RSTART, RLENGTH - 1)
            gsub(/[ \t]+/, "", fn_name)
          }
        }
        stack[++open] = kind
        if (kind != "t") eff++
        header = ""
      } else if (c == "}") {
        if (open == 0) continue
        kind = stack[open--]
        if (kind != "t") eff--
        if (kind == "f" && FNR - fn_line + 1 > max) {
          printf "check_house: %s:%d: function %s has %d lines (at most %d): split it\n",
                 FILENAME, fn_line, fn_name, FNR - fn_line + 1, max > "/dev/stderr"
          bad = 1
        }
        if (eff == 0) header = ""
      } else if (eff == 0) {
        if (c == ";") header = ""
        else header = header c
      }
    }
    if (eff == 0) header = header " "
  }
  END { exit bad }
' "${files[@]}"; then
  fail=1
fi

# 3. what a backend includes
inside() { # inside PATH DIR...: PATH (resolved) lies under one of the DIRs of the repository
  local p=$1 d
  shift
  for d in "$@"; do
    case "$p" in "$ROOT/$d"/*) return 0 ;; esac
  done
  return 1
}
for f in "${files[@]}"; do
  case "$f" in backends/* | kernels/*) ;; *) continue ;; esac
  while IFS=: read -r ln text; do
    inc=$(printf '%s\n' "$text" | sed -E 's/^[ \t]*#[ \t]*include[ \t]*["<]([^">]+)[">].*/\1/')
    quoted=0
    printf '%s\n' "$text" | grep -Eq '^[ \t]*#[ \t]*include[ \t]*"' && quoted=1
    ok=0
    if [ "$quoted" -eq 1 ]; then
      case "$inc" in
        clpar/*) [ -f "include/$inc" ] || [ "$inc" = clpar/version.h ] && ok=1 ;;
        *)
          for cand in "$(dirname "$f")/$inc" "backends/$inc" "kernels/$inc"; do
            if [ -f "$cand" ] && inside "$(realpath -m "$cand")" backends kernels; then
              ok=1
              break
            fi
          done
          ;;
      esac
    else
      ok=1 # a system or vendor header, unless the name is one of src/'s
      [ -f "src/$inc" ] && ok=0
    fi
    if [ "$ok" -eq 0 ]; then
      echo "check_house: $f:$ln: includes \"$inc\": a backend sees the core only through" \
        "backends/backend.h and the public clpar/ headers" >&2
      fail=1
    fi
  done < <(grep -nE '^[ \t]*#[ \t]*include[ \t]*["<]' "$f")
done

# 4. what the runtime includes
for f in "${files[@]}"; do
  case "$f" in src/runtime/*) ;; *) continue ;; esac
  while IFS=: read -r ln text; do
    inc=$(printf '%s\n' "$text" | sed -E 's/^[ \t]*#[ \t]*include[ \t]*["<]([^">]+)[">].*/\1/')
    ok=0
    if printf '%s\n' "$text" | grep -Eq '^[ \t]*#[ \t]*include[ \t]*"'; then
      case "$inc" in
        runtime.h) [ -f src/runtime/runtime.h ] && ok=1 ;;
        backend.h) [ -f backends/backend.h ] && ok=1 ;;
        clpar/*) [ -f "include/$inc" ] || [ "$inc" = clpar/version.h ] && ok=1 ;;
      esac
    else
      ok=1 # a system header, unless the name is one of clpar's own
      [ -f "src/$inc" ] || [ -f "src/runtime/$inc" ] || [ -f "backends/$inc" ] && ok=0
    fi
    if [ "$ok" -eq 0 ]; then
      echo "check_house: $f:$ln: includes \"$inc\": the runtime sees only runtime.h," \
        "backend.h and the public clpar/ headers (it never calls up into the layers above)" >&2
      fail=1
    fi
  done < <(grep -nE '^[ \t]*#[ \t]*include[ \t]*["<]' "$f")
done

# 5. the README's first program
if [ -n "$BUILD_DIR" ]; then
  if [ -f scripts/readme_program.sh ]; then
    if ! bash scripts/readme_program.sh "$BUILD_DIR"; then
      echo "check_house: the README's first program does not compile and link against" \
        "$BUILD_DIR (scripts/readme_program.sh)" >&2
      fail=1
    fi
  else
    echo "check_house: note: no scripts/readme_program.sh, so the README's first program" \
      "is not checked"
  fi
fi

if [ "$fail" -ne 0 ]; then
  echo "check_house: FAILED" >&2
  exit 1
fi
readme=""
[ -n "$BUILD_DIR" ] && [ -f scripts/readme_program.sh ] && readme=", the README's first program builds"
echo "check_house: ${#files[@]} files: none over $MAX_FILE lines, no function over $MAX_FN" \
  "lines, backends include no core header, the runtime none of the layers above$readme"
