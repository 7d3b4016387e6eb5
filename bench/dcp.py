#!/usr/bin/env python3
"""Converting a torch.distributed.checkpoint folder to safetensors: ckpt against torch, in one run.

Makes a 4-rank DCP folder (torchrun, gloo on the CPU; float32 DTensors Shard(0) and Shard(1),
SIZE MiB in all) and the torch.save of the same state (dcp_to_torch_save), then times, each the
median of REPEAT runs:
  ckpt convert DIR out.safetensors     the issue's subject
  ckpt convert same.pt out.safetensors ckpt's own pt -> safetensors of the same bytes
  dcp_to_torch_save + safetensors.torch.save_file   what users run today, timed without and
                                       with an fsync of its output (ckpt convert always fsyncs)
  writing as many bytes to a new file + fsync        the machine's limit for the output
and the peak RSS of the streamed ckpt conversion (default budget, and --budget-mb 64) beside the
largest tensor. Run with the torch 2.x
Python (it has torchrun):

    $VPY bench/dcp.py [--size-mb 1024] [--repeat 3] [--ckpt build/ckpt] [--out build/bench-dcp]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

MAKE = textwrap.dedent(r"""
    import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    out, size_mb = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    n = max(1, size_mb // 16)  # tensors of 16 MiB: 2048 x 2048 float32
    g = torch.Generator().manual_seed(0)
    sd = {f"layers.{i}.weight": distribute_tensor(torch.randn(2048, 2048, generator=g), mesh,
                                                  [Shard(i % 2)]) for i in range(n)}
    dcp.save(sd, checkpoint_id=out)
    dist.barrier()
    dist.destroy_process_group()
""")

TORCH = textwrap.dedent(r"""
    import os, sys, time
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    import torch
    from safetensors.torch import save_file
    d, tmp, out = sys.argv[1:4]
    t0 = time.perf_counter()
    dcp_to_torch_save(d, tmp)
    save_file(torch.load(tmp, weights_only=True), out)
    t1 = time.perf_counter()
    fd = os.open(out, os.O_RDONLY)  # on disk, as ckpt convert leaves its output
    os.fsync(fd)
    os.close(fd)
    print(t1 - t0, time.perf_counter() - t0)
""")


WRITE = textwrap.dedent(r"""
    import os, sys, time
    out, size = sys.argv[1], int(sys.argv[2])
    buf = memoryview(bytearray(16 << 20))
    t0 = time.perf_counter()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    done = 0
    while done < size:
        done += os.write(fd, buf[:min(len(buf), size - done)])
    os.fsync(fd)
    os.close(fd)
    print(time.perf_counter() - t0)
""")


def settle(path):
    """Each run starts alike: no output left from the last one, no dirty pages being written back
    (a 1 GiB write leaves the next command throttled by the kernel's writeback)."""
    if os.path.exists(path):
        os.remove(path)
    os.sync()


def timed(cmd):
    settle(cmd[-1])
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def peak_rss(cmd):
    """Peak RSS (bytes) of one run of cmd alone, through a small launcher (bench/measure.py: a
    child forked from this process would report this process's own peak)."""
    settle(cmd[-1])
    return measure.peak_rss(cmd)


def args_and_folder():
    """The command line (--size-mb, --repeat, --ckpt, --out) and the 4-rank DCP folder made once
    under --out (bench/serve.py uses the same)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--out", default="build/bench-dcp")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    d = os.path.join(a.out, "dcp")
    if not os.path.isdir(d):
        script = os.path.join(a.out, "make_dcp.py")
        with open(script, "w") as f:
            f.write(MAKE)
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        subprocess.run([torchrun, "--standalone", "--nproc-per-node", "4", script, d,
                        str(a.size_mb)], check=True, capture_output=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return a, d


def main():
    a, d = args_and_folder()
    pt = os.path.join(a.out, "same.pt")
    if not os.path.exists(pt):
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        dcp_to_torch_save(d, pt)
    st = os.path.join(a.out, "out.safetensors")
    torch_script = os.path.join(a.out, "torch_convert.py")
    with open(torch_script, "w") as f:
        f.write(TORCH)
    write_script = os.path.join(a.out, "write.py")
    with open(write_script, "w") as f:
        f.write(WRITE)
    rows = {"ckpt convert DIR": [], "ckpt convert same.pt": [],
            "dcp_to_torch_save + save_file": [], "dcp_to_torch_save + save_file + fsync": [],
            "machine: write as many bytes to a new file + fsync": []}
    def run_dcp():
        rows["ckpt convert DIR"].append(timed([a.ckpt, "convert", d, st]))

    def run_pt():
        rows["ckpt convert same.pt"].append(timed([a.ckpt, "convert", pt, st]))

    def run_torch():
        settle(st)
        r = subprocess.run([sys.executable, torch_script, d, os.path.join(a.out, "tmp.pt"), st],
                           check=True, capture_output=True, text=True)
        plain, synced = map(float, r.stdout.strip().splitlines()[-1].split())
        rows["dcp_to_torch_save + save_file"].append(plain)
        rows["dcp_to_torch_save + save_file + fsync"].append(synced)

    def run_write():
        settle(st)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        r = subprocess.run([sys.executable, write_script, st, str(size)], check=True,
                           capture_output=True, text=True)
        rows["machine: write as many bytes to a new file + fsync"].append(float(r.stdout))

    # The order turns each round, so that each contender follows each other equally often: a
    # run right after the torch one (gigabytes allocated and freed) is slower on some machines
    # (a VM's freed guest pages are touched again first), whoever it is.
    runs = [run_dcp, run_pt, run_torch, run_write]
    for i in range(a.repeat):
        k = i % len(runs)
        for run in runs[k:] + runs[:k]:
            run()
    med = {k: statistics.median(v) for k, v in rows.items()}
    best = {k: min(v) for k, v in rows.items()}
    settle(st)
    rss = peak_rss([a.ckpt, "convert", d, st])
    settle(st)
    rss_small = peak_rss([a.ckpt, "convert", d, st, "--budget-mb", "64"])
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"| {size / 2**20:.0f} MiB, 4 ranks | median of {a.repeat} (s) | best (s) |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {best[k]:.3f} |")
    dcp_s, pt_s = med["ckpt convert DIR"], med["ckpt convert same.pt"]
    print(f"| DCP / pt conversion speed | {pt_s / dcp_s:.2f}x | (target >= 0.8x) |")
    # ckpt convert fsyncs its output: the like-for-like ratio is against torch's way + fsync.
    print(f"| ckpt over torch + fsync | {med['dcp_to_torch_save + save_file + fsync'] / dcp_s:.1f}x "
          f"| (target >= 5x) |")
    print(f"| ckpt over torch without fsync | {med['dcp_to_torch_save + save_file'] / dcp_s:.1f}x | |")
    w = med["machine: write as many bytes to a new file + fsync"]
    print(f"| ckpt convert DIR over the machine's write | {w / dcp_s:.2f}x | |")
    print(f"| peak RSS of ckpt convert DIR (budget 128 MiB) | {rss / 2**20:.0f} MiB (largest tensor 16 MiB) |")
    print(f"| peak RSS of ckpt convert DIR --budget-mb 64 | {rss_small / 2**20:.0f} MiB |")
    print(json.dumps({"median_s": med, "best_s": best, "peak_rss": rss, "peak_rss_budget_64": rss_small,
                      "bytes": size}))
    if os.path.exists(os.path.join(a.out, "tmp.pt")):
        os.remove(os.path.join(a.out, "tmp.pt"))


if __name__ == "__main__":
    main()
