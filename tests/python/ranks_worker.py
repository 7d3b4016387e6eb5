"""One rank of tests/python/test_ranks.py, run by torchrun (gloo on the CPU).

    torchrun --nproc-per-node N ranks_worker.py DIR loads|kill|timeout

loads: every file of DIR/files.json loaded with every plan; each rank's tensors compared with
torch.load's sliced as DTensor's Shard splits, and the bytes read (ckpt's counter) recorded.
kill: rank 1 leaves the group before loading; timeout: rank 1 never joins the exchange. The
other ranks record the error they get. Results: DIR/<case>.<rank>.json.
"""

import datetime
import fnmatch
import json
import os
import re
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate as DReplicate
from torch.distributed.tensor import Shard as DShard

import ckpt
from ckpt import _ranks


def plans():
    return {
        "dict": {"*.weight": ckpt.Shard(0), "layers.0.bias": ckpt.Shard(0)},
        "glob": {"layers.*": ckpt.Shard(-1)},
        "callable": lambda name, shape, dtype: (ckpt.Shard(1) if len(shape) == 2 and
                                                dtype == torch.float32 else ckpt.Replicate()),
        "dtensor": {"emb.*": DShard(1), r"re:layers\.\d+\.weight": DShard(0), "*": DReplicate()},
        "replicate": None,
    }


def dim_of(plan, name, t):
    """The Shard dimension `plan` gives `name` (None: replicated), as the plan says it."""
    if plan is None:
        return None
    if callable(plan):
        p = plan(name, tuple(t.shape), t.dtype)
    else:
        p = None
        for pattern, q in plan.items():
            hit = (re.fullmatch(pattern[3:], name) if pattern.startswith("re:")
                   else fnmatch.fnmatchcase(name, pattern))
            if hit:
                p = q
                break
    if p is None or isinstance(p, (ckpt.Replicate, DReplicate)):
        return None
    return p.dim % t.dim()


def expected(t, dim, rank, world):
    if dim is None:
        return t
    # DTensor's own split: torch.chunk, empty parts for the last ranks.
    shards, _ = DShard(dim)._split_tensor(t, world, with_padding=False)
    return shards[rank]


def check_loads(d, rank, world):
    files = json.load(open(os.path.join(d, "files.json")))
    ref = torch.load(files.pop("ref"))
    out = {}
    for fmt, path in files.items():
        for pname, plan in plans().items():
            b0 = _ranks.bytes_read()
            ckpt.open(path, mmap=False)
            b1 = _ranks.bytes_read()
            sd = ckpt.load(path, plan=plan, group=dist.group.WORLD, timeout=20,
                           exchange_budget=4096)
            b2 = _ranks.bytes_read()
            bad = []
            assert set(sd) == set(ref), (fmt, sorted(sd), sorted(ref))
            for name, t in ref.items():
                want = expected(t, dim_of(plan, name, t), rank, world)
                got = sd[name]
                if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
                    bad.append(name)
            out[f"{fmt}/{pname}"] = {"bad": bad, "read": (b2 - b1) - (b1 - b0)}
    return out


def main():
    d, case = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    files = json.load(open(os.path.join(d, "files.json")))
    result = {}
    if case == "loads":
        result = check_loads(d, rank, world)
        dist.barrier()
    elif rank == 1:
        if case == "timeout":
            time.sleep(12)  # in the group, never in the exchange
        os._exit(0)  # "kill": gone, its connections closed
    else:
        t0 = time.monotonic()
        try:
            ckpt.load(files["safetensors"], group=dist.group.WORLD, timeout=3)
            result = {"error": None}
        except ckpt.RankError as e:
            result = {"error": "RankError", "text": str(e), "rank": e.rank, "tensor": e.tensor,
                      "cause": type(e.__cause__).__name__}
        except Exception as e:  # noqa: BLE001 - recorded for the test to show
            result = {"error": type(e).__name__, "text": str(e)}
        result["seconds"] = time.monotonic() - t0
    with open(os.path.join(d, f"{case}.{rank}.json"), "w") as f:
        json.dump(result, f)
    # No gloo teardown (it aborts a rank now and then on a loaded machine): the results are out.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
