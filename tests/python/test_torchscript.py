"""TorchScript archives through ckpt.load: what torch 2.11 writes (the shared fixtures, made on
another machine) and what the running torch writes, scripted and traced, and quantized Linear
modules' packed parameters (their weights are no parameter or buffer of the scripted module).

The fixtures are $CKPT_FIXTURES/torch2, else <repo>/../shared/fixtures/torch2 (beside the
checkout), else /work/shared/fixtures/torch2; the tests that need them skip without them."""

import collections
import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
import ckpt  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = next((os.path.join(d, "torch2") for d in (
    os.environ.get("CKPT_FIXTURES"), os.path.join(REPO, "..", "shared", "fixtures"),
    "/work/shared/fixtures") if d and os.path.isdir(os.path.join(d, "torch2"))), "")
TS211 = ["ts211_linear", "ts211_convbn", "ts211_traced", "ts211_extra", "ts211_dynquant"]
needs_fixtures = pytest.mark.skipif(not os.path.isfile(os.path.join(FIXTURES, "ts211_linear.pt")),
                                    reason=f"torch 2.11 fixtures not found in {FIXTURES} "
                                           "(set CKPT_FIXTURES)")


def fixture(name):
    return os.path.join(FIXTURES, name + ".pt")


def jit_state_dict(path):
    """torch.jit.load(path).state_dict(), or None where this torch cannot load the archive
    (torch 1.13 and some operators of later versions)."""
    try:
        return torch.jit.load(path).state_dict()
    except RuntimeError:
        return None


def bits(t):
    t = t.detach()
    if t.is_quantized:
        return t.int_repr()
    return t.view(torch.int16) if t.element_size() == 2 and t.is_floating_point() else t


def assert_value(a, b, path):
    """ckpt's value `a` equals torch's `b`: a Parameter may come back as a tensor with
    requires_grad (a TorchScript archive does not say Parameter); else type, dtype, shape,
    strides, requires_grad, quantization and bits."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), path
        if type(b) is not torch.nn.Parameter:
            assert type(a) is type(b), path
        assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride()), path
        assert a.requires_grad == b.requires_grad, path
        if b.is_quantized:
            assert (a.qscheme(), a.q_scale(), a.q_zero_point()) == \
                (b.qscheme(), b.q_scale(), b.q_zero_point()), path
        assert torch.equal(bits(a), bits(b)), path
    elif isinstance(b, tuple):
        assert type(a) is tuple and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_value(x, y, f"{path}[{i}]")
    else:
        assert type(a) is type(b) and a == b, (path, a, b)


def assert_state_dict(got, ref):
    assert isinstance(got, collections.OrderedDict)
    assert list(got) == list(ref)
    for k in ref:
        assert_value(got[k], ref[k], k)
    # The versions load_state_dict needs for packed layouts (ckpt gives only those).
    for m, v in getattr(got, "_metadata", {}).items():
        assert ref._metadata[m] == v, m


@needs_fixtures
@pytest.mark.parametrize("name", TS211)
@pytest.mark.parametrize("mmap", [False, True])
def test_torch211_archives(name, mmap):
    """Archives torch 2.11 wrote load (a scripted Linear once crashed the interpreter under
    torch 2.11) and equal torch.jit.load's state dict where this torch loads them."""
    got = ckpt.load(fixture(name), mmap=mmap)
    assert isinstance(got, collections.OrderedDict)
    if name == "ts211_dynquant":
        return  # test_dynquant_fixture
    ref = jit_state_dict(fixture(name))
    if ref is not None:
        assert_state_dict(got, ref)
    want = {"ts211_linear": ["weight", "bias"], "ts211_extra": ["weight", "bias"],
            "ts211_traced": ["0.weight", "0.bias"],
            "ts211_convbn": ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                             "1.running_var", "1.num_batches_tracked"]}[name]
    assert list(got) == want
    assert not any(v.requires_grad for v in got.values())  # detached, as state_dict() gives


@needs_fixtures
def test_dynquant_fixture():
    """A dynamically quantized Linear scripted by torch 2.11: its packed weight and bias, dtype,
    scale and zero point, as the quantized module's state_dict() holds them, equal to what
    torch.jit.load's module unpacks (torch.jit.load(...).state_dict() itself is empty: the
    scripted module has no parameters or buffers)."""
    p = fixture("ts211_dynquant")
    got = ckpt.load(p)
    assert list(got) == ["0.scale", "0.zero_point", "0._packed_params.dtype",
                         "0._packed_params._packed_params"]
    assert got["0._packed_params.dtype"] is torch.qint8
    w, b = got["0._packed_params._packed_params"]
    assert w.dtype == torch.qint8 and w.shape == (8, 16) and b.shape == (8,) and b.requires_grad
    assert got["0.scale"].dtype == torch.float32 and got["0.scale"].item() == 1.0
    assert got["0.zero_point"].dtype == torch.int64 and got["0.zero_point"].item() == 0
    try:
        m = torch.jit.load(p)
    except RuntimeError:
        return  # this torch cannot load it
    assert len(m.state_dict()) == 0
    lin = getattr(m, "0")
    assert_value(got["0._packed_params._packed_params"], lin._packed_params._weight_bias(),
                 "packed")
    assert lin._packed_params.dtype == 12  # c10::ScalarType::QInt8
    assert got["0.scale"].item() == lin.scale and got["0.zero_point"].item() == lin.zero_point
    # The eager quantized module takes the state dict and computes what the archive computes.
    q = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(16, 8)),
                                               {torch.nn.Linear}, dtype=torch.qint8)
    q.load_state_dict(got)
    x = torch.randn(5, 16)
    assert torch.equal(q(x), m(x))


def _quantized_models():
    lin = torch.nn.Linear
    yield "dynamic_qint8", lambda: torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(lin(16, 8), torch.nn.ReLU(), torch.nn.LayerNorm(8), lin(8, 4)),
        {lin}, dtype=torch.qint8)
    yield "dynamic_float16", lambda: torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(lin(16, 8), torch.nn.LayerNorm(8)), {lin}, dtype=torch.float16)
    yield "dynamic_no_bias", lambda: torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(lin(6, 2, bias=False)), {lin}, dtype=torch.qint8)
    yield "static", lambda: torch.nn.Sequential(torch.ao.nn.quantized.Linear(4, 3), lin(3, 2))


@pytest.mark.parametrize("kind", [k for k, _ in _quantized_models()])
def test_quantized_linear_state_dict(tmp_path, kind):
    """Quantized Linear modules scripted by this torch: ckpt.load of the archive equals the
    state_dict() of the module that was scripted (keys in its order, packed weights bit for bit)
    and loads back into it."""
    torch.manual_seed(3)
    try:
        q = dict(_quantized_models())[kind]()
    except RuntimeError as e:  # fp16 packing needs fbgemm (torch 1.13 on this CPU: onednn)
        pytest.skip(f"this torch cannot make it: {e}")
    p = tmp_path / "q.pt"
    torch.jit.script(q).save(str(p))
    ref = q.state_dict()
    for mmap in (False, True):
        assert_state_dict(ckpt.load(p, mmap=mmap), ref)
    torch.manual_seed(4)
    fresh = dict(_quantized_models())[kind]()
    fresh.load_state_dict(ckpt.load(p))
    x = torch.randn(3, q[0].in_features if hasattr(q[0], "in_features") else 4)
    if kind == "static":
        x = torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
        assert torch.equal(fresh[0](x).int_repr(), q[0](x).int_repr())
    else:
        assert torch.equal(fresh(x), q(x))


def test_scripted_and_traced_modules(tmp_path):
    """Modules this torch scripts and traces: what torch.jit.load's state_dict() holds."""
    torch.manual_seed(5)
    mods = {
        "linear": torch.jit.script(torch.nn.Linear(3, 2)),
        "no_bias": torch.jit.script(torch.nn.Linear(3, 2, bias=False)),
        "half": torch.jit.script(torch.nn.Linear(3, 2).half()),
        "bfloat16": torch.jit.script(torch.nn.Linear(3, 2).to(torch.bfloat16)),
        "empty": torch.jit.script(torch.nn.Linear(0, 2)),
        "lstm": torch.jit.script(torch.nn.LSTM(4, 5, 2)),
        "traced": torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()),
                                  torch.randn(2, 8)),
        "frozen": torch.jit.freeze(torch.jit.script(torch.nn.Sequential(
            torch.nn.Linear(4, 4), torch.nn.ReLU()).eval())),
    }
    for name, m in mods.items():
        p = tmp_path / f"{name}.pt"
        m.save(str(p))
        ref = torch.jit.load(str(p)).state_dict()
        for mmap in (False, True):
            assert_state_dict(ckpt.load(p, mmap=mmap), ref)
