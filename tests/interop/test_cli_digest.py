"""`ckpt digest`, `ckpt verify --digests`, `ckpt convert --digests` against files torch writes.

A tensor's digest is the SHA-256 of its logical bytes (elements in row-major order, little-endian,
its own dtype): hashlib over torch's `t.contiguous().numpy().tobytes()` (helpers.tensor_bytes),
whatever the file format, strides or storage sharing. The whole-file digest is hashlib's over
the file.
"""

import hashlib
import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch

import helpers

CORRUPT = 5
INVALID_ARGUMENT = 8
NOT_VERIFIED = 10


def sha(b):
    return hashlib.sha256(b).hexdigest()


def file_sha(path):
    with open(path, "rb") as f:
        return sha(f.read())


def training_checkpoint():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 6),
                                torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randint(0, 10, (8,))).pow(2).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        # A value, not a tensor (a numpy scalar would be refused: numpy.core.multiarray.scalar is
        # not an allowed global).
        "best": 0.25,
        "extra": {
            "transposed": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # strided
            "half": torch.linspace(-2, 2, 7).to(torch.bfloat16),
            "mask": torch.tensor([True, False, True]),
            "step": torch.tensor(5, dtype=torch.int64),
            "empty": torch.zeros(0, 3, dtype=torch.float16),
        },
    }


def write_safetensors(path, tensors, metadata=None):
    """A safetensors file written here, without ckpt or the safetensors package."""
    codes = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = helpers.tensor_bytes(t)
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def read_safetensors(path):
    """(header, {name: raw bytes}) parsed here."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    data = {k: raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}
    return header, data


def data_offset(path, name):
    """Absolute offset of tensor `name`'s first byte in a safetensors file."""
    header, _ = read_safetensors(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    return 8 + n + header[name]["data_offsets"][0]


def flip(path, offset, count=4):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(count)
        f.seek(offset)
        f.write(bytes(x ^ 0xA5 for x in b))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("digest")
    obj = training_checkpoint()
    out = {"dir": d, "obj": obj}
    out["pt"] = str(d / "train.pt")
    torch.save(obj, out["pt"])
    out["legacy"] = str(d / "train_legacy.pt")
    torch.save(obj, out["legacy"], _use_new_zipfile_serialization=False)
    out["st_tensors"] = {"embed.weight": torch.randn(10, 4), "proj.bias": torch.randn(6).half(),
                         "ids": torch.arange(5, dtype=torch.int64), "flag": torch.tensor([True])}
    out["st"] = str(d / "plain.safetensors")
    write_safetensors(out["st"], out["st_tensors"], {"format": "pt"})
    return out


def expected_tensors(obj):
    """{name: (dtype, shape, sha256)} for every tensor path torch's object reaches."""
    return {name: (helpers.dtype_name(t), list(t.shape), sha(helpers.tensor_bytes(t)))
            for name, t in helpers.flatten(obj, every_path=True)}


def manifest(ckpt, path, out):
    r = ckpt.ok("digest", path, "-o", out)
    assert f"wrote {out}" in r.stdout
    with open(out) as f:
        return json.load(f)


def check_manifest(m, path, want):
    assert m["ckpt_digest"] == 1 and m["algorithm"] == "sha256"
    assert m["file"] == {"name": os.path.basename(path), "size": os.path.getsize(path),
                         "sha256": file_sha(path)}
    got = {k: (v["dtype"], v["shape"], v["sha256"]) for k, v in m["tensors"].items()}
    assert got == want


@pytest.mark.parametrize("kind", ["pt", "legacy"])
def test_manifest_of_torch_files_matches_hashlib(ckpt, files, tmp_path, kind):
    path = files[kind]
    m = manifest(ckpt, path, str(tmp_path / "m.json"))
    want = expected_tensors(helpers.torch_load(path))
    assert "extra.transposed" in want and "optimizer.state.0.exp_avg" in want
    check_manifest(m, path, want)
    # The digest is of the logical (row-major) elements, not of the strided storage.
    t = files["obj"]["extra"]["transposed"]
    assert m["tensors"]["extra.transposed"]["sha256"] == sha(t.contiguous().numpy().tobytes())
    assert m["tensors"]["extra.transposed"]["sha256"] != sha(t.numpy().T.tobytes())


def test_manifest_of_safetensors_matches_hashlib(ckpt, files, tmp_path):
    m = manifest(ckpt, files["st"], str(tmp_path / "m.json"))
    check_manifest(m, files["st"], expected_tensors(files["st_tensors"]))


def test_digest_stdout_forms(ckpt, files, tmp_path):
    out = str(tmp_path / "m.json")
    m = manifest(ckpt, files["pt"], out)
    assert ckpt.json("digest", files["pt"], "--json") == m
    lines = ckpt.ok("digest", files["pt"]).stdout.splitlines()
    # The first line is what sha256sum prints; then one line per tensor.
    assert lines[0] == f"{file_sha(files['pt'])}  {files['pt']}"
    assert lines[1:] == [f"{v['sha256']}  {k}" for k, v in m["tensors"].items()]
    assert not [f for f in os.listdir(tmp_path) if f != "m.json"]  # no temporaries left


def test_verify_digests_ok_across_formats(ckpt, files, tmp_path):
    m = str(tmp_path / "m.json")
    n = len(manifest(ckpt, files["pt"], m)["tensors"])
    r = ckpt.ok("verify", files["pt"], "--digests", m)
    assert r.stdout.startswith(f"OK: {n} of {n} tensors match {m}")
    # The manifest of the .pt verifies the legacy file and the safetensors converted from it.
    ckpt.ok("verify", files["legacy"], "--digests", m)
    st = str(tmp_path / "train.safetensors")
    ckpt.ok("convert", files["pt"], st)
    r = ckpt.ok("verify", st, "--digests", m)
    assert r.stdout.startswith(f"OK: {n} of {n} tensors match")
    # Without a manifest a plain safetensors file still checks nothing, and says how to.
    r = ckpt.run("verify", st)
    assert r.returncode == NOT_VERIFIED, r.stderr
    assert "ckpt digest" in r.stderr


def test_verify_digests_names_flipped_tensor(ckpt, files, tmp_path):
    m = str(tmp_path / "m.json")
    manifest(ckpt, files["st"], m)
    bad = str(tmp_path / "bad.safetensors")
    shutil.copy(files["st"], bad)
    flip(bad, data_offset(bad, "embed.weight") + 8, 4)
    r = ckpt.run("verify", bad, "--digests", m)
    assert r.returncode == CORRUPT, r.stdout + r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("ckpt: error:")]
    assert len(lines) == 1, r.stderr
    assert f"{bad}: embed.weight: SHA-256 " in lines[0] and "[corrupt]" in lines[0]
    assert "1 tensor does not match" in r.stderr
    assert "OK" not in r.stdout


def test_verify_digests_names_missing_and_extra_tensors(ckpt, files, tmp_path):
    m = str(tmp_path / "m.json")
    manifest(ckpt, files["st"], m)
    other = str(tmp_path / "other.safetensors")
    t = dict(files["st_tensors"])
    t["added"] = t.pop("ids")
    t["proj.bias"] = t["proj.bias"].float()
    write_safetensors(other, t)
    r = ckpt.run("verify", other, "--digests", m)
    assert r.returncode == CORRUPT, r.stderr
    assert "ids: not in the file" in r.stderr
    assert "added: not in the manifest" in r.stderr
    assert "proj.bias: dtype float32, expected float16" in r.stderr
    assert "3 tensors do not match" in r.stderr


def test_verify_bad_manifest_is_an_invalid_argument(ckpt, files, tmp_path):
    m = tmp_path / "m.json"
    m.write_text('{"tensors": {}}')
    r = ckpt.run("verify", files["st"], "--digests", str(m))
    assert r.returncode == INVALID_ARGUMENT, r.stderr
    assert "not a ckpt digest manifest" in r.stderr


def test_convert_digests_stored_in_safetensors_metadata(ckpt, files, tmp_path):
    out = str(tmp_path / "d.safetensors")
    r = ckpt.ok("convert", files["pt"], out, "--digests")
    assert "ckpt.sha256" in r.stderr
    header, data = read_safetensors(out)
    meta = header["__metadata__"]
    assert meta["format"] == "pt"
    stored = json.loads(meta["ckpt.sha256"])
    want = expected_tensors(helpers.torch_load(files["pt"]))
    assert stored == {k: v[2] for k, v in want.items()}
    # The file itself is plain safetensors: every tensor's bytes are torch's.
    for name, (dtype, shape, digest) in want.items():
        assert header[name]["shape"] == shape
        assert sha(data[name]) == digest
    t = files["obj"]["extra"]["transposed"]
    got = np.frombuffer(data["extra.transposed"], dtype="<f4").reshape(4, 3)
    assert np.array_equal(got, t.numpy())

    r = ckpt.ok("verify", out)
    n = len(want)
    assert r.stdout.startswith(f"OK: {n} of {n} tensors match their stored SHA-256")

    flip(out, data_offset(out, "model.1.weight") + 4, 4)
    r = ckpt.run("verify", out)
    assert r.returncode == CORRUPT, r.stdout + r.stderr
    assert f"{out}: model.1.weight: SHA-256 " in r.stderr
    assert "1 tensor does not match their stored SHA-256" in r.stderr


def test_convert_digests_from_safetensors_and_legacy(ckpt, files, tmp_path):
    for src in (files["st"], files["legacy"]):
        out = str(tmp_path / (os.path.basename(src) + ".d.safetensors"))
        ckpt.ok("convert", src, out, "--digests")
        ckpt.ok("verify", out)
        m = str(tmp_path / "m.json")
        manifest(ckpt, src, m)
        ckpt.ok("verify", out, "--digests", m)


@pytest.mark.parametrize("target", ["x.pt", "x.tensors"])
def test_convert_digests_refused_for_other_targets(ckpt, files, tmp_path, target):
    out = str(tmp_path / target)
    r = ckpt.run("convert", files["pt"], out, "--digests")
    assert r.returncode == INVALID_ARGUMENT, r.stderr
    assert "only available for safetensors" in r.stderr
    assert os.listdir(tmp_path) == []


def test_verify_crc_mismatch_names_the_tensors_of_the_record(ckpt, files, tmp_path):
    bad = str(tmp_path / "bad.pt")
    shutil.copy(files["pt"], bad)
    ls = ckpt.json("ls", bad, "--json")
    t = next(x for x in ls["tensors"] if x["name"] == "model.1.weight")
    flip(bad, t["offset"] + 4, 4)
    r = ckpt.run("verify", bad)
    assert r.returncode == CORRUPT, r.stderr
    assert "CRC32 mismatch" in r.stderr and "(tensors: model.1.weight)" in r.stderr


def test_quantized_tensors(ckpt, tmp_path):
    torch.manual_seed(3)
    x = torch.randn(3, 4)
    obj = {"pt": torch.quantize_per_tensor(x, 0.05, 3, torch.quint8),
           "pc": torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
                                            torch.tensor([1, -2, 3]), 0, torch.qint8)}
    path = str(tmp_path / "q.pt")
    torch.save(obj, path)
    m = manifest(ckpt, path, str(tmp_path / "m.json"))["tensors"]
    for name, q in obj.items():
        assert m[name]["sha256"] == sha(q.int_repr().contiguous().numpy().tobytes())
    assert m["pt"]["quantization"]["scale"] == 0.05 and m["pt"]["quantization"]["zero_point"] == 3
    pc = m["pc"]["quantization"]
    assert pc["axis"] == 0
    assert pc["scales_sha256"] == sha(obj["pc"].q_per_channel_scales().numpy().tobytes())
    assert pc["zero_points_sha256"] == sha(obj["pc"].q_per_channel_zero_points().numpy().tobytes())
    ckpt.ok("verify", path, "--digests", str(tmp_path / "m.json"))
