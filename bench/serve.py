#!/usr/bin/env python3
"""From training to serving in one command: a 4-rank DCP folder of float32 (what training
writes) to a Hugging Face folder of bfloat16 safetensors shards under the serving model's names
(what serving reads), ckpt against torch's own path, in one run.

  ckpt convert DIR OUT/ --rename REGEX=REPL --cast bf16 --max-shard-size 200MB
  torch: dcp_to_torch_save, torch.load, a rename loop, .to(torch.bfloat16), save_file per shard
         and the index (what users script today), and the same with an fsync of its files
         (ckpt fsyncs its output)

Each timed the median of REPEAT runs (the order turns each round), and the peak RSS of each
through a small launcher (bench/measure.py). The folder is made as bench/dcp.py makes it
(torchrun, gloo on the CPU, 2048 x 2048 float32 DTensors, Shard(0) and Shard(1)).

    $VPY bench/serve.py [--size-mb 1024] [--repeat 3] [--ckpt build/ckpt] [--out build/bench-dcp]
"""
import os
import resource
import shutil
import statistics
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
from dcp import args_and_folder  # noqa: E402

RENAME = r"^layers\.(\d+)\.=model.layers.$1."
SHARD = 200 * 10**6

TORCH = textwrap.dedent(r"""
    import json, os, re, sys, time
    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    d, tmp, out, shard, sync = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
    t0 = time.perf_counter()
    dcp_to_torch_save(d, tmp)
    sd = torch.load(tmp, weights_only=True)
    os.remove(tmp)
    sd = {re.sub(r"^layers\.(\d+)\.", r"model.layers.\1.", k): v.to(torch.bfloat16)
          for k, v in sd.items()}
    groups, size = [[]], 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if groups[-1] and size + n > shard:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += n
    os.makedirs(out, exist_ok=True)
    weight_map = {}
    for i, g in enumerate(groups):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(groups))
        save_file({k: sd[k] for k in g}, os.path.join(out, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in g})
        if sync:
            fd = os.open(os.path.join(out, name), os.O_RDONLY); os.fsync(fd); os.close(fd)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(v.numel() * 2 for v in sd.values())},
                   "weight_map": weight_map}, f)
    print(time.perf_counter() - t0)
""")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def clean(out):
    shutil.rmtree(out, ignore_errors=True)
    os.sync()


def main():
    a, d = args_and_folder()
    torch_script = os.path.join(a.out, "torch_serve.py")
    with open(torch_script, "w") as f:
        f.write(TORCH)
    out = os.path.join(a.out, "serve")
    tmp = os.path.join(a.out, "serve-tmp.pt")
    ckpt_cmd = [a.ckpt, "convert", d, out + "/", "--rename", RENAME, "--cast", "bf16",
                "--max-shard-size", str(SHARD)]

    def torch_cmd(sync):
        return [sys.executable, torch_script, d, tmp, out, str(SHARD), "1" if sync else "0"]

    rows = {"ckpt convert (rename, bf16, shards)": [], "torch: dcp_to_torch_save ... save_file": [],
            "torch ... + fsync (ckpt always fsyncs)": []}

    cpu = {k: [] for k in rows}  # user + sys of the whole process (torch's imports included)

    def run_ckpt():
        clean(out)
        c0, t0 = children_cpu(), time.perf_counter()
        subprocess.run(ckpt_cmd, check=True, capture_output=True)
        rows["ckpt convert (rename, bf16, shards)"].append(time.perf_counter() - t0)
        cpu["ckpt convert (rename, bf16, shards)"].append(children_cpu() - c0)

    def run_torch(sync):
        clean(out)
        c0 = children_cpu()
        r = subprocess.run(torch_cmd(sync), check=True, capture_output=True, text=True)
        key = "torch ... + fsync (ckpt always fsyncs)" if sync else "torch: dcp_to_torch_save ... save_file"
        rows[key].append(float(r.stdout.strip().splitlines()[-1]))
        cpu[key].append(children_cpu() - c0)

    runs = [run_ckpt, lambda: run_torch(False), lambda: run_torch(True)]
    for i in range(a.repeat):
        k = i % len(runs)
        for run in runs[k:] + runs[:k]:
            run()
    med = {k: statistics.median(v) for k, v in rows.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    clean(out)
    rss_ckpt = measure.peak_rss(ckpt_cmd)
    clean(out)
    rss_torch = measure.peak_rss(torch_cmd(False))
    clean(out)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    k_c, k_t, k_s = ("ckpt convert (rename, bf16, shards)", "torch: dcp_to_torch_save ... save_file",
                     "torch ... + fsync (ckpt always fsyncs)")
    print(f"| {size / 2**20:.0f} MiB fp32, 4 ranks -> bf16 HF folder | median of {a.repeat} (s) "
          f"| CPU user+sys, whole process (s) | peak RSS |")
    print("|---|---|---|---|")
    print(f"| ckpt convert (rename, bf16, shards) | {med[k_c]:.3f} | {mcpu[k_c]:.2f} "
          f"| {rss_ckpt / 2**20:.0f} MiB |")
    print(f"| torch: dcp_to_torch_save, rename, .to(bf16), save_file | {med[k_t]:.3f} "
          f"| {mcpu[k_t]:.2f} | {rss_torch / 2**20:.0f} MiB |")
    print(f"| torch ... + fsync | {med[k_s]:.3f} | {mcpu[k_s]:.2f} | |")
    c = med["ckpt convert (rename, bf16, shards)"]
    print(f"| ckpt over torch + fsync | {med[k_s] / c:.1f}x | | (goal >= 5x) |")
    print(f"| ckpt over torch without fsync | {med[k_t] / c:.1f}x | | |")
    print(f"| memory: ckpt / torch | {rss_ckpt / rss_torch:.2f} | | (goal <= 0.2) |")


if __name__ == "__main__":
    main()
