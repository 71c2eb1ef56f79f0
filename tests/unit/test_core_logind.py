"""core/logind.py: when logind's InhibitDelayMaxSec must be raised, the drop-in that raises it,
the error when it stays short, and what a PrepareForShutdown signal says."""

from __future__ import annotations

import pytest

from trio_kubelet.core.logind import (
    RELOAD_CHECK_PAUSES,
    needs_override,
    override_dropin,
    override_failed,
    prepare_for_shutdown,
)


def test_the_delay_is_raised_only_when_below_the_whole_grace_period() -> None:
    assert needs_override(30, 5_000_000)  # logind's default 5 s
    assert not needs_override(30, 30_000_000)
    assert not needs_override(30, 60_000_000)
    assert needs_override(30, 29_999_999)


def test_the_drop_in_sets_inhibit_delay_max_sec_in_the_login_section() -> None:
    assert override_dropin(45) == "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=45\n"


def test_the_error_names_the_attempts_and_both_durations_as_go_prints_them() -> None:
    assert override_failed(5, 120, 30_000_000) == (
        "node shutdown manager was timed out after 5 attempts waiting for logind "
        "InhibitDelayMaxSec to update to 2m0s (ShutdownGracePeriod), current value is 30s"
    )


def test_the_reload_is_checked_five_times_over_one_and_a_half_seconds() -> None:
    assert len(RELOAD_CHECK_PAUSES) + 1 == 5
    assert sum(RELOAD_CHECK_PAUSES) == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("body", "expected"),
    [((True,), True), ((False,), False), ((), None), (("true",), None), ((1,), None),
     ((True, True), None)],
)
def test_prepare_for_shutdown_carries_one_boolean(
    body: tuple[object, ...], expected: bool | None
) -> None:
    assert prepare_for_shutdown(body) is expected
