"""TorchScript archives (torch.jit.save) <-> ckpt.

Archives are made at test time with torch.jit.script and torch.jit.trace: nested submodules,
ModuleList and Sequential, buffers, tensor constants, a module with __getstate__/__setstate__,
several code files. An old-format (per-range) debug_pkl is made by re-encoding the new-format
(string-table) one that torch 1.13 writes. Rewritten archives must torch.jit.load and give the
same outputs (and, where debug info is kept, the same source-annotated graphs); state dicts that
`ckpt convert` exports must load_state_dict(strict=True) into the Python module.
"""

import io
import json
import pickle
import struct
import zipfile

import numpy as np
import pytest
import torch

from conftest import one_error_line
import helpers

torch.manual_seed(0)


class Leaf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.linear(x))


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Leaf(), Leaf()])
        self.register_buffer("running", torch.arange(4.0))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x + self.running


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
        self.scale = 2.0

    def forward(self, x):
        return self.head(self.encoder(x)) * self.scale


class Traced(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x):
        # A tensor made in forward becomes a constant (constants.pkl) when traced.
        return self.lin(x) + torch.tensor([0.5, -1.0, 2.0]) + self.shift


class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))
        self.k = 3

    @torch.jit.export
    def __getstate__(self):
        return (self.w, self.k, self.training)

    @torch.jit.export
    def __setstate__(self, st: tuple[torch.Tensor, int, bool]):
        self.w = st[0]
        self.k = st[1]
        self.training = st[2]

    def forward(self, x):
        return x * self.w * self.k


MODELS = {
    "net": (Net, lambda m: torch.jit.script(m), (2, 4)),
    "traced": (Traced, lambda m: torch.jit.trace(m, torch.randn(2, 3)), (2, 3)),
    "stateful": (Stateful, lambda m: torch.jit.script(m), (2, 3)),
}


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    d = tmp_path_factory.mktemp("ts")
    out = {}
    for name, (cls, make, shape) in MODELS.items():
        eager = cls()
        path = d / f"{name}.pt"
        torch.jit.save(make(eager), str(path), _extra_files={"meta.json": b'{"k": 1}'})
        out[name] = (path, eager, torch.randn(*shape))
    # The same net with every debug_pkl re-encoded in the per-range (old) layout.
    old = d / "net_old.pt"
    reencode_debug_old(out["net"][0], old)
    out["net_old"] = (old, out["net"][1], out["net"][2])
    return out


class _DebugUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "torch.jit._pickle" and name == "build_intlist":
            return list
        raise pickle.UnpicklingError(f"{module}.{name}")


def reencode_debug_old(src, dst):
    """Rewrites every .debug_pkl from ("FORMAT_WITH_STRING_TABLE", table, records) into the
    per-range layout: records with sources (text, filename, starting_line)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith(".debug_pkl"):
                marker, table, records = _DebugUnpickler(io.BytesIO(data)).load()
                assert marker == "FORMAT_WITH_STRING_TABLE"
                recs = []
                for off, (source, start, end), tag in records:
                    lines, fname, line = source
                    if lines:
                        s = ("".join(table[i] for i in lines), table[fname], line)
                    else:
                        s = ("", None, 0)
                    recs.append((off, (s, start, end), tag))
                data = pickle.dumps(tuple(recs), protocol=2)
            zout.writestr(info.filename, data, compress_type=info.compress_type)


def test_torch_113_writes_string_table_debug(archives):
    with zipfile.ZipFile(archives["net"][0]) as z:
        names = z.namelist()
        dbg = [n for n in names if n.endswith(".debug_pkl")]
        assert len([n for n in names if n.endswith(".py")]) >= 3  # several code files
        assert dbg and all(_DebugUnpickler(io.BytesIO(z.read(n))).load()[0] ==
                           "FORMAT_WITH_STRING_TABLE" for n in dbg)
        assert "net/constants.pkl" in names and "net/version" in names


def _ls(ckpt, path):
    return {t["name"]: t for t in ckpt.json("ls", "--json", path)["tensors"]}


@pytest.mark.parametrize("name", ["net", "traced", "stateful"])
def test_ls_names_by_module_path(ckpt, archives, name):
    path, eager, _ = archives[name]
    ls = _ls(ckpt, path)
    sd = eager.state_dict()
    for k, v in sd.items():
        assert k in ls, f"{k} missing from ckpt ls: {sorted(ls)}"
        assert ls[k]["shape"] == list(v.shape)
    module_tensors = {k for k, t in ls.items() if t.get("type") != "constant"}
    assert module_tensors == set(sd)
    params = {k for k, _ in eager.named_parameters()}
    for k in sd:
        assert ls[k].get("type") == ("param" if k in params else "buffer"), k
    if name == "traced":
        consts = [k for k in ls if k.startswith("constants.")]
        assert consts and all(ls[k]["type"] == "constant" for k in consts)


def test_show_prints_module_tree(ckpt, archives):
    out = ckpt.ok("show", archives["net"][0]).stdout
    # Classes defined in this file are qualified by its module name.
    assert "__torch__.test_torchscript.Net (" in out and "__torch__.test_torchscript.Encoder (" in out
    assert "__torch__.torch.nn.modules.container.Sequential" in out
    assert "scale: 2.0" in out


def test_code_all_and_one(ckpt, archives):
    path = archives["net"][0]
    out = ckpt.ok("code", path).stdout
    assert "class Net(Module):" in out and "class Linear(Module):" in out
    one = ckpt.ok("code", path, "__torch__.test_torchscript.Encoder").stdout
    assert one.startswith("class Encoder(Module):") and "class Net" not in one
    lin = ckpt.ok("code", path, "code/__torch__/torch/nn/modules/linear.py").stdout
    with zipfile.ZipFile(path) as z:
        assert lin == z.read("net/code/__torch__/torch/nn/modules/linear.py").decode()
    r = ckpt.run("code", path, "__torch__.Nope")
    assert "no code file" in one_error_line(r)
    one_error_line(ckpt.run("code", path, "code/../../x.py"))


@pytest.mark.parametrize("name", ["net", "net_old"])
def test_code_ranges(ckpt, archives, name):
    out = ckpt.ok("code", "--ranges", archives[name][0], "__torch__.test_torchscript.Leaf").stdout
    line = [l for l in out.splitlines() if "torch.relu" in l][0]
    # Leaf.forward's return is this file's line (found by text, not hard-coded).
    src_line = [i for i, l in enumerate(open(__file__).read().splitlines(), 1)
                if "return torch.relu(self.linear(x))" in l][0]
    assert line.rstrip().endswith(f"test_torchscript.py:{src_line}"), line


def _graphs(m):
    return str(m.graph), str(getattr(m.head, "0").graph) if hasattr(m, "head") else ""


@pytest.mark.parametrize("name", ["net", "traced", "stateful", "net_old"])
@pytest.mark.parametrize("debug", ["keep", "table", "strip"])
def test_rewrite_loads_and_matches(ckpt, archives, name, debug, tmp_path):
    path, _, x = archives[name]
    out = tmp_path / "out.pt"
    r = ckpt.ok("rewrite", path, out, f"--debug={debug}")
    a, b = torch.jit.load(str(path)), torch.jit.load(str(out))
    assert torch.equal(a(x), b(x))
    if debug != "strip":
        assert _graphs(a) == _graphs(b)  # source annotations come from debug_pkl
    if debug == "table" and name == "net_old":
        assert "converted to the string-table format" in r.stdout
        with zipfile.ZipFile(out) as z:
            for n in z.namelist():
                if n.endswith(".debug_pkl"):
                    assert _DebugUnpickler(io.BytesIO(z.read(n))).load()[0] == \
                        "FORMAT_WITH_STRING_TABLE"
    if debug == "strip":
        with zipfile.ZipFile(out) as z:
            assert not [n for n in z.namelist() if n.endswith(".debug_pkl")]


@pytest.mark.parametrize("name", ["net", "traced", "net_old"])
def test_rewrite_no_jitter(ckpt, archives, name, tmp_path):
    path = archives[name][0]
    ckpt.ok("rewrite", path, tmp_path / "a.pt")
    ckpt.ok("rewrite", tmp_path / "a.pt", tmp_path / "b.pt")
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
    with zipfile.ZipFile(path) as zi, zipfile.ZipFile(tmp_path / "a.pt") as zo:
        assert [i.filename for i in zi.infolist()] == [i.filename for i in zo.infolist()]
        for i, o in zip(zi.infolist(), zo.infolist()):
            assert zi.read(i) == zo.read(o), i.filename
            assert (i.compress_type == 0) == (o.compress_type == 0), i.filename


def test_rewrite_align(ckpt, archives, tmp_path):
    path, _, x = archives["net"]
    out = tmp_path / "al.pt"
    ckpt.ok("rewrite", path, out, "--align", 4096)
    for t in ckpt.json("ls", "--json", out)["tensors"]:
        assert t["offset"] % 4096 == 0, t
    assert torch.equal(torch.jit.load(str(path))(x), torch.jit.load(str(out))(x))


@pytest.mark.parametrize("name", ["net", "traced", "stateful"])
def test_convert_state_dict_loads_strict(ckpt, archives, name, tmp_path):
    path, eager, x = archives[name]
    out = tmp_path / "sd.pt"
    ckpt.ok("convert", path, out)
    sd = helpers.torch_load(str(out))
    fresh = MODELS[name][0]()
    fresh.load_state_dict(sd, strict=True)
    for k, v in eager.state_dict().items():
        assert torch.equal(sd[k], v), k
    with torch.no_grad():
        assert torch.allclose(fresh(x), torch.jit.load(str(path))(x))


def _read_safetensors(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32"
        b, e = v["data_offsets"]
        out[k] = torch.from_numpy(np.frombuffer(data[b:e], dtype="<f4").copy()).reshape(v["shape"])
    return out


def test_convert_safetensors_and_tensorizer(ckpt, archives, tmp_path):
    path, eager, _ = archives["net"]
    ckpt.ok("convert", path, tmp_path / "w.safetensors")
    st = _read_safetensors(tmp_path / "w.safetensors")
    MODELS["net"][0]().load_state_dict(st, strict=True)
    ckpt.ok("convert", path, tmp_path / "w.tensors")
    names = {t["name"] for t in ckpt.json("ls", "--json", tmp_path / "w.tensors")["tensors"]}
    assert names == set(eager.state_dict())


def test_extract_state_dict(ckpt, archives, tmp_path):
    path, eager, _ = archives["traced"]
    ckpt.ok("extract", path, tmp_path / "x")
    index = json.loads((tmp_path / "x" / "index.json").read_text())
    got = {t["name"]: np.load(tmp_path / "x" / t["file"]) for t in index["tensors"]}
    assert set(got) == set(eager.state_dict())
    for k, v in eager.state_dict().items():
        assert np.array_equal(got[k], v.numpy()), k


def test_bytecode_noted(ckpt, archives, tmp_path):
    m = torch.jit.script(Stateful())
    lite = tmp_path / "lite.ptl"
    m._save_for_lite_interpreter(str(lite))
    info = ckpt.ok("info", lite).stdout
    assert "bytecode" in info
    assert set(_ls(ckpt, lite)) == {"w"}


def test_bad_archives(ckpt, archives, tmp_path):
    path = archives["net"][0]
    # No constants.pkl (code/ still there).
    bad = tmp_path / "noconst.pt"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(bad, "w") as zout:
        for i in zin.infolist():
            if not i.filename.endswith("constants.pkl"):
                zout.writestr(i.filename, zin.read(i), compress_type=i.compress_type)
    assert "constants.pkl" in one_error_line(ckpt.run("ls", bad))
    # A corrupt deflate stream in a code record.
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("net/code/__torch__/test_torchscript.py")
    assert info.compress_type == zipfile.ZIP_DEFLATED
    local_extra = struct.unpack("<H", raw[info.header_offset + 28:info.header_offset + 30])[0]
    start = info.header_offset + 30 + len(info.filename) + local_extra
    raw[start:start + info.compress_size] = b"\xff" * info.compress_size
    bad2 = tmp_path / "badz.pt"
    bad2.write_bytes(bytes(raw))
    one_error_line(ckpt.run("ls", bad2))
    # rewrite/code of a plain torch.save file: a clear error, not a crash.
    plain = tmp_path / "plain.pt"
    torch.save({"a": torch.ones(2)}, plain)
    assert "not a TorchScript archive" in one_error_line(ckpt.run("rewrite", plain, tmp_path / "o.pt"))
