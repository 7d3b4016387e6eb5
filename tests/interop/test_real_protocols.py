"""Legacy torch.save files in every pickle protocol (issue 13, point 1).

`torch.save(obj, f, _use_new_zipfile_serialization=False, pickle_protocol=N)` pickles the
magic number, the protocol version, sys_info, the object and the storage keys with protocol N:
0 and 1 have no PROTO opcode (the magic number is the text of a LONG), 4 and 5 put each pickle
in a FRAME. Each file is made by torch 1.13 with every dtype, views, shared storages, a
Parameter and a quantized tensor, and read back value by value, types included.

torch 1.13 cannot read its own protocol 0 files (the persistent ids become str() of a tuple,
which torch.load's persistent_load does not parse): ckpt reads them, and they are compared
with the protocol 2 file of the same object.
"""

import collections
import json

import pytest
import torch

import helpers

PROTOCOLS = [0, 1, 2, 3, 4, 5]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
          torch.complex128, torch.bool, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.uint8]


def build():
    torch.manual_seed(13)
    d = collections.OrderedDict()
    for dt in DTYPES:
        if dt.is_floating_point or dt.is_complex:
            t = torch.randn(3, 4, dtype=dt)
        elif dt == torch.bool:
            t = torch.rand(3, 4) > 0.5
        else:
            t = torch.randint(0, 100, (3, 4), dtype=dt)
        d[str(dt).replace("torch.", "")] = t
    base = torch.arange(20.0)
    d["base"] = base
    d["view"] = base[2:].view(3, 6)
    d["transposed"] = base.view(4, 5).t()
    d["step"] = base[1::3]
    shared = torch.arange(10, dtype=torch.int64)
    d["shared_a"] = shared[:5]  # two views of one storage, the storage itself not saved
    d["shared_b"] = shared[5:]
    d["scalar"] = torch.tensor(2.5)
    d["empty"] = torch.empty(0, 3)
    d["param"] = torch.nn.Parameter(torch.randn(2, 2))
    d["q"] = torch.quantize_per_tensor(torch.randn(4), 0.1, 2, torch.quint8)
    d["nested"] = {"list": [base, (shared[:5], 3)], "x": 1.5, 7: "seven", "big": 2 ** 70}
    return d


@pytest.fixture(scope="module")
def legacy_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("protocols")
    files = {}
    for p in PROTOCOLS:
        f = out / f"p{p}.pt"
        torch.save(build(), f, _use_new_zipfile_serialization=False, pickle_protocol=p)
        files[p] = f
    return files


def reference(files, p):
    # torch 1.13 cannot load protocol 0 (see the module doc): the same object at protocol 2.
    return helpers.torch_load(files[2 if p == 0 else p])


def test_protocol_0_is_unreadable_by_torch(legacy_files):
    """The reason protocol 0 is compared with protocol 2: torch.load fails on it."""
    head = open(legacy_files[0], "rb").read(32)
    assert head.startswith(b"L119547037146038801333356L\n.")
    with pytest.raises(Exception):
        torch.load(legacy_files[0], weights_only=False)


@pytest.mark.parametrize("p", PROTOCOLS)
def test_every_protocol_is_detected(ckpt, legacy_files, p):
    info = ckpt.json("info", legacy_files[p], "--json")
    assert info["format"] == "torch-legacy", info
    assert info["properties"]["pickle_protocol"] == str(p), info


@pytest.mark.parametrize("p", PROTOCOLS)
def test_every_protocol_lists_as_torch(ckpt, legacy_files, p):
    ref = reference(legacy_files, p)
    listing = ckpt.json("ls", legacy_files[p], "--json")["tensors"]
    want = helpers.flatten(ref)
    assert [t["name"] for t in listing] == [n for n, _ in want]
    for t, (name, x) in zip(listing, want):
        assert t["dtype"] == helpers.dtype_name(x), name
        assert t["shape"] == list(x.shape), name


@pytest.mark.parametrize("p", PROTOCOLS)
def test_every_protocol_converts_equal(ckpt, legacy_files, p, tmp_path):
    """pt (legacy, protocol p) -> pt zip: torch.load of the result equals torch.load of the
    original, bit-exact, storage sharing and types included."""
    out = tmp_path / "out.pt"
    ckpt.ok("convert", legacy_files[p], out)
    diffs = helpers.compare(reference(legacy_files, p), helpers.torch_load(out))
    assert not diffs, "\n".join(diffs[:30])


@pytest.mark.parametrize("p", PROTOCOLS)
def test_every_protocol_extracts_equal(ckpt, legacy_files, p, tmp_path):
    ref = dict(helpers.flatten(reference(legacy_files, p)))
    ckpt.ok("extract", legacy_files[p], tmp_path / "x")
    index = json.loads((tmp_path / "x" / "index.json").read_text())
    assert len(index["tensors"]) == len(ref)
    for e in index["tensors"]:
        x = ref[e["name"]]
        _, header, got = helpers.read_npy(tmp_path / "x" / e["file"])
        assert list(header["shape"]) == list(x.shape), e["name"]
        assert got == helpers.tensor_bytes(x), e["name"]


@pytest.mark.parametrize("p", PROTOCOLS)
def test_truncated_magic_is_truncated(ckpt, legacy_files, p, tmp_path):
    """A file cut inside the magic number's pickle, whatever its protocol, is truncated (4)."""
    data = open(legacy_files[p], "rb").read()
    for n in (3, 8, 14):
        cut = tmp_path / f"cut{n}.pt"
        cut.write_bytes(data[:n])
        r = ckpt.run("ls", cut)
        assert r.returncode == 4, (n, r.stderr)


@pytest.mark.parametrize("p", PROTOCOLS)
def test_damaged_magic_is_corrupt(ckpt, legacy_files, p, tmp_path):
    """A wrong digit or byte of the magic number: a corrupt legacy file (5), not unknown."""
    data = bytearray(open(legacy_files[p], "rb").read())
    at = data.index(b"0", 1) if p < 2 else data.index(b"\x9c")  # inside the number
    data[at] ^= 0x01
    f = tmp_path / "bad.pt"
    f.write_bytes(bytes(data))
    r = ckpt.run("ls", f)
    assert r.returncode == 5 and "magic" in r.stderr, r.stderr
