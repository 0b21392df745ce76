#!/usr/bin/env bash
# demo.sh — the README's demo command: on a fresh Debian 12 machine, installs what is missing,
# builds clpar, and runs the main samples over 4 PoCL devices (or over the machine's real GPUs
# when it has some): the devices with a GEMM checked on each, PyTorch's DataParallel tutorial,
# an MLP trained with DataParallel whose weights match a one-device run, digits from a CSV file,
# a small character GPT on Shakespeare, the model-parallel tutorial's ToyModel split over two
# devices, a small ResNet training run, and DistributedDataParallel on 2 processes (mpirun).
set -euo pipefail
CLPAR_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$CLPAR_ROOT/scripts/deps.sh"
clpar_install_deps
cd "$CLPAR_ROOT"
echo "== build"
clpar_build build-demo -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLPAR_BUILD_TESTS=OFF -DCLPAR_BUILD_SAMPLES=ON
# Without a GPU, PoCL shows four CPU devices; a machine with GPUs uses them (GPUs come first).
# PoCL's "basic" devices each run in the host thread that drives them, so four of them really
# run at once (its "pthread" devices share one pool of workers and take turns).
# Whether there is a GPU is read from each device's type (CL_DEVICE_TYPE_GPU), never from names:
# a CPU device's name carries its vendor's ("pthread-znver3-AMD EPYC 7763"), which once made an
# EPYC machine count as one with a GPU and run the whole demo on one device.
opencl_has_gpu() {
  clinfo --raw 2>/dev/null | grep -E '^\[[^]]*\][[:space:]]+CL_DEVICE_TYPE[[:space:]]' |
    grep -q 'CL_DEVICE_TYPE_GPU'
}
if ! opencl_has_gpu; then
  export POCL_DEVICES=${POCL_DEVICES:-"basic basic basic basic"}
fi
echo "== samples/devices (POCL_DEVICES=${POCL_DEVICES:-unset}, CLPAR_DEVICES=${CLPAR_DEVICES:-unset})"
./build-demo/samples/devices 256
echo
echo "== samples/data_parallel (PyTorch's DataParallel tutorial)"
./build-demo/samples/data_parallel
echo
echo "== samples/train_data_parallel (an MLP trained with DataParallel, then on one device)"
./build-demo/samples/train_data_parallel 3
echo
echo "== samples/train_digits (the UCI handwritten digits from gzip CSV, DataParallel, a checkpoint per epoch)"
ckpt_dir=$(mktemp -d)
./build-demo/samples/train_digits --epochs 30 --checkpoint "$ckpt_dir/digits.safetensors"
echo
echo "== samples/train_gpt, tiny (a character GPT on Shakespeare, DataParallel; nanoGPT's CPU run: ./build-demo/samples/train_gpt)"
./build-demo/samples/train_gpt --iters 200 --layers 2 --heads 4 --width 64 --block 32 --batch 16 \
  --warmup 20 --eval-interval 100 --log-interval 50 --sample-len 200 --data-parallel \
  --ckpt "$ckpt_dir/gpt.safetensors"
rm -rf "$ckpt_dir"
echo
echo "== samples/model_parallel (the model-parallel tutorial's ToyModel: net1 on one device, net2 on another)"
./build-demo/samples/model_parallel
echo
echo "== samples/resnet50, small (torchvision's ResNet-18, 8 images of 3x32x32; the tutorial's full run: ./build-demo/samples/resnet50)"
./build-demo/samples/resnet50 --model resnet18 --batch 8 --image-size 32 --classes 10
echo
echo "== samples/ddp (DistributedDataParallel: 2 processes under mpirun, one device each)"
if [ -x build-demo/samples/ddp ] && command -v mpirun >/dev/null; then
  # As root, Open MPI runs only with its two opt-ins. Each rank drives one PoCL "basic" device
  # with one thread, so the two ranks share the cores evenly (on GPUs, rank r takes GPU r).
  if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  POCL_DEVICES=basic POCL_MAX_PTHREAD_COUNT=1 mpirun --oversubscribe -np 2 ./build-demo/samples/ddp 100
else
  echo "(not built here: clpar found no MPI; scripts/deps.sh installs Open MPI)"
fi
