"""The node's order of stops: a sandbox stop lets containers already being killed go first.

When many pods stop at once (a mass deletion, a drain, a node shutdown), the runtime
handles the killed containers' exits and the stopped sandboxes' teardown (CNI DEL, the
pause container, unmounts) on the same CPUs. A pod's sandbox stop therefore waits while a
container stop elsewhere on the node has run past its grace period — SIGKILL sent, its
exit being handled — and the runtime is still getting through them: it stops waiting once
no such stop has returned for ``STALL`` seconds (one container that never dies holds no one
up for longer), and after ``WAIT_LIMIT`` seconds in any case. A container still in its
grace period holds no one up. Measured on containerd 2.4.2 with 110 pods, see
bench/README.md ("Issue 21: stop order").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import trio

__all__ = ["STALL", "WAIT_LIMIT", "StopOrder"]

STALL = 1.0  # no killed container's stop returned for this long: the runtime is not busy with them
WAIT_LIMIT = 10.0  # the longest a sandbox stop ever defers to other pods' containers


class StopOrder:
    """The container stops in flight on the node, each with the moment its SIGKILL is due."""

    def __init__(self) -> None:
        self._kill_due: dict[int, float] = {}
        self._tokens = itertools.count()
        self._ended = trio.Event()
        self._last_end = -float("inf")

    @contextmanager
    def container_stop(self, grace: int) -> Iterator[None]:
        """Around a StopContainer call with ``grace`` seconds before the runtime's SIGKILL."""
        token = next(self._tokens)
        self._kill_due[token] = trio.current_time() + grace
        try:
            yield
        finally:
            del self._kill_due[token]
            self._last_end = trio.current_time()
            self._ended.set()
            self._ended = trio.Event()

    def killing(self) -> bool:
        """Whether some container stop has passed its grace period and not returned yet."""
        now = trio.current_time()
        return any(due <= now for due in self._kill_due.values())

    async def sandbox_turn(self) -> None:
        """Wait while containers are being killed and their stops keep returning."""
        with trio.move_on_after(WAIT_LIMIT):
            while self.killing():
                with trio.move_on_at(self._last_end + STALL) as stalled:
                    await self._ended.wait()
                if stalled.cancelled_caught:
                    return
