"""ckpt.load_into: a checkpoint copied into a module's existing tensors, in place.

On the CPU (here) and, with a usable GPU (tests/gpu/run.sh), into CUDA tensors: the storages
(data_ptr) are the same before and after, tied weights stay tied, the values equal
load_state_dict(torch.load(...)), strict behaves like load_state_dict, and a bad shape or dtype
is refused before any byte is read. Also "cuda" meaning torch's current device, and the current
device left as the caller set it.
"""

import pytest

import ckpt

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.lin = torch.nn.Linear(16, 24)
        self.norm = torch.nn.LayerNorm(24)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("steps", torch.tensor(7, dtype=torch.int64))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("load_into")
    torch.manual_seed(5)
    src = Net()
    pt = d / "m.pt"
    torch.save(src.state_dict(), pt)
    st = d / "m.safetensors"
    sd = {k: v.contiguous() for k, v in src.state_dict().items() if k != "head.weight"}
    safetensors_torch.save_file(sd, str(st))
    return src, pt, st


def ptrs(m):
    return {k: v.data_ptr() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_equals_load_state_dict(files, device):
    src, pt, _ = files
    torch.manual_seed(9)
    m = Net().to(device)
    before = ptrs(m)
    missing, unexpected = ckpt.load_into(m, pt)
    assert (missing, unexpected) == ([], [])
    assert ptrs(m) == before  # the same storages
    assert m.head.weight is m.emb.weight  # still tied
    ref = Net().to(device)
    ref.load_state_dict(torch.load(pt, map_location=device))
    for k, v in ref.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k


def test_a_state_dict_and_safetensors(files):
    src, _, st = files
    m = Net()
    sd = {k: v for k, v in m.state_dict().items() if k != "head.weight"}
    out = ckpt.load_into(sd, st)
    assert out.missing_keys == [] and out.unexpected_keys == []
    assert torch.equal(m.lin.weight, src.lin.weight)


def test_strict_like_load_state_dict(files):
    _, pt, _ = files
    m = Net()
    m.extra = torch.nn.Linear(2, 2)
    with pytest.raises(ckpt.InvalidArgumentError, match="extra.weight"):
        ckpt.load_into(m, pt)
    missing, unexpected = ckpt.load_into(m, pt, strict=False)
    assert missing == ["extra.weight", "extra.bias"] and unexpected == []


def test_shape_and_dtype_refused_before_any_read_cast_on_request(files):
    _, pt, _ = files
    m = Net()
    m.lin = torch.nn.Linear(16, 25)
    w = m.emb.weight.detach().clone()
    with pytest.raises(ckpt.InvalidArgumentError, match="size mismatch for lin.weight"):
        ckpt.load_into(m, pt)
    assert torch.equal(m.emb.weight, w)  # nothing was read
    m = Net().half()
    with pytest.raises(ckpt.InvalidArgumentError, match="dtype mismatch"):
        ckpt.load_into(m, pt)
    ptr = m.lin.weight.data_ptr()
    ckpt.load_into(m, pt, cast=True)
    assert m.lin.weight.dtype == torch.float16 and m.lin.weight.data_ptr() == ptr
    assert torch.equal(m.lin.weight, files[0].lin.weight.half())


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_is_the_current_device_and_the_device_is_restored(files):
    _, pt, _ = files
    last = torch.cuda.device_count() - 1
    torch.cuda.set_device(last)
    try:
        sd = ckpt.load(pt, map_location="cuda")
        assert sd["lin.weight"].device == torch.device("cuda", last)
        assert torch.cuda.current_device() == last
        ckpt.load(pt, map_location="cuda:0")
        assert torch.cuda.current_device() == last
    finally:
        torch.cuda.set_device(0)
