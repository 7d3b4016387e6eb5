#!/usr/bin/env bash
# Compares the functions libckpt_c.so exports with the list in the tree (capi/ckpt_c.symbols):
# an accidental export (a C++ symbol leaking through) or a removal fails.
# Usage: scripts/check-c-symbols.sh LIBCKPT_C_SO [LIST]
set -euo pipefail
lib="$1"
list="${2:-$(cd "$(dirname "$0")/.." && pwd)/capi/ckpt_c.symbols}"
actual="$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | sed 's/@.*//' | sort -u)"
expected="$(grep -v '^#' "$list" | sort -u)"
if [ "$actual" != "$expected" ]; then
  echo "check-c-symbols: $lib exports differ from $list (< exported, > listed):" >&2
  diff <(echo "$actual") <(echo "$expected") >&2 || true
  exit 1
fi
echo "check-c-symbols: $(echo "$actual" | wc -l) symbols, as listed"
