#!/usr/bin/env bash
# run.sh — on a GPU machine, from the root of a copy of this repository with the bundle of
# tools/gpu/bundle.sh in it: the ctest suite on each CUDA device and each NVIDIA OpenCL GPU
# against the host (as scripts/test-gpu.sh, without building), the MPI tests with both ranks
# on cuda:0 (NCCL's one-rank path, and its refusal of two ranks on one GPU), the Linear tests
# on cuda:0 with CLPAR_CUDA_LT=1 and CLPAR_CUDA_XENT=1 (cuBLASLt's epilogue, the fused
# cross-entropy), the autocast tests on cuda:0 with
# CLPAR_CUDA_HALF_GEMM=1 (cublasGemmEx), then the GPU benchmarks. Logs go to
# $OUT (or /tmp/gpu-logs); a summary to stdout.
#
#   tools/gpu/run.sh [BUNDLE.tar.xz]      # default .gpu/bundle.tar.xz
set -uo pipefail
R=$PWD; bundle=${1:-.gpu/bundle.tar.xz}; L=${OUT:-/tmp/gpu-logs}; mkdir -p "$L"
S=$(mktemp -d); tar -xJf "$bundle" -C "$S" || exit 1
# the test files name the binaries by the absolute path of the tree they were built in
built=$(sed -n 's/^add_test([^ ]* "\(.*\)\/build\/tests\/.*/\1/p' "$S/build/tests/CTestTestfile.cmake" | head -1)
if [ "$built" != "$R" ]; then
  [ -e "$built" ] && { echo "run.sh: $built exists; run from there or move it"; exit 1; }
  mkdir -p "$(dirname "$built")" && ln -s "$R" "$built"
fi
rm -rf "$R/build"; mv "$S/build" "$R/build"
libdir() { find /usr /opt -name "$1" 2>/dev/null | head -1 | xargs -r dirname; }
nvocl=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'libnvidia-opencl.so*' -print 2>/dev/null | head -1)
mpil=; command -v mpiexec >/dev/null || mpil=$S/mpilib
export LD_LIBRARY_PATH=$S/lib:$mpil:$(libdir libcublas.so.13):$(libdir libnccl.so.2):$(libdir libcudnn.so.9)
mkdir -p "$S/icd"; echo "$nvocl" > "$S/icd/nvidia.icd"
export OCL_ICD_VENDORS=$S/icd CLPAR_CACHE_DIR=$S/kc OMP_NUM_THREADS=2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p -m 700 "$S/kc"; unset POCL_DEVICES CLPAR_DEVICES
[ -e /usr/bin/cmake ] || ln -s "$(command -v cmake)" /usr/bin/cmake # ctest's -P scripts
nvidia-smi -L; "$R/build/samples/devices" 2>&1 | head -4
gpus=$("$R/build/samples/devices" 2>/dev/null | awk '$1 ~ /^cuda:/ || ($1 ~ /^opencl:/ && $2 == "GPU") {print $1}')
suite() { # suite NAME CLPAR_DEVICES SECONDS ctest-args...: one ctest run in a tree of its own
  local n=$1 d=$2 t=$3; shift 3; local w=$S/ct-$n
  for s in . tests bench samples; do mkdir -p "$w/$s"; cp "$R/build/$s/CTestTestfile.cmake" "$w/$s/"; done
  (cd "$w" && CLPAR_DEVICES=$d timeout "$t" ctest --timeout 200 --output-on-failure "$@" >"$L/ctest-$n.log" 2>&1)
  echo "== $n (CLPAR_DEVICES=$d): rc $? $(grep -h 'tests passed' "$L/ctest-$n.log")"
  grep -hE '\((Failed|Timeout|SEGFAULT|Subprocess)' "$L/ctest-$n.log" | head -20; }
for g in $gpus; do suite "${g/:/}" "host,$g" "${SUITE_S:-300}" -LE "install|mpi" -j8 & done; wait
command -v mpiexec >/dev/null && echo "$gpus" | grep -q '^cuda:0$' && suite mpi cuda:0 150 -L mpi -j6
# a Linear's bias and ReLU in cuBLASLt's epilogue (CLPAR_CUDA_LT=1) and the fused cross-entropy
# (CLPAR_CUDA_XENT=1): the tests that run Linear layers and losses, again with both on
# (test_cuda_lt turns the first on itself and ran above)
echo "$gpus" | grep -q '^cuda:0$' && (export CLPAR_CUDA_LT=1 CLPAR_CUDA_XENT=1; suite cuda0-lt \
  host,cuda:0 200 -j4 \
  -R '^test_(cuda_lt|linear_fused|linear_backward|xent_fused|layers|module|graph|graph_gpt)$')
# autocast's forward GEMMs on the 16-bit operands through cublasGemmEx (CLPAR_CUDA_HALF_GEMM=1):
# the autocast, AMP and mixed-precision tests again with it on
echo "$gpus" | grep -q '^cuda:0$' && (export CLPAR_CUDA_HALF_GEMM=1; suite cuda0-half \
  host,cuda:0 200 -R '^test_(autocast_gemm|autocast|autocast_conv|amp|amp_parallel|half)$' -j4)
cd "$R/build/bench"
b() { echo "== $*"; timeout 60 env "$@" 2>&1 | grep '^{' | tail -2; }
for g in $gpus; do
  b CLPAR_DEVICES=$g ./bench_train_step 0 10 --model resnet50 --rounds 3 --no-torch
  b CLPAR_DEVICES=$g ./bench_graph 20 5 --model resnet50
  b CLPAR_DEVICES=$g ./bench_graph 50 5
  b CLPAR_DEVICES=$g ./bench_conv 0 16 64
  # OpenCL: the forward's per-shape choice (auto, above) against CLBlast's convgemm forced
  case $g in opencl:*) b CLPAR_DEVICES=$g CLPAR_OCL_CONV=convgemm ./bench_conv 0 16 64;; esac
done
if echo "$gpus" | grep -q '^cuda:0$'; then
  # cuDNN's step is slower than im2col + cuBLAS: host_ms_per_step tells whether its calls are
  # host-bound (the worker posting slower than the GPU runs)
  b CLPAR_DEVICES=cuda:0 CLPAR_CUDA_CUDNN=1 ./bench_train_step 0 10 --model resnet50 --rounds 3 --no-torch
  b CLPAR_DEVICES=cuda:0 CLPAR_CUDA_CUDNN=1 ./bench_graph 20 5 --model resnet50
  # clpar's cuDNN path against cuDNN called directly ("pass": "cudnn" lines of bench_conv)
  b CLPAR_DEVICES=cuda:0 CLPAR_CUDA_CUDNN=1 ./bench_conv 0 16 64
  # cuBLASLt's epilogue against SGEMM then bias_act: the MLP 784-1024-1024-10 step without and
  # with CLPAR_CUDA_LT=1, and the latency-bound MLP (48 Linear + ReLU; without it: above)
  b CLPAR_DEVICES=cuda:0 ./bench_train_step 0 20 --no-torch
  b CLPAR_DEVICES=cuda:0 CLPAR_CUDA_LT=1 ./bench_train_step 0 20 --no-torch
  b CLPAR_DEVICES=cuda:0 CLPAR_CUDA_LT=1 ./bench_graph 50 5
  echo "== PyTorch, the same ResNet-50 step on cuda (bench/torch_step.py)"
  timeout 120 python3 "$R/bench/torch_step.py" --model resnet50 --device cuda --steps 10 \
    --rounds 3 2>&1 | tail -1
fi
# open: test_pipeline_resnet on NVIDIA's OpenCL with oneDNN on the host did not finish in 250 s
for g in $gpus; do
  case $g in opencl:*)
    echo "== test_pipeline_resnet, CLPAR_DEVICES=host,$g, 120 s"
    (cd "$R/build/tests" && CLPAR_DEVICES=host,$g CLPAR_LOG_LEVEL=debug timeout 120 \
      ./test_pipeline_resnet >"$L/pipeline_resnet-${g/:/}.log" 2>&1; echo "rc $?")
    tail -3 "$L/pipeline_resnet-${g/:/}.log";;
  esac
done
true
