"""Per-channel quantized tensors keep their scales and zero points (issue 13, point 2).

A per-channel quantized tensor's scales and zero points are tensors of their own inside the
file (in `_rebuild_qtensor`'s quantizer tuple). They belong to their tensor: `ls`, `info`,
`load`, `extract` and `show` never list them as extra tensors (`<unnamed>.N`), `extract`'s
index.json carries their values and the axis, and `show` prints them. Checked on torch.save
files (zip and legacy) and on TorchScript archives made by torch.jit.save (scripted and frozen
modules holding per-channel quantized buffers, and a quantized Conv2d with per-channel packed
weights), against torch 1.13.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

import helpers

HERE = os.path.dirname(os.path.abspath(__file__))


def qtree():
    torch.manual_seed(5)
    x = torch.randn(3, 4)
    return {
        "axis0": torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
                                            torch.tensor([1, -2, 3]), 0, torch.qint8),
        "axis1": torch.quantize_per_channel(x, torch.tensor([0.05, 0.1, 0.15, 0.2], dtype=torch.float64),
                                            torch.tensor([10, 20, 30, 40]), 1, torch.quint8),
        "per_tensor": torch.quantize_per_tensor(x, 0.25, 4, torch.quint8),
        "plain": torch.ones(2),
    }


@pytest.fixture(scope="module", params=["zip", "legacy"])
def qfile(request, tmp_path_factory):
    f = tmp_path_factory.mktemp("quant") / f"q_{request.param}.pt"
    torch.save(qtree(), f, _use_new_zipfile_serialization=request.param == "zip")
    return f


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    out = tmp_path_factory.mktemp("quant_scripted")
    r = subprocess.run([sys.executable, os.path.join(HERE, "real_make_quant_scripted.py"), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout.strip().splitlines()[-1])


def test_torch_save_lists_as_many_tensors_as_torch(ckpt, qfile):
    ref = helpers.torch_load(qfile)
    listing = ckpt.json("ls", qfile, "--json")["tensors"]
    assert [t["name"] for t in listing] == [n for n, _ in helpers.flatten(ref)]
    by = {t["name"]: t for t in listing}
    assert by["axis0"]["qscheme"] == "per_channel_affine" and by["axis0"]["axis"] == 0
    assert by["axis1"]["axis"] == 1
    assert by["per_tensor"]["scale"] == 0.25 and by["per_tensor"]["zero_point"] == 4
    assert ckpt.json("info", qfile, "--json")["tensors"] == len(ref)
    load = ckpt.json("load", qfile, "--json")
    assert load["tensors"] == len(ref), load


def test_extract_carries_per_channel_parameters(ckpt, qfile, tmp_path):
    ref = helpers.torch_load(qfile)
    ckpt.ok("extract", qfile, tmp_path / "x")
    index = {e["name"]: e for e in json.loads((tmp_path / "x" / "index.json").read_text())["tensors"]}
    assert sorted(index) == sorted(ref)
    for name in ("axis0", "axis1"):
        e, t = index[name], ref[name]
        assert e["qscheme"] == "per_channel_affine"
        assert e["scales"] == t.q_per_channel_scales().tolist()
        assert e["zero_points"] == t.q_per_channel_zero_points().tolist()
        assert e["axis"] == t.q_per_channel_axis()
        _, _, data = helpers.read_npy(tmp_path / "x" / e["file"])
        assert data == helpers.tensor_bytes(t)
    assert index["per_tensor"]["scale"] == 0.25 and index["per_tensor"]["zero_point"] == 4


def test_show_prints_per_channel_parameters(ckpt, qfile):
    t = helpers.torch_load(qfile)["axis1"]
    out = ckpt.ok("show", qfile, "axis1").stdout
    assert "quantization_scheme=torch.per_channel_affine" in out, out
    assert "zero_points=[10, 20, 30, 40]" in out and "axis=1" in out, out
    tree = ckpt.ok("show", qfile).stdout
    assert "<unnamed>" not in tree


def test_convert_keeps_per_channel(ckpt, qfile, tmp_path):
    out = tmp_path / "o.pt"
    ckpt.ok("convert", qfile, out)
    diffs = helpers.compare(helpers.torch_load(qfile), helpers.torch_load(out, like=qfile))
    assert not diffs, "\n".join(diffs)


@pytest.mark.parametrize("name", ["holder", "holder_frozen", "conv", "conv_frozen"])
def test_torchscript_lists_no_quantizer_tensors(ckpt, scripted, name):
    folder, state_names = scripted
    f = folder / f"{name}.pt"
    listing = ckpt.json("ls", f, "--json")["tensors"]
    names = [t["name"] for t in listing]
    assert not [n for n in names if "<unnamed>" in n], names
    info = ckpt.json("info", f, "--json")
    assert info["tensors"] == len(listing)
    if name == "holder":
        # torch's state dict of the loaded module: the same tensors under the same names
        assert sorted(names) == sorted(state_names["holder"]), (names, state_names)
        by = {t["name"]: t for t in listing}
        assert by["qw"]["axis"] == 0 and by["qw1"]["axis"] == 1


def test_torchscript_extract_carries_per_channel(ckpt, scripted, tmp_path):
    folder, _ = scripted
    f = folder / "holder.pt"
    ckpt.ok("extract", f, tmp_path / "x")
    index = {e["name"]: e for e in json.loads((tmp_path / "x" / "index.json").read_text())["tensors"]}
    # The reference values, read in a child process (loading a TorchScript module here would
    # register its classes in this process).
    code = ("import torch, json, sys; m = torch.jit.load(sys.argv[1]); "
            "print(json.dumps({k: [v.q_per_channel_scales().tolist(), "
            "v.q_per_channel_zero_points().tolist(), v.q_per_channel_axis()] "
            "for k, v in m.state_dict().items() if v.is_quantized and "
            "v.qscheme() == torch.per_channel_affine}))")
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ref = json.loads(r.stdout)
    assert sorted(ref) == ["qw", "qw1"]
    for k, (scales, zps, axis) in ref.items():
        assert index[k]["scales"] == scales and index[k]["zero_points"] == zps
        assert index[k]["axis"] == axis


@pytest.mark.parametrize("name", ["holder", "holder_frozen"])
def test_torchscript_to_pt_round_trips(ckpt, scripted, name, tmp_path):
    """A TorchScript archive with per-channel quantized tensors converts to a pt state dict
    that torch.load reads equal to the module's (scales, zero points, axis included) — and a
    second rewrite of that changes nothing."""
    folder, _ = scripted
    once, twice = tmp_path / "once.pt", tmp_path / "twice.pt"
    ckpt.ok("convert", folder / f"{name}.pt", once)
    ckpt.ok("convert", once, twice)
    assert not helpers.compare(helpers.torch_load(once), helpers.torch_load(twice))
    if name != "holder":
        return  # a frozen module's state lives in constants; the values are checked above
    code = ("import sys, torch; sys.path.insert(0, sys.argv[3]); import helpers; "
            "m = torch.jit.load(sys.argv[1]); sd = dict(m.state_dict()); got = helpers.torch_load(sys.argv[2]); "
            "assert sorted(sd) == sorted(got), (sorted(sd), sorted(got)); "
            "d = [x for k in sd for x in helpers.compare({k: sd[k]}, {k: got[k]})]; "
            "assert not d, d")
    r = subprocess.run([sys.executable, "-c", code, str(folder / f"{name}.pt"), str(once), HERE],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
