"""Writes torch.distributed.checkpoint (DCP) folders for tests/interop/test_dcp.py.

Run by torchrun (`torchrun --nproc-per-node 4 dcp_make.py OUT`, gloo on the CPU) it saves, with
every rank writing its own shards:
  OUT/dtensor  DTensors over a 4-rank mesh: Shard(0) (even and uneven), Shard(1), Replicate(),
               a bfloat16 Shard(0), a plain tensor every rank holds, and non-tensor values
  OUT/fsdp     an FSDP2 (fully_shard) model and its Adam state after one step, through
               torch.distributed.checkpoint.state_dict.get_state_dict
Run by plain python (`python dcp_make.py OUT --single`) it saves OUT/single from one process:
nested dicts and lists, several dtypes, an empty tensor, a 0-d tensor and non-tensor values.
"""

import os
import sys

import torch

import torchrun_util


def dtensor_state(mesh, rank):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(7)
    full = {
        "rows": torch.randn(16, 8, generator=g),
        "uneven": torch.randn(10, 3, generator=g),
        "cols": torch.randn(8, 12, generator=g),
        "cube": torch.randn(4, 6, 8, generator=g),
        "repl": torch.randn(5, 3, generator=g),
        "half": torch.randn(12, 4, generator=g).to(torch.bfloat16),
    }
    place = {"rows": Shard(0), "uneven": Shard(0), "cols": Shard(1), "cube": Shard(2),
             "repl": Replicate(), "half": Shard(0)}
    sd = {"model": {k: distribute_tensor(v, mesh, [place[k]]) for k, v in full.items()}}
    sd["model"]["plain"] = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    sd["extra"] = {"step": 12, "name": "run-a", "lrs": [0.1, 0.01]}
    return sd


def fsdp_state(mesh):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 6))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(5)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def single_state():
    g = torch.Generator().manual_seed(11)
    return {
        "enc": {"w": torch.randn(7, 5, generator=g), "b": torch.zeros(5, dtype=torch.float16)},
        "layers": [{"w": torch.randn(3, 3, generator=g).double()},
                   {"w": torch.randint(-5, 5, (4,), generator=g, dtype=torch.int64)}],
        "mask": torch.rand(9, generator=g) > 0.5,
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(2.5),
        "meta": {"epoch": 3, "tags": ["a", "b"]},
    }


def make_folders(out):
    """Runs dcp_make.py: 4 ranks (torchrun, gloo) and one process; the dcp_to_torch_save of each."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    torchrun_util.run_ranks([torchrun, "--standalone", "--nproc-per-node", "4",
                             os.path.abspath(__file__), out], out, made=("dtensor", "fsdp"), timeout=600)
    torchrun_util.run_ranks([sys.executable, os.path.abspath(__file__), out, "--single"], out,
                            made=("single",), timeout=600)
    dirs = {}
    for name in ("dtensor", "fsdp", "single"):
        d = os.path.join(out, name)
        dcp_to_torch_save(d, d + ".pt")
        dirs[name] = d
    return dirs


def main():
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    out = sys.argv[1]
    if "--single" in sys.argv:
        dcp.save(single_state(), checkpoint_id=os.path.join(out, "single"), no_dist=True)
        return
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dcp.save(dtensor_state(mesh, rank), checkpoint_id=os.path.join(out, "dtensor"))
    dcp.save(fsdp_state(mesh), checkpoint_id=os.path.join(out, "fsdp"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
