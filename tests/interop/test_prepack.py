"""ckpt's pre-pack cache (issue 12, point 3) through `ckpt prepack`: packed bytes equal a numpy
reference for both example packers, a second use comes from the cache, a changed tensor never
gets a stale blob, four processes at once leave one entry per tensor and no temporaries, and
--gc bounds the folder."""

import json
import os
import struct
import subprocess

import numpy as np
import pytest

from test_onnx import read_safetensors, write_safetensors  # noqa: F401  (shared helpers)


def blob(path):
    """The payload of a cache entry (src/api/prepack.cc: magic, payload offset, size, key)."""
    data = open(path, "rb").read()
    assert data[:8] == b"CKPTPACK"
    off, n = struct.unpack("<QQ", data[8:24])
    assert off % 4096 == 0 and off + n == len(data)
    return data[off:]


def ref_transpose(a, B=64):
    R, C = a.shape
    nb = (C + B - 1) // B
    pad = np.zeros((R, nb * B), a.dtype)
    pad[:, :C] = a
    return np.ascontiguousarray(pad.reshape(R, nb, B).transpose(1, 2, 0)).tobytes()


def ref_int8(a):
    m = np.abs(a).max(axis=1)
    scale = np.where(m > 0, m / np.float32(127), np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(a * (np.float32(1) / scale)[:, None]), -127, 127).astype(np.int8)
    return scale.tobytes() + q.tobytes()


@pytest.fixture()
def ckpt_file(tmp_path):
    rng = np.random.default_rng(3)
    t = {"a": rng.standard_normal((100, 130)).astype(np.float32),
         "b": rng.standard_normal((64, 64)).astype(np.float32)}
    p = tmp_path / "w.safetensors"
    write_safetensors(p, t)
    return p, t


@pytest.mark.parametrize("packer,ref", [("transpose-blocks64", ref_transpose), ("int8-rows", ref_int8)])
def test_packed_bytes_and_hits(ckpt, ckpt_file, packer, ref):
    p, t = ckpt_file
    first = ckpt.json("prepack", p, "--packer", packer, "--json")
    assert [e["hit"] for e in first["tensors"]] == [False, False]
    for e in first["tensors"]:
        got = blob(e["path"])
        want = ref(t[e["tensor"]])
        if packer == "int8-rows":  # rounding of x * (1/scale) may differ by one step
            a = np.frombuffer(got[4 * t[e["tensor"]].shape[0]:], np.int8).astype(int)
            b = np.frombuffer(want[4 * t[e["tensor"]].shape[0]:], np.int8).astype(int)
            assert got[:4 * t[e["tensor"]].shape[0]] == want[:4 * t[e["tensor"]].shape[0]]
            assert np.abs(a - b).max() <= 1
        else:
            assert got == want, e["tensor"]
    second = ckpt.json("prepack", p, "--packer", packer, "--json")
    assert [e["hit"] for e in second["tensors"]] == [True, True]
    assert [e["path"] for e in second["tensors"]] == [e["path"] for e in first["tensors"]]


def test_changed_tensor_is_not_stale(ckpt, ckpt_file):
    p, t = ckpt_file
    a = ckpt.json("prepack", p, "--tensor", "a", "--json")["tensors"][0]
    t["a"] = t["a"] + 1
    write_safetensors(p, t)
    b = ckpt.json("prepack", p, "--tensor", "a", "--json")["tensors"][0]
    assert not b["hit"] and b["path"] != a["path"]
    assert blob(b["path"]) == ref_transpose(t["a"])


def test_four_processes_share_one_entry(ckpt, ckpt_file, tmp_path):
    p, _ = ckpt_file
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([ckpt.path, "prepack", str(p), "--cache-dir", str(cache), "--json"],
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [json.loads(pr.communicate(timeout=60)[0]) for pr in procs]
    assert all(pr.returncode == 0 for pr in procs)
    for name in ("a", "b"):
        packed = sum(1 for o in outs for e in o["tensors"] if e["tensor"] == name and not e["hit"])
        assert packed == 1, (name, outs)
    files = os.listdir(cache)
    assert sorted(f for f in files if f.endswith(".blob")) == sorted(
        {os.path.basename(e["path"]) for o in outs for e in o["tensors"]})
    assert not [f for f in files if ".tmp-" in f]


def test_gc_bounds_the_cache(ckpt, ckpt_file, tmp_path):
    p, _ = ckpt_file
    cache = tmp_path / "c"
    ckpt.ok("prepack", p, "--cache-dir", cache)
    ckpt.ok("prepack", p, "--cache-dir", cache, "--packer", "int8-rows")
    before = sum(os.path.getsize(cache / f) for f in os.listdir(cache) if f.endswith(".blob"))
    r = ckpt.ok("prepack", "--gc", "--cache-dir", cache, "--max-size", "40KiB")
    after = sum(os.path.getsize(cache / f) for f in os.listdir(cache) if f.endswith(".blob"))
    assert after <= 40 * 1024 < before, r.stdout


def test_huge_page_alignment(ckpt, ckpt_file, tmp_path):
    p, t = ckpt_file
    e = ckpt.json("prepack", p, "--tensor", "b", "--cache-dir", tmp_path / "h", "--align", "2MiB",
                  "--json")["tensors"][0]
    data = open(e["path"], "rb").read()
    off, n = struct.unpack("<QQ", data[8:24])
    assert off % (2 << 20) == 0 and data[off:] == ref_transpose(t["b"])


@pytest.mark.parametrize("sig", ["KILL", "TERM"])
def test_killed_writer_leaves_no_half_entry(ckpt, tmp_path, sig):
    # A writer killed while it packs or stores never leaves an entry under its final name (an
    # entry appears by rename when complete); SIGTERM also removes its temporary. The next run
    # packs again and stores a correct entry.
    import signal
    import time
    rng = np.random.default_rng(5)
    big = {"w": rng.standard_normal((2048, 8192)).astype(np.float32)}  # 64 MiB
    p = tmp_path / "big.safetensors"
    write_safetensors(p, big)
    cache = tmp_path / "cache"
    killed = 0
    for delay in (0.02, 0.1, 0.25, 0.5):
        proc = subprocess.Popen([ckpt.path, "prepack", str(p), "--cache-dir", str(cache), "--json"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(delay)
        proc.send_signal(getattr(signal, "SIG" + sig))
        proc.communicate(timeout=60)
        if proc.returncode == 0:
            break  # it finished first: the entry is complete
        killed += 1
        files = os.listdir(cache) if cache.exists() else []
        for f in files:
            if f.endswith(".blob"):
                assert blob(cache / f) == ref_transpose(big["w"])  # complete, never half
        if sig == "TERM":
            assert not [f for f in files if ".tmp-" in f], files
    assert killed >= 1
    e = ckpt.json("prepack", p, "--cache-dir", cache, "--json")["tensors"][0]
    assert blob(e["path"]) == ref_transpose(big["w"])
