#!/usr/bin/env bash
# Creates (once per machine) the torch 2.x peer venv from tests/peers/requirements.txt and prints
# its path. The venv lives outside the clone, in ${CKPT_PEERS_ROOT:-~/.cache/ckpt}/peers-<hash>,
# keyed by the hash of the pinned requirements, so a fresh clone (CI) reuses it and a changed pin
# makes a new one. Idempotent: an existing complete venv is reused without touching the network.
# It is built under a temporary name and renamed when complete, so an interrupted install leaves
# no half venv that a later run would take for a good one.
# Usage: scripts/install-peers.sh [--path] [--on VENV] [REQUIREMENTS [NAME]]: another pinned set
# into NAME-<hash>; --path prints where the venv is (or will be) and installs nothing
# (scripts/check-wheel.sh: torch and numpy alone, the pins of this tier, as torch-only-<hash>).
# --on VENV layers the new venv on an existing one instead of installing the set whole: made with
# VENV's base interpreter, it sees VENV's site-packages through one .pth (site.addsitedir), and
# REQUIREMENTS is installed with --no-deps (so it lists what VENV lacks, pinned); the hash covers
# VENV's path too (tests/peers/megatron.txt: megatron-core on the peers, as megatron-<hash>).
set -euo pipefail
path_only=0
base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --path) path_only=1; shift ;;
    --on) base="$2"; shift 2 ;;
    *) break ;;
  esac
done
here="$(cd "$(dirname "$0")/.." && pwd)"
req="${1:-$here/tests/peers/requirements.txt}"
name="${2:-peers}"
root="${CKPT_PEERS_ROOT:-$HOME/.cache/ckpt}"
hash="$({ cat "$req"; [ -z "$base" ] || echo "on $base"; } | sha256sum | cut -c1-16)"
venv="$root/$name-$hash"
if [ "$path_only" = 1 ]; then echo "$venv"; exit 0; fi
if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
  echo "$venv"; exit 0
fi
mkdir -p "$root"
tmp="$venv.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
if [ -n "$base" ]; then
  [ -x "$base/bin/python" ] && [ -f "$base/.complete" ] ||
    { echo "install-peers: $base is not a complete venv (make it first)" >&2; exit 1; }
  echo "install-peers: creating $venv ($req on $base)" >&2
  "$("$base/bin/python" -c 'import sys; print(sys._base_executable)')" -m venv "$tmp" >&2
  site="$("$tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  base_site="$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  echo "import site; site.addsitedir('$base_site')" > "$site/$(basename "$base").pth"
  "$tmp/bin/python" -m pip install -q --progress-bar off --no-deps -r "$req" >&2
else
  echo "install-peers: creating $venv (torch 2.x from PyPI: several GB, once per machine)" >&2
  # Debian's interpreter (the one python3-dev and the Debian build of the module match).
  /usr/bin/python3 -m venv "$tmp" >&2
  "$tmp/bin/python" -m pip install -q --upgrade pip >&2
  "$tmp/bin/python" -m pip install --progress-bar off -r "$req" >&2
fi
# Built under a temporary name, then renamed: the console scripts pip wrote name the
# interpreter by that path, so their first lines are rewritten to the final one.
mv "$tmp" "$venv"
trap - EXIT
grep -rlI --exclude-dir=__pycache__ "$tmp" "$venv/bin" 2>/dev/null | xargs -r sed -i "s#$tmp#$venv#g"
touch "$venv/.complete"
echo "$venv"
