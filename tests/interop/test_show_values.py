"""`ckpt show FILE NAME` for any value (issue 13, point 7): a tensor by the name `ls` lists, any
value of the object tree by its dotted path (dict keys, list indices, object attributes), and a
tensor indexed as in Python (`w[0:2]`, `w[1, 1:3]`, `w[:, -1]`) — printed as torch prints them."""

import subprocess

import pytest
import helpers

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    d = tmp_path_factory.mktemp("show-values")
    torch.manual_seed(13)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3))
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    obj = {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 7,
           "cfg": {"lr": 0.1, "name": "x"}, "w": torch.arange(24.).reshape(2, 3, 4),
           "hist": [1.5, 2.5], "i": torch.arange(10, dtype=torch.int64)}
    p = d / "train.pt"
    torch.save(obj, p)
    return str(p), helpers.torch_load(p)


def _show(ckpt, path, name):
    return ckpt.ok("show", path, name).stdout.rstrip("\n")


@pytest.mark.parametrize("expr, ref", [
    ("w[0]", lambda o: o["w"][0]),
    ("w[1, 1:3]", lambda o: o["w"][1, 1:3]),
    ("w[:, -1]", lambda o: o["w"][:, -1]),
    ("w[0:1, :, 2]", lambda o: o["w"][0:1, :, 2]),
    ("w[-1, -2, -3]", lambda o: o["w"][-1, -2, -3]),
    ("i[2:7]", lambda o: o["i"][2:7]),
    ("i[5]", lambda o: o["i"][5]),
    ("i[:]", lambda o: o["i"][:]),
    ("model.0.weight[1]", lambda o: o["model"]["0.weight"][1]),
    ("optimizer.state.0.exp_avg[:, 0]", lambda o: o["optimizer"]["state"][0]["exp_avg"][:, 0]),
])
def test_indexed_tensor_prints_like_torch(ckpt, train, expr, ref):
    path, obj = train
    assert _show(ckpt, path, expr) == repr(ref(obj))


@pytest.mark.parametrize("name", ["epoch", "cfg.lr", "cfg.name", "hist.1"])
def test_scalar_values(ckpt, train, name):
    path, obj = train
    v = obj
    for part in name.split("."):
        v = v[int(part)] if isinstance(v, list) else v[part]
    assert _show(ckpt, path, name) == repr(v)


def test_containers_and_state_paths(ckpt, train):
    path, obj = train
    out = _show(ckpt, path, "cfg")
    assert out.splitlines()[0] == "dict (2)" and "lr: 0.1" in out and "name: 'x'" in out
    exp = obj["optimizer"]["state"][0]["exp_avg"]
    assert _show(ckpt, path, "optimizer.state.0.exp_avg") == repr(exp)
    # The state dict's own names (keys with dots) still work.
    assert _show(ckpt, path, "model.0.bias") == repr(obj["model"]["0.bias"])


@pytest.mark.parametrize("name, code, says", [
    ("nope", 2, "no tensor or value has this name or path"),
    ("epoch[0]", 8, "only a tensor can be indexed"),
    ("w[5]", 8, "out of range for dimension 0 of size 2"),
    ("w[0,0,0,0]", 8, "too many indices"),
    ("w[0:4:2]", 8, "steps are not supported"),
    ("w[x]", 8, "'x' is not an integer"),
])
def test_bad_names_and_indices(ckpt, train, name, code, says):
    path, _ = train
    r = ckpt.run("show", path, name)
    assert r.returncode == code, r.stderr
    assert says in r.stderr and r.stderr.count("\n") == 1 and path in r.stderr, r.stderr


def test_info_prints_top_level_values(ckpt, tmp_path):
    """info lists a training checkpoint's top-level scalars (epoch, step, metrics, short strings,
    short tuples) with their values; tensors, containers and long strings are only counted."""
    p = tmp_path / "t.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "epoch": 7, "step": 1200, "best_acc": 0.913,
                "name": "run-3", "betas": (0.9, 0.999), "done": True, "nothing": None,
                "big": 2**70, "long": "x" * 100, "nest": [[1]]}, p)
    j = ckpt.json("info", p, "--json")
    assert j["top_level_values"] == {"epoch": 7, "step": 1200, "best_acc": 0.913, "name": "run-3",
                                     "betas": [0.9, 0.999], "done": True, "nothing": None,
                                     "big": str(2**70)}
    out = ckpt.ok("info", p).stdout
    assert "top-level values:" in out
    for line in ("epoch:", "'run-3'", "(0.9, 0.999)", "True", "1180591620717411303424"):
        assert line in out, out


def test_verify_json(ckpt, train, tmp_path):
    path, _ = train
    import json as _json
    r = ckpt.ok("verify", path, "--json")
    j = _json.loads(r.stdout)
    assert j["result"] == "ok" and j["checked"] == j["total"] > 0 and j["what"] == "records"
    m = tmp_path / "m.json"
    ckpt.ok("digest", path, "-o", m)
    j = _json.loads(ckpt.ok("verify", path, "--digests", m, "--json").stdout)
    assert j["result"] == "ok" and j["what"] == "tensors" and j["mismatches"] == []
    # Nothing to check: not_verified, exit 10, still one JSON object.
    st = tmp_path / "x.safetensors"
    ckpt.ok("convert", path, st)
    r = ckpt.run("verify", st, "--json")
    assert r.returncode == 10 and _json.loads(r.stdout)["result"] == "not_verified"
    # A flipped byte in a data record: corrupt, exit 5, the record named in the object.
    import struct
    import zipfile
    bad = tmp_path / "bad.pt"
    data = bytearray(open(path, "rb").read())
    info = [i for i in zipfile.ZipFile(path).infolist() if i.filename.endswith("data/0")][0]
    n, e = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + n + e] ^= 0xFF
    bad.write_bytes(bytes(data))
    r = ckpt.run("verify", bad, "--json")
    j = _json.loads(r.stdout)
    assert r.returncode == 5 and j["result"] == "corrupt" and j["record"].endswith("data/0"), r.stdout
    assert isinstance(j["offset"], int) and "CRC32 mismatch" in j["error"]


def test_show_prints_what_was_put_on_unknown_objects(ckpt, tmp_path):
    """A list or dict subclass of the user's own is an opaque object: show lists its appended
    items (`+[i]`) and the items set on it (`[key] = value`), and a path reaches its attributes."""
    mod = tmp_path / "usermod_show.py"
    mod.write_text("class MyList(list):\n    pass\n\nclass MyDict(dict):\n    pass\n\n"
                   "class Cfg:\n    pass\n")
    p = tmp_path / "u.pt"
    subprocess.run(["/usr/bin/python3", "-c",
                    "import torch, usermod_show as m\n"
                    "d = m.MyDict(); d['a'] = 7\n"
                    "c = m.Cfg(); c.lr = 0.25\n"
                    f"torch.save({{'l': m.MyList([1, 2]), 'd': d, 'cfg': c}}, {str(p)!r})\n"],
                   check=True, cwd=tmp_path, timeout=120)
    out = ckpt.ok("show", p).stdout
    assert "l: usermod_show.MyList (2)" in out and "+[0] 1" in out and "+[1] 2" in out, out
    assert "d: usermod_show.MyDict (1)" in out and "['a'] = 7" in out, out
    assert _show(ckpt, str(p), "cfg.lr") == "0.25"


def test_show_json(ckpt, train):
    """show --json: the tree with tensors as references, any value, and a tensor (or an indexed
    view of it) with its values, equal to torch's `.tolist()`."""
    import json as _json
    path, obj = train
    tree = _json.loads(ckpt.ok("show", path, "--json").stdout)
    assert tree["epoch"] == 7 and tree["cfg"] == {"lr": 0.1, "name": "x"} and tree["hist"] == [1.5, 2.5]
    assert tree["w"] == {"tensor": "w", "dtype": "float32", "shape": [2, 3, 4]}
    assert tree["model"]["class"] == "OrderedDict" and "0.weight" in tree["model"]["items"]
    assert _json.loads(ckpt.ok("show", path, "cfg", "--json").stdout) == {"lr": 0.1, "name": "x"}
    assert _json.loads(ckpt.ok("show", path, "epoch", "--json").stdout) == 7
    for expr, ref in [("w", obj["w"]), ("w[1, 1:3]", obj["w"][1, 1:3]), ("i[2:7]", obj["i"][2:7]),
                      ("model.0.weight", obj["model"]["0.weight"])]:
        j = _json.loads(ckpt.ok("show", path, expr, "--json").stdout)
        assert j["dtype"] == str(ref.dtype).replace("torch.", "") and j["shape"] == list(ref.shape)
        assert j["values"] == ref.tolist(), expr
