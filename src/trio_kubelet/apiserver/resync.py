"""Bringing the API server in line with the node, again and again, whatever it takes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import trio

from trio_kubelet.apiserver.errors import Unreachable

log = logging.getLogger("trio_kubelet.apiserver")

RETRY_MAX = 30.0


async def resync_forever(
    sync: Callable[[], Awaitable[None]],
    *,
    what: str,
    changed: Sequence[Callable[[], trio.Event]],
    period: float,
) -> None:
    """Run ``sync`` whenever something changed, and at least every ``period``.

    Each of ``changed`` returns the event its source sets at its next change. They are taken
    before each ``sync``, so a change made while ``sync`` waits on the API server (a pod that
    became ready while its last status was being sent) starts the next one at once instead
    of a period later. While the API server is unreachable, retry with backoff (1 s doubling
    to 30 s) instead of waiting for a change: what the node did meanwhile must still be told.
    """
    delay = 1.0
    while True:
        pending = [next_change() for next_change in changed]
        try:
            await sync()
            delay = 1.0
        except Unreachable as err:
            log.warning("Cannot %s: %s; retrying in %.0fs", what, err, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
            continue
        if any(event.is_set() for event in pending):
            await trio.lowlevel.checkpoint()
            continue
        with trio.move_on_after(period):
            async with trio.open_nursery() as waiting:
                for event in pending:
                    waiting.start_soon(_then_cancel, event, waiting.cancel_scope)


async def _then_cancel(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
