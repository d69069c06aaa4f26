"""Exceptions raised by zcc.

Every error the C++ client or zccd reports arrives as an ``absl::Status``; the
binding raises the class below for its code, with the daemon's message as the
exception text. Each class also derives from the built-in exception a Python
caller would naturally catch:

=====================  ===========================  ==========================
absl code              zcc class                    also a
=====================  ===========================  ==========================
INVALID_ARGUMENT       InvalidArgumentError         ValueError
OUT_OF_RANGE           OutOfRangeError              ValueError
NOT_FOUND              NotFoundError                LookupError
ALREADY_EXISTS         AlreadyExistsError           RuntimeError
FAILED_PRECONDITION    FailedPreconditionError      RuntimeError
ABORTED                AbortedError                 RuntimeError
UNAVAILABLE            UnavailableError             ConnectionError
DEADLINE_EXCEEDED      DeadlineExceededError        TimeoutError
PERMISSION_DENIED      PermissionDeniedError        PermissionError
UNAUTHENTICATED        PermissionDeniedError        PermissionError
RESOURCE_EXHAUSTED     ResourceExhaustedError       RuntimeError
DATA_LOSS              DataLossError                RuntimeError
UNIMPLEMENTED          UnimplementedError           NotImplementedError
CANCELLED              CancelledError               RuntimeError
anything else          Error                        -
=====================  ===========================  ==========================

All derive from :class:`zcc.Error`, which carries ``code`` (the absl code
name, e.g. ``"NOT_FOUND"``) and ``message`` (the daemon's text).
"""


class Error(Exception):
    """Base class of every zcc error: ``code`` (absl code name) and ``message``."""

    code = "UNKNOWN"

    def __init__(self, message="", code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self):
        return self.message


class InvalidArgumentError(Error, ValueError):
    code = "INVALID_ARGUMENT"


class OutOfRangeError(Error, ValueError):
    code = "OUT_OF_RANGE"


class NotFoundError(Error, LookupError):
    code = "NOT_FOUND"


class AlreadyExistsError(Error, RuntimeError):
    code = "ALREADY_EXISTS"


class FailedPreconditionError(Error, RuntimeError):
    code = "FAILED_PRECONDITION"


class AbortedError(Error, RuntimeError):
    code = "ABORTED"


class UnavailableError(Error, ConnectionError):
    code = "UNAVAILABLE"


class DeadlineExceededError(Error, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class PermissionDeniedError(Error, PermissionError):
    code = "PERMISSION_DENIED"


class ResourceExhaustedError(Error, RuntimeError):
    code = "RESOURCE_EXHAUSTED"


class DataLossError(Error, RuntimeError):
    code = "DATA_LOSS"


class UnimplementedError(Error, NotImplementedError):
    code = "UNIMPLEMENTED"


class CancelledError(Error, RuntimeError):
    code = "CANCELLED"


_BY_CODE = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "OUT_OF_RANGE": OutOfRangeError,
    "NOT_FOUND": NotFoundError,
    "ALREADY_EXISTS": AlreadyExistsError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "ABORTED": AbortedError,
    "UNAVAILABLE": UnavailableError,
    "DEADLINE_EXCEEDED": DeadlineExceededError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "UNAUTHENTICATED": PermissionDeniedError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
    "DATA_LOSS": DataLossError,
    "UNIMPLEMENTED": UnimplementedError,
    "CANCELLED": CancelledError,
}


def from_status(code_number, code_name, message):
    """The exception for an absl status (called by the binding)."""
    del code_number  # the name is the stable spelling
    cls = _BY_CODE.get(code_name, Error)
    return cls(message, code=code_name)
