"""Without torch, ckpt loads into numpy arrays (torch blocked in a child process)."""

import subprocess
import sys
import time

import torch

CHILD = r'''
import sys, time
sys.modules["torch"] = None  # "import torch" now raises ImportError
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
import ckpt
print("import_ms", (time.perf_counter() - t0) * 1000)
import numpy as np
sd = ckpt.load(sys.argv[2])
assert type(sd).__name__ == "OrderedDict", type(sd)
assert isinstance(sd["w"], np.ndarray) and sd["w"].dtype == np.float32 and sd["w"].shape == (3, 4)
assert np.array_equal(sd["w"], np.arange(12, dtype=np.float32).reshape(3, 4))
assert np.array_equal(sd["t"], np.arange(12, dtype=np.float32).reshape(3, 4).T)
assert sd["size"] == (3, 4) and type(sd["size"]) is tuple
mm = ckpt.load(sys.argv[2], mmap=True)
assert np.array_equal(mm["w"], sd["w"]) and mm["w"].flags.writeable
with ckpt.safe_open(sys.argv[2], framework="np") as f:
    assert np.array_equal(f.get_slice("w")[1:], sd["w"][1:])
try:
    ckpt.safe_open(sys.argv[2], framework="pt")
except ckpt.InvalidArgumentError:
    pass
else:
    raise AssertionError("framework=pt without torch")
arrs = {"x": np.arange(6, dtype=np.float64).reshape(2, 3).T, "y": np.array([1, 2], dtype=">i4"),
        "z": np.zeros((0, 3), dtype=np.uint8), "b": np.array([True, False])}
out = sys.argv[2] + ".np.safetensors"
ckpt.save_file(arrs, out, metadata={"k": "v"})
back = ckpt.load_file(out)
for k in arrs:
    assert np.array_equal(back[k], arrs[k]) and back[k].shape == arrs[k].shape, k
assert back["y"].dtype == np.int32
ckpt.save(arrs, sys.argv[2] + ".np.tensors")
back = ckpt.load(sys.argv[2] + ".np.tensors")
assert all(np.array_equal(back[k], arrs[k]) for k in arrs)
ckpt.save({"a": arrs["x"]}, sys.argv[2] + ".np.pt")  # as torch.save: numpy's own pickle
back = ckpt.load(sys.argv[2] + ".np.pt")["a"]
assert type(back) is np.ndarray and np.array_equal(back, arrs["x"]) and back.dtype == np.float64
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None and m == "torch"]
print("ok")
'''


def test_numpy_without_torch(tmp_path, built_path):
    import collections
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    p = tmp_path / "n.pt"
    torch.save(collections.OrderedDict(w=w, t=w.t(), size=w.shape), p)
    r = subprocess.run([sys.executable, "-c", CHILD, built_path, str(p)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_import_time(built_path):
    # import ckpt alone: no torch, no numpy at import (target < 50 ms; bound loosely in CI).
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); t = time.perf_counter(); "
            "import ckpt; print((time.perf_counter() - t) * 1000); "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, built_path], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    ms, mods = r.stdout.splitlines()
    assert mods == "False False"
    assert float(ms) < 500
