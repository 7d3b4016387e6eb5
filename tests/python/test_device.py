"""map_location / device: CUDA tensors handed over through DLPack, and the refusals.

Without a usable GPU (CI, the build machines) a CUDA load raises ckpt.UnsupportedError naming
the device and what is missing, for ckpt.load, load_file and safe_open alike; forms ckpt does not
load into are InvalidArgumentError. With one (the lent GPU machine, tests/gpu/run.sh), every
tensor of a training checkpoint (shared storages, views, Parameters, dtypes DLPack lacks) equals
torch.load(map_location="cuda")'s, on that device, and load_file/safe_open equal safetensors'.
"""

import collections

import pytest

import ckpt

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("device")
    g = torch.Generator().manual_seed(3)
    lin = torch.nn.Linear(48, 40)
    w = torch.randn(64, 48, generator=g)
    sd = collections.OrderedDict(
        weight=torch.nn.Parameter(w),
        view=w[3:9, 5:],                     # a strided view of the same storage
        tied=w,                              # the same storage again
        half=torch.randn(17, 3, generator=g).half(),
        bf16=torch.randn(5, 5, generator=g).bfloat16(),
        flags=torch.rand(33, generator=g) > 0.5,   # bool
        steps=torch.arange(7, dtype=torch.int64),
        empty=torch.zeros(0, 4),
        lin=lin.state_dict(),
    )
    obj = {"model": sd, "epoch": 3, "optimizer": torch.optim.AdamW(lin.parameters()).state_dict()}
    pt = str(d / "train.pt")
    torch.save(obj, pt)
    flat = {k: v.detach().clone().contiguous() for k, v in sd.items() if torch.is_tensor(v)}
    flat.pop("empty")
    st = None
    try:
        from safetensors.torch import save_file
        st = str(d / "m.safetensors")
        save_file(flat, st)
    except ImportError:
        pass
    return pt, st


@pytest.mark.skipif(CUDA, reason="a CUDA device is usable here")
@pytest.mark.parametrize("loc", ["cuda", "cuda:0", 0, "cuda:3"])
def test_without_a_gpu_cuda_is_unsupported(files, loc):
    with pytest.raises(ckpt.UnsupportedError) as e:
        ckpt.load(files[0], map_location=loc)
    assert "cuda:" in str(e.value)
    with pytest.raises(ckpt.UnsupportedError):
        ckpt.load_file(files[0], device=loc)
    with pytest.raises(ckpt.UnsupportedError):
        ckpt.safe_open(files[0], device=loc).get_tensor("model.steps")
    with pytest.raises(ckpt.UnsupportedError):
        ckpt.load(files[0], map_location=torch.device("cuda"))


def test_forms_ckpt_does_not_load_into(files):
    for loc in ("cuda:x", "gpu", {"cpu": "gpu"}):
        with pytest.raises(ckpt.InvalidArgumentError):
            ckpt.load(files[0], map_location=loc)
    with pytest.raises(ckpt.InvalidArgumentError):
        ckpt.safe_open(files[0], framework="np", device="cuda")
    # Every form of the CPU still works.
    for loc in (None, "cpu", torch.device("cpu"), {"cuda:0": "cpu"}):
        assert torch.equal(ckpt.load(files[0], map_location=loc)["model"]["steps"],
                           torch.arange(7))


def walk(a, b, path=""):
    """Asserts that b (ckpt's) equals a (torch's), tensors on the same device."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b), path
        assert b.device == a.device, (path, b.device, a.device)
        assert b.dtype == a.dtype and b.shape == a.shape and b.stride() == a.stride(), path
        assert type(b) is type(a), path
        assert torch.equal(b.cpu(), a.cpu()), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            walk(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.skipif(not CUDA, reason="no CUDA device here")
@pytest.mark.parametrize("loc", ["cuda", "cuda:0", torch.device("cuda:0"), 0, {"cpu": "cuda:0"}])
def test_cuda_tensors_equal_torch_load(files, loc):
    ref = torch.load(files[0], map_location="cuda:0", weights_only=False)
    got = ckpt.load(files[0], map_location=loc)
    walk(ref, got)
    m = got["model"]
    # Storages shared in the file stay shared on the device.
    assert m["view"].untyped_storage().data_ptr() == m["weight"].untyped_storage().data_ptr()
    assert m["tied"].untyped_storage().data_ptr() == m["weight"].untyped_storage().data_ptr()
    assert isinstance(m["weight"], torch.nn.Parameter)


@pytest.mark.skipif(not CUDA, reason="no CUDA device here")
def test_cuda_load_file_and_safe_open(files):
    if files[1] is None:
        pytest.skip("no safetensors here")
    from safetensors.torch import load_file
    ref = load_file(files[1], device="cuda:0")
    got = ckpt.load_file(files[1], device="cuda:0")
    assert list(got) == list(ref)
    for k in ref:
        assert got[k].is_cuda and torch.equal(got[k], ref[k]), k
    with ckpt.safe_open(files[1], framework="pt", device="cuda:0") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            assert t.is_cuda and torch.equal(t, ref[k]), k
        assert torch.equal(f.get_slice("half")[2:5], ref["half"][2:5])
