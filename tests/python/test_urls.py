"""ckpt.load, safe_open and ckpt.open take URLs (issue 11 through the module): a real nginx
serves the files (the session's `nginx` fixture, tests/python/conftest.py)."""

import os

import pytest

torch = pytest.importorskip("torch")
import ckpt  # noqa: E402


def test_load_url_equals_torch_load(nginx, tmp_path):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(64, 32, generator=g)
    obj = {"model": {"w": base, "view": base[3:9], "b": torch.arange(7)}, "epoch": 3,
           "shape": torch.Size([2, 3])}
    p = tmp_path / "m.pt"
    torch.save(obj, p)
    url = nginx.put(str(p), "m.pt")
    for mmap in (False, True):
        got = ckpt.load(url, mmap=mmap)
        assert got["epoch"] == 3 and type(got["shape"]) is torch.Size
        assert torch.equal(got["model"]["w"], base)
        assert torch.equal(got["model"]["view"], base[3:9])
        # storage sharing survives the network
        assert got["model"]["view"].storage().data_ptr() == \
            got["model"]["w"].storage().data_ptr()


def test_safe_open_url(nginx, tmp_path):
    sd = {"a": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5, dtype=torch.int32)}
    p = tmp_path / "s.safetensors"
    ckpt.save_file(sd, str(p))
    url = nginx.put(str(p), "s.safetensors")
    with ckpt.safe_open(url, framework="pt") as f:
        assert sorted(f.keys()) == ["a", "b"]
        assert torch.equal(f.get_tensor("a"), sd["a"])
        assert torch.equal(f.get_slice("a")[1:3, 2:], sd["a"][1:3, 2:])


def test_missing_url_is_not_found(nginx):
    with pytest.raises(ckpt.NotFoundError) as e:
        ckpt.load(nginx.url("nope.pt"))
    assert "nope.pt" in str(e.value)
