"""The node's order of starts: a bounded number of pod starts in flight, none held up by a slow one.

When many pods start at once (an agent start, a node's pods rescheduled onto it), each
pod start costs the runtime a sandbox (a shim, the pause container, CNI) and containers,
all on the same CPUs. With every start in flight at once, the runtime interleaves them:
on 2 cores the first of 110 pods runs after seconds and the last no sooner. A pod start
therefore waits while ``PER_CPU`` others per CPU are in flight; a start in flight for more than
``SLOW`` seconds (a hung CNI plugin, an image pull) stops counting, so at worst every start
goes ahead at once, as with no order at all. Measured on containerd 2.4.2 with 110 pods,
see bench/README.md ("Issue 21: start order").
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

__all__ = ["PER_CPU", "SLOW", "StartOrder"]

PER_CPU = 8  # pod starts in flight per CPU before others wait
SLOW = 5.0  # a start in flight this long no longer holds others back


class StartOrder:
    """The pod starts in flight on the node, each with the moment it began."""

    def __init__(self, cpus: int = 1) -> None:
        self._limit = PER_CPU * max(cpus, 1)
        self._began: dict[int, float] = {}
        self._tokens = itertools.count()
        self._ended = trio.Event()

    @asynccontextmanager
    async def pod_start(self) -> AsyncIterator[None]:
        """Around a pod's sandbox creation and container starts."""
        await self._turn()
        token = next(self._tokens)
        self._began[token] = trio.current_time()
        try:
            yield
        finally:
            del self._began[token]
            self._ended.set()
            self._ended = trio.Event()

    async def _turn(self) -> None:
        while True:
            counted = sorted(b for b in self._began.values() if b > trio.current_time() - SLOW)
            if len(counted) < self._limit:
                return
            with trio.move_on_at(counted[0] + SLOW):
                await self._ended.wait()
