#!/usr/bin/env bash
# bundle.sh — packs this machine's build tree (scripts/test.sh's build/, configured with the
# CUDA module) for a GPU machine that has the NVIDIA driver, CUDA 13 (cuBLAS, NCCL, cuDNN) and
# Open MPI but not Debian's libraries nor a network: the test, bench and sample binaries
# (debug info stripped), their CTestTestfile.cmake files and the shared libraries they need
# that such a machine lacks. Open MPI's own libraries go to mpilib/, used only where the
# machine has no mpiexec of its own. tools/gpu/run.sh unpacks it there.
#
#   tools/gpu/bundle.sh [OUT.tar.xz]      # default .gpu/bundle.tar.xz (.gpu is git-ignored)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu/bundle.tar.xz}
S=$(mktemp -d); trap 'rm -rf "$S"' EXIT
mkdir -p "$S/build" "$S/lib" "$S/mpilib" "$(dirname "$out")"
for d in tests bench samples; do
  mkdir -p "$S/build/$d"
  find "build/$d" -maxdepth 1 -type f \( -perm -u+x -o -name CTestTestfile.cmake -o -name '*.sh' \) \
    -exec cp -p {} "$S/build/$d/" \;
done
cp -p build/CTestTestfile.cmake "$S/build/"; cp -a build/libclpar.so* "$S/build/"
find "$S/build" -type f -exec sh -c 'file -b "$1" | grep -q ELF && strip --strip-debug "$1"' _ {} \;
base='^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libz|libudev|libmvec|libcuda|libcublas|libcublasLt|libnccl|libcudnn|ld-linux)[.-]'
deps() { for f in "$@"; do ldd "$f" 2>/dev/null; done | awk '/=>/ {print $1" "$3}' | sort -u; }
deps $(find "$S/build" -type f -perm -u+x) | while read -r n p; do
  [[ $n =~ $base ]] || cp -L "$p" "$S/lib/"; done
# Open MPI and what its plugins load: only for a machine without an MPI of its own
mpi=$(dpkg -L libopenmpi3 libpmix2 | grep '\.so$' || true)
for n in libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 libhwloc.so.15 libevent_core-2.1.so.7 \
  libevent_pthreads-2.1.so.7 $(deps $mpi | awk '{print $1}'); do
  if [ -f "$S/lib/$n" ] && ! [[ $n =~ ^(libgomp|libgfortran|libquadmath|libcudart) ]]; then mv "$S/lib/$n" "$S/mpilib/"; fi
done
tar -C "$S" -cf - . | xz -T0 -9 > "$out"
echo "$out: $(du -h "$out" | cut -f1)"
