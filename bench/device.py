#!/usr/bin/python3
"""Python device loads: per-storage memory from torch's caching allocator against one arena,
each with its set-up overlapping the first reads (the default) and without (CKPT_DEVICE_OVERLAP=0).

Needs a CUDA GPU (the lent GPU machine). Writes (once) a set of safetensors shards with a
index.json, then for each kind of device memory:

  per-storage   ckpt.load_file(index, device="cuda"): every storage its own allocation from
                torch's caching allocator (the Python default: tensors free one by one)
  arena         the same with CKPT_DEVICE_ARENA=1: one allocation per file (the CLI's path;
                tensors free together)
  ... serial    the same with CKPT_DEVICE_OVERLAP=0: the device memory and the pinned staging
                are all made before the first read

prints the first load of a fresh process (torch.cuda initialised before the timing) and the
median of --repeat warm loads in that process (the last load's tensors freed before each),
in GB/s, beside the pinned host-to-device link (torch: one pinned copy of 1 GiB) and each row's
fraction of it. The page cache is warm (each file read once first); the shards total --size-gb.
With --set-gb 60 (or more) this is the large-set check: the target is >= 0.9x the link, and the
process's threads and pinned memory must not grow with the number of files (printed: the most
threads seen during a load). The large set goes to --set-out (default /dev/shm: memory, so it
stays cached whatever the disk); where that folder's free space, the host's available memory or
the device's free memory cannot hold --set-gb, the set is made smaller to fit and the line before
its rows says so.

    python bench/device.py [--size-gb 8] [--files 4] [--set-gb 0] [--repeat 3]
        [--out /tmp/ckpt-device-bench] [--set-out /dev/shm/ckpt-device-set]
        [--pythonpath build/python] [--no-serial]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The shards, written with numpy (no torch: a 60 GB set in seconds, one thread per file): per
# file, float32 tensors of up to 256 MB filled with one value each, and a small one beside each.
GEN = textwrap.dedent(r"""
    import json, os, sys
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np
    out, files, gb = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    per_file = int(gb * 1e9 / files)
    numel = 64 << 20
    def write(f):
        name = f"model-{f + 1:05d}-of-{files:05d}.safetensors"
        ents, left, i = [], per_file, 0
        while left > 0:
            n = min(numel, max(left // 4, 1))
            ents += [(f"f{f}.t{i}", n, float(f * 1000 + i)), (f"f{f}.bias{i}", 4096, None)]
            left -= 4 * n + 4 * 4096
            i += 1
        header, off = {}, 0
        for key, n, _ in ents:
            header[key] = {"dtype": "F32", "shape": [n], "data_offsets": [off, off + 4 * n]}
            off += 4 * n
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(out, name), "wb") as fh:
            fh.write(len(h).to_bytes(8, "little"))
            fh.write(h)
            for key, n, v in ents:
                a = np.full(n, v, np.float32) if v is not None else np.arange(n, dtype=np.float32)
                fh.write(memoryview(a).cast("B"))
        return name, [e[0] for e in ents]
    with ThreadPoolExecutor(min(files, 8)) as ex:
        done = list(ex.map(write, range(files)))
    weight_map = {k: name for name, keys in done for k in keys}
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
    print(json.dumps({"gb_per_s": n / sorted(ts)[2] / 1e9,
                      "free": torch.cuda.mem_get_info()[0] + n}))
""")


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def warm_cache(folder, names=None):
    def read(name):
        with open(os.path.join(folder, name), "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(read, names or sorted(os.listdir(folder))))


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def fitting(gb, folder, device_free):
    """The largest set <= gb GB that the folder's filesystem, the host's memory (the page cache
    must hold it beside the load) and the device can hold, and why it is smaller."""
    os.makedirs(folder, exist_ok=True)
    have = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    room = {"free space of " + folder: shutil.disk_usage(folder).free + have,
            "available host memory": mem_available() + (have if folder.startswith("/dev/shm") else 0),
            "free device memory": device_free}
    why, fit = "", gb * 1e9
    for what, b in room.items():
        if 0.9 * b < fit:
            fit, why = 0.9 * b, f"{what}: {b / 1e9:.1f} GB"
    return fit / 1e9, why


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/ckpt-device-bench")
    ap.add_argument("--set-out", default="/dev/shm/ckpt-device-set")
    ap.add_argument("--pythonpath", default=os.path.join(REPO, "build", "python"))
    ap.add_argument("--size-gb", type=float, default=8)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--set-gb", type=float, default=0,
                    help="also a large set of this many GB (>= 60: the large-set check)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--also", action="append", default=[],
                    help="rows for this existing file or index.json too (repeatable)")
    ap.add_argument("--no-serial", action="store_true",
                    help="skip the CKPT_DEVICE_OVERLAP=0 rows")
    a = ap.parse_args()
    py = sys.executable
    link = json.loads(run([py, "-c", LINK]))
    print(f"pinned host->device link: {link['gb_per_s']:.1f} GB/s (torch, 1 GiB); "
          f"device memory free: {link['free'] / 1e9:.1f} GB", flush=True)
    print("| set | memory | first load GB/s | x link | warm GB/s | x link | threads |")
    print("|---|---|---|---|---|---|---|", flush=True)
    sets = [(a.size_gb, a.files, a.out)] if a.size_gb > 0 else []
    if a.set_gb:
        set_out = a.set_out if os.path.isdir(os.path.dirname(a.set_out)) else a.out
        gb, why = fitting(a.set_gb, set_out, link["free"])
        if why:
            print(f"(the {a.set_gb:g} GB set does not fit ({why}): {gb:.1f} GB instead)")
        sets.append((round(gb, 1), max(a.files, int(gb // 5)), set_out))
    kinds = [("per-storage", "0", "1"), ("arena", "1", "1")]
    if not a.no_serial:
        kinds = [("per-storage", "0", "1"), ("per-storage, serial", "0", "0"),
                 ("arena", "1", "1"), ("arena, serial", "1", "0")]
    todo = []
    for path in a.also:
        todo.append((os.path.basename(path), path))
        warm_cache(os.path.dirname(path) or ".", [os.path.basename(path)])
    for gb, files, out in sets:
        folder = os.path.join(out, f"{gb:g}gb-{files}")
        index = os.path.join(folder, "model.safetensors.index.json")
        if not os.path.exists(index):
            os.makedirs(folder, exist_ok=True)
            run([py, "-c", GEN, folder, str(files), str(gb)])
        todo.append((f"{gb:g} GB, {files} files", index))
    for name, index in todo:
        if index.endswith(".index.json"):
            warm_cache(os.path.dirname(index))
        for label, arena, overlap in kinds:
            env = dict(os.environ, CKPT_DEVICE_ARENA=arena, CKPT_DEVICE_OVERLAP=overlap)
            r = json.loads(run([py, "-c", TIME, index, str(a.repeat), a.pythonpath], env))
            f, w = r["bytes"] / r["first"] / 1e9, r["bytes"] / r["warm"] / 1e9
            lk = link["gb_per_s"]
            print(f"| {name} | {label} | {f:.1f} | {f / lk:.2f} | {w:.1f} | "
                  f"{w / lk:.2f} | {r['threads']} |", flush=True)


if __name__ == "__main__":
    main()
