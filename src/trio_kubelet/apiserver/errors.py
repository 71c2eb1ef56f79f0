"""Typed API-server errors, decided from the HTTP status and the Status object's reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class APIError(Exception):
    """The API server answered with an error, or could not be reached (``status`` 0)."""

    def __init__(
        self, status: int, reason: str, message: str, *, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{reason} ({status}): {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class Unreachable(APIError):
    """No HTTP answer at all: connection refused, TLS failure, timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "Unreachable", message)


class Unauthorized(APIError):
    pass


class Forbidden(APIError):
    pass


class NotFound(APIError):
    pass


class Conflict(APIError):
    """A precondition (resourceVersion, UID) did not hold."""


class AlreadyExists(Conflict):
    pass


class Gone(APIError):
    """The resourceVersion asked for is too old: list again."""


class Invalid(APIError):
    pass


class TooManyRequests(APIError):
    pass


class ServerError(APIError):
    pass


_BY_STATUS: dict[int, type[APIError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_from_status(
    status: int, body: Mapping[str, Any] | None, retry_after: str | None = None
) -> APIError:
    """The typed error for an HTTP error answer (``body`` is the Status object, if JSON)."""
    reason = str(body.get("reason", "")) if body else ""
    message = str(body.get("message", "")) if body else ""
    if status == 409 and reason == "AlreadyExists":
        cls: type[APIError] = AlreadyExists
    else:
        cls = _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    delay: float | None = None
    if retry_after:
        try:
            delay = max(0.0, float(retry_after))
        except ValueError:
            delay = None
    return cls(status, reason or _DEFAULT_REASON.get(status, "Unknown"), message, retry_after=delay)


_DEFAULT_REASON = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
