"""ckpt.Error and one subclass per error code of the C++ library (include/ckpt/error.h)."""

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


class IoError(Error):
    """The OS refused a read, write, open or mmap."""
    code = "io"


class NotFoundError(Error):
    """A file, record, tensor or key that should exist does not."""
    code = "not_found"


class TruncatedError(Error):
    """The data ends before a structure it declares (an empty file too)."""
    code = "truncated"


class CorruptError(Error):
    """Bytes that cannot be what the format says (bad magic, CRC, opcode); a failed verify."""
    code = "corrupt"


class UnsupportedError(Error):
    """Valid but not handled (an unknown global with strict=True, a dtype...)."""
    code = "unsupported"


class LimitExceededError(Error):
    """A configurable limit was hit (metadata size, tensor count, nesting depth...)."""
    code = "limit_exceeded"


class InvalidArgumentError(Error, ValueError):
    """The caller asked for something impossible."""
    code = "invalid_argument"


class AuthError(Error):
    """A wrong key or password, or tampered ciphertext."""
    code = "auth"


_BY_CODE = {c.code: c for c in (IoError, NotFoundError, TruncatedError, CorruptError,
                                UnsupportedError, LimitExceededError, InvalidArgumentError,
                                AuthError)}


def class_for(code):
    return _BY_CODE.get(code, Error)


def error(cls, message, source="", record=""):
    """An error raised by the Python layer, formatted like the library's."""
    parts = [p for p in (source, record) if p]
    return cls(": ".join(parts + [message]) + " [" + cls.code + "]", cls.code, source, record,
               None, message)
