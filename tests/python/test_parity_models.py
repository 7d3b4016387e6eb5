"""Writer options as Python keywords (errors name Python keywords, the CLI's its flags), and
save_model / load_model with safetensors' semantics for every format ckpt writes. Run under
torch 2.x and torch 1.13."""

import io
import json
import os
import subprocess

import pytest
import torch

import ckpt


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("steps", torch.tensor(3))


def test_tied_to_safetensors_names_python_keyword(tmp_path):
    sd = Tied().state_dict()
    with pytest.raises(ckpt.InvalidArgumentError) as e:
        ckpt.save(sd, tmp_path / "m.safetensors")
    msg = str(e.value)
    assert "copy_shared=True" in msg and "::" not in msg, msg
    ckpt.save(sd, tmp_path / "m.safetensors", copy_shared=True)
    got = ckpt.load(tmp_path / "m.safetensors")
    assert torch.equal(got["head.weight"], sd["embed.weight"])
    # Checkpoint.convert writes a tied weight once, as safetensors' save_model does (save,
    # like save_file, refuses it), and records the name it left out.
    torch.save(sd, tmp_path / "m.pt")
    r = ckpt.open(tmp_path / "m.pt").convert(tmp_path / "c.safetensors")
    with ckpt.safe_open(str(tmp_path / "c.safetensors"), framework="pt") as f:
        names = set(f.keys())
        meta = f.metadata()
    assert len(names & {"head.weight", "embed.weight"}) == 1
    kept = (names & {"head.weight", "embed.weight"}).pop()
    dropped = ({"head.weight", "embed.weight"} - {kept}).pop()
    assert meta.get(dropped) == kept, meta
    assert torch.equal(ckpt.load(tmp_path / "c.safetensors")[kept], sd["embed.weight"])


def test_cli_names_its_flag(tmp_path, ckpt_bin):
    torch.save(Tied().state_dict(), tmp_path / "m.pt")
    r = subprocess.run([ckpt_bin, "convert", str(tmp_path / "m.pt"),
                        str(tmp_path / "m.safetensors")], capture_output=True, text=True)
    # The alias is left out with a note that names the flag that writes copies instead.
    assert r.returncode == 0 and "--copy-shared" in r.stderr and "::" not in r.stderr, r.stderr


def test_writer_keywords(tmp_path):
    sd = {"a": torch.randn(3, 5), "b": torch.arange(7)}
    p = tmp_path / "d.safetensors"
    ckpt.save(sd, p, align=4096, store_digests=True, metadata={"k": "v"}, fsync=True)
    c = ckpt.open(p)
    assert c.properties.get("metadata.k") == "v"
    raw = p.read_bytes()
    header = int.from_bytes(raw[:8], "little")
    assert (8 + header) % 4096 == 0
    assert "ckpt.sha256" in json.loads(raw[8:8 + header])["__metadata__"]
    assert c.verify() >= 0
    q = tmp_path / "a.pt"
    ckpt.save(sd, q, align=4096)
    assert torch.equal(ckpt.load(q)["a"], sd["a"])
    # tensorizer encryption: key, key_file (made when missing), password
    kf = tmp_path / "key.hex"
    raw_key = ckpt.save(sd, tmp_path / "e.tensors", key_file=kf)
    assert kf.read_text().strip() == raw_key.hex() and (os.stat(kf).st_mode & 0o777) == 0o600
    assert torch.equal(ckpt.load(tmp_path / "e.tensors", key=raw_key)["b"], sd["b"])
    ckpt.save(sd, tmp_path / "e2.tensors", key_file=kf)  # an existing key file is used
    assert torch.equal(ckpt.load(tmp_path / "e2.tensors", key=kf.read_text().strip())["a"],
                       sd["a"])
    # A keyword of another format is refused by its name.
    for kw, target in (({"copy_shared": True}, "x.pt"), ({"store_digests": True}, "x.tensors"),
                       ({"key": bytes(32)}, "x.safetensors"), ({"align": 64}, "x.tensors"),
                       ({"metadata": {"a": "b"}}, "x.pt")):
        with pytest.raises(ckpt.InvalidArgumentError) as e:
            ckpt.save(sd, tmp_path / target, **kw)
        assert f"{next(iter(kw))}=" in str(e.value)
    with pytest.raises(ckpt.InvalidArgumentError) as e:
        ckpt.open(q).convert(tmp_path / "y.pt", copy_shared=True)
    assert "copy_shared=" in str(e.value)


@pytest.mark.parametrize("ext", ["safetensors", "pt", "tensors"])
def test_save_model_load_model(tmp_path, ext):
    torch.manual_seed(0)
    model = Tied()
    p = tmp_path / f"m.{ext}"
    ckpt.save_model(model, p)
    names = ckpt.open(p).keys()
    assert "embed.weight" in names and "head.weight" not in names  # saved once, one name
    fresh = Tied()
    assert not torch.equal(fresh.embed.weight, model.embed.weight)
    missing, unexpected = ckpt.load_model(fresh, p)
    assert missing == [] and unexpected == []
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert fresh.head.weight is fresh.embed.weight  # still tied
    # strict: a file that lacks a name (not tied to one it has) is refused, naming it.
    sd = model.state_dict()
    del sd["body.bias"]
    ckpt.save(sd, tmp_path / f"partial.{ext}", **({"copy_shared": True} if ext == "safetensors"
                                                     else {}))
    with pytest.raises(ckpt.InvalidArgumentError) as e:
        ckpt.load_model(Tied(), tmp_path / f"partial.{ext}")
    assert "body.bias" in str(e.value)
    missing, unexpected = ckpt.load_model(Tied(), tmp_path / f"partial.{ext}", strict=False)
    assert missing == ["body.bias"] and unexpected == []


def test_save_model_file_object(tmp_path):
    model = Tied()
    buf = io.BytesIO()
    ckpt.save_model(model, buf, format="safetensors")
    buf.seek(0)
    fresh = Tied()
    ckpt.load_model(fresh, buf)
    assert torch.equal(fresh.body.weight, model.body.weight)
    ckpt.save_model(model, str(tmp_path / "s.safetensors"), metadata={"m": "1"})
    assert ckpt.open(tmp_path / "s.safetensors").properties["metadata.m"] == "1"


def test_convert_progress_and_fsync(tmp_path):
    torch.save({"a": torch.randn(1000)}, tmp_path / "c.pt")
    calls = []
    ckpt.open(tmp_path / "c.pt").convert(tmp_path / "c.safetensors", fsync=False,
                                          progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1][0] == calls[-1][1] == os.path.getsize(tmp_path / "c.safetensors")
