"""Files torch.save writes (zip and legacy) read in ckpt bit-exact.

Checks, per corpus file: `ckpt ls --json` against what torch.load sees
(names, dtypes, shapes, strides, storage offsets, nbytes), storage sharing,
byte offsets into the file, `ckpt extract` values; plus smoke tests of
`ckpt info` / `ckpt show`, and refusal of files that would need code to load.
"""

import json
import math
import os
import zlib

import pytest

import corpus
import helpers
from conftest import ALL_IDS, REFUSE_IDS, one_error_line


def _expected(cache, file_id):
    return helpers.flatten(cache.load(cache.path(file_id)))


def _subbyte(file_id):
    return "subbyte" in corpus.file_case(file_id).notes


@pytest.mark.parametrize("file_id", ALL_IDS)
def test_ls_metadata(cache, file_id):
    listing = cache.ls(file_id)
    want_format = "torch-legacy" if file_id.endswith(".legacy") else "torch-zip"
    assert listing.get("format") == want_format
    got = listing["tensors"]
    names = [e["name"] for e in got]
    assert len(names) == len(set(names)), f"duplicate names: {sorted(n for n in names if names.count(n) > 1)}"
    expected = _expected(cache, file_id)
    assert sorted(names) == sorted(n for n, _ in expected)
    by_name = {e["name"]: e for e in got}
    for name, t in expected:
        e = by_name[name]
        want = {"dtype": helpers.dtype_name(t), "shape": list(t.shape), "strides": list(t.stride()),
                "storage_offset": t.storage_offset()}
        if not _subbyte(file_id):
            # Sub-byte quantized dtypes pack 2 or 4 values per byte, so numel x
            # element_size (1) over-counts their bytes; the contract is silent there.
            want["nbytes"] = t.numel() * t.element_size()
        have = {k: e.get(k) for k in want}
        assert have == want, f"tensor {name!r}"
        assert isinstance(e.get("storage"), str), f"tensor {name!r}: storage key {e.get('storage')!r}"


@pytest.mark.parametrize("file_id", ALL_IDS)
def test_ls_storage_sharing(cache, file_id):
    """Two listed tensors share a "storage" key iff torch gives them one StorageImpl."""
    by_name = {e["name"]: e for e in cache.ls(file_id)["tensors"]}
    expected = _expected(cache, file_id)
    key_of, sid_of = {}, {}
    for name, t in expected:
        key, sid = by_name[name]["storage"], helpers.storage_id(t)
        if key_of.setdefault(sid, key) != key:
            pytest.fail(f"{name!r}: torch says it shares a storage with a tensor ckpt keys {key_of[sid]!r}, ckpt says {key!r}")
        if sid_of.setdefault(key, sid) != sid:
            pytest.fail(f"{name!r}: ckpt storage key {key!r} is shared with tensors torch keeps apart")


@pytest.mark.parametrize("file_id", ALL_IDS)
def test_ls_offsets(cache, file_id):
    """"offset" points at the tensor's first element in the file: the bytes there,
    walked with the tensor's strides, are the tensor's bytes."""
    path = cache.path(file_id)
    with open(path, "rb") as f:
        buf = f.read()
    by_name = {e["name"]: e for e in cache.ls(file_id)["tensors"]}
    for name, t in _expected(cache, file_id):
        off = by_name[name].get("offset")
        if t.numel() == 0 and off is None:
            continue
        assert isinstance(off, int), f"{name!r}: offset {off!r} (torch files store tensors raw)"
        want = helpers.tensor_bytes(t)
        if _subbyte(file_id):
            got = buf[off:off + len(want)]
        else:
            got = helpers.strided_from_buffer(buf, off, t.shape, t.stride(), t.element_size())
        assert got == want, f"{name!r}: bytes at offset {off} differ from the tensor's"


@pytest.mark.parametrize("file_id", ALL_IDS)
def test_extract(ckpt, cache, file_id, tmp_path):
    out = tmp_path / "x"
    ckpt.ok("extract", cache.path(file_id), out)
    with open(out / "index.json") as f:
        index = json.load(f)
    want_format = "torch-legacy" if file_id.endswith(".legacy") else "torch-zip"
    assert index.get("format") == want_format
    entries = {e["name"]: e for e in index["tensors"]}
    expected = _expected(cache, file_id)
    assert sorted(entries) == sorted(n for n, _ in expected)
    files = [e["file"] for e in index["tensors"]]
    assert len(set(files)) == len(files), "two tensors extracted to one file"
    for name, t in expected:
        e = entries[name]
        dname = helpers.dtype_name(t)
        descr, raw_bits, _ = helpers.NPY[dname]
        assert (e["dtype"], e["shape"], e["numpy_dtype"], e["raw_bits"]) == (dname, list(t.shape), descr, raw_bits), name
        npy = out / e["file"]
        assert os.path.realpath(npy).startswith(os.path.realpath(out) + os.sep), f"{name!r}: file escapes DIR"
        version, header, data = helpers.read_npy(npy)
        assert version == (1, 0), f"{name!r}: .npy version {version}"
        assert header["descr"] == descr and header["fortran_order"] is False, f"{name!r}: header {header}"
        want = helpers.tensor_bytes(t)
        if not _subbyte(file_id):
            assert tuple(header["shape"]) == tuple(t.shape), f"{name!r}: .npy shape {header['shape']}"
        else:
            # int_repr of a packed dtype is the packed bytes; either shape is acceptable.
            assert math.prod(header["shape"]) in (t.numel(), len(want)), f"{name!r}: .npy shape {header['shape']}"
        assert data == want, f"{name!r}: extracted bytes differ from torch's"


@pytest.mark.parametrize("mode", ["eager", "mmap", "stream"])
@pytest.mark.parametrize("file_id", ALL_IDS)
def test_every_load_path_matches_torch(ckpt, cache, file_id, mode):
    """`ckpt load --digest`: each tensor's elements as the eager load (open_and_load: reads that
    overlap the pickle parse), the zero-copy mmap views and the streaming ring give them, against
    torch.load's, by CRC32 — with CRC verification on."""
    got = ckpt.json("load", cache.path(file_id), "--mode", mode, "--verify", "--digest",
                    "--json")["digests"]
    expected = _expected(cache, file_id)
    want = {name: "%08x" % zlib.crc32(helpers.tensor_bytes(t)) for name, t in expected}
    assert {n: got.get(n) for n in want} == want


def test_info_and_show(ckpt, cache):
    path = cache.path("module_sd")
    n = len(_expected(cache, "module_sd"))
    info = ckpt.json("info", path, "--json")
    assert info.get("format") == "torch-zip"

    def counts(x, key=""):
        if isinstance(x, dict):
            for k, v in x.items():
                yield from counts(v, k)
        elif isinstance(x, list):
            if "tensor" in key.lower():
                yield len(x)
        elif isinstance(x, int) and not isinstance(x, bool) and ("tensor" in key.lower() or "count" in key.lower()):
            yield x

    assert n in set(counts(info)), f"info does not report the tensor count {n}: {info}"

    shown = ckpt.ok("show", path).stdout
    for name, _ in _expected(cache, "module_sd"):
        assert name in shown, f"show does not mention {name!r}"
    shown = ckpt.ok("show", cache.path("dtype_int32"), "t").stdout
    assert "-2147483648" in shown and "2147483647" in shown, f"show NAME lacks the values: {shown[:500]}"


@pytest.mark.parametrize("command", ["ls", "extract", "convert"])
@pytest.mark.parametrize("file_id", REFUSE_IDS)
def test_refuse_unknown_global(ckpt, corpus_files, file_id, command, tmp_path):
    path, global_name = corpus_files["refuse"][file_id]
    args = {"ls": ["ls", path, "--json"], "extract": ["extract", path, tmp_path / "x"],
            "convert": ["convert", path, tmp_path / "out.pt"]}[command]
    r = ckpt.run(*args, "--strict")  # issue 13: only --strict refuses; by default it is opaque
    line = one_error_line(r)
    module, name = global_name.rsplit(".", 1)
    assert global_name in line or f"{module} {name}" in line, f"message does not name {global_name}: {line!r}"
    assert not os.path.exists(corpus_files["marker"]), "a pickled os.system call ran"
    if command == "convert":
        assert os.listdir(tmp_path) == [], f"failed convert left files: {os.listdir(tmp_path)}"


@pytest.mark.parametrize("file_id", REFUSE_IDS)
def test_unknown_global_is_opaque(ckpt, corpus_files, file_id, tmp_path):
    """Without --strict an unknown global is kept by name, never called (issue 13)."""
    path, global_name = corpus_files["refuse"][file_id]
    listing = ckpt.json("ls", path, "--json")
    names = {r["name"] for r in (listing if isinstance(listing, list) else listing["tensors"])}
    assert "w" in names, names
    info = ckpt.json("info", path, "--json")
    assert global_name in info["foreign_classes"], info["foreign_classes"]
    ckpt.ok("extract", path, tmp_path / "x")
    assert not os.path.exists(corpus_files["marker"]), "a pickled os.system call ran"
