#!/usr/bin/env bash
# deps.sh — installs the Debian 12 packages clpar needs to build, test and run on PoCL, when
# they are missing. Sourced by test.sh and demo.sh; runs apt-get as root (or through sudo).
# OpenBLAS's OpenMP build (the host backend's GEMM): its threads are the OpenMP threads the host
# backend's own loops use, where the pthread build would add a second pool of spinning threads.
# libdnnl-dev: oneDNN, the host backend's convolutions (its Debian build threads with OpenMP too).
# iproute2: `ip`, with which tests/ddp_netns.sh makes two network namespaces into two hosts.
# strace: tests/sample_line_writes.sh traces how each rank writes its lines.
# jq and gnuplot-nox (gnuplot without X11): scripts/plot_pipeline.sh and the training samples'
# --loss-plot draw their PNGs with them.
clpar_deps=(build-essential cmake pkg-config binutils ocl-icd-opencl-dev opencl-headers
  pocl-opencl-icd libclblast-dev libcmocka-dev libjansson-dev zlib1g-dev clinfo clang libclang-rt-14-dev
  libopenblas-dev libopenblas-openmp-dev libdnnl-dev openmpi-bin libopenmpi-dev iproute2 strace jq gnuplot-nox)

clpar_install_deps() {
  local missing=()
  for p in "${clpar_deps[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; return 1; }
    sudo=sudo
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Configures and builds into $1 with the remaining arguments as CMake options.
clpar_build() {
  local dir=$1
  shift
  mkdir -p "$dir"
  cmake -S "$CLPAR_ROOT" -B "$dir" "$@" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; return 1; }
  grep -E '^-- clpar' "$dir/configure.log" || true
  cmake --build "$dir" -j "$(nproc)" >"$dir/build.log" 2>&1 || { tail -50 "$dir/build.log"; return 1; }
  if grep -E 'warning:' "$dir/build.log" >/dev/null; then
    echo "== compiler warnings in $dir:"; grep -E 'warning:' "$dir/build.log" | sort -u | head -20
  fi
}
