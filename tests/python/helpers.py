"""Deep comparison of what ckpt.load and torch.load return."""

import collections

import torch

_INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}


def bits(t):
    """The tensor as integers of the same width (bit-exact comparison, NaN included)."""
    t = t.detach()
    if t.is_quantized:
        return t.int_repr()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype in _INT_OF:
        return t.view(_INT_OF[t.dtype])
    return t


def _ptr(t):
    try:
        return t.storage().data_ptr() if t.storage().nbytes() else None
    except (RuntimeError, NotImplementedError):
        return None


def assert_same(a, b, path="root", tensors=None):
    """a (ckpt) equals b (torch): types, values, tensor layout; tensors collected in order."""
    if tensors is None:
        tensors = []
        assert_same(a, b, path, tensors)
        # Sharing: two tensors share a storage in one tree iff they do in the other.
        for i in range(len(tensors)):
            for j in range(i + 1, len(tensors)):
                (x1, y1), (x2, y2) = tensors[i], tensors[j]
                pa, pb = _ptr(x1), _ptr(x2)
                qa, qb = _ptr(y1), _ptr(y2)
                same_a = pa is not None and pa == pb
                same_b = qa is not None and qa == qb
                assert same_a == same_b, f"storage sharing differs for tensors {i}, {j}"
                assert (x1 is x2) == (y1 is y2), f"tensor identity differs for {i}, {j}"
        return
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(b, torch.Tensor):
        tensors.append((a, b))
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape"
        assert a.is_quantized == b.is_quantized
        if b.device.type == "meta":
            assert a.device.type == "meta"
            return
        assert a.stride() == b.stride(), f"{path}: strides {a.stride()} != {b.stride()}"
        assert a.storage_offset() == b.storage_offset(), f"{path}: storage offset"
        assert a.storage().nbytes() == b.storage().nbytes(), f"{path}: storage size"
        assert a.requires_grad == b.requires_grad, f"{path}: requires_grad"
        if b.is_quantized:
            assert a.qscheme() == b.qscheme()
            if b.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                assert a.q_scale() == b.q_scale() and a.q_zero_point() == b.q_zero_point()
            else:
                assert torch.equal(a.q_per_channel_scales(), b.q_per_channel_scales())
                assert torch.equal(a.q_per_channel_zero_points(), b.q_per_channel_zero_points())
                assert a.q_per_channel_axis() == b.q_per_channel_axis()
        assert torch.equal(bits(a), bits(b)), f"{path}: values differ"
        return
    if isinstance(b, dict):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for k in b:
            assert_same(a[k], b[k], f"{path}[{k!r}]", tensors)
        if isinstance(b, collections.OrderedDict):
            assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), \
                f"{path}: _metadata"
        return
    if isinstance(b, (list, tuple)):
        assert len(a) == len(b), f"{path}: length"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", tensors)
        return
    if isinstance(b, float) and b != b:
        assert a != a
        return
    assert a == b, f"{path}: {a!r} != {b!r}"
