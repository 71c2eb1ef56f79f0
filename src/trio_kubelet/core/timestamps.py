"""The API's timestamps (metav1.Time): RFC 3339 in UTC, whole seconds, e.g. 2026-11-22T10:00:00Z.

One formatter and one parser, so every status, condition and Event the kubelet writes shows
time the same way. Log timestamps (nanoseconds) and static pods' manifest stamps (microseconds)
are other formats and live with their users.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

__all__ = ["format_time", "parse_time"]

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(seconds: float) -> str:
    """Epoch seconds as a metav1.Time, e.g. 2026-11-22T10:00:00Z.

    The fraction is dropped before conversion, as Go's formatting truncates: converting the
    float first would round x.9999996 up to the next second.
    """
    return datetime.fromtimestamp(math.floor(seconds), tz=UTC).strftime(_FORMAT)


def parse_time(value: str | None) -> float:
    """A metav1.Time as epoch seconds.

    0.0 when unset, so a caller can fall back with ``parse_time(value) or now``.
    """
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
