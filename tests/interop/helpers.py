"""Parsing and comparison helpers for the ckpt interop tests.

Nothing here runs ckpt; these are the torch-side and file-side references the
tests hold ckpt's output against: the object-tree flattening rule of
`ckpt ls`, raw tensor bytes, .npy and zip parsing, a restricted pickle scanner
(persistent-id order) and a recursive, bit-exact comparison of two torch.load
results.
"""

import ast
import collections
import io
import math
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import numpy as np
import torch

# ---------------------------------------------------------------------------
# dtypes

# dtype name -> (.npy descr, raw_bits, torch dtype whose bits we compare).
NPY = {
    "float32": ("<f4", False, torch.float32),
    "float64": ("<f8", False, torch.float64),
    "float16": ("<f2", False, torch.float16),
    "bfloat16": ("<u2", True, torch.int16),
    "complex32": ("<u4", True, torch.int32),
    "complex64": ("<c8", False, torch.complex64),
    "complex128": ("<c16", False, torch.complex128),
    "bool": ("|b1", False, torch.bool),
    "int8": ("|i1", False, torch.int8),
    "int16": ("<i2", False, torch.int16),
    "int32": ("<i4", False, torch.int32),
    "int64": ("<i8", False, torch.int64),
    "uint8": ("|u1", False, torch.uint8),
    "qint8": ("|i1", True, None),
    "quint8": ("|u1", True, None),
    "qint32": ("<i4", True, None),
    "quint4x2": ("|u1", True, None),
    "quint2x4": ("|u1", True, None),
}
SUBBYTE = {"quint4x2", "quint2x4"}
ELEMENT_SIZE = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "complex32": 4, "complex64": 8,
    "complex128": 16, "bool": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
}


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def is_tensor(x):
    return isinstance(x, torch.Tensor)


# ---------------------------------------------------------------------------
# flattening (the naming rule of `ckpt ls`)


def flatten(obj, every_path=False):
    """[(name, tensor)] in pickle (depth-first, insertion) order.

    Dict keys: str as is, int as decimal; list/tuple indices; joined with '.'.
    A tensor object reached twice is listed once, under its first path — or, with every_path,
    under each of its paths (tied weights under each of their names).
    Quantizer parameters live inside the qtensor and are not reached.
    """
    out, seen = [], set()

    def walk(x, path):
        if is_tensor(x):
            if every_path or id(x) not in seen:
                seen.add(id(x))
                out.append((".".join(path), x))
        elif isinstance(x, dict):
            for k, v in x.items():
                assert isinstance(k, (str, int)) and not isinstance(k, bool), f"unsupported key {k!r}"
                walk(v, path + [str(k)])
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, path + [str(i)])

    walk(obj, [])
    return out


def untyped_storage(t):
    """The UntypedStorage behind t: torch 2.x's untyped_storage(), torch 1.13's storage()._storage."""
    t = t.detach()
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()._storage


def storage_id(t):
    """Identity of the StorageImpl behind t (works for empty storages, unlike data_ptr)."""
    return untyped_storage(t)._cdata


# ---------------------------------------------------------------------------
# raw bytes


def element_size(t):
    return t.element_size()


def tensor_bytes(t):
    """The tensor's elements, C order, as raw little-endian bytes.

    Quantized tensors give their int_repr (the stored integers)."""
    t = t.detach()
    if t.is_quantized:
        return t.int_repr().contiguous().numpy().tobytes()
    bits = NPY[dtype_name(t)][2]
    t = t.contiguous()
    if bits != t.dtype:
        t = t.view(bits)
    return t.numpy().tobytes()


def storage_bytes(t):
    """Every byte of the storage behind t (the whole storage, not just the view)."""
    u = torch.empty(0, dtype=torch.uint8).set_(untyped_storage(t))
    return u.numpy().tobytes()


# ---------------------------------------------------------------------------
# torch.load with weights_only stated

_WEIGHTS_ONLY = {}


def weights_only_ok(path):
    """Whether torch.load(weights_only=True) takes the file (torch 2.x's default since 2.6)."""
    key = (str(path), os.stat(path).st_mtime_ns)
    if key not in _WEIGHTS_ONLY:
        try:
            torch.load(path, weights_only=True, map_location="cpu")
            _WEIGHTS_ONLY[key] = True
        except Exception:  # noqa: BLE001 - UnpicklingError, RuntimeError by torch version
            _WEIGHTS_ONLY[key] = False
    return _WEIGHTS_ONLY[key]


def torch_load(path, like=None):
    """torch.load as a user of this torch loads the file: weights_only=True when torch takes it
    that way (judged on `like`, the original of a converted file, when given, so a conversion
    that lost weights-only loading fails), else weights_only=False (numpy arrays, argparse
    namespaces, user classes: what torch refuses unless the caller trusts the file)."""
    wo = weights_only_ok(like if like is not None else path)
    return torch.load(path, weights_only=wo, map_location="cpu")


def strided_from_buffer(buf, offset, shape, strides, itemsize):
    """Gather a strided tensor's elements (C order) from buf, element 0 at byte offset."""
    numel = math.prod(shape)
    if numel == 0:
        return b""
    span = (sum((s - 1) * st for s, st in zip(shape, strides)) + 1) * itemsize
    if offset < 0 or offset + span > len(buf):
        raise ValueError(f"offset {offset} + span {span} outside file of {len(buf)} bytes")
    raw = np.frombuffer(buf, dtype=np.dtype(f"V{itemsize}"), count=span // itemsize, offset=offset)
    view = np.lib.stride_tricks.as_strided(raw, shape=tuple(shape), strides=tuple(s * itemsize for s in strides))
    return np.ascontiguousarray(view).tobytes()


# ---------------------------------------------------------------------------
# .npy


def read_npy(path):
    """(version tuple, header dict, data bytes) of a .npy file, parsed by hand."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    version = (data[6], data[7])
    if version == (1, 0):
        (hlen,) = struct.unpack_from("<H", data, 8)
        start = 10
    elif version in ((2, 0), (3, 0)):
        (hlen,) = struct.unpack_from("<I", data, 8)
        start = 12
    else:
        raise ValueError(f"{path}: unknown .npy version {version}")
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    return version, header, data[start + hlen:]


# ---------------------------------------------------------------------------
# zip


ZipRecord = collections.namedtuple(
    "ZipRecord", "name short header_offset data_offset size compress_type crc flag_bits")


def zip_records(path):
    """Records of a zip in file (local header) order, with payload offsets read
    from each local header: data_offset = header_offset + 30 + name len + extra len."""
    with open(path, "rb") as f:
        buf = f.read()
    recs = []
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            h = info.header_offset
            sig, = struct.unpack_from("<I", buf, h)
            if sig != 0x04034B50:
                raise ValueError(f"{info.filename}: no local header at {h}")
            nlen, elen = struct.unpack_from("<HH", buf, h + 26)
            short = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
            recs.append(ZipRecord(info.filename, short, h, h + 30 + nlen + elen, info.file_size,
                                  info.compress_type, info.CRC, info.flag_bits))
    recs.sort(key=lambda r: r.header_offset)
    return recs


def zip_read(path, short):
    """Payload of record <folder>/<short>."""
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.split("/", 1)[-1] == short:
                return z.read(name)
    raise KeyError(short)


def is_zip(path):
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


# ---------------------------------------------------------------------------
# restricted pickle scanner: reads a torch data.pkl without importing anything


class StorageRef:
    def __init__(self, type_name, key, location, numel):
        self.type_name, self.key, self.location, self.numel = type_name, key, location, numel


class TensorRef:
    """What a _rebuild_* call describes: enough for `ls` and for ordering checks."""

    def __init__(self, storage, offset, size, stride, requires_grad, dtype=None):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)
        self.requires_grad, self.dtype, self.param, self.qparams = requires_grad, dtype, False, None


class _Global:
    def __init__(self, name):
        self.name = name

    def __call__(self, *args):
        return ("call", self.name, args)


def _rebuild_v2(storage, offset, size, stride, requires_grad, hooks, metadata=None):
    return TensorRef(storage, offset, size, stride, requires_grad)


def _rebuild_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    return TensorRef(storage, offset, size, stride, requires_grad, dtype=dtype.name)


def _rebuild_q(storage, offset, size, stride, qparams, requires_grad, hooks):
    t = TensorRef(storage, offset, size, stride, requires_grad)
    t.qparams = qparams
    return t


def _rebuild_param(data, requires_grad, hooks, state=None):
    data.param, data.requires_grad = True, requires_grad
    return data


_STORAGE_DTYPE = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128", "ComplexFloatStorage": "complex64",
    "QInt8Storage": "qint8", "QUInt8Storage": "quint8", "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4", "UntypedStorage": "uint8",
}


class ScanUnpickler(pickle.Unpickler):
    """Unpickles a torch data.pkl into plain containers + TensorRef, refusing
    every global outside the torch state-dict vocabulary (raises
    pickle.UnpicklingError naming 'module.name')."""

    def __init__(self, f):
        super().__init__(f, encoding="utf-8")
        self.storages = collections.OrderedDict()  # key -> StorageRef, first-reference order

    def find_class(self, module, name):
        full = f"{module}.{name}"
        table = {
            "collections.OrderedDict": collections.OrderedDict,
            "torch._utils._rebuild_tensor_v2": _rebuild_v2,
            "torch._utils._rebuild_tensor_v3": _rebuild_v3,
            "torch._utils._rebuild_qtensor": _rebuild_q,
            "torch._utils._rebuild_parameter": _rebuild_param,
            "torch._utils._rebuild_parameter_with_state": _rebuild_param,
            "torch.nn.parameter.Parameter": _Global(full),
            "_codecs.encode": lambda s, enc: s.encode(enc),  # protocol 2: bytes(x) = encode(x.decode('latin1'), 'latin1')
            "__builtin__.bytes": bytes,  # protocol 2 pickles b"" as __builtin__.bytes + EMPTY_TUPLE + REDUCE
            "builtins.bytes": bytes,
            "builtins.set": set, "builtins.frozenset": frozenset, "builtins.complex": complex,
            "builtins.bytearray": bytearray, "torch.Size": tuple,
        }
        if full in table:
            return table[full]
        if module == "torch" and (name in _STORAGE_DTYPE or name.startswith("per_") or
                                  isinstance(getattr(torch, name, None), torch.dtype)):
            return _Global(name)
        raise pickle.UnpicklingError(f"refused global {full}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"bad persistent id {pid!r}")
        _, stype, key, location, numel = pid[:5]
        if key not in self.storages:
            self.storages[key] = StorageRef(stype.name, key, location, numel)
        return self.storages[key]


def scan_pickle(data):
    """(object tree with TensorRef leaves, [storage keys in first-reference order])."""
    u = ScanUnpickler(io.BytesIO(data))
    obj = u.load()
    return obj, list(u.storages)


def scan_legacy(buf):
    """Parse a legacy (non-zip) torch.save stream.

    Returns (tree, storages: {key: (StorageRef, data_offset)})."""
    f = io.BytesIO(buf)
    magic = pickle.load(f)
    if magic != 0x1950A86A20F9469CFC6C:
        raise ValueError("not a legacy torch file")
    pickle.load(f)  # protocol version
    pickle.load(f)  # sys_info
    u = ScanUnpickler(f)
    tree = u.load()
    keys = pickle.load(f)
    out = {}
    for key in keys:
        count, = struct.unpack("<q", f.read(8))
        ref = u.storages[key]
        esize = ELEMENT_SIZE[_STORAGE_DTYPE[ref.type_name]]
        out[key] = (ref, f.tell())
        if len(f.read(count * esize)) != count * esize:
            raise ValueError(f"storage {key}: truncated")
    return tree, out


def flatten_refs(obj):
    """flatten() for a scan_pickle tree."""
    out, seen = [], set()

    def walk(x, path):
        if isinstance(x, TensorRef):
            if id(x) not in seen:
                seen.add(id(x))
                out.append((".".join(path), x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + [str(k)])
        elif isinstance(x, (list, tuple)) and not (x and x[0] == "call"):
            for i, v in enumerate(x):
                walk(v, path + [str(i)])

    walk(obj, [])
    return out


# ---------------------------------------------------------------------------
# recursive comparison of two torch.load results


def _float_bits(x):
    return struct.pack("<d", x)


class Comparer:
    """compare(a, b) collects human-readable differences.

    Besides values it checks that object identity of tensors (tied weights) and
    storage identity (views, shared storages) map one-to-one between a and b."""

    def __init__(self):
        self.diffs = []
        self.tensor_ab, self.tensor_ba = {}, {}
        self.storage_ab, self.storage_ba = {}, {}

    def fail(self, path, msg):
        self.diffs.append(f"{path or '<root>'}: {msg}")

    def _bijection(self, ab, ba, ka, kb, path, what):
        if ab.setdefault(ka, kb) != kb or ba.setdefault(kb, ka) != ka:
            self.fail(path, f"{what} sharing differs")

    def compare(self, a, b, path=""):
        if type(a) is not type(b):
            return self.fail(path, f"type {type(a).__name__} != {type(b).__name__}")
        if is_tensor(a):
            return self.compare_tensor(a, b, path)
        if isinstance(a, dict):
            ka, kb = list(a.keys()), list(b.keys())
            if ka != kb or [type(k) for k in ka] != [type(k) for k in kb]:
                return self.fail(path, f"keys {ka!r} != {kb!r}")
            for k in ka:
                self.compare(a[k], b[k], f"{path}.{k}" if path else str(k))
            da, db = getattr(a, "__dict__", {}), getattr(b, "__dict__", {})
            if list(da) != list(db):
                return self.fail(path, f"attributes {list(da)} != {list(db)}")
            for k in da:
                self.compare(da[k], db[k], f"{path}@{k}")
            return
        if isinstance(a, (list, tuple)):
            if len(a) != len(b):
                return self.fail(path, f"length {len(a)} != {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                self.compare(x, y, f"{path}.{i}" if path else str(i))
            return
        if isinstance(a, float):
            if _float_bits(a) != _float_bits(b):
                self.fail(path, f"float {a!r} != {b!r}")
            return
        if isinstance(a, complex):
            if _float_bits(a.real) + _float_bits(a.imag) != _float_bits(b.real) + _float_bits(b.imag):
                self.fail(path, f"complex {a!r} != {b!r}")
            return
        if a is None or isinstance(a, (bool, int, str, bytes, bytearray)):
            if a != b:
                self.fail(path, f"{a!r} != {b!r}")
            return
        if isinstance(a, torch.dtype) or isinstance(a, torch.qscheme):
            if a != b:
                self.fail(path, f"{a} != {b}")
            return
        self.fail(path, f"no comparison for type {type(a).__name__}")

    def compare_tensor(self, a, b, path):
        self._bijection(self.tensor_ab, self.tensor_ba, id(a), id(b), path, "tensor object (tied weight)")
        for attr in ("dtype", "shape", "requires_grad", "is_quantized", "layout", "device"):
            if getattr(a, attr) != getattr(b, attr):
                return self.fail(path, f"{attr} {getattr(a, attr)} != {getattr(b, attr)}")
        if a.stride() != b.stride():
            self.fail(path, f"stride {a.stride()} != {b.stride()}")
        if a.storage_offset() != b.storage_offset():
            self.fail(path, f"storage_offset {a.storage_offset()} != {b.storage_offset()}")
        self._bijection(self.storage_ab, self.storage_ba, storage_id(a), storage_id(b), path, "storage")
        if tensor_bytes(a) != tensor_bytes(b):
            self.fail(path, "tensor bytes differ")
        if storage_bytes(a) != storage_bytes(b):
            self.fail(path, f"storage bytes differ ({a.storage().nbytes()} vs {b.storage().nbytes()} bytes)")
        if a.is_quantized:
            if a.qscheme() != b.qscheme():
                return self.fail(path, f"qscheme {a.qscheme()} != {b.qscheme()}")
            if a.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                if _float_bits(a.q_scale()) != _float_bits(b.q_scale()) or a.q_zero_point() != b.q_zero_point():
                    self.fail(path, "q_scale/q_zero_point differ")
            else:
                sub = Comparer()
                sub.compare(a.q_per_channel_scales(), b.q_per_channel_scales(), "scales")
                sub.compare(a.q_per_channel_zero_points(), b.q_per_channel_zero_points(), "zero_points")
                if a.q_per_channel_axis() != b.q_per_channel_axis():
                    sub.fail("axis", "differs")
                self.diffs += [f"{path}: {d}" for d in sub.diffs]


def compare(a, b):
    c = Comparer()
    c.compare(a, b)
    return c.diffs


def run_measured(ckpt, *args, timeout=120, address_space=None):
    """(CompletedProcess, peak RSS in bytes) of `ckpt args`, run under a wrapper that reports
    its only child's peak RSS; `address_space` caps the child's RLIMIT_AS. (A small wrapper
    process: a child forked straight from the test process would count the test's own pages,
    torch's included, in its peak.)"""
    wrapper = (
        "import resource, subprocess, sys\n"
        "lim = int(sys.argv[1])\n"
        "def pre():\n"
        "    if lim: resource.setrlimit(resource.RLIMIT_AS, (lim, lim))\n"
        "r = subprocess.run(sys.argv[2:], preexec_fn=pre, capture_output=True)\n"
        "sys.stdout.buffer.write(r.stdout); sys.stderr.buffer.write(r.stderr)\n"
        "sys.stderr.write('\\nRSS_KIB %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(r.returncode)\n")
    asan = "asan" in ckpt.path
    r = subprocess.run([sys.executable, "-c", wrapper, str(0 if asan else (address_space or 0)),
                        ckpt.path, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, errors="replace")
    head, _, tail = r.stderr.rpartition("\nRSS_KIB ")
    r.stderr = head
    return r, int(tail.strip()) * 1024


def s3_env(rgw, **over):
    """The environment of a ckpt run against the session's RGW (the `rgw` fixture): its
    endpoint and keys, no other AWS_ variable; `over` sets (or, with None, removes) more."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=rgw.endpoint, AWS_ACCESS_KEY_ID=rgw.access_key,
               AWS_SECRET_ACCESS_KEY=rgw.secret_key, AWS_REGION="us-east-1")
    for k, v in over.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env
