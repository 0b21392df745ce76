#!/usr/bin/env bash
# install_consumer.sh BUILD_DIR WORK_DIR CONSUMER_SRC — installs the built library into a
# fresh prefix, then builds tests/consumer against the installed copy three times (a C and a
# C++-only project through find_package, and the README's pkg-config line) and runs each
# without LD_LIBRARY_PATH. Run by ctest as "install_consumer".
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

# The programs run with no LD_LIBRARY_PATH: each must find libclpar.so.0 in the custom prefix
# by the run path its build line gave it, as a user's program does.
unset LD_LIBRARY_PATH

echo "== find_package(clpar), C project"
cmake -S "$src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake-configure.log"
cmake --build "$work/cmake-build" >"$work/cmake-build.log"
"$work/cmake-build/consumer"

# A C++-only project: find_package(clpar) must not need a C compiler or MPI (private
# dependencies of the shared library).
echo "== find_package(clpar), C++-only project"
if ! cmake -S "$src/cxx" -B "$work/cmake-build-cxx" -DCMAKE_PREFIX_PATH="$prefix" \
    >"$work/cmake-configure-cxx.log" 2>&1; then
  cat "$work/cmake-configure-cxx.log"; exit 1
fi
cmake --build "$work/cmake-build-cxx" >"$work/cmake-build-cxx.log"
"$work/cmake-build-cxx/consumer_cxx"
mpi_lines=$(grep -n MPI "$libdir/cmake/clpar/"*.cmake | grep -v ':[0-9]*:[[:space:]]*#' || true)
if [ -n "$mpi_lines" ]; then echo "the installed CMake package names MPI:"; echo "$mpi_lines"; exit 1; fi

echo "== pkg-config clpar"
export PKG_CONFIG_PATH=$libdir/pkgconfig
echo "pkg-config --modversion clpar: $(pkg-config --modversion clpar)"
# The compile flags are the installed headers' directory and nothing else (no MPI or other
# private dependency's include paths).
cflags=$(pkg-config --cflags clpar)
echo "pkg-config --cflags clpar: $cflags"
for flag in $cflags; do
  case $flag in
    -I*) [ "$(cd "${flag#-I}" && pwd -P)" = "$(cd "$prefix/include" && pwd -P)" ] ||
      { echo "pkg-config --cflags clpar names $flag, not the installed headers"; exit 1; } ;;
    *) echo "pkg-config --cflags clpar has $flag"; exit 1 ;;
  esac
done
# The README's line, word for word but for the file names: the run path makes the program
# start from the custom prefix without LD_LIBRARY_PATH.
cd "$work"
cp "$src/consumer.c" app.c
cc app.c $(pkg-config --cflags --libs clpar) -Wl,-rpath,$(pkg-config --variable=libdir clpar)
./a.out
echo "installed library consumed all three ways"
