"""Writes the GPU benchmark's checkpoints: N GiB of 4 MiB float32 tensors (1024 x 1024), as
torch.save (.pt) and safetensors (.safetensors) files. Usage: make_files.py DIR GIB [GIB ...]"""
import os, sys
import torch
from safetensors.torch import save_file

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for gib in map(int, sys.argv[2:]):
    g = torch.Generator().manual_seed(gib)
    sd = {f"layers.{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(gib * 256)}
    torch.save(sd, os.path.join(out, f"m{gib}.pt"))
    save_file(sd, os.path.join(out, f"m{gib}.safetensors"))
    print(f"wrote {gib} GiB as m{gib}.pt and m{gib}.safetensors", flush=True)
