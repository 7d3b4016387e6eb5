"""What ckpt writes, checked against the torch that runs the suite (2.x in the peer venv, 1.13
from Debian), with safetensors as the second oracle.

- Every dtype this torch has, with sharing (views, tied weights) and Parameters: `ckpt convert`
  of torch.save's file (pt -> pt) and of safetensors' file (st -> pt) loads in torch.load with
  weights_only=True, bit-exact, and its data.pkl names the same GLOBALs and rebuild calls as
  torch.save's pickle of the same state dict.
- `--strict` accepts exactly what torch's weights_only accepts: one file per global on torch's
  default allow-list (read from torch itself), and refuses what torch refuses.
- safetensors both ways: ckpt reads what safetensors writes, and safetensors.torch.load_file
  reads what ckpt writes (aligned, metadata kept).
"""

import io
import json
import os
import pickletools
import struct
import zipfile

import pytest
import torch

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
# $CKPT_FIXTURES, else ../shared/fixtures beside the clone, else the workplace's /work/shared.
FIXTURES = next((os.path.join(d, "torch2") for d in (
    os.environ.get("CKPT_FIXTURES"),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "fixtures"),
    "/work/shared/fixtures") if d and os.path.isdir(os.path.join(d, "torch2"))), "")
TORCH211_ONLY = sorted(p for p in os.listdir(FIXTURES) if p.startswith("torch211_only_")) \
    if os.path.isdir(FIXTURES) else []
# Every dtype name torch has spelled (this torch has a subset), in a fixed order.
DTYPE_NAMES = ["float32", "float64", "float16", "bfloat16", "complex64", "complex128", "complex32",
               "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
               "float8_e8m0fnu", "float4_e2m1fn_x2", "bcomplex32"]


def _torch_saves(name):
    """This torch has the dtype and torch.save writes it (torch 1.13 cannot save complex32)."""
    if not isinstance(getattr(torch, name, None), torch.dtype):
        return False
    try:
        torch.save(torch.zeros(16, dtype=torch.uint8).view(getattr(torch, name))
                   if name not in ("bool",) else torch.zeros(2, dtype=torch.bool), io.BytesIO())
        return True
    except Exception:  # noqa: BLE001 - torch raises KeyError/RuntimeError for what it lacks
        return False


DTYPES = [n for n in DTYPE_NAMES if _torch_saves(n)]
# Dtypes whose arithmetic this torch lacks on the CPU: made from random bytes instead.
ST_CODES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
            "complex64": "C64", "bool": "BOOL", "int8": "I8", "int16": "I16", "int32": "I32",
            "int64": "I64", "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64",
            "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
            "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
            "float8_e8m0fnu": "F8_E8M0"}


def make_tensor(name, shape, seed):
    """A tensor of dtype `name` with arbitrary bit patterns (every byte random; bool 0/1)."""
    dt = getattr(torch, name)
    g = torch.Generator().manual_seed(seed)
    if dt is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    itemsize = torch.empty(0, dtype=dt).element_size()
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    if dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        # Finite values only, so that equality is meaningful after any round trip.
        return torch.randn(shape, generator=g).to(dt)
    return raw.view(dt).reshape(shape)


def same_bits(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def state_dict_of(name):
    base = make_tensor(name, (6, 4), seed=DTYPES.index(name))
    sd = {
        f"{name}.w": base,
        f"{name}.row": base[2],                      # a view into the same storage
        f"{name}.tied": base,                        # the same tensor twice
        f"{name}.scalar": make_tensor(name, (), seed=99),
        "step": 7,
        "shape": torch.Size([6, 4]),
    }
    if base.is_floating_point() and name in ("float32", "bfloat16", "float16", "float64"):
        sd[f"{name}.param"] = torch.nn.Parameter(base.clone(), requires_grad=True)
    return sd


def pickle_of(path):
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def globals_and_calls(data):
    """The GLOBALs a pickle names, and the sequence of rebuild functions it calls."""
    names, calls = [], []
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        if op.name == "GLOBAL":
            mod, _, fn = arg.partition(" ")
            names.append(f"{mod}.{fn}")
            if fn.startswith("_rebuild"):
                calls.append(fn)
    return sorted(set(names)), calls


def weights_only_load(path):
    return torch.load(path, weights_only=True, map_location="cpu")


@pytest.fixture(scope="module")
def written(ckpt, tmp_path_factory):
    """{dtype: (torch.save file, ckpt's pt -> pt file)}."""
    d = tmp_path_factory.mktemp("dtypes")
    out = {}
    for name in DTYPES:
        ref = d / f"{name}.pt"
        torch.save(state_dict_of(name), ref)
        conv = d / f"{name}.ckpt.pt"
        ckpt.ok("convert", ref, conv)
        out[name] = (ref, conv)
    return out


@pytest.mark.parametrize("name", DTYPES)
def test_pt_rewrite_loads_weights_only(written, name):
    ref, conv = written[name]
    want = torch.load(ref, weights_only=True)
    got = weights_only_load(conv)
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert type(got[k]) is type(v), k
            assert same_bits(got[k], v), k
            assert got[k].requires_grad == v.requires_grad, k
        else:
            assert got[k] == v and type(got[k]) is type(v), k
    # Sharing survives: the view and the tied entry share the base's storage.
    w, row, tied = got[f"{name}.w"], got[f"{name}.row"], got[f"{name}.tied"]
    assert tied is w
    assert row.storage().data_ptr() == w.storage().data_ptr()


@pytest.mark.parametrize("name", DTYPES)
def test_pt_rewrite_pickles_like_torch(written, name):
    ref, conv = written[name]
    want_names, want_calls = globals_and_calls(pickle_of(ref))
    got_names, got_calls = globals_and_calls(pickle_of(conv))
    assert got_names == want_names
    assert got_calls == want_calls


@pytest.mark.parametrize("name", [n for n in DTYPES if n in ST_CODES])
def test_safetensors_to_pt_pickles_like_torch(ckpt, tmp_path, name):
    st = pytest.importorskip("safetensors.torch")
    t = make_tensor(name, (3, 5), seed=7)
    src = tmp_path / "in.safetensors"
    st.save_file({"a": t}, str(src))
    out = tmp_path / "out.pt"
    ckpt.ok("convert", src, out)
    got = weights_only_load(out)
    assert same_bits(got["a"], t)
    ref = tmp_path / "ref.pt"
    torch.save({"a": t}, ref)
    assert globals_and_calls(pickle_of(out)) == globals_and_calls(pickle_of(ref))


@pytest.mark.parametrize("path", TORCH211_ONLY)
def test_torch211_files_open_strict_and_rewrite_identically(ckpt, tmp_path, path):
    """torch 2.11's own files open with --strict, and ckpt's rewrite pickles the same GLOBALs."""
    src = os.path.join(FIXTURES, path)
    ckpt.ok("ls", src, "--strict")
    out = tmp_path / "out.pt"
    ckpt.ok("convert", src, out)
    assert globals_and_calls(pickle_of(out)) == globals_and_calls(pickle_of(src))


# ---------------------------------------------------------------------------------------------
# --strict == torch's weights_only allow-list

def _allowed_globals():
    if not TORCH2:
        return {}
    from torch._weights_only_unpickler import _get_allowed_globals
    return _get_allowed_globals()


ALLOWED = sorted(_allowed_globals())


def _zip_with_pickle(path, pkl):
    """A torch.save zip whose data.pkl is `pkl` (torch's own records otherwise)."""
    buf = io.BytesIO()
    torch.save({}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            data = pkl if info.filename.endswith("/data.pkl") else zin.read(info.filename)
            zout.writestr(info.filename, data, compress_type=zipfile.ZIP_STORED)


def _pickle_naming(full):
    """{"g": <GLOBAL full>} as a protocol-2 pickle (the global pushed, never called)."""
    mod, _, name = full.rpartition(".")
    return (b"\x80\x02}q\x00X\x01\x00\x00\x00gq\x01c" + mod.encode() + b"\n" + name.encode() +
            b"\nq\x02s.")


@pytest.mark.skipif(not TORCH2, reason="torch's weights_only allow-list is torch 2.x's")
@pytest.mark.parametrize("full", ALLOWED)
def test_strict_accepts_each_weights_only_global(ckpt, tmp_path, full):
    path = tmp_path / "g.pt"
    _zip_with_pickle(path, _pickle_naming(full))
    torch.load(path, weights_only=True)  # the oracle accepts it
    ckpt.ok("ls", path, "--strict")


REFUSED = ["os.system", "builtins.eval", "builtins.exec", "subprocess.Popen",
           "numpy.core.multiarray._reconstruct", "numpy.dtype", "argparse.Namespace",
           "pathlib.PosixPath", "collections.defaultdict", "datetime.datetime", "builtins.getattr",
           "torch.load", "torch.serialization.load", "torch._C._nn.gelu", "builtins.list"]


@pytest.mark.skipif(not TORCH2, reason="torch's weights_only allow-list is torch 2.x's")
@pytest.mark.parametrize("full", REFUSED)
def test_strict_refuses_what_weights_only_refuses(ckpt, tmp_path, full):
    path = tmp_path / "g.pt"
    _zip_with_pickle(path, _pickle_naming(full))
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)
    r = ckpt.run("ls", path, "--strict")
    assert r.returncode == 6, r
    assert full in r.stderr and "not allowed" in r.stderr, r.stderr
    ckpt.ok("ls", path)  # without --strict it is data, never called


# ---------------------------------------------------------------------------------------------
# safetensors 0.8 as the oracle, both ways

def _st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


@pytest.mark.parametrize("name", [n for n in DTYPES if n in ST_CODES])
def test_safetensors_reads_what_ckpt_writes(ckpt, tmp_path, name):
    st = pytest.importorskip("safetensors.torch")
    import safetensors
    tensors = {"a": make_tensor(name, (4, 3), seed=3), "b": make_tensor(name, (5,), seed=4),
               "c": make_tensor(name, (), seed=5)}
    src = tmp_path / "in.pt"
    torch.save(tensors, src)
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", src, out)
    # safetensors' own parser validates the file whatever the dtype (header, offsets, coverage).
    parsed = dict(safetensors.deserialize(out.read_bytes()))
    assert set(parsed) == set(tensors)
    for k, v in tensors.items():
        assert parsed[k]["dtype"].upper() == ST_CODES[name], parsed[k]["dtype"]
        assert list(parsed[k]["shape"]) == list(v.shape), k
        assert bytes(parsed[k]["data"]) == v.reshape(-1).view(torch.uint8).numpy().tobytes(), k
    if ST_CODES[name] in st._TYPES:  # safetensors.torch maps the code to a torch dtype
        got = st.load_file(str(out))
        assert set(got) == set(tensors)
        for k, v in tensors.items():
            assert same_bits(got[k], v), k
    n, header = _st_header(out)
    assert (8 + n) % 8 == 0, "data must start 8-aligned"
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {ST_CODES[name]}


@pytest.mark.parametrize("name", [n for n in DTYPES if n in ST_CODES])
def test_ckpt_reads_what_safetensors_writes(ckpt, tmp_path, name):
    st = pytest.importorskip("safetensors.torch")
    t = make_tensor(name, (4, 3), seed=11)
    src = tmp_path / "in.safetensors"
    u = t[1:].clone()
    st.save_file({"t": t, "u": u}, str(src), metadata={"who": "test"})
    listing = ckpt.json("ls", src, "--json")
    rows = listing if isinstance(listing, list) else listing.get("tensors", listing)
    assert {r["name"]: r["dtype"] for r in rows} == {"t": name, "u": name}
    # The bytes, through a pt rewrite that torch reads back.
    out = tmp_path / "out.pt"
    ckpt.ok("convert", src, out)
    got = weights_only_load(out)
    assert same_bits(got["t"], t) and same_bits(got["u"], u)
    # st -> st keeps the metadata and safetensors reads it back.
    again = tmp_path / "again.safetensors"
    ckpt.ok("convert", src, again)
    _, header = _st_header(again)
    assert header.get("__metadata__", {}).get("who") == "test"
    if ST_CODES[name] in st._TYPES:
        back = st.load_file(str(again))
        assert same_bits(back["t"], t)


def test_safetensors_fixture_of_new_dtypes(ckpt, tmp_path):
    """safetensors 0.8's own file of the new dtypes (written by the fixture script)."""
    src = os.path.join(FIXTURES, "st08_new_dtypes.safetensors")
    if not os.path.exists(src):
        pytest.skip("torch2 fixtures not found")
    listing = ckpt.json("ls", src, "--json")
    rows = listing if isinstance(listing, list) else listing.get("tensors", listing)
    for r in rows:
        assert r["name"] == r["dtype"], r
