"""core/timestamps.py: the one formatter and parser of the API's whole-second UTC timestamps."""

from __future__ import annotations

import pytest

from trio_kubelet.core.timestamps import format_time, parse_time

T0 = 1_700_000_000  # 2023-11-14T22:13:20Z
T0_TEXT = "2023-11-14T22:13:20Z"


def test_round_trip() -> None:
    assert format_time(T0) == T0_TEXT
    assert parse_time(T0_TEXT) == T0
    assert format_time(parse_time("2026-11-22T10:00:00Z")) == "2026-11-22T10:00:00Z"


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.999, 0.9999996])
def test_fractions_are_truncated_not_rounded(fraction: float) -> None:
    # 0.9999996 is where converting the float before truncating would round up a second.
    assert format_time(T0 + fraction) == T0_TEXT


def test_epoch_and_before() -> None:
    assert format_time(0) == "1970-01-01T00:00:00Z"
    assert format_time(-0.5) == "1969-12-31T23:59:59Z"  # the floor, as Go's time.Unix


@pytest.mark.parametrize("unset", [None, ""])
def test_unset_parses_as_zero(unset: str | None) -> None:
    assert parse_time(unset) == 0.0


def test_parse_reads_offsets_and_fractions() -> None:
    assert parse_time("2023-11-14T23:13:20+01:00") == T0
    assert parse_time("2023-11-14T22:13:20.25Z") == T0 + 0.25
    with pytest.raises(ValueError):
        parse_time("yesterday")
