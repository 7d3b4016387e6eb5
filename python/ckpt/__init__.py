"""ckpt: load and save model checkpoints safely and fast (PyTorch, safetensors, tensorizer).

    import ckpt
    sd = ckpt.load("model.pt")                  # what torch.load returns; no code runs
    sd = ckpt.load("model.pt", mmap=True)       # zero-copy views of the file
    ckpt.save(sd, "model.safetensors")          # or .pt / .tensors
    with ckpt.safe_open("model.pt", framework="pt") as f:
        w = f.get_slice("layer.weight")[:, :16]

Files are read by a C++ library (no pickle code is ever run: unknown classes come back as
:class:`ckpt.Opaque`). Without torch installed, tensors come back as numpy arrays.
Errors are :class:`ckpt.Error` subclasses naming the file, record and byte offset.
"""

import atexit
import collections
import gc
import io
import os
import sys
import threading

from . import _build, _ckpt, _script, _tree
from ._build import Builder, backend
from ._build import untyped_storage as _untyped_storage
from ._errors import (AuthError, CorruptError, Error, InvalidArgumentError,
                      IoError, LimitExceededError, NotACheckpointDirError, NotFoundError,
                      TruncatedError, UnsupportedError, error)
from ._save import _key, _Progress, load_model, save, save_file, save_model
from ._tree import Global, Opaque, OpaqueDict

# Large checkpoints are freed on a background thread (python/src/reaper.cc); wait for them at exit.
atexit.register(_ckpt.drain_reaped)

# Loaded on first use (PEP 562), not at `import ckpt`: loading across ranks and in place, and
# the refusal that is also a pickle.UnpicklingError (it needs the pickle module).
_LAZY = {"ForbiddenGlobalError": "_errors", "Box": "_ranks", "RankError": "_ranks",
         "Replicate": "_ranks", "Shard": "_ranks", "load_into": "_load_into"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckpt' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module("." + module, __name__), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"
__all__ = [
    "load", "save", "safe_open", "load_file", "save_file", "save_model", "load_model", "open",
    "Checkpoint", "TensorInfo",
    "Opaque", "Global", "OpaqueDict", "Error", "IoError", "NotFoundError", "TruncatedError",
    "CorruptError", "UnsupportedError", "LimitExceededError", "InvalidArgumentError",
    "AuthError", "ForbiddenGlobalError", "NotACheckpointDirError", "set_kept_memory_limit",
    "release_kept_memory", "kept_memory", "Shard", "Replicate", "Box", "RankError", "load_into",
]

TensorInfo = collections.namedtuple(
    "TensorInfo", "name dtype shape strides storage_offset storage requires_grad is_parameter "
                  "quantization type")
TensorInfo.__doc__ = """What a checkpoint says about one tensor (no bytes read): name (dotted
path), dtype (torch's name, "float32"), shape, strides and storage_offset (in elements), storage
(index of its storage), requires_grad, is_parameter, quantization (None or (scheme, scale,
zero_point, axis, scales_tensor, zero_points_tensor)), type (format-specific)."""


def _framework(framework):
    if framework in (None, "pt", "torch"):
        fw = backend()
        if framework is not None and fw != "torch":
            raise error(InvalidArgumentError, "framework='pt' needs torch, which cannot be "
                        "imported")
        return fw
    if framework in ("np", "numpy"):
        return "numpy"
    raise error(InvalidArgumentError, f"unknown framework {framework!r} (use 'pt' or 'np')")


def _device(map_location, framework="torch"):
    """The device a load puts every tensor on: "cpu" or "cuda[:N]" (the library checks N).
    map_location / device forms: None, "cpu", "cuda", "cuda:N", an int N (cuda:N), a
    torch.device, or a dict whose values all name one device ({"cuda:1": "cpu"})."""
    loc = map_location
    if loc is None:
        return "cpu"
    if isinstance(loc, dict):
        targets = {str(v) for v in loc.values()}
        if not targets:
            return "cpu"
        if len(targets) > 1:
            raise error(InvalidArgumentError, f"map_location={map_location!r}: ckpt loads every "
                        "tensor onto one device; name one target device")
        loc = targets.pop()
    if isinstance(loc, int) and not isinstance(loc, bool):
        loc = f"cuda:{loc}"
    loc = str(loc)
    if loc in ("cpu", "cpu:0"):
        return "cpu"
    if loc == "meta":
        if framework != "torch":
            raise error(InvalidArgumentError, "map_location='meta' makes torch meta tensors: "
                        "it needs torch")
        return "meta"
    if loc == "cuda" or loc.startswith("cuda:"):
        if framework != "torch":
            raise error(InvalidArgumentError, f"device {loc!r}: numpy arrays live in host memory "
                        "(use framework='pt' for CUDA tensors)")
        return _current_cuda(loc)
    raise error(InvalidArgumentError, f"map_location={map_location!r}: ckpt loads onto 'cpu', "
                "'cuda[:N]' or 'meta' (move the tensors afterwards)")


def _current_cuda(loc):
    """"cuda" is torch's current device (torch.cuda.current_device()) at the time of the call,
    made explicit here; "cuda:N" as it is. Without torch's CUDA, the library resolves "cuda"
    (cudaGetDevice) itself."""
    if loc != "cuda":
        return loc
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()}"
    except Exception:  # a broken CUDA setup: the library reports what is missing
        pass
    return loc


def _is_callable_location(loc):
    if loc is None or isinstance(loc, (str, dict, int)):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(loc, torch.device):
        return False
    return callable(loc)


def _call_location(fn, locations):
    """The device a callable map_location (torch's ``fn(storage, location)``) puts storages on.

    ckpt loads every tensor onto one device, so the callable is not called per storage with the
    file's bytes: it is called once per distinct location the file names ("cpu", "cuda:0"...),
    with an empty CPU storage, and the device of what it returns is where the load goes
    (``lambda storage, loc: storage`` is "cpu"; returning None keeps the saved location, as
    torch does). Results that differ by location, or that are not storages or tensors, raise
    ckpt.UnsupportedError."""
    import torch
    targets = set()
    for loc in sorted(set(locations)) or ["cpu"]:
        probe = torch.UntypedStorage(0)
        out = fn(probe, loc)
        if out is None:
            targets.add(loc)
            continue
        dev = getattr(out, "device", None)
        if dev is None:
            raise error(UnsupportedError, f"map_location callable returned a "
                        f"{type(out).__name__} for location {loc!r}; ckpt needs a storage or "
                        "tensor (its device is where the tensors go)")
        targets.add(str(dev))
    targets = {"cpu" if t in ("cpu", "cpu:0") else t for t in targets}
    if len(targets) > 1:
        raise error(UnsupportedError, f"map_location callable sends storages to "
                    f"{sorted(targets)}; ckpt loads every tensor onto one device")
    return targets.pop()


def _saved_device(map_location, locations, framework="torch"):
    """The one device a dict map_location, or None, puts a file's storages on, as torch.load
    maps them: each saved location ("cpu", "cuda:1") through the dict, a location the dict does
    not name staying where it was saved; None keeps every saved location. locations: those the
    file names (none: "cpu"). Storages that would go to several devices raise
    ckpt.InvalidArgumentError (ckpt loads every tensor onto one device)."""
    table = {} if map_location is None else {str(k): v for k, v in map_location.items()}
    targets = set()
    for loc in sorted(set(locations)) or ["cpu"]:
        targets.add(_device(table.get(loc, loc), framework))
    if len(targets) > 1:
        raise error(InvalidArgumentError, f"map_location={map_location!r} puts the file's "
                    f"storages on {sorted(targets)}; ckpt loads every tensor onto one device")
    return targets.pop()


def _resolve_location(map_location, source, strict, key, password, framework):
    """map_location as _device takes it. A dict, None or a callable depends on where the file's
    storages were saved: the file's tables are read for their locations (no tensor byte)."""
    callable_loc = _is_callable_location(map_location)
    if not (map_location is None or isinstance(map_location, dict) or callable_loc):
        return map_location
    if callable_loc and framework != "torch":
        raise error(InvalidArgumentError, "a callable map_location needs torch")
    ck = _open_source(source, strict, key, password)
    locations = [s[4] or "cpu" for s in ck.storage_infos()]
    del ck
    if callable_loc:
        return _call_location(map_location, locations)
    return _saved_device(map_location, locations, framework)


_ENCODINGS = ("utf-8", "utf8", "ascii")


def _torch_load_args(pickle_module, encoding):
    """torch.load's pickle_module= and encoding=: accepted where ckpt does what torch does,
    refused by name otherwise (ckpt.InvalidArgumentError)."""
    if pickle_module is not None and pickle_module is not sys.modules.get("pickle"):
        name = getattr(pickle_module, "__name__", type(pickle_module).__name__)
        raise error(InvalidArgumentError, f"pickle_module={name}: ckpt reads pickles itself and "
                    "never runs a pickle module (pass None or pickle)")
    if encoding is not None and str(encoding).lower() not in _ENCODINGS:
        raise error(InvalidArgumentError, f"encoding={encoding!r}: ckpt decodes Python 2 str "
                    "as UTF-8 where it is valid, else as latin-1, and has no other encoding "
                    "(leave encoding out, or pass 'utf-8')")


def _is_url(path):
    return path.split("://", 1)[0].lower() in ("http", "https", "s3") and "://" in path


def _open_path(path, mmap, strict, key, password):
    # mmap: a private mapping with writable copy-on-write views. A URL (http://, https://,
    # s3://bucket/key) is read with ranged requests: nothing to map.
    return _ckpt.Checkpoint.open(path, mmap, strict, _key(key), password or "")


class _NoGC:
    """The cyclic garbage collector paused while a load makes its objects.

    A load makes a few objects per tensor (tensors, dict entries) and none of them forms a cycle
    the load leaves behind; with the collector on, 20,000 tensors trigger full collections over
    every object of the interpreter (torch's included), ~40 ms of a 70 ms mmap load. This is
    about the number of objects any loader makes, not about how the bytes are handed over, so it
    stays. Paused (gc.disable) by the first of concurrent loads and restored by the last one,
    and only if the collector was on when the first began: never re-enabled behind a caller
    that disabled it.
    """

    _lock = threading.Lock()
    _depth = 0
    _was_enabled = False

    def __enter__(self):
        with _NoGC._lock:
            if _NoGC._depth == 0:
                _NoGC._was_enabled = gc.isenabled()
                gc.disable()
            _NoGC._depth += 1

    def __exit__(self, *exc):
        with _NoGC._lock:
            _NoGC._depth -= 1
            if _NoGC._depth == 0 and _NoGC._was_enabled:
                gc.enable()
        return False


def _loader(fw):
    """The arguments every C++ load takes after its own: from_dlpack (torch's, or None for
    numpy), and the helper modules it calls (leftover tensors, tree objects, TorchScript)."""
    _tree._MODE["torch"] = fw == "torch"
    return (_build.from_dlpack(), _build, _tree, _script)


def load(f, map_location="cpu", pickle_module=None, *, weights_only=None, mmap=None,
         verify=False, strict=False, key=None, password=None, progress=None, encoding=None,
         plan=None, group=None, timeout=None, exchange_budget=64 << 20, drop_cache=False):
    """Load a checkpoint: returns what ``torch.load(f)`` returns, without running any code.

    f: a path (str or os.PathLike), a URL (http://, https://, s3://bucket/key: ranged requests,
      configured by the AWS_* environment as the ckpt command documents; mmap does not apply),
      or a binary file object (read whole into memory).
      Any format ckpt reads: torch.save zip and legacy files, TorchScript archives (their state
      dict), safetensors (a dict of name -> tensor, as safetensors' load_file), tensorizer.
    map_location (also the second positional argument): where the tensors go: "cpu", "cuda",
      "cuda:N", an int N, a torch.device; None: where the file's storages were saved (as
      torch.load); a dict as torch.load takes it (each saved location through the dict, one it
      does not name staying where it was saved: {"cuda:1": "cuda:0"} on a CPU file is the
      CPU); the storages must all end on one device; "meta" or torch.device("meta") (meta
      tensors: dtype, shape and strides from the file's tables, no tensor byte read), or a
      callable ``fn(storage, location)`` as torch takes it (called once per location the file
      names, with an empty CPU storage: the device of what it returns is where every tensor
      goes; ``lambda storage, loc: storage`` is the CPU). CUDA: the bytes are read by several
      threads into pinned staging buffers and copied into one device allocation, and the
      tensors are CUDA tensors over it (handed to torch through DLPack, no host copy; the memory
      is freed when the last of them dies). Without a usable GPU: ckpt.UnsupportedError naming
      what is missing. mmap does not apply to a device load.
    mmap: (None: False, as torch.load) tensors are zero-copy views of a private copy-on-write mapping of the file (writable:
      writes stay in this process); the mapping lives while any tensor uses it. The file may be
      deleted or replaced by rename meanwhile; truncating it in place is undefined, as for any
      mapping. Stored bytes that need decoding (compressed, encrypted, other byte order) are
      decoded into memory of their own.
    verify: check every stored CRC32 while reading (raises ckpt.CorruptError on a mismatch).
    drop_cache: a local file's pages leave the page cache once their bytes are read, those that
      were not cached when the load began (another process's warm cache stays), so that a cold
      load does not leave a second copy of the checkpoint in memory; a load of the same file
      right after reads it from the disk again. Not for mmap=True (the views are the pages).
    strict: refuse classes ckpt does not know (ckpt.UnsupportedError), as torch.load(
      weights_only=True) does; otherwise they come back as ckpt.Opaque, never called.
    key / password: decryption for encrypted tensorizer files (32 raw bytes or 64 hex digits).
    weights_only: True means strict=True; a refused global raises ckpt.ForbiddenGlobalError,
      also a pickle.UnpicklingError as torch.load(weights_only=True) raises.
    pickle_module (third positional), encoding: torch.load's; None / pickle and None / "utf-8"
      / "ascii" are accepted, anything else refused by name (ckpt runs no pickle module, and
      decodes Python 2 str as UTF-8 where valid, else latin-1).
    progress: None (default), a callable ``fn(done, total)`` called with bytes read (at most
      every 100 ms, and once at the end with done == total; from a reader thread, with the GIL
      held; an exception it raises stops the load and is raised by it), or True for a tqdm bar
      on stderr (a plain percentage line when tqdm is not installed).

    plan / group: load across ranks (python/ckpt/_ranks.py): this rank's part of each tensor as
      `plan` places it (a dict of glob or "re:" patterns -> ckpt.Shard(dim) / ckpt.Replicate() /
      ckpt.Box or torch.distributed.tensor placements, a callable (name, shape, dtype) ->
      placement, or one placement for all; unmatched tensors are replicated), over `group` (a
      torch.distributed process group or a 1-D DeviceMesh; default: the world when
      initialized). Returns a flat dict of plain tensors, on map_location (cuda: loaded straight
      into device memory through pinned staging); Replicate bytes are read once across the group,
      each rank's part broadcast into the others' tensors in rounds of `exchange_budget` bytes; a
      collective that fails or waits past `timeout` seconds raises ckpt.RankError naming the
      rank and the tensor.

    Tensors are torch tensors when torch can be imported, else numpy arrays. Storages shared in
    the file stay shared; Parameters, requires_grad, torch.Size, OrderedDict (with _metadata)
    and quantized tensors come back as torch makes them. Bytes move with the GIL released.
    Raises ckpt.Error subclasses (NotFoundError, CorruptError, TruncatedError, ...; a folder that
    is not a checkpoint: NotACheckpointDirError, an IsADirectoryError).
    """
    _torch_load_args(pickle_module, encoding)
    strict = bool(strict or weights_only)
    source = _source(f)
    if plan is not None or group is not None:
        ck = _open_source(source, strict, key, password, mmap=False)
        from . import _ranks

        return _ranks.load(ck, plan, group, _device(map_location, "torch"), verify, timeout,
                           exchange_budget)
    fw = _framework(None)
    map_location = _resolve_location(map_location, source, strict, key, password, fw)
    device = _device(map_location, fw)
    with _NoGC(), _Progress(progress, "load") as fn:
        return _load(source, bool(mmap), verify, strict, key, password, device=device,
                     progress=fn, drop_cache=bool(drop_cache))


def _source(f):
    """A path (str) or (bytes, name) for a binary file object (read whole)."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(f)
    if isinstance(f, tuple):
        return f
    if not hasattr(f, "read"):
        raise error(InvalidArgumentError, f"expected a path (str, pathlib.Path) or a binary file "
                    f"object, not {type(f).__name__}")
    name = str(getattr(f, "name", "<stream>"))
    text_mode = isinstance(f, io.TextIOBase)
    if not text_mode:
        try:
            data = f.read()
        except UnicodeDecodeError:
            text_mode = True
    if text_mode or isinstance(data, str):
        raise error(InvalidArgumentError, "the file object is open in text mode; open it with "
                    "'rb'", name)
    return (bytes(data), name)


def _open_source(source, strict, key, password, mmap=True):
    """A _ckpt.Checkpoint of `source` (metadata read, no tensor bytes)."""
    if isinstance(source, tuple):
        return _ckpt.Checkpoint.open_bytes(source[0], source[1], strict, _key(key),
                                           password or "")
    return _open_path(source, mmap, strict, key, password)


def _load(f, mmap, verify, strict, key, password, flat=False, device="cpu", progress=None,
          drop_cache=False):
    # One call: the bytes, the tensors and the tree (python/src/load.cc).
    fw = _framework(None)
    source = _source(f)
    if device == "meta":
        return _load_meta(source, strict, key, password, flat)
    return _ckpt.load(source, mmap, verify, strict, _key(key), password or "", flat, *_loader(fw),
                      device, progress, drop_cache)


def _load_meta(source, strict, key, password, flat):
    """map_location="meta": the file's tables only (no tensor byte is read), every tensor a
    torch meta tensor of its dtype, shape and strides. numpy arrays, whose bytes the pickle
    itself holds, come back as the arrays they are (as torch.load gives them)."""
    ck = _open_source(source, strict, key, password)
    _loader("torch")
    b = Builder(ck, "torch", ck.name)
    b.meta = True
    tensors = b.all()
    if flat:
        return {n: tensors[i] for n, i in ck.state_dict_entries()}
    if ck.format == "torchscript":
        return _script.state_dict(ck, tensors, lambda: ck.tree(tensors, _tree, 1000), True)
    return ck.tree(tensors, _tree, 1000)


def load_file(filename, device="cpu"):
    """safetensors.torch.load_file: a dict of name -> tensor, from any format ckpt reads (a
    torch checkpoint: its flattened state dict, dotted names). On the CPU the tensors are
    zero-copy views of a private copy-on-write mapping of the file (as load(mmap=True)): no
    byte is read until touched, as safetensors' own load_file maps the file."""
    device = _device(device, _framework(None))
    with _NoGC():
        return _load(filename, True, False, False, None, None, flat=True, device=device)


# --- safe_open ------------------------------------------------------------------------------

_ST_CODES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
             "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8",
             "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
             "complex64": "C64", "float8_e5m2": "F8_E5M2", "float8_e4m3fn": "F8_E4M3"}


class _Slice:
    """A tensor not yet read: get_shape(), get_dtype(), and [index] reads only that part."""

    def __init__(self, owner, index):
        self._o = owner
        self._i = index

    def get_shape(self):
        return list(self._o._b.infos[self._i][2])

    def get_dtype(self):
        dt = self._o._b.infos[self._i][1]
        return _ST_CODES.get(dt, dt)

    def __getitem__(self, idx):
        if self._o._ck.format == "torch-dcp":
            part = self._box(idx)
            if part is not None:
                return part
        view = self._o._view(self._i)
        part = view[idx]
        # A copy of the selected elements only: a view of a mapped file touches only their pages.
        return part.clone() if self._o._b.framework == "torch" else part.copy()


    def _box(self, idx):
        # Integers and step-1 slices: only the box they select is read (a DCP folder reads just
        # the chunks that meet it). Anything else: None (the whole tensor, then indexed).
        info = self._o._b.infos[self._i]
        shape, dt = list(info[2]), info[1]
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) > len(shape) or any(isinstance(x, bool) or not isinstance(x, (int, slice))
                                        for x in idx):
            return None
        begin, end, rest = [], [], []
        for d, n in enumerate(shape):
            x = idx[d] if d < len(idx) else slice(None)
            if isinstance(x, int):
                i = x + n if x < 0 else x
                if not 0 <= i < n:
                    return None
                begin.append(i), end.append(i + 1), rest.append(0)
            else:
                a, b, step = x.indices(n)
                if step != 1:
                    return None
                begin.append(a), end.append(max(a, b)), rest.append(slice(None))
        data = bytearray(self._o._ck.read_slice(self._i, begin, end))
        sizes = [e - b for b, e in zip(begin, end)]
        if self._o._b.framework == "torch":
            import torch
            dtype = getattr(torch, dt, None)
            if not isinstance(dtype, torch.dtype):
                return None
            flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        else:
            import numpy as np
            try:
                flat = np.frombuffer(data, dtype=np.dtype(dt))
            except TypeError:
                return None
        return flat.reshape(sizes)[tuple(rest)]


class safe_open:
    """safetensors' safe_open for every format ckpt reads.

        with ckpt.safe_open("model.safetensors", framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
            part = f.get_slice("emb.weight")[10:20]
            meta = f.metadata()

    The file is mapped (private, copy-on-write); get_tensor returns a zero-copy view where the
    bytes are stored raw, get_slice(name)[...] copies just the selected elements. Names are
    those of the flattened state dict (dotted paths) for torch files. framework: "pt" or "np".
    """

    def __init__(self, filename, framework="pt", device="cpu", *, key=None, password=None,
                 strict=False):
        fw = _framework(framework)
        self._device = _device(device, fw)
        self._ck = _open_source(_source(filename), strict, key, password)
        self._b = Builder(self._ck, fw, self._ck.name)
        self._b.meta = self._device == "meta"
        self._names = collections.OrderedDict(self._ck.state_dict_entries())
        self._lock = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Drops this handle; tensors already returned stay valid."""
        self._names = collections.OrderedDict()

    def keys(self):
        return list(self._names)

    def offset_keys(self):
        return list(self._names)

    def metadata(self):
        """safetensors' __metadata__ (dict of str), or None when the file has none."""
        props = self._ck.properties
        md = {k[len("metadata."):]: v for k, v in props.items() if k.startswith("metadata.")}
        return md or None

    def _index(self, name):
        i = self._names.get(name)
        if i is None:
            raise error(NotFoundError, f"no tensor named {name!r}", self._ck.name, name)
        return i

    def _view(self, i):
        with self._lock:
            need = [] if self._b.meta else self._b.need_storages([i])
            if need:
                bufs = self._ck.storages(need, False, self._device)
                for s, buf in zip(need, bufs):
                    if buf is not None:
                        self._b.storages[s] = buf
            return self._b.tensor(i)

    def get_tensor(self, name):
        return self._view(self._index(name))

    def get_slice(self, name):
        return _Slice(self, self._index(name))


# --- ckpt.open ------------------------------------------------------------------------------

open_builtin = open


def _recipe(recipe, strip_prefix, rename, add_prefix, keep, drop, cast, dequantize, split,
            fuse, transpose):
    """Checkpoint.convert's transform keywords as the JSON recipe the native layer parses."""
    import json as _json

    def many(x):
        if x is None:
            return []
        return [x] if isinstance(x, (str, bytes, os.PathLike, dict)) else list(x)

    if isinstance(recipe, (str, bytes, os.PathLike)):  # a JSON or YAML file, read natively
        recipe = _json.loads(_ckpt.transform_recipe_json(os.fsdecode(recipe)))
    r = dict(recipe or {})
    names = [{"strip_prefix": p} for p in many(strip_prefix)]
    for x in many(rename):
        names.append(x if isinstance(x, (str, dict)) else
                     {"regex": x[0], "replacement": x[1]})
    names += [{"add_prefix": p} for p in many(add_prefix)]
    if names:
        r["rename"] = list(r.get("rename", [])) + names
    for key, v in (("keep", keep), ("drop", drop), ("transpose", transpose), ("split", split),
                   ("fuse", fuse)):
        if v is not None:
            r[key] = many(r.get(key)) + many(v)
    if cast is not None:
        r["cast"] = cast
    if dequantize is not None:
        r["dequantize"] = dequantize if isinstance(dequantize, bool) else many(dequantize)
    return _json.dumps(r) if r else ""


class Checkpoint:
    """An opened checkpoint (metadata read; tensor bytes read when asked for). Made by
    :func:`ckpt.open`. Thread-safe."""

    def __init__(self, path, *, strict=False, key=None, password=None, mmap=True):
        self._path = os.fsdecode(path)
        self._ck = _open_path(self._path, mmap, strict, key, password)

    @property
    def format(self):
        """"torch-zip", "torch-legacy", "torchscript", "safetensors", "tensorizer" or "torch-dcp" (a folder)."""
        return self._ck.format

    @property
    def properties(self):
        """Format facts (version, alignment, byteorder, metadata.* for safetensors...)."""
        return dict(self._ck.properties)

    @property
    def tensors(self):
        """Every tensor's :class:`TensorInfo`, in table order."""
        return [TensorInfo(*t[:10]) for t in self._ck.tensor_infos()]

    def keys(self):
        """The flattened state dict's names (dotted paths)."""
        return [n for n, _ in self._ck.state_dict_entries()]

    def load(self, *, verify=False):
        """The whole object tree, eagerly loaded (like ckpt.load(path))."""
        with _NoGC():
            return _ckpt.load_checkpoint(self._ck, verify, *_loader(backend()))

    def verify(self):
        """Checks every stored CRC32; returns the number of records checked. Raises
        ckpt.CorruptError naming the first bad record."""
        return self._ck.verify()

    def digest(self, *, verify=False):
        """SHA-256 (hex) of every tensor's logical bytes, by flattened name (None for meta
        tensors): the same for a .pt and the .safetensors converted from it."""
        return dict(self._ck.digests(verify))

    def file_digest(self):
        """(file name, size, SHA-256 hex) of the whole file."""
        return tuple(self._ck.file_digest())

    def convert(self, dst, *, format=None, alignment=0, copy_shared=False, meta="refuse",
                key=None, key_file=None, password=None, store_digests=False,
                max_shard_size=0, fsync=True, progress=None, dcp_files=0, memory_budget=None,
                recipe=None, strip_prefix=None, rename=None, add_prefix=None, keep=None,
                drop=None, cast=None, dequantize=None, split=None, fuse=None, transpose=None):
        """Write this checkpoint in another format (what `ckpt convert` does); returns a report
        dict (format, tensors, tensor_bytes, bytes_written, not_written, ...). Atomic; fsync
        (default on, as `ckpt convert`) flushes it to disk first. progress: as for
        :func:`load`, with bytes written (called on this thread). A keyword of another format
        than the output's is refused (ckpt.InvalidArgumentError naming it). format="dcp": dst
        is a torch.distributed.checkpoint folder; dcp_files=N writes N data files as N ranks
        would (`ckpt convert --dcp-files`). A checkpoint that is not one mapped file (a DCP
        folder, a URL, compressed records) is streamed to the writer: memory_budget bytes of
        tensor data at most are read ahead (default 128 MiB; a larger tensor is held alone),
        as `ckpt convert --budget-mb`. A checkpoint opened from a folder written into a folder
        gets the input folder's config.json, generation_config.json and tokenizer files beside
        its weights, as `ckpt convert` copies them (the report's "model_files_copied").

        Transforms for serving (`ckpt convert --rename ...`, docs/python.md): recipe= a dict (or
        a JSON or YAML file's path) of rules as `--recipe` takes them, and keywords that add to it:
        strip_prefix= / add_prefix= a prefix or a list, rename= [(REGEX, REPLACEMENT), ...]
        (rename rules in the order strip_prefix, rename, add_prefix), keep= / drop= /
        transpose= globs, cast="bf16"|"fp16"|"fp32", dequantize=True (every scheme) or
        "fp8-block" / "mxfp4" or a list, split= ["NAME:DIM:P1,P2[:S1,S2]"], fuse=
        ["P1,P2:DIM:NAME"]. The report then has "transforms" ((rule, tensors) pairs) and
        "unmatched_rules"."""
        fmt = "" if format is None else format
        rules = _recipe(recipe, strip_prefix, rename, add_prefix, keep, drop, cast, dequantize,
                        split, fuse, transpose)
        if memory_budget is not None and memory_budget <= 0:
            raise error(InvalidArgumentError, "memory_budget must be more than 0 bytes",
                        os.fsdecode(dst))
        with _Progress(progress, "convert") as fn:
            return self._ck.convert(os.fsdecode(dst), fmt, alignment, copy_shared, meta,
                                    _key(key), key_file or "", password or "", store_digests,
                                    max_shard_size, bool(fsync), fn, dcp_files,
                                    int(memory_budget or 0), rules)

    def stream(self, budget, *, verify=False):
        """Iterate (name, tensor) in file order with at most ``budget`` bytes of storage in
        memory at once (plus the tensor being handed out, a copy the caller owns)."""
        import queue as _queue
        fw = backend()
        q = _queue.Queue(maxsize=1)
        stop = threading.Event()
        done = object()
        ck = self._ck
        sinfos = ck.storage_infos()

        def on_tensor(info, buf):
            if stop.is_set():
                raise error(InvalidArgumentError, "stream closed")
            q8 = info[8]
            if q8 is not None and q8[4] is not None:
                raise error(UnsupportedError, "stream() does not hand out per-channel quantized "
                            "tensors (load them with load())", ck.name, info[0])
            one = _OneTensor(info, sinfos)
            b = Builder(one, fw, ck.name)
            b.storages[info[5]] = _copy_buffer(buf, fw)
            t = b.tensor(0)
            while not stop.is_set():
                try:
                    q.put((info[0], t), timeout=0.1)
                    return
                except _queue.Full:
                    pass
            raise error(InvalidArgumentError, "stream closed")

        def run():
            try:
                ck.stream(budget, on_tensor, verify)
                q.put(done)
            except BaseException as e:  # handed to the consumer
                q.put(e)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    if isinstance(item, Error) and stop.is_set():
                        return
                    raise item
                yield item
        finally:
            stop.set()
            while th.is_alive():
                try:
                    q.get(timeout=0.05)
                except _queue.Empty:
                    pass
            th.join()


class _OneTensor:
    """A Builder's view of one streamed tensor."""

    def __init__(self, info, sinfos):
        self._info = [info]
        self._s = sinfos

    def tensor_infos(self):
        return self._info

    def storage_infos(self):
        return self._s


def _copy_buffer(buf, fw):
    if fw == "torch":
        import torch
        if len(buf) == 0:
            return torch.UntypedStorage(0)
        return _untyped_storage(torch.from_dlpack(buf).clone())  # own copy
    import numpy
    return numpy.array(memoryview(buf), dtype=numpy.uint8)


def set_kept_memory_limit(max_bytes):
    """The largest memory of a freed eager load kept for the next load (bytes; 0: keep none,
    and give back what is kept now). When the tensors of an eager load of 64 MiB or more are all
    freed, that memory is kept, lazily freed (the kernel takes it back under pressure), for the
    next load of a similar size, which then skips first-touch page faults. Default: half the
    machine's memory, or $CKPT_KEEP_ARENA_MB. Returns the previous limit."""
    before = _ckpt.kept_memory_limit()
    _ckpt.set_kept_memory_limit(int(max_bytes))
    return before


def release_kept_memory():
    """Gives the memory kept from a freed load back to the system now; returns its size."""
    return _ckpt.release_kept_memory()


def kept_memory():
    """Bytes of memory kept now from a freed load for the next one (0: none)."""
    return _ckpt.kept_memory()


def open(path, *, strict=False, key=None, password=None, mmap=True):  # noqa: A001
    """Open a checkpoint without loading tensors: a :class:`Checkpoint` with format, tensors,
    verify(), convert(), stream(), digest(). mmap=False reads with pread instead of mapping."""
    return Checkpoint(path, strict=strict, key=key, password=password, mmap=mmap)
