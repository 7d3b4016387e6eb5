"""torch.load's and safetensors' edges, as a user of torch meets them: map_location dicts and
None, torch.load's call forms, the exception types fallback code catches, file objects in text
mode, save errors naming the file, reference cycles, a progress callback raising after the
commit, load_file's mapped tensors, and the container types each peer returns. Each case states
torch's (or safetensors') own behaviour next to ckpt's."""

import collections
import gc
import inspect
import io
import os
import pickle
import sys
import types

import pytest
import torch

import ckpt
from helpers import assert_same


class Custom:
    """A class outside torch's weights_only list (pickled by name)."""


@pytest.fixture
def pt(tmp_path):
    p = tmp_path / "sd.pt"
    torch.save(collections.OrderedDict(w=torch.arange(6.0).reshape(2, 3), b=torch.ones(2)), p)
    return p


@pytest.mark.parametrize("loc", [{"cuda:1": "cuda:0"}, {"cuda:0": "cuda:1"}, {}, None,
                                 {"cpu": "cpu"}])
def test_map_location_dict_and_none_on_a_cpu_file(pt, loc):
    # torch maps each saved location through the dict (unlisted ones stay where they were
    # saved), and None keeps the saved location: a CPU file stays on the CPU.
    ref = torch.load(pt, map_location=loc, weights_only=False)
    got = ckpt.load(pt, map_location=loc)
    assert all(t.device.type == "cpu" for t in ref.values())
    assert_same(got, ref)


def test_saved_device_mapping():
    f = ckpt._saved_device
    assert f({"cuda:1": "cuda:0"}, ["cuda:1"]) == "cuda:0"
    assert f({"cuda:1": "cuda:0"}, ["cpu"]) == "cpu"
    assert f({"cuda:1": "cuda:0"}, ["cuda:1", "cuda:1"]) == "cuda:0"
    assert f(None, ["cuda:2"]) == "cuda:2"
    assert f(None, []) == "cpu"
    assert f({}, ["cuda:0"]) == "cuda:0"
    assert f({"cuda:0": "cpu"}, ["cuda:0", "cpu"]) == "cpu"
    assert f({"cuda:0": torch.device("cpu")}, ["cuda:0"]) == "cpu"
    assert f({"cuda:0": "meta"}, ["cuda:0"]) == "meta"
    with pytest.raises(ckpt.InvalidArgumentError, match="one device"):
        f({"cuda:0": "cuda:1"}, ["cuda:0", "cpu"])
    with pytest.raises(ckpt.InvalidArgumentError, match="one device"):
        f(None, ["cuda:0", "cpu"])


def test_torch_load_call_forms(pt):
    forms = [(("cpu",), {}), ((None, pickle), {}), ((torch.device("cpu"),), {}),
             ((), {"encoding": "utf-8"}), ((), {"weights_only": True}),
             ((), {"weights_only": False}), ((), {"pickle_module": pickle})]
    if "mmap" in inspect.signature(torch.load).parameters:  # torch 2.1+
        forms += [((), {"mmap": None}), ((), {"mmap": True})]
    for args, kw in forms:
        ref = torch.load(pt, *args, **kw) if "weights_only" in kw else \
            torch.load(pt, *args, weights_only=False, **kw)
        assert_same(ckpt.load(pt, *args, **kw), ref)


def test_torch_load_arguments_refused_by_name(pt):
    other = types.ModuleType("my_pickle")
    with pytest.raises(ckpt.InvalidArgumentError, match="pickle_module=my_pickle"):
        ckpt.load(pt, "cpu", other)
    with pytest.raises(ckpt.InvalidArgumentError, match="encoding='latin1'"):
        ckpt.load(pt, encoding="latin1")
    with pytest.raises(TypeError):  # torch hands unknown keywords to the unpickler: TypeError
        torch.load(pt, weights_only=False, no_such_argument=1)
    with pytest.raises(TypeError):
        ckpt.load(pt, no_such_argument=1)


def test_weights_only_refusal_is_an_unpickling_error(tmp_path):
    p = tmp_path / "custom.pt"
    torch.save({"obj": Custom(), "w": torch.ones(2)}, p)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(p, weights_only=True)
    with pytest.raises(pickle.UnpicklingError) as e:
        ckpt.load(p, weights_only=True)
    assert isinstance(e.value, ckpt.ForbiddenGlobalError)
    assert isinstance(e.value, ckpt.UnsupportedError) and e.value.code == "unsupported"
    assert "Custom" in str(e.value) and str(p) in str(e.value)
    # The usual fallback: a full load when the safe one refuses (nothing runs in ckpt's).
    try:
        got = ckpt.load(p, weights_only=True)
    except pickle.UnpicklingError:
        got = ckpt.load(p, weights_only=False)
    assert isinstance(got["obj"], ckpt.Opaque) and torch.equal(got["w"], torch.ones(2))


def test_a_folder_that_is_not_a_checkpoint(tmp_path):
    d = tmp_path / "folder"
    d.mkdir()
    with pytest.raises(IsADirectoryError):
        torch.load(d, weights_only=True)
    for fn in (lambda: ckpt.load(d), lambda: ckpt.load(d, mmap=True),
               lambda: ckpt.load_file(d), lambda: ckpt.open(d)):
        with pytest.raises(IsADirectoryError) as e:
            fn()
        assert isinstance(e.value, ckpt.Error) and str(d) in str(e.value)


def test_file_object_in_text_mode(pt, tmp_path):
    with open(pt) as f, pytest.raises(UnicodeDecodeError):
        torch.load(f, weights_only=True)  # torch: a UnicodeDecodeError
    with open(pt) as f, pytest.raises(ckpt.InvalidArgumentError, match="open it with 'rb'"):
        ckpt.load(f)
    with open(pt, encoding="latin-1") as f, pytest.raises(ckpt.InvalidArgumentError,
                                                          match="'rb'"):
        ckpt.load(f)
    with open(tmp_path / "out.pt", "w") as f, pytest.raises(ckpt.InvalidArgumentError,
                                                             match="open it with 'wb'"):
        ckpt.save({"a": torch.ones(1)}, f)


def test_save_errors_name_the_file(tmp_path):
    p = str(tmp_path / "bad.pt")
    with pytest.raises(ckpt.InvalidArgumentError) as e:
        ckpt.save({"x": object()}, p)
    assert e.value.source == p and str(e.value).startswith(p + ": x: ")
    s = str(tmp_path / "bad.safetensors")
    with pytest.raises(ckpt.InvalidArgumentError) as e:
        ckpt.save_file({"x": 3}, s)
    assert e.value.source == s and s in str(e.value)
    buf = io.BytesIO()
    with pytest.raises(ckpt.InvalidArgumentError) as e:
        ckpt.save({"x": object()}, buf)
    assert e.value.source == "<stream>" and "<stream>: x: " in str(e.value)
    assert not os.path.exists(p) and not os.path.exists(s) and buf.getvalue() == b""


def test_reference_cycles_are_refused_when_saving(tmp_path):
    d = {"w": torch.ones(1)}
    d["self"] = d
    lst = [1]
    lst.append(lst)
    inner = []
    tup = (inner,)
    inner.append(tup)
    p = tmp_path / "cycle.pt"
    torch.save(d, p)  # torch writes a cycle (pickle's memo) and reads it back
    back = torch.load(p, weights_only=False)
    assert back["self"] is back
    for obj, where in ((d, "self"), ({"l": lst}, "l"), ({"t": tup}, "t")):
        q = tmp_path / "ckpt.pt"
        with pytest.raises(ckpt.InvalidArgumentError, match="reference cycle") as e:
            ckpt.save(obj, q)
        assert str(q) in str(e.value) and where in str(e.value)
        assert not q.exists() and os.listdir(tmp_path) == ["cycle.pt"]
    with pytest.raises(ckpt.UnsupportedError, match="cycle"):
        ckpt.load(p)  # what ckpt would have written and could not read
    shared = [torch.ones(2)]
    ckpt.save({"a": shared, "b": shared, "c": (shared, shared)}, tmp_path / "shared.pt")
    got = ckpt.load(tmp_path / "shared.pt")
    ref = torch.load(tmp_path / "shared.pt", weights_only=False)
    assert got["a"] is got["b"] is got["c"][0] and ref["a"] is ref["b"]


def test_progress_raising_after_the_commit(tmp_path):
    sd = {f"t{i}": torch.randn(256) for i in range(8)}
    calls = []

    def at_end(done, total):
        calls.append((done, total))
        if done >= total:
            raise KeyError("stop")

    p = tmp_path / "done.pt"
    with pytest.raises(KeyError) as e:
        ckpt.save(sd, p, progress=at_end)
    assert e.value.ckpt_committed is True and p.exists()
    if sys.version_info >= (3, 11):
        assert any(str(p) in n and "committed" in n for n in e.value.__notes__)
    assert_same(torch.load(p, weights_only=True), sd)

    def at_once(done, total):
        raise KeyError("stop")

    q = tmp_path / "stopped.pt"
    with pytest.raises(KeyError) as e:
        ckpt.save(sd, q, progress=at_once)
    assert not getattr(e.value, "ckpt_committed", False) and not q.exists()

    s = tmp_path / "done.safetensors"
    with pytest.raises(KeyError) as e:
        ckpt.save(sd, s, progress=at_end)
    assert e.value.ckpt_committed is True and s.exists()

    # Checkpoint.convert: the same mark, and the output is whole.
    c = tmp_path / "converted.safetensors"
    with pytest.raises(KeyError) as e:
        ckpt.open(p).convert(str(c), progress=at_end)
    assert e.value.ckpt_committed is True
    assert_same(ckpt.load(c), sd)
    # Raising at the first call: marked exactly when that call came after the commit (a quick
    # conversion makes only the last call), and the output exists exactly then.
    d = tmp_path / "stopped.safetensors"
    with pytest.raises(KeyError) as e:
        ckpt.open(p).convert(str(d), progress=at_once)
    assert bool(getattr(e.value, "ckpt_committed", False)) == d.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is usable here")
def test_no_gpu_reads_no_cuda_device(pt):
    with pytest.raises(ckpt.UnsupportedError) as e:
        ckpt.load(pt, map_location="cuda:0")
    assert "no CUDA" in str(e.value) and "insufficient" not in str(e.value)


def test_container_types_match_the_peers(pt, tmp_path):
    st = pytest.importorskip("safetensors.torch")
    s = tmp_path / "sd.safetensors"
    st.save_file({"w": torch.ones(2)}, s)
    assert type(st.load_file(s)) is dict
    assert type(ckpt.load(s)) is dict and type(ckpt.load_file(s)) is dict
    assert type(torch.load(pt, weights_only=True)) is collections.OrderedDict
    assert type(ckpt.load(pt)) is collections.OrderedDict
    assert type(ckpt.load_file(pt)) is dict


def test_load_file_is_mapped(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    p = tmp_path / "mapped.safetensors"
    st.save_file({f"t{i}": torch.randn(1024) for i in range(4)}, p)

    def mapped():
        with open("/proc/self/maps") as f:
            return str(p) in f.read()

    expected = {k: v.clone() for k, v in st.load_file(p).items()}
    gc.collect()
    assert not mapped()
    got = ckpt.load_file(p)
    assert mapped()  # views of the file, as safetensors' own load_file returns
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    got["t0"][0] = 123.0  # a private mapping: writes stay in this process
    assert ckpt.load(p)["t0"][0] == expected["t0"][0]
    del got
    gc.collect()
    ckpt._ckpt.drain_reaped()
    assert not mapped()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("loc", [None, {"cuda:0": "cpu"}, {"cuda:1": "cuda:0"}, {},
                                 {"cuda:0": "cuda:0"}])
def test_map_location_dict_and_none_on_a_cuda_file(tmp_path, loc):
    # Saved on cuda:0: None and a dict that does not name cuda:0 keep it there, as torch does.
    p = tmp_path / "cuda.pt"
    torch.save({"w": torch.arange(6.0, device="cuda:0"), "n": 3}, p)
    ref = torch.load(p, map_location=loc, weights_only=True)
    got = ckpt.load(p, map_location=loc)
    assert got["w"].device == ref["w"].device
    assert torch.equal(got["w"].cpu(), ref["w"].cpu()) and got["n"] == 3
