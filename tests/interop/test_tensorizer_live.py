"""ckpt against the tensorizer that pip installs (tests/peers/requirements.txt), both ways, with
its encryption: tensorizer's TensorSerializer writes, ckpt reads and converts; ckpt writes
.tensors, tensorizer's TensorDeserializer reads. The saved 2.11.1 files are test_formats.py's."""

import os

import pytest
import torch

import helpers

tensorizer = pytest.importorskip(
    "tensorizer", reason="tensorizer is not importable in this interpreter: run the suite with the "
    "peer venv's python (scripts/install-peers.sh)")
from tensorizer import (DecryptionParams, EncryptionParams, TensorDeserializer,  # noqa: E402
                        TensorSerializer)


def state_dict():
    g = torch.Generator().manual_seed(5)
    return {
        "embed.weight": torch.randn(64, 32, generator=g),
        "layer.0.weight": torch.randn(32, 32, generator=g).to(torch.bfloat16),
        "layer.0.bias": torch.randn(32, generator=g).half(),
        "layer.0.scale": torch.randn(32, generator=g).double(),
        "ids": torch.arange(100, dtype=torch.int64),
        "mask": torch.arange(40) % 3 == 0,
        "codes": torch.randint(-128, 127, (7, 9), dtype=torch.int8, generator=g),
    }


def serialize(path, sd, encryption=None):
    s = TensorSerializer(str(path), encryption=encryption)
    s.write_state_dict(sd)
    s.close()


def private(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def assert_equal(got, want):
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k], v), k


def test_ckpt_reads_what_tensorizer_writes(ckpt, tmp_path):
    sd = state_dict()
    src = tmp_path / "m.tensors"
    serialize(src, sd)
    rows = {r["name"]: r for r in ckpt.json("ls", src, "--json")["tensors"]}
    assert {k: rows[k]["dtype"] for k in sd} == {k: str(v.dtype)[6:] for k, v in sd.items()}
    assert {k: rows[k]["shape"] for k in sd} == {k: list(v.shape) for k, v in sd.items()}
    ckpt.ok("verify", src)  # tensorizer's own hashes
    out = tmp_path / "m.pt"
    ckpt.ok("convert", src, out)
    assert_equal(torch.load(out, weights_only=True), sd)


def test_tensorizer_reads_what_ckpt_writes(ckpt, tmp_path):
    sd = state_dict()
    src = tmp_path / "m.pt"
    torch.save(sd, src)
    out = tmp_path / "m.tensors"
    ckpt.ok("convert", src, out)
    d = TensorDeserializer(str(out), device="cpu", verify_hash=True)
    try:
        assert_equal(dict(d.items()), sd)
    finally:
        d.close()


def test_encrypted_by_tensorizer_with_a_password(ckpt, tmp_path):
    sd = state_dict()
    src = tmp_path / "e.tensors"
    serialize(src, sd, EncryptionParams.from_string("correct horse battery staple"))
    pw = tmp_path / "pw.txt"
    private(pw, b"correct horse battery staple")
    out = tmp_path / "e.pt"
    ckpt.ok("convert", src, out, "--decrypt-password-file", pw)
    assert_equal(torch.load(out, weights_only=True), sd)
    wrong = tmp_path / "wrong.txt"
    private(wrong, b"not the password")
    r = ckpt.run("convert", src, tmp_path / "x.pt", "--decrypt-password-file", wrong)
    assert r.returncode == 9, r  # authentication
    assert not (tmp_path / "x.pt").exists()


def test_encrypted_by_ckpt_read_by_tensorizer(ckpt, tmp_path):
    sd = state_dict()
    src = tmp_path / "m.pt"
    torch.save(sd, src)
    key = tmp_path / "k.key"
    out = tmp_path / "e.tensors"
    ckpt.ok("convert", src, out, "--encrypt-key", key)
    raw = bytes.fromhex(key.read_text().strip())
    d = TensorDeserializer(str(out), device="cpu", encryption=DecryptionParams.from_key(raw))
    try:
        assert_equal(dict(d.items()), sd)
    finally:
        d.close()
