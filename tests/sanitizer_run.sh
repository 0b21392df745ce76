#!/usr/bin/env bash
# sanitizer_run.sh TEST [ARGS...] — runs a test of the sanitizer build. LeakSanitizer's
# tracer sometimes crashes while it stops the process's threads at exit ("Tracer caught
# signal 11", a known sanitizer-runtime bug: google/sanitizers#1353), after every test has
# passed. Only that crash is retried, once, and said so; a leak report, a sanitizer error or
# a failed test fails as usual.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for attempt in 1 2; do
  "$@" >"$log" 2>&1
  rc=$?
  cat "$log"
  if [ $rc -ne 0 ] && [ $attempt -eq 1 ] && grep -q 'Tracer caught signal' "$log" &&
     grep -q 'LeakSanitizer has encountered a fatal error' "$log" &&
     ! grep -qE 'detected memory leaks|ERROR: AddressSanitizer|runtime error:|FAILED' "$log"; then
    echo "sanitizer_run.sh: LeakSanitizer's tracer crashed at exit (not a leak); running once more"
    continue
  fi
  exit $rc
done
