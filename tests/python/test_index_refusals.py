"""A shard index names files beside it and nothing else, through the module too
(docs/security.md, "What a shard index may name"): a local index naming a URL or a link out of its
folder raises ckpt.CorruptError before any request."""

import json
import os
import struct

import pytest

import ckpt
import hostile_http  # tests/interop (on sys.path via conftest)


def write_safetensors(path, name="w"):
    raw = bytes(range(64))
    h = json.dumps({name: {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}}).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + raw)


def write_index(folder, weight_map):
    p = os.path.join(folder, "model.safetensors.index.json")
    with open(p, "w") as f:
        json.dump({"weight_map": weight_map}, f)
    return p


@pytest.fixture
def server(tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    write_safetensors(www / "m.safetensors")
    s = hostile_http.HostileServer(str(www))
    yield s
    s.stop()


def test_local_index_naming_a_url_raises_before_any_request(server, tmp_path, monkeypatch):
    d = tmp_path / "idx"
    d.mkdir()
    write_index(str(d), {"w": server.url("py", "plain", "m.safetensors")})
    monkeypatch.chdir(d)
    for call in (lambda: ckpt.open("model.safetensors.index.json"),
                 lambda: ckpt.load("model.safetensors.index.json"),
                 lambda: ckpt.load(str(d / "model.safetensors.index.json"))):
        with pytest.raises(ckpt.CorruptError) as e:
            call()
        assert "local files only" in str(e.value)
    assert server.requests_under("/py/") == []


def test_local_index_shard_linking_out_raises(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write_safetensors(outside / "m.safetensors")
    d = tmp_path / "idx"
    d.mkdir()
    os.symlink(outside / "m.safetensors", d / "m.safetensors")
    p = write_index(str(d), {"w": "m.safetensors"})
    with pytest.raises(ckpt.CorruptError) as e:
        ckpt.load(p)
    assert "resolves outside the index's folder" in str(e.value)
    # The same shard as a file of the folder loads.
    (d / "m.safetensors").unlink()
    write_safetensors(d / "m.safetensors")
    assert list(ckpt.load(p)) == ["w"]
