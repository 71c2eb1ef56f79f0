"""Typed errors for failed CRI calls, so callers branch on a class instead of a gRPC code."""

from __future__ import annotations

import enum


class StatusCode(enum.IntEnum):
    """gRPC status codes (same numbers as the wire), without importing a gRPC library."""

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
    UNAUTHENTICATED = 16


class CRIError(Exception):
    """A CRI call failed; ``method`` is the RPC name (e.g. "StartContainer")."""

    #: Whether retrying the same call later may succeed (runtime restarting, overloaded...).
    temporary: bool = False

    def __init__(self, method: str, code: StatusCode, message: str) -> None:
        super().__init__(method, code, message)
        self.method = method
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"CRI {self.method} failed: {self.code.name}: {self.message or '(no message)'}"


class CRINotFound(CRIError):
    """The sandbox, container or image named in the request does not exist."""


class CRIAlreadyExists(CRIError):
    """A sandbox or container with that name is already reserved."""


class CRIInvalidArgument(CRIError):
    """The runtime rejected the request itself (bad config, bad filter)."""


class CRIFailedPrecondition(CRIError):
    """The object is not in a state that allows the operation."""


class CRIUnimplemented(CRIError):
    """The runtime does not implement this RPC (e.g. an older containerd)."""


class CRIUnknown(CRIError):
    """The runtime failed without a specific code (containerd's usual answer)."""


class CRIUnavailable(CRIError):
    """The runtime cannot be reached: socket missing, connection refused or lost, UNAVAILABLE."""

    temporary = True


class CRIDeadlineExceeded(CRIError):
    """The call did not finish within its deadline."""

    temporary = True


class CRIResourceExhausted(CRIError):
    """The runtime is out of some resource; later may work."""

    temporary = True


_BY_CODE: dict[StatusCode, type[CRIError]] = {
    StatusCode.NOT_FOUND: CRINotFound,
    StatusCode.ALREADY_EXISTS: CRIAlreadyExists,
    StatusCode.INVALID_ARGUMENT: CRIInvalidArgument,
    StatusCode.FAILED_PRECONDITION: CRIFailedPrecondition,
    StatusCode.UNIMPLEMENTED: CRIUnimplemented,
    StatusCode.UNKNOWN: CRIUnknown,
    StatusCode.UNAVAILABLE: CRIUnavailable,
    StatusCode.DEADLINE_EXCEEDED: CRIDeadlineExceeded,
    StatusCode.RESOURCE_EXHAUSTED: CRIResourceExhausted,
}


def error_for(method: str, code: int, message: str) -> CRIError:
    """The most specific CRIError subclass for a gRPC status code."""
    try:
        status = StatusCode(code)
    except ValueError:
        status = StatusCode.UNKNOWN
    return _BY_CODE.get(status, CRIError)(method, status, message)
