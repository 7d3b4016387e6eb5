"""Helpers for the object tree: what the C++ core calls to make Python objects that are not
builtins (torch.Size, dtypes, OrderedDict...), and to describe Python objects for ckpt.save.

No class or function named by a file is ever called: only the fixed, known constructors here.
Everything else becomes :class:`Opaque` or :class:`Global`.

An eager load builds the tree while its reader threads are still filling the tensors' memory
(LoadOptions::on_placed): nothing here may read a tensor's bytes (views such as .numpy() are
fine; values are not).
"""

import builtins
import collections
import sys

__all__ = ["Opaque", "Global", "OpaqueDict"]


class Global:
    """A class or function a checkpoint names (``module.name``) and ckpt does not import."""

    __slots__ = ("module", "name")

    def __init__(self, module, name):
        self.module = module
        self.name = name

    def __repr__(self):
        return f"ckpt.Global({self.module}.{self.name})"

    def __eq__(self, other):
        return isinstance(other, Global) and (self.module, self.name) == (other.module, other.name)

    def __hash__(self):
        return hash((self.module, self.name))


class Opaque:
    """An object of a class ckpt does not construct, kept as data, never called.

    ``module``/``name``: the class (or function) the pickle named; ``args``: the arguments of
    the call that made it; ``state``: what ``__setstate__`` would have received (BUILD), or
    None; ``appended``: items appended to it (a list subclass); ``items``: (key, value) pairs
    set on it (a dict subclass); ``call``: "reduce" (``cls(*args)``) or "newobj"
    (``cls.__new__(cls, *args)``). ``ckpt.save`` writes it back as the same object.
    """

    __slots__ = ("module", "name", "args", "state", "appended", "items", "call", "foreign")

    def __init__(self, module, name, args=(), state=None, appended=(), items=(), call="reduce",
                 foreign=True):
        self.module = module
        self.name = name
        self.args = tuple(args)
        self.state = state
        self.appended = list(appended)
        self.items = list(items)
        self.call = call
        self.foreign = foreign

    def __repr__(self):
        s = f"ckpt.Opaque({self.module}.{self.name}, args={self.args!r}"
        if self.state is not None:
            s += f", state={self.state!r}"
        return s + ")"

    def __eq__(self, other):
        if not isinstance(other, Opaque):
            return NotImplemented
        return all(getattr(self, a) == getattr(other, a) for a in Opaque.__slots__)

    __hash__ = object.__hash__

    def is_module(self):
        """Whether this is a pickled torch.nn.Module (its state has _parameters, _buffers and
        _modules)."""
        st = self.state
        return isinstance(st, dict) and all(
            isinstance(st.get(k), dict) for k in ("_parameters", "_buffers", "_modules"))

    def state_dict(self, prefix=""):
        """The tensors of a pickled torch.nn.Module (``torch.save(model)``) by module path,
        as ``model.state_dict()`` names them (``0.weight``, ``encoder.layers.1.bias``):
        each module's parameters, then its persistent buffers, then its submodules', None
        entries skipped. Read from the pickled state as data; nothing of the module runs (a
        custom ``state_dict`` override is not applied). Raises ckpt.InvalidArgumentError when
        this is not a module."""
        if not self.is_module():
            from ._errors import InvalidArgumentError, error
            raise error(InvalidArgumentError, f"{self.module}.{self.name} is not a pickled "
                        "torch.nn.Module (its state has no _parameters/_buffers/_modules)")
        out = collections.OrderedDict()
        _module_entries(self, prefix, out, set())
        return out


def _module_entries(m, prefix, out, seen):
    # A shared submodule is listed under each of its names, as Module.state_dict does; `seen`
    # holds the modules on the current path only (a cycle ends there).
    if id(m) in seen:
        return
    seen.add(id(m))
    st = m.state
    for k, v in st["_parameters"].items():
        if v is not None:
            out[prefix + str(k)] = v
    skip = st.get("_non_persistent_buffers_set") or ()
    for k, v in st["_buffers"].items():
        if v is not None and k not in skip:
            out[prefix + str(k)] = v
    for k, sub in st["_modules"].items():
        if isinstance(sub, Opaque) and sub.is_module():
            _module_entries(sub, prefix + str(k) + ".", out, seen)
    seen.discard(id(m))


class OpaqueDict(dict):
    """A dict of a class ckpt does not construct: its items, with the class's name."""

    def __init__(self, module, name, args=()):
        super().__init__()
        self.module = module
        self.name = name
        self.args = tuple(args)


_SAFE_BUILTINS = {"int", "float", "complex", "str", "bytes", "bytearray", "list", "tuple",
                  "dict", "set", "frozenset", "bool", "object"}


def _torch():
    return sys.modules.get("torch") if _MODE["torch"] else None


_MODE = {"torch": False}  # set by the loader: True when tensors are torch tensors


def make_set(items, frozen):
    return frozenset(items) if frozen else set(items)


def make_dict(module, name, args):
    if module == "collections":
        if name == "OrderedDict":
            return collections.OrderedDict()
        if name == "Counter":
            return collections.Counter()
        if name == "defaultdict":
            factory = args[0] if args else None
            if factory is not None and not (isinstance(factory, type) and
                                            factory.__name__ in _SAFE_BUILTINS):
                factory = None
            return collections.defaultdict(factory)
    return OpaqueDict(module, name, args)


def set_state(obj, state):
    if isinstance(state, dict):
        for k, v in state.items():
            if isinstance(k, str):
                try:
                    setattr(obj, k, v)
                except (AttributeError, TypeError):
                    pass


def make_global(module, name, foreign):
    torch = _torch()
    if torch is not None and module == "torch" and not foreign:
        g = getattr(torch, name, None)
        if isinstance(g, (torch.dtype, torch.layout, torch.qscheme, torch.memory_format)):
            return g
    if module in ("builtins", "__builtin__") and name in _SAFE_BUILTINS:
        return getattr(builtins, name)
    return Global(module, name)


def make_object(module, name, args, state, appended, items, call, foreign):
    if not foreign:
        if module == "torch" and name == "Size" and len(args) == 1:
            torch = _torch()
            return torch.Size(args[0]) if torch is not None else tuple(args[0])
        if module == "torch" and name == "device" and args and \
                all(isinstance(a, (str, int)) for a in args):
            torch = _torch()
            if torch is not None:
                try:
                    return torch.device(*args)
                except (RuntimeError, TypeError):
                    pass
        if module == "argparse" and name == "Namespace" and not args and \
                isinstance(state, dict) and all(isinstance(k, str) for k in state):
            import argparse
            # Attribute names from the file: a dunder (``__class__``, ``__dict__``) would change
            # what the object is, or make setattr raise; such a state is no Namespace's.
            bad = [k for k in state if k.startswith("__") and k.endswith("__")]
            if bad:
                from ._errors import CorruptError, error
                raise error(CorruptError, f"argparse.Namespace state sets {bad[0]!r}, which no "
                                          "Namespace holds")
            try:
                return argparse.Namespace(**state)
            except (TypeError, ValueError, AttributeError) as e:
                from ._errors import CorruptError, error
                raise error(CorruptError, f"argparse.Namespace state cannot be set: {e}") from None
    return Opaque(module, name, args, state, appended, items, call, foreign)


def _numpy():
    try:
        import numpy
        return numpy
    except ImportError:
        return None


def _np_dtype(np, d):
    # numpy.dtype('f8', False, True) with state (3, '<', ...) as an Opaque.
    if not (isinstance(d, Opaque) and d.name == "dtype" and d.args and isinstance(d.args[0], str)):
        return None
    t = np.dtype(d.args[0])
    if isinstance(d.state, tuple) and len(d.state) > 1 and d.state[1] in ("<", ">"):
        t = t.newbyteorder(d.state[1])
    return t


def scalar_with_origin(value, origin):
    """A number read from numpy.core.multiarray.scalar(dtype, bytes): the numpy scalar."""
    np = _numpy()
    if np is None or not isinstance(origin, Opaque) or len(origin.args) != 2 or \
            not isinstance(origin.args[1], bytes):
        return value
    try:
        t = _np_dtype(np, origin.args[0])
        if t is None:
            return value
        return np.frombuffer(origin.args[1], dtype=t)[0]
    except (TypeError, ValueError):
        return value


_TENSOR_WRAPPERS = {("torch._tensor", "_rebuild_from_type_v2"),
                    ("torch._utils", "_rebuild_parameter_with_state")}


def tensor_with_origin(tensor, origin):
    """A tensor read from a call that wraps it.

    torch's wrapper of a tensor subclass or a tensor with Python attributes (origin
    `(type, state)`): the tensor with its attributes set (plain data, never a call); the
    subclass itself is not made (its class is never imported), as with torch's weights_only.
    Otherwise an array read from a numpy array pickle: the numpy array (torch.load returns one).
    """
    if isinstance(origin, Opaque) and (origin.module, origin.name) in _TENSOR_WRAPPERS:
        state = origin.args[1] if len(origin.args) == 2 else None
        if isinstance(state, tuple) and state and isinstance(state[0], dict):
            state = state[0]  # (__dict__, slots) for a class with __slots__
        if isinstance(state, dict):
            for k, v in state.items():
                if isinstance(k, str) and not (k.startswith("__") and k.endswith("__")):
                    try:
                        setattr(tensor, k, v)
                    except (AttributeError, TypeError):
                        pass
        return tensor
    arr = _array_from_reconstruct(origin)
    if arr is not None:
        return arr
    torch = _torch()
    if torch is not None and isinstance(tensor, torch.Tensor):
        try:
            return tensor.numpy()
        except (RuntimeError, TypeError):
            return tensor
    return tensor


def _array_from_reconstruct(origin):
    """The ndarray numpy's own unpickling makes from _reconstruct + its BUILD state (version,
    shape, dtype, fortran, raw bytes): its own dtype (in native byte order, as numpy's
    __setstate__ makes it), a writable copy. None
    where the origin is not that (numpy missing, an unexpected state)."""
    np = _numpy()
    if np is None or not isinstance(origin, Opaque) or origin.name != "_reconstruct":
        return None
    st = origin.state
    if not (isinstance(st, tuple) and len(st) == 5 and isinstance(st[1], tuple) and
            isinstance(st[4], (bytes, bytearray))):
        return None
    try:
        t = _np_dtype(np, st[2])
        if t is None:
            return None
        a = np.frombuffer(bytearray(st[4]), dtype=t)
        if not t.isnative:  # numpy's __setstate__ gives the values in native byte order
            a = a.astype(t.newbyteorder("="))
        return a.reshape(st[1], order="F" if st[3] else "C")
    except (TypeError, ValueError):
        return None


# --- ckpt.save: describing Python objects ---------------------------------------------------

_NP_NAMES = {"<f4": "float32", "<f8": "float64", "<f2": "float16", "<c8": "complex64",
             "<c16": "complex128", "|b1": "bool", "|i1": "int8", "<i2": "int16", "<i4": "int32",
             "<i8": "int64", "|u1": "uint8", "<u2": "uint16", "<u4": "uint32", "<u8": "uint64"}


def describe(obj, flat=False):
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.Tensor):
            return ("tensor", _describe_tensor(torch, obj))
        if isinstance(obj, torch.Size):
            return ("object", "torch", "Size", (tuple(obj),), None, [], [], "reduce", False)
        if isinstance(obj, torch.dtype):
            return ("global", "torch", str(obj).split(".", 1)[1], False)
        if isinstance(obj, torch.device):
            return ("object", "torch", "device", (str(obj),), None, [], [], "reduce", False)
        if isinstance(obj, (torch.layout, torch.qscheme)):
            # pickled by name (their __reduce__ is a string): the global torch.<name>
            return ("global", "torch", str(obj).split(".", 1)[1], False)
    if isinstance(obj, collections.OrderedDict) or type(obj) is collections.Counter:
        state = dict(vars(obj)) or None
        return ("dict", "collections", type(obj).__name__, list(obj.items()), state, ())
    if type(obj) is collections.defaultdict:
        f = obj.default_factory
        return ("dict", "collections", "defaultdict", list(obj.items()), None,
                () if f is None else (f,))
    if isinstance(obj, type) and obj.__module__ == "builtins" and obj.__name__ in _SAFE_BUILTINS:
        return ("global", "builtins", obj.__name__, False)
    if isinstance(obj, Opaque):
        return ("object", obj.module, obj.name, obj.args, obj.state, obj.appended, obj.items,
                obj.call, True)
    if isinstance(obj, OpaqueDict):
        return ("dict", obj.module, obj.name, list(obj.items()), None, obj.args)
    if isinstance(obj, Global):
        return ("global", obj.module, obj.name, True)
    if type(obj).__module__ == "argparse" and type(obj).__name__ == "Namespace":
        # what pickle makes of it (copyreg.__reduce_ex__, protocol 2): NEWOBJ + its __dict__
        return ("object", "argparse", "Namespace", (), dict(vars(obj)), [], [], "newobj", False)
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(obj, np.ndarray) and flat:
            return ("tensor", _describe_array(np, obj))
        if isinstance(obj, (np.ndarray, np.generic, np.dtype)):
            return _describe_numpy(obj)
        if isinstance(obj, type) and obj.__module__.split(".")[0] == "numpy":
            return ("global", obj.__module__, obj.__qualname__, False)
    return ("unsupported",)


def _describe_numpy(obj):
    """An ndarray, numpy scalar or dtype as torch.save pickles it: numpy's own reduction
    (protocol 2: _reconstruct + BUILD state for arrays, scalar(dtype, bytes) for scalars), so
    torch.load (and ckpt.load) make the same object. Only numpy's reduction is called here."""
    red = obj.__reduce_ex__(2)
    if not isinstance(red, tuple) or len(red) < 2 or isinstance(red, str):
        return ("unsupported",)
    fn, args = red[0], red[1]
    state = red[2] if len(red) > 2 else None
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None)
    if not module or not name or module.split(".")[0] != "numpy":
        return ("unsupported",)
    appended = list(red[3]) if len(red) > 3 and red[3] is not None else []
    items = list(red[4]) if len(red) > 4 and red[4] is not None else []
    return ("object", module, name, tuple(args), state, appended, items, "reduce", False)


def _describe_array(np, a):
    from ._errors import UnsupportedError, error
    c = np.ascontiguousarray(a)
    if c.dtype.byteorder == ">":
        c = c.astype(c.dtype.newbyteorder("<"))
    name = _NP_NAMES.get(c.dtype.str)
    if name is None:
        raise error(UnsupportedError, f"numpy dtype {a.dtype} has no ckpt equivalent")
    strides = tuple(s // c.itemsize for s in c.strides) if c.itemsize else (0,) * c.ndim
    return (id(c), c.ctypes.data, c.nbytes, name, tuple(c.shape), strides, 0, False, False,
            (a, c), None)


def _describe_tensor(torch, t):
    from ._errors import UnsupportedError, error
    if t.is_sparse or t.layout != torch.strided:
        raise error(UnsupportedError, "ckpt.save cannot write sparse or non-strided tensors")
    quant = None
    if t.is_quantized:
        qs = t.qscheme()
        scheme = str(qs).split(".", 1)[1]
        if qs in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            quant = (scheme, float(t.q_scale()), int(t.q_zero_point()), 0, None, None)
        else:
            quant = (scheme, 0.0, 0, int(t.q_per_channel_axis()), t.q_per_channel_scales(),
                     t.q_per_channel_zero_points())
    is_param = isinstance(t, torch.nn.Parameter)
    rg = bool(t.requires_grad)
    name = str(t.dtype).split(".", 1)[1]
    if t.device.type == "meta":  # dtype, size and stride only
        return (id(t), 0, 0, name, tuple(t.shape), tuple(t.stride()), t.storage_offset(), rg,
                is_param, (t,), quant, True)
    if t.device.type != "cpu":
        t = t.detach().cpu()
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()
    nbytes = s.nbytes()
    key = s.data_ptr() if nbytes else id(s)
    return (key, s.data_ptr(), nbytes, name, tuple(t.shape), tuple(t.stride()),
            t.storage_offset(), rg, is_param, (t, s), quant, False)
