"""Writes the training layouts of tests/interop/test_layouts.py with torch itself.

Run by torchrun (`torchrun --nproc-per-node 2 layouts_make.py OUT`, gloo on the CPU), the ranks
hold a small Llama (transformers, from a config) sharded by FSDP2 (fully_shard: every parameter a
DTensor Shard(0) over the 2-rank mesh), plus DTensors placed by hand, and save:
  OUT/st          dcp.save through FileSystemWriter(serialization_format=SAFETENSORS)
  OUT/ranklocal   dcp.save(..., use_collectives=False): one `__<rank>.metadata` per rank
  OUT/hf_dist     the model's state dict through HuggingFaceStorageWriter(save_distributed=True):
                  shard-<rank>-model-00001-of-00001.safetensors, no index
  OUT/hf_cons     the same with enable_consolidation=True: OUT/hf_cons/sharded/ holds the shards,
                  OUT/hf_cons the consolidated files and model.safetensors.index.json
  OUT/verl        what verl's FSDP checkpoint manager writes: torch.save(model.state_dict()) of
                  the DTensors, per rank, as model_world_size_2_rank_<rank>.pt, and the model's
                  config.json in OUT/verl/huggingface/
Rank 0 also writes OUT/<name>.ref.pt: torch.save of the full tensors each layout holds, and
OUT/model/ (save_pretrained of the unsharded model) for from_pretrained comparisons.
"""

import os
import sys

import torch

import torchrun_util

WORLD = 2
LAYOUTS = ("st", "ranklocal", "hf_dist", "hf_cons", "verl")


def llama():
    import transformers

    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   hidden_size=64, intermediate_size=96, vocab_size=250,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(cfg).eval()


def placed(mesh):
    """DTensors placed by hand: Shard(0) (uneven too), Shard(1), Replicate(), bfloat16."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(7)
    full = {"rows": torch.randn(6, 4, generator=g), "uneven": torch.randn(5, 3, generator=g),
            "cols": torch.randn(3, 8, generator=g), "repl": torch.randn(2, 3, generator=g),
            "half": torch.randn(4, 4, generator=g).to(torch.bfloat16)}
    place = {"rows": Shard(0), "uneven": Shard(0), "cols": Shard(1), "repl": Replicate(),
             "half": Shard(0)}
    return full, {k: distribute_tensor(v, mesh, [place[k]]) for k, v in full.items()}


def full_of(sd):
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in sd.items()}


def main():
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter, HuggingFaceStorageWriter
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (WORLD,))
    model = llama()
    if rank == 0:
        model.save_pretrained(os.path.join(out, "model"))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    msd = model.state_dict()  # DTensors, Shard(0) over the mesh
    model_full = full_of(msd)
    hand_full, hand = placed(mesh)
    extra = {"step": 12, "name": "run-a", "lrs": [0.1, 0.01]}
    nested = {"model": msd, "hand": hand, "extra": extra}
    nested_ref = {**{"model." + k: v for k, v in model_full.items()},
                  **{"hand." + k: v for k, v in hand_full.items()}}

    dcp.save(nested, storage_writer=FileSystemWriter(
        os.path.join(out, "st"), serialization_format=SerializationFormat.SAFETENSORS))
    dcp.save(nested, checkpoint_id=os.path.join(out, "ranklocal"), use_collectives=False)
    flat = dict(msd)
    flat.update({"hand." + k: v for k, v in hand.items()})
    flat_ref = {**model_full, **{"hand." + k: v for k, v in hand_full.items()}}
    dcp.save(flat, storage_writer=HuggingFaceStorageWriter(os.path.join(out, "hf_dist"),
                                                          save_distributed=True))
    dcp.save(flat, storage_writer=HuggingFaceStorageWriter(
        os.path.join(out, "hf_cons"), save_distributed=True, enable_consolidation=True))
    os.makedirs(os.path.join(out, "verl"), exist_ok=True)
    torch.save(msd, os.path.join(out, "verl", f"model_world_size_{WORLD}_rank_{rank}.pt"))
    dist.barrier()
    if rank == 0:
        model.config.save_pretrained(os.path.join(out, "verl", "huggingface"))
        refs = {"st": nested_ref, "ranklocal": nested_ref, "hf_dist": flat_ref,
                "hf_cons": flat_ref, "verl": model_full}
        for name, ref in refs.items():
            torch.save(ref, os.path.join(out, name + ".ref.pt"))
    dist.barrier()
    dist.destroy_process_group()


def make_layouts(out):
    """Runs this file under torchrun (2 ranks, gloo); returns {layout: folder}."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    torchrun_util.run_ranks([torchrun, "--standalone", "--nproc-per-node", str(WORLD),
                             os.path.abspath(__file__), out], out)
    return {name: os.path.join(out, name) for name in LAYOUTS + ("model",)}


if __name__ == "__main__":
    main()
