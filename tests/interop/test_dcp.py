"""torch.distributed.checkpoint (DCP) folders as one checkpoint, through the CLI.

The folders are made in this session by torch itself (dcp_make.py): `torchrun --nproc-per-node 4`
on the CPU (gloo) for DTensor Shard(0)/Shard(1)/Replicate() and an FSDP2 model with its Adam
state, and one process for nested dicts and lists. Every tensor ckpt reads must equal what
torch's dcp_to_torch_save writes for the folder, and a safetensors conversion must equal
safetensors.torch.load_file of that state. The workplace fixture dcp_model (torch 2.11) too.
"""

import os
import shutil

import pytest
import torch

import helpers

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = next((os.path.join(d, "torch2") for d in (
    os.environ.get("CKPT_FIXTURES"),
    os.path.join(HERE, "..", "..", "..", "shared", "fixtures"),
    "/work/shared/fixtures") if d and os.path.isdir(os.path.join(d, "torch2", "dcp_model"))), "")

pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                                reason="DCP folders are made by torch 2.x")
NOT_VERIFIED = 10


NAMES = ["dtensor", "fsdp", "single", "fixture"]


def reference(dcp_dirs, name):
    """dcp_to_torch_save's output, flattened to {dotted name: value}."""
    if name == "fixture":
        path = os.path.join(FIXTURES, "dcp_model_as_torch_save.pt")
    else:
        path = dcp_dirs[name] + ".pt"
    return dict(helpers.flatten(torch.load(path, weights_only=False)))


def folder(dcp_dirs, name):
    if name not in dcp_dirs:
        pytest.skip("the workplace fixture dcp_model is not here")
    return dcp_dirs[name]


@pytest.mark.parametrize("name", NAMES)
def test_ls_names_shapes_dtypes(ckpt, dcp_dirs, name):
    d = folder(dcp_dirs, name)
    ref = {k: v for k, v in reference(dcp_dirs, name).items() if isinstance(v, torch.Tensor)}
    listed = ckpt.json("ls", d, "--json")
    got = {t["name"]: t for t in listed["tensors"]}
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert got[k]["shape"] == list(t.shape), k
        assert got[k]["dtype"] == helpers.dtype_name(t), k


@pytest.mark.parametrize("name", NAMES)
def test_convert_safetensors_equals_dcp_to_torch_save(ckpt, dcp_dirs, name, tmp_path):
    from safetensors.torch import load_file

    d = folder(dcp_dirs, name)
    ref = {k: v for k, v in reference(dcp_dirs, name).items() if isinstance(v, torch.Tensor)}
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", d, out)
    got = load_file(str(out))
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k


@pytest.mark.parametrize("name", ["dtensor", "fsdp", "fixture"])
def test_convert_pt_equals_dcp_to_torch_save(ckpt, dcp_dirs, name, tmp_path):
    """The whole tree, values included (BytesStorageMetadata items come back as their values)."""
    d = folder(dcp_dirs, name)
    out = tmp_path / "out.pt"
    ckpt.ok("convert", d, out)
    got = torch.load(str(out), weights_only=False)
    want = torch.load(dcp_dirs[name] + ".pt" if name != "fixture" else
                      os.path.join(FIXTURES, "dcp_model_as_torch_save.pt"), weights_only=False)
    assert not helpers.compare(got, want)


def test_sharded_safetensors_and_tensorizer(ckpt, dcp_dirs, tmp_path):
    from safetensors.torch import load_file

    d = dcp_dirs["fsdp"]
    ref = {k: v for k, v in reference(dcp_dirs, "fsdp").items() if isinstance(v, torch.Tensor)}
    ckpt.ok("convert", d, tmp_path / "model.safetensors", "--max-shard-size", "1KB")
    got = {}
    for f in sorted(os.listdir(tmp_path)):
        if f.endswith(".safetensors"):
            got.update(load_file(str(tmp_path / f)))
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert torch.equal(got[k], t), k
    ckpt.ok("convert", d, tmp_path / "model.tensors")
    back = tmp_path / "back.safetensors"
    ckpt.ok("convert", tmp_path / "model.tensors", back)
    again = load_file(str(back))
    for k, t in ref.items():
        assert torch.equal(again[k], t), k


@pytest.mark.parametrize("mode", ["eager", "mmap", "stream"])
def test_load_modes(ckpt, dcp_dirs, mode):
    r = ckpt.ok("load", dcp_dirs["dtensor"], "--mode", mode, "--json")
    assert '"tensors"' in r.stdout


def test_verify_says_not_verified(ckpt, dcp_dirs):
    r = ckpt.run("verify", dcp_dirs["dtensor"])
    assert r.returncode == NOT_VERIFIED, r.stderr
    assert "not verified" in r.stderr


def test_info_show_digest_extract(ckpt, dcp_dirs, tmp_path):
    d = dcp_dirs["dtensor"]
    info = ckpt.ok("info", d).stdout
    assert "torch-dcp" in info
    show = ckpt.ok("show", d).stdout
    assert "run-a" in show and "model" in show
    a = ckpt.ok("digest", d).stdout
    ckpt.ok("convert", d, tmp_path / "same.safetensors")
    b = ckpt.ok("digest", tmp_path / "same.safetensors").stdout
    # Same tensors, same digests (the lines name tensor and SHA-256; formats differ).
    lines = lambda s: sorted(l for l in s.splitlines() if "model." in l)  # noqa: E731
    assert [l.split()[-1] for l in lines(a)] == [l.split()[-1] for l in lines(b)]
    ckpt.ok("extract", d, tmp_path / "x")
    ref = reference(dcp_dirs, "dtensor")
    _, header, data = helpers.read_npy(str(tmp_path / "x" / "model.cols.npy"))
    assert header["shape"] == (8, 12)
    assert data == ref["model.cols"].contiguous().numpy().tobytes()


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    for root, _, files in os.walk(dst):
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return dst


def test_missing_data_file_is_named(ckpt, dcp_dirs, tmp_path):
    d = copy_folder(dcp_dirs["dtensor"], tmp_path / "d")
    os.remove(d / "__2_0.distcp")
    r = ckpt.run("ls", d)
    assert r.returncode != 0
    assert "__2_0.distcp" in r.stderr


def test_truncated_data_file_is_named(ckpt, dcp_dirs, tmp_path):
    d = copy_folder(dcp_dirs["dtensor"], tmp_path / "d")
    with open(d / "__1_0.distcp", "r+b") as f:
        f.truncate(100)
    r = ckpt.run("ls", d)
    assert r.returncode != 0
    assert "__1_0.distcp" in r.stderr and "passes the end" in r.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory, dcp_dirs):
    """The four-rank folders under an HTTP prefix (nginx, as tests/interop/test_remote.py)."""
    from test_remote import NGINX, Nginx

    if not os.path.exists(NGINX):
        pytest.skip("nginx is not installed (Debian package nginx)")
    try:
        n = Nginx(str(tmp_path_factory.mktemp("dcp-nginx")))
    except (RuntimeError, OSError) as e:
        pytest.skip(f"nginx cannot run here: {e}")
    for name in ("dtensor", "fsdp"):
        shutil.copytree(dcp_dirs[name], os.path.join(n.www, name))
    yield n
    n.stop()


@pytest.mark.parametrize("name", ["dtensor", "fsdp"])
def test_folder_under_an_http_prefix(ckpt, dcp_dirs, served, name, tmp_path):
    from safetensors.torch import load_file

    ref = reference(dcp_dirs, name)
    out = tmp_path / "out.safetensors"
    ckpt.ok("convert", served.url(name + "/"), out)
    got = load_file(str(out))
    assert sorted(got) == sorted(ref)
    for k, t in ref.items():
        assert torch.equal(got[k], t), k
    r = ckpt.run("ls", served.url("nothing-here/"))
    assert r.returncode == 2 and ".metadata" in r.stderr, r.stderr
