"""Exceptions carrying oscarkv status codes (the gRPC / absl codes of oscarkv_c.h).

Every failure of the library raises a subclass of :class:`OscarkvError` chosen by its code, with
``.code`` (int) and ``.code_name`` ("NOT_FOUND", ...). A few also derive from the matching
built-in exception so generic handlers work: InvalidArgumentError is a ValueError,
DeadlineExceededError a TimeoutError, UnavailableError a ConnectionError.
"""
from __future__ import annotations

import enum
from typing import Any, Dict, Optional, Type


class StatusCode(enum.IntEnum):
    """The status codes of the C ABI (OSCARKV_OK, OSCARKV_E_*)."""
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15


class OscarkvError(Exception):
    """Base class: an oscarkv call failed. ``code`` is the status code, ``message`` the text."""

    code: int = StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[int] = None, **details: Any) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        for k, v in details.items():
            setattr(self, k, v)

    @property
    def code_name(self) -> str:
        try:
            return StatusCode(self.code).name
        except ValueError:
            return "UNKNOWN_CODE"

    def __str__(self) -> str:
        return "%s: %s" % (self.code_name, self.message)


class CancelledError(OscarkvError):
    code = StatusCode.CANCELLED


class UnknownError(OscarkvError):
    code = StatusCode.UNKNOWN


class InvalidArgumentError(OscarkvError, ValueError):
    code = StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(OscarkvError, TimeoutError):
    code = StatusCode.DEADLINE_EXCEEDED


class NotFoundError(OscarkvError):
    code = StatusCode.NOT_FOUND


class AlreadyExistsError(OscarkvError):
    code = StatusCode.ALREADY_EXISTS


class PermissionDeniedError(OscarkvError):
    code = StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(OscarkvError):
    code = StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(OscarkvError):
    code = StatusCode.FAILED_PRECONDITION


class AbortedError(OscarkvError):
    code = StatusCode.ABORTED


class OutOfRangeError(OscarkvError):
    code = StatusCode.OUT_OF_RANGE


class UnimplementedError(OscarkvError):
    code = StatusCode.UNIMPLEMENTED


class InternalError(OscarkvError):
    code = StatusCode.INTERNAL


class UnavailableError(OscarkvError, ConnectionError):
    code = StatusCode.UNAVAILABLE


class DataLossError(OscarkvError):
    code = StatusCode.DATA_LOSS


_BY_CODE: Dict[int, Type[OscarkvError]] = {
    cls.code: cls for cls in (
        CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError, NotFoundError,
        AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError,
        FailedPreconditionError, AbortedError, OutOfRangeError, UnimplementedError, InternalError,
        UnavailableError, DataLossError)
}


def error_class(code: int) -> Type[OscarkvError]:
    """The exception class raised for a status code (OscarkvError for unknown codes)."""
    return _BY_CODE.get(code, OscarkvError)


def make_error(code: int, message: str, **details: Any) -> OscarkvError:
    cls = error_class(code)
    return cls(message, code=code, **details)
