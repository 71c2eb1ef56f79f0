"""Crash-loop backoff: 10 s doubling to 300 s, forgotten after 10 idle minutes."""

from __future__ import annotations

import pytest

from trio_kubelet.core.backoff import (
    Backoff,
    backoff_key,
    crash_loop_message,
    format_duration,
)
from trio_kubelet.core.hashing import container_hash
from trio_kubelet.model.pod import Pod

POD = Pod.model_validate({
    "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
    "spec": {"containers": [{"name": "app", "image": "busybox"}]},
})
APP = POD.spec.containers[0]


def test_unknown_key_is_free() -> None:
    assert Backoff().in_backoff("k", finished_at=100.0, now=100.0) == 0.0
    assert Backoff().delay("k") == 0.0


def test_delays_double_up_to_the_maximum() -> None:
    backoff, delays = Backoff(), []
    for restart in range(8):
        backoff = backoff.next("k", now=100.0 + restart)
        delays.append(backoff.delay("k"))
    assert delays == [10, 20, 40, 80, 160, 300, 300, 300]


def test_remaining_time_counts_from_the_finish() -> None:
    backoff = Backoff().next("k", now=0.0).next("k", now=1.0)  # delay 20 s
    assert backoff.in_backoff("k", finished_at=5.0, now=5.0) == 20.0
    assert backoff.in_backoff("k", finished_at=5.0, now=20.0) == 5.0
    assert backoff.in_backoff("k", finished_at=5.0, now=25.0) == 0.0
    assert backoff.in_backoff("k", finished_at=5.0, now=99.0) == 0.0


def test_entry_expires_after_twice_the_maximum() -> None:
    backoff = Backoff().next("k", now=0.0).next("k", now=0.0).next("k", now=0.0)
    assert backoff.delay("k") == 40
    # A container that ran for more than 10 minutes before failing is not in backoff ...
    assert backoff.in_backoff("k", finished_at=601.0, now=601.0) == 0.0
    # ... and its next restart starts over from the initial delay.
    assert backoff.next("k", now=601.0).delay("k") == 10
    assert backoff.next("k", now=700.0, event_time=500.0).delay("k") == 80


def test_values_are_immutable() -> None:
    first = Backoff()
    second = first.next("k", now=0.0)
    assert first.delay("k") == 0.0 and second.delay("k") == 10
    with pytest.raises(TypeError):
        second.entries["x"] = second.entries["k"]  # type: ignore[index, unused-ignore]


def test_gc_and_reset() -> None:
    backoff = Backoff().next("old", now=0.0).next("new", now=500.0)
    collected = backoff.gc(now=700.0)
    assert set(collected.entries) == {"new"}
    assert collected.gc(now=700.0) is collected
    assert collected.reset("new").entries == {}
    assert collected.reset("absent") is collected


def test_custom_limits_clamp_initial_to_maximum() -> None:
    backoff = Backoff(initial=10.0, maximum=5.0)
    assert backoff.initial == 5.0
    assert backoff.next("k", now=0.0).next("k", now=1.0).delay("k") == 5.0
    with pytest.raises(ValueError, match="positive"):
        Backoff(initial=0.0)


def test_backoff_key_is_go_stable_key() -> None:
    assert backoff_key(POD, APP) == f"web_default_u-1_app_{container_hash(APP)}"
    edited = APP.model_copy(update={"image": "busybox:2"})
    assert backoff_key(POD, edited) != backoff_key(POD, APP)


@pytest.mark.parametrize("seconds, text", [
    (10, "10s"), (20, "20s"), (80, "1m20s"), (160, "2m40s"), (300, "5m0s"), (3600, "1h0m0s"),
    (1.5, "1.5s"),
])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_crash_loop_message() -> None:
    assert crash_loop_message(20.0, POD, APP) == (
        "back-off 20s restarting failed container=app pod=web_default(u-1)")
