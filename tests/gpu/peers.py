"""The peers' rows of the GPU table, in one run, beside ckpt's Python rows when the module imports:
the link (pinned and pageable host->device copies of the same bytes), torch.load(map_location=
"cuda"), safetensors.torch.load_file(device="cuda:0"), ckpt.load(map_location="cuda"), and a
bit-exactness check of ckpt's CUDA tensors against safetensors'. Usage: peers.py FILE.pt FILE.safetensors [--repeat N]"""
import argparse, os, statistics, time
import torch
from safetensors.torch import load_file

ap = argparse.ArgumentParser()
ap.add_argument("pt"); ap.add_argument("st"); ap.add_argument("--repeat", type=int, default=3)
a = ap.parse_args()
size = os.path.getsize(a.st)

def timed(fn):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(a.repeat):
        t = time.perf_counter(); r = fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t); del r
    return statistics.median(ts)

def row(name, s):
    print(f"{name:<62} {s*1e3:10.1f} ms {size/s/1e9:8.2f} GB/s", flush=True)

host = torch.empty(size, dtype=torch.uint8)
host.fill_(1)
pinned = host.pin_memory()
dev = torch.empty(size, dtype=torch.uint8, device="cuda")
row("link: pinned host->device copy", timed(lambda: dev.copy_(pinned, non_blocking=True)))
row("pageable host->device copy", timed(lambda: dev.copy_(host)))
del host, pinned, dev
row("torch.load(map_location='cuda')", timed(lambda: torch.load(a.pt, map_location="cuda")))
row("safetensors load_file(device='cuda:0')", timed(lambda: load_file(a.st, device="cuda:0")))
try:
    import ckpt
except ImportError as e:
    print("ckpt module: not importable here:", e)
    raise SystemExit(0)
for p in (a.st, a.pt):
    row(f"ckpt.load(map_location='cuda') {os.path.basename(p)}",
        timed(lambda: ckpt.load(p, map_location="cuda")))
row("ckpt.load(p) then .cuda() per tensor",
    timed(lambda: {k: v.cuda() for k, v in ckpt.load(a.st).items()}))
ref = load_file(a.st, device="cuda:0")
for p in (a.st, a.pt):
    got = ckpt.load(p, map_location="cuda")
    same = got.keys() == ref.keys() and all(
        got[k].is_cuda and got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]) for k in ref)
    print(f"ckpt CUDA tensors of {os.path.basename(p)} equal safetensors': {same}", flush=True)
