"""Hostile local files, third round: pickle and inflate amplification, FIFOs, overlapping ONNX
initializers, laundered checksums, control characters (docs/security.md).

Memory is measured as the child's peak RSS (getrusage of a wrapper process that runs only it).
"""

import io
import json
import os
import struct
import subprocess
import sys
import zipfile
import zlib

import pytest

MiB = 1 << 20


def run_measured(ckpt, *args, timeout=120, address_space=None):
    """(CompletedProcess, peak RSS in bytes) of `ckpt args`, run under a wrapper that reports
    its only child's peak RSS; `address_space` caps the child's RLIMIT_AS."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "lim = int(sys.argv[1])\n"
        "def pre():\n"
        "    if lim: resource.setrlimit(resource.RLIMIT_AS, (lim, lim))\n"
        "r = subprocess.run(sys.argv[2:], preexec_fn=pre, capture_output=True)\n"
        "sys.stdout.buffer.write(r.stdout); sys.stderr.buffer.write(r.stderr)\n"
        "sys.stderr.write('\\nRSS_KIB %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(r.returncode)\n")
    asan = "asan" in ckpt.path
    r = subprocess.run([sys.executable, "-c", wrapper, str(0 if asan else (address_space or 0)),
                        ckpt.path, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, errors="replace")
    head, _, tail = r.stderr.rpartition("\nRSS_KIB ")
    r.stderr = head
    return r, int(tail.strip()) * 1024


def deflated_zip(records) -> bytes:
    """A torch-style zip whose records (name -> bytes, or name -> (bytes, method)) are written
    as given; data.pkl and data/ records deflated unless stored is asked for."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in records.items():
            method = zipfile.ZIP_DEFLATED
            if isinstance(data, tuple):
                data, method = data
            z.writestr(zipfile.ZipInfo("archive/" + name), data, compress_type=method)
    return buf.getvalue()


# ----------------------------------------------------------------- pickle / inflate amplification

LIST_BOMB = b"\x80\x02](" + b"]" * 8_000_000 + b"e."


def test_list_bomb_is_refused_in_bounded_memory(ckpt, tmp_path):
    p = tmp_path / "bomb.pt"
    p.write_bytes(deflated_zip({"data.pkl": LIST_BOMB, "version": (b"3\n", zipfile.ZIP_STORED)}))
    assert p.stat().st_size < 64 << 10
    r, rss = run_measured(ckpt, "ls", p, address_space=1 << 30)
    assert r.returncode == 7, r.stderr
    assert str(p) in r.stderr and "data.pkl" in r.stderr, r.stderr
    assert "--max-object-mb" in r.stderr, r.stderr
    assert rss < 400 * MiB, rss
    # The limit is an option: raised, the same file opens (8M empty lists in a list).
    r, rss = run_measured(ckpt, "ls", p, "--max-object-mb", 8192)
    assert r.returncode == 0, r.stderr
    per_object = rss / 8_000_000
    assert per_object < 210, f"{per_object:.0f} bytes per pickle object"  # 343 before


def test_out_of_memory_names_the_file(ckpt, tmp_path):
    # With the limit lifted, the address-space cap is what stops it: a typed error naming the
    # file, not "std::bad_alloc".
    p = tmp_path / "bomb.pt"
    p.write_bytes(deflated_zip({"data.pkl": LIST_BOMB, "version": (b"3\n", zipfile.ZIP_STORED)}))
    r, _ = run_measured(ckpt, "ls", p, "--max-object-mb", 1 << 20, address_space=512 << 20)
    assert r.returncode == 7, r.stderr
    assert str(p) in r.stderr and "bad_alloc" not in r.stderr, r.stderr


def test_garbage_data_pkl_is_refused_before_it_is_inflated(ckpt, tmp_path):
    # 200 MiB of zeros deflated to ~200 KB: the first byte (0x00) is no opcode.
    p = tmp_path / "garbage.pt"
    p.write_bytes(deflated_zip({"data.pkl": bytes(200 * MiB),
                                "version": (b"3\n", zipfile.ZIP_STORED)}))
    r, rss = run_measured(ckpt, "ls", p)
    assert r.returncode == 5, r.stderr
    assert "not a pickle" in r.stderr and "data.pkl" in r.stderr, r.stderr
    assert rss < 100 * MiB, rss


def test_inflated_data_pkl_bounded_by_file_size(ckpt, tmp_path):
    # 1 GiB of pickle from a ~1 MB file: more than the file's object budget, refused unread.
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = b"\x80\x02" + b"N" * ((1 << 30) - 4) + b"0."
    raw = comp.compress(body) + comp.flush()
    crc = zlib.crc32(body)
    del body
    p = tmp_path / "inflate.pt"
    p.write_bytes(_zip_with_raw("archive/data.pkl", raw, 1 << 30, crc))
    assert p.stat().st_size < 2 << 20
    r, rss = run_measured(ckpt, "ls", p)
    assert r.returncode == 7, r.stderr
    assert "data.pkl inflates to" in r.stderr and "--max-object-mb" in r.stderr, r.stderr
    assert rss < 100 * MiB, rss


def _zip_with_raw(name, raw, size, crc, extra_records=()):
    """A zip holding `name` as the given raw deflate stream (declared size and CRC), then
    `extra_records` (name, bytes) stored."""
    out = io.BytesIO()
    central = []

    def add(n, data, comp_size, usize, c, method):
        off = out.tell()
        nb = n.encode()
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, c, comp_size,
                              usize, len(nb), 0) + nb)
        out.write(data)
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0,
                                   c, comp_size, usize, len(nb), 0, 0, 0, 0, 0, off) + nb)

    add(name, raw, len(raw), size, crc, 8)
    for n, data in extra_records:
        add(n, data, len(data), len(data), zlib.crc32(data), 0)
    cd = out.tell()
    for c in central:
        out.write(c)
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central),
                          out.tell() - cd, cd, 0))
    return out.getvalue()


def _big_deflated_storage(tmp_path, nbytes):
    """A torch zip with one float32 tensor of nbytes zeros whose data/0 record is deflated."""
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"t": torch.zeros(4)}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        pkl = z.read("archive/data.pkl")
    n = nbytes // 4
    pkl = pkl.replace(b"K\x04tq", b"J" + struct.pack("<i", n) + b"tq", 1)
    pkl = pkl.replace(b"K\x04\x85", b"J" + struct.pack("<i", n) + b"\x85", 1)
    comp = zlib.compressobj(1, zlib.DEFLATED, -15)
    zero = bytes(16 * MiB)
    parts, crc = [], 0
    for _ in range(nbytes // len(zero)):
        parts.append(comp.compress(zero))
        crc = zlib.crc32(zero, crc)
    parts.append(comp.flush())
    raw = b"".join(parts)
    # data/0 first (the helper writes it first), then data.pkl and version stored.
    data = _zip_with_raw("archive/data/0", raw, nbytes, crc,
                         [("archive/data.pkl", pkl), ("archive/version", b"3\n")])
    p = tmp_path / "deflated_storage.pt"
    p.write_bytes(data)
    return p


def test_deflated_storage_verify_and_load_stream(ckpt, tmp_path):
    size = 512 * MiB
    p = _big_deflated_storage(tmp_path, size)
    r, rss = run_measured(ckpt, "verify", p)
    assert r.returncode == 0, r.stderr
    assert rss < 100 * MiB, f"verify of a deflated {size >> 20} MiB record: {rss >> 20} MiB RSS"
    if "load" not in ckpt.run("--help").stdout:
        return
    r, rss = run_measured(ckpt, "load", p)
    assert r.returncode == 0, r.stderr
    assert rss < size + 150 * MiB, f"load of a deflated {size >> 20} MiB tensor: {rss >> 20} MiB"
