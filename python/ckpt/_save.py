"""ckpt.save, save_file, save_model and load_model: Python objects to the library's writers
(python/src/save.cc), each writer's options as keywords; and the progress= argument."""

import collections
import io
import os
import sys

from . import _ckpt, _tree
from ._build import untyped_storage as _untyped_storage
from ._errors import Error, InvalidArgumentError, error, with_source

open_builtin = open


def _key(key):
    """A key as the C++ core takes it: "" for none, else 64 hex digits (or the text given)."""
    if key is None:
        return ""
    return key.hex() if isinstance(key, (bytes, bytearray)) else str(key)


class _Progress:
    """progress= of load/save: None, a callable fn(done, total), or True (a tqdm bar when tqdm
    is installed, else a percentage line on stderr). A context giving the callable to pass to
    the C++ core (None for none), closing the bar at the end."""

    def __init__(self, progress, what):
        self._bar = None
        self._what = what
        if progress is None or progress is False:
            self.fn = None
        elif progress is True:
            self.fn = self._default
        elif callable(progress):
            self.fn = progress
        else:
            raise error(InvalidArgumentError, f"progress={progress!r}: pass a callable "
                        "fn(done, total), True (a bar) or None")

    def _default(self, done, total):
        if self._bar is None:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=self._what)
            except ImportError:
                self._bar = False
        if self._bar is False:
            pct = 100.0 * done / total if total else 100.0
            sys.stderr.write(f"\r{self._what}: {pct:5.1f}%" + ("\n" if done >= total else ""))
            sys.stderr.flush()
            return
        if total != self._bar.total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def __enter__(self):
        return self.fn

    def __exit__(self, *exc):
        if self._bar:
            self._bar.close()
        return False


# --- saving ---------------------------------------------------------------------------------

class _naming_file:
    """A ckpt.Error raised inside that names no file (a value that cannot be saved) is raised
    naming ``path`` (and one naming ``replacing``, a temporary file, names ``path`` instead).
    A class, not contextlib's decorator: contextlib is not imported at `import ckpt`."""

    def __init__(self, path, replacing=""):
        self._path, self._replacing = path, replacing

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or not isinstance(e, Error):
            return False
        named = with_source(e, self._path, self._replacing)
        if named is None:
            return False
        raise named.with_traceback(tb) from None


def _file_object_name(f):
    if isinstance(f, io.TextIOBase):
        raise error(InvalidArgumentError, "the file object is open in text mode; open it with "
                    "'wb'", str(getattr(f, "name", "<stream>")))
    return str(getattr(f, "name", "<stream>"))


_FORMATS = {"pt": "pt", "torch": "pt", "safetensors": "safetensors", "tensorizer": "tensorizer",
            "dcp": "dcp"}


def _format_for(path, format):
    if format is not None:
        if format not in _FORMATS:
            raise error(InvalidArgumentError, f"unknown format {format!r} (pt, safetensors, "
                        "tensorizer, dcp)")
        return _FORMATS[format]
    p = path.lower()
    if p.endswith(".safetensors"):
        return "safetensors"
    if p.endswith(".tensors"):
        return "tensorizer"
    return "pt"


def _flat_items(obj, fmt):
    if not isinstance(obj, dict):
        raise error(InvalidArgumentError, f"{fmt} stores a dict of name -> tensor, not a "
                    f"{type(obj).__name__}")
    items = []
    for k, v in obj.items():
        if not isinstance(k, str):
            raise error(InvalidArgumentError, f"{fmt} tensor names are strings, not {k!r}")
        items.append((k, v))
    return items


def save(obj, f, *, format=None, metadata=None, fsync=False, progress=None, align=None,
         copy_shared=False, store_digests=False, key=None, key_file=None, password=None,
         dcp_files=None):
    """Write ``obj`` the way ``torch.save`` does (torch.load reads it), or as safetensors or
    tensorizer (from the file extension .safetensors / .tensors, or format="pt" |
    "safetensors" | "tensorizer"), or as a torch.distributed.checkpoint folder (format="dcp",
    which torch.distributed.checkpoint.load reads).

    pt: any tree of dict, OrderedDict, Counter, defaultdict, list, tuple, set, numbers, str,
    bytes, None, torch.Size, dtypes, layouts, devices, tensors (quantized and meta too),
    Parameters, numpy arrays, scalars and dtypes (pickled by numpy's own reduction, as
    torch.save does), argparse.Namespace, ckpt.Opaque / OpaqueDict / Global (written back as
    they were read): whatever ckpt.load returns. Storage sharing is kept.
    safetensors/tensorizer: a dict of name -> tensor.
    dcp: a dict (a state dict, nested as pt's): f is the folder (created whole; an existing
    non-empty folder is refused), tensors are stored under DCP's dotted keys, other values as
    torch.save'd bytes items; dcp_files=N writes N data files as N ranks would (each tensor's
    rows split as Shard(0) splits them; default 1). progress is called once, at the end.
    Atomic: the file appears complete or not at all (a temporary file renamed over the target).

    Every format: fsync (also flush the file and its folder to disk before the rename; torch.save
    does not; off by default), progress (as for :func:`load`, with bytes written).
    pt: align (payload alignment, a power of two below 65536; default 64).
    safetensors: metadata (__metadata__, str -> str), align (data start alignment, a power of
    two; default 8), copy_shared (write tensors sharing memory as separate copies instead of
    refusing them, as safetensors refuses), store_digests (each tensor's SHA-256 in
    __metadata__, which `ckpt verify` and Checkpoint.digest() check).
    tensorizer: encryption with key (32 raw bytes or 64 hex digits), key_file (a file holding
    such a key; when it does not exist, a new random key is written there first, mode 0600) or
    password (Argon2id). Returns the raw 32-byte key when encrypting.
    A keyword of another format is refused (ckpt.InvalidArgumentError naming it).
    f: a path (str, pathlib.Path) or a binary file object. A value that cannot be saved raises
    ckpt.InvalidArgumentError naming where it is (``a.b[1]``). Raises ckpt.Error.
    """
    kw = dict(metadata=metadata, fsync=fsync, progress=progress, align=align,
              copy_shared=copy_shared, store_digests=store_digests, key=key, key_file=key_file,
              password=password)
    if not isinstance(f, (str, bytes, os.PathLike)):
        import tempfile
        name = _file_object_name(f)
        fmt = _format_for("", format)
        if fmt == "dcp":
            raise error(InvalidArgumentError, "format='dcp' writes a folder: pass its path", name)
        with tempfile.TemporaryDirectory() as d:
            tmp = os.path.join(d, "out")
            with _naming_file(name, tmp):
                out = save(obj, tmp, format=fmt, **kw)
            with open_builtin(tmp, "rb") as src:
                while True:
                    chunk = src.read(1 << 24)
                    if not chunk:
                        break
                    f.write(chunk)
        return out
    path = os.fsdecode(f)
    fmt = _format_for(path, format)
    _only_for(fmt, path, metadata=(metadata is not None, "safetensors"),
              copy_shared=(bool(copy_shared), "safetensors"),
              store_digests=(bool(store_digests), "safetensors"),
              key=(key is not None, "tensorizer"), key_file=(key_file is not None, "tensorizer"),
              password=(password is not None, "tensorizer"),
              align=(align is not None, ("pt", "safetensors")),
              dcp_files=(dcp_files is not None, "dcp"))
    with _naming_file(path), _Progress(progress, "save") as fn:
        if fmt == "pt":
            _ckpt.save_torch(path, obj, _tree, _align(align), "", bool(fsync), fn)
        elif fmt == "safetensors":
            _save_safetensors(obj, path, metadata, fsync, fn, align, copy_shared, store_digests)
        elif fmt == "dcp":
            if not isinstance(obj, dict):
                raise error(InvalidArgumentError, "dcp stores a state dict (a dict), not a "
                            f"{type(obj).__name__}", path)
            files = 1 if dcp_files is None else dcp_files
            if not isinstance(files, int) or isinstance(files, bool) or not 1 <= files <= 4096:
                raise error(InvalidArgumentError, f"dcp_files={dcp_files!r}: 1 to 4096", path)
            _ckpt.save_dcp(path, obj, _tree, files, bool(fsync), fn)
        else:
            if key_file is not None and key is None:
                key = _key_from_file(os.fsdecode(key_file))
            raw = _ckpt.save_tensorizer(path, _flat_items(obj, "tensorizer"), _tree, _key(key),
                                        password or "", bool(fsync), fn)
            return raw or None


def _only_for(fmt, path, **given):
    # keyword=(set, format or formats it belongs to): a keyword of another format is refused.
    for name, (is_set, owners) in given.items():
        owners = (owners,) if isinstance(owners, str) else owners
        if is_set and fmt not in owners:
            raise error(InvalidArgumentError, f"{name}= applies to {' and '.join(owners)} "
                        f"output only, not {fmt}", path)


def _align(align):
    if align is None:
        return 0
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0:
        raise error(InvalidArgumentError, f"align={align!r}: a power of two")
    return align


def _key_from_file(path):
    """The key in `path` (64 hex digits or 32 raw bytes), or a new random one written there
    (64 hex digits and a newline, mode 0600, never over another file)."""
    try:
        with open_builtin(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        key = os.urandom(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.hex() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return key
    stripped = data.rstrip(b" \t\r\n")
    if len(stripped) == 64:
        try:
            return bytes.fromhex(stripped.decode("ascii"))
        except ValueError:
            pass
    if len(data) == 32:
        return data
    raise error(InvalidArgumentError, "a key file holds 64 hex digits or 32 raw bytes", path)


def _save_safetensors(tensors, path, metadata, fsync, progress, align=None, copy_shared=False,
                      store_digests=False):
    md = dict(metadata or {})
    for k, v in md.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise error(InvalidArgumentError, "safetensors metadata maps str to str")
    _ckpt.save_safetensors(path, _flat_items(tensors, "safetensors"), md, _tree, _align(align),
                           bool(fsync), progress, bool(copy_shared), bool(store_digests))


def save_file(tensors, filename, metadata=None):
    """safetensors.torch.save_file: write a dict of name -> tensor (and str -> str metadata).
    Tensors sharing memory are refused (ckpt.InvalidArgumentError), as safetensors does.
    filename: a path or a binary file object."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        return save(tensors, filename, format="safetensors", metadata=metadata)
    path = os.fsdecode(filename)
    with _naming_file(path):
        _save_safetensors(tensors, path, metadata, False, None)


# --- whole models ---------------------------------------------------------------------------

def _alias_groups(sd):
    """Names of a state dict grouped by the tensor they are (the same storage, offset, shape,
    strides and dtype: tied weights), in state-dict order; single names are groups of one."""
    groups = collections.OrderedDict()
    for name, t in sd.items():
        try:
            s = _untyped_storage(t)
            ident = (s.data_ptr(), s.nbytes(), t.storage_offset(), tuple(t.shape),
                     tuple(t.stride()), t.dtype, t.device.type) if s.nbytes() else ("own", name)
        except (AttributeError, RuntimeError, TypeError):
            ident = ("own", name)
        groups.setdefault(ident, []).append(name)
    return list(groups.values())


def save_model(model, filename, metadata=None, **options):
    """safetensors.torch.save_model for every format ckpt writes (from the extension, or
    format=): ``model.state_dict()`` with each tied tensor (one tensor under several names,
    e.g. an embedding and an output layer sharing their weight) saved once, under its first
    name in state-dict order. Tensors that only overlap (different views of one storage) are
    written as separate copies in safetensors and tensorizer, shared in a .pt file. options:
    the keywords of :func:`save` (fsync, progress, align, store_digests, key, ...)."""
    sd = model.state_dict()
    keep = collections.OrderedDict()
    for names in _alias_groups(sd):
        keep[names[0]] = sd[names[0]]
    fmt = options.get("format") or (_format_for(os.fsdecode(filename), None)
                                    if isinstance(filename, (str, bytes, os.PathLike)) else "pt")
    if fmt == "safetensors":
        options.setdefault("copy_shared", True)
        if metadata is not None:
            options["metadata"] = metadata
    elif metadata is not None:
        raise error(InvalidArgumentError, f"metadata= applies to safetensors output only, "
                    f"not {fmt}")
    keep = collections.OrderedDict((k, v.detach()) for k, v in keep.items())
    return save(keep, filename, **options)


def load_model(model, filename, strict=True, device="cpu", **options):
    """safetensors.torch.load_model for every format ckpt reads: loads the file's tensors into
    ``model`` (``model.load_state_dict(..., strict=False)``), counting a tied name the file
    lacks as loaded when the name it is tied to was (save_model keeps one name per tied tensor;
    the model's own tying makes both hold the values). Returns (missing, unexpected) name lists;
    strict=True raises ckpt.InvalidArgumentError naming them when either is not empty.
    device: where the file's tensors are loaded first (as load_file's device). options: load
    keywords (key, password, progress...)."""
    from . import load, load_file
    if options:
        sd = load(filename, map_location=device, **options)
        if not isinstance(sd, dict):
            raise error(InvalidArgumentError, f"{filename}: not a state dict "
                        f"({type(sd).__name__})")
    else:
        sd = load_file(filename, device=device)
    groups = _alias_groups(model.state_dict())
    covered = set()
    for names in groups:
        if any(n in sd for n in names):
            covered.update(n for n in names if n not in sd)
    result = model.load_state_dict(sd, strict=False)
    missing = [n for n in result.missing_keys if n not in covered]
    unexpected = list(result.unexpected_keys)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append("missing: " + ", ".join(missing))
        if unexpected:
            parts.append("unexpected: " + ", ".join(unexpected))
        raise error(InvalidArgumentError, "the file does not match the model (" +
                    "; ".join(parts) + ")", str(getattr(filename, "name", filename)))
    return missing, unexpected
