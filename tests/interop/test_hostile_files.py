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

from helpers import run_measured

MiB = 1 << 20


def measured(ckpt):
    """Whether peak RSS and address-space caps mean anything for this binary: not under ASan,
    whose shadow memory and quarantine count in the RSS (the plain build's run checks them)."""
    return "asan" not in ckpt.path


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
    assert not measured(ckpt) or rss < 400 * MiB, rss
    # The limit is an option: raised, the same file opens (8M empty lists in a list).
    r, rss = run_measured(ckpt, "ls", p, "--max-object-mb", 8192)
    assert r.returncode == 0, r.stderr
    per_object = rss / 8_000_000
    assert not measured(ckpt) or per_object < 210, f"{per_object:.0f} bytes per pickle object"


def test_out_of_memory_names_the_file(ckpt, tmp_path):
    # With the limit lifted, the address-space cap is what stops it: a typed error naming the
    # file, not "std::bad_alloc".
    if not measured(ckpt):
        pytest.skip("no address-space cap under ASan")
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
    assert not measured(ckpt) or rss < 100 * MiB, rss


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
    assert not measured(ckpt) or rss < 100 * MiB, rss


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
    assert not measured(ckpt) or rss < 100 * MiB, \
        f"verify of a deflated {size >> 20} MiB record: {rss >> 20} MiB RSS"
    if "load" not in ckpt.run("--help").stdout:
        return
    r, rss = run_measured(ckpt, "load", p)
    assert r.returncode == 0, r.stderr
    assert not measured(ckpt) or rss < size + 150 * MiB, \
        f"load of a deflated {size >> 20} MiB tensor: {rss >> 20} MiB"


# ----------------------------------------------------------------- FIFOs, ONNX external data

def _onnx_external_model(d, inits, checksum=None):
    """An ONNX model in folder d whose initializers are float32 tensors of external data:
    inits = [(name, dims, location, offset)]. Returns the model's path."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    tensors = []
    for name, dims, location, offset in inits:
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        n = 4
        for x in dims:
            n *= x
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(n))) + \
                ((("checksum", checksum),) if checksum else ()):
            e = t.external_data.add()
            e.key, e.value = k, v
        tensors.append(t)
    g = helper.make_graph([], "g", [], [], initializer=tensors)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    p = os.path.join(d, "m.onnx")
    with open(p, "wb") as f:
        f.write(m.SerializeToString())
    return p


def test_onnx_external_fifo_is_refused_without_blocking(ckpt, tmp_path):
    os.mkfifo(tmp_path / "w.bin")
    p = _onnx_external_model(str(tmp_path), [("w", [4], "w.bin", 0)])
    for cmd in ("load", "verify", "convert"):
        args = [cmd, p] + ([str(tmp_path / "o.safetensors")] if cmd == "convert" else [])
        if cmd == "load" and "load" not in ckpt.run("--help").stdout:
            continue
        r = ckpt.run(*args, timeout=20)  # blocked forever in open() before
        assert r.returncode == 8, (cmd, r.stderr)
        assert "not a regular file" in r.stderr and "FIFO" in r.stderr, r.stderr


def test_fifo_checkpoint_and_shard_are_refused(ckpt, tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    r = ckpt.run("ls", fifo, timeout=20)
    assert r.returncode == 8 and "FIFO" in r.stderr, r.stderr
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"w": "model.safetensors"}}))
    r = ckpt.run("ls", index, timeout=20)
    assert r.returncode == 8 and "FIFO" in r.stderr, r.stderr


def test_onnx_missing_huge_external_file_names_model_and_tensor(ckpt, tmp_path):
    # 1 TiB declared, the file missing (then a directory): no 1 TiB mapping is tried first.
    p = _onnx_external_model(str(tmp_path), [("huge", [1 << 38], "gone.bin", 0)])
    if "load" not in ckpt.run("--help").stdout:
        pytest.skip("no load subcommand")
    r = ckpt.run("load", p)
    assert r.returncode == 2, r.stderr
    assert "mmap" not in r.stderr and "huge" in r.stderr and "m.onnx" in r.stderr, r.stderr
    os.mkdir(tmp_path / "gone.bin")
    r = ckpt.run("load", p)
    assert r.returncode == 8, r.stderr
    assert "mmap" not in r.stderr and "huge" in r.stderr and "directory" in r.stderr, r.stderr


def test_onnx_overlapping_initializers_are_refused_at_open(ckpt, tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(MiB))
    p = _onnx_external_model(str(tmp_path),
                             [(f"w{i}", [MiB // 4], "w.bin", 0) for i in range(200)])
    for cmd in ("ls", "convert"):
        args = [cmd, p] + ([str(tmp_path / "o.safetensors")] if cmd == "convert" else [])
        r = ckpt.run(*args)
        assert r.returncode == 5, (cmd, r.stderr)
        assert "overlaps" in r.stderr, r.stderr
    assert not (tmp_path / "o.safetensors").exists()
    # Disjoint ranges of one file still open.
    (tmp_path / "w2.bin").write_bytes(bytes(2 * MiB))
    os.remove(p)
    p = _onnx_external_model(str(tmp_path), [("a", [MiB // 4], "w2.bin", 0),
                                             ("b", [MiB // 4], "w2.bin", MiB)])
    ckpt.ok("ls", p)


def test_rewrite_refuses_a_bad_checksum(ckpt, tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(4096))
    p = _onnx_external_model(str(tmp_path), [("w", [1024], "w.bin", 0)],
                             checksum="0" * 40)  # SHA-1 of the file is not this
    r = ckpt.run("verify", p)
    assert r.returncode == 5, r.stderr
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    r = ckpt.run("rewrite", p, out)
    assert r.returncode == 5, r.stderr
    assert "fails verification" in r.stderr, r.stderr
    assert not out.exists()


# ----------------------------------------------------------------- control characters

def test_control_characters_are_escaped_in_text_output(ckpt, tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "esc.pt"
    torch.save({"w\x1b[2J\x07": torch.ones(2), "note": "a\x1b]0;title\x07b"}, p)
    for args in (["ls", p], ["info", p], ["show", p]):
        r = ckpt.ok(*args)
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout, (args, r.stdout)
        assert "\\x1b" in r.stdout, (args, r.stdout)
    r = ckpt.run("show", p, "w\x1b[2J\x07.nope")
    assert r.returncode != 0 and "\x1b" not in r.stderr, r.stderr
    # JSON keeps the names exact (its own escaping).
    j = json.loads(ckpt.ok("ls", p, "--json").stdout)
    assert j["tensors"][0]["name"] == "w\x1b[2J\x07"



def test_extract_names_longer_than_a_file_name(ckpt, tmp_path):
    """A tensor name past NAME_MAX (255 bytes) gets a shortened file name (its start and a hash);
    index.json keeps the real name. Two such names with one start get two files."""
    torch = pytest.importorskip("torch")
    long = "layer." * 60
    names = [long + "weight", long + "bias", "short"]
    p = tmp_path / "long.pt"
    torch.save({n: torch.full((2,), float(i)) for i, n in enumerate(names)}, p)
    out = tmp_path / "x"
    ckpt.ok("extract", p, out)
    index = json.loads((out / "index.json").read_text())
    assert [t["name"] for t in index["tensors"]] == names
    files = [t["file"] for t in index["tensors"]]
    assert len(set(files)) == 3 and files[2] == "short.npy", files
    np = pytest.importorskip("numpy")
    for i, f in enumerate(files):
        assert len(f.encode()) <= 255, f
        assert np.load(out / f).tolist() == [float(i)] * 2


# ----------------------------------------------------------------- CLI rough edges

def _zero_storage_crcs(data: bytes) -> bytes:
    """A torch zip with the CRC of every data/ record zeroed (local and central headers), as
    torch writes them with CRCs off, while data.pkl keeps its CRC."""
    z = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            if "/data/" in info.filename:
                z[info.header_offset + 14:info.header_offset + 18] = bytes(4)
    at = 0
    while (at := z.find(b"PK\x01\x02", at)) >= 0:
        n = struct.unpack_from("<H", z, at + 28)[0]
        if b"/data/" in z[at + 46:at + 46 + n]:
            z[at + 16:at + 20] = bytes(4)
        at += 46
    return bytes(z)


def test_verify_of_storages_saved_without_crcs_is_not_verified(ckpt, tmp_path):
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"w": torch.ones(4), "b": torch.zeros(3)}, buf)
    p = tmp_path / "nocrc.pt"
    p.write_bytes(_zero_storage_crcs(buf.getvalue()))
    r = ckpt.run("verify", p)
    assert r.returncode == 10, (r.returncode, r.stdout, r.stderr)
    assert "not verified" in r.stderr and "without checksums" in r.stderr, r.stderr
    assert "OK" not in r.stdout


def test_convert_max_shard_size_creates_missing_folders(ckpt, tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "m.pt"
    torch.save({f"w{i}": torch.ones(1024) for i in range(4)}, p)
    out = tmp_path / "shards" / "deeper" / "model.safetensors"
    ckpt.ok("convert", p, out, "--max-shard-size", "8KB")
    assert any(f.endswith(".safetensors") for f in os.listdir(out.parent))


def test_did_you_mean_for_a_tensor_and_an_option(ckpt, tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "m.pt"
    torch.save({"embed.weight": torch.ones(2), "head.bias": torch.zeros(2)}, p)
    r = ckpt.run("show", p, "embed.weigth")
    assert r.returncode == 2, r.stderr
    assert "did you mean 'embed.weight'" in r.stderr, r.stderr
    r = ckpt.run("convert", p, tmp_path / "o.safetensors", "--max-shard-sise", "1MB")
    assert r.returncode != 0
    assert "did you mean '--max-shard-size'" in r.stderr, r.stderr


def test_code_accepts_source_ranges_over_empty_text(ckpt, tmp_path):
    # torch writes debug ranges such as [0, 1) over an empty source text for a scripted
    # nn.MultiheadAttention; torch.jit.load accepts them, so must code --list/--ranges and
    # rewrite --debug=table.
    torch = pytest.importorskip("torch")
    p = tmp_path / "mha_ts.pt"
    torch.jit.script(torch.nn.MultiheadAttention(8, 2)).save(str(p))
    ckpt.ok("code", p, "--list")
    ckpt.ok("code", p, "--ranges")
    ckpt.ok("rewrite", p, tmp_path / "out.pt", "--debug=table")


def test_bench_columns_align_and_say_no_internal_target(ckpt, tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / ("a_rather_long_checkpoint_name_" * 3 + ".pt")
    torch.save({"w": torch.ones(256, 256)}, p)
    r = ckpt.ok("bench", p, "--repeat", "1", timeout=300)
    assert "target <=" not in r.stdout, r.stdout
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    head = next(i for i, l in enumerate(lines) if l.startswith("measurement"))
    ms_end = lines[head].index(" ms") + 3
    for l in lines[head + 1:]:
        # the figure under "ms" ends where the header's "ms" ends ("0.98x" for the ratio row)
        assert l[ms_end - 1] != " " and (len(l) == ms_end or l[ms_end] in " x"), (l, lines[head])


def test_out_of_memory_while_loading_names_the_file(ckpt, tmp_path):
    # A 1 GiB storage (deflated: a few MiB on disk) loaded under a 512 MiB address-space cap:
    # a typed error naming the file, not "std::bad_alloc", in every load mode that allocates.
    if not measured(ckpt):
        pytest.skip("no address-space cap under ASan (the loads would assert nothing; "
                    "test_deflated_storage_verify_and_load_stream loads a deflated storage)")
    big = b"\0" * (1 << 30)
    import pickle  # noqa: F401  (the pickle below is torch's layout, written by hand)
    pkl = (b"\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02"
           b"((X\x07\x00\x00\x00storageq\x03ctorch\nByteStorage\nq\x04X\x01\x00\x00\x000q\x05"
           b"X\x03\x00\x00\x00cpuq\x06J\x00\x00\x00@tq\x07QK\x00J\x00\x00\x00@\x85q\x08K\x01\x85"
           b"q\x09\x89ccollections\nOrderedDict\nq\x0a)Rq\x0btq\x0cRq\x0ds.")
    p = tmp_path / "big.pt"
    p.write_bytes(deflated_zip({"data.pkl": (pkl, zipfile.ZIP_STORED), "data/0": big,
                                "version": (b"3\n", zipfile.ZIP_STORED)}))
    del big
    assert p.stat().st_size < 16 << 20
    r = ckpt.run("ls", p)
    assert r.returncode == 0, r.stderr
    for mode in ("eager", "stream"):
        r, _ = run_measured(ckpt, "load", p, "--mode", mode, "--budget-mb", 2048,
                            address_space=512 << 20)
        assert r.returncode == 7, (mode, r.stderr)
        assert str(p) in r.stderr and "bad_alloc" not in r.stderr, (mode, r.stderr)
