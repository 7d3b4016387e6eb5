"""ckpt.Error and one subclass per error code of the C++ library (include/ckpt/error.h).

Each subclass is also the builtin exception that fits, so code written for torch.load and
safetensors catches it: NotFoundError is a FileNotFoundError, IoError an OSError,
InvalidArgumentError and LimitExceededError ValueErrors, UnsupportedError a NotImplementedError.
``except ckpt.Error`` still catches them all.
"""

import errno as _errno
import threading

__all__ = [
    "Error", "IoError", "NotFoundError", "TruncatedError", "CorruptError", "UnsupportedError",
    "LimitExceededError", "InvalidArgumentError", "AuthError", "ForbiddenGlobalError",
    "NotACheckpointDirError",
]


class Error(Exception):
    """A ckpt error. ``str(e)`` reads "<file>: <record>: at byte <offset>: <message> [code]".

    Attributes: ``code`` ("corrupt", "truncated", ...), ``source`` (the file), ``record`` (the
    record or tensor, may be ""), ``offset`` (byte offset or None), ``message`` (the bare
    message).
    """

    code = None

    def __init__(self, text, code=None, source="", record="", offset=None, message=None):
        super().__init__(text)
        if code is not None:
            self.code = code
        self.source = source
        self.record = record
        self.offset = offset
        self.message = text if message is None else message


class _OSErrorMixin:
    # OSError's fields: errno (where the code implies one) and filename (the file), while
    # str(e) stays ckpt's text.
    _errno = None

    def __init__(self, text, code=None, source="", record="", offset=None, message=None):
        Error.__init__(self, text, code, source, record, offset, message)
        self.errno = self._errno
        self.strerror = self.message
        self.filename = source or None

    def __str__(self):
        return self.args[0] if self.args else ""


class IoError(_OSErrorMixin, Error, OSError):
    """The OS refused a read, write, open or mmap. Also an OSError."""
    code = "io"


class NotFoundError(_OSErrorMixin, Error, FileNotFoundError):
    """A file, record, tensor or key that should exist does not. Also a FileNotFoundError
    (an OSError): ``except FileNotFoundError`` / ``except OSError`` catch a missing file."""
    code = "not_found"
    _errno = _errno.ENOENT


class TruncatedError(Error):
    """The data ends before a structure it declares (an empty file too)."""
    code = "truncated"


class CorruptError(Error):
    """Bytes that cannot be what the format says (bad magic, CRC, opcode); a failed verify."""
    code = "corrupt"


class UnsupportedError(Error, NotImplementedError):
    """Valid but not handled (an unknown global with strict=True, a dtype...). Also a
    NotImplementedError: the input is not wrong, ckpt does not do it."""
    code = "unsupported"


_forbidden_lock = threading.Lock()


def _forbidden_global_error():
    """ForbiddenGlobalError, made on first use: its base pickle.UnpicklingError needs the pickle
    module, which `import ckpt` does not import."""
    with _forbidden_lock:  # one class, whichever thread makes it
        cls = globals().get("ForbiddenGlobalError")
        if cls is not None:
            return cls
        import pickle

        class ForbiddenGlobalError(UnsupportedError, pickle.UnpicklingError):
            """strict=True (weights_only=True) met a class or function outside torch's
            weights_only list. Also a pickle.UnpicklingError, as torch.load(weights_only=True)
            raises, so code that falls back to a full load on ``except pickle.UnpicklingError``
            catches it."""

        ForbiddenGlobalError.__qualname__ = "ForbiddenGlobalError"
        globals()["ForbiddenGlobalError"] = ForbiddenGlobalError
        return ForbiddenGlobalError


def __getattr__(name):
    if name == "ForbiddenGlobalError":
        return _forbidden_global_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class LimitExceededError(Error, ValueError):
    """A configurable limit was hit (metadata size, tensor count, nesting depth...). Also a
    ValueError (the input is larger than allowed; not a MemoryError: nothing ran out)."""
    code = "limit_exceeded"


class InvalidArgumentError(Error, ValueError):
    """The caller asked for something impossible. Also a ValueError."""
    code = "invalid_argument"


class AuthError(Error):
    """A wrong key or password, or tampered ciphertext."""
    code = "auth"


class NotACheckpointDirError(_OSErrorMixin, InvalidArgumentError, IsADirectoryError):
    """A folder that is not a checkpoint (no DCP ``.metadata``): an InvalidArgumentError that is
    also an IsADirectoryError (errno EISDIR), as torch.load and safetensors raise for a folder."""
    _errno = _errno.EISDIR


_BY_CODE = {c.code: c for c in (IoError, NotFoundError, TruncatedError, CorruptError,
                                UnsupportedError, LimitExceededError, InvalidArgumentError,
                                AuthError)}


def class_for(code, message=""):
    """The class of a library error: by its code; a strict refusal of a global (the
    unpickler's "global 'm.n' is not allowed") and a folder that is not a checkpoint ("is a
    directory") by their messages."""
    if code == "unsupported" and message.startswith("global '") and "is not allowed" in message:
        return _forbidden_global_error()
    if code == "invalid_argument" and message.startswith("is a directory"):
        return NotACheckpointDirError
    return _BY_CODE.get(code, Error)


def at_record(exc, record):
    """exc (a ckpt.Error raised while converting a value) remade naming ``record`` (where the
    value is); None for anything else."""
    if not isinstance(exc, Error) or exc.record:
        return None
    parts = [p for p in (exc.source, record) if p]
    text = ": ".join(parts + [exc.message]) + " [" + str(exc.code) + "]"
    return type(exc)(text, exc.code, exc.source, record, exc.offset, exc.message)


def with_source(exc, source, replacing=""):
    """exc (a ckpt.Error that names no file, or names ``replacing``) remade naming ``source``;
    None for anything else."""
    if not isinstance(exc, Error) or not source or exc.source not in ("", replacing):
        return None
    parts = [p for p in (source, exc.record) if p]
    text = ": ".join(parts + [exc.message]) + " [" + str(exc.code) + "]"
    return type(exc)(text, exc.code, source, exc.record, exc.offset, exc.message)


def error(cls, message, source="", record=""):
    """An error raised by the Python layer, formatted like the library's."""
    parts = [p for p in (source, record) if p]
    return cls(": ".join(parts + [message]) + " [" + cls.code + "]", cls.code, source, record,
               None, message)
