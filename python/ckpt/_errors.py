"""ckpt.Error and one subclass per error code of the C++ library (include/ckpt/error.h).

Each subclass is also the builtin exception that fits, so code written for torch.load and
safetensors catches it: NotFoundError is a FileNotFoundError, IoError an OSError,
InvalidArgumentError and LimitExceededError ValueErrors, UnsupportedError a NotImplementedError.
``except ckpt.Error`` still catches them all.
"""

import errno as _errno

__all__ = [
    "Error", "IoError", "NotFoundError", "TruncatedError", "CorruptError", "UnsupportedError",
    "LimitExceededError", "InvalidArgumentError", "AuthError",
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


_BY_CODE = {c.code: c for c in (IoError, NotFoundError, TruncatedError, CorruptError,
                                UnsupportedError, LimitExceededError, InvalidArgumentError,
                                AuthError)}


def class_for(code):
    return _BY_CODE.get(code, Error)


def at_record(exc, record):
    """exc (a ckpt.Error raised while converting a value) remade naming ``record`` (where the
    value is); None for anything else."""
    if not isinstance(exc, Error) or exc.record:
        return None
    parts = [p for p in (exc.source, record) if p]
    text = ": ".join(parts + [exc.message]) + " [" + str(exc.code) + "]"
    return type(exc)(text, exc.code, exc.source, record, exc.offset, exc.message)


def error(cls, message, source="", record=""):
    """An error raised by the Python layer, formatted like the library's."""
    parts = [p for p in (source, record) if p]
    return cls(": ".join(parts + [message]) + " [" + cls.code + "]", cls.code, source, record,
               None, message)
