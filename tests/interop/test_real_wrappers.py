"""Tensors inside Python wrappers, and objects made with keyword arguments (issue 13).

- A tensor subclass with attributes: torch 1.13 pickles it as
  torch._tensor._rebuild_from_type_v2(func, cls, args, state).
- A Parameter with attributes: torch 2.x pickles it as
  torch._utils._rebuild_parameter_with_state(data, requires_grad, hooks, state). torch 1.13 has
  no such function (it drops the attributes), so the test writes that form exactly as torch 2
  does, with a stand-in of torch 2's function registered under its name, which torch 1.13's
  torch.load then also uses.
- An object whose __getnewargs_ex__ has keyword arguments: NEWOBJ_EX with a non-empty dict
  (protocol 4), or copyreg.__newobj_ex__ (protocol 2).
ckpt calls none of these: it lists the tensors, shows the class and attributes, and a pt -> pt
rewrite gives torch.load the same classes, attributes and values.
"""

import sys
import textwrap

import pytest
import torch
import helpers

USER_MODULE = "ckpt_user_wrappers"
USER_SRC = textwrap.dedent("""
    import collections
    import torch
    import torch._utils

    class Tagged(torch.Tensor):
        pass

    class Point:
        def __new__(cls, *args, **kwargs):
            self = object.__new__(cls)
            self.args = args
            self.kwargs = kwargs
            return self

        def __getnewargs_ex__(self):
            return self.args, self.kwargs

        def __eq__(self, other):
            return type(self) is type(other) and self.__dict__ == other.__dict__

    # torch 2's _rebuild_parameter_with_state, as torch 2 defines its effect (a stand-in: torch
    # 1.13 has none).
    def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
        param = torch.nn.Parameter(data, requires_grad)
        param._backward_hooks = backward_hooks
        for k, v in state.items():
            setattr(param, k, v)
        return param

    _rebuild_parameter_with_state.__module__ = "torch._utils"
    _rebuild_parameter_with_state.__qualname__ = "_rebuild_parameter_with_state"
    torch._utils._rebuild_parameter_with_state = _rebuild_parameter_with_state

    class Torch2Parameter(torch.nn.Parameter):
        # Pickled the way torch 2 pickles a Parameter that has attributes; loads as a Parameter.
        def __reduce_ex__(self, proto):
            return (torch._utils._rebuild_parameter_with_state,
                    (self.data, self.requires_grad, collections.OrderedDict(), dict(self.__dict__)))
""")


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    d = tmp_path_factory.mktemp("wrapmod")
    (d / f"{USER_MODULE}.py").write_text(USER_SRC)
    sys.path.insert(0, str(d))
    try:
        yield __import__(USER_MODULE)
    finally:
        sys.path.remove(str(d))
        sys.modules.pop(USER_MODULE, None)


def subclass_checkpoint(mod):
    t = mod.Tagged(torch.arange(6.0).reshape(2, 3))
    t.unit = "m/s"
    t.scale = 0.5
    base = torch.arange(10, dtype=torch.int64)
    v = mod.Tagged(base[2:8])  # a view: offset and shared storage stay
    v.note = {"layer": 3}
    return {"t": t, "v": v, "base": base, "plain": torch.ones(2)}


def parameter_checkpoint(mod):
    p = mod.Torch2Parameter(torch.randn(3, 4))
    p.tag = "embedding"
    p.tied_to = ("decoder", 0)
    q = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    return {"p": p, "q": q}


def kwargs_checkpoint(mod):
    return {"pt": mod.Point(1, 2.5, name="origin", w=torch.ones(3)), "w": torch.arange(4)}


def assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert a.storage_offset() == b.storage_offset()
        assert torch.equal(a.as_subclass(torch.Tensor), b.as_subclass(torch.Tensor))
        assert a.requires_grad == b.requires_grad
        assert getattr(a, "__dict__", {}).keys() == getattr(b, "__dict__", {}).keys()
        for k in a.__dict__:
            if not k.startswith("_"):
                assert a.__dict__[k] == b.__dict__[k], k
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif type(a).__name__ == "Point":
        assert a.args[:2] == b.args[:2] and a.kwargs.keys() == b.kwargs.keys()
        assert a.kwargs["name"] == b.kwargs["name"]
        assert torch.equal(a.kwargs["w"], b.kwargs["w"])
    else:
        assert a == b


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_subclass_with_attributes(ckpt, mod, tmp_path, legacy):
    src, out = tmp_path / "sub.pt", tmp_path / "out.pt"
    torch.save(subclass_checkpoint(mod), src, _use_new_zipfile_serialization=not legacy)
    ref = helpers.torch_load(src)
    assert type(ref["t"]) is mod.Tagged and ref["t"].unit == "m/s"
    names = ckpt.json("ls", src, "--json")
    names = {t["name"] for t in (names["tensors"] if isinstance(names, dict) else names)}
    assert names == {"t", "v", "base", "plain"}
    shown = ckpt.ok("show", src).stdout
    assert f"t: {USER_MODULE}.Tagged(float32, [2, 3])" in shown
    assert "attributes: dict (2)" in shown and "unit: 'm/s'" in shown
    info = ckpt.ok("info", src).stdout
    assert f"{USER_MODULE}.Tagged" in info
    ckpt.ok("convert", src, out)
    got = helpers.torch_load(out)
    assert_same(ref, got)
    assert got["v"].storage().data_ptr() == got["base"].storage().data_ptr()
    # and again: the rewrite of the rewrite is the same
    out2 = tmp_path / "out2.pt"
    ckpt.ok("convert", out, out2)
    assert_same(ref, helpers.torch_load(out2))


def test_parameter_with_state(ckpt, mod, tmp_path):
    src, out = tmp_path / "param.pt", tmp_path / "out.pt"
    torch.save(parameter_checkpoint(mod), src)
    ref = helpers.torch_load(src)
    assert type(ref["p"]) is torch.nn.Parameter and ref["p"].tag == "embedding"
    shown = ckpt.ok("show", src).stdout
    assert "p: Parameter(float32, [3, 4]) requires_grad" in shown
    assert "tag: 'embedding'" in shown
    ckpt.ok("convert", src, out)
    got = helpers.torch_load(out)
    assert_same(ref, got)
    assert got["p"].tied_to == ("decoder", 0)
    # a safetensors conversion keeps the weights (attributes have no place there)
    st = tmp_path / "p.safetensors"
    ckpt.ok("convert", src, st)
    listed = ckpt.ok("ls", st).stdout
    assert "p " in listed and "q " in listed


@pytest.mark.parametrize("protocol", [2, 4])
def test_newobj_with_keyword_arguments(ckpt, mod, tmp_path, protocol):
    src, out = tmp_path / "kw.pt", tmp_path / "out.pt"
    torch.save(kwargs_checkpoint(mod), src, pickle_protocol=protocol)
    ref = helpers.torch_load(src)
    assert ref["pt"].kwargs["name"] == "origin"
    listing = ckpt.ok("ls", src).stdout
    assert "pt.kwargs" not in listing  # the tensor inside is named by where it sits
    shown = ckpt.ok("show", src).stdout
    assert f"{USER_MODULE}.Point" in shown and "name: 'origin'" in shown
    ckpt.ok("convert", src, out)
    assert_same(ref, helpers.torch_load(out))
    r = ckpt.run("ls", src, "--strict")
    assert r.returncode == 6 and "not allowed" in r.stderr
