#!/usr/bin/env bash
# Checks that ckpt installs and can be used the three ways docs/library.md describes:
#   1. cmake --install into a temporary prefix (library, headers, CLI, CMake package, ckpt.pc);
#   2. tests/consumer built with find_package(ckpt CONFIG REQUIRED) against that prefix, and run;
#   3. tests/consumer/main.cc built with plain c++ and `pkg-config --cflags --static --libs ckpt`;
#   4. ckpt as an add_subdirectory() subproject of a throwaway project: only the library is
#      configured and built (no tests, no CLI, no GoogleTest), and a program links ckpt::ckpt.
# Usage: scripts/check-install.sh [BUILD_DIR]
#   BUILD_DIR: an existing ckpt build folder to install from (brought up to date first);
#   without it a fresh one is configured in the temporary folder.
# CKPT_SUBPROJECT_BUILD=0 configures the subproject (4) without building it.
# Temporaries live in one mktemp folder, removed on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
cxx=${CXX:-c++}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-install-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() { echo "check-install: $*"; }
fail() { echo "check-install: FAILED: $*" >&2; exit 1; }

# --- 1. install ------------------------------------------------------------------------------
if [ $# -ge 1 ]; then
  build=$(cd "$1" && pwd)
  [ -f "$build/CMakeCache.txt" ] || fail "$1 is not a configured CMake build folder"
  step "building $build"
  cmake --build "$build" -j "$jobs" >/dev/null
else
  build=$tmp/build
  step "configuring a fresh build in $build"
  cmake -S "$root" -B "$build" "${gen[@]}" -DCKPT_BUILD_TESTS=OFF >/dev/null
  cmake --build "$build" -j "$jobs" >/dev/null
fi
prefix=$tmp/prefix
step "installing into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

pc=$(find "$prefix" -name ckpt.pc -path '*/pkgconfig/*' | head -n 1)
config=$(find "$prefix" -name ckptConfig.cmake | head -n 1)
[ -n "$pc" ] || fail "no ckpt.pc installed"
[ -n "$config" ] || fail "no ckptConfig.cmake installed"
for f in ckptConfigVersion.cmake ckptTargets.cmake; do
  [ -f "$(dirname "$config")/$f" ] || fail "no $f beside ckptConfig.cmake"
done
libdir=$(dirname "$(dirname "$pc")")
ls "$libdir"/libckpt.a "$libdir"/libckpt.so >/dev/null 2>&1 ||
  [ -n "$(find "$libdir" -maxdepth 1 -name 'libckpt*')" ] || fail "no libckpt in $libdir"
[ -f "$prefix/include/ckpt/ckpt.h" ] || fail "no include/ckpt/ckpt.h installed"
extra=$(find "$prefix/include" -mindepth 1 -maxdepth 1 ! -name ckpt)
[ -z "$extra" ] || fail "more than include/ckpt installed: $extra"
if grep -q '^CKPT_BUILD_CLI:BOOL=ON' "$build/CMakeCache.txt" &&
   ! grep -q '^CKPT_FUZZ:BOOL=ON' "$build/CMakeCache.txt"; then
  [ -x "$prefix/bin/ckpt" ] || fail "no bin/ckpt installed"
  "$prefix/bin/ckpt" --version >/dev/null || fail "the installed bin/ckpt does not run"
fi
step "installed: $(cd "$prefix" && find . -type f | sed 's|^\./||' | grep -v '^include/' | sort | tr '\n' ' ')+ include/ckpt/*.h"

# --- 2. find_package(ckpt) -------------------------------------------------------------------
step "consumer with find_package(ckpt CONFIG REQUIRED)"
cmake -S "$root/tests/consumer" -B "$tmp/consumer-cmake" "${gen[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/consumer-cmake" >/dev/null
if grep -rqsF -e "$root/include" -e "$root/src" "$tmp/consumer-cmake/build.ninja" \
     "$tmp/consumer-cmake/CMakeFiles" "$tmp/consumer-cmake/compile_commands.json"; then
  fail "the consumer was compiled against the source tree, not the install"
fi
out=$("$tmp/consumer-cmake/consumer")
[ "$out" = OK ] || fail "consumer (CMake) printed: $out"

# --- 3. pkg-config --static ------------------------------------------------------------------
step "consumer with $cxx and pkg-config --static"
flags=$(PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --cflags --static --libs ckpt)
step "  pkg-config: $flags"
# shellcheck disable=SC2086  # the flags are words
"$cxx" -std=c++20 "$root/tests/consumer/main.cc" -o "$tmp/consumer-pc" $flags
out=$(LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/consumer-pc")  # if shared
[ "$out" = OK ] || fail "consumer (pkg-config) printed: $out"

# --- 4. add_subdirectory(ckpt) ---------------------------------------------------------------
step "ckpt as an add_subdirectory() subproject"
mkdir -p "$tmp/sub"
cat > "$tmp/sub/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.22)
project(ckpt_subproject LANGUAGES CXX)
add_subdirectory("$root" ckpt)
foreach(t ckpt_cli base_tests zip_tests pickle_tests fmt_tests load_tests device_tests api_tests
          convert_tests ranks_tests ckpt_tests)
  if(TARGET \${t})
    message(FATAL_ERROR "the ckpt subproject defines \${t}")
  endif()
endforeach()
if(NOT TARGET ckpt::ckpt)
  message(FATAL_ERROR "the ckpt subproject defines no ckpt::ckpt")
endif()
add_executable(consumer "$root/tests/consumer/main.cc")
target_link_libraries(consumer PRIVATE ckpt::ckpt)
EOF
# GoogleTest made unfindable: the subproject must not look for it.
cmake -S "$tmp/sub" -B "$tmp/sub-build" "${gen[@]}" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON \
  > "$tmp/sub-configure.log" 2>&1 || { cat "$tmp/sub-configure.log" >&2; fail "subproject configure"; }
if [ "${CKPT_SUBPROJECT_BUILD:-1}" != 0 ]; then
  cmake --build "$tmp/sub-build" -j "$jobs" >/dev/null
  built=$(find "$tmp/sub-build/ckpt" -type f -perm -u+x ! -name '*.so*' | grep -v CMakeFiles || true)
  [ -z "$built" ] || fail "the subproject built executables: $built"
  out=$("$tmp/sub-build/consumer")
  [ "$out" = OK ] || fail "consumer (subproject) printed: $out"
fi

step "OK"
