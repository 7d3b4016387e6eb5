"""Loading into GPU memory through the CLI, on any machine.

Where no CUDA device is usable (CI, this project's build machines) every device load is
`unsupported` (exit 6) with one error line naming the device and what is missing: no runtime
library at all, or a real CUDA runtime (the one torch's wheels ship, found in the peer venv)
that finds no device. Malformed devices are invalid arguments (exit 8). Where a device is usable
(the lent GPU machine), the device bytes equal the host load's for torch and safetensors files
written by torch (tests/gpu/run.sh measures the speed there).
"""

import glob
import os
import sys

import pytest
import torch

from conftest import one_error_line

UNSUPPORTED, INVALID = 6, 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("device")
    g = torch.Generator().manual_seed(7)
    sd = {f"layer{i}.weight": torch.randn(64, 33 + i, generator=g) for i in range(12)}
    sd["layer0.bias"] = torch.arange(10, dtype=torch.int64)
    sd["tied"] = sd["layer1.weight"]  # one storage, two names
    sd["half"] = torch.randn(5, 7, generator=g).half()
    pt = str(d / "m.pt")
    torch.save(sd, pt)
    st = None
    try:
        from safetensors.torch import save_file
        st = str(d / "m.safetensors")
        save_file({k: v.clone() for k, v in sd.items()}, st)
    except ImportError:
        pass
    return pt, st


def usable(ckpt, files):
    r = ckpt.run("load", files[0], "--device", "cuda:0")
    return r.returncode == 0


def torch_cudart():
    """libcudart.so.* from torch's CUDA wheels (nvidia-cuda-runtime), if installed here."""
    for base in sys.path:
        for pat in ("nvidia/cuda_runtime/lib/libcudart.so.*", "nvidia/cu13/lib/libcudart.so.*"):
            found = sorted(glob.glob(os.path.join(base, pat)))
            if found:
                return found[0]
    return None


def test_no_device_is_unsupported_and_says_why(ckpt, files):
    if usable(ckpt, files):
        pytest.skip("a CUDA device is usable here")
    for dev in ("cuda", "cuda:0", "cuda:3"):
        r = ckpt.run("load", files[0], "--device", dev)
        line = one_error_line(r)
        assert r.returncode == UNSUPPORTED, line
        assert ("cuda:" + (dev.split(":")[1] if ":" in dev else "0")) in line, line
        assert "[unsupported]" in line
    r = ckpt.run("bench", files[0], "--device", "cuda:0")
    assert r.returncode == UNSUPPORTED, r.stderr


def test_missing_runtime_is_named(ckpt, files):
    env = dict(os.environ, CKPT_CUDART="/nonexistent/libcudart.so.13")
    import subprocess
    r = subprocess.run([ckpt.path, "load", files[0], "--device", "cuda:0"], capture_output=True,
                       text=True, env=env, timeout=60)
    line = one_error_line(r)
    assert r.returncode == UNSUPPORTED
    assert "no CUDA runtime" in line and "/nonexistent/libcudart.so.13" in line, line


def test_a_real_runtime_without_a_device(ckpt, files):
    lib = torch_cudart()
    if lib is None:
        pytest.skip("torch here ships no CUDA runtime (a CPU build)")
    if usable(ckpt, files):
        pytest.skip("a CUDA device is usable here")
    import subprocess
    env = dict(os.environ, CKPT_CUDART=lib)
    r = subprocess.run([ckpt.path, "load", files[0], "--device", "cuda:0"], capture_output=True,
                       text=True, env=env, timeout=60)
    line = one_error_line(r)
    assert r.returncode == UNSUPPORTED, line
    assert "no CUDA device" in line or "no usable CUDA device" in line or \
        "does not exist" in line, line
    assert "insufficient" not in line, line  # the runtime's words for "no driver here"


@pytest.mark.parametrize("dev,code", [("cuda:x", INVALID), ("cuda:-1", INVALID), ("gpu", INVALID),
                                      ("mps", UNSUPPORTED), ("meta", UNSUPPORTED)])
def test_bad_devices(ckpt, files, dev, code):
    r = ckpt.run("load", files[0], "--device", dev)
    line = one_error_line(r)
    assert r.returncode == code, line


def test_device_loads_are_eager_only(ckpt, files):
    for mode in ("stream", "mmap"):
        r = ckpt.run("load", files[0], "--device", "cuda", "--mode", mode)
        line = one_error_line(r)
        assert r.returncode == INVALID and "eager" in line, line


def test_device_bytes_equal_the_host_load(ckpt, files):
    if not usable(ckpt, files):
        pytest.skip("no usable CUDA device here")
    for f in files:
        if f is None:
            continue
        host = ckpt.json("load", f, "--json", "--digest")
        for extra in ([], ["--verify", "--staging-mb", "2", "--threads", "3"]):
            dev = ckpt.json("load", f, "--json", "--digest", "--device", "cuda:0", *extra)
            assert dev["device"] == "cuda:0"
            assert dev["digests"] == host["digests"], f


def test_gds_needs_a_device_and_falls_back_or_refuses_cleanly(ckpt, files):
    r = ckpt.run("load", files[0], "--gds")
    line = one_error_line(r)
    assert r.returncode == INVALID and "--device" in line, line
    if usable(ckpt, files):
        # A device: the same bytes whether cuFile is there or not (a note says when it is not).
        host = ckpt.json("load", files[1] or files[0], "--json", "--digest")
        dev = ckpt.json("load", files[1] or files[0], "--json", "--digest", "--device", "cuda:0",
                        "--gds")
        assert dev["digests"] == host["digests"]
        return
    r = ckpt.run("load", files[0], "--device", "cuda:0", "--gds")
    line = one_error_line(r)
    assert r.returncode == UNSUPPORTED and "cuda:0" in line, line
