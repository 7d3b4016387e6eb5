"""Tensors from the buffers the C++ core hands over: torch tensors (one torch storage per
checkpoint storage, tensors set onto it with their offset, shape and strides, so storages shared
in the file stay shared) or, without torch, numpy arrays.

An eager load runs the builder while its reader threads are still filling the buffers
(LoadOptions::on_placed): making tensors over them is fine, reading their bytes is not."""

import collections
import sys

from . import _ckpt
from ._errors import CorruptError, UnsupportedError, error

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


class Builder:
    """Makes the tensors of one checkpoint, each storage once."""

    def __init__(self, ck, framework, source_name=""):
        self.ck = ck
        self.framework = framework
        self._infos = self._sinfos = None  # made when first needed (20,000 tuples: ~6 ms)
        self.source = source_name
        self._dtypes = {}
        self._sizes = {}
        self._storages = {}  # storage index -> buffer, then torch tensor / UntypedStorage
        self._bufs = None  # the buffers of add_buffers, by index, until `storages` is needed
        self.tensors = [None] * self.tensor_count()  # made when first asked for
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

    def from_dlpack(self):
        """torch._C._from_dlpack (tensors over our memory, module.cc), or None (numpy; a torch
        without it)."""
        if self.framework != "torch" or not isinstance(self.ck, _ckpt.Checkpoint):
            return None
        return getattr(self.torch._C, "_from_dlpack", None)

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

    @property
    def storages(self):
        """storage index -> buffer (then its torch tensor / UntypedStorage once made)."""
        if self._bufs is not None:
            bufs, self._bufs = self._bufs, None
            self._storages = {i: b for i, b in enumerate(bufs) if b is not None}
        return self._storages

    def add_buffers(self, bufs):
        if self._bufs is None and not self._storages:
            # Kept as the list (index -> buffer or None): plain_tensors takes it as it is, and
            # the dict is made only if some tensor is left for tensor() (~1.5 ms per 20,000).
            self._bufs = bufs if type(bufs) is list else list(bufs)
            return
        for i, b in enumerate(bufs):
            if b is not None and i not in self.storages:
                self.storages[i] = self._storage(b)

    def _storage(self, b):
        # torch: the buffer itself; the first tensor made over it creates its torch storage
        # (_torch_tensor), so that the common one-tensor-per-storage case costs one frombuffer.
        return b

    def all(self):
        """Every tensor, as a list in table order (quantization parameters first)."""
        n = len(self.tensors)
        made = self._plain_tensors() if self.framework == "torch" else 0
        if made < n:
            order = [i for i in range(n) if self.infos[i][8] is None] + \
                    [i for i in range(n) if self.infos[i][8] is not None]
            for i in order:
                self.tensor(i)
        return self.tensors

    def _plain_tensors(self):
        # The common case (a plain tensor over a storage's buffer) inlined: on a file of many
        # small tensors this loop is most of the Python side's time. The rest goes to tensor().
        torch = self.torch
        frombuffer, empty, Tensor = torch.frombuffer, torch.empty, torch.Tensor
        tensors = self.tensors
        # dtype name -> (torch dtype, element size), looked up once per dtype, not per tensor
        dtypes = {}
        for dt, d in self._dtypes.items():
            if dt.startswith("q"):
                continue  # quantized (qint8...): tensor() makes them
            try:
                dtypes[dt] = (d, self._itemsize(d))
            except RuntimeError:
                pass  # tensor() makes (or reports) them
        made = 0
        if isinstance(self.ck, _ckpt.Checkpoint):
            # The same loop in C++ (module.cc plain_tensors), for tensors that are the first of
            # their storage; this one makes what it left (shared storages...).
            made = _ckpt.plain_tensors(
                self.ck, self._bufs if self._bufs is not None else self._storages, tensors,
                dtypes, frombuffer, self.from_dlpack())
            if made == len(tensors):
                return made
        storages, sinfos = self.storages, self.sinfos
        for i, (name, dt, shape, strides, offset, si, rg, is_param, q, _, dense) in \
                enumerate(self.infos):
            if q is not None or tensors[i] is not None or rg or is_param or sinfos[si][3]:
                continue
            ds = dtypes.get(dt)
            if ds is None:
                continue
            dtype, size = ds
            s = storages[si]
            if isinstance(s, Tensor):
                if s.dtype is not dtype:
                    continue
                try:
                    t = empty(0, dtype=dtype).set_(s).as_strided_(shape, strides, offset)
                except RuntimeError:
                    continue  # tensor() reports it
            else:
                n = len(s)
                if not n or n % size:
                    continue
                t = frombuffer(s, dtype=dtype)
                try:
                    if not dense:
                        t.as_strided_(shape, strides, offset)
                    elif len(shape) != 1 or shape[0] * size != n:
                        t.resize_(shape)  # contiguous from offset 0: cheaper than as_strided_
                except RuntimeError:
                    continue  # tensor() reports it
                storages[si] = t
            tensors[i] = t
            made += 1
        return made

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
        return sorted(s for s in need if s not in self.storages and not self.sinfos[s][3])

    def tensor(self, i):
        t = self.tensors[i]
        if t is None:
            try:
                t = self._torch_tensor(i) if self.framework == "torch" else self._np_array(i)
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
        if not isinstance(dtype, torch.dtype):
            raise error(UnsupportedError, f"dtype {dt} does not exist in this torch "
                        f"({torch.__version__})", self.source, name)
        if self.sinfos[si][3]:  # meta: shape and dtype only
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

    def _untyped(self, si):
        """The torch UntypedStorage of storage si (made once; tensors share it)."""
        s = self.storages[si]
        if isinstance(s, self.torch.Tensor):
            return untyped_storage(s)
        if isinstance(s, self.torch.UntypedStorage):
            return s
        torch = self.torch
        u = untyped_storage(torch.frombuffer(s, dtype=torch.uint8)) if len(s) else \
            torch.UntypedStorage(0)
        self.storages[si] = u
        return u

    def _itemsize(self, dtype):
        n = self._sizes.get(dtype)
        if n is None:
            n = self._sizes[dtype] = self.torch.empty(0, dtype=dtype).element_size()
        return n

    def _plain(self, si, dtype, shape, strides, offset):
        torch = self.torch
        s = self.storages[si]
        if not isinstance(s, (torch.Tensor, torch.UntypedStorage)) and len(s) and \
                len(s) % self._itemsize(dtype) == 0:
            # First tensor of this storage: a tensor over the buffer, re-shaped in place (a leaf,
            # not a view). Later tensors of the storage share its StorageImpl through set_.
            t = torch.frombuffer(s, dtype=dtype)
            self.storages[si] = t
            return t.as_strided_(shape, strides, offset)
        if isinstance(s, torch.Tensor) and s.dtype == dtype:
            src = s.detach() if s.requires_grad else s
            return torch.empty(0, dtype=dtype).set_(src).as_strided_(shape, strides, offset)
        return torch.tensor([], dtype=dtype).set_(self._untyped(si), offset, shape, strides)

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
