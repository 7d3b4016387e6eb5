"""Meta tensors (a dtype and shape, no bytes) are never given invented zeros (issue 13, point 5).

`show` prints them as torch does; `extract` and `convert` to safetensors refuse them, naming the
tensor, unless `--meta=zeros` or `--meta=skip` says what to do; pt keeps them as meta tensors
(torch 1.13 reads them back: _rebuild_meta_tensor_no_storage) and so does tensorizer.
"""

import json

import pytest
import torch

import helpers
from test_real_roundtrip import typed_diffs

UNSUPPORTED = 6


def meta_tree():
    return {
        "m": torch.empty(2, 3, device="meta"),
        "half": torch.empty(4, dtype=torch.float16, device="meta"),
        "scalar": torch.empty((), device="meta"),
        "p": torch.nn.Parameter(torch.empty(3, device="meta")),
        "strided": torch.empty(4, 6, device="meta").t(),
        "real": torch.arange(4.0),
    }


@pytest.fixture(scope="module", params=["zip", "legacy"])
def meta_file(request, tmp_path_factory):
    f = tmp_path_factory.mktemp("meta") / f"meta_{request.param}.pt"
    torch.save(meta_tree(), f, _use_new_zipfile_serialization=request.param == "zip")
    return f


def test_show_prints_meta_as_torch(ckpt, meta_file):
    ref = helpers.torch_load(meta_file)
    for name in ("m", "half", "scalar", "p", "strided"):
        out = ckpt.ok("show", meta_file, name).stdout
        assert out == repr(ref[name]) + "\n", (name, out, repr(ref[name]))


def test_ls_marks_meta(ckpt, meta_file):
    listing = {t["name"]: t for t in ckpt.json("ls", meta_file, "--json")["tensors"]}
    assert listing["m"].get("meta") is True and not listing["real"].get("meta")


def test_extract_refuses_meta(ckpt, meta_file, tmp_path):
    r = ckpt.run("extract", meta_file, tmp_path / "x")
    assert r.returncode == UNSUPPORTED, r.stderr
    assert "meta tensor" in r.stderr and "--meta" in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()


def test_extract_meta_zeros_and_skip(ckpt, meta_file, tmp_path):
    ckpt.ok("extract", meta_file, tmp_path / "z", "--meta=zeros")
    index = {e["name"]: e for e in json.loads((tmp_path / "z" / "index.json").read_text())["tensors"]}
    assert index["m"]["meta"] is True and "meta" not in index["real"]
    _, header, data = helpers.read_npy(tmp_path / "z" / index["m"]["file"])
    assert header["shape"] == (2, 3) and data == b"\0" * 24
    ckpt.ok("extract", meta_file, tmp_path / "s", "--meta", "skip")
    index = json.loads((tmp_path / "s" / "index.json").read_text())["tensors"]
    assert [e["name"] for e in index] == ["real"]


def test_convert_to_safetensors_refuses_meta(ckpt, meta_file, tmp_path):
    out = tmp_path / "o.safetensors"
    r = ckpt.run("convert", meta_file, out)
    assert r.returncode == UNSUPPORTED, r.stderr
    assert "meta tensor" in r.stderr and "--meta" in r.stderr, r.stderr
    assert not out.exists()


def read_safetensors(path):
    """{name: (dtype, shape, bytes)}, parsed by hand (the safetensors package is not needed)."""
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def test_convert_to_safetensors_meta_policies(ckpt, meta_file, tmp_path):
    z = tmp_path / "z.safetensors"
    r = ckpt.ok("convert", meta_file, z, "--meta=zeros")
    assert "written as zeros" in r.stderr
    got = read_safetensors(z)
    assert got["m"] == ("F32", [2, 3], b"\0" * 24)
    assert got["half"] == ("F16", [4], b"\0" * 8)
    assert got["real"][2] == torch.arange(4.0).numpy().tobytes()
    s = tmp_path / "s.safetensors"
    r = ckpt.ok("convert", meta_file, s, "--meta=skip")
    assert "left out" in r.stderr
    assert sorted(read_safetensors(s)) == ["real"]


def test_convert_to_pt_keeps_meta(ckpt, meta_file, tmp_path):
    out = tmp_path / "o.pt"
    ckpt.ok("convert", meta_file, out)
    diffs = typed_diffs(helpers.torch_load(meta_file), helpers.torch_load(out, like=meta_file))
    assert not diffs, "\n".join(diffs)
    # and again, from ckpt's own output
    again = tmp_path / "again.pt"
    ckpt.ok("convert", out, again)
    diffs = typed_diffs(helpers.torch_load(meta_file), helpers.torch_load(again))
    assert not diffs, "\n".join(diffs)


def test_convert_to_tensorizer_keeps_meta(ckpt, meta_file, tmp_path):
    out = tmp_path / "o.tensors"
    ckpt.ok("convert", meta_file, out)
    listing = {t["name"]: t for t in ckpt.json("ls", out, "--json")["tensors"]}
    assert listing["m"].get("meta") is True


@pytest.mark.parametrize("out", ["o.pt", "o.tensors"])
def test_meta_option_for_a_target_without_it_is_refused(ckpt, meta_file, tmp_path, out):
    """pt and tensorizer keep meta tensors: --meta is not theirs, and a command never ignores what
    it was asked (exit 8 naming the flag and the format, nothing written)."""
    r = ckpt.run("convert", meta_file, tmp_path / out, "--meta=zeros")
    assert r.returncode == 8, r.stderr
    fmt = "pt" if out.endswith(".pt") else "tensorizer"
    assert f"--meta is only available for safetensors output, not {fmt}" in r.stderr, r.stderr
    assert not (tmp_path / out).exists()
