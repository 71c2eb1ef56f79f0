"""Bounding how many connections one server holds open at once."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger(__name__)

__all__ = ["limit_connections"]

ConnectionHandler = Callable[[trio.SocketStream], Awaitable[None]]


def limit_connections(handler: ConnectionHandler, limit: int) -> ConnectionHandler:
    """``handler`` for each accepted connection while fewer than ``limit`` are open; one
    beyond that is closed at once, so a flood of idle clients cannot exhaust the process."""
    open_now = 0

    async def serve(stream: trio.SocketStream) -> None:
        nonlocal open_now
        if open_now >= limit:
            log.debug("Too many connections (%d), closing a new one", open_now)
            await trio.aclose_forcefully(stream)
            return
        open_now += 1
        try:
            await handler(stream)
        finally:
            open_now -= 1

    return serve
