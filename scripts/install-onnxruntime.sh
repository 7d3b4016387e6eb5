#!/bin/sh
# Installs onnxruntime-node 1.30.0 (the CPU library ships inside the npm package) into
# tests/peers/node_modules for the ONNX interop tests. --ignore-scripts: its post-install script
# downloads GPU extras from a host these machines cannot reach. Idempotent; exits non-zero when
# npm fails (the tests then skip with that message).
set -eu
cd "$(dirname "$0")/../tests/peers"
if [ -f node_modules/onnxruntime-node/package.json ] &&
   grep -q '"version": "1.30.0"' node_modules/onnxruntime-node/package.json; then
  exit 0
fi
command -v npm >/dev/null || "$(dirname "$0")/install-deps.sh" npm || true
command -v npm >/dev/null || { echo "install-onnxruntime: npm not found" >&2; exit 1; }
npm install --ignore-scripts --no-audit --no-fund --no-save onnxruntime-node@1.30.0 >&2
