#!/usr/bin/env bash
# check_skips_test.sh CHECK_SKIPS WORK_DIR — scripts/check_skips.sh on a made-up ctest run: a
# cmocka case that skipped (printed "[  SKIPPED ] case", passed in ctest), a test that exited
# with its SKIP_RETURN_CODE, and cmocka's summary lines, which name the skipped cases again.
# The run must match a list naming exactly those skips; a skip the list lacks, a listed skip
# that did not happen, and another configuration's list must each fail, naming the skip.
set -euo pipefail
check=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
cd "$work"
cat >LastTest.log <<'LOG'
1/3 Testing: test_peer
1/3 Test: test_peer
Output:
----------------------------------------------------------
[ RUN      ] test_copy
skipped: fewer than two OpenCL devices
[  SKIPPED ] test_copy
[ RUN      ] test_other
[       OK ] test_other
[==========] 2 test(s) run.
[  PASSED  ] 1 test(s).
[  SKIPPED ] 1 test(s), listed below:
[  SKIPPED ] test_copy
<end of output>
Test Passed.
2/3 Testing: test_plain
2/3 Test: test_plain
Output:
----------------------------------------------------------
[  PASSED  ] 4 test(s).
<end of output>
Test Passed.
3/3 Testing: sample_x
3/3 Test: sample_x
Output:
----------------------------------------------------------
no second device
<end of output>
Test Passed.
LOG
cat >console.log <<'LOG'
100% tests passed, 0 tests failed out of 3

The following tests did not run:
	  3 - sample_x (Skipped)
LOG
expect() { # expect RC PATTERN CONFIG LIST-LINES...
  local rc=$1 pattern=$2 config=$3
  shift 3
  printf '%s\n' "# configuration test case reason" "$@" >expected.txt
  local got=0
  out=$(bash "$check" "$config" console.log LastTest.log expected.txt) || got=$?
  if [ "$got" != "$rc" ] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL: list [$*] for $config: exit $got (want $rc), output:"; echo "$out"; exit 1
  fi
  echo "ok: $pattern"
}
expect 0 "skips (c1): 2, as" c1 "c1 test_peer test_copy one device" "c1 sample_x - one device"
expect 0 "skips (c1): 2, as" c1 "* test_peer * one device" "c1 sample_x - one device" \
  "*? test_gpu * no GPU here (a GPU machine runs it)"
expect 1 "skipped, not expected: sample_x -" c1 "c1 test_peer test_copy one device"
expect 1 "skipped, not expected: test_peer test_copy" c1 # an empty list
expect 1 "expected, not skipped: test_plain case_a why" c1 "c1 test_peer test_copy x" \
  "c1 sample_x - x" "c1 test_plain case_a why"
expect 0 "skips (c1): 2, as" c1 "c1 test_peer test_copy x" "c1 sample_x - x" \
  "c1 test_not_run case_a a test this run did not run"
expect 1 "skipped, not expected: test_peer test_copy" c2 "c1 test_peer test_copy x" \
  "c1 sample_x - x"
echo "check_skips.sh: all cases as expected"
