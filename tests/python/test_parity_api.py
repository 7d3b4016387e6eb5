"""torch.load / torch.save / safetensors call forms ckpt takes as they do: map_location forms,
builtin exception classes, fsync and progress options, paths as str, pathlib.Path or a binary
file object. Run under torch 2.x and torch 1.13."""

import collections
import io
import os
import pathlib

import pytest
import torch

import ckpt


@pytest.fixture
def pt(tmp_path):
    p = tmp_path / "m.pt"
    w = torch.randn(4, 3)
    torch.save(collections.OrderedDict(w=w, t=w.t(), b=torch.arange(5), n=7), p)
    return p


# --- map_location ---------------------------------------------------------------------------

def test_map_location_callable(pt):
    want = torch.load(pt, weights_only=False)
    for fn in (lambda storage, loc: storage, lambda s, loc: None, lambda s, loc: s.cpu()):
        got = ckpt.load(pt, map_location=fn)
        assert torch.equal(got["w"], want["w"]) and got["w"].device.type == "cpu"
        assert got["t"].stride() == want["t"].stride() and got["n"] == 7

    def bad(storage, loc):
        return "somewhere"
    with pytest.raises(ckpt.UnsupportedError):
        ckpt.load(pt, map_location=bad)


def test_map_location_meta(pt, tmp_path):
    for loc in ("meta", torch.device("meta")):
        got = ckpt.load(pt, map_location=loc)
        assert got["w"].device.type == "meta" and got["w"].shape == (4, 3)
        assert got["t"].stride() == (1, 3) and got["b"].dtype == torch.int64 and got["n"] == 7
    st = tmp_path / "m.safetensors"
    ckpt.save({"a": torch.ones(2, 2)}, st)
    assert ckpt.load(st, map_location="meta")["a"].is_meta
    assert ckpt.load_file(st, device="meta")["a"].is_meta
    with ckpt.safe_open(st, framework="pt", device="meta") as f:
        assert f.get_tensor("a").is_meta


def test_map_location_meta_reads_no_bytes(tmp_path):
    # Zeroing the tensor bytes (CRCs go stale) changes nothing for a meta load: not read.
    p = tmp_path / "big.pt"
    torch.save({"w": torch.ones(1 << 16)}, p)
    data = bytearray(p.read_bytes())
    start = data.find(b"\x00\x00\x80\x3f" * 16)
    assert start > 0
    data[start:start + (1 << 18)] = b"\xff" * (1 << 18)
    p.write_bytes(bytes(data))
    with pytest.raises(ckpt.CorruptError):
        ckpt.load(p, verify=True)
    got = ckpt.load(p, map_location="meta", verify=True)  # nothing read, nothing to verify
    assert got["w"].is_meta and got["w"].shape == (1 << 16,)


# --- exceptions ------------------------------------------------------------------------------

def test_builtin_exception_classes(tmp_path, pt):
    missing = tmp_path / "nope.pt"
    with pytest.raises(FileNotFoundError) as e:
        ckpt.load(missing)
    assert isinstance(e.value, ckpt.NotFoundError) and isinstance(e.value, OSError)
    assert e.value.filename == str(missing) and e.value.errno == 2 and str(missing) in str(e.value)
    with pytest.raises(OSError):
        ckpt.open(missing)
    with pytest.raises(ValueError) as e:
        ckpt.load(pt, map_location="tpu")
    assert isinstance(e.value, ckpt.InvalidArgumentError)
    assert issubclass(ckpt.UnsupportedError, NotImplementedError)
    assert issubclass(ckpt.LimitExceededError, ValueError)
    assert issubclass(ckpt.IoError, OSError)
    for cls in (ckpt.NotFoundError, ckpt.IoError, ckpt.UnsupportedError,
                ckpt.LimitExceededError, ckpt.InvalidArgumentError):
        assert issubclass(cls, ckpt.Error)


# --- fsync and progress ------------------------------------------------------------------------

def test_save_fsync_option(tmp_path):
    sd = {"a": torch.randn(10, 10)}
    for fsync in (False, True):
        for ext in ("pt", "safetensors", "tensors"):
            p = tmp_path / f"f{int(fsync)}.{ext}"
            ckpt.save(sd, p, fsync=fsync)
            assert torch.equal(ckpt.load(p)["a"], sd["a"])
    assert sorted(os.listdir(tmp_path)) == sorted(
        f"f{i}.{e}" for i in (0, 1) for e in ("pt", "safetensors", "tensors"))  # no temporaries


def test_progress_callback(tmp_path):
    sd = {f"t{i}": torch.randn(256, 256) for i in range(8)}
    for ext in ("pt", "safetensors", "tensors"):
        p = tmp_path / f"p.{ext}"
        calls = []
        ckpt.save(sd, p, progress=lambda d, t: calls.append((d, t)))
        assert calls and calls[-1][0] == calls[-1][1] == os.path.getsize(p), (ext, calls)
        assert all(d <= t for d, t in calls)
        for mmap in (False, True):
            loads = []
            got = ckpt.load(p, mmap=mmap, progress=lambda d, t: loads.append((d, t)))
            assert torch.equal(got["t3"], sd["t3"])
            assert loads and loads[-1][0] == loads[-1][1] > 0, (ext, mmap, loads)
    # Off by default; an exception the callback raises stops the operation and is raised.

    class Stop(Exception):
        pass

    def stop(d, t):
        raise Stop()
    with pytest.raises(Stop):
        ckpt.save(sd, tmp_path / "s.pt", progress=stop)
    assert not (tmp_path / "s.pt").exists()
    with pytest.raises(Stop):
        ckpt.load(tmp_path / "p.pt", progress=stop)
    with pytest.raises(ValueError):
        ckpt.save(sd, tmp_path / "s.pt", progress="yes")


def test_progress_true_without_tqdm(tmp_path, capsys, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "tqdm", None)
    ckpt.save({"a": torch.zeros(100)}, tmp_path / "a.pt", progress=True)
    assert "100.0%" in capsys.readouterr().err


# --- paths and file objects -----------------------------------------------------------------------

def test_str_path_and_file_object(tmp_path):
    sd = {"a": torch.arange(6.0).reshape(2, 3)}
    for ext in ("pt", "safetensors"):
        p = tmp_path / f"x.{ext}"
        for target in (str(p), pathlib.Path(p)):
            ckpt.save(sd, target)
            assert torch.equal(ckpt.load(target)["a"], sd["a"])
            assert torch.equal(ckpt.load_file(target)["a"], sd["a"])
            with ckpt.safe_open(target, framework="pt") as f:
                assert torch.equal(f.get_tensor("a"), sd["a"])
        buf = io.BytesIO()
        ckpt.save(sd, buf, format="safetensors" if ext == "safetensors" else None)
        for reader in (ckpt.load, ckpt.load_file):
            buf.seek(0)
            assert torch.equal(reader(buf)["a"], sd["a"])
        buf.seek(0)
        with ckpt.safe_open(buf, framework="pt") as f:
            assert f.keys() == ["a"] and torch.equal(f.get_slice("a")[1:], sd["a"][1:])
        with open(p, "rb") as fh:
            assert torch.equal(ckpt.load(fh)["a"], sd["a"])
    buf = io.BytesIO()
    ckpt.save_file(sd, buf)
    buf.seek(0)
    assert torch.equal(ckpt.load_file(buf)["a"], sd["a"])
    with open(tmp_path / "x.pt", "r") as text:
        with pytest.raises(ValueError):
            ckpt.load(text)
