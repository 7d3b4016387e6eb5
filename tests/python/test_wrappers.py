"""Tensors torch pickled inside Python wrappers, and objects made with keyword arguments.

ckpt.load never imports or calls a class from the file: a tensor subclass comes back as a plain
tensor (a Parameter stays a Parameter) with its Python attributes set, and an object made by
cls.__new__(cls, *args, **kwargs) comes back as ckpt.Opaque of copyreg.__newobj_ex__.
"""

import sys

import pytest

torch = pytest.importorskip("torch")
import ckpt  # noqa: E402

# The same user module the CLI's interop test saves with (a subclass, torch 2's Parameter form,
# a class with __getnewargs_ex__), under this module's own name.
from test_real_wrappers import USER_SRC as SRC  # noqa: E402  (tests/interop, on sys.path)


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    d = tmp_path_factory.mktemp("wrapmod")
    (d / "ckpt_py_wrappers.py").write_text(SRC)
    sys.path.insert(0, str(d))
    try:
        yield __import__("ckpt_py_wrappers")
    finally:
        sys.path.remove(str(d))
        sys.modules.pop("ckpt_py_wrappers", None)


@pytest.mark.parametrize("mmap", [False, True])
def test_subclass_and_parameter_attributes(mod, tmp_path, mmap):
    t = mod.Tagged(torch.arange(6.0).reshape(2, 3))
    t.unit = "m/s"
    p = mod.Torch2Parameter(torch.randn(3, 4))
    p.tag = "embedding"
    path = tmp_path / "w.pt"
    torch.save({"t": t, "p": p}, path)
    got = ckpt.load(path, mmap=mmap)
    assert type(got["t"]) is torch.Tensor  # the subclass is never imported
    assert got["t"].unit == "m/s" and torch.equal(got["t"], t.as_subclass(torch.Tensor))
    assert type(got["p"]) is torch.nn.Parameter and got["p"].tag == "embedding"
    assert torch.equal(got["p"].data, p.data) and got["p"].requires_grad


@pytest.mark.parametrize("protocol", [2, 4])
def test_newobj_keyword_arguments(mod, tmp_path, protocol):
    path = tmp_path / "kw.pt"
    torch.save({"pt": mod.Point(1, name="origin", w=torch.ones(3))}, path, pickle_protocol=protocol)
    got = ckpt.load(path)["pt"]
    assert isinstance(got, ckpt.Opaque)
    assert (got.module, got.name) == ("copyreg", "__newobj_ex__")
    cls, args, kwargs = got.args
    assert (cls.module, cls.name) == ("ckpt_py_wrappers", "Point")
    assert args == (1,) and kwargs["name"] == "origin" and torch.equal(kwargs["w"], torch.ones(3))
    # written back, torch.load makes the same object
    out = tmp_path / "out.pt"
    ckpt.save(ckpt.load(path), out)
    # Point is a user class (copyreg.__newobj_ex__ makes it): weights_only=True refuses it, and
    # constructing it is what this test checks
    back = torch.load(out, weights_only=False)["pt"]
    assert type(back) is mod.Point and back.args == (1,) and back.kwargs["name"] == "origin"
