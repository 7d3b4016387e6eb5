"""`ckpt load FILE --rank R --world N --plan PLAN` (the dry run of a rank's load): the boxes are
DTensor's Shard split, and the bytes at the printed file ranges are exactly torch's slice of the
tensor, for a torch zip, a safetensors file and a Hugging Face sharded set; plans that do not fit
exit 8 naming the tensor."""

import json

import pytest
import torch
from safetensors.torch import save_file
from torch.distributed.tensor import Shard

PLAN = {"*.weight": "shard:0", "re:.*bias": "shard:-1", "cols": "shard:1",
        "box": {"begin": [1, 2], "end": [3, 5]}}


def model():
    g = torch.Generator().manual_seed(9)
    return {"a.weight": torch.randn(10, 6, generator=g), "a.bias": torch.randn(7, generator=g),
            "cols": torch.randn(4, 9, generator=g).to(torch.bfloat16),
            "box": torch.randn(5, 6, generator=g), "step": torch.tensor(3)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks_cli")
    sd = model()
    torch.save(sd, d / "m.pt")
    save_file(sd, str(d / "m.safetensors"))
    save_file({k: sd[k] for k in ("a.weight", "a.bias")}, str(d / "s1.safetensors"))
    save_file({k: sd[k] for k in ("cols", "box", "step")}, str(d / "s2.safetensors"))
    wm = {"a.weight": "s1.safetensors", "a.bias": "s1.safetensors", "cols": "s2.safetensors",
          "box": "s2.safetensors", "step": "s2.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    (d / "plan.json").write_text(json.dumps(PLAN))
    return d


def want(name, t, rank, world):
    if name == "box":
        return t[1:3, 2:5]
    dim = {"a.weight": 0, "a.bias": 0, "cols": 1}.get(name)
    if dim is None:
        return t
    return Shard(dim)._split_tensor(t, world, with_padding=False)[0][rank]


@pytest.mark.parametrize("name", ["m.pt", "m.safetensors", "model.safetensors.index.json"])
@pytest.mark.parametrize("world", [1, 3, 4])
def test_ranges_hold_the_rank_bytes(ckpt, files, name, world):
    sd = model()
    for rank in range(world):
        out = ckpt.json("load", files / name, "--rank", rank, "--world", world,
                        "--plan", files / "plan.json", "--json")
        assert out["rank"] == rank and out["world"] == world
        total = 0
        for t in out["tensors"]:
            w = want(t["name"], sd[t["name"]], rank, world)
            assert [e - b for b, e in zip(t["begin"], t["end"])] == list(w.shape), t
            assert t["exact"], t
            got = b"".join(open(r["file"] if r["file"].startswith("/") else files / r["file"],
                                "rb").read()[r["offset"]:r["offset"] + r["length"]]
                           for r in t["ranges"])
            assert got == w.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), (t["name"], rank)
            # Rows along dim 0 are one range; a column shard one range per row.
            if t["name"] == "cols" and w.numel():
                assert len(t["ranges"]) == (4 if world > 1 else 1), t
            elif w.numel():
                assert len(t["ranges"]) == (2 if t["name"] == "box" else 1), t
            total += sum(r["length"] for r in t["ranges"])
        assert out["read_bytes"] == total


def test_plans_that_do_not_fit(ckpt, files):
    (files / "strict.json").write_text(json.dumps({"tensors": {"a.*": "shard:0"},
                                                   "default": None}))
    r = ckpt.run("load", files / "m.pt", "--world", 2, "--plan", files / "strict.json")
    assert r.returncode == 8 and "cols" in r.stderr and "no rule" in r.stderr, r.stderr
    (files / "scalar.json").write_text(json.dumps({"*": "shard:0"}))
    r = ckpt.run("load", files / "m.pt", "--world", 2, "--plan", files / "scalar.json")
    assert r.returncode == 8 and "step" in r.stderr, r.stderr
    (files / "bad.json").write_text(json.dumps({"*": "shard:x"}))
    r = ckpt.run("load", files / "m.pt", "--world", 2, "--plan", files / "bad.json")
    assert r.returncode == 8 and "bad.json" in r.stderr, r.stderr
    r = ckpt.run("load", files / "m.pt", "--rank", 2, "--world", 2)
    assert r.returncode == 8, r.stderr
