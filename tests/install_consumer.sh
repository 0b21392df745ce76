#!/usr/bin/env bash
# install_consumer.sh BUILD_DIR WORK_DIR CONSUMER_SRC — installs the built library into a
# fresh prefix, then builds tests/consumer against the installed copy twice (through
# find_package and through pkg-config) and runs both. Run by ctest as "install_consumer".
set -euo pipefail
build=$1 work=$2 src=$3
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
libdir=$(dirname "$(find "$prefix" -name 'libclpar.so' -print -quit)")
[ -n "$libdir" ] || { echo "libclpar.so was not installed"; exit 1; }
soname=$(objdump -p "$libdir/libclpar.so" | awk '/SONAME/ {print $2}')
echo "installed $(readlink -f "$libdir/libclpar.so") (SONAME $soname)"
# No kernel sources may be needed at run time: none are installed.
if find "$prefix" -name '*.cl' | grep -q .; then echo "kernel files were installed"; exit 1; fi
# Only the public API is exported.
if nm -D --defined-only "$libdir/libclpar.so" | awk '$2 ~ /[TDB]/ {print $3}' | grep -v '^clpar_' | grep -v '^_' | grep -q .; then
  echo "symbols other than clpar_* are exported:"; nm -D --defined-only "$libdir/libclpar.so" | grep -v ' clpar_'; exit 1
fi

echo "== find_package(clpar)"
cmake -S "$src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake-configure.log"
cmake --build "$work/cmake-build" >"$work/cmake-build.log"
LD_LIBRARY_PATH=$libdir "$work/cmake-build/consumer"

echo "== pkg-config clpar"
export PKG_CONFIG_PATH=$libdir/pkgconfig
echo "pkg-config --modversion clpar: $(pkg-config --modversion clpar)"
cc -std=c11 -o "$work/consumer-pc" "$src/consumer.c" $(pkg-config --cflags --libs clpar) -lm
LD_LIBRARY_PATH=$libdir "$work/consumer-pc"
echo "installed library consumed both ways"
