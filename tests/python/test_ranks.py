"""Loading across ranks (ckpt.load(plan=..., group=...)) under torchrun with gloo on the CPU:
every rank's tensors equal torch.load's sliced as DTensor's Shard splits, for a torch zip, a
safetensors file, a Hugging Face sharded set, a DCP folder and a tensorizer file, with plans from
a dict, a glob, a callable and DTensor placements; the group reads each tensor byte once, in
every format (ckpt's byte counter); a rank gone or late gives ckpt.RankError within the timeout."""

import json
import os
import subprocess
import sys

import pytest
import torch

import ckpt

# torch 2.x (DTensor, torchrun) and safetensors: not in Debian's torch 1.13 tier.
pytest.importorskip("safetensors")
pytest.importorskip("torch.distributed.tensor")

HERE = os.path.dirname(os.path.abspath(__file__))


def model():
    g = torch.Generator().manual_seed(5)
    return {
        "emb.weight": torch.randn(10, 6, generator=g),
        "layers.0.weight": torch.randn(7, 5, generator=g),
        "layers.0.bias": torch.randn(7, generator=g),
        "layers.1.weight": torch.randn(9, 4, generator=g).to(torch.bfloat16),
        "norm.scale": torch.randn(3, generator=g),
        "step": torch.tensor(5),
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from safetensors.torch import save_file
    import torch.distributed.checkpoint as dcp

    d = tmp_path_factory.mktemp("ranks")
    sd = model()
    torch.save(sd, d / "ref.pt")
    torch.save(sd, d / "m.pt")
    save_file(sd, str(d / "m.safetensors"))
    names = sorted(sd)
    parts = {"a.safetensors": names[:3], "b.safetensors": names[3:]}
    for f, ns in parts.items():
        save_file({n: sd[n] for n in ns}, str(d / f))
    with open(d / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: f for f, ns in parts.items() for n in ns}}, f)
    dcp.save(sd, checkpoint_id=str(d / "dcp"), no_dist=True)
    out = {"ref": str(d / "ref.pt"), "torch": str(d / "m.pt"),
           "safetensors": str(d / "m.safetensors"),
           "hf_set": str(d / "model.safetensors.index.json"), "dcp": str(d / "dcp")}
    try:
        from tensorizer import TensorSerializer
        s = TensorSerializer(str(d / "m.tensors"))
        s.write_state_dict(sd)
        s.close()
        out["tensorizer"] = str(d / "m.tensors")
    except ImportError:
        pass
    with open(d / "files.json", "w") as f:
        json.dump(out, f)
    return d


def torchrun(d, n, case, built_path, ranks=None):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([built_path, os.environ.get("PYTHONPATH", "")]))
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone",
           "--nproc-per-node", str(n), os.path.join(HERE, "ranks_worker.py"), str(d), case]
    for name in os.listdir(d):
        if name.startswith(case + "."):
            os.unlink(d / name)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    results = {}
    for rank in ranks if ranks is not None else range(n):
        p = d / f"{case}.{rank}.json"
        assert p.exists(), f"rank {rank} wrote nothing ({r.returncode}):\n{r.stderr[-4000:]}"
        results[rank] = json.loads(p.read_text())
    return results


@pytest.mark.parametrize("n", [2, 4])
def test_every_rank_holds_its_part(files, n, built_path):
    results = torchrun(files, n, "loads", built_path)
    model_bytes = sum(t.numel() * t.element_size() for t in model().values())
    cases = results[0].keys()
    assert {c.split("/")[0] for c in cases} >= {"torch", "safetensors", "hf_set", "dcp"}
    for case in cases:
        for rank in range(n):
            assert results[rank][case]["bad"] == [], (case, rank)
        read = sum(results[rank][case]["read"] for rank in range(n))
        # Each byte once across the group (a DCP folder: of each chunk, only the part that
        # meets a rank's box).
        assert read == model_bytes, (case, read, model_bytes)


@pytest.mark.parametrize("case", ["kill", "timeout"])
def test_a_lost_rank_is_a_typed_error(files, case, built_path):
    results = torchrun(files, 2, case, built_path, ranks=[0])  # rank 1 leaves
    r = results[0]
    assert r["error"] == "RankError", r
    assert r["rank"] == 0 and r["tensor"] in model(), r
    assert "rank 0 of 2" in r["text"], r
    assert r["seconds"] < 15, r


def test_single_process_plan_reads_only_its_part(files):
    # No process group: rank 0 of 1, each tensor whole; a Box reads just the box.
    sd = ckpt.load(str(files / "m.safetensors"), plan={"emb.weight": ckpt.Box([2, 1], [5, 4])})
    ref = model()
    assert torch.equal(sd["emb.weight"], ref["emb.weight"][2:5, 1:4])
    assert torch.equal(sd["layers.0.weight"], ref["layers.0.weight"])
    with pytest.raises(ckpt.InvalidArgumentError, match="step"):
        ckpt.load(str(files / "m.pt"), plan={"*": ckpt.Shard(0)})


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is usable here")
def test_a_device_load_without_a_gpu_is_unsupported(files):
    # The rank load goes to the device itself (no host load moved afterwards): without one it
    # raises UnsupportedError naming the device, before any tensor byte is read.
    path = str(files / "m.safetensors")
    b0 = ckpt._ranks.bytes_read()
    ckpt.open(path, mmap=False)
    b1 = ckpt._ranks.bytes_read()
    with pytest.raises(ckpt.UnsupportedError, match="cuda"):
        ckpt.load(path, map_location="cuda", plan={"*.weight": ckpt.Shard(0)})
    assert ckpt._ranks.bytes_read() - b1 == b1 - b0  # what opening reads, no tensor byte
