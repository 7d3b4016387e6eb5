"""The tensors the C++ core leaves to Python: torch tensors (one torch storage per checkpoint
storage, tensors set onto it with their offset, shape and strides, so storages shared in the file
stay shared) or, without torch, numpy arrays.

Storages arrive as ``_ckpt.Span`` objects (a storage's bytes, its device and their owner):
torch takes them through ``torch.from_dlpack`` as bytes (uint8), and each tensor gets its
dtype by being set onto that storage, which also serves the dtypes DLPack has no code for
(bool, float8, complex32, uint16-64, quantized); numpy views them through the buffer protocol.

An eager load runs the builder while its reader threads are still filling the memory
(LoadOptions::on_placed): making tensors over it is fine, reading their bytes is not."""

import collections
import sys

from ._errors import CorruptError, Error, UnsupportedError, error

_NP_TYPES = {
    "float32": "<f4", "float64": "<f8", "float16": "<f2", "complex64": "<c8",
    "complex128": "<c16", "bool": "|b1", "int8": "|i1", "int16": "<i2", "int32": "<i4",
    "int64": "<i8", "uint8": "|u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
}


# torch 2.x deprecated TypedStorage (a warning at first use, per process): tensors' bytes are
# reached through untyped_storage() there, and the TypedStorage that _rebuild_qtensor takes is
# made as torch.load makes it (_internal=True: no warning). torch 1.13 has neither.
_TYPED_STORAGE_KW = {}


def untyped_storage(t):
    """The UntypedStorage behind tensor t, without torch 2.x's TypedStorage warning."""
    f = getattr(t, "untyped_storage", None)
    return f() if f is not None else t.storage().untyped()


def backend():
    """"torch" when torch can be imported, else "numpy"."""
    if "torch" in sys.modules:
        return "torch" if sys.modules["torch"] is not None else "numpy"
    try:
        import torch  # noqa: F401
        return "torch"
    except ImportError:
        return "numpy"


def finish(ck, storages, tensors):
    """Makes the tensors the C++ loop left (None in `tensors`, a list by tensor index) over
    `storages` (a list by storage index: a Span, a tensor made already, or None). Called by the
    C++ load (python/src/load.cc)."""
    Builder(ck, backend(), ck.name, storages, tensors).all()


def from_dlpack():
    """torch.from_dlpack when tensors are torch tensors, else None (numpy)."""
    if backend() != "torch":
        return None
    import torch
    return torch.from_dlpack


class Builder:
    """Makes the tensors of one checkpoint, each storage once."""

    def __init__(self, ck, framework, source_name="", storages=None, tensors=None):
        self.ck = ck
        self.framework = framework
        self._infos = self._sinfos = None  # made when first needed (20,000 tuples: ~6 ms)
        self.source = source_name
        self.meta = False  # every tensor a meta tensor (map_location="meta"): no bytes needed
        self._dtypes = {}
        # storage index -> Span, then its torch tensor / UntypedStorage; None: not loaded
        self.storages = storages if storages is not None else [None] * self.storage_count()
        self.tensors = tensors if tensors is not None else [None] * self.tensor_count()
        if framework == "torch":
            import torch
            self.torch = torch
            if hasattr(torch.Tensor, "untyped_storage"):  # torch 2.x
                _TYPED_STORAGE_KW["_internal"] = True
            used = ck.dtype_names() if hasattr(ck, "dtype_names") else \
                {info[1] for info in self.infos}
            for dt in used:
                d = getattr(torch, dt, None)
                if isinstance(d, torch.dtype):
                    self._dtypes[dt] = d
        else:
            import numpy
            self.np = numpy

    @property
    def infos(self):
        if self._infos is None:
            self._infos = self.ck.tensor_infos()
        return self._infos

    @property
    def sinfos(self):
        if self._sinfos is None:
            self._sinfos = self.ck.storage_infos()
        return self._sinfos

    def tensor_count(self):
        return self.ck.tensor_count() if self._infos is None and \
            hasattr(self.ck, "tensor_count") else len(self.infos)

    def storage_count(self):
        return self.ck.storage_count() if self._sinfos is None and \
            hasattr(self.ck, "storage_count") else len(self.sinfos)

    def all(self):
        """Every tensor, as a list in table order (quantization parameters first)."""
        n = len(self.tensors)
        if self.framework == "torch" and not self.meta:
            self._shared_tensors()
        order = [i for i in range(n) if self.tensors[i] is None and self.infos[i][8] is None] + \
                [i for i in range(n) if self.tensors[i] is None and self.infos[i][8] is not None]
        for i in order:
            self.tensor(i)
        return self.tensors

    def _shared_tensors(self):
        # Plain tensors over a storage whose first tensor exists already (views, tied weights):
        # set_ onto its storage, inlined (a file may have many). The rest goes to tensor().
        torch = self.torch
        empty, Tensor = torch.empty, torch.Tensor
        tensors, storages, dtypes = self.tensors, self.storages, self._dtypes
        for i, t in enumerate(tensors):
            if t is not None:
                continue
            name, dt, shape, strides, offset, si, rg, is_param, q = self.infos[i][:9]
            s = storages[si]
            if q is not None or rg or is_param or not isinstance(s, Tensor) or \
                    s.dtype is not dtypes.get(dt):
                continue
            try:
                tensors[i] = empty(0, dtype=s.dtype, device=s.device).set_(s).as_strided_(
                    shape, strides, offset)
            except RuntimeError:
                pass  # tensor() reports it

    def need_storages(self, indices):
        """Storage indices (not yet made) that tensors `indices` need, qparams included."""
        need = set()
        for i in indices:
            info = self.infos[i]
            need.add(info[5])
            q = info[8]
            if q is not None:
                for j in (q[4], q[5]):
                    if j is not None:
                        need.add(self.infos[j][5])
        return sorted(s for s in need if self.storages[s] is None and not self.sinfos[s][3])

    def tensor(self, i):
        t = self.tensors[i]
        if t is None:
            try:
                t = self._torch_tensor(i) if self.framework == "torch" else self._np_array(i)
            except Error:
                raise  # ckpt's own (UnsupportedError is a RuntimeError too)
            except (RuntimeError, ValueError, TypeError) as e:
                # The library checked the layout already; anything torch or numpy still refuses
                # is reported as the file's fault, naming the tensor.
                raise error(CorruptError, f"tensor cannot be made: {e}", self.source,
                            self.infos[i][0]) from None
            self.tensors[i] = t
        return t

    def _torch_tensor(self, i):
        torch = self.torch
        name, dt, shape, strides, offset, si, rg, is_param, q = self.infos[i][:9]
        dtype = self._dtypes.get(dt)
        if dtype is None:
            dtype = getattr(torch, dt, None)
            self._dtypes[dt] = dtype
        if not isinstance(dtype, torch.dtype) and self.infos[i][9] == "numpy" and dt in _NP_TYPES:
            return self._numpy_over_torch(si, dt, shape, strides, offset)
        if not isinstance(dtype, torch.dtype):
            raise error(UnsupportedError, f"dtype {dt} does not exist in this torch "
                        f"({torch.__version__})", self.source, name)
        if self.sinfos[si][3] or self.meta:  # meta: shape and dtype only
            t = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
        elif q is not None:
            scheme, scale, zp, axis, scales_i, zps_i = q
            storage = torch.storage.TypedStorage(wrap_storage=self._untyped(si), dtype=dtype,
                                                 **_TYPED_STORAGE_KW)
            qscheme = getattr(torch, scheme)
            if scales_i is not None:
                params = (qscheme, self.tensor(scales_i), self.tensor(zps_i), axis)
            else:
                params = (qscheme, scale, zp)
            t = torch._utils._rebuild_qtensor(storage, offset, shape, strides, params, False,
                                              collections.OrderedDict())
        else:
            t = self._plain(si, dtype, shape, strides, offset)
        if is_param:
            return torch.nn.Parameter(t, requires_grad=rg)
        if rg:
            t.requires_grad_(True)
        return t

    def _numpy_over_torch(self, si, dt, shape, strides, offset):
        """A numpy array pickled by numpy whose dtype this torch lacks (uint16-64 before torch
        2.3): made as numpy makes it; the tree then gives it back as the array it was."""
        import numpy as np
        torch = self.torch
        s = self.storages[si]
        if self.meta or s is None:  # the tree gives the array back from the pickle's bytes
            return np.zeros(tuple(shape), dtype=_NP_TYPES[dt])
        if isinstance(s, torch.Tensor):
            s = untyped_storage(s)
        if isinstance(s, torch.UntypedStorage):
            raw = torch.tensor([], dtype=torch.uint8, device=s.device).set_(s).cpu().numpy()
        elif s.__dlpack_device__()[0] == 1:  # a host Span: its buffer
            raw = np.frombuffer(s, dtype=np.uint8) if len(s) else np.zeros(0, np.uint8)
        else:  # device memory (a GPU load): numpy arrays stay in host memory, as torch.load's
            raw = torch.from_dlpack(s).cpu().numpy()
        t = np.dtype(_NP_TYPES[dt])
        return np.ndarray(tuple(shape), dtype=t, buffer=raw, offset=offset * t.itemsize,
                          strides=tuple(x * t.itemsize for x in strides))

    def _untyped(self, si):
        """The torch UntypedStorage of storage si (made once; tensors share it)."""
        s = self.storages[si]
        if isinstance(s, self.torch.Tensor):
            return untyped_storage(s)
        if isinstance(s, self.torch.UntypedStorage):
            return s
        torch = self.torch
        # The Span's bytes as uint8 (DLPack), whatever the tensors' dtypes.
        if len(s):
            u = untyped_storage(torch.from_dlpack(s))
        else:  # an empty storage, on the Span's device
            kind, index = s.__dlpack_device__()
            u = torch.UntypedStorage(0, device="cpu" if kind == 1 else f"cuda:{index}")
        self.storages[si] = u
        return u

    def _plain(self, si, dtype, shape, strides, offset):
        torch = self.torch
        s = self.storages[si]
        if isinstance(s, torch.Tensor) and s.dtype == dtype:
            src = s.detach() if s.requires_grad else s
            return torch.empty(0, dtype=dtype, device=s.device).set_(src).as_strided_(
                shape, strides, offset)
        u = self._untyped(si)
        return torch.tensor([], dtype=dtype, device=u.device).set_(u, offset, shape, strides)

    def _np_array(self, i):
        np = self.np
        name, dt, shape, strides, offset, si, rg, is_param, q = self.infos[i][:9]
        code = _NP_TYPES.get(dt)
        if code is None or q is not None:
            raise error(UnsupportedError, f"dtype {dt} has no numpy equivalent (install torch "
                        "to load it)", self.source, name)
        t = np.dtype(code)
        if self.sinfos[si][3]:
            return np.zeros(shape, dtype=t)
        item = t.itemsize
        return np.ndarray(tuple(shape), dtype=t, buffer=self.storages[si], offset=offset * item,
                          strides=tuple(s * item for s in strides))
