"""ckpt.load returns what torch.load returns, for every file of the interop corpus."""

import collections
import gc
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch

import ckpt
import corpus
from helpers import assert_same

ZIP_IDS = [c.name for c in corpus.CASES]
LEGACY_IDS = [f"{c.name}.legacy" for c in corpus.CASES if c.legacy]


@pytest.mark.parametrize("fid", ZIP_IDS + LEGACY_IDS)
def test_corpus_equal_to_torch(torch_corpus, fid):
    path = torch_corpus["files"][fid]
    expected = torch.load(path, weights_only=corpus.weights_only(fid))
    assert_same(ckpt.load(path), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "non-writable buffer" warning
        assert_same(ckpt.load(path, mmap=True), expected)


@pytest.mark.parametrize("fid", ["nested", "adam", "module_sd.legacy", "quant_per_channel"])
def test_file_object_and_verify(torch_corpus, fid):
    path = torch_corpus["files"][fid]
    with open(path, "rb") as f:
        got = ckpt.load(f)
    expected = torch.load(path, weights_only=corpus.weights_only(fid))
    assert_same(got, expected)
    assert_same(ckpt.load(path, verify=True), expected)


def test_load_state_dict(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    p = tmp_path / "m.pt"
    torch.save(m.state_dict(), p)
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    for mmap in (False, True):
        sd = ckpt.load(p, mmap=mmap)
        m2.load_state_dict(sd)
        for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
            assert torch.equal(a, b)


def test_mmap_views_are_private_and_outlive_the_file(tmp_path):
    p = tmp_path / "a.pt"
    torch.save({"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3)}, p)
    sd = ckpt.load(p, mmap=True)
    sd["a"][0] = 42  # private copy-on-write: the file is unchanged
    assert ckpt.load(p)["a"][0] == 0
    # Replace the file (rename over it, as ckpt.save and torch.save via a temp do) and delete it.
    torch.save({"a": torch.zeros(1000)}, tmp_path / "b.pt")
    os.replace(tmp_path / "b.pt", p)
    os.remove(p)
    gc.collect()
    assert sd["a"][1] == 1 and sd["a"][999] == 999 and sd["a"][0] == 42


def test_every_dtype_and_layout_mmap_and_eager(tmp_path):
    # Tensors made over the mapping / the load's memory through DLPack (whole storages of a
    # dtype with a DLPack code) and through frombuffer (bool, views, shared storages, empties):
    # every layout as torch.load gives it, storage sizes and sharing included.
    torch.manual_seed(0)
    base = torch.randn(6, 4)
    sd = collections.OrderedDict()
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
               torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
               torch.bool):
        sd[str(dt)] = (torch.randn(3, 5) * 10).to(dt)
    sd["scalar"] = torch.tensor(3.5)
    sd["empty"] = torch.empty(0, 4)
    sd["base"] = base
    sd["row_view"] = base[2]          # offset into a shared storage
    sd["transposed"] = base.t()       # strided view of the same storage
    sd["nonc"] = torch.randn(4, 6).t().contiguous().t()  # sole user, not contiguous
    sd["prefix"] = torch.arange(10.0)[:4]  # sole user of a larger storage
    p = tmp_path / "layouts.pt"
    torch.save(sd, p)
    expected = torch.load(p, weights_only=True)
    for mmap in (True, False):
        got = ckpt.load(p, mmap=mmap)
        assert_same(got, expected)
        got["torch.float32"][0, 0] = 123.0  # writable, and private
        assert got["torch.float32"][0, 0] == 123.0
    assert ckpt.load(p)["torch.float32"][0, 0] == expected["torch.float32"][0, 0]


def test_mmap_mapping_released_with_the_last_tensor(tmp_path):
    # The mapping lives exactly as long as a tensor over it (the DLPack deleter drops it).
    p = tmp_path / "released.pt"
    torch.save({f"t{i}": torch.randn(64) for i in range(50)}, p)

    def mapped():
        with open("/proc/self/maps") as f:
            return str(p) in f.read()

    sd = ckpt.load(p, mmap=True)
    gc.collect()
    assert mapped()
    keep = sd["t7"]
    del sd
    gc.collect()
    ckpt._ckpt.drain_reaped()
    assert mapped()
    assert keep.sum().item() == keep.sum().item()  # readable
    del keep
    gc.collect()
    assert not mapped()


def test_eager_tensors_outlive_file_and_overwrite(tmp_path):
    p = tmp_path / "a.pt"
    torch.save({"a": torch.arange(10.0)}, p)
    sd = ckpt.load(p)
    with open(p, "wb") as f:  # truncate and overwrite in place
        f.write(b"garbage" * 100)
    os.remove(p)
    gc.collect()
    assert torch.equal(sd["a"], torch.arange(10.0))


def test_formats(tmp_path):
    torch.manual_seed(0)
    sd = collections.OrderedDict(w=torch.randn(3, 4), b=torch.arange(5), h=torch.randn(2).half())
    st = tmp_path / "m.safetensors"
    tz = tmp_path / "m.tensors"
    ckpt.save_file(dict(sd), st)
    ckpt.save(dict(sd), tz)
    for p in (st, tz):
        for mmap in (False, True):
            got = ckpt.load(p, mmap=mmap)
            assert set(got) == set(sd)
            for k in sd:
                assert torch.equal(got[k], sd[k])


def test_torchscript_state_dict(tmp_path):
    torch.manual_seed(0)
    m = torch.jit.script(torch.nn.Linear(3, 2))
    p = tmp_path / "s.pt"
    m.save(str(p))
    got = ckpt.load(p)
    assert isinstance(got, collections.OrderedDict)
    assert set(got) == {"weight", "bias"}
    assert torch.equal(got["weight"], m.weight) and torch.equal(got["bias"], m.bias)


def test_opaque_objects_are_never_called(torch_corpus):
    for fid, (path, glob) in torch_corpus["refuse"].items():
        got = ckpt.load(path)
        assert torch.equal(got["w"], torch.ones(2))
        obj = got["obj"] if "obj" in got else got["payload"]
        assert isinstance(obj, ckpt.Opaque)
        assert f"{obj.module}.{obj.name}" == glob
        with pytest.raises(ckpt.UnsupportedError) as e:
            ckpt.load(path, strict=True)
        assert glob in str(e.value)
        with pytest.raises(ckpt.UnsupportedError):
            ckpt.load(path, weights_only=True)
    assert not os.path.exists(torch_corpus["marker"])


def test_numpy_values_and_misc(tmp_path):
    import argparse
    import numpy as np
    obj = {"f": np.float64(1.5), "i": np.int64(7), "a": np.arange(4, dtype=np.float32),
           "ns": argparse.Namespace(lr=0.1, name="x"), "c": 1 + 2j, "big": 2 ** 80,
           "set": {1, 2}, "fs": frozenset({3}), "ba": bytearray(b"xy"), "by": b"\x00\xff",
           "size": torch.Size([2, 3]), "dt": torch.float16, "dev": torch.device("cpu"),
           "cnt": collections.Counter("aab")}
    p = tmp_path / "v.pt"
    torch.save(obj, p)
    got = ckpt.load(p)
    # numpy scalars and arrays, argparse.Namespace, Counter, set, bytes: no torch allowlists
    # them for weights_only=True, and this test is about exactly those objects
    exp = torch.load(p, weights_only=False)
    for k in ("f", "i", "c", "big", "set", "fs", "ba", "by", "size", "dt", "dev", "cnt", "ns"):
        assert type(got[k]) is type(exp[k]), k
        assert got[k] == exp[k], k
    assert isinstance(got["a"], np.ndarray) and np.array_equal(got["a"], exp["a"])


def test_shared_storage_identity(torch_corpus):
    sd = ckpt.load(torch_corpus["files"]["tied"])
    exp = torch.load(torch_corpus["files"]["tied"], weights_only=corpus.weights_only("tied"))
    assert_same(sd, exp)


def test_map_location_forms(torch_corpus):
    p = torch_corpus["files"]["plain_sd"]
    ckpt.load(p, map_location=torch.device("cpu"))
    ckpt.load(p, map_location=None)
    ckpt.load(p, map_location={"cuda:0": "cpu"})
    # CUDA is a device ckpt loads into (tests/python/test_device.py); without a usable one it
    # is unsupported, not an invalid argument.
    if not torch.cuda.is_available():
        with pytest.raises(ckpt.UnsupportedError):
            ckpt.load(p, map_location="cuda")
    with pytest.raises(ckpt.InvalidArgumentError):
        ckpt.load(p, map_location="tpu")


def test_bytesio_roundtrip():
    buf = io.BytesIO()
    torch.save({"x": torch.arange(3)}, buf)
    buf.seek(0)
    assert torch.equal(ckpt.load(buf)["x"], torch.arange(3))


def test_sharded_index(tmp_path):
    import json
    ckpt.save({"a": torch.ones(3)}, tmp_path / "m-1.safetensors")
    ckpt.save({"b": torch.zeros(2)}, tmp_path / "m-2.safetensors")
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}))
    for mmap in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            sd = ckpt.load(tmp_path / "m.safetensors.index.json", mmap=mmap)
        assert list(sd) == ["a", "b"] and torch.equal(sd["a"], torch.ones(3))
        sd["a"][0] = 5  # writable: a shard's read-only mapping is never handed out


def test_load_restores_the_garbage_collector(tmp_path):
    # ckpt.load pauses the cyclic collector while it makes its objects (speed) and restores the
    # caller's setting, also after an error.
    p = tmp_path / "sd.pt"
    torch.save({"a": torch.arange(4)}, p)
    assert gc.isenabled()
    ckpt.load(p)
    ckpt.load(p, mmap=True)
    assert gc.isenabled()
    with pytest.raises(ckpt.NotFoundError):
        ckpt.load(tmp_path / "missing.pt")
    assert gc.isenabled()
    gc.disable()
    try:
        ckpt.load(p)
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("mmap", [False, True])
def test_many_tensors_own_storages_and_lifetime(tmp_path, mmap):
    # The C++ fast path (plain tensors, one frombuffer per storage): each tensor has a storage
    # of its own, as large as torch.load's (torch.save of one writes only its bytes), views and
    # shared storages stay shared, and a tensor kept alone outlives the rest and the file.
    torch.manual_seed(0)
    base = torch.randn(6, 5)
    sd = collections.OrderedDict()
    for i in range(300):
        sd[f"w{i}"] = torch.randn(3, 4) if i % 3 else torch.arange(7, dtype=torch.int64)
    sd["view"] = base[1:, 2:]
    sd["base"] = base
    sd["half"] = torch.randn(5).half()
    p = tmp_path / "many.pt"
    torch.save(sd, p)
    expected = torch.load(p, weights_only=True)
    got = ckpt.load(p, mmap=mmap)
    assert_same(got, expected)
    for k in expected:
        assert got[k].storage().nbytes() == expected[k].storage().nbytes(), k
    keep, keep_view = got["w5"], got["view"]
    del got
    gc.collect()
    os.replace(tmp_path / "many.pt", tmp_path / "gone.pt")
    (tmp_path / "gone.pt").unlink()
    assert torch.equal(keep, expected["w5"])
    assert torch.equal(keep_view, expected["view"])


def test_memory_kept_between_eager_loads(tmp_path):
    # The memory of a freed eager load (>= 64 MiB) is kept for the next one, which reads right.
    p = tmp_path / "big.pt"
    torch.manual_seed(1)
    sd = {"a": torch.randn(9 << 20), "b": torch.arange(9 << 20, dtype=torch.float32)}
    torch.save(sd, p)
    before = ckpt.set_kept_memory_limit(1 << 40)
    try:
        ckpt.release_kept_memory()
        got = ckpt.load(p)
        assert ckpt.kept_memory() == 0
        del got
        gc.collect()
        kept = ckpt.kept_memory()
        assert kept >= 72 << 20
        got = ckpt.load(p)
        assert ckpt.kept_memory() == 0  # taken by this load
        assert torch.equal(got["a"], sd["a"]) and torch.equal(got["b"], sd["b"])
        del got
        gc.collect()
        assert ckpt.release_kept_memory() == kept and ckpt.kept_memory() == 0
        ckpt.set_kept_memory_limit(0)
        del sd
        got = ckpt.load(p)
        del got
        gc.collect()
        assert ckpt.kept_memory() == 0
    finally:
        ckpt.set_kept_memory_limit(before)


NO_WARNINGS = r'''
import sys, warnings
warnings.simplefilter("error")  # a warning raised in ckpt fails the load
sys.path.insert(0, sys.argv[1])
import ckpt, torch
for p in sys.argv[2:]:
    for mmap in (False, True):
        ckpt.load(p, mmap=mmap)
    with ckpt.safe_open(p) as f:
        [f.get_tensor(k) for k in f.keys()]
    ckpt.save(ckpt.load(p), p + ".again.pt")
    list(ckpt.open(p).stream(1 << 20))
print("ok")
'''


def test_no_warnings_from_ckpt(torch_corpus, built_path):
    # torch 2.x warns once per process at the first use of a TypedStorage (tensor.storage()):
    # ckpt's loads (shared storages, views, bool), saves and streams use none (a fresh process,
    # every warning an error). Quantized tensors are left out: torch's own _rebuild_qtensor,
    # which ckpt calls as torch.load does, asks a TypedStorage for its device, and torch.load
    # of such a file warns the same.
    files = [torch_corpus["files"][f] for f in ("tied", "shared_storage", "views", "dtype_bool",
                                                "params", "scalars_0d")]
    r = subprocess.run([sys.executable, "-c", NO_WARNINGS, built_path, *files],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"


def _resident(path):
    """Bytes of `path` in the page cache (util-linux fincore)."""
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", path],
                       capture_output=True, text=True)
    return int(r.stdout.split()[0])


def _drop(path):
    with open(path, "rb") as f:
        os.fdatasync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def test_drop_cache_leaves_a_cold_file_cold_and_a_warm_one_warm(tmp_path):
    import shutil
    if not shutil.which("fincore"):
        pytest.skip("fincore (util-linux) is not installed")
    path = str(tmp_path / "m.pt")
    sd = {f"t{i}": torch.full((1 << 20,), float(i)) for i in range(32)}  # 128 MiB
    torch.save(sd, path)
    _drop(path)
    if _resident(path) != 0:
        pytest.skip("this filesystem keeps pages posix_fadvise drops")
    assert_same(ckpt.load(path, drop_cache=True), sd)
    # At most what the open read before the load began (data.pkl, the zip directory) and the
    # kernel's read-ahead around it (read_ahead_kb of the disk, twice: the window and the next).
    st = os.stat(path)
    ra = 128 << 10
    for q in ("queue/read_ahead_kb", "../queue/read_ahead_kb"):
        try:
            with open(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/{q}") as f:
                ra = int(f.read()) << 10
            break
        except OSError:
            pass
    assert _resident(path) <= 2 * ra + (256 << 10)
    assert_same(ckpt.load(path), sd)
    size = os.path.getsize(path)
    assert _resident(path) >= size - 4096  # without: the file stays cached
    ckpt.load(path, drop_cache=True)  # warm before the load: another reader's cache stays
    assert _resident(path) >= size - 4096
