#!/usr/bin/env python3
"""In-place reload of a model's weights (an evaluation loop, a weight refresh): a 1 GiB module
whose tensors already exist gets the checkpoint's values, three ways, on the same files (page
cache warm), one untimed warm-up each, then the median of --repeat runs:

  ckpt.load_into(model, f.pt)                 one call: the bytes read straight into the
                                              module's tensors (no new tensors)
  model.load_state_dict(torch.load(f.pt))     the peer: new tensors, then a copy into the module
  safetensors load_file(f.safetensors) +      the peer's fast format: new tensors, then copy_
    copy_ per tensor

    PYTHONPATH=build/python python bench/load_into.py [--size-mb 1024] [--repeat 5] [--out DIR]
        [--device cpu|cuda]
"""

import argparse
import os
import statistics
import time

import torch
from safetensors.torch import load_file, save_file

import ckpt


class Model(torch.nn.Module):
    def __init__(self, size_mb, width=4096):
        super().__init__()
        rows = size_mb * (1 << 20) // 4 // width // 64
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, rows) for _ in range(64))


def median_time(fn, repeat, sync):
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="build/bench-load-into")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    pt = os.path.join(a.out, f"m{a.size_mb}.pt")
    st = os.path.join(a.out, f"m{a.size_mb}.safetensors")
    torch.manual_seed(0)
    src = Model(a.size_mb)
    if not os.path.exists(pt):
        torch.save(src.state_dict(), pt)
    if not os.path.exists(st):
        save_file(src.state_dict(), st)
    model = Model(a.size_mb).to(a.device)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)

    def st_copy():
        with torch.no_grad():
            sd = model.state_dict()
            for k, v in load_file(st, device=a.device).items():
                sd[k].copy_(v)

    rows = [
        ("ckpt.load_into(model, f.pt)", lambda: ckpt.load_into(model, pt)),
        ("ckpt.load_into(model, f.safetensors)", lambda: ckpt.load_into(model, st)),
        ("model.load_state_dict(torch.load(f.pt))",
         lambda: model.load_state_dict(torch.load(pt, map_location=a.device))),
        ("safetensors load_file + copy_", st_copy),
    ]
    print(f"{nbytes / 2**30:.2f} GiB, {len(model.state_dict())} tensors, device {a.device}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    results = {}
    for name, fn in rows:
        results[name] = median_time(fn, a.repeat, sync)
    base = results["model.load_state_dict(torch.load(f.pt))"]
    for name, t in results.items():
        print(f"{name:42s} {t * 1000:8.1f} ms  {nbytes / t / 1e9:6.2f} GB/s  {base / t:5.2f}x")


if __name__ == "__main__":
    main()
