"""Writing torch.distributed.checkpoint folders from Python: ckpt.save(obj, DIR, format="dcp")
and Checkpoint.convert(DIR, format="dcp"); torch's dcp.load (one process, no process group)
reads them into a state dict of the same structure."""

import os
import warnings

import pytest
import torch

import ckpt

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="DCP is read back by torch 2.x")


@pytest.fixture(scope="module")
def dcp():
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        pytest.skip("torch.distributed is not available")
    return dcp


def state():
    torch.manual_seed(1)
    return {"model": {"w": torch.randn(9, 4), "b": torch.randn(4).to(torch.bfloat16)},
            "step": 12, "lr": [1e-3, 5e-4], "tag": "x",
            "groups": [{"params": [0, 1], "wd": 0.1}]}


def load_into_template(dcp, folder):
    sd = {"model": {"w": torch.zeros(9, 4), "b": torch.zeros(4, dtype=torch.bfloat16)},
          "step": None, "lr": None, "tag": None, "groups": [{"params": None, "wd": None}]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, checkpoint_id=str(folder))
    return sd


def same(a, b):
    if isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(b, dict):
        assert list(a) == list(b)
        for k in b:
            same(a[k], b[k])
    elif isinstance(b, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("files", [None, 3])
def test_save_dcp_then_dcp_load(dcp, tmp_path, files):
    out = tmp_path / "ckpt_dcp"
    kw = {} if files is None else {"dcp_files": files}
    ckpt.save(state(), out, format="dcp", **kw)
    n = files or 1
    assert sorted(os.listdir(out)) == [".metadata"] + [f"__{r}_0.distcp" for r in range(n)]
    same(load_into_template(dcp, out), state())
    # ckpt reads it back as dcp_to_torch_save would give it.
    back = ckpt.load(out)
    assert torch.equal(back["model"]["w"], state()["model"]["w"])
    assert back["step"] == 12 and back["groups"][0]["params"] == [0, 1]


def test_convert_to_dcp(dcp, tmp_path):
    src = tmp_path / "in.pt"
    torch.save(state(), src)
    out = tmp_path / "out"
    r = ckpt.open(src).convert(out, format="dcp", dcp_files=2)
    assert r["format"] == "dcp" and r["files"][-1] == ".metadata"
    same(load_into_template(dcp, out), state())


def test_refusals(tmp_path):
    with pytest.raises(ckpt.InvalidArgumentError, match="dcp_files"):
        ckpt.save(state(), tmp_path / "a.pt", dcp_files=2)
    with pytest.raises(ckpt.InvalidArgumentError, match="dcp_files"):
        ckpt.save(state(), tmp_path / "d", format="dcp", dcp_files=0)
    with pytest.raises(ckpt.InvalidArgumentError, match="dict"):
        ckpt.save(torch.ones(2), tmp_path / "d", format="dcp")
    with pytest.raises(ckpt.InvalidArgumentError, match="dcp_files"):
        ckpt.open(_saved(tmp_path)).convert(tmp_path / "x.safetensors", dcp_files=2)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep").write_text("x")
    with pytest.raises(ckpt.InvalidArgumentError, match="not empty"):
        ckpt.save(state(), taken, format="dcp")
    assert os.listdir(taken) == ["keep"]
    assert not os.path.exists(tmp_path / "d")


def _saved(tmp_path):
    p = tmp_path / "s.pt"
    torch.save({"w": torch.ones(2)}, p)
    return p
