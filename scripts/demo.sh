#!/usr/bin/env bash
# The main job on a generated sample: write a transformer-like checkpoint with ckpt's own writer,
# then list, inspect, verify and load it, and check torch reads it too.
set -euo pipefail
CKPT=${1:-build/ckpt}
DIR=${2:-demo-out}
mkdir -p "$DIR"
F="$DIR/sample.pt"
echo "== ckpt sample: a ~300 MiB transformer-like state dict (float32)"
"$CKPT" sample "$F" --size-mb 300
echo
echo "== ckpt info"
"$CKPT" info "$F"
echo
echo "== ckpt ls (first rows)"
listing=$("$CKPT" ls "$F")
printf '%s\n' "$listing" | sed -n 1,12p
echo "   ... $("$CKPT" ls --json "$F" | grep -c '"name"') tensors"
echo
echo "== ckpt verify"
"$CKPT" verify "$F"
echo
echo "== ckpt show (one tensor)"
shown=$("$CKPT" show "$F" model.norm.weight)
echo "${shown:0:300} ..."
echo
echo "== ckpt bench: load paths beside this machine's limits"
"$CKPT" bench "$F" --repeat 3
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo
  echo "== torch.load reads ckpt's file"
  /usr/bin/python3 - "$F" <<'PY'
import sys, time, warnings
warnings.filterwarnings("ignore")
import torch
t0 = time.perf_counter(); sd = torch.load(sys.argv[1]); dt = time.perf_counter() - t0
n = sum(t.numel() * t.element_size() for t in sd.values())
print(f"torch.load: {len(sd)} tensors, {n/2**20:.0f} MiB in {dt:.3f} s ({n/dt/1e9:.2f} GB/s)")
PY
fi
echo
echo "demo OK"
