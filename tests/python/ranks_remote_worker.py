"""One rank of tests/python/test_ranks_remote.py, run by torchrun (gloo on the CPU).

    torchrun --nproc-per-node N ranks_remote_worker.py DIR

DIR/cases.json: {"ref": a local safetensors file, "open": a URL rank 0 only opens (one
process's metadata reads), "cases": [{"url": ..., "plan": "replicate" | "shard"}, ...]}. Every
rank loads every case's URL with its plan and compares its tensors with the reference sliced as
DTensor's Shard splits. Results: DIR/remote.<rank>.json (the names of tensors that differ).
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.tensor import Shard as DShard

import ckpt


def main():
    d = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = json.load(open(os.path.join(d, "cases.json")))
    ref = load_file(spec["ref"])
    if rank == 0:
        ckpt.open(spec["open"])
    out = {}
    for case in spec["cases"]:
        plan = ckpt.Shard(0) if case["plan"] == "shard" else ckpt.Replicate()
        sd = ckpt.load(case["url"], plan=plan, group=dist.group.WORLD, timeout=60)
        bad = sorted(set(sd) ^ set(ref))
        for name, t in ref.items():
            want = t
            if case["plan"] == "shard":
                want = DShard(0)._split_tensor(t, world, with_padding=False)[0][rank]
            if name in sd and (sd[name].shape != want.shape or not torch.equal(sd[name], want)):
                bad.append(name)
        out[case["url"]] = bad
        dist.barrier()
    with open(os.path.join(d, f"remote.{rank}.json"), "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    os._exit(0)  # no gloo teardown (as ranks_worker.py)


if __name__ == "__main__":
    main()
