"""The C ABI (include/ckpt/ckpt_c.h, libckpt_c.so) from C, from Python's ctypes (without the
pybind11 module) and from Rust (a hand-written extern "C" block, built offline with cargo), on
files torch and safetensors wrote: every tensor's bytes equal what torch loads.

libckpt_c.so and the C program (tests/capi/ckpt_c_dump.c) are found beside the ckpt binary
($CKPT_BIN's folder: the ASan build's run the same tests under ASan). ctypes and Rust load the
library into processes that are not instrumented, so they run against an uninstrumented build
only.
"""

import ctypes
import os
import shutil
import subprocess
import zlib

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import helpers
from conftest import REPO, ckpt_path

BUILD = os.path.dirname(os.path.abspath(ckpt_path()))
LIB = os.path.join(BUILD, "libckpt_c.so")
DUMP = os.path.join(BUILD, "ckpt_c_dump")


def _sanitized():
    if not os.path.exists(LIB):
        return False
    out = subprocess.run(["ldd", LIB], capture_output=True, text=True).stdout
    return "libasan" in out or "libtsan" in out


pytestmark = pytest.mark.skipif(not os.path.exists(LIB) or not os.path.exists(DUMP),
                                reason=f"libckpt_c.so / ckpt_c_dump not built in {BUILD}")
uninstrumented = pytest.mark.skipif(_sanitized(), reason="the library is built with a sanitizer")


def _bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _expected(state):
    return {k: (helpers.dtype_name(v), list(v.shape), v.numel() * v.element_size(),
                f"{zlib.crc32(_bytes(v)):08x}") for k, v in state.items()}


def _parse(out):
    rows = {}
    for line in out.splitlines():
        f = line.split("\t")
        if len(f) >= 5 and f[2].startswith("["):
            shape = [int(x) for x in f[2][1:-1].split(",") if x]
            rows[f[0]] = (f[1], shape, int(f[3]), f[4])
    return rows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("capi")
    g = torch.Generator().manual_seed(7)
    model = {
        "embed.weight": torch.randn(64, 32, generator=g),
        "layers.0.attn.qkv.weight": torch.randn(96, 32, generator=g).to(torch.bfloat16),
        "layers.0.attn.qkv.bias": torch.randn(96, generator=g).half(),
        "layers.0.norm.weight": torch.ones(32),
        "step": torch.tensor(500, dtype=torch.int64),
        "mask": torch.rand(8, 8, generator=g) > 0.5,
    }
    pt = d / "train.pt"
    # A training checkpoint: model, AdamW state and plain numbers, as torch.save writes it.
    opt_state = {"state": {0: {"exp_avg": torch.randn(64, 32, generator=g), "step": torch.tensor(3.0)}},
                 "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]}
    torch.save({"model": model, "optimizer": opt_state, "epoch": 2}, pt)
    flat = {f"model.{k}": v for k, v in model.items()}
    flat["optimizer.state.0.exp_avg"] = opt_state["state"][0]["exp_avg"]
    flat["optimizer.state.0.step"] = opt_state["state"][0]["step"]
    st = d / "model.safetensors"
    save_file(model, str(st), metadata={"format": "pt"})
    return {"dir": d, "pt": pt, "st": st, "model": model, "flat": flat}


def test_c_reads_torch_and_safetensors_files_as_torch_does(files):
    for path, state in ((files["st"], files["model"]), (files["pt"], files["flat"])):
        r = subprocess.run([DUMP, str(path)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert _parse(r.stdout) == _expected(state)
    # safetensors is mapped: every tensor has a zero-copy view.
    r = subprocess.run([DUMP, str(files["st"])], capture_output=True, text=True)
    assert all(line.endswith("\tview") for line in r.stdout.splitlines()[2:])


def test_c_converts_and_verifies(files, tmp_path):
    out = tmp_path / "out.safetensors"
    r = subprocess.run([DUMP, "--convert", str(files["pt"]), str(out), "safetensors"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"written\t{len(files['flat'])}"
    from safetensors.torch import load_file
    got = load_file(str(out))
    assert set(got) == set(files["flat"])
    for k, v in files["flat"].items():
        assert torch.equal(got[k], v), k
    r = subprocess.run([DUMP, "--verify", str(files["pt"])], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("verify\tok\t"), r.stdout + r.stderr
    assert int(r.stdout.split("\t")[2]) > 0
    # safetensors stores no checksums: the CLI's "not verified", exit 10.
    r = subprocess.run([DUMP, "--verify", str(files["st"])], capture_output=True, text=True)
    assert r.returncode == 10 and "not_verified" in r.stdout


def test_c_errors_are_typed_and_named(files, tmp_path):
    missing = tmp_path / "nope.pt"
    r = subprocess.run([DUMP, "--errors", str(missing)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split("\t", 1) for line in r.stdout.splitlines())
    status, handle, source, _ = lines["open"].split("\t")
    assert (status, handle) == ("not_found", "null")
    assert str(missing) in lines["message"]
    assert lines["option"].startswith("invalid_argument\t") and "no_such_option" in lines["option"]
    assert lines["value"].startswith("invalid_argument\t") and "maybe" in lines["value"]
    assert lines["ok"] == "ok\t[]"
    assert lines["null"] == "invalid_argument"
    assert lines["version"].split("\t")[1] == "1"
    # A damaged file: the status is the CLI's exit code for the same failure.
    bad = tmp_path / "bad.safetensors"
    data = bytearray(files["st"].read_bytes())
    data[:8] = (10 ** 9).to_bytes(8, "little")
    bad.write_bytes(bytes(data))
    r = subprocess.run([DUMP, str(bad)], capture_output=True, text=True)
    cli = subprocess.run([ckpt_path(), "ls", str(bad)], capture_output=True, text=True)
    assert r.returncode == cli.returncode != 0
    assert str(bad) in r.stderr


class TensorInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p),
                ("dtype", ctypes.c_char_p), ("element_size", ctypes.c_size_t),
                ("ndim", ctypes.c_size_t), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("nbytes", ctypes.c_uint64),
                ("file_offset", ctypes.c_uint64), ("file_index", ctypes.c_size_t),
                ("contiguous", ctypes.c_int)]


@uninstrumented
def test_ctypes_without_the_module(files):
    lib = ctypes.CDLL(LIB)
    lib.ckpt_open.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.ckpt_tensor_count.argtypes = [ctypes.c_void_p]
    lib.ckpt_tensor_count.restype = ctypes.c_size_t
    lib.ckpt_tensor_info_at.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(TensorInfo)]
    lib.ckpt_tensor_data.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    lib.ckpt_read_tensor.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_void_p]
    lib.ckpt_close.argtypes = [ctypes.c_void_p]
    lib.ckpt_last_error.restype = ctypes.c_char_p
    h = ctypes.c_void_p()
    assert lib.ckpt_open(str(files["st"]).encode(), None, ctypes.byref(h)) == 0
    try:
        seen = {}
        for i in range(lib.ckpt_tensor_count(h)):
            info = TensorInfo(struct_size=ctypes.sizeof(TensorInfo))
            assert lib.ckpt_tensor_info_at(h, i, ctypes.byref(info)) == 0
            name = info.name.decode()
            want = files["model"][name]
            assert [info.shape[d] for d in range(info.ndim)] == list(want.shape)
            assert info.dtype.decode() == helpers.dtype_name(want)
            view = ctypes.c_void_p()
            assert lib.ckpt_tensor_data(h, i, ctypes.byref(view)) == 0  # mapped: zero-copy
            mapped = ctypes.string_at(view, info.nbytes)
            owned = np.empty(info.nbytes, np.uint8)
            assert lib.ckpt_read_tensor(h, i, owned.ctypes.data, info.nbytes, None) == 0
            assert mapped == owned.tobytes() == _bytes(want), name
            seen[name] = True
        assert set(seen) == set(files["model"])
        info = TensorInfo(struct_size=ctypes.sizeof(TensorInfo))
        assert lib.ckpt_tensor_info_at(h, 10 ** 6, ctypes.byref(info)) == 2
        assert b"past the last tensor" in lib.ckpt_last_error()
    finally:
        lib.ckpt_close(h)


@uninstrumented
@pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo is not installed")
def test_rust_extern_block(files, tmp_path):
    env = dict(os.environ, CKPT_C_LIB_DIR=BUILD, CARGO_TARGET_DIR=str(tmp_path / "target"),
               LD_LIBRARY_PATH=BUILD, CARGO_NET_OFFLINE="true")
    manifest = os.path.join(REPO, "tests", "capi", "rust", "Cargo.toml")
    b = subprocess.run(["cargo", "build", "--offline", "--quiet", "--manifest-path", manifest],
                       capture_output=True, text=True, env=env, timeout=600)
    assert b.returncode == 0, b.stderr
    exe = tmp_path / "target" / "debug" / "ckpt_c_rust"
    for path, state in ((files["st"], files["model"]), (files["pt"], files["flat"])):
        r = subprocess.run([str(exe), str(path)], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert _parse(r.stdout) == _expected(state)
    r = subprocess.run([str(exe), "--missing", str(tmp_path / "nope.pt")], capture_output=True,
                       text=True, env=env)
    status, name, null, message = r.stdout.rstrip("\n").split("\t", 3)
    assert (status, name, null) == ("2", "not_found", "true") and "nope.pt" in message
