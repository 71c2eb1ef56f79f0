"""Go duration strings ("20s", "1m0s", "1h2m3.5s", "300ms") to and from float seconds.

Kubernetes configuration writes durations the way Go's ``time.ParseDuration`` reads
them and ``time.Duration.String`` prints them; this module does both so an
operator's KubeletConfiguration means the same here and round-trips unchanged.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal

_NS_PER_UNIT: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek small letter mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_NUMBER = re.compile(r"(\d*)(?:\.(\d*))?")
_UNIT = re.compile(r"[^\d.]*")


class DurationError(ValueError):
    """A string that is not a Go duration; the message quotes it and says what is wrong."""


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds (negative values are allowed, as in Go)."""
    rest = text
    sign = 1
    if rest[:1] in ("+", "-"):
        sign = -1 if rest[0] == "-" else 1
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise DurationError(f"invalid duration {_quote(text)}: empty")
    total = Decimal(0)
    while rest:
        number = _NUMBER.match(rest)
        assert number is not None  # the pattern also matches the empty string
        whole, fraction = number.group(1), number.group(2)
        if not whole and not fraction:
            raise DurationError(
                f"invalid duration {_quote(text)}: expected a number at {_quote(rest)}"
            )
        rest = rest[number.end() :]
        unit_match = _UNIT.match(rest)
        unit = unit_match.group(0) if unit_match else ""
        if not unit:
            raise DurationError(
                f"invalid duration {_quote(text)}: missing unit (ns, us, ms, s, m or h)"
            )
        if unit not in _NS_PER_UNIT:
            raise DurationError(
                f"invalid duration {_quote(text)}: unknown unit {_quote(unit)} "
                "(expected ns, us, ms, s, m or h)"
            )
        rest = rest[len(unit) :]
        total += Decimal(f"{whole or '0'}.{fraction or '0'}") * _NS_PER_UNIT[unit]
    return sign * float(total / 1_000_000_000)


def _trim_fraction(whole: int, fraction: int, digits: int) -> str:
    if not fraction:
        return str(whole)
    return f"{whole}.{fraction:0{digits}d}".rstrip("0")


def format_duration(seconds: float) -> str:
    """Render seconds as Go's ``time.Duration.String`` does: "0s", "300ms", "1m0s", "1h2m3.5s"."""
    ns = round(seconds * 1_000_000_000)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_trim_fraction(ns // 1_000, ns % 1_000, 3)}\u00b5s"
    if ns < 1_000_000_000:
        return f"{sign}{_trim_fraction(ns // 1_000_000, ns % 1_000_000, 6)}ms"
    total_seconds, fraction = divmod(ns, 1_000_000_000)
    hours, remainder = divmod(total_seconds, 3600)
    minutes, secs = divmod(remainder, 60)
    text = f"{_trim_fraction(secs, fraction, 9)}s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return sign + text
