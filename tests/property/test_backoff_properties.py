"""Invariants of the crash-loop backoff over generated restart timelines."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from trio_kubelet.core.backoff import Backoff

GAPS = st.lists(st.floats(min_value=0.0, max_value=1000.0, allow_nan=False), min_size=1,
                max_size=30)
LIMITS = st.tuples(st.floats(0.5, 60.0), st.floats(1.0, 900.0))


def replay(backoff: Backoff, gaps: list[float]) -> list[tuple[float, float]]:
    """(time since the previous restart, delay after it) for each restart.

    The time is the difference of the accumulated clock readings the backoff saw, not the
    generated gap: at the 2 x max boundary the two can differ by a rounding error.
    """
    now, before, history = 0.0, 0.0, []
    for gap in gaps:
        now += gap
        backoff = backoff.next("k", now=now)
        history.append((now - before, backoff.delay("k")))
        before = now
    return history


@settings(max_examples=300)
@given(LIMITS, GAPS)
# Found by hypothesis: a gap of exactly 2 x max after rounding in the accumulated clock.
@example(limits=(1.0, 90.0), gaps=[1.5637006934460373, 1.9066544227723057, 841.4314173576757,
                                   180.0])
def test_delay_grows_until_capped_and_resets_only_after_idling(
    limits: tuple[float, float], gaps: list[float]
) -> None:
    backoff = Backoff(initial=limits[0], maximum=limits[1])
    previous = 0.0
    for gap, delay in replay(backoff, gaps):
        assert backoff.initial <= delay <= backoff.maximum
        if gap > 2 * backoff.maximum:
            assert delay == backoff.initial
        elif previous:
            assert delay >= previous
            assert delay == min(2 * previous, backoff.maximum)
        previous = delay


@settings(max_examples=300)
@given(GAPS, st.floats(0.0, 2000.0), st.floats(0.0, 2000.0))
def test_remaining_backoff_is_bounded_and_shrinks(
    gaps: list[float], finished_after: float, wait: float
) -> None:
    backoff, now = Backoff(), 0.0
    for gap in gaps:
        now += gap
        backoff = backoff.next("k", now=now)
    finished = now + finished_after
    remaining = backoff.in_backoff("k", finished_at=finished, now=finished)
    assert 0.0 <= remaining <= backoff.delay("k")
    later = backoff.in_backoff("k", finished_at=finished, now=finished + wait)
    assert later <= remaining
    if finished_after > 2 * backoff.maximum:
        assert remaining == 0.0


@settings(max_examples=200)
@given(st.dictionaries(st.text(min_size=1, max_size=3), st.floats(0.0, 2000.0), max_size=8),
       st.floats(0.0, 4000.0))
def test_gc_drops_exactly_the_idle_entries(updates: dict[str, float], now: float) -> None:
    backoff = Backoff()
    for key, when in updates.items():
        backoff = backoff.next(key, now=when)
    kept = backoff.gc(now)
    assert set(kept.entries) == {k for k, when in updates.items() if now - when <= 600.0}
