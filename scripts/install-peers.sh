#!/usr/bin/env bash
# Creates (once per machine) the torch 2.x peer venv from tests/peers/requirements.txt and prints
# its path. The venv lives outside the clone, in ${CKPT_PEERS_ROOT:-~/.cache/ckpt}/peers-<hash>,
# keyed by the hash of the pinned requirements, so a fresh clone (CI) reuses it and a changed pin
# makes a new one. Idempotent: an existing complete venv is reused without touching the network.
# It is built under a temporary name and renamed when complete, so an interrupted install leaves
# no half venv that a later run would take for a good one.
# Usage: scripts/install-peers.sh [--path] [REQUIREMENTS [NAME]]: another pinned set into NAME-<hash>;
# --path prints where the venv is (or will be) and installs nothing
# (scripts/check-wheel.sh: torch and numpy alone, the pins of this tier, as torch-only-<hash>).
set -euo pipefail
path_only=0
if [ "${1:-}" = "--path" ]; then path_only=1; shift; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
req="${1:-$here/tests/peers/requirements.txt}"
name="${2:-peers}"
root="${CKPT_PEERS_ROOT:-$HOME/.cache/ckpt}"
hash="$(sha256sum "$req" | cut -c1-16)"
venv="$root/$name-$hash"
if [ "$path_only" = 1 ]; then echo "$venv"; exit 0; fi
if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
  echo "$venv"; exit 0
fi
mkdir -p "$root"
tmp="$venv.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
echo "install-peers: creating $venv (torch 2.x from PyPI: several GB, once per machine)" >&2
# Debian's interpreter (the one python3-dev and the Debian build of the module match).
/usr/bin/python3 -m venv "$tmp" >&2
"$tmp/bin/python" -m pip install -q --upgrade pip >&2
"$tmp/bin/python" -m pip install --progress-bar off -r "$req" >&2
# Built under a temporary name, then renamed: the console scripts pip wrote name the
# interpreter by that path, so their first lines are rewritten to the final one.
mv "$tmp" "$venv"
trap - EXIT
grep -rlI --exclude-dir=__pycache__ "$tmp" "$venv/bin" 2>/dev/null | xargs -r sed -i "s#$tmp#$venv#g"
touch "$venv/.complete"
echo "$venv"
