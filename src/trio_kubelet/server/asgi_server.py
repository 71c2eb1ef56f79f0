"""Serving an ASGI app over one HTTP/1.1 connection, on trio: h11 frames the requests, wsproto the
websockets, and SPDY upgrades go to ``spdy_proxy``; plus the app's lifespan.

This is the server of the Quart-Trio apps on 10250 and 10255 (``serve.py`` accepts the
connections, does TLS and the connection cap, and calls ``serve_connection``). It replaced
Hypercorn, whose public ``serve`` could not carry what 10250 needs (docs/http-api.md, "Why our
own server"): the client certificate in the scope, pyOpenSSL TLS whose unverified client
certificate still reaches the authenticator (Go's 401), the connection cap, and SPDY upgrades.

HTTP/1.1 only (keep-alive, pipelining, HTTP/1.0 clients, chunked bodies both ways,
``Expect: 100-continue``); no HTTP/2. Per connection: one request at a time; the app's
``receive`` reads the request body as the app asks for it, then reports ``http.disconnect``
when the client goes away (a followed log stops then). Each websocket message is at most
``MAX_MESSAGE_BYTES`` (close 1009 otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import suppress
from typing import Any
from urllib.parse import unquote, urlsplit

import h11
import trio
from wsproto.connection import Connection as WSConnection
from wsproto.connection import ConnectionState, ConnectionType
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError as WSLocalProtocolError
from wsproto.utilities import generate_accept_token

from trio_kubelet.server import spdy_proxy
from trio_kubelet.server.asgi import ASGIApp, Scope
from trio_kubelet.server.asgi import Message as ASGIMessage
from trio_kubelet.server.connections import HTTPLimits
from trio_kubelet.server.http1 import (
    READ_SIZE,
    error_answer,
    header,
    http_date,
    next_event,
    reason,
)

log = logging.getLogger(__name__)

__all__ = ["MAX_MESSAGE_BYTES", "LifespanError", "run_lifespan", "serve_connection"]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # one websocket message
CLOSE_TIMEOUT = 5.0  # for a TLS close_notify to a client that does not read
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_INTERNAL_ERROR = b"Internal Server Error\n"


class _Gone(Exception):
    """The connection cannot carry another request: an answer was cut off half-way."""


class _Conn:
    """One client connection: its stream, its h11 state, and what every request's scope shares."""

    def __init__(self, app: ASGIApp, stream: trio.abc.Stream, limits: HTTPLimits,
                 base: Scope) -> None:
        self.app = app
        self.stream = stream
        self.limits = limits
        self.base = base
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.peer_closed = False  # the client stopped sending (EOF or a broken connection)
        self.broken = False  # sending failed

    async def write(self, data: bytes) -> None:
        """Send ``data``; a client that left makes it a no-op (the app learns through
        ``receive``, which reports the disconnect)."""
        if self.broken or not data:
            return
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.broken = True

    async def read(self) -> bytes:
        """The client's next bytes; b"" once it has stopped sending."""
        if self.peer_closed:
            return b""
        try:
            data = await self.stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.peer_closed = True
        return bytes(data)

    def scope(self, kind: str, request: h11.Request, **extensions: Any) -> Scope:
        """What Hypercorn would put in the scope of ``request``, plus ``extensions``."""
        target = request.target.decode("latin-1")
        path, _, query = target.partition("?")
        if not path.startswith("/"):  # absolute form, "http://host/path"
            path = urlsplit(path).path or "/"
        scope: Scope = {
            **self.base, "type": kind, "asgi": _ASGI,
            "http_version": request.http_version.decode(), "method": request.method.decode(),
            "path": unquote(path), "raw_path": path.encode("latin-1"),
            "query_string": query.encode("latin-1"), "root_path": "",
            "headers": list(request.headers), "state": dict(self.base.get("state") or {}),
        }
        scope["extensions"] = {**(self.base.get("extensions") or {}), **extensions}
        return scope


# -- one HTTP request -----------------------------------------------------------------------------


class _Exchange:
    """The ``receive`` and ``send`` of one ordinary HTTP request."""

    def __init__(self, conn: _Conn, request: h11.Request) -> None:
        self.conn = conn
        self.head_only = request.method == b"HEAD"
        self.body_read = False
        self.head_sent = False
        self.ended = False

    async def receive(self) -> ASGIMessage:
        conn = self.conn
        if not self.body_read:
            if conn.h11.they_are_waiting_for_100_continue:
                await conn.write(conn.h11.send(h11.InformationalResponse(
                    status_code=100, headers=[])) or b"")
            try:
                event = await _next_body_event(conn)
            except h11.RemoteProtocolError:
                event = None  # the client left in the middle of its body
            if isinstance(event, h11.Data):
                return {"type": "http.request", "body": bytes(event.data), "more_body": True}
            if isinstance(event, h11.EndOfMessage):
                self.body_read = True
                return {"type": "http.request", "body": b"", "more_body": False}
            conn.peer_closed = True
        await self._wait_for_disconnect()
        return {"type": "http.disconnect"}

    async def _wait_for_disconnect(self) -> None:
        """Return once the client has gone. What it sends meanwhile (pipelined requests) is kept
        for the next exchange, up to the head size limit; past that it is not read any more."""
        conn = self.conn
        while not conn.peer_closed:
            if len(conn.h11.trailing_data[0]) > conn.limits.max_header_bytes:
                await trio.sleep_forever()
            if data := await conn.read():
                conn.h11.receive_data(data)

    async def send(self, message: ASGIMessage) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.head_sent:
                raise RuntimeError("http.response.start sent twice")
            # At once, not with the first body: a followed log may have none for a while.
            await self._head(int(message["status"]), message.get("headers", ()))
        elif kind == "http.response.body":
            if not self.head_sent:
                raise RuntimeError("http.response.body before http.response.start")
            if self.ended:
                return
            await self._body(bytes(message.get("body", b"")), bool(message.get("more_body")))

    async def _head(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        fields = [(bytes(name).lower(), bytes(value)) for name, value in headers]
        if not any(name == b"date" for name, _ in fields):
            fields.append((b"date", http_date()))
        self.head_sent = True
        await self.conn.write(self.conn.h11.send(h11.Response(
            status_code=status, headers=fields, reason=reason(status))) or b"")

    async def _body(self, body: bytes, more: bool) -> None:
        conn = self.conn
        out = b""
        if body and not self.head_only:
            out += conn.h11.send(h11.Data(data=body)) or b""
        if not more:
            out += conn.h11.send(h11.EndOfMessage()) or b""
            self.ended = True
        await conn.write(out)

    async def finish(self) -> None:
        """After the app: a request it failed to answer gets a 500."""
        if self.head_sent and not self.ended:
            raise _Gone  # a half-sent answer: the connection cannot carry another
        if not self.head_sent:
            await self._head(500, [(b"content-type", b"text/plain; charset=utf-8"),
                                   (b"content-length", str(len(_INTERNAL_ERROR)).encode()),
                                   (b"connection", b"close")])
            await self._body(_INTERNAL_ERROR, False)


async def _next_body_event(conn: _Conn) -> h11.Event | None:
    """The next event of a request body (reading as needed); None when the client has gone."""
    while True:
        event = conn.h11.next_event()
        if event is h11.NEED_DATA:
            conn.h11.receive_data(await conn.read())
            continue
        if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
            return None
        return event  # type: ignore[return-value]


async def _serve_http(conn: _Conn, request: h11.Request) -> bool:
    """Run the app for one request; whether the connection may carry another."""
    exchange = _Exchange(conn, request)
    try:
        await conn.app(conn.scope("http", request), exchange.receive, exchange.send)
    except Exception as exc:
        log.error("%s %s: the app failed: %s: %s", request.method.decode(),
                  request.target.decode("latin-1"), type(exc).__name__, exc)
    await exchange.finish()
    return await _drop_unread_body(conn)


async def _drop_unread_body(conn: _Conn) -> bool:
    """Read and drop what the app left of the request body (up to the body limit, within the
    idle timeout), so the connection can carry the next request; False: it cannot."""
    if conn.broken or conn.h11.our_state is not h11.DONE:
        return False
    if conn.h11.they_are_waiting_for_100_continue:
        return False  # the client may or may not send the body now: nobody can tell
    dropped = 0
    with trio.move_on_after(conn.limits.idle_timeout):
        while conn.h11.their_state is h11.SEND_BODY:
            event = await _next_body_event(conn)
            if event is None:
                return False
            if isinstance(event, h11.Data):
                dropped += len(event.data)
                if dropped > conn.limits.max_body_bytes:
                    return False
    return conn.h11.their_state is h11.DONE and not conn.peer_closed


# -- websockets -----------------------------------------------------------------------------------


def _tokens(value: bytes) -> list[str]:
    return [token.strip() for token in value.decode("latin-1").split(",") if token.strip()]


def _is_websocket(request: h11.Request) -> bool:
    return ("upgrade" in _tokens(header(request, b"connection"))
            and header(request, b"upgrade") == b"websocket")


class _Websocket:
    """The ``receive`` and ``send`` of one websocket request (RFC 6455 over the connection)."""

    def __init__(self, conn: _Conn, request: h11.Request) -> None:
        self.conn = conn
        self.request = request
        self.ws: WSConnection | None = None  # once accepted
        self.settled = trio.Event()  # accepted, refused or closed by the app
        self.refused = trio.Event()  # an HTTP answer instead of the websocket has been sent
        self.connected = False  # websocket.connect was received
        self.answered = False  # an HTTP answer (a refusal) was started
        self.closed = False
        self.lock = trio.StrictFIFOLock()  # the reader answers pings while the app sends
        self.pending: list[bytes | str] = []

    async def receive(self) -> ASGIMessage:
        if not self.connected:
            self.connected = True
            return {"type": "websocket.connect"}
        await self.settled.wait()
        if self.ws is None:
            await self.refused.wait()
        while self.ws is not None and not self.closed:
            for event in self.ws.events():
                message = await self._handle(event)
                if message is not None:
                    return message
            if not self.closed:
                data = await self.conn.read()
                self.ws.receive_data(data or None)
        return {"type": "websocket.disconnect", "code": 1006}

    async def _handle(self, event: object) -> ASGIMessage | None:
        assert self.ws is not None
        if isinstance(event, Message):
            self.pending.append(event.data)
            if sum(len(part) for part in self.pending) > MAX_MESSAGE_BYTES:
                await self._close(1009, "message too big")
                return {"type": "websocket.disconnect", "code": 1009}
            if not event.message_finished:
                return None
            parts, self.pending = self.pending, []
            if isinstance(event, TextMessage):
                return {"type": "websocket.receive", "text": "".join(map(str, parts))}
            return {"type": "websocket.receive",
                    "bytes": b"".join(part for part in parts if isinstance(part, bytes))}
        if isinstance(event, Ping):
            await self._send_frame(event.response())
        elif isinstance(event, CloseConnection):
            if self.ws.state is ConnectionState.REMOTE_CLOSING:
                await self._send_frame(event.response())
            self.closed = True
            return {"type": "websocket.disconnect", "code": event.code}
        return None

    async def _send_frame(self, event: Any) -> None:
        assert self.ws is not None
        async with self.lock:
            try:
                data = self.ws.send(event)
            except WSLocalProtocolError:
                return  # closed meanwhile
            await self.conn.write(data)

    async def _close(self, code: int, reason_text: str = "") -> None:
        if self.ws is not None and self.ws.state is ConnectionState.OPEN:
            await self._send_frame(CloseConnection(code=code, reason=reason_text))
        self.closed = True

    async def send(self, message: ASGIMessage) -> None:
        kind = message["type"]
        if kind == "websocket.accept" and not self.settled.is_set():
            await self._accept(message)
        elif kind == "websocket.send" and self.ws is not None and not self.closed:
            text = message.get("text")
            await self._send_frame(TextMessage(data=text) if text is not None
                                   else BytesMessage(data=bytes(message.get("bytes") or b"")))
        elif kind == "websocket.close":
            if self.ws is None and not self.answered:
                await self._refuse(403)
            else:
                await self._close(int(message.get("code", 1000)), message.get("reason") or "")
            self.settled.set()
        elif kind == "websocket.http.response.start" and self.ws is None and not self.answered:
            self.answered = True
            self.settled.set()
            status = int(message["status"])
            await self.conn.write(self.conn.h11.send(h11.Response(
                status_code=status, reason=reason(status),
                headers=[*message.get("headers", ()), (b"connection", b"close")])) or b"")
        elif kind == "websocket.http.response.body" and self.answered:
            out = self.conn.h11.send(h11.Data(data=bytes(message.get("body", b"")))) or b""
            if not message.get("more_body", False):
                out += self.conn.h11.send(h11.EndOfMessage()) or b""
            await self.conn.write(out)
            if not message.get("more_body", False):
                self.refused.set()

    async def _accept(self, message: ASGIMessage) -> None:
        key = header(self.request, b"sec-websocket-key", lower=False)
        headers = [(b"upgrade", b"websocket"), (b"connection", b"Upgrade"),
                   (b"sec-websocket-accept", generate_accept_token(key))]
        if message.get("subprotocol"):
            headers.append((b"sec-websocket-protocol", str(message["subprotocol"]).encode()))
        headers.extend(message.get("headers") or ())
        data = self.conn.h11.send(h11.InformationalResponse(
            status_code=101, headers=headers, reason=b"Switching Protocols")) or b""
        self.ws = WSConnection(ConnectionType.SERVER, trailing_data=self.conn.h11.trailing_data[0])
        self.settled.set()
        await self.conn.write(data)

    async def _refuse(self, status: int, body: bytes = b"") -> None:
        self.answered = True
        headers = [(b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        await self.conn.write(b"".join(self.conn.h11.send(event) or b"" for event in (
            h11.Response(status_code=status, reason=reason(status), headers=headers),
            h11.Data(data=body), h11.EndOfMessage())))
        self.refused.set()

    async def finish(self) -> None:
        """After the app: an open websocket is closed (1000), an unanswered one refused (500)."""
        if self.ws is not None:
            await self._close(1000)
        elif not self.answered:
            await self._refuse(500, _INTERNAL_ERROR)


async def _serve_websocket(conn: _Conn, request: h11.Request) -> None:
    if request.method != b"GET" or header(request, b"sec-websocket-version") != b"13" \
            or not header(request, b"sec-websocket-key"):
        raise h11.RemoteProtocolError("not a valid websocket handshake", error_status_hint=400)
    session = _Websocket(conn, request)
    scope = conn.scope("websocket", request, **{"websocket.http.response": {}})
    scope["scheme"] = "wss" if scope.get("scheme") == "https" else "ws"
    scope["subprotocols"] = _tokens(header(request, b"sec-websocket-protocol", lower=False))
    try:
        await conn.app(scope, session.receive, session.send)
    except Exception as exc:
        log.error("websocket %s: the app failed: %s: %s", scope["path"], type(exc).__name__, exc)
    await session.finish()


def _has_body(request: h11.Request) -> bool:
    return bool(header(request, b"transfer-encoding")) \
        or header(request, b"content-length") not in (b"", b"0")


def _upgrade(conn: _Conn, request: h11.Request) -> bool:
    """Whether ``request`` is a websocket or SPDY upgrade to take over the connection: one
    without a body, whose end h11 has then been told (so a 101 can be sent)."""
    if not (_is_websocket(request) or spdy_proxy.is_spdy_upgrade(request)) or _has_body(request):
        return False
    end = conn.h11.next_event()
    if not isinstance(end, h11.EndOfMessage):
        raise h11.RemoteProtocolError("an upgrade request without its end", error_status_hint=400)
    return True


# -- the connection -------------------------------------------------------------------------------


async def _exchange(conn: _Conn) -> bool:
    """Serve the connection's next request; whether the connection may carry another."""
    request: h11.Event | None = None
    with trio.move_on_after(conn.limits.idle_timeout):  # waiting for, and reading, a head
        try:
            request = await next_event(conn.h11, conn.stream, conn.limits.max_header_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
    if not isinstance(request, h11.Request):
        return False
    if _upgrade(conn, request):
        if _is_websocket(request):
            await _serve_websocket(conn, request)
        else:
            scope = conn.scope("http", request)
            upgrade = spdy_proxy.UpgradeRequest(conn.h11, request, scope["path"],
                                                conn.h11.trailing_data[0])
            await spdy_proxy.serve_upgrade(conn.app, conn.stream, upgrade, scope)
        return False
    return await _serve_http(conn, request)


async def serve_connection(app: ASGIApp, stream: trio.abc.Stream, *, limits: HTTPLimits,
                           scope: Scope) -> None:
    """Serve ``app`` on ``stream`` until the client leaves, idles past the limit, or a request
    ends the connection; then close it. ``scope`` holds what every request's scope shares:
    ``scheme``, ``client``, ``server``, ``state``, and ``extensions`` (``tls``)."""
    conn = _Conn(app, stream, limits, scope)
    try:
        while await _exchange(conn):
            conn.h11.start_next_cycle()
    except h11.RemoteProtocolError as exc:
        log.debug("Bad request: %s", exc)
        await error_answer(conn.h11, stream, exc.error_status_hint, limits.idle_timeout)
    except (_Gone, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except Exception as exc:  # one broken connection must never take the server down
        log.error("HTTP connection failed: %s: %s", type(exc).__name__, exc)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
            await stream.aclose()
        await trio.aclose_forcefully(stream)


# -- the app's lifespan ---------------------------------------------------------------------------


class LifespanError(Exception):
    """The app refused to start; ``str()`` says why."""


async def _next(channel: trio.MemoryReceiveChannel[ASGIMessage]) -> ASGIMessage | None:
    """The app's next lifespan message; None once it has ended."""
    try:
        return await channel.receive()
    except trio.EndOfChannel:
        return None


async def run_lifespan(app: ASGIApp, state: dict[str, Any], timeout: float, *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Start the app (ASGI ``lifespan.startup``), report it started, and shut it down
    (``lifespan.shutdown``, at most ``timeout`` seconds) once cancelled. Raises LifespanError
    when the app refuses to start; an app without lifespan support is served anyway."""
    to_app, app_inbox = trio.open_memory_channel[ASGIMessage](1)
    app_outbox, from_app = trio.open_memory_channel[ASGIMessage](1)
    # The app's own task outlives the cancellation that ends serving, until it has shut down.
    app_scope = trio.CancelScope(shield=True)

    async def run() -> None:
        with app_scope:
            try:
                await app({"type": "lifespan", "asgi": _ASGI, "state": state},
                          app_inbox.receive, app_outbox.send)
            except Exception as exc:
                log.debug("the app's lifespan ended: %s: %s", type(exc).__name__, exc)
            finally:
                await app_outbox.aclose()
                await app_inbox.aclose()

    failure: str | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await to_app.send({"type": "lifespan.startup"})
        message = await _next(from_app)
        if message is not None and message["type"] == "lifespan.startup.failed":
            failure = str(message.get("message") or "startup failed")
        else:
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(timeout), \
                        suppress(trio.BrokenResourceError):
                    await to_app.send({"type": "lifespan.shutdown"})
                    await _next(from_app)
        app_scope.cancel()
    if failure is not None:
        raise LifespanError(failure)
