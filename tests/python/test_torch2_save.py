"""ckpt.save's files load in the torch that runs the suite with weights_only=True, for every dtype
torch itself saves (torch 2.x: float8, float4, uint16-64 and complex32 included), and
ckpt.save_file's safetensors files load in safetensors.torch where it is installed."""

import io

import pytest

torch = pytest.importorskip("torch")
import ckpt  # noqa: E402

NAMES = ["float32", "float64", "float16", "bfloat16", "complex64", "complex128", "complex32", "bool",
         "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float8_e4m3fn",
         "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"]


def _torch_saves(name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        return False
    try:
        torch.save(torch.zeros(16, dtype=torch.uint8).view(dt) if dt is not torch.bool
                   else torch.zeros(2, dtype=torch.bool), io.BytesIO())
        return True
    except Exception:  # noqa: BLE001 - torch 1.13 cannot save complex32
        return False


DTYPES = [n for n in NAMES if _torch_saves(n)]


def _tensor(name, n):
    dt = getattr(torch, name)
    if dt is torch.bool:
        return torch.arange(n) % 3 == 0
    itemsize = torch.empty(0, dtype=dt).element_size()
    raw = (torch.arange(n * itemsize) * 37 % 251).to(torch.uint8)
    if dt.is_floating_point and itemsize >= 2:
        return torch.linspace(-3, 3, n).to(dt)
    return raw.view(dt)


def _bits(t):
    return t.reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("name", DTYPES)
def test_save_loads_weights_only(tmp_path, name):
    base = _tensor(name, 12).reshape(3, 4)
    sd = {"w": base, "row": base[1], "tied": base, "step": 3}
    path = tmp_path / "x.pt"
    ckpt.save(sd, str(path))
    got = torch.load(path, weights_only=True)
    assert got["step"] == 3
    for k in ("w", "row", "tied"):
        assert got[k].dtype == sd[k].dtype and got[k].shape == sd[k].shape, k
        assert torch.equal(_bits(got[k].contiguous()), _bits(sd[k].contiguous())), k
    assert got["tied"] is got["w"]
    # ckpt reads its own file back the same way.
    back = ckpt.load(str(path), strict=True)
    assert torch.equal(_bits(back["w"]), _bits(base))


@pytest.mark.parametrize("name", DTYPES)
def test_save_file_loads_in_safetensors(tmp_path, name):
    st = pytest.importorskip("safetensors.torch")
    codes = {v: k for k, v in st._TYPES.items() if v is not None}
    dt = getattr(torch, name)
    if dt not in codes:
        pytest.skip(f"safetensors.torch has no code for {name}")
    t = _tensor(name, 12).reshape(4, 3)
    path = tmp_path / "x.safetensors"
    ckpt.save_file({"t": t}, str(path), metadata={"k": "v"})
    got = st.load_file(str(path))
    assert torch.equal(_bits(got["t"]), _bits(t)) and got["t"].dtype == dt
    with st.safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"k": "v"}
