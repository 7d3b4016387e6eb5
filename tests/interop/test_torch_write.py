"""Files ckpt writes load in torch 1.13, equal to what was converted.

Checks: `ckpt convert` round trips (structure, types, values bit-exact,
sharing, _metadata; weights_only where torch 1.13 can), data.pkl byte identity
with torch.save for plain state dicts, record order and contents, alignment,
CRCs (`ckpt verify` and Python's zipfile), clean failures on truncated input,
determinism.
"""

import io
import re
import shutil
import time
import zipfile

import pytest
import torch

import helpers
from conftest import ALL_IDS, BYTE_IDENTITY_IDS, LEGACY_IDS, ZIP_IDS, one_error_line

OPTIONAL_HEAD = [".format_version", ".storage_alignment", "byteorder"]
VERSION_TAILS = [["version"], [".data/version"], ["version", ".data/serialization_id"],
                 [".data/version", ".data/serialization_id"]]


def _weights_only(path):
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises several types here
        return e


@pytest.mark.parametrize("file_id", ALL_IDS)
def test_convert_roundtrip(cache, file_id):
    src = cache.path(file_id)
    out = cache.converted(file_id)
    assert helpers.is_zip(out), "convert must write a torch.save zip"
    a, b = cache.load(src), helpers.torch_load(out, like=src)
    diffs = helpers.compare(a, b)
    assert not diffs, "torch.load(converted) differs:\n" + "\n".join(diffs[:30])


@pytest.mark.parametrize("file_id", ALL_IDS)
def test_convert_roundtrip_weights_only(cache, file_id):
    """Where torch 1.13's weights-only unpickler takes the original, it takes ckpt's file too.

    (1.13's weights-only unpickler has no BINFLOAT opcode and no _rebuild_qtensor, so
    files holding Python floats or quantized tensors are skipped here.)"""
    src = cache.path(file_id)
    a = _weights_only(src)
    if isinstance(a, Exception):
        pytest.skip(f"torch 1.13 weights_only cannot load the original either: {str(a)[-120:]}")
    b = _weights_only(cache.converted(file_id))
    assert not isinstance(b, Exception), f"weights_only load of ckpt's file failed: {b}"
    diffs = helpers.compare(a, b)
    assert not diffs, "\n".join(diffs[:30])


def check_records(path, alignment):
    """Assert the modern torch.save record layout:
    data.pkl, [.format_version, .storage_alignment, byteorder], data/0..N-1 in
    pickle order, version | .data/version, [.data/serialization_id]."""
    recs = helpers.zip_records(path)
    folders = {r.name.split("/", 1)[0] for r in recs}
    assert all("/" in r.name for r in recs) and len(folders) == 1, f"records not under one folder: {[r.name for r in recs]}"
    names = [r.short for r in recs]
    assert len(names) == len(set(names)), f"duplicate records: {names}"
    assert names[0] == "data.pkl", names
    i = 1
    while i < len(names) and names[i] in OPTIONAL_HEAD:
        i += 1
    head = names[1:i]
    assert head == [n for n in OPTIONAL_HEAD if n in head], f"header records out of order: {head}"

    _, keys = helpers.scan_pickle(helpers.zip_read(path, "data.pkl"))
    assert keys == [str(k) for k in range(len(keys))], f"storage keys not 0..N-1 in pickle order: {keys}"
    data = names[i:i + len(keys)]
    want = [f"data/{k}" for k in keys]
    if data != want:
        at = next((j for j, (x, y) in enumerate(zip(data, want)) if x != y), min(len(data), len(want)))
        pytest.fail(f"data records not in pickle order: record #{at} is {data[at:at + 3]}, want {want[at:at + 3]} "
                    f"({len(data)} data records, {len(want)} storages)")
    tail = names[i + len(keys):]
    assert tail in VERSION_TAILS, f"unexpected trailing records {tail}"

    contents = {r.short: helpers.zip_read(path, r.short) for r in recs if not r.short.startswith("data")}
    if ".format_version" in contents:
        assert contents[".format_version"] == b"1"
    if ".storage_alignment" in contents:
        assert contents[".storage_alignment"] == str(alignment).encode()
    if "byteorder" in contents:
        assert contents["byteorder"] == b"little"
    version = contents.get("version", contents.get(".data/version"))
    assert re.fullmatch(rb"\d+\n?", version) and 1 <= int(version) <= 10, f"version record {version!r}"

    # Every data record is stored (mmap-able), aligned, and as long as its storage.
    refs = _storage_refs(path)
    for r in recs:
        if r.short.startswith("data/"):
            assert r.compress_type == zipfile.ZIP_STORED, f"{r.short} is compressed"
            assert r.data_offset % alignment == 0, f"{r.short} payload at {r.data_offset}, not {alignment}-aligned"
            ref = refs[r.short[5:]]
            esize = helpers.ELEMENT_SIZE[helpers._STORAGE_DTYPE[ref.type_name]]
            assert r.size == ref.numel * esize, f"{r.short}: {r.size} bytes, storage says {ref.numel} x {esize}"
    return recs


def _storage_refs(path):
    """{storage key: StorageRef} from the file's data.pkl."""
    u = helpers.ScanUnpickler(io.BytesIO(helpers.zip_read(path, "data.pkl")))
    u.load()
    return dict(u.storages)


@pytest.mark.parametrize("file_id", ALL_IDS)
def test_converted_records(cache, file_id):
    out = cache.converted(file_id)
    check_records(out, alignment=64)
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None, "a record's CRC32 does not match (Python zipfile)"


def test_torch_113_record_list(corpus_files):
    """Documents what torch 1.13 itself writes (not a ckpt check): no .format_version,
    .storage_alignment, byteorder or .data/serialization_id, and data/N in *string*
    order of the keys (data/10 before data/2), not pickle order as newer torch does."""
    if not torch.__version__.startswith("1.13"):
        pytest.skip(f"characterizes torch 1.13, this is {torch.__version__}")
    recs = [r.short for r in helpers.zip_records(corpus_files["files"]["plain_sd"])]
    assert recs == ["data.pkl", "data/0", "data/1", "data/2", "data/3", "version"]


@pytest.mark.parametrize("file_id", BYTE_IDENTITY_IDS)
def test_byte_identity(cache, file_id):
    """For plain state dicts ckpt pickles exactly what torch.save pickles."""
    src, out = cache.path(file_id), cache.converted(file_id)
    want, got = helpers.zip_read(src, "data.pkl"), helpers.zip_read(out, "data.pkl")
    if want != got:
        at = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
        pytest.fail(f"data.pkl differs at byte {at} (torch {len(want)} bytes, ckpt {len(got)}): "
                    f"torch {want[max(0, at - 24):at + 24]!r} vs ckpt {got[max(0, at - 24):at + 24]!r}")
    for r in helpers.zip_records(src):
        if r.short.startswith("data/"):
            assert helpers.zip_read(out, r.short) == helpers.zip_read(src, r.short), r.short


@pytest.mark.parametrize("file_id", ["big", "views", "tied", "module_sd", "many_keys", "adam.legacy"])
def test_convert_align_4096(ckpt, cache, file_id, tmp_path):
    out = tmp_path / "aligned.pt"
    ckpt.ok("convert", cache.path(file_id), out, "--align", 4096)
    check_records(str(out), alignment=4096)
    diffs = helpers.compare(cache.load(cache.path(file_id)), helpers.torch_load(out, like=cache.path(file_id)))
    assert not diffs, "\n".join(diffs[:30])
    for e in ckpt.json("ls", out, "--json")["tensors"]:
        if e["storage_offset"] == 0 and e["nbytes"] > 0:
            assert e["offset"] % 4096 == 0, f"{e['name']}: offset {e['offset']}"


@pytest.mark.parametrize("file_id", ZIP_IDS)
def test_verify_torch_file(ckpt, cache, file_id):
    ckpt.ok("verify", cache.path(file_id))


# A file whose format stores no checksums (pre-1.6 legacy torch files written by torch itself,
# safetensors) is never reported OK: verify says nothing was checked and exits 10.
@pytest.mark.parametrize("file_id", [i for i in LEGACY_IDS if i.split(".")[0] in
                                     ("dtype_float32", "tied", "module_sd", "adam")])
def test_verify_refuses_to_pass_what_it_cannot_check(ckpt, cache, file_id, tmp_path):
    r = ckpt.run("verify", cache.path(file_id))
    assert r.returncode == 10, f"verify exited {r.returncode}; stdout {r.stdout!r}"
    assert r.stdout == ""
    assert "not verified" in r.stderr and "torch-legacy files store no checksums" in r.stderr
    st = tmp_path / "x.safetensors"
    ckpt.ok("convert", cache.path(file_id), st, "--copy-shared")
    r = ckpt.run("verify", st)
    assert r.returncode == 10 and "safetensors files store no checksums" in r.stderr, r.stderr
    # The same bytes as a torch zip carry CRCs, and verify checks them.
    assert ckpt.ok("verify", cache.converted(file_id)).stdout.startswith("OK: ")


@pytest.mark.parametrize("file_id", ALL_IDS)
def test_verify_converted(ckpt, cache, file_id):
    ckpt.ok("verify", cache.converted(file_id))


def _flip_in_record(src, dst):
    """Copy src to dst with one byte flipped inside the largest data/N payload; returns the record."""
    shutil.copyfile(src, dst)
    rec = max((r for r in helpers.zip_records(dst) if r.short.startswith("data/")), key=lambda r: r.size)
    assert rec.size > 0
    with open(dst, "r+b") as f:
        pos = rec.data_offset + rec.size // 2
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x5A]))
    return rec


@pytest.mark.parametrize("origin", ["torch", "ckpt"])
@pytest.mark.parametrize("file_id", ["big", "views", "many_keys", "module_sd"])
def test_verify_detects_flip(ckpt, cache, file_id, origin, tmp_path):
    src = cache.path(file_id) if origin == "torch" else cache.converted(file_id)
    bad = tmp_path / "bad.pt"
    rec = _flip_in_record(src, bad)
    r = ckpt.run("verify", bad)
    assert r.returncode == 5, f"verify exited {r.returncode}, want 5; stderr {r.stderr!r}"
    line = one_error_line(r)
    assert re.search(re.escape(rec.short) + r"(?!\d)", line), f"stderr does not name {rec.name}: {line!r}"


def _cut_points(size):
    return {"empty": 0, "10B": 10, "half": size // 2, "minus1": size - 1}


@pytest.mark.parametrize("cut", ["empty", "10B", "half", "minus1"])
@pytest.mark.parametrize("file_id", ["views", "big", "module_sd", "views.legacy", "big.legacy"])
def test_truncated_input(ckpt, cache, file_id, cut, tmp_path):
    src = cache.path(file_id)
    with open(src, "rb") as f:
        data = f.read()
    bad = tmp_path / "trunc.pt"
    bad.write_bytes(data[:_cut_points(len(data))[cut]])
    commands = [["ls", bad, "--json"], ["extract", bad, tmp_path / "x"], ["convert", bad, tmp_path / "out.pt"],
                ["info", bad, "--json"]]
    if not file_id.endswith(".legacy"):
        commands.append(["verify", bad])
    for args in commands:
        r = ckpt.run(*args)
        one_error_line(r)
    assert not (tmp_path / "out.pt").exists(), "failed convert left its output"


def test_determinism(ckpt, cache, tmp_path):
    """Same input -> same bytes, even seconds apart (zip timestamps, serialization_id)."""
    ids = ["module_sd", "views", "tied", "adam", "values", "big.legacy", "quant_per_channel"]
    for d in ("1", "2"):
        for fid in ids:
            (tmp_path / d).mkdir(exist_ok=True)
            ckpt.ok("convert", cache.path(fid), tmp_path / d / f"{fid.replace('.', '_')}.pt")
        if d == "1":
            time.sleep(2.1)  # DOS timestamps have 2-second resolution
    for fid in ids:
        name = f"{fid.replace('.', '_')}.pt"
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes(), fid
