#!/bin/bash
# Packs what tests/gpu/run.sh needs on a GPU machine that has none of our Debian libraries:
# the CLI, the shared libraries it links (as ldd lists them, less the C runtime), the static
# library and DLPack's header (to build the Python module there against its own Python).
# Usage (here, after a build): tests/gpu/pack.sh [BUILD] -> build-gpu/ (ignored by git; `carry` it).
set -euo pipefail
BUILD=${1:-build}
OUT=build-gpu
rm -rf "$OUT" && mkdir -p "$OUT/lib" "$OUT/include/dlpack"
cp "$BUILD/ckpt" "$OUT/" && strip --strip-debug "$OUT/ckpt"  # the carry limit is 64 MiB
ldd "$BUILD/ckpt" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|libresolv.so*|ld-linux*) ;;
    *) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
# The module is built there: the library (position-independent objects) and the headers it needs.
if [ -f "$BUILD/libckpt.a" ]; then cp "$BUILD/libckpt.a" "$OUT/" && strip --strip-debug "$OUT/libckpt.a"; fi
cp /usr/include/dlpack/dlpack.h "$OUT/include/dlpack/"
du -sh "$OUT"
