"""What one client may cost a server (``HTTPLimits``), and the cap on open connections."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from trio_kubelet.server.app import MAX_BODY_BYTES

log = logging.getLogger(__name__)

__all__ = ["HTTPLimits", "limit_connections"]


@dataclass(frozen=True)
class HTTPLimits:
    """What one client may cost a server."""

    max_header_bytes: int = 64 * 1024
    # Idle keep-alive connections are closed after this, and it is also the time a client
    # has to send a complete request head (Go's IdleTimeout is 90 s).
    idle_timeout: float = 90.0
    tls_handshake_timeout: float = 10.0
    max_body_bytes: int = MAX_BODY_BYTES
    max_connections: int = 1024
    max_concurrent_streams: int = 100  # per HTTP/2 connection
    shutdown_timeout: float = 5.0


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
