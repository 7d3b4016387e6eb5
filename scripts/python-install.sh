#!/usr/bin/env bash
# Installs the Python module and the `ckpt` command for PYTHON (default: Debian's /usr/bin/python3)
# without reaching a package index: `make python-install`.
#
# The build backend is scikit-build-core (pyproject.toml), which Debian 12 does not package, so
# the wheel is built by the peer venv (scripts/install-peers.sh: its interpreter is a venv of
# /usr/bin/python3, with scikit-build-core and pybind11), without build isolation and with
# --no-index; then PYTHON's pip installs that wheel, again with --no-index. Only the first
# install-peers.sh on a machine downloads (from PyPI); after it, nothing is.
# For /usr/bin/python3, pip needs --break-system-packages (PEP 668): it installs into
# /usr/local/lib/python3.11/dist-packages, which Debian leaves for local installs, and the
# command into /usr/local/bin/ckpt.
# Usage: scripts/python-install.sh [PYTHON]. CMAKE_ARGS and CMAKE_BUILD_PARALLEL_LEVEL reach CMake.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${1:-/usr/bin/python3}
peers=$("$root/scripts/install-peers.sh")
# The wheel's tag (cp311) must be one PYTHON accepts: the peer venv's interpreter must match.
want=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
have=$("$peers/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$want" != "$have" ]; then
  echo "python-install: $py is Python $want but the peer venv is $have: use" \
       "$py -m pip install . (build isolation, from PyPI) instead" >&2
  exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-python-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "python-install: building the wheel with $peers/bin/python (no index, no isolation)"
"$peers/bin/python" -m pip wheel -v --no-build-isolation --no-index --no-deps -w "$tmp" "$root"
echo "python-install: installing $(basename "$tmp"/ckpt_io-*.whl) for $py"
"$py" -m pip install --no-index --no-deps --force-reinstall --break-system-packages \
  "$tmp"/ckpt_io-*.whl
