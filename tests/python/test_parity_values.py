"""ckpt.load returns what torch.load returns for training-checkpoint values (numpy arrays and
scalars stay numpy), and ckpt.save writes every value kind ckpt.load returns back as torch.save
does, so that torch.load reads the same values. Run under torch 2.x and torch 1.13."""

import argparse
import collections
import json
import os
import subprocess

import numpy as np
import pytest
import torch

import ckpt


def torch_load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def rng_checkpoint():
    np.random.seed(1234)
    return {
        "rng": np.random.get_state(),  # ('MT19937', uint32[624], pos, has_gauss, cached)
        "u32": np.arange(5, dtype=np.uint32),
        "u16": np.arange(3, dtype=np.uint16).reshape(1, 3),
        "u64": np.array([2**63 + 5], dtype=np.uint64),
        "big_endian": np.arange(3, dtype=">i4"),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        "f32": np.float32(1.5), "i64": np.int64(-7), "u8": np.uint8(200), "b": np.bool_(True),
        "c64": np.complex64(1 + 2j), "f16": np.float16(0.25),
        "epoch": 3, "w": torch.arange(4.0),
    }


def assert_numpy_same(a, b, path="root"):
    """a equals b with numpy types kept: same type, same dtype (byte order too), same values."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(b, np.ndarray):
        assert a.dtype == b.dtype and a.dtype.str == b.dtype.str, f"{path}: {a.dtype} {b.dtype}"
        assert a.shape == b.shape and a.flags.f_contiguous == b.flags.f_contiguous, path
        assert np.array_equal(a, b), path
    elif isinstance(b, np.generic):
        assert a.dtype == b.dtype and a == b, f"{path}: {a!r} != {b!r}"
    elif isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(b, dict):
        assert list(a) == list(b), path
        for k in b:
            assert_numpy_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_numpy_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_numpy_values_load_as_numpy(tmp_path):
    p = tmp_path / "rng_state.pth"
    torch.save(rng_checkpoint(), p)
    want = torch_load(p)
    for got in (ckpt.load(p), ckpt.load(p, mmap=True)):
        assert_numpy_same(got, want)
        assert got["rng"][1].dtype == np.uint32 and got["rng"][1].shape == (624,)
        assert got["u32"].flags.writeable
    # The generator state restores: the next draws are numpy's own.
    np.random.set_state(ckpt.load(p)["rng"])
    a = np.random.rand(3)
    np.random.set_state(want["rng"])
    assert np.array_equal(a, np.random.rand(3))


def test_cli_lists_numpy_arrays(tmp_path, ckpt_bin):
    p = tmp_path / "rng.pth"
    torch.save({"rng": np.random.get_state(), "w": torch.zeros(2)}, p)
    out = subprocess.run([ckpt_bin, "ls", str(p)], capture_output=True, text=True, check=True)
    row = [ln for ln in out.stdout.splitlines() if ln.startswith("rng.1 ")]
    assert row and "uint32" in row[0] and "numpy" in row[0], out.stdout
    assert "1 numpy array" in out.stdout
    js = json.loads(subprocess.run([ckpt_bin, "ls", "--json", str(p)], capture_output=True,
                                   text=True, check=True).stdout)
    assert {t["name"]: t.get("type") for t in js["tensors"]}["rng.1"] == "numpy"


class _Cfg:  # a user class: ckpt.load keeps it as ckpt.Opaque, never calls it
    def __init__(self, lr):
        self.lr = lr

    def __eq__(self, other):
        return type(other) is _Cfg and vars(self) == vars(other)


def every_kind():
    w = torch.randn(3, 4)
    return collections.OrderedDict(
        model=collections.OrderedDict(weight=w, tied=w, view=w[1:], p=torch.nn.Parameter(w[0])),
        numpy=rng_checkpoint(),
        args=argparse.Namespace(lr=0.1, name="run", layers=[1, 2]),
        cfg=_Cfg(0.5),
        counts=collections.Counter(a=2), dd=collections.defaultdict(list, k=[1]),
        misc=[1, 2.5, 1 + 2j, "s", b"b", bytearray(b"ba"), None, True, 2**80, {1, 2},
              frozenset({3}), (4, (5,))],
        torch_objs=[torch.float16, torch.Size([2, 3]), torch.device("cpu"), torch.strided,
                    torch.per_tensor_affine],
        type_objs=[int, float],
    )


def test_round_trip_every_kind(tmp_path):
    src, dst = tmp_path / "train.pt", tmp_path / "x.pt"
    obj = every_kind()
    torch.save(obj, src)
    loaded = ckpt.load(src)
    assert isinstance(loaded["cfg"], ckpt.Opaque)
    ckpt.save(loaded, dst)
    want, got = torch_load(src), torch_load(dst)
    assert type(got["cfg"]) is _Cfg and got["cfg"] == want["cfg"]
    assert got["args"] == want["args"]
    assert got["torch_objs"] == want["torch_objs"] and got["type_objs"] == want["type_objs"]
    for k in ("numpy", "misc", "counts", "dd"):
        assert_numpy_same(got[k], want[k], k)
    assert type(got["dd"]) is collections.defaultdict and got["dd"].default_factory is list
    m = got["model"]
    assert m["weight"].data_ptr() == m["tied"].data_ptr()
    assert m["view"].untyped_storage().data_ptr() == m["weight"].untyped_storage().data_ptr() \
        if hasattr(m["view"], "untyped_storage") else True
    assert isinstance(m["p"], torch.nn.Parameter) and torch.equal(m["weight"], want["model"]["weight"])
    # And ckpt reads its own output the same way it read torch's.
    again = ckpt.load(dst)
    assert_numpy_same(again["numpy"], loaded["numpy"])
    assert again["cfg"] == loaded["cfg"]


def test_numpy_values_from_python(tmp_path):
    # Saved straight from Python objects (not a load): torch.save's bytes for numpy.
    p, q = tmp_path / "n.pt", tmp_path / "t.pt"
    obj = rng_checkpoint()
    ckpt.save(obj, p)
    torch.save(obj, q)
    want = torch_load(q)  # numpy unpickles a big-endian array in native byte order
    assert_numpy_same(torch_load(p), want)
    assert_numpy_same(ckpt.load(p), want)


class _Local:
    pass


def test_unsavable_value_names_its_path(tmp_path):
    obj = {"a": {"b": [1, _Local()]}}
    with pytest.raises(ckpt.Error) as e:
        ckpt.save(obj, tmp_path / "x.pt")
    assert e.value.record == "a.b[1]", str(e.value)
    assert "a.b[1]" in str(e.value) and "_Local" in str(e.value)
    with pytest.raises(ckpt.Error) as e:
        ckpt.save({"x": [(0, {3: object()})]}, tmp_path / "y.pt")
    assert e.value.record == "x[0][1][3]", str(e.value)
    # A flat format names the tensor.
    with pytest.raises(ckpt.Error) as e:
        ckpt.save({"w": torch.zeros(1), "bad": [1]}, tmp_path / "z.safetensors")
    assert "bad" in str(e.value)
    assert not os.path.exists(tmp_path / "x.pt")


def test_opaque_module_state_dict(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Sequential(torch.nn.Linear(4, 2)))
    model[1].register_buffer("scratch", torch.zeros(1), persistent=False)
    p = tmp_path / "whole.pt"
    torch.save(model, p)
    got = ckpt.load(p)
    assert isinstance(got, ckpt.Opaque) and got.is_module()
    sd = got.state_dict()
    want = model.state_dict()
    assert list(sd) == list(want)  # "0.weight", not "_modules.0._parameters.weight"
    for k in want:
        assert torch.equal(sd[k], want[k]), k
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Sequential(torch.nn.Linear(4, 2)))
    fresh.load_state_dict(sd)
    assert torch.equal(fresh[2][0].weight, model[2][0].weight)
    with pytest.raises(ckpt.InvalidArgumentError):
        ckpt.Opaque("m", "C", state={}).state_dict()
