#!/usr/bin/python3
"""Python device loads: per-storage memory from torch's caching allocator against one arena.

Needs a CUDA GPU (the lent GPU machine). Writes (once) a set of safetensors shards with a
index.json, then for each kind of device memory:

  per-storage   ckpt.load_file(index, device="cuda"): every storage its own allocation from
                torch's caching allocator (the Python default: tensors free one by one)
  arena         the same with CKPT_DEVICE_ARENA=1: one allocation per file (the CLI's path;
                tensors free together)

prints the first load of a fresh process (torch.cuda initialised before the timing) and the
median of --repeat warm loads in that process (the last load's tensors freed before each),
in GB/s, beside the pinned host-to-device link (torch: one pinned copy of 1 GiB) and each row's
fraction of it. The page cache is warm (each file read once first); the shards total --size-gb.
With --set-gb 60 (or more) this is the large-set check: the target is >= 0.9x the link, and the
process's threads and pinned memory must not grow with the number of files (printed: the most
threads seen during a load, and torch's pinned memory is not used by ckpt at all).

    python bench/device.py [--size-gb 8] [--files 4] [--set-gb 0] [--repeat 3]
        [--out /tmp/ckpt-device-bench] [--pythonpath build/python]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GEN = textwrap.dedent(r"""
    import json, os, sys, torch
    from safetensors.torch import save_file
    out, files, gb = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    per_file = int(gb * 1e9 / files)
    numel = 64 << 20  # 256 MB float32 tensors, and a few small ones per file
    weight_map = {}
    for f in range(files):
        name = f"model-{f + 1:05d}-of-{files:05d}.safetensors"
        sd, left, i = {}, per_file, 0
        while left > 0:
            n = min(numel, max(left // 4, 1))
            sd[f"f{f}.t{i}"] = torch.full((n,), float(f * 1000 + i))
            sd[f"f{f}.bias{i}"] = torch.arange(4096, dtype=torch.float32)
            left -= 4 * n + 4 * 4096
            i += 1
        save_file(sd, os.path.join(out, name))
        weight_map.update({k: name for k in sd})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
""")

TIME = textwrap.dedent(r"""
    import json, os, sys, threading, time
    index, repeat = sys.argv[1], int(sys.argv[2])
    sys.path.insert(0, sys.argv[3])
    import torch, ckpt
    torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
    most = [0]
    def watch(stop):
        while not stop.is_set():
            most[0] = max(most[0], len(os.listdir("/proc/self/task"))); time.sleep(0.002)
    def one():
        stop = threading.Event(); w = threading.Thread(target=watch, args=(stop,)); w.start()
        t0 = time.perf_counter(); sd = ckpt.load_file(index, device="cuda")
        torch.cuda.synchronize(); dt = time.perf_counter() - t0
        stop.set(); w.join()
        n = sum(t.numel() * t.element_size() for t in sd.values())
        return sd, dt, n
    sd, first, n = one(); del sd
    warm = []
    for _ in range(repeat):
        sd, dt, n = one(); warm.append(dt); del sd
    print(json.dumps({"first": first, "warm": statistics.median(warm) if warm else first,
                      "bytes": n, "threads": most[0] - 1}))
""").replace("import json, os", "import json, os, statistics")

LINK = textwrap.dedent(r"""
    import json, time, torch
    n = 1 << 30
    h = torch.empty(n, dtype=torch.uint8).pin_memory(); d = torch.empty(n, dtype=torch.uint8,
                                                                   device="cuda")
    d.copy_(h, non_blocking=True); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); d.copy_(h, non_blocking=True); torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    print(json.dumps({"gb_per_s": n / sorted(ts)[2] / 1e9}))
""")


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def warm_cache(folder):
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            while f.read(64 << 20):
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/ckpt-device-bench")
    ap.add_argument("--pythonpath", default=os.path.join(REPO, "build", "python"))
    ap.add_argument("--size-gb", type=float, default=8)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--set-gb", type=float, default=0,
                    help="also a large set of this many GB (>= 60: the large-set check)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    py = sys.executable
    link = json.loads(run([py, "-c", LINK]))["gb_per_s"]
    print(f"pinned host->device link: {link:.1f} GB/s (torch, 1 GiB)")
    print("| set | memory | first load GB/s | x link | warm GB/s | x link | threads |")
    print("|---|---|---|---|---|---|---|")
    sets = [(a.size_gb, a.files)] + ([(a.set_gb, max(a.files, int(a.set_gb // 5)))]
                                     if a.set_gb else [])
    for gb, files in sets:
        folder = os.path.join(a.out, f"{gb:g}gb-{files}")
        index = os.path.join(folder, "model.safetensors.index.json")
        if not os.path.exists(index):
            os.makedirs(folder, exist_ok=True)
            run([py, "-c", GEN, folder, str(files), str(gb)])
        warm_cache(folder)
        for label, arena in (("per-storage", "0"), ("arena", "1")):
            env = dict(os.environ, CKPT_DEVICE_ARENA=arena)
            r = json.loads(run([py, "-c", TIME, index, str(a.repeat), a.pythonpath], env))
            f, w = r["bytes"] / r["first"] / 1e9, r["bytes"] / r["warm"] / 1e9
            print(f"| {gb:g} GB, {files} files | {label} | {f:.1f} | {f / link:.2f} | {w:.1f} | "
                  f"{w / link:.2f} | {r['threads']} |")


if __name__ == "__main__":
    main()
