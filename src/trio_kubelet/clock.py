"""Wall-clock time derived from trio's clock, so a MockClock makes the whole agent deterministic."""

from __future__ import annotations

import time

import trio


class TrioWallClock:
    """Epoch seconds = an epoch fixed at construction + trio's monotonic clock.

    Decisions compare ``now()`` with runtime timestamps (epoch seconds), so the
    agent needs wall time; taking it from trio's clock means tests and replay
    control it with ``trio.testing.MockClock``.
    """

    def __init__(self, epoch: float | None = None) -> None:
        start = time.time() if epoch is None else epoch
        self._offset: float = start - float(trio.current_time())

    def now(self) -> float:
        return float(trio.current_time()) + self._offset
