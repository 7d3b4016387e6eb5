#!/usr/bin/python3
"""ckpt.save against torch.save from Python, in one run, on the same state dict.

A state dict of --tensors float32 tensors, --size-mb in all, is saved --repeat times by each
writer, the writers interleaved (one of each per round, so drift of the machine hits both), into
a file removed before each save; `os.sync()` before each save starts it with no dirty pages:

  torch.save(sd, path)                      the peer: what torch does (no fsync)
  ckpt.save(sd, path)                       the default: atomic replace (temporary + rename),
                                            no fsync, as torch
  torch.save + fsync                        torch.save into an open file, then flush + os.fsync
  ckpt.save(sd, path, fsync=True)           atomic replace + fsync of the file and its folder

Prints the median of each (and the ratios torch / ckpt), and whether ckpt.save is at least 2x
torch.save both without fsync and with it.

    /usr/bin/python3 bench/python_save.py [--size-mb 200] [--tensors 64] [--repeat 7]
        [--out build/bench-python] [--pythonpath build/python]
"""
import argparse
import collections
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench-python"))
    ap.add_argument("--pythonpath", default=os.path.join(REPO, "build", "python"))
    ap.add_argument("--size-mb", type=float, default=200)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, a.pythonpath)
    import torch

    import ckpt
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    numel = int(a.size_mb * 2**20 / 4 / a.tensors)
    sd = collections.OrderedDict((f"layers.{i}.weight", torch.randn(numel))
                                 for i in range(a.tensors))
    path = os.path.join(a.out, "save.pt")

    def torch_fsync():
        with open(path, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())

    kinds = collections.OrderedDict([
        ("torch.save", lambda: torch.save(sd, path)),
        ("ckpt.save", lambda: ckpt.save(sd, path)),
        ("torch.save + fsync", torch_fsync),
        ("ckpt.save(fsync=True)", lambda: ckpt.save(sd, path, fsync=True)),
    ])
    times = {k: [] for k in kinds}
    for _ in range(a.repeat + 1):  # the first round warms up and is dropped
        for k, fn in kinds.items():
            if os.path.exists(path):
                os.remove(path)
            os.sync()
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    size = os.path.getsize(path)
    os.remove(path)
    ratio = med["torch.save"] / med["ckpt.save"]
    ratio_sync = med["torch.save + fsync"] / med["ckpt.save(fsync=True)"]
    if a.json:
        print(json.dumps({"median_s": med, "file_bytes": size, "ratio": ratio,
                          "ratio_fsync": ratio_sync}))
        return
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {a.tensors} tensors, "
          f"{size / 1e6:.0f} MB file, median of {a.repeat} (after one warm-up round)\n")
    print("| writer | ms | GB/s |")
    print("|---|---|---|")
    for k, s in med.items():
        print(f"| {k} | {s * 1e3:.0f} | {size / s / 1e9:.2f} |")
    print(f"\nno fsync: ckpt.save {ratio:.1f}x torch.save ({'ok' if ratio >= 2 else 'BELOW 2x'})")
    print(f"fsync:    ckpt.save {ratio_sync:.1f}x torch.save ({'ok' if ratio_sync >= 2 else 'BELOW 2x'})")


if __name__ == "__main__":
    main()
