#!/usr/bin/env python3
"""Loading across ranks: ckpt.load(plan=..., group=...) against what each rank does today, in
one run, for 1, 2 and 4 ranks (torchrun, gloo on the CPU) on one safetensors file of SIZE MiB
(float32 matrices), from local disk and from nginx (HTTP ranges, the nginx of
tests/interop/test_remote.py serving the folder). Per source, method and rank count: the wall
time of the slowest rank, the CPU time (user + sys) of all ranks together, and the bytes the
group read from storage against the model:
  ckpt-all         ckpt.load(path) on every rank: every rank reads the whole model
  ckpt-replicate   ckpt.load(path, group=WORLD): every tensor whole on every rank, each byte
                   read once across the group and all-gathered (gloo)
  ckpt-shard0      ckpt.load(path, plan={"*": ckpt.Shard(0)}): each rank its rows only
  ckpt-mixed       ckpt.load(path, plan=<even layers Shard(0)>, group=WORLD): half the matrices
                   each rank's rows, the other half replicated and exchanged (a rank reads its
                   rows while the rounds' broadcasts run)
  torch-slice      torch.load(.pt, mmap=False) + torch.chunk(..)[rank] on every rank (HTTP: the
                   whole .pt fetched into memory first)
  st-get_slice     safetensors safe_open + get_slice(name)[rows].clone() on every rank (HTTP:
                   safe_open needs a file, so the whole file fetched and safetensors.torch.load)
Bytes from storage: local disk: ckpt's counter (ckpt._ranks.bytes_read), torch's /proc/self/io
rchar (safetensors maps the file: not counted, shown as -); nginx: the body bytes its access log
says it sent, for every method. The page cache is warm (the files are read once first).

    $VPY bench/ranks.py [--size-mb 1024] [--repeat 1] [--ranks 1,2,4] [--sources local,http]
                        [--methods ckpt-replicate,...] [--built build/python]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

WORKER = r"""
import io, json, os, resource, sys, time, urllib.request
import torch, torch.distributed as dist
sys.path.insert(0, os.environ["CKPT_PY"])
import ckpt
from ckpt import _ranks

def rchar():
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def fetch(url):
    return urllib.request.urlopen(url).read()

def rows(n, rank, world):
    c = (n + world - 1) // world
    return min(n, rank * c), min(n, (rank + 1) * c)

method, st, pt, out = sys.argv[1:5]
remote = st.startswith("http")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dist.barrier()
b0, r0, c0, t0 = _ranks.bytes_read(), rchar(), cpu(), time.perf_counter()
if method == "ckpt-all":
    sd = ckpt.load(st)
elif method == "ckpt-replicate":
    sd = ckpt.load(st, group=dist.group.WORLD)
elif method == "ckpt-shard0":
    sd = ckpt.load(st, plan={"*": ckpt.Shard(0)}, group=dist.group.WORLD)
elif method == "ckpt-mixed":
    sd = ckpt.load(st, plan={r"re:layers\.\d*[02468]\.weight": ckpt.Shard(0)},
                   group=dist.group.WORLD)
elif method == "torch-slice":
    full = torch.load(io.BytesIO(fetch(pt)) if remote else pt, mmap=False)
    sd = {}
    for k, v in full.items():
        a, b = rows(v.shape[0], rank, world)
        sd[k] = v[a:b].clone()
    del full
elif remote:
    from safetensors.torch import load
    full = load(fetch(st))
    sd = {}
    for k, v in full.items():
        a, b = rows(v.shape[0], rank, world)
        sd[k] = v[a:b].clone()
    del full
else:
    from safetensors import safe_open
    sd = {}
    with safe_open(st, "pt") as f:
        for k in f.keys():
            s = f.get_slice(k)
            a, b = rows(s.get_shape()[0], rank, world)
            # clone(): a slice may stay a view of the mapping; its pages are read here.
            sd[k] = s[a:b].clone()
t = time.perf_counter() - t0
got = {"seconds": t, "cpu": cpu() - c0, "ckpt_bytes": _ranks.bytes_read() - b0,
       "rchar": rchar() - r0}
dist.barrier()
with open(f"{out}.{rank}.json", "w") as f:
    json.dump(got, f)
sys.stdout.flush()
os._exit(0)
"""

METHODS = ("ckpt-all", "ckpt-replicate", "ckpt-shard0", "ckpt-mixed", "torch-slice",
           "st-get_slice")


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


def served(log):
    """Body bytes nginx's access log says it sent so far (combined format)."""
    if not os.path.exists(log):
        return 0
    with open(log) as f:
        return sum(int(m.group(1)) for m in re.finditer(r'" \d{3} (\d+) ', f.read()))


def run(method, n, st, pt, out, built, log):
    worker = os.path.join(out, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", CKPT_PY=built)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    res = os.path.join(out, "r")
    s0 = served(log) if log else 0
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(n), worker, method,
                        st, pt, res], env=env, capture_output=True, text=True, timeout=1200)
    if r.returncode:
        raise SystemExit(f"{method} x{n}: {r.stderr[-3000:]}")
    ranks = [json.load(open(f"{res}.{k}.json")) for k in range(n)]
    return {"seconds": max(x["seconds"] for x in ranks), "cpu": sum(x["cpu"] for x in ranks),
            "ckpt_bytes": sum(x["ckpt_bytes"] for x in ranks),
            "rchar": sum(x["rchar"] for x in ranks), "served": served(log) - s0 if log else 0}


def table(source, st, pt, a, model, log):
    print(f"\n{source}: model {model / 2**20:.0f} MiB safetensors; wall: slowest rank, median of "
          f"{a.repeat}; cpu: user+sys of all ranks")
    print(f"{'method':<16}{'ranks':>6}{'wall s':>9}{'cpu s':>8}{'read/model':>12}{'n x model':>11}")
    for n in [int(x) for x in a.ranks.split(",")]:
        for method in a.methods.split(","):
            runs = [run(method, n, st, pt, a.out, a.built, log) for _ in range(a.repeat)]
            sec = statistics.median(r["seconds"] for r in runs)
            cpu = statistics.median(r["cpu"] for r in runs)
            if log:
                ratio = f"{runs[0]['served'] / model:.2f}x"
            elif method.startswith("ckpt"):
                ratio = f"{runs[0]['ckpt_bytes'] / model:.2f}x"
            elif method == "torch-slice":
                ratio = f"{runs[0]['rchar'] / model:.2f}x"
            else:
                ratio = "-"
            print(f"{method:<16}{n:>6}{sec:>9.3f}{cpu:>8.2f}{ratio:>12}{f'{n:.2f}x':>11}",
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--sources", default="local,http")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default="build/bench-ranks")
    ap.add_argument("--built", default=os.path.abspath("build/python"))
    a = ap.parse_args()
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    st, pt = make(a.out, a.size_mb)
    model = os.path.getsize(st)
    for p in (st, pt):  # warm the page cache
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass
    for source in a.sources.split(","):
        if source == "local":
            table("local disk", st, pt, a, model, None)
            continue
        sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))
        from test_remote import Nginx
        import tempfile
        root = tempfile.mkdtemp(prefix="bench-ranks-nginx-")
        srv = Nginx(root)
        try:
            for p in (st, pt):
                os.symlink(p, os.path.join(srv.www, os.path.basename(p)))
            table("nginx (HTTP)", srv.url("m.safetensors"), srv.url("m.pt"), a, model, srv.log)
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
