"""safe_open / load_file / save_file against safetensors' API and torch indexing."""

import collections
import threading

import pytest
import torch

import ckpt


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("so")
    torch.manual_seed(0)
    sd = collections.OrderedDict(
        emb=torch.randn(50, 8), w=torch.randn(4, 6, 5), b=torch.arange(7, dtype=torch.int64),
        h=torch.randn(3, 3).to(torch.bfloat16), s=torch.tensor(2.5))
    out = {"sd": sd}
    out["st"] = d / "m.safetensors"
    ckpt.save_file(dict(sd), out["st"], metadata={"format": "pt", "who": "test"})
    out["pt"] = d / "m.pt"
    torch.save(sd, out["pt"])
    out["tz"] = d / "m.tensors"
    ckpt.save(dict(sd), out["tz"])
    return out


@pytest.mark.parametrize("kind", ["st", "pt", "tz"])
def test_safe_open_every_format(files, kind):
    sd = files["sd"]
    with ckpt.safe_open(files[kind], framework="pt") as f:
        assert set(f.keys()) == set(sd)
        for k, v in sd.items():
            t = f.get_tensor(k)
            assert t.dtype == v.dtype and torch.equal(t, v)
        s = f.get_slice("w")
        assert s.get_shape() == [4, 6, 5]
        for idx in [(slice(1, 3),), (slice(None), slice(2, 5)), (0, slice(None), 1),
                    (slice(None, None, 2), 3), (Ellipsis, -1), (slice(-2, None),)]:
            assert torch.equal(s[idx], sd["w"][idx]), idx
        assert torch.equal(f.get_slice("emb")[10:20], sd["emb"][10:20])
        if kind == "st":
            assert f.metadata() == {"format": "pt", "who": "test"}
            assert f.get_slice("h").get_dtype() == "BF16"
        with pytest.raises(ckpt.NotFoundError):
            f.get_tensor("missing")


def test_safe_open_numpy(files):
    import numpy as np
    with ckpt.safe_open(files["st"], framework="np") as f:
        a = f.get_tensor("w")
        assert isinstance(a, np.ndarray) and np.array_equal(a, files["sd"]["w"].numpy())
        assert np.array_equal(f.get_slice("emb")[3:5], files["sd"]["emb"][3:5].numpy())
        with pytest.raises(ckpt.UnsupportedError):
            f.get_tensor("h")  # bfloat16: numpy has none


def test_load_file_and_save_file(files, tmp_path):
    got = ckpt.load_file(files["st"])
    assert list(got) == sorted(got) or set(got) == set(files["sd"])
    for k, v in files["sd"].items():
        assert torch.equal(got[k], v)
    got = ckpt.load_file(files["pt"])
    assert set(got) == set(files["sd"])
    # shared tensors are refused, as safetensors does
    a = torch.ones(4)
    with pytest.raises(ckpt.InvalidArgumentError):
        ckpt.save_file({"a": a, "b": a[:2]}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_threads(files):
    sd = files["sd"]
    errors = []

    def work():
        try:
            for _ in range(20):
                with ckpt.safe_open(files["st"]) as f:
                    assert torch.equal(f.get_slice("emb")[5:9], sd["emb"][5:9])
                got = ckpt.load(files["pt"])
                assert torch.equal(got["w"], sd["w"])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
