#!/usr/bin/python3
"""ckpt's pre-pack cache (issue 12, docs/benchmarks/onnx.md "Pre-pack cache"): a 1 GiB float32 torch
checkpoint (`ckpt sample`), each example packer: the first `ckpt prepack` (packs every 2-D
tensor and stores it) against the next one (maps the stored blobs), and 4 processes holding
the same blobs mapped (every page touched): PSS per process.

Usage: bench/prepack_cache.py CKPT_BIN WORKDIR [SIZE_MB]
"""
import json
import os
import shutil
import subprocess
import sys


def run(*args):
    r = subprocess.run(list(map(str, args)), capture_output=True, text=True, check=True)
    return json.loads(r.stdout) if "--json" in args else r.stdout


def main():
    ckpt, work = sys.argv[1], sys.argv[2]
    size = sys.argv[3] if len(sys.argv) > 3 else "1024"
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "model.pt")
    if not os.path.exists(model):
        run(ckpt, "sample", model, "--size-mb", size, "--dtype", "float32")
    print(f"checkpoint: {os.path.getsize(model) / 2**20:.0f} MiB (ckpt sample, float32)")
    print(f"{'packer':20} {'packed bytes':>12} {'pack+store s':>13} {'from cache s':>13} "
          f"{'ratio':>6} {'PSS MiB each (4)':>17}")
    for packer in ("transpose-blocks64", "int8-rows"):
        cache = os.path.join(work, "cache-" + packer)
        shutil.rmtree(cache, ignore_errors=True)
        first = run(ckpt, "prepack", model, "--packer", packer, "--cache-dir", cache, "--json")
        second = run(ckpt, "prepack", model, "--packer", packer, "--cache-dir", cache, "--json")
        assert second["hits"] == len(second["tensors"])
        procs = [subprocess.Popen([ckpt, "prepack", model, "--packer", packer, "--cache-dir", cache,
                                   "--json", "--hold-ms", "3000"], stdout=subprocess.PIPE, text=True)
                 for _ in range(4)]
        four = [json.loads(p.communicate()[0]) for p in procs]
        pss = sum(f["pss_kb"] for f in four) / 4 / 1024
        print(f"{packer:20} {first['bytes'] / 2**20:10.0f}Mi {first['seconds']:13.3f} "
              f"{second['seconds']:13.3f} {first['seconds'] / second['seconds']:6.0f} {pss:17.0f}")


if __name__ == "__main__":
    main()
