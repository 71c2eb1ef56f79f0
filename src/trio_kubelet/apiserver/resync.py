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
    changed: Sequence[Callable[[], Awaitable[None]]],
    period: float,
) -> None:
    """Run ``sync`` whenever one of ``changed`` returns, and at least every ``period``.

    While the API server is unreachable, retry with backoff (1 s doubling to 30 s)
    instead of waiting for a change: what the node did meanwhile must still be told.
    """
    delay = 1.0
    while True:
        try:
            await sync()
            delay = 1.0
        except Unreachable as err:
            log.warning("Cannot %s: %s; retrying in %.0fs", what, err, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
            continue
        with trio.move_on_after(period):
            async with trio.open_nursery() as waiting:
                for wait in changed:
                    waiting.start_soon(_then_cancel, wait, waiting.cancel_scope)


async def _then_cancel(wait: Callable[[], Awaitable[None]], scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()
