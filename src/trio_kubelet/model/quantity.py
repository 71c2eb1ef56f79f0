"""Kubernetes resource quantities ("100m", "128Mi", "1e3") parsed to exact fractions.

The grammar is the API machinery's: an optionally signed decimal number followed by
a binary suffix (Ki … Ei), a decimal SI suffix (n u m "" k M G T P E) or a decimal
exponent (e3, E-2). Values are returned as :class:`fractions.Fraction` so that
"0.1" + "0.2" == "300m" holds exactly, which resource accounting and QoS rely on.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache
from math import ceil

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

_QUANTITY = re.compile(
    r"""^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))
         (?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)
           |[eE](?P<exponent>[+-]?[0-9]+)
           |(?P<decimal>[numkMGTPE]?))$""",
    re.VERBOSE,
)


# Bounds on what a quantity may spell, so that parsing one stays cheap whatever it says.
MAX_QUANTITY_CHARS = 128
MAX_EXPONENT = 128


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


# Pods carry a handful of distinct quantities that the eviction rounds, admission and the
# cgroup settings parse again and again; Fractions are immutable, so results are shared.
@lru_cache(maxsize=4096, typed=True)
def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity; ints and floats (as YAML gives them) are accepted too."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r} must be a number or a string")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {value!r} must be a finite number")
        # Through repr(): YAML's 0.1 should mean one tenth, not the nearest binary double.
        return Fraction(repr(value))
    match = _QUANTITY.match(value.strip()) if len(value) <= MAX_QUANTITY_CHARS else None
    if match is None:
        raise QuantityError(f"quantity {value!r} must match '<number><suffix>', e.g. 100m, 128Mi")
    number = Fraction(match["number"])
    if match["binary"]:
        return number * Fraction(1024) ** _BINARY[match["binary"]]
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > MAX_EXPONENT:  # 1e1000000000 would take forever to compute
            raise QuantityError(f"quantity {value!r} is out of range (exponent beyond "
                                f"±{MAX_EXPONENT})")
        return number * Fraction(10) ** exponent
    return number * Fraction(10) ** _DECIMAL[match["decimal"] or ""]


def is_quantity(value: str | int | float) -> bool:
    """Whether ``value`` parses as a quantity."""
    try:
        parse_quantity(value)
    except QuantityError:
        return False
    return True


_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P"}


def format_quantity(value: Fraction | int, *, binary: bool = False) -> str:
    """How Go's resource.Quantity prints ``value`` in its canonical form.

    ``binary`` is Go's BinarySI format (bytes): a power-of-1024 suffix when the value is an
    integer of at least 1024 (``16318420Ki``, ``56453061600``); otherwise DecimalSI: the
    largest power-of-1000 suffix that keeps the number whole (``7900m``, ``8``, ``1k``).
    """
    value = Fraction(value)
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    if binary and magnitude >= 1024 and magnitude.denominator == 1:
        number, power = int(magnitude), 0
        while number % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
            number, power = number // 1024, power + 1
        return f"{sign}{number}{_BINARY_SUFFIXES[power]}"
    number, exponent = ceil(magnitude * 10**9), -9  # Go keeps nano precision, rounding up
    while number % 1000 == 0 and exponent < 15:
        number, exponent = number // 1000, exponent + 3
    return f"{sign}{number}{_DECIMAL_SUFFIXES[exponent]}"
