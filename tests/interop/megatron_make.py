"""Writes Megatron-core `torch_dist` checkpoints with megatron-core itself (test_megatron.py).

Run by torchrun in the megatron venv (tests/peers/megatron.txt layered on the peers by
scripts/install-peers.sh --on; `python -m torch.distributed.run --nproc-per-node 2
megatron_make.py OUT`, gloo on the CPU), the 2 ranks save with
megatron.core.dist_checkpointing.save (its default TorchDistSaveShardedStrategy):
  OUT/hand  a sharded state dict made by hand: ShardedTensor.from_rank_offsets split along
            dim 0 (float32 and bfloat16), along dim 1, replicated (replica_id = rank) and
            stacked (prepend_axis_num=1: each rank one slice of a new leading axis, as
            Megatron stacks layers); ShardedObjects, one per rank and one replicated; and
            plain values, which dist_checkpointing keeps in common.pt
  OUT/gpt   a GPTModel (megatron.core.models.gpt, the local layer spec, no Transformer Engine)
            with tensor parallelism 2 on the CPU: its sharded_state_dict()
Then megatron reads each folder back itself and rank 0 writes OUT/<name>.ref.pt (torch.save of
plain data): {"tensors": dist_checkpointing.load_plain_tensors (every global tensor by its
key), "common": load_common_state_dict, "objects": {unique_key: what load gives each
ShardedObject}, "megatron": megatron-core's version}. OUT/<name>.error holds the traceback when
a folder could not be made (test_megatron.py reports it).
"""

import os
import subprocess
import sys
import traceback

import torch

import torchrun_util

WORLD = 2
FOLDERS = ("hand", "gpt")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def same(a, b):
    """a and b equal, tensors bit for bit and of one dtype, through dicts, lists and tuples (the
    tests' comparison of ckpt's values with megatron's)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and sorted(a) == sorted(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def venv_python():
    """(python, "") of the megatron venv, made when missing (scripts/install-peers.sh --on the
    peers venv, tests/peers/megatron.txt; `make peers` makes it too), or (None, why) when it
    cannot be made (no network: pip's error)."""
    script = os.path.join(REPO, "scripts", "install-peers.sh")
    req = os.path.join(REPO, "tests", "peers", "megatron.txt")
    peers = subprocess.run([script, "--path"], capture_output=True, text=True,
                           check=True).stdout.strip()
    r = subprocess.run([script, "--on", peers, req, "megatron"], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode != 0:
        return None, f"{script} --on {peers} {req} megatron failed:\n{r.stderr[-2000:]}"
    return os.path.join(r.stdout.strip().splitlines()[-1], "bin", "python"), ""


def hand(rank):
    """The sharded state dict to save."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    g = torch.Generator().manual_seed(7)
    full = {"rows": torch.randn(6, 4, generator=g), "cols": torch.randn(3, 8, generator=g),
            "repl": torch.randn(2, 3, generator=g), "stack": torch.randn(WORLD, 3, 5, generator=g),
            "half": torch.randn(4, 4, generator=g).to(torch.bfloat16)}
    sd = {
        "rows": ShardedTensor.from_rank_offsets(
            "hand.rows", full["rows"].chunk(WORLD)[rank].clone(), (0, rank, WORLD)),
        "cols": ShardedTensor.from_rank_offsets(
            "hand.cols", full["cols"].chunk(WORLD, dim=1)[rank].contiguous(), (1, rank, WORLD)),
        "repl": ShardedTensor.from_rank_offsets("hand.repl", full["repl"].clone(),
                                                replica_id=rank),
        "layers": {"stack": ShardedTensor.from_rank_offsets(
            "hand.stack", full["stack"][rank].clone(), (0, rank, WORLD), prepend_axis_num=1)},
        "half": ShardedTensor.from_rank_offsets(
            "hand.half", full["half"].chunk(WORLD)[rank].clone(), (0, rank, WORLD)),
        "per_rank": ShardedObject("hand.per_rank", {"rank": rank, "lrs": [0.1, 0.01]},
                                  (WORLD,), (rank,)),
        "shared": ShardedObject("hand.shared", {"seed": 7, "name": "run-a"}, (1,), (0,),
                                replica_id=rank),
        # Not sharded: common.pt (rank 0's; dist_checkpointing checks the ranks agree).
        "step": 12, "name": "run-a", "scale": torch.tensor([1.5, 2.5]),
        "nested": {"lrs": [0.1, 0.01], "mask": torch.tensor([True, False])},
    }
    return sd


def gpt(rank):
    """A GPTModel with tensor parallelism 2, built on the CPU; its sharded state dict."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=WORLD)
    torch.manual_seed(1)
    cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                            ffn_hidden_size=96, use_cpu_initialization=True,
                            params_dtype=torch.float32)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=256, max_sequence_length=64)
    return model.sharded_state_dict()


def read_back(folder):
    """Megatron's own reading of the folder (every rank calls it; rank 0's is kept).

    dist_checkpointing.load_plain_tensors is load() of one unsharded ShardedTensor per global
    tensor, made by load_tensors_metadata; megatron-core 0.16.1's load_tensors_metadata fails on
    torch 2.15 (strategies/torch.py: torch.empty(tp.size, **tp.properties.__dict__) meets the
    `strides` field torch's TensorProperties now has), so the same template is made here from
    torch's own reading of .metadata and given to dist_checkpointing.load. The ShardedObjects
    are loaded as load_sharded_metadata finds them: one per bytes item of .metadata
    (ShardedObject.empty_from_unique_key)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    from torch.distributed.checkpoint import (BytesStorageMetadata, FileSystemReader,
                                              TensorStorageMetadata)

    md = FileSystemReader(folder).read_metadata()
    plain = {k: ShardedTensor.from_rank_offsets(k, torch.empty(tuple(m.size),
                                                               dtype=m.properties.dtype))
             for k, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    tensors = dist_checkpointing.load(plain, folder, validate_access_integrity=False)
    common = dist_checkpointing.load_common_state_dict(folder)
    objects = {k: ShardedObject.empty_from_unique_key(k)
               for k, m in md.state_dict_metadata.items() if isinstance(m, BytesStorageMetadata)}
    loaded = dist_checkpointing.load(objects, folder, validate_access_integrity=False)
    got = {k: loaded[k] for k in objects}
    return {"tensors": {k: tensors[k] for k in plain}, "common": common, "objects": got}


def cpu_only_cuda_calls():
    """megatron-core's torch_dist save assumes a GPU in two calls that move no checkpoint bytes:
    FileSystemWriterAsync.preload_tensors ends with torch.cuda.synchronize() (after copying the
    tensors to the CPU, filesystem_async.py) and save_state_dict_async_finalize broadcasts its
    failure flag in a tensor on torch.cuda.current_device() (state_dict_saver.py); on a machine
    without CUDA both raise. Here the first does nothing and the second names the CPU (gloo
    broadcasts it); everything megatron writes is its own."""
    if torch.cuda.is_available():
        return
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: "cpu"


def main():
    import megatron.core
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    out = sys.argv[1]
    cpu_only_cuda_calls()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for name, make in (("hand", hand), ("gpt", gpt)):
        folder = os.path.join(out, name)
        try:
            if rank == 0:
                os.makedirs(folder, exist_ok=True)
            dist.barrier()
            sd = make(rank)
            dist_checkpointing.save(sd, folder)
            dist.barrier()
            ref = read_back(folder)
            ref["megatron"] = megatron.core.__version__
            if rank == 0:
                torch.save(ref, os.path.join(out, name + ".ref.pt"))
        except Exception:  # the test names what failed; the other folder is still made
            if rank == 0:
                with open(os.path.join(out, name + ".error"), "w") as f:
                    f.write(traceback.format_exc())
        dist.barrier()
    dist.destroy_process_group()


def make(out, python):
    """Runs this file under torchrun with `python` (the megatron venv's); returns
    {name: folder or None} and {name: the traceback of a folder that could not be made}."""
    torchrun_util.run_ranks([python, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", str(WORLD), os.path.abspath(__file__), out], out)
    folders, errors = {}, {}
    for name in FOLDERS:
        err = os.path.join(out, name + ".error")
        if os.path.exists(err):
            errors[name] = open(err).read()
        folders[name] = os.path.join(out, name) if name not in errors else None
    return folders, errors


if __name__ == "__main__":
    main()
