"""parse_quantity: the API's quantity grammar, exactly."""

from __future__ import annotations

from fractions import Fraction

import pytest

from trio_kubelet.model.quantity import QuantityError, is_quantity, parse_quantity


@pytest.mark.parametrize("text, value", [
    ("100m", Fraction(1, 10)),
    ("1", Fraction(1)),
    ("128Mi", Fraction(128 * 1024**2)),
    ("1G", Fraction(10**9)),
    ("1e3", Fraction(1000)),
    ("1E3", Fraction(1000)),
    ("1E", Fraction(10**18)),
    ("2Ei", Fraction(2 * 1024**6)),
    ("1.5Gi", Fraction(3 * 1024**3, 2)),
    ("0.1", Fraction(1, 10)),
    (".5", Fraction(1, 2)),
    ("5n", Fraction(5, 10**9)),
    ("250u", Fraction(250, 10**6)),
    ("1e-3", Fraction(1, 1000)),
    ("+2k", Fraction(2000)),
    ("-1Ki", Fraction(-1024)),
    ("0", Fraction(0)),
    (" 64Mi ", Fraction(64 * 1024**2)),
])
def test_parses(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


def test_numbers_from_yaml() -> None:
    assert parse_quantity(2) == 2
    assert parse_quantity(0.1) == Fraction(1, 10)
    assert parse_quantity(0.5) + parse_quantity("500m") == 1


@pytest.mark.parametrize("text", ["", "m", "Mi", "1Kii", "1x", "1.2.3", "1 Mi", "e3", "1e",
                                  "1mi", "0x10", "--1"])
def test_rejects(text: str) -> None:
    with pytest.raises(QuantityError, match="must match"):
        parse_quantity(text)
    assert not is_quantity(text)


def test_rejects_booleans() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)


@pytest.mark.parametrize("value", ["1e1000000000", "1E-129", "1" * 129, float("inf"), float("nan")])
def test_quantities_out_of_range_are_refused_at_once(value: str | float) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)
    assert parse_quantity("1e128") == 10**128
