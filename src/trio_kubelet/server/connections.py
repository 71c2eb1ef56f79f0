"""What one client may cost a server (``HTTPLimits``): the cap on open connections, and the
request head size in front of the apps."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from trio_kubelet.server.app import MAX_BODY_BYTES
from trio_kubelet.server.asgi import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

__all__ = ["HTTPLimits", "limit_connections", "limit_request_head"]


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
    shutdown_timeout: float = 5.0  # for the app's own shutdown (ASGI lifespan)


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


def request_head_size(scope: Mapping[str, Any]) -> int:
    """The size of the request line and headers as an HTTP/1.1 client sent them."""
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    line = len(scope.get("method", "GET")) + target + len(" ? HTTP/1.1\r\n")
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers") or ()
    return line + sum(len(name) + len(value) + 4 for name, value in headers) + 2


def limit_request_head(app: ASGIApp, max_bytes: int) -> ASGIApp:
    """``app`` behind the request head limit: a bigger head is answered 431 and the
    connection closed, as Go's ``MaxHeaderBytes``.

    The server reads a head within the limit already (``http1.next_event``); this covers
    the scope as the app sees it, whatever server built it.
    """

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or request_head_size(scope) <= max_bytes:
            await app(scope, receive, send)
            return
        log.debug("Request head over %d bytes: 431", max_bytes)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1009, "reason": ""})
            return
        body = b"431 Request Header Fields Too Large"
        await send({"type": "http.response.start", "status": 431, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
            (b"content-length", str(len(body)).encode())], "trailers": False})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return guarded
