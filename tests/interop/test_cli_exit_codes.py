"""Exit statuses that match their names (issue 16, point 5), through the ckpt CLI.

A file that ends before what its own headers promise is truncated (exit 4), wherever it is cut:
one real file per format (torch 1.13's zip, legacy and TorchScript writers; a safetensors file
laid out by hand here; the tensorizer 2.11.1 fixture), cut every 2 % of its size and at each
structural boundary (inside a header, right after it, inside the data, one byte short), read
by `ls`, `verify` and `load` (mapped and with --no-mmap). Opening checks that every record and
tensor lies within the file, so even `ls`, which reads no data, sees a cut in the data. An
empty file is truncated for every command that opens one. Bytes that are damaged rather than
missing stay corrupt (exit 5).

Not a cut: tensorizer's closing u64 zero (after the last tensor, where the next header size
would be) is declared by no header and needed by no reader, so a file without it still reads
(tests/interop/test_formats.py, test_fixture_truncated).
"""

import collections
import json
import os
import struct
import subprocess
import sys

import pytest

import helpers
from conftest import one_error_line

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TZ_FIXTURE = next((os.path.abspath(os.path.join(d, "v1_numpy_dtypes.tensors"))
                   for d in (os.path.join(REPO, "..", "shared", "fixtures", "tensorizer"),
                             os.path.join(REPO, "shared", "fixtures", "tensorizer"),
                             "/work/shared/fixtures/tensorizer")
                   if os.path.isfile(os.path.join(d, "v1_numpy_dtypes.tensors"))), None)

TRUNCATED, CORRUPT = 4, 5
SCRIPT_CHILD = """
import sys, torch
m = torch.nn.Sequential(torch.nn.Linear(40, 48), torch.nn.ReLU(), torch.nn.Linear(48, 8))
torch.jit.save(torch.jit.script(m), sys.argv[1])
"""


# ---------------------------------------------------------------------------
# one file per format, and the structural boundaries of each


def _state_dict():
    import torch
    torch.manual_seed(16)
    sd = collections.OrderedDict()
    for i in range(3):
        sd[f"layers.{i}.weight"] = torch.randn(48, 40)
        sd[f"layers.{i}.bias"] = torch.randn(48)
    sd["steps"] = torch.tensor(7)
    sd["mask"] = torch.rand(33) > 0.5
    return sd


def _write_safetensors(path, sd):
    """The safetensors layout (u64 header size, JSON header, data buffer), written by hand."""
    codes = {"float32": "F32", "int64": "I64", "bool": "BOOL"}
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in sd.items():
        raw = helpers.tensor_bytes(t)
        header[name] = {"dtype": codes[helpers.dtype_name(t)], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return 8 + len(text)


def _zip_boundaries(path):
    size = os.path.getsize(path)
    out = set()
    for r in helpers.zip_records(path):
        h, d = r.header_offset, r.data_offset
        out |= {h, h + 1, h + 29, h + 30, h + 31, d - 1, d, d + 1, d + r.size // 2, d + r.size,
                d + r.size + 1}
    with open(path, "rb") as f:
        data = f.read()
    cd = data.find(b"PK\x01\x02")
    eocd = data.rfind(b"PK\x05\x06")
    out |= {cd, cd + 1, cd + 46, (cd + eocd) // 2, eocd - 1, eocd, eocd + 1, eocd + 21}
    z64 = data.rfind(b"PK\x06\x06")
    if z64 >= 0:
        out |= {z64, z64 + 1, z64 + 56}
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory, ckpt):
    """{kind: (path, structural cut points)}."""
    torch = pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("exit_codes")
    sd = _state_dict()
    out = {}

    p = tmp / "zip.pt"
    torch.save(sd, p)
    out["torch_zip"] = (p, _zip_boundaries(p))

    p = tmp / "legacy.pt"
    torch.save(sd, p, _use_new_zipfile_serialization=False)
    cuts = {1, 2, 3, 4, 13, 14, 15, 30, 100, 200}
    for t in ckpt.json("ls", p, "--json")["tensors"]:
        o = t["offset"] - t["storage_offset"] * helpers.ELEMENT_SIZE[t["dtype"]]
        cuts |= {o - 8, o - 4, o, o + 1, o + t["nbytes"] // 2}  # element count, then bytes
    out["torch_legacy"] = (p, cuts)

    # Scripted in a child process: scripting here would compile torch.nn classes into the
    # session's global compilation unit and mangle the names other tests expect.
    p = tmp / "scripted.pt"
    subprocess.run([sys.executable, "-c", SCRIPT_CHILD, str(p)], check=True, timeout=300)
    out["torchscript"] = (p, _zip_boundaries(p))

    p = tmp / "st.safetensors"
    data_start = _write_safetensors(p, sd)
    cuts = {1, 4, 7, 8, 9, 10, data_start // 2, data_start - 1, data_start, data_start + 1}
    for t in ckpt.json("ls", p, "--json")["tensors"]:
        cuts |= {t["offset"], t["offset"] + 1, t["offset"] + t["nbytes"] - 1}
    out["safetensors"] = (p, cuts)

    if TZ_FIXTURE:
        size = os.path.getsize(TZ_FIXTURE)
        # prologue (73 bytes: magic, version, flags, sizes, count, index length), the index,
        # each tensor's header and data
        cuts = {1, 4, 5, 6, 9, 40, 41, 57, 65, 72, 73, 74, 1000}
        tensors = ckpt.json("ls", TZ_FIXTURE, "--json")["tensors"]
        for t in tensors:
            if t.get("offset") is not None:
                cuts |= {t["offset"] - 20, t["offset"] - 1, t["offset"], t["offset"] + 1,
                         t["offset"] + t["nbytes"] // 2, t["offset"] + t["nbytes"] - 1}
        cuts.add(size - 9)  # the last data byte (the closing u64 zero follows)
        out["tensorizer"] = (TZ_FIXTURE, cuts)
    return out


def _cut_points(path, structural):
    size = os.path.getsize(path)
    every = {size * k // 50 for k in range(1, 50)}  # every 2 %
    last = size - 9 if str(path).endswith(".tensors") else size - 1  # one byte short
    return sorted(c for c in every | structural | {1, last} if 0 < c <= last)


KINDS = ["torch_zip", "torch_legacy", "torchscript", "safetensors", "tensorizer"]


def _check_truncated(r, what, path):
    line = one_error_line(r)
    assert r.returncode == TRUNCATED, f"{what}: exit {r.returncode}, want {TRUNCATED}: {line}"
    assert line.startswith("ckpt: error: ") and "[truncated]" in line, f"{what}: {line}"
    assert str(path) in line, f"{what}: the error does not name the file: {line}"
    return line


@pytest.mark.parametrize("kind", KINDS)
def test_cut_anywhere_is_truncated(ckpt, files, kind, tmp_path):
    if kind not in files:
        pytest.skip("tensorizer 2.11.1 fixtures not found")
    src, structural = files[kind]
    data = open(src, "rb").read()
    cut = tmp_path / ("cut" + os.path.splitext(str(src))[1])
    cuts = _cut_points(src, structural)
    assert len(cuts) > 60
    for n in cuts:
        cut.write_bytes(data[:n])
        for args in (["ls"], ["ls", "--no-mmap"], ["verify"], ["load"], ["load", "--no-mmap",
                                                                          "--mode", "eager"]):
            r = ckpt.run(args[0], cut, *args[1:])
            _check_truncated(r, f"{kind} cut at {n} of {len(data)}: {' '.join(args)}", cut)


def test_truncated_errors_say_where(ckpt, files, tmp_path):
    """The line names the record or tensor the file ends in, and a byte offset."""
    cases = [("torch_zip", lambda recs: [r for r in recs if r.short == "data/1"][0]),
             ("torchscript", lambda recs: [r for r in recs if r.short.startswith("data/")][0])]
    for kind, pick in cases:
        src = files[kind][0]
        rec = pick(helpers.zip_records(src))
        cut = tmp_path / f"{kind}.pt"
        cut.write_bytes(open(src, "rb").read()[:rec.data_offset + rec.size // 2])
        for extra in ([], ["--no-mmap"]):
            line = _check_truncated(ckpt.run("ls", cut, *extra), kind, cut)
            assert rec.name in line and "at byte" in line, line
    src = files["safetensors"][0]
    t = ckpt.json("ls", src, "--json")["tensors"][2]
    cut = tmp_path / "st.safetensors"
    cut.write_bytes(open(src, "rb").read()[:t["offset"] + 3])
    line = _check_truncated(ckpt.run("ls", cut), "safetensors", cut)
    assert f": {t['name']}: at byte {t['offset']}:" in line, line


EMPTY_COMMANDS = [["ls"], ["info"], ["show"], ["verify"], ["load"], ["load", "--mode", "stream"],
                  ["code"], ["extract", "{tmp}/x"], ["convert", "{tmp}/o.safetensors"]]


@pytest.mark.parametrize("args", EMPTY_COMMANDS, ids=lambda a: "-".join(a).replace("{tmp}/", ""))
@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "pread"])
def test_empty_file_is_truncated(ckpt, tmp_path, args, mmap):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    rest = [a.replace("{tmp}", str(tmp_path)) for a in args[1:]]
    r = ckpt.run(args[0], empty, *rest, *([] if mmap else ["--no-mmap"]))
    line = _check_truncated(r, " ".join(args), empty)
    assert "empty file" in line, line
    assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_tiny_prefixes_are_truncated(ckpt, files, n, tmp_path):
    """Fewer bytes than any header: a prefix of a format's magic or header size is a cut."""
    for kind in ("torch_zip", "torch_legacy", "safetensors", "tensorizer"):
        if kind not in files:
            continue
        cut = tmp_path / f"{kind}.bin"
        cut.write_bytes(open(files[kind][0], "rb").read()[:n])
        for extra in ([], ["--no-mmap"]):
            _check_truncated(ckpt.run("ls", cut, *extra), f"{kind} first {n} bytes", cut)


def test_unknown_format_is_not_truncated(ckpt, tmp_path):
    p = tmp_path / "notes.txt"
    p.write_bytes(b"These are not the weights you are looking for.\n" * 4)
    r = ckpt.run("ls", p)
    line = one_error_line(r)
    assert r.returncode == 6 and "unknown format" in line, line


def _flip(path, offset):
    b = bytearray(open(path, "rb").read())
    b[offset] ^= 0x40
    path.write_bytes(bytes(b))


def test_damaged_bytes_stay_corrupt(ckpt, files, tmp_path):
    """Every byte there, some of them wrong: corrupt (5), never truncated."""
    def copy(kind, name):
        p = tmp_path / name
        p.write_bytes(open(files[kind][0], "rb").read())
        return p

    cases = []
    # torch zip: a data byte (verify's CRC), and the end record's signature (no end record, but
    # the central directory is whole, so the file was not cut).
    p = copy("torch_zip", "data.pt")
    rec = [r for r in helpers.zip_records(p) if r.short == "data/0"][0]
    _flip(p, rec.data_offset + 5)
    cases.append((["verify", p], rec.name))
    for kind in ("torch_zip", "torchscript"):
        p = copy(kind, f"eocd_{kind}.pt")
        _flip(p, open(p, "rb").read().rfind(b"PK\x05\x06"))
        cases += [(["ls", p], "end-of-central-directory"), (["ls", p, "--no-mmap"], None)]
    # torch zip: a damaged name in data.pkl's local header (checked when data.pkl is read)
    p = copy("torch_zip", "local.pt")
    _flip(p, helpers.zip_records(p)[0].header_offset + 30)
    cases.append((["ls", p], "local header"))
    # legacy: a byte of the magic number
    p = copy("torch_legacy", "magic.pt")
    _flip(p, 6)
    cases.append((["ls", p], "magic"))
    # safetensors: bytes after the last tensor (the data buffer is longer than its tensors)
    p = copy("safetensors", "long.safetensors")
    with open(p, "ab") as f:
        f.write(b"\0" * 16)
    cases.append((["ls", p], None))
    # tensorizer: a data byte (its hashes)
    if "tensorizer" in files:
        p = copy("tensorizer", "flip.tensors")
        big = [t for t in ckpt.json("ls", p, "--json")["tensors"] if t["name"] == "big"][0]
        _flip(p, big["offset"] + 100)
        cases.append((["verify", p], "big"))
    for args, needle in cases:
        r = ckpt.run(*args)
        line = one_error_line(r)
        assert r.returncode == CORRUPT and "[corrupt]" in line, f"{args}: {line}"
        if needle:
            assert needle in line, f"{args}: {line}"
