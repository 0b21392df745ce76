#!/usr/bin/env bash
# demo.sh — the README's demo command: on a fresh Debian 12 machine, installs what is missing,
# builds clpar and runs the main sample over 4 PoCL devices (or over the machine's real GPUs
# when it has some): it lists the devices and checks a GEMM on each against the host backend.
set -euo pipefail
CLPAR_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$CLPAR_ROOT/scripts/deps.sh"
clpar_install_deps
cd "$CLPAR_ROOT"
echo "== build"
clpar_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLPAR_BUILD_TESTS=OFF
# Without a GPU, PoCL shows four CPU devices; a machine with GPUs uses them (GPUs come first).
if ! clinfo -l 2>/dev/null | grep -qiE 'gpu|nvidia|amd|radeon|intel\(r\) (uhd|iris|arc)'; then
  export POCL_DEVICES=${POCL_DEVICES:-"pthread pthread pthread pthread"}
fi
echo "== samples/devices (POCL_DEVICES=${POCL_DEVICES:-unset}, CLPAR_DEVICES=${CLPAR_DEVICES:-unset})"
./build/samples/devices "${1:-512}"
echo
echo "== samples/train_mlp (an MLP classifier trained on the first device)"
./build/samples/train_mlp 200
