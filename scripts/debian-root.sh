#!/usr/bin/env bash
# Creates (once per machine) a minimal Debian 12 root for scripts/check-wheels.sh and prints
# its path: debootstrap --variant=minbase bookworm with python3, python3-venv and python3-numpy
# (1.24) only (no compiler, no torch, none of ckpt's libraries),
# in ${CKPT_PEERS_ROOT:-~/.cache/ckpt}/debian-bookworm-minbase-<hash>
# (root-owned; <hash> of this script's settings, so a changed package list makes a new root).
# Built under a temporary name and renamed when complete. Needs root (sudo) and debootstrap.
# Usage: scripts/debian-root.sh [--path]
set -euo pipefail
suite=bookworm
mirror=${CKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
include=python3,python3-venv,python3-numpy
root_dir="${CKPT_PEERS_ROOT:-$HOME/.cache/ckpt}"
hash=$(echo "$suite minbase $include" | sha256sum | cut -c1-16)
dir="$root_dir/debian-$suite-minbase-$hash"
if [ "${1:-}" = "--path" ]; then echo "$dir"; exit 0; fi
if [ -x "$dir/usr/bin/python3" ] && [ -f "$dir/.complete" ]; then echo "$dir"; exit 0; fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
command -v debootstrap >/dev/null || "$(dirname "$0")/install-deps.sh" debootstrap >&2
mkdir -p "$root_dir"
tmp="$dir.tmp.$$"
trap '$SUDO rm -rf --one-file-system "$tmp"' EXIT
echo "debian-root: creating $dir (debootstrap $suite, about 150 MB, once per machine)" >&2
$SUDO debootstrap --variant=minbase --include="$include" "$suite" "$tmp" "$mirror" >&2
$SUDO mv "$tmp" "$dir"
trap - EXIT
$SUDO touch "$dir/.complete"
echo "$dir"
