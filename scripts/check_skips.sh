#!/usr/bin/env bash
# check_skips.sh CONFIG CTEST_OUTPUT LAST_TEST_LOG EXPECTED — compares the tests one ctest run
# skipped with the skips EXPECTED allows for configuration CONFIG; exit 1, listing them, on
# any skip not listed and on any listed skip of a test that ran that did not happen.
#
# A cmocka skip() passes in ctest, so the skips are read from what the test printed: ctest
# keeps every test's output in Testing/Temporary/LastTest.log (LAST_TEST_LOG), where a skipped
# case is a line "[  SKIPPED ] <case>" after "<i>/<n> Test: <test>". A whole test that exits
# with its SKIP_RETURN_CODE is listed by ctest itself ("<i> - <test> (Skipped)" in its
# console output, CTEST_OUTPUT) and counts as case "-".
#
# EXPECTED (tests/expected_skips.txt): one skip a line, "CONFIG TEST CASE REASON...", '#'
# comments. CONFIG is a configuration name of scripts/test.sh or * (all of them); CASE may be
# * (any case of TEST). CONFIG ending in ? marks a skip that depends on the machine (hardware
# this machine may have): allowed, not required.
set -euo pipefail
config=$1 console=$2 lastlog=$3 expected=$4

# "skip TEST CASE" for each skip, "ran TEST" for each test this run ran: a listed skip of a
# test that did not run (ctest -R, -LE, a test not built) is not missing.
found=$( {
  awk '/^[0-9]+\/[0-9]+ Test: / { test = $3; print "ran", test }
       /^\[  SKIPPED \] [A-Za-z0-9_]+$/ { print "skip", test, $4 }' "$lastlog"
  sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) \(Skipped\)$/skip \1 -/p' "$console"
} | sort -u)

# Prints "unexpected TEST CASE" and "missing TEST CASE REASON" lines.
report=$(printf '%s\n' "$found" | awk -v config="$config" '
  FILENAME == ARGV[1] {
    if ($0 ~ /^[[:space:]]*(#|$)/) next
    c = $1; optional = sub(/\?$/, "", c)
    if (c != "*" && c != config) next
    n++; et[n] = $2; ec[n] = $3; eopt[n] = optional; seen[n] = 0
    reason = $0; sub(/^[^ \t]+[ \t]+[^ \t]+[ \t]+[^ \t]+[ \t]*/, "", reason); er[n] = reason
    next
  }
  $1 == "ran" { ran[$2] = 1 }
  $1 == "skip" {
    ok = 0
    for (i = 1; i <= n; i++)
      if (et[i] == $2 && (ec[i] == "*" || ec[i] == $3)) { ok = 1; seen[i] = 1 }
    if (!ok) print "unexpected", $2, $3
  }
  END {
    for (i = 1; i <= n; i++)
      if (!seen[i] && !eopt[i] && (et[i] in ran)) print "missing", et[i], ec[i], er[i]
  }
' "$expected" -)

count=$(printf '%s\n' "$found" | grep -c '^skip ' || true)
if [ -z "$report" ]; then
  echo "skips ($config): $count, as $expected expects"
  exit 0
fi
echo "skips ($config): $count; they differ from $expected:"
printf '%s\n' "$report" | sed -e 's/^unexpected /  skipped, not expected: /' \
  -e 's/^missing /  expected, not skipped: /'
exit 1
