"""Sharded checkpoints (issue 13, point 6): an index (`*.index.json`) or several shard files are
one checkpoint for ls, info, show, verify, load, extract and convert; convert writes shards plus
an index in the Hugging Face layout with --max-shard-size.

The sets are made by torch 1.13 (.bin shards: torch.save of slices of a state dict, and the
index beside them) or by hand (.safetensors shards: 8-byte header size, JSON header, data), and
every value ckpt reads is compared with what torch loads from the shard itself.
"""

import collections
import json
import os
import struct
import zlib

import pytest
import torch

from helpers import read_npy, tensor_bytes, zip_records
import helpers

ST_DTYPE = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
            torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
ST_TORCH = {v: k for k, v in ST_DTYPE.items()}


def state_dict(seed=0):
    g = torch.Generator().manual_seed(seed)
    sd = collections.OrderedDict()
    sd["embed.weight"] = torch.randn(64, 32, generator=g)
    sd["layers.0.attn.q.weight"] = torch.randn(32, 32, generator=g).half()
    sd["layers.0.attn.q.bias"] = torch.randn(32, generator=g).to(torch.bfloat16)
    sd["layers.0.mlp.weight"] = torch.randn(48, 32, generator=g).double()
    sd["layers.0.norm.weight"] = torch.ones(32)
    sd["layers.1.attn.q.weight"] = torch.randn(32, 32, generator=g)
    sd["layers.1.mask"] = torch.rand(16, generator=g) > 0.5
    sd["layers.1.positions"] = torch.arange(100, dtype=torch.int64)
    sd["layers.1.codes"] = torch.randint(-128, 127, (7, 3), generator=g, dtype=torch.int8)
    sd["head.weight"] = torch.randn(10, 32, generator=g)
    sd["scalar"] = torch.tensor(3.5)
    return sd


def nbytes(t):
    return t.numel() * t.element_size()


def split(sd, n):
    names = list(sd)
    per = (len(names) + n - 1) // n
    return [collections.OrderedDict((k, sd[k]) for k in names[i * per:(i + 1) * per])
            for i in range(n)]


def write_index(path, parts, files):
    wm = {name: f for part, f in zip(parts, files) for name in part}
    total = sum(nbytes(t) for part in parts for t in part.values())
    with open(path, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f,
                  indent=2)


def write_safetensors(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        raw = tensor_bytes(t)
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    out = collections.OrderedDict()
    base = 8 + n
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        dt = ST_TORCH[e["dtype"]]
        raw = bytearray(buf[base + b:base + en])
        if dt == torch.bfloat16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16) if raw else \
                torch.empty(0, dtype=dt)
        elif raw:
            t = torch.frombuffer(raw, dtype=dt)
        else:
            t = torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out, header


def bin_set(d, n=3, sd=None):
    sd = sd if sd is not None else state_dict()
    parts = split(sd, n)
    files = [f"pytorch_model-{i + 1:05d}-of-{n:05d}.bin" for i in range(n)]
    for part, f in zip(parts, files):
        torch.save(dict(part), os.path.join(d, f))
    index = os.path.join(d, "pytorch_model.bin.index.json")
    write_index(index, parts, files)
    return index, [os.path.join(d, f) for f in files], sd


def st_set(d, n=3, sd=None):
    sd = sd if sd is not None else state_dict()
    parts = split(sd, n)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for part, f in zip(parts, files):
        write_safetensors(os.path.join(d, f), part, {"format": "pt"})
    index = os.path.join(d, "model.safetensors.index.json")
    write_index(index, parts, files)
    return index, [os.path.join(d, f) for f in files], sd


def torch_values(shards):
    """name -> tensor, from torch.load of each .bin shard, or the hand parse of safetensors."""
    out = collections.OrderedDict()
    for p in shards:
        part = read_safetensors(p)[0] if p.endswith(".safetensors") else helpers.torch_load(p)
        for k, v in part.items():
            assert k not in out
            out[k] = v
    return out


def same(a, b):
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
    assert tensor_bytes(a) == tensor_bytes(b)


def crcs(values):
    return {k: f"{zlib.crc32(tensor_bytes(v)):08x}" for k, v in values.items()}


@pytest.fixture(params=["bin", "safetensors"])
def sharded(request, tmp_path):
    make = bin_set if request.param == "bin" else st_set
    index, shards, sd = make(str(tmp_path))
    return index, shards, sd


# ---------------------------------------------------------------------------------------------
# reading


@pytest.mark.parametrize("given", ["index", "files"])
def test_ls(ckpt, sharded, given):
    index, shards, sd = sharded
    args = [index] if given == "index" else shards
    j = ckpt.json("ls", *args, "--json")
    rows = {r["name"]: r for r in j["tensors"]}
    assert sorted(rows) == sorted(sd)
    assert [r["name"] for r in j["tensors"]] == list(sd)  # shard order, then file order
    for k, t in sd.items():
        assert rows[k]["dtype"] == str(t.dtype).replace("torch.", "")
        assert rows[k]["shape"] == list(t.shape)
        assert rows[k]["nbytes"] == nbytes(t)
    text = ckpt.ok("ls", *args).stdout
    assert f"{len(sd)} tensors" in text
    # the plain listing names each tensor's shard in its last column
    lines = text.splitlines()
    assert lines[0].split()[-1] == "shard"
    by_name = {ln.split()[0]: ln.split()[-1] for ln in lines[1:] if ln and not ln.startswith("-")}
    for k in sd:
        assert by_name[k] == os.path.basename(rows[k]["shard"])


def test_info(ckpt, sharded):
    index, shards, sd = sharded
    j = ckpt.json("info", index, "--json")
    assert j["properties"]["shards"] == "3"
    assert j["properties"]["total_size"] == str(sum(nbytes(t) for t in sd.values()))
    j2 = ckpt.json("info", *shards, "--json")
    assert j2["properties"]["shards"] == "3"


@pytest.mark.parametrize("mode", ["eager", "mmap", "stream"])
@pytest.mark.parametrize("given", ["index", "files"])
def test_load_values(ckpt, sharded, mode, given):
    index, shards, sd = sharded
    args = [index] if given == "index" else shards
    j = ckpt.json("load", *args, "--mode", mode, "--json", "--digest", "--budget-mb", "1")
    ref = torch_values(shards)
    assert j["tensors"] == len(ref)
    assert j["digests"] == crcs(ref)
    for k in sd:
        same(ref[k], sd[k])


def test_show(ckpt, sharded):
    index, shards, sd = sharded
    tree = ckpt.ok("show", index).stdout
    for k in sd:
        assert k in tree
    one = ckpt.ok("show", index, "layers.1.positions").stdout
    assert "99" in one
    many = ckpt.ok("show", *shards, "layers.1.positions").stdout
    assert many == one


def test_extract(ckpt, sharded, tmp_path):
    index, shards, sd = sharded
    out = tmp_path / "npy"
    ckpt.ok("extract", index, out)
    idx = json.loads((out / "index.json").read_text())
    assert sorted(e["name"] for e in idx["tensors"]) == sorted(sd)
    ref = torch_values(shards)
    for e in idx["tensors"]:
        _, header, data = read_npy(str(out / e["file"]))
        t = ref[e["name"]]
        assert tuple(header["shape"]) == tuple(t.shape)
        assert data == tensor_bytes(t)
    out2 = tmp_path / "npy2"
    ckpt.ok("extract", *shards, out2)
    assert sorted(os.listdir(out2)) == sorted(os.listdir(out))


def test_verify_bin_each_shard(ckpt, tmp_path):
    index, shards, sd = bin_set(str(tmp_path))
    r = ckpt.ok("verify", index)
    assert r.stdout.startswith("OK")
    # A flipped byte in the second shard's data: the error names that shard.
    rec = next(r for r in zip_records(shards[1]) if "/data/" in r.name and r.size > 0)
    with open(shards[1], "r+b") as f:
        f.seek(rec.data_offset)
        b = f.read(1)
        f.seek(rec.data_offset)
        f.write(bytes([b[0] ^ 0xFF]))
    bad = ckpt.run("verify", index)
    assert bad.returncode != 0
    assert os.path.basename(shards[1]) in bad.stderr
    bad2 = ckpt.run("load", index, "--verify")
    assert bad2.returncode != 0 and os.path.basename(shards[1]) in bad2.stderr


def test_verify_safetensors_not_verified(ckpt, tmp_path):
    index, shards, sd = st_set(str(tmp_path))
    r = ckpt.run("verify", index)
    assert r.returncode == 10  # safetensors store no checksums: never "OK"


def test_verify_shards_with_stored_digests(ckpt, tmp_path):
    # convert --max-shard-size --digests stores each shard's digests in its own __metadata__;
    # verify of the index checks every shard's, and names the tensor a changed byte hits.
    src = tmp_path / "full.pt"
    sd = state_dict()
    torch.save(sd, src)
    out = tmp_path / "out"
    out.mkdir()
    ckpt.ok("convert", src, out / "model.safetensors", "--max-shard-size", "6KB", "--digests")
    index = out / "model.safetensors.index.json"
    shards = sorted(p for p in out.iterdir() if p.name != index.name)
    assert len(shards) > 1
    for p in shards:
        assert "ckpt.sha256" in read_safetensors(str(p))[1]["__metadata__"]
    r = ckpt.ok("verify", index)
    assert f"OK: {len(sd)} of {len(sd)} tensors match their stored SHA-256" in r.stdout
    # one byte of the last tensor of the second shard
    j = ckpt.json("ls", index, "--json")
    row = [t for t in j["tensors"] if os.path.basename(t["shard"]) == shards[1].name][-1]
    with open(shards[1], "r+b") as f:
        f.seek(row["offset"] + row["nbytes"] - 1)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    bad = ckpt.run("verify", index)
    assert bad.returncode == 5 and row["name"] in bad.stdout + bad.stderr


# ---------------------------------------------------------------------------------------------
# refusals


def test_duplicate_name_names_both_shards(ckpt, tmp_path):
    d = str(tmp_path)
    a = os.path.join(d, "a.bin")
    b = os.path.join(d, "b.safetensors")
    torch.save({"x": torch.ones(3), "y": torch.zeros(2)}, a)
    write_safetensors(b, {"y": torch.zeros(2), "z": torch.ones(1)})
    r = ckpt.run("ls", a, b)
    assert r.returncode != 0
    assert "a.bin" in r.stderr and "b.safetensors" in r.stderr and "y" in r.stderr
    with open(os.path.join(d, "m.index.json"), "w") as f:
        json.dump({"weight_map": {"x": "a.bin", "y": "a.bin", "z": "b.safetensors"}}, f)
    r = ckpt.run("ls", os.path.join(d, "m.index.json"))
    assert r.returncode != 0
    assert "a.bin" in r.stderr and "b.safetensors" in r.stderr


def test_missing_shard_named(ckpt, tmp_path):
    index, shards, sd = bin_set(str(tmp_path))
    os.remove(shards[2])
    r = ckpt.run("ls", index)
    assert r.returncode != 0
    assert os.path.basename(shards[2]) in r.stderr
    r2 = ckpt.run("load", index)
    assert r2.returncode == r.returncode and os.path.basename(shards[2]) in r2.stderr


def test_index_entry_not_in_its_shard(ckpt, tmp_path):
    index, shards, sd = st_set(str(tmp_path))
    j = json.load(open(index))
    j["weight_map"]["ghost.weight"] = os.path.basename(shards[1])
    json.dump(j, open(index, "w"))
    r = ckpt.run("ls", index)
    assert r.returncode != 0
    assert "ghost.weight" in r.stderr and os.path.basename(shards[1]) in r.stderr


def test_index_shard_outside_folder_refused(ckpt, tmp_path):
    d = tmp_path / "sub"
    d.mkdir()
    torch.save({"x": torch.ones(2)}, tmp_path / "outside.bin")
    (d / "m.index.json").write_text(json.dumps({"weight_map": {"x": "../outside.bin"}}))
    r = ckpt.run("ls", d / "m.index.json")
    assert r.returncode != 0 and "outside.bin" in r.stderr


def test_json_that_is_not_an_index(ckpt, tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": 10}')
    r = ckpt.run("ls", p)
    assert r.returncode != 0 and "weight_map" in r.stderr


# ---------------------------------------------------------------------------------------------
# converting


@pytest.mark.parametrize("given", ["index", "files"])
def test_convert_set_to_one_pt(ckpt, sharded, tmp_path, given):
    index, shards, sd = sharded
    out = tmp_path / "one.pt"
    ckpt.ok("convert", *([index] if given == "index" else shards), out)
    got = helpers.torch_load(out)
    assert list(got) == list(sd)
    for k in sd:
        same(got[k], sd[k])


def test_convert_set_to_one_safetensors(ckpt, sharded, tmp_path):
    index, shards, sd = sharded
    out = tmp_path / "one.safetensors"
    ckpt.ok("convert", index, out)
    got, _ = read_safetensors(str(out))
    assert sorted(got) == sorted(sd)
    for k in sd:
        same(got[k], sd[k])


def test_round_trip_pt_pt_torch_load(ckpt, tmp_path):
    index, shards, sd = bin_set(str(tmp_path))
    one = tmp_path / "one.pt"
    two = tmp_path / "two.pt"
    ckpt.ok("convert", index, one)
    ckpt.ok("convert", one, two)
    got = helpers.torch_load(two)
    assert list(got) == list(sd)
    for k in sd:
        same(got[k], sd[k])


def check_index(index_path, shards_expected=None):
    j = json.load(open(index_path))
    d = os.path.dirname(index_path)
    files = sorted(set(j["weight_map"].values()))
    if shards_expected is not None:
        assert len(files) == shards_expected
    n = len(files)
    for i, f in enumerate(files):
        assert f.endswith(f"-{i + 1:05d}-of-{n:05d}" + os.path.splitext(f)[1])
    return j, [os.path.join(d, f) for f in files]


@pytest.mark.parametrize("target", ["bin", "safetensors"])
def test_convert_to_shards(ckpt, tmp_path, target):
    sd = state_dict()
    src = tmp_path / "model.pt"
    torch.save(sd, src)
    out = tmp_path / "out"
    out.mkdir()
    name = "pytorch_model.bin" if target == "bin" else "model.safetensors"
    limit = 10000
    r = ckpt.ok("convert", src, out / name, "--max-shard-size", f"{limit}B")
    index = out / (name + ".index.json")
    assert index.exists() and "shards" in r.stdout
    assert not (out / name).exists()
    j, files = check_index(str(index))
    assert len(files) > 1
    assert j["metadata"]["total_size"] == sum(nbytes(t) for t in sd.values())
    assert sorted(j["weight_map"]) == sorted(sd)
    assert list(j["weight_map"]) == sorted(j["weight_map"])
    seen = {}
    for f in files:
        part = helpers.torch_load(f) if target == "bin" else read_safetensors(f)[0]
        size = sum(nbytes(t) for t in part.values())
        assert size <= limit or len(part) == 1
        for k, v in part.items():
            assert j["weight_map"][k] == os.path.basename(f)
            assert k not in seen
            seen[k] = v
    assert sorted(seen) == sorted(sd)
    for k in sd:
        same(seen[k], sd[k])
    # No temporaries left, and ckpt reads the set back as one.
    assert not [p for p in os.listdir(out) if ".tmp" in p]
    back = ckpt.json("load", index, "--json", "--digest")
    assert back["digests"] == crcs(sd)


def test_big_tensor_alone(ckpt, tmp_path):
    sd = collections.OrderedDict()
    sd["a"] = torch.ones(10)           # 40 bytes
    sd["big"] = torch.arange(1000.0)   # 4000 bytes > max
    sd["b"] = torch.zeros(5)           # 20 bytes
    sd["c"] = torch.ones(5)            # 20 bytes
    src = tmp_path / "m.pt"
    torch.save(sd, src)
    ckpt.ok("convert", src, tmp_path / "model.safetensors", "--max-shard-size", "100")
    j, files = check_index(str(tmp_path / "model.safetensors.index.json"), 3)
    assert j["weight_map"] == {"a": files[0].rsplit("/", 1)[1], "big": files[1].rsplit("/", 1)[1],
                               "b": files[2].rsplit("/", 1)[1], "c": files[2].rsplit("/", 1)[1]}
    got, _ = read_safetensors(files[1])
    same(got["big"], sd["big"])


def test_everything_fits_one_file(ckpt, tmp_path):
    sd = state_dict()
    src = tmp_path / "m.pt"
    torch.save(sd, src)
    ckpt.ok("convert", src, tmp_path / "pytorch_model.bin", "--max-shard-size", "5GB")
    assert (tmp_path / "pytorch_model.bin").exists()
    assert not (tmp_path / "pytorch_model.bin.index.json").exists()
    got = helpers.torch_load(tmp_path / "pytorch_model.bin")
    for k in sd:
        same(got[k], sd[k])


def test_shards_to_shards(ckpt, tmp_path):
    index, shards, sd = st_set(str(tmp_path))
    out = tmp_path / "re"
    out.mkdir()
    ckpt.ok("convert", index, out / "pytorch_model.bin.index.json", "--max-shard-size", "8KB")
    j, files = check_index(str(out / "pytorch_model.bin.index.json"))
    got = torch_values(files)
    assert sorted(got) == sorted(sd)
    for k in sd:
        same(got[k], sd[k])


def test_tied_weights_stay_together(ckpt, tmp_path):
    w = torch.randn(20, 10)
    sd = collections.OrderedDict([("embed.weight", w), ("mid", torch.ones(300)),
                                  ("lm_head.weight", w)])
    src = tmp_path / "tied.pt"
    torch.save(sd, src)
    ckpt.ok("convert", src, tmp_path / "pytorch_model.bin", "--max-shard-size", "1000")
    j, files = check_index(str(tmp_path / "pytorch_model.bin.index.json"))
    assert j["weight_map"]["embed.weight"] == j["weight_map"]["lm_head.weight"]
    part = helpers.torch_load(os.path.join(tmp_path, j["weight_map"]["lm_head.weight"]))
    same(part["lm_head.weight"], w)
    assert part["embed.weight"].data_ptr() == part["lm_head.weight"].data_ptr()


@pytest.mark.parametrize("size,ok", [("0", False), ("abc", False), ("5XB", False),
                                     ("1.5KB", True), ("2KiB", True)])
def test_max_shard_size_parsing(ckpt, tmp_path, size, ok):
    src = tmp_path / "m.pt"
    torch.save(state_dict(), src)
    r = ckpt.run("convert", src, tmp_path / "model.safetensors", "--max-shard-size", size)
    if ok:
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "model.safetensors.index.json").exists()
    else:
        assert r.returncode == 64, r.stderr
        assert "--max-shard-size" in r.stderr
