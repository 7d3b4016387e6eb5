"""GPU checks of device memory handling (tests/gpu/run.sh --memory), with the module built there:
prints one line per check, "ok" or "FAIL", and exits 1 if any failed.

  - "cuda" is torch's current device, and a load leaves the current device as it found it
  - a device load's memory comes from torch's caching allocator and frees tensor by tensor
  - a refused load (absent device) leaves no CUDA error behind: torch's next calls work
  - ckpt.load_into into CUDA tensors: in place (same data_ptr), tied weights kept, equal to
    load_state_dict(torch.load(...)), and no device memory of its own (free memory unchanged)
  - a load whose allocations overlap its reads equals one that makes them first
    (CKPT_DEVICE_OVERLAP=0, in a child process) and the host load
  - torch's allocator failing midway through a load (a per-process memory fraction smaller than
    the file, in a child process): an error, nothing of the load left allocated, and the next
    load works
"""

import os
import subprocess
import sys

import torch

import ckpt

failed = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f" ({detail})" if detail else ""))
    if not cond:
        failed.append(name)


def main(path):
    n = torch.cuda.device_count()
    last = n - 1
    torch.cuda.set_device(last)
    sd = ckpt.load(path, map_location="cuda")
    dev = next(iter(v for v in sd.values() if torch.is_tensor(v))).device
    check("'cuda' is the current device", dev == torch.device("cuda", last), str(dev))
    check("the current device is kept after a load", torch.cuda.current_device() == last)
    ckpt.load(path, map_location="cuda:0")
    check("... and after a load into cuda:0", torch.cuda.current_device() == last)
    torch.cuda.set_device(0)
    del sd

    torch.cuda.synchronize()
    a0 = torch.cuda.memory_allocated(0)
    sd = ckpt.load(path, map_location="cuda:0")
    ts = [v for v in sd.values() if torch.is_tensor(v)]
    total = sum(t.untyped_storage().nbytes() for t in ts)
    a1 = torch.cuda.memory_allocated(0)
    check("a device load's memory comes from torch's caching allocator", a1 - a0 >= total,
          f"{(a1 - a0) / 2**20:.0f} MiB for {total / 2**20:.0f} MiB")
    big = max(ts, key=lambda t: t.untyped_storage().nbytes())
    size = big.untyped_storage().nbytes()
    name = next(k for k, v in sd.items() if v is big)
    del ts, big, sd[name]
    a2 = torch.cuda.memory_allocated(0)
    check("... and frees tensor by tensor", a1 - a2 >= size, f"{(a1 - a2) / 2**20:.0f} MiB freed")
    del sd

    try:
        ckpt.load(path, map_location=f"cuda:{n + 3}")
        check("an absent device is refused", False)
    except ckpt.UnsupportedError:
        pass
    x = torch.ones(1 << 20, device="cuda") * 2
    torch.cuda.synchronize()
    check("torch works after a refused load (no pending CUDA error)", float(x.sum()) == 2 * (1 << 20))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(4096, 4096)
            self.lin = torch.nn.Linear(4096, 4096)
            self.head = torch.nn.Linear(4096, 4096, bias=False)
            self.head.weight = self.lin.weight

    torch.manual_seed(1)
    src = Net()
    pt = "/tmp/ckpt-gpu-load-into.pt"
    torch.save(src.state_dict(), pt)
    m = Net().cuda()
    ckpt.load_into(m, pt)  # warm: the engine's context and pinned staging exist from here on
    torch.manual_seed(2)
    m = Net().cuda()
    ptrs = {k: v.data_ptr() for k, v in m.state_dict().items()}
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    ckpt.load_into(m, pt)
    free1 = torch.cuda.mem_get_info()[0]
    check("load_into keeps every data_ptr", ptrs == {k: v.data_ptr() for k, v in m.state_dict().items()})
    check("load_into keeps tied weights tied", m.head.weight is m.lin.weight)
    ref = Net().cuda()
    ref.load_state_dict(torch.load(pt, map_location="cuda"))
    check("load_into equals load_state_dict(torch.load)",
          all(torch.equal(v, m.state_dict()[k]) for k, v in ref.state_dict().items()))
    check("load_into allocates no device memory", free0 - free1 < (32 << 20),
          f"{(free0 - free1) / 2**20:.0f} MiB")
    overlap_and_failure(path)
    print("FAILED: " + ", ".join(failed) if failed else "all device-memory checks passed")
    return 1 if failed else 0


CHILD = r"""
import os, sys, torch, ckpt
path, mode = sys.argv[1], sys.argv[2]
torch.empty(1, device="cuda")
if mode == "digest":
    sd = ckpt.load(path, map_location="cuda")
    print(sum(int(v.view(torch.int32).sum(dtype=torch.int64)) for v in sd.values()
              if torch.is_tensor(v) and v.element_size() == 4))
    sys.exit(0)
size = os.path.getsize(path)
free, total = torch.cuda.mem_get_info()
torch.cuda.set_per_process_memory_fraction(size / 3 / total)
a0 = torch.cuda.memory_allocated()
try:
    ckpt.load(path, map_location="cuda")
    print("no error")
except Exception as e:
    print(type(e).__name__, str(e).splitlines()[0][:100])
print("left", torch.cuda.memory_allocated() - a0)
torch.cuda.set_per_process_memory_fraction(1.0)
sd = ckpt.load(path, map_location="cuda")
print("after", len(sd))
"""


def overlap_and_failure(path):
    def child(mode, **env):
        r = subprocess.run([sys.executable, "-c", CHILD, path, mode], capture_output=True,
                           text=True, env=dict(os.environ, **env), timeout=120)
        return r.stdout.split("\n"), r.stderr[-300:]
    host = ckpt.load(path)
    want = sum(int(v.view(torch.int32).sum(dtype=torch.int64)) for v in host.values()
               if torch.is_tensor(v) and v.element_size() == 4)
    on, err = child("digest")
    off, err2 = child("digest", CKPT_DEVICE_OVERLAP="0")
    check("an overlapped load equals a serial one and the host's", on[0] == off[0] == str(want),
          f"{on[0]} / {off[0]} / {want} {err or err2}")
    out, err = child("fail")
    check("an allocation failing midway raises", len(out) > 1 and out[0] != "no error",
          out[0] if out else err)
    check("... leaves nothing of the load allocated", "left 0" in out, " ".join(out) or err)
    check("... and the next load works", any(x.startswith("after ") for x in out), err)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
