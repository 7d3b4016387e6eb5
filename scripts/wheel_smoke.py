"""Uses an installed ckpt wheel the way a user does (scripts/check-wheels.sh runs it in a venv
made for it, on the host or in a Debian chroot that has none of ckpt's libraries).

Usage: python wheel_smoke.py WORK URL OUT [torch|numpy]
  WORK: a folder made outside (scripts/check-wheels.sh): file.pt (torch.save'd by torch 2.x),
        expected.json (its entries: tensors as dtype, shape and values), cert.pem (the CA of the
        https server); read only.
  URL:  https://... of the same file.pt, served with cert.pem.
  OUT:  a writable folder.
  torch|numpy: what the venv must give (torch must import, or must not); unchecked without it.
Checks: torch, when it imports, is imported first (so the extension, with its own copy of
libstdc++, loads into a process that holds torch's libraries); the module, its extension and the
libraries they load come from the venv's site-packages (libcurl from the wheel's ckpt_io.libs/);
ckpt.load == what torch.save wrote (torch tensors when torch imports, else numpy arrays); a
truncated copy raises a ckpt.Error naming it (a C++ exception thrown and translated inside
the extension); ckpt.save of those tensors as safetensors (with
digests), read back by ckpt.load and by parsing the file here; `ckpt verify` passes on it and
fails on a copy with one byte changed; `ckpt ls URL` over TLS with --ca-bundle, and refused
without it; ckpt.load(URL) with CURL_CA_BUNDLE; `ckpt --version`.
"""
import json
import os
import struct
import subprocess
import sys
import sysconfig

work, url, out = sys.argv[1:4]
expect = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
site = os.path.realpath(sysconfig.get_path("platlib"))
try:
    import torch
except ImportError:
    torch = None
assert expect is None or expect == ("torch" if torch else "numpy"), (expect, torch)
import ckpt  # noqa: E402

for mod in (ckpt, ckpt._ckpt):
    assert os.path.realpath(mod.__file__).startswith(site), (mod.__file__, site)
import numpy as np  # noqa: E402

exe = os.path.join(os.path.dirname(sys.executable), "ckpt")
expected = json.load(open(os.path.join(work, "expected.json")))


def as_numpy(t):
    return t.numpy() if torch is not None else t


def check_tree(got, what):
    assert list(got) == list(expected), (what, list(got), list(expected))
    for k, e in expected.items():
        v = got[k]
        if isinstance(e, dict):
            a = as_numpy(v)
            assert str(a.dtype) == e["dtype"] and list(a.shape) == e["shape"], (what, k, a.dtype)
            assert a.ravel().tolist() == e["values"], (what, k)
        else:
            assert v == e, (what, k, v, e)


sd = ckpt.load(os.path.join(work, "file.pt"))
check_tree(sd, "ckpt.load")
kind = type(sd["w"]).__module__.split(".")[0]
assert kind == ("torch" if torch is not None else "numpy"), kind
print(f"  ckpt {ckpt.__version__}, Python {sys.version.split()[0]}, "
      f"{'torch ' + torch.__version__ if torch else 'numpy ' + np.__version__}: "
      f"ckpt.load == torch.save's {len(expected)} entries ({kind} tensors)")

# --- a C++ exception (ckpt::Error) thrown and translated inside the extension --------------
data = open(os.path.join(work, "file.pt"), "rb").read()
cut = os.path.join(out, "cut.pt")
with open(cut, "wb") as f:
    f.write(data[:len(data) // 2])
try:
    ckpt.load(cut)
    raise AssertionError("ckpt.load of a truncated file returned")
except ckpt.Error as e:
    assert "cut.pt" in str(e), str(e)
    print(f"  a truncated copy: {type(e).__name__}: {str(e).splitlines()[0][:90]}")

# --- safetensors: saved by ckpt.save, read back two ways, verified by the CLI --------------
tensors = {k: v for k, v in sd.items() if isinstance(expected[k], dict)}
st = os.path.join(out, "out.safetensors")
ckpt.save(tensors, st, store_digests=True)
back = ckpt.load(st)
for k, v in tensors.items():
    assert np.array_equal(as_numpy(back[k]), as_numpy(v)), k
raw = open(st, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
codes = {"F32": "float32", "I64": "int64", "F16": "float16", "BOOL": "bool", "U8": "uint8"}
for k, e in ((k, expected[k]) for k in tensors):
    h = header[k]
    begin, end = h["data_offsets"]
    a = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=codes[h["dtype"]])
    assert codes[h["dtype"]] == e["dtype"] and h["shape"] == e["shape"], k
    assert a.tolist() == e["values"], k
subprocess.run([exe, "verify", st], check=True, stdout=subprocess.DEVNULL)
bad = os.path.join(out, "bad.safetensors")
with open(bad, "wb") as f:
    f.write(raw[:-1] + bytes([raw[-1] ^ 1]))
r = subprocess.run([exe, "verify", bad], capture_output=True, text=True)
assert r.returncode != 0, "ckpt verify passed a changed file"
print(f"  ckpt.save -> safetensors ({len(tensors)} tensors, digests) == ckpt.load == the raw "
      f"file; ckpt verify: OK, and exit {r.returncode} on one changed byte")

# --- https through the bundled libcurl and its TLS stack ------------------------------------
cert = os.path.join(work, "cert.pem")
env = {k: v for k, v in os.environ.items()
       if k not in ("AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")}
r = subprocess.run([exe, "ls", url, "--ca-bundle", cert], capture_output=True, text=True,
                   env=env)
assert r.returncode == 0, r.stderr
for k in tensors:
    assert k in r.stdout, (k, r.stdout)
refused = subprocess.run([exe, "ls", url], capture_output=True, text=True, env=env)
assert refused.returncode != 0, "an unknown CA was accepted"
for k in ("AWS_CA_BUNDLE", "SSL_CERT_FILE"):  # AWS_CA_BUNDLE would come first
    os.environ.pop(k, None)
os.environ["CURL_CA_BUNDLE"] = cert
check_tree(ckpt.load(url), "ckpt.load(URL)")
maps = open("/proc/self/maps").read().split("\n")
curl = {line.split()[-1] for line in maps if "libcurl" in line}
assert curl and all(os.path.realpath(p).startswith(os.path.join(site, "ckpt_io.libs"))
                    for p in curl), curl
ldd = subprocess.run(["ldd", os.path.join(site, "ckpt", "_bin", "ckpt")], capture_output=True,
                     text=True, check=True).stdout
assert "not found" not in ldd, ldd
for lib in ("libcurl", "libdeflate", "libisal", "libsodium", "libssl", "libcrypto"):
    lines = [line for line in ldd.split("\n") if lib in line]
    assert lines and all("ckpt_io.libs/" in line for line in lines), (lib, ldd)
print(f"  https: ckpt ls with --ca-bundle OK, exit {refused.returncode} without it "
      f"(\"{refused.stderr.strip().splitlines()[-1][:70]}\"); ckpt.load(URL) equal; libcurl "
      f"from {os.path.relpath(sorted(curl)[0], site)} (the module and the program alike)")
version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
assert version.stdout.startswith(f"ckpt {ckpt.__version__}"), version.stdout
print("  " + version.stdout.split("\n")[0])
