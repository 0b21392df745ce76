#!/usr/bin/env bash
# test-gpu.sh — for a machine with GPUs: installs what is missing (Debian 12, as test.sh),
# builds clpar with the CUDA module where the CUDA toolkit is found (cuBLAS, NCCL), runs the
# test suite with each CUDA device and each GPU OpenCL device (AMD, Intel, NVIDIA) against the
# host backend, then the GEMM, convolution and ResNet-50 training-step benchmarks on each of
# them. Says what it skipped and why. Logs and the benchmarks' JSON go to build-gpu/gpu-logs.
#
#   scripts/test-gpu.sh            # every GPU clpar finds
#   CUDA toolkit: /usr/local/cuda (or CUDAToolkit_ROOT); OpenCL GPUs: their vendor's ICD.
set -uo pipefail
CLPAR_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$CLPAR_ROOT/scripts/deps.sh"
clpar_install_deps || exit 1
cd "$CLPAR_ROOT"
unset CLPAR_DEVICES POCL_DEVICES
export CLPAR_CACHE_DIR=${CLPAR_CACHE_DIR:-$CLPAR_ROOT/build-gpu/kernel-cache}
B=${CLPAR_GPU_BUILD:-build-gpu}
LOGS=$B/gpu-logs

echo "== build with the CUDA module where the toolkit is found ($B)"
clpar_build "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLPAR_BUILD_TESTS=ON \
  -DCLPAR_BUILD_SAMPLES=ON -DCLPAR_BUILD_BENCH=ON || exit 1
mkdir -p "$LOGS"

# The GPUs clpar sees: cuda:N, and opencl:N whose type is GPU (samples/devices lists them).
gpus=$("./$B/samples/devices" 2>/dev/null | awk '$1 ~ /^cuda:/ || ($1 ~ /^opencl:/ && $2 == "GPU") {print $1}')
if [ -z "$gpus" ]; then
  echo "== no GPU: clpar found no CUDA device and no OpenCL GPU; nothing to run"
  "./$B/samples/devices" 2>&1 | head -5
  [ -x "$B/tests/test_cuda" ] || echo "   (the CUDA module was not built: no CUDA toolkit found)"
  exit 0
fi
echo "== GPUs: $(echo $gpus)"

failed=0
for dev in $gpus; do
  echo
  echo "== ctest on $dev, the host backend as the reference (CLPAR_DEVICES=host,$dev)"
  # mpi: one rank per device needs as many devices (test_ddp_nccl runs under ctest -L mpi);
  # install: device-independent.
  if (cd "$B" && CLPAR_DEVICES=host,$dev ctest -LE "install|mpi" --output-on-failure \
      >"../$LOGS/ctest-${dev/:/-}.log" 2>&1); then
    tail -1 "$LOGS/ctest-${dev/:/-}.log"
  else
    failed=1
    grep -E "tests passed|\(Failed\)" "$LOGS/ctest-${dev/:/-}.log"
  fi
done

echo
echo "== benchmarks (JSON in $LOGS)"
for dev in $gpus; do
  f=$LOGS/bench-${dev/:/-}.json
  CLPAR_DEVICES=$dev "./$B/bench/bench_gemm" 0 4096x4096x4096:nn 256x2304x256:nt >"$f" 2>&1
  CLPAR_DEVICES=$dev "./$B/bench/bench_conv" 0 16 64 >>"$f" 2>&1
  CLPAR_DEVICES=$dev "./$B/bench/bench_train_step" 0 10 --model resnet50 --rounds 3 --no-torch >>"$f" 2>&1
  echo "$dev: $(grep -h '"shape": "total"' "$f" | head -1)"
  echo "$dev: $(grep -h '"bench": "train_step"' "$f" | head -1)"
done
if command -v mpirun >/dev/null && [ "$(echo "$gpus" | grep -c '^cuda:')" -ge 2 ]; then
  echo
  echo "== NCCL: DistributedDataParallel on 2 CUDA devices (ctest -R test_ddp_nccl)"
  (cd "$B" && ctest -R test_ddp_nccl --output-on-failure) || failed=1
else
  echo "== skipped: DDP over NCCL needs mpirun and two CUDA devices"
fi
exit $failed
