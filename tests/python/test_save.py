"""ckpt.save writes what torch.load reads; round trips; ckpt.open."""

import collections
import os

import pytest
import torch

import ckpt
import corpus
from helpers import assert_same

ROUNDTRIP = ["nested", "values", "adam", "module_sd", "params", "tied", "views", "shared_storage",
             "noncontig", "empty", "scalars_0d", "ordered", "dtype_bfloat16", "dtype_complex128",
             "dtype_bool", "dtype_int8", "quant_qint8", "quant_quint8", "quant_qint32",
             "quant_per_channel", "quant_subbyte"]


@pytest.mark.parametrize("fid", ROUNDTRIP)
def test_torch_roundtrip(torch_corpus, tmp_path, fid):
    path = torch_corpus["files"][fid]
    # ckpt.save writes the objects torch.save wrote (the same GLOBALs): what torch's
    # weights-only unpickler reads of the one it reads of the other
    wo = corpus.weights_only(fid)
    obj = torch.load(path, weights_only=wo)
    out = tmp_path / "out.pt"
    ckpt.save(obj, out)
    assert_same(torch.load(out, weights_only=wo), obj)     # ckpt.save -> torch.load
    assert_same(ckpt.load(out), obj)      # and back through ckpt


def test_save_opaque_roundtrip(torch_corpus, tmp_path):
    path, _ = torch_corpus["refuse"]["custom_class"]
    got = ckpt.load(path)
    out = tmp_path / "o.pt"
    ckpt.save(got, out)
    again = ckpt.load(out)
    assert again["obj"] == got["obj"]


def test_save_formats_and_atomic(tmp_path):
    sd = {"a": torch.randn(3, 2), "b": torch.arange(4)}
    for name in ("m.safetensors", "m.tensors", "m.pt"):
        ckpt.save(sd, tmp_path / name)
        got = ckpt.load(tmp_path / name)
        assert all(torch.equal(got[k], sd[k]) for k in sd)
    ckpt.save(sd, tmp_path / "x.bin", format="safetensors")
    assert ckpt.open(tmp_path / "x.bin").format == "safetensors"
    with pytest.raises(ckpt.InvalidArgumentError):
        ckpt.save({"a": object()}, tmp_path / "bad.pt")
    with pytest.raises(ckpt.InvalidArgumentError):
        ckpt.save([torch.ones(1)], tmp_path / "bad.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["m.pt", "m.safetensors", "m.tensors", "x.bin"]


def test_open_checkpoint(torch_corpus, tmp_path):
    p = torch_corpus["files"]["module_sd"]
    c = ckpt.open(p)
    assert c.format == "torch-zip"
    infos = c.tensors
    exp = torch.load(p, weights_only=corpus.weights_only("module_sd"))
    assert [i.name for i in infos] == list(exp)
    assert c.verify() > 0
    dig = c.digest()
    assert set(dig) == set(exp) and all(len(h) == 64 for h in dig.values())
    rep = c.convert(tmp_path / "m.safetensors")
    assert rep["format"] == "safetensors" and rep["tensors"] == len(exp)
    assert ckpt.open(tmp_path / "m.safetensors").digest() == dig
    streamed = dict(c.stream(1 << 20))
    assert set(streamed) == set(exp)
    for k in exp:
        assert torch.equal(streamed[k], exp[k])
    # breaking out of a stream early stops it
    for name, t in c.stream(1 << 20):
        break
    assert_same(c.load(), exp)


def test_tensorizer_encrypted(tmp_path):
    sd = {"a": torch.randn(5, 3), "b": torch.arange(6)}
    p = tmp_path / "e.tensors"
    key = bytes(range(32))
    ckpt.save(sd, p, key=key)
    for mmap in (False, True):
        got = ckpt.load(p, key=key, mmap=mmap)
        assert all(torch.equal(got[k], sd[k]) for k in sd)
    with pytest.raises(ckpt.Error):
        ckpt.load(p)  # no key
    with pytest.raises(ckpt.AuthError):
        ckpt.load(p, key=bytes(32))
    assert ckpt.open(p, key=key.hex()).keys() == ["a", "b"]


def test_save_to_file_object():
    import io
    buf = io.BytesIO()
    sd = collections.OrderedDict(a=torch.arange(4.0), b=torch.ones(2, 2, dtype=torch.bfloat16))
    ckpt.save(sd, buf)
    buf.seek(0)
    assert_same(torch.load(buf, weights_only=True), sd)


def test_stream_quantized(torch_corpus):
    c = ckpt.open(torch_corpus["files"]["quant_qint8"])
    got = dict(c.stream(1 << 20))
    exp = torch.load(torch_corpus["files"]["quant_qint8"],
                     weights_only=corpus.weights_only("quant_qint8"))
    assert torch.equal(got["q"].int_repr(), exp["q"].int_repr())
    with pytest.raises(ckpt.UnsupportedError):
        dict(ckpt.open(torch_corpus["files"]["quant_per_channel"]).stream(1 << 20))


def test_save_meta_and_defaultdict(tmp_path):
    sd = {"m": torch.empty(3, 4, device="meta"),
          "p": torch.nn.Parameter(torch.empty(2, device="meta")),
          "d": collections.defaultdict(list, {"a": [1]}), "n": collections.defaultdict(None),
          "cnt": collections.Counter("abca")}
    p = tmp_path / "m.pt"
    ckpt.save(sd, p)
    # defaultdict and Counter are what this test writes; no torch allowlists them for
    # weights_only=True
    back = torch.load(p, weights_only=False)
    assert back["m"].device.type == "meta" and back["m"].shape == (3, 4)
    assert isinstance(back["p"], torch.nn.Parameter) and back["p"].device.type == "meta"
    assert type(back["d"]) is collections.defaultdict and back["d"].default_factory is list
    assert back["d"] == sd["d"] and back["n"].default_factory is None
    assert back["cnt"] == sd["cnt"] and type(back["cnt"]) is collections.Counter
    again = ckpt.load(p)
    assert again["d"].default_factory is list and again["m"].device.type == "meta"


@pytest.mark.parametrize("dst, kw, says", [
    ("o.pt", {"meta": "zeros"}, "meta= is only available for safetensors output, not pt"),
    ("o.tensors", {"alignment": 64},
     "alignment= is only available for pt and safetensors output, not tensorizer"),
    ("o.safetensors", {"password": "pw"}, "only available for tensorizer output, not safetensors"),
])
def test_convert_refuses_a_keyword_of_another_format(tmp_path, dst, kw, says):
    """The library's table decides which format owns a keyword; the CLI refuses the same flags
    with the same words (exit 8)."""
    src = tmp_path / "s.pt"
    torch.save({"w": torch.ones(3)}, src)
    with pytest.raises(ckpt.InvalidArgumentError, match=says):
        ckpt.open(src).convert(tmp_path / dst, **kw)
    assert not (tmp_path / dst).exists()
