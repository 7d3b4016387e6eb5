#!/usr/bin/python3
"""ckpt.load_file against safetensors.torch.load_file on one ~512 MiB safetensors file (page
cache warm): the call itself (tensors mapped, no byte read) and the call plus reading every
tensor once (t.sum()), with the eager load ckpt.load_file made before it maps the file (every
tensor read into memory of its own: `ckpt._load(p, False, ..., flat=True)`) as a third row.
In-process timing, one untimed warm-up, the median of --repeat runs.

    VPY bench/load_file.py [--size-mb 512] [--repeat 7] [--out build/bench-load-file]
        [--pythonpath build/python]
(VPY: the peer venv's interpreter, which has safetensors.)
"""
import argparse
import gc
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(fn, repeat, touch):
    def once():
        t0 = time.perf_counter()
        out = fn()
        if touch:
            for t in out.values():
                t.sum()
        dt = time.perf_counter() - t0
        del out
        gc.collect()
        return dt
    once()
    return statistics.median(once() for _ in range(repeat))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench-load-file"))
    ap.add_argument("--pythonpath", default=os.path.join(REPO, "build", "python"))
    a = ap.parse_args()
    sys.path.insert(0, a.pythonpath)
    import torch
    from safetensors.torch import load_file, save_file

    import ckpt
    os.makedirs(a.out, exist_ok=True)
    p = os.path.join(a.out, f"model-{a.size_mb}.safetensors")
    n = a.size_mb // 4
    if not os.path.exists(p):
        save_file({f"layer.{i}.weight": torch.randn(1024, 1024) for i in range(n)}, p)
    size = os.path.getsize(p)
    rows = [("safetensors.torch.load_file(p)", lambda: load_file(p)),
            ("ckpt.load_file(p) (mapped)", lambda: ckpt.load_file(p)),
            ("eager flat load (ckpt.load_file before)",
             lambda: ckpt._load(p, False, False, False, None, None, flat=True))]
    print(f"{size / 1e6:.0f} MB, {n} tensors, torch {torch.__version__}")
    print("| call | call only (s) | call + t.sum() of every tensor (s) |")
    print("|---|---|---|")
    for name, fn in rows:
        print(f"| `{name}` | {timed(fn, a.repeat, False):.4f} | "
              f"{timed(fn, a.repeat, True):.3f} |")


if __name__ == "__main__":
    main()
