#!/usr/bin/env python3
"""Loading across ranks: ckpt.load(plan=..., group=...) against what each rank does today, in
one run, for 1, 2 and 4 ranks (torchrun, gloo on the CPU) on one safetensors file of SIZE MiB
(float32 matrices) on local disk. Per method and rank count: the wall time of the slowest rank
(median of REPEAT) and the bytes the group read from the file against n x the model:
  ckpt-replicate   ckpt.load(path, group=WORLD): every tensor whole on every rank, each byte
                   read once across the group and all-gathered (gloo)
  ckpt-shard0      ckpt.load(path, plan={"*": ckpt.Shard(0)}): each rank its rows only
  torch-slice      torch.load(path-as-.pt, mmap=False) + torch.chunk(..)[rank] on every rank
  st-get_slice     safetensors safe_open + get_slice(name)[rows].clone() on every rank
Bytes: ckpt's counter (ckpt._ranks.bytes_read); for torch and safetensors, /proc/self/io rchar
(read() calls; safetensors maps the file, so its pages read are not counted there: shown as -).
The page cache is warm for every method (the file is read once before timing).

    $VPY bench/ranks.py [--size-mb 1024] [--repeat 3] [--out build/bench-ranks]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKER = r"""
import json, os, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, os.environ["CKPT_PY"])
import ckpt
from ckpt import _ranks

def rchar():
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])

method, st, pt, out = sys.argv[1:5]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dist.barrier()
b0, r0, t0 = _ranks.bytes_read(), rchar(), time.perf_counter()
if method == "ckpt-replicate":
    sd = ckpt.load(st, group=dist.group.WORLD)
elif method == "ckpt-shard0":
    sd = ckpt.load(st, plan={"*": ckpt.Shard(0)}, group=dist.group.WORLD)
elif method == "torch-slice":
    full = torch.load(pt, mmap=False)
    sd = {k: torch.chunk(v, world, 0)[rank].clone() if rank < len(torch.chunk(v, world, 0))
          else v[:0] for k, v in full.items()}
    del full
else:
    from safetensors import safe_open
    sd = {}
    with safe_open(st, "pt") as f:
        for k in f.keys():
            s = f.get_slice(k)
            n = s.get_shape()[0]
            c = (n + world - 1) // world
            # clone(): a slice may stay a view of the mapping; its pages are read here.
            sd[k] = s[min(n, rank * c):min(n, (rank + 1) * c)].clone()
t = time.perf_counter() - t0
got = {"seconds": t, "ckpt_bytes": _ranks.bytes_read() - b0, "rchar": rchar() - r0}
dist.barrier()
with open(f"{out}.{rank}.json", "w") as f:
    json.dump(got, f)
sys.stdout.flush()
os._exit(0)
"""


def make(out, size_mb):
    import torch
    from safetensors.torch import save_file
    st, pt = os.path.join(out, "m.safetensors"), os.path.join(out, "m.pt")
    if os.path.exists(st) and os.path.exists(pt):
        return st, pt
    g = torch.Generator().manual_seed(1)
    n = max(1, size_mb // 16)  # 16 MiB matrices of 2048 x 2048 float32
    sd = {f"layers.{i}.weight": torch.randn(2048, 2048, generator=g) for i in range(n)}
    save_file(sd, st)
    torch.save(sd, pt)
    return st, pt


def run(method, n, st, pt, out, built):
    worker = os.path.join(out, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", CKPT_PY=built)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    res = os.path.join(out, "r")
    t0 = time.perf_counter()
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(n), worker, method,
                        st, pt, res], env=env, capture_output=True, text=True, timeout=1200)
    if r.returncode:
        raise SystemExit(f"{method} x{n}: {r.stderr[-3000:]}")
    ranks = [json.load(open(f"{res}.{k}.json")) for k in range(n)]
    return {"seconds": max(x["seconds"] for x in ranks),
            "ckpt_bytes": sum(x["ckpt_bytes"] for x in ranks),
            "rchar": sum(x["rchar"] for x in ranks), "wall": time.perf_counter() - t0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--out", default="build/bench-ranks")
    ap.add_argument("--built", default=os.path.abspath("build/python"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    st, pt = make(a.out, a.size_mb)
    model = os.path.getsize(st)
    for p in (st, pt):  # warm the page cache
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass
    print(f"model: {model / 2**20:.0f} MiB safetensors; times: slowest rank, median of {a.repeat}")
    print(f"{'method':<16}{'ranks':>6}{'seconds':>10}{'bytes read / model':>20}")
    for n in [int(x) for x in a.ranks.split(",")]:
        for method in ("ckpt-replicate", "ckpt-shard0", "torch-slice", "st-get_slice"):
            runs = [run(method, n, st, pt, a.out, a.built) for _ in range(a.repeat)]
            sec = statistics.median(r["seconds"] for r in runs)
            b = runs[0]["ckpt_bytes"] if method.startswith("ckpt") else runs[0]["rchar"]
            ratio = "-" if method == "st-get_slice" else f"{b / model:.2f}x"
            print(f"{method:<16}{n:>6}{sec:>10.3f}{ratio:>20}", flush=True)


if __name__ == "__main__":
    main()
