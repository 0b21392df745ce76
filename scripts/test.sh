#!/usr/bin/env bash
# test.sh — the README's test command: on a fresh Debian 12 machine, installs what is missing,
# builds clpar, and runs the whole ctest suite on PoCL with 1 device, on PoCL with 4 devices,
# on the host backend, and in an AddressSanitizer + UndefinedBehaviorSanitizer build (there
# the DistributedDataParallel tests too, without leak checks); between them it fuzzes the safetensors reader for 60 s and the .npy reader for 30 s (scripts/fuzz.sh).
# Stops at the first configuration that fails; the last lines are ctest's own summary, or
# the skip check's.
#
# A cmocka skip() passes in ctest: after each run the skipped cases are compared with
# tests/expected_skips.txt (scripts/check_skips.sh), and a skip it does not list, or a listed
# skip that did not happen, fails the configuration. Each run_ctest names its configuration
# (skips=NAME) as that file does.
#
# The host runs select CLPAR_DEVICES=host,opencl:0 (one PoCL device), not the host alone:
# the host backend is device 0, the one every single-device test uses, and the OpenCL device
# is the second that the tests comparing a device with the host reference, and those that
# cross devices (model parallel, DataParallel, transfers), need. With the host alone they
# compared the host with itself or had no second device, and so could not fail.
set -euo pipefail
CLPAR_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$CLPAR_ROOT/scripts/deps.sh"
clpar_install_deps
cd "$CLPAR_ROOT"
unset CLPAR_DEVICES
export CLPAR_CACHE_DIR=${CLPAR_CACHE_DIR:-$CLPAR_ROOT/build/kernel-cache}

echo "== build (release with debug info)"
clpar_build build -DCLPAR_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLPAR_BUILD_TESTS=ON -DCLPAR_BUILD_SAMPLES=ON -DCLPAR_BUILD_BENCH=ON

echo
echo "== shape rules and the README's first program against this build (scripts/check_house.sh)"
bash "$CLPAR_ROOT/scripts/check_house.sh" build

run_ctest() { # skips=CONFIG run_ctest DIR TITLE [ctest args...]
  local dir=$1 title=$2
  shift 2
  echo
  echo "== ctest: $title"
  mkdir -p "$dir/Testing"
  (cd "$dir" && ctest --output-on-failure "$@" 2>&1 | tee Testing/ctest-console.log)
  bash "$CLPAR_ROOT/scripts/check_skips.sh" "${skips:?run_ctest needs skips=CONFIG}" \
    "$dir/Testing/ctest-console.log" "$dir/Testing/Temporary/LastTest.log" \
    "$CLPAR_ROOT/tests/expected_skips.txt"
}

# The DistributedDataParallel tests (label mpi) run through mpirun with one PoCL "basic"
# device per rank whatever the configuration (tests/CMakeLists.txt), so they run here and in
# the sanitizer build's last run only: the other runs would repeat them unchanged.
skips=pocl1 POCL_DEVICES=pthread run_ctest build "PoCL, 1 device (POCL_DEVICES=pthread)"
if [ -x build/tests/test_cuda ]; then
  echo
  echo "== CUDA module: built; test_cuda on this machine says:"
  cuda_out=$(./build/tests/test_cuda 2>&1 || true)
  echo "$cuda_out" | grep -m1 'no CUDA device' || true
  echo "$cuda_out" | grep -E '^\[  (SKIPPED|FAILED) *\] [0-9]+ test' || true
else
  echo
  echo "== CUDA module: not built here (see the configure line above)"
fi
skips=pocl4 POCL_DEVICES="pthread pthread pthread pthread" run_ctest build "PoCL, 4 devices" -LE "install|mpi"
skips=host CLPAR_DEVICES=host,opencl:0 POCL_DEVICES=pthread \
  run_ctest build "host backend first, one PoCL device second (CLPAR_DEVICES=host,opencl:0)" -LE "install|mpi"

echo
echo "== fuzz: the safetensors reader 60 s, the .npy reader 30 s (libFuzzer + ASan + UBSan; scripts/fuzz.sh)"
bash "$CLPAR_ROOT/scripts/fuzz.sh" 60

echo
echo "== build (ASan + UBSan)"
clpar_build build-sanitize -DCLPAR_WERROR=ON -DCMAKE_BUILD_TYPE=Debug -DCLPAR_SANITIZE=ON -DCLPAR_BUILD_TESTS=ON -DCLPAR_BUILD_SAMPLES=ON -DCLPAR_BUILD_BENCH=OFF
# intercept_tls_get_addr=0: up to GCC 13, the sanitizer runtime's __tls_get_addr interceptor
# can take a dynamic TLS block (PoCL and its LLVM use them) for a pre-2.25 glibc header when it
# happens to sit at a certain page offset, and LeakSanitizer's tracer then crashes at exit
# ("Tracer caught signal 11") after every test has passed; which runs hit it depends on the
# memory layout, so a run that hits it hits it again on retry (seen here; cause found by
# Mudlet, issue 9809 / PR 9930).
# use_sigaltstack=0: ASan gives every thread an alternate signal stack and takes it down when
# the thread ends; with the many threads PoCL and its LLVM start, a run could abort on exit in
# UnsetAlternateSignalStack after every test had passed. clpar installs no signal handlers, so
# nothing needs that stack (a stack overflow is then reported less clearly, nothing more).
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_odr_violation=0:intercept_tls_get_addr=0:use_sigaltstack=0
export LSAN_OPTIONS=suppressions=$CLPAR_ROOT/scripts/lsan.supp:print_suppressions=0:intercept_tls_get_addr=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
skips=sanitize-host CLPAR_DEVICES=host,opencl:0 POCL_DEVICES=pthread \
  run_ctest build-sanitize "sanitizers, host backend first, one PoCL device second" -LE mpi
skips=sanitize-pocl2 POCL_DEVICES="pthread pthread" run_ctest build-sanitize "sanitizers, PoCL, 2 devices" -LE mpi

# The DistributedDataParallel and ZeRO tests (label mpi) under ASan + UBSan, leak checks off:
# Open MPI keeps allocations at exit that are not ours, made in components it has unloaded by
# then, so LeakSanitizer's stacks of them end in "<unknown module>" after a frame or two and
# no suppression can name them (whole stacks need fast_unwind_on_malloc=0, many times slower);
# reads and writes of freed or unowned memory and undefined behaviour are still reported. Left
# out: test_ddp_netns (its second "host" starts the rank with a fresh environment, as ssh
# would, so without these options), test_ddp_np2_tcp (test_ddp_np2 over another transport),
# test_ddp_nccl_* (CUDA devices only).
skips=sanitize-mpi ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} \
  run_ctest build-sanitize "sanitizers, DistributedDataParallel and ZeRO (label mpi; no leak checks)" \
  -L mpi -E '^(test_ddp_netns|test_ddp_np2_tcp|test_ddp_nccl_np[0-9]+)$'
