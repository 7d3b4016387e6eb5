"""Training checkpoints with data-only objects (issue 13, point 4).

argparse.Namespace, numpy scalars and arrays, datetime, pathlib, collections
types, set, slice, complex, enum members and a class of the user's own: ckpt
never calls any of them.  Known classes become values (numpy arrays are tensors
too), unknown ones opaque objects that `info` names; every reading command
works, pt -> pt gives torch.load the same objects, and --strict refuses.
"""

import argparse
import collections
import datetime
import json
import os
import pathlib
import random
import sys
import textwrap

import numpy as np
import pytest
import torch

from conftest import one_error_line
import helpers

USER_MODULE = "ckpt_user_objects"
USER_SRC = textwrap.dedent("""
    import enum

    class Config:
        def __init__(self, depth, name):
            self.depth = depth
            self.name = name

        def __eq__(self, other):
            return type(self) is type(other) and self.__dict__ == other.__dict__

    class Color(enum.Enum):
        RED = 1
        GREEN = 2

    class Tags(list):
        pass
""")


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    d = tmp_path_factory.mktemp("usermod")
    (d / f"{USER_MODULE}.py").write_text(USER_SRC)
    sys.path.insert(0, str(d))
    try:
        mod = __import__(USER_MODULE)
        yield mod
    finally:
        sys.path.remove(str(d))
        sys.modules.pop(USER_MODULE, None)


def training_checkpoint(mod):
    torch.manual_seed(0)
    return {
        "model": {"w": torch.randn(3, 4), "b": torch.zeros(3)},
        "args": argparse.Namespace(lr=0.1, epochs=3, name="run"),
        "best_acc": np.float64(0.93),
        "step": np.int64(1200),
        "f32": np.float32(1.5),
        "flag": np.bool_(True),
        "arr_f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "arr_i64": np.array([-1, 2, 3], dtype=np.int64),
        "arr_0d": np.array(2.5),
        "arr_fortran": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        "arr_be": np.arange(4, dtype=">i4"),
        "arr_u8": np.arange(5, dtype=np.uint8),
        "arr_obj": np.array(["a", 1], dtype=object),
        "when": datetime.datetime(2024, 5, 6, 7, 8, 9),
        "delta": datetime.timedelta(days=2),
        "path": pathlib.PosixPath("/data/run1"),
        "dd": collections.defaultdict(list, {"a": [1, 2]}),
        "counter": collections.Counter({"x": 2, "y": 1}),
        "dq": collections.deque([1, 2, 3], maxlen=5),
        "set": {1, 2, 3},
        "slice": slice(1, 10, 2),
        "complex": 1 + 2j,
        "color": mod.Color.GREEN,
        "config": mod.Config(4, "big"),
        "tags": mod.Tags(["x", "y"]),
    }


def rng_state():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    return {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}


def assert_same(a, b, path="root"):
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        if a.dtype == object:
            assert list(a.ravel()) == list(b.ravel()), path
        else:
            assert np.array_equal(a, b), path
            assert a.flags["F_CONTIGUOUS"] == b.flags["F_CONTIGUOUS"], path
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
        if isinstance(a, collections.defaultdict):
            assert a.default_factory is b.default_factory, path
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}.{i}")
    elif isinstance(a, argparse.Namespace) or hasattr(a, "__dict__") and not isinstance(a, type):
        assert_same(vars(a), vars(b), path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
    if isinstance(a, collections.deque):
        assert a.maxlen == b.maxlen and list(a) == list(b), path


@pytest.fixture(scope="module")
def files(user_module, tmp_path_factory):
    d = tmp_path_factory.mktemp("dataobj")
    out = {}
    for legacy in (False, True):
        p = d / f"train{'.legacy' if legacy else ''}.pt"
        torch.save(training_checkpoint(user_module), p, _use_new_zipfile_serialization=not legacy)
        out[p.name] = p
    p = d / "rng_state.pth"
    torch.save(rng_state(), p)
    out[p.name] = p
    return out


NAMES = ["train.pt", "train.legacy.pt", "rng_state.pth"]
NUMPY_TENSORS = {"arr_f32": (np.float32, [2, 3]), "arr_i64": (np.int64, [3]), "arr_0d": (np.float64, []),
                 "arr_fortran": (np.float64, [2, 3]), "arr_be": (np.dtype(">i4"), [4]), "arr_u8": (np.uint8, [5])}


@pytest.mark.parametrize("name", NAMES)
def test_ls_lists_tensors_and_arrays(ckpt, files, name):
    listing = ckpt.json("ls", files[name], "--json")
    rows = listing if isinstance(listing, list) else listing.get("tensors", listing)
    names = {r["name"] for r in rows}
    if name.startswith("train"):
        assert {"model.w", "model.b"} <= names
        assert set(NUMPY_TENSORS) <= names, names
        assert "arr_obj" not in names  # object arrays stay opaque
    else:
        assert {"cpu", "numpy.1"} <= names, names


@pytest.mark.parametrize("name", NAMES)
def test_info_names_foreign_classes(ckpt, files, name):
    info = ckpt.json("info", files[name], "--json")
    foreign = info.get("foreign_classes", {})
    if name.startswith("train"):
        assert f"{USER_MODULE}.Config" in foreign and f"{USER_MODULE}.Color" in foreign, foreign
        assert "argparse.Namespace" not in foreign and not any(k.startswith("numpy") for k in foreign)
    else:
        assert foreign == {}, foreign
    text = ckpt.ok("info", files[name]).stdout
    if name.startswith("train"):
        assert "foreign classes" in text and f"{USER_MODULE}.Config" in text


@pytest.mark.parametrize("name", NAMES)
def test_show_load_extract(ckpt, files, name, tmp_path):
    shown = ckpt.ok("show", files[name]).stdout
    if name.startswith("train"):
        for word in ("best_acc", "0.93", "argparse.Namespace", "lr", "Config"):
            assert word in shown, f"show lacks {word!r}: {shown[:3000]}"
        one = ckpt.ok("show", files[name], "arr_f32").stdout
        assert "5" in one
    ckpt.ok("load", files[name])
    ckpt.ok("extract", files[name], tmp_path / "x")
    got = set(os.listdir(tmp_path / "x"))
    assert got, "extract wrote nothing"


def _read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


@pytest.mark.parametrize("name", ["train.pt", "train.legacy.pt"])
def test_convert_to_safetensors(ckpt, files, name, tmp_path, user_module):
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", files[name], out)
    header, data = _read_safetensors(out)
    ref = helpers.torch_load(files[name])
    codes = {np.float32: "F32", np.int64: "I64", np.float64: "F64", np.uint8: "U8"}
    for key, (dt, shape) in NUMPY_TENSORS.items():
        assert key in header, f"{key} missing from {sorted(header)}"
        h = header[key]
        assert h["shape"] == shape
        lo, hi = h["data_offsets"]
        arr = np.frombuffer(data[lo:hi], dtype=np.dtype(dt).newbyteorder("<")).reshape(shape)
        assert np.array_equal(arr, ref[key]), key
    assert torch.equal(torch.frombuffer(bytearray(data[slice(*header["model.w"]["data_offsets"])]),
                                        dtype=torch.float32).reshape(3, 4), ref["model"]["w"])


@pytest.mark.parametrize("name", NAMES)
def test_pt_round_trip(ckpt, files, name, tmp_path, user_module):
    out = tmp_path / "out.pt"
    ckpt.ok("convert", files[name], out)
    assert_same(helpers.torch_load(files[name]), helpers.torch_load(out, like=files[name]))


@pytest.mark.parametrize("name", ["train.pt", "train.legacy.pt"])
@pytest.mark.parametrize("command", ["ls", "show", "convert"])
def test_strict_refuses(ckpt, files, name, command, tmp_path):
    args = {"ls": ["ls", files[name]], "show": ["show", files[name]],
            "convert": ["convert", files[name], tmp_path / "o.pt"]}[command]
    r = ckpt.run(*args, "--strict")
    line = one_error_line(r)
    assert r.returncode == 6, r
    assert "not allowed" in line, line  # the first unknown global (here builtins.list)


def test_strict_agrees_with_weights_only(ckpt, files):
    """--strict accepts what torch.load(weights_only=True) accepts: the RNG states hold numpy
    arrays, which torch refuses unless a caller allows them with add_safe_globals."""
    with pytest.raises(Exception):
        torch.load(files["rng_state.pth"], weights_only=True)
    r = ckpt.run("ls", files["rng_state.pth"], "--strict")
    assert r.returncode == 6 and "numpy" in one_error_line(r), r
    ckpt.ok("ls", files["rng_state.pth"])
