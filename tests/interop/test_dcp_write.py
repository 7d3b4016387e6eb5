"""Writing torch.distributed.checkpoint (DCP) folders: `ckpt convert IN OUT --to dcp`.

The peer is torch itself: `torch.distributed.checkpoint.load` (one process, no process group)
must read what ckpt writes into a state dict of the same structure with equal tensors, exactly
as it reads what torch's own `dcp.save` writes for the same object; `dcp_to_torch_save` of ckpt's
folder must equal the input; and ckpt must read its own folders back.
"""

import copy
import os
import warnings

import pytest
import torch

import helpers
from conftest import one_error_line

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="DCP is read back by torch 2.x")
INVALID_ARGUMENT = 8


@pytest.fixture(scope="module")
def dcp():
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        pytest.skip("torch.distributed is not available")
    return dcp


def dcp_load(dcp, like, folder):
    """What a single process does to resume: dcp.load into a state dict of the right structure
    (here: `like` with every tensor zeroed and every other leaf None, so that each value
    compared afterwards is one dcp.load read), no process group."""
    sd = copy.deepcopy(like)

    def zero(x):  # in place: an OrderedDict keeps its _metadata
        if isinstance(x, torch.Tensor):
            return torch.zeros_like(x)
        if isinstance(x, dict):
            for k in x:
                x[k] = zero(x[k])
        elif isinstance(x, list):
            x[:] = [zero(v) for v in x]
        else:
            return None
        return x

    zero(sd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.load(sd, checkpoint_id=str(folder))
    return sd


def training_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": {"epoch": 3, "name": "run-7", "loss": 0.25, "nested": {"bf": torch.randn(
            3, 5).to(torch.bfloat16), "ids": torch.arange(10, dtype=torch.int64)}},
        "history": [torch.ones(2), {"k": 1}],
    }


def assert_same(a, b):
    assert not helpers.compare(a, b), helpers.compare(a, b)[:10]


def test_safetensors_input_dcp_load_reads_it(ckpt, dcp, tmp_path):
    from safetensors.torch import load_file, save_file

    src = tmp_path / "in.safetensors"
    save_file({"layers.0.weight": torch.randn(7, 5), "layers.0.bias": torch.randn(7),
               "embed": torch.randn(11, 4).to(torch.float16), "scale": torch.tensor(2.5)}, src)
    out = tmp_path / "out"
    r = ckpt.ok("convert", src, out, "--to", "dcp")
    assert "(dcp, 2 files)" in r.stdout
    assert sorted(os.listdir(out)) == [".metadata", "__0_0.distcp"]
    ref = load_file(src)
    got = dcp_load(dcp, ref, out)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), k


def test_training_checkpoint_loads_as_torchs_own_save(ckpt, dcp, tmp_path):
    state = training_state()
    src = tmp_path / "train.pt"
    torch.save(state, src)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ckpt.ok("convert", src, ours, "--to", "dcp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(theirs))
    got = dcp_load(dcp, state, ours)
    want = dcp_load(dcp, state, theirs)
    assert_same(got, want)
    assert_same(got, state)  # numbers, strings, the optimizer's state and param_groups
    assert got["optim"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert got["extra"]["epoch"] == 3 and got["extra"]["name"] == "run-7"
    # The same keys, kinds and chunks as torch's metadata.
    mine = dcp.FileSystemReader(str(ours)).read_metadata()
    torchs = dcp.FileSystemReader(str(theirs)).read_metadata()
    assert list(mine.state_dict_metadata) == list(torchs.state_dict_metadata)
    for k, m in torchs.state_dict_metadata.items():
        assert type(mine.state_dict_metadata[k]) is type(m), k
        if hasattr(m, "chunks"):
            assert mine.state_dict_metadata[k].size == m.size, k
            assert mine.state_dict_metadata[k].chunks == m.chunks, k
            assert mine.state_dict_metadata[k].properties.dtype == m.properties.dtype, k
    assert mine.planner_data == torchs.planner_data


def test_dcp_to_torch_save_of_ckpts_folder(ckpt, dcp, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = training_state()
    src = tmp_path / "train.pt"
    torch.save(state, src)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ckpt.ok("convert", src, ours, "--to", "dcp", "--dcp-files", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(theirs))
        dcp_to_torch_save(str(ours), str(tmp_path / "ours.pt"))
        dcp_to_torch_save(str(theirs), str(tmp_path / "theirs.pt"))
    a = torch.load(tmp_path / "ours.pt", weights_only=False)
    b = torch.load(tmp_path / "theirs.pt", weights_only=False)
    assert_same(a, b)
    # Inputs with string keys only come back as they went in.
    plain = {"model": state["model"], "extra": state["extra"]}
    torch.save(plain, tmp_path / "plain.pt")
    ckpt.ok("convert", tmp_path / "plain.pt", tmp_path / "plain_dcp", "--to", "dcp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(tmp_path / "plain_dcp"), str(tmp_path / "back.pt"))
    back = torch.load(tmp_path / "back.pt", weights_only=False)
    assert_same(back, {"model": dict(plain["model"]), "extra": plain["extra"]})


def test_four_files_shard0_chunks(ckpt, dcp, tmp_path):
    from safetensors.torch import load_file, save_file

    src = tmp_path / "in.safetensors"
    tensors = {"w": torch.randn(10, 3), "b": torch.randn(3), "one": torch.randn(1, 4),
               "s": torch.tensor(7, dtype=torch.int32), "e": torch.zeros(0, 2)}
    save_file(tensors, src)
    out = tmp_path / "out4"
    ckpt.ok("convert", src, out, "--to", "dcp", "--dcp-files", "4")
    assert sorted(os.listdir(out)) == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    md = dcp.FileSystemReader(str(out)).read_metadata()
    chunks = {k: [(tuple(c.offsets), tuple(c.sizes)) for c in m.chunks]
              for k, m in md.state_dict_metadata.items()}
    # ceil(10 / 4) = 3 rows per rank: 3, 3, 3, 1.
    assert chunks["w"] == [((0, 0), (3, 3)), ((3, 0), (3, 3)), ((6, 0), (3, 3)), ((9, 0), (1, 3))]
    assert chunks["b"] == [((0,), (1,)), ((1,), (1,)), ((2,), (1,))]
    assert chunks["one"] == [((0, 0), (1, 4))]
    assert chunks["s"] == [((), ())]
    files = {(i.fqn, tuple(i.offset)): s.relative_path for i, s in md.storage_data.items()}
    assert [files[("w", (r * 3, 0))] for r in range(4)] == [f"__{r}_0.distcp" for r in range(4)]
    ref = load_file(src)
    got = dcp_load(dcp, ref, out)
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    # ckpt reads its own folder back: ls, and a conversion to safetensors equal to the input.
    listed = {t["name"]: t for t in ckpt.json("ls", out, "--json")["tensors"]}
    assert sorted(listed) == sorted(ref)
    ckpt.ok("convert", out, tmp_path / "back.safetensors")
    back = load_file(tmp_path / "back.safetensors")
    assert sorted(back) == sorted(ref)
    for k in ref:
        assert torch.equal(back[k], ref[k]), k


def test_ckpt_reads_its_training_folder(ckpt, tmp_path):
    state = training_state()
    src = tmp_path / "train.pt"
    torch.save(state, src)
    out = tmp_path / "out"
    ckpt.ok("convert", src, out, "--to", "dcp", "--dcp-files", "2")
    ckpt.ok("convert", out, tmp_path / "back.pt")
    back = torch.load(tmp_path / "back.pt", weights_only=False)
    # dcp_to_torch_save's tree: str(key) keys, plain dicts.
    assert torch.equal(back["model"]["0.weight"], state["model"]["0.weight"])
    assert torch.equal(back["optim"]["state"]["0"]["exp_avg"],
                       state["optim"]["state"][0]["exp_avg"])
    assert back["optim"]["param_groups"][0]["lr"] == 1e-3
    assert back["extra"]["name"] == "run-7"


def test_refusals_leave_nothing(ckpt, tmp_path):
    from safetensors.torch import save_file

    src = tmp_path / "in.safetensors"
    save_file({"w": torch.randn(2, 2)}, src)
    # A non-empty folder is not replaced.
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep").write_text("x")
    r = ckpt.run("convert", src, taken, "--to", "dcp")
    assert r.returncode == INVALID_ARGUMENT and "not empty" in one_error_line(r)
    assert os.listdir(taken) == ["keep"]
    # A flag of another format, --dcp-files for another format, a bad count.
    for args in (["--to", "dcp", "--align", "64"], ["--to", "dcp", "--copy-shared"],
                 ["--to", "dcp", "--max-shard-size", "1MB"],
                 ["--to", "safetensors", "--dcp-files", "2"]):
        r = ckpt.run("convert", src, tmp_path / "o", *args)
        assert r.returncode == INVALID_ARGUMENT, (args, r.stderr)
        assert args[2] in one_error_line(r), (args, r.stderr)
    r = ckpt.run("convert", src, tmp_path / "o", "--to", "dcp", "--dcp-files", "0")
    assert r.returncode != 0
    # A tree DCP cannot hold: a tensor at the top.
    torch.save(torch.ones(3), tmp_path / "t.pt")
    r = ckpt.run("convert", tmp_path / "t.pt", tmp_path / "o", "--to", "dcp")
    assert r.returncode == INVALID_ARGUMENT and "state dict" in one_error_line(r)
    # Two paths that flatten to one key.
    torch.save({"a": {"b": torch.ones(1)}, "a.b": torch.ones(1)}, tmp_path / "dup.pt")
    r = ckpt.run("convert", tmp_path / "dup.pt", tmp_path / "o", "--to", "dcp")
    assert r.returncode == INVALID_ARGUMENT and "a.b" in one_error_line(r)
    assert not os.path.exists(tmp_path / "o")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".o.")]


FIXTURES = next((os.path.join(d, "torch2") for d in (
    os.environ.get("CKPT_FIXTURES"),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared",
                 "fixtures"),
    "/work/shared/fixtures") if d and os.path.isdir(os.path.join(d, "torch2", "dcp_model"))), "")


@pytest.mark.skipif(not FIXTURES, reason="the workplace fixture dcp_model is not here")
def test_torchs_folder_resharded_to_three_files(ckpt, dcp, tmp_path):
    """DCP in, DCP out: torch 2.11's own folder re-written as 3 ranks gives the same state."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / "three"
    ckpt.ok("convert", os.path.join(FIXTURES, "dcp_model"), out, "--to", "dcp",
            "--dcp-files", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(out), str(tmp_path / "three.pt"))
    got = torch.load(tmp_path / "three.pt", weights_only=False)
    want = torch.load(os.path.join(FIXTURES, "dcp_model_as_torch_save.pt"), weights_only=False)
    assert_same(got, want)
