"""Rewriting keeps every class of the object tree (issue 13, point 3).

`ckpt convert a.pt b.pt` must give an object tree that torch.load sees as equal to a's, types
included: torch.Size stays torch.Size (not a tuple), Parameters stay Parameters with their
requires_grad, frozenset stays frozenset, bytes and bytearray, complex, ints beyond 64 bits,
inf/nan/-0.0, tuples and lists, OrderedDict, nested. Files are made by torch 1.13 (zip and
legacy) and compared value by value, with type() checked at every node; a second rewrite
(pt -> pt -> pt) gives the same again.
"""

import collections
import math

import pytest
import torch

import helpers


class TypedComparer(helpers.Comparer):
    """helpers.Comparer (type() equal at every node, tensors bit-exact, sharing kept), with sets,
    frozensets, torch.device and meta tensors compared too."""

    def compare(self, a, b, path=""):
        if type(a) is not type(b):
            return self.fail(path, f"type {type(a).__name__} != {type(b).__name__}")
        if isinstance(a, (set, frozenset)):
            if a != b:
                self.fail(path, f"{a!r} != {b!r}")
            return
        if isinstance(a, torch.device):
            if a != b:
                self.fail(path, f"{a} != {b}")
            return
        if helpers.is_tensor(a) and (a.is_meta or b.is_meta):
            for attr in ("dtype", "shape", "requires_grad", "device"):
                if getattr(a, attr) != getattr(b, attr):
                    self.fail(path, f"{attr} {getattr(a, attr)} != {getattr(b, attr)}")
            if a.stride() != b.stride():
                self.fail(path, f"stride {a.stride()} != {b.stride()}")
            return
        return super().compare(a, b, path)


def typed_diffs(a, b):
    c = TypedComparer()
    c.compare(a, b)
    return c.diffs


def tree():
    torch.manual_seed(3)
    base = torch.arange(12.0)
    return {
        "ordered": collections.OrderedDict([("a", 1), ("b", [1, 2])]),
        "size": torch.Size([3, 4]),
        "sizes": [torch.Size([]), torch.Size([2]), (torch.Size([1, 2, 3]),)],
        "shape_of": base.view(3, 4).shape,
        "param": torch.nn.Parameter(torch.randn(2, 3)),
        "frozen_param": torch.nn.Parameter(torch.randn(2), requires_grad=False),
        "grad": torch.randn(3).requires_grad_(),
        "set": {1, 2, "x"},
        "frozenset": frozenset({3, 4, (5, 6)}),
        "empty_set": set(),
        "empty_frozenset": frozenset(),
        "sets_inside": [frozenset({1}), {frozenset({2})}],
        "bytes": b"\x00\xffabc\x80",
        "empty_bytes": b"",
        "bytearray": bytearray(b"xy\x80\x00"),
        "complex": 1.5 - 2j,
        "complex_special": complex(math.inf, -0.0),
        "big": 2 ** 70,
        "neg_big": -(2 ** 100),
        "int64_edges": [2 ** 63 - 1, -(2 ** 63), 2 ** 63, -(2 ** 63) - 1],
        "floats": [math.inf, -math.inf, math.nan, -0.0, 1e-300, 5e-324],
        "tuple": (1, (2, 3), [], ()),
        "list": [(), [], {}, [[]]],
        "nested": {"x": [{"y": (base[2:5], base)}], "z": ({"w": base.view(3, 4)},)},
        "text": "héllo ✓ \u2028",
        "none": None,
        "bools": (True, False),
        "dtype": torch.float16,
        "int_keys": {1: "a", -2: "b", 2 ** 64: "c"},
        "device": torch.device("cpu"),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("roundtrip")
    files = {}
    for kind, legacy in (("zip", False), ("legacy", True)):
        f = out / f"tree_{kind}.pt"
        torch.save(tree(), f, _use_new_zipfile_serialization=not legacy)
        files[kind] = f
    return files


@pytest.mark.parametrize("kind", ["zip", "legacy"])
def test_rewrite_keeps_every_class(ckpt, saved, kind, tmp_path):
    src = saved[kind]
    once, twice = tmp_path / "once.pt", tmp_path / "twice.pt"
    ckpt.ok("convert", src, once)
    ckpt.ok("convert", once, twice)
    ref = helpers.torch_load(src)
    for out in (once, twice):
        diffs = typed_diffs(ref, helpers.torch_load(out, like=src))
        assert not diffs, f"{out.name}:\n" + "\n".join(diffs[:40])


def test_torch_size_after_convert(ckpt, tmp_path):
    """The issue's case: a dict holding torch.Size([3, 4]) comes back as torch.Size."""
    src, out = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"s": torch.Size([3, 4])}, src)
    ckpt.ok("convert", src, out)
    got = helpers.torch_load(out)["s"]
    assert type(got) is torch.Size and got == torch.Size([3, 4])


def test_weights_only_reads_rewritten_size(ckpt, tmp_path):
    """torch.Size and friends are written in forms torch's weights_only unpickler accepts."""
    src, out = tmp_path / "a.pt", tmp_path / "b.pt"
    obj = {"s": torch.Size([2]), "p": torch.nn.Parameter(torch.ones(2)),
           "o": collections.OrderedDict(a=torch.zeros(1))}
    torch.save(obj, src)
    ckpt.ok("convert", src, out)
    diffs = typed_diffs(obj, torch.load(out, weights_only=True))
    assert not diffs, "\n".join(diffs)


def test_show_prints_classes_as_torch(ckpt, saved):
    out = ckpt.ok("show", saved["zip"]).stdout
    assert "size: torch.Size([3, 4])" in out, out
    assert "frozenset (3)" in out, out
