"""Writes the GPU benchmark's checkpoints: N GiB of 4 MiB float32 tensors (1024 x 1024), as
torch.save (.pt) and safetensors (.safetensors) files (only the latter with --safetensors-only).
Usage: make_files.py DIR GIB [GIB ...] [--safetensors-only]"""
import os, sys
import torch
from safetensors.torch import save_file

args = [a for a in sys.argv[1:] if a != "--safetensors-only"]
only_st = len(args) < len(sys.argv) - 1
out = args[0]
os.makedirs(out, exist_ok=True)
for gib in map(int, args[1:]):
    g = torch.Generator().manual_seed(gib)
    sd = {f"layers.{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(gib * 256)}
    if not only_st:
        torch.save(sd, os.path.join(out, f"m{gib}.pt"))
    save_file(sd, os.path.join(out, f"m{gib}.safetensors"))
    print(f"wrote {gib} GiB as " + ("" if only_st else f"m{gib}.pt and ") + f"m{gib}.safetensors",
          flush=True)
