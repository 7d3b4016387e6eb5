#!/usr/bin/python3
"""ckpt against torch and the machine's limits, in one run, on the same files.

Generates the default inputs with `ckpt sample` (a 1 GiB checkpoint of 256 float32 tensors and a
1 GiB checkpoint of 20,000 tensors), runs `ckpt bench --json` on each (machine limits, open,
mmap, eager, eager+verify, streaming, save, peak RSS in fresh processes), times torch.load and
torch.save (Debian's python3-torch) on the same files, and prints a markdown table of medians,
ratios and the issue's targets.

    /usr/bin/python3 bench/run.py [--size-mb 1024] [--repeat 5] [--ckpt build/ckpt] [--out build/bench]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

TORCH_SCRIPT = textwrap.dedent(r"""
    import json, os, resource, sys, time, warnings
    warnings.filterwarnings("ignore")
    import torch
    path, repeat, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if mode == "rss":
        t0 = time.perf_counter(); sd = torch.load(path); dt = time.perf_counter() - t0
        print(json.dumps({"seconds": dt, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          "import_rss": base_rss}))
        sys.exit(0)
    loads, saves = [], []
    out = path + ".torch-save.pt"
    sd = torch.load(path)  # untimed warm-up, as ckpt bench does
    for _ in range(repeat):
        t0 = time.perf_counter(); sd = torch.load(path); loads.append(time.perf_counter() - t0)
    for _ in range(repeat):
        if os.path.exists(out): os.remove(out)
        os.sync()  # start each save from a clean page cache, as ckpt bench does
        t0 = time.perf_counter(); torch.save(sd, out); saves.append(time.perf_counter() - t0)
    os.remove(out)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    print(json.dumps({"load": sorted(loads)[len(loads) // 2], "save": sorted(saves)[len(saves) // 2],
                      "bytes": nbytes}))
""")


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--size-mb", type=float, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the raw results here")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    inputs = [("256 tensors", "big256.pt", 256), ("20,000 tensors", "small20k.pt", 20000)]
    results = {}
    for label, name, n in inputs:
        path = os.path.join(a.out, name)
        if not os.path.exists(path):
            run([a.ckpt, "sample", path, "--tensors", str(n), "--size-mb", str(a.size_mb)])
        ck = json.loads(run([a.ckpt, "bench", path, "--json", "--repeat", str(a.repeat)]))
        th = json.loads(run(["/usr/bin/python3", "-c", TORCH_SCRIPT, path, str(a.repeat), "time"]))
        th_rss = json.loads(run(["/usr/bin/python3", "-c", TORCH_SCRIPT, path, "1", "rss"]))
        results[label] = {"ckpt": ck, "torch": th, "torch_rss": th_rss, "file": path}

    lines = []
    for label, r in results.items():
        ck, th = r["ckpt"], r["torch"]
        rows = {x["name"]: x for x in ck["results"]}
        size = ck["file_bytes"]
        data = th["bytes"]
        t = ck["threads"]
        ts_ = "thread" if t == 1 else "threads"
        eager = rows[f"ckpt: eager load, {t} {ts_}"]
        verify = rows[f"ckpt: eager load + verify CRC32, {t} {ts_}"]
        save = rows["ckpt: save (page cache), 2 threads"]
        openl = rows["ckpt: open + list"]
        lines.append(f"### {label}: {size / 2**20:.0f} MiB file, {ck['tensors']} tensors\n")
        lines.append("Each ckpt row beside its limit: the same work done by plain system calls with the same "
                     "thread count into the same kind of memory (`limit:` rows); `machine:` rows are facts "
                     "for reference.\n")
        lines.append("| measurement | ms | GB/s | × its limit |")
        lines.append("|---|---:|---:|---:|")
        for x in ck["results"]:
            gbs = f"{x['gb_per_s']:.2f}" if x["gb_per_s"] else "-"
            ratio = f"{x['vs_limit']:.2f}" if "vs_limit" in x else "-"
            lines.append(f"| {x['name']} | {x['seconds'] * 1e3:.2f} | {gbs} | {ratio} |")
        tl = data / th["load"] / 1e9
        ts = data / th["save"] / 1e9
        lim_load = rows[eager["limit"]]["gb_per_s"]
        lim_save = rows[save["limit"]]["gb_per_s"]
        lines.append(f"| torch.load (1.13), 1 thread | {th['load'] * 1e3:.2f} | {tl:.2f} | {tl / lim_load:.2f} (of the eager limit) |")
        lines.append(f"| torch.save (1.13, page cache), 1 thread | {th['save'] * 1e3:.2f} | {ts:.2f} | {ts / lim_save:.2f} (of the save limit) |")
        for m in ck.get("memory", []):
            lines.append(f"| {m['name']} | {m['peak_rss_bytes'] / 2**20:.0f} MiB | | |")
        trss = r["torch_rss"]
        lines.append(f"| peak RSS: torch.load (import alone: {trss['import_rss'] / 2**20:.0f} MiB) | "
                     f"{trss['peak_rss'] / 2**20:.0f} MiB | | |")
        lines.append("")
        # Targets (issue 3).
        open_target = 2.0 if ck["tensors"] <= 1000 else 50.0
        checks = [
            (f"open+list < {open_target:g} ms", openl["seconds"] * 1e3 < open_target, f"{openl['seconds'] * 1e3:.2f} ms"),
            (f"eager ≥ 0.8× its limit ({eager['limit'][7:]})", eager["vs_limit"] >= 0.8, f"{eager['vs_limit']:.2f}×"),
            ("verify adds ≤ 25%", verify["seconds"] <= 1.25 * eager["seconds"], f"+{(verify['seconds'] / eager['seconds'] - 1) * 100:.0f}%"),
            ("eager ≥ 5× torch.load", th["load"] / eager["seconds"] >= 5, f"{th['load'] / eager['seconds']:.1f}×"),
            ("save ≥ 3× torch.save", th["save"] / save["seconds"] >= 3, f"{th['save'] / save['seconds']:.1f}×"),
        ]
        if "convert_vs_save" in ck:  # issue 10: convert pt->pt within 10% of save_torch
            checks.append(("convert pt→pt ≤ 1.1× save_torch", ck["convert_vs_save"] <= 1.1,
                           f"{ck['convert_vs_save']:.2f}×"))
        for m in ck.get("memory", []):
            checks.append((f"{m['name']} ≤ {m['target_bytes'] / 2**20:.0f} MiB", m["peak_rss_bytes"] <= m["target_bytes"],
                           f"{m['peak_rss_bytes'] / 2**20:.0f} MiB"))
        lines.append("| target | measured | met |")
        lines.append("|---|---:|:---:|")
        for name, ok, got in checks:
            lines.append(f"| {name} | {got} | {'yes' if ok else '**no**'} |")
        lines.append("")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
