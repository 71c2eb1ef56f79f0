"""SPDY/3.1 upgrades of ``/exec``, ``/attach`` and ``/portForward``, relayed to the runtime.

The API server speaks SPDY/3.1 to the kubelet for exec, attach and port-forward (it translates a
client's websocket to SPDY), and the runtime's streaming server speaks SPDY itself: like the Go
kubelet, we relay the upgrade request to the runtime's one-time URL, relay its ``101`` and then
copy bytes both ways, without understanding a single SPDY frame. ASGI has no way to hand an app
the socket of an ``Upgrade`` other than a websocket, so the server (``asgi_server``) recognises an
SPDY upgrade (``is_spdy_upgrade``) and gives it to the same ASGI app through ``serve_upgrade``: the
app authenticates, authorises, routes, counts and answers errors exactly as for any request, and
finds the connection in the scope (extension ``RAW_UPGRADE``, a ``RawUpgrade``). The streaming
view dials the runtime (``dial_upgrade``) and, on ``101``, hands the connection over
(``RawUpgrade.splice``).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

from trio_kubelet.server.asgi import ASGIApp, Message, Scope
from trio_kubelet.server.http1 import READ_SIZE, header, reason
from trio_kubelet.server.idle import IdleTimer

__all__ = [
    "RAW_UPGRADE",
    "RawUpgrade",
    "UpgradeRequest",
    "UpstreamAnswer",
    "UpstreamError",
    "dial_upgrade",
    "is_spdy_upgrade",
    "serve_upgrade",
    "splice",
]

# The ASGI scope extension under which ``serve_upgrade`` offers the request's connection.
RAW_UPGRADE = "trio_kubelet.raw_upgrade"
CLOSE_TIMEOUT = 5.0  # for a TLS close_notify to a client that does not read
MAX_ANSWER_BODY = 64 * 1024  # of a runtime's refusal, passed on to the client
# What of the client's request the runtime gets besides Host: what the upgrade needs, no
# credentials (the Go proxy sends every header on).
_FORWARDED_HEADERS = frozenset({b"upgrade", b"connection", b"x-stream-protocol-version"})

Headers = list[tuple[bytes, bytes]]


# -- the request -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpgradeRequest:
    """An SPDY upgrade request, read to its end; not yet answered."""

    connection: h11.Connection  # server side, waiting for our answer to the proposed switch
    request: h11.Request
    path: str  # percent-decoded, as ASGI's scope["path"]
    early: bytes  # what the client sent after the request head


def is_spdy_upgrade(request: h11.Request) -> bool:
    """Whether ``request`` asks for an SPDY upgrade: its Connection header mentions ``upgrade``
    (Go's ``httpstream.IsUpgradeRequest``) and its Upgrade header names ``SPDY/…``."""
    return b"upgrade" in header(request, b"connection") and b"spdy/" in header(request, b"upgrade")


# -- serving it through the app ------------------------------------------------------------------


class RawUpgrade:
    """The connection of an upgrade request, for the view that answers it with the runtime's 101.

    Until ``splice`` it is an ordinary HTTP/1.1 request: ``serve_upgrade`` writes the app's
    answer. After, the app's answer is dropped: the connection carries the runtime's protocol.
    """

    def __init__(self, stream: trio.abc.Stream, upgrade: UpgradeRequest) -> None:
        self._stream = stream
        self._upgrade = upgrade
        self.switched = False

    @property
    def method(self) -> bytes:
        return self._upgrade.request.method

    @property
    def headers(self) -> Headers:
        """The request's headers, names as the client spelt them."""
        return list(self._upgrade.request.headers.raw_items())

    async def splice(self, answer: UpstreamAnswer,
                     idle: IdleTimer | None = None) -> tuple[int, int]:
        """Pass the runtime's 101 on, then ``splice`` the two connections until either ends.

        ``answer`` must be a switch (``answer.stream``); both connections are closed on return.
        Returns the bytes copied (client to runtime, runtime to client).
        """
        assert answer.stream is not None
        self.switched = True
        try:
            await self._stream.send_all(self._upgrade.connection.send(h11.InformationalResponse(
                status_code=101, headers=answer.headers, reason=answer.reason)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await trio.aclose_forcefully(answer.stream)
            return 0, 0
        return await splice(self._stream, self._upgrade.early, answer.stream, answer.early,
                            idle=idle)

    async def respond(self, message: Message) -> None:
        """Write an ASGI ``http.response.*`` message; the connection closes after the answer."""
        if self.switched:
            return
        connection = self._upgrade.connection
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            data = connection.send(h11.Response(status_code=status, headers=headers,
                                                reason=reason(status)))
        elif message["type"] == "http.response.body":
            data = connection.send(h11.Data(data=message.get("body", b"")))
            if not message.get("more_body", False):
                data += connection.send(h11.EndOfMessage())
        else:
            return
        await self._stream.send_all(data)


async def serve_upgrade(app: ASGIApp, stream: trio.abc.Stream, upgrade: UpgradeRequest,
                        scope: Scope) -> None:
    """Run ``app`` for this one request (``scope``, to which the ``RAW_UPGRADE`` extension is
    added), then close the connection. The request has no body; ``receive`` then waits forever,
    since the end of the session is not an ASGI event here (the view sees the connection end
    itself)."""
    raw = RawUpgrade(stream, upgrade)
    scope = {**scope, "extensions": {**(scope.get("extensions") or {}), RAW_UPGRADE: raw}}
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if requested:
            await trio.sleep_forever()
        requested = True
        return {"type": "http.request", "body": b"", "more_body": False}

    try:
        await app(scope, receive, raw.respond)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client left before its answer
    finally:
        with trio.move_on_after(CLOSE_TIMEOUT):
            await stream.aclose()


# -- the runtime's side ---------------------------------------------------------------------------


class UpstreamError(Exception):
    """The runtime's streaming server could not be reached, or did not answer in HTTP."""


@dataclass(frozen=True)
class UpstreamAnswer:
    """The runtime's answer to an upgrade request: a switch (``stream`` set) or a refusal."""

    status: int
    reason: bytes
    headers: Headers  # names as the runtime spelt them
    body: bytes = b""  # a refusal's, at most MAX_ANSWER_BODY bytes
    stream: trio.abc.Stream | None = None  # a switch's connection, now the runtime's protocol
    early: bytes = b""  # what the runtime sent after its 101


async def dial_upgrade(url: str, method: bytes, headers: Iterable[tuple[bytes, bytes]], *,
                       timeout: float) -> UpstreamAnswer:
    """Send an upgrade request to the runtime's streaming ``url``; its answer within ``timeout``.

    Of ``headers`` (the client's) only Upgrade, Connection and X-Stream-Protocol-Version are
    sent on, with the URL's own path, query and Host. Raises UpstreamError.
    """
    target = urlsplit(url)
    host = target.hostname or "127.0.0.1"
    port = target.port or (443 if target.scheme == "https" else 80)
    connection = h11.Connection(h11.CLIENT)
    head = connection.send(h11.Request(
        method=method, target=target.path + (f"?{target.query}" if target.query else "") or "/",
        headers=[(b"Host", target.netloc.encode()),
                 *((name, value) for name, value in headers
                   if name.lower() in _FORWARDED_HEADERS)]))
    stream: trio.abc.Stream | None = None
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            if target.scheme == "https":
                stream = trio.SSLStream(stream, ssl.create_default_context(),
                                        server_hostname=host, https_compatible=True)
            await stream.send_all(head + connection.send(h11.EndOfMessage()))
            return await _read_answer(stream, connection)
    except trio.TooSlowError:
        message = f"no answer from {target.netloc} within {timeout:g} s"
    except (OSError, trio.BrokenResourceError) as error:
        message = str(error.__cause__ or error) or type(error).__name__
    except h11.RemoteProtocolError as error:
        message = f"invalid answer from {target.netloc}: {error}"
    finally:
        if stream is not None and connection.their_state is not h11.SWITCHED_PROTOCOL:
            await trio.aclose_forcefully(stream)
    raise UpstreamError(message)


async def _read_answer(stream: trio.abc.Stream, connection: h11.Connection) -> UpstreamAnswer:
    response: h11.Response | None = None
    body = b""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(bytes(await stream.receive_some(READ_SIZE)))
        elif isinstance(event, h11.InformationalResponse) and event.status_code == 101:
            return UpstreamAnswer(101, event.reason, list(event.headers.raw_items()),
                                  stream=stream, early=connection.trailing_data[0])
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        if response is not None and (isinstance(event, h11.EndOfMessage)
                                     or len(body) >= MAX_ANSWER_BODY):
            return UpstreamAnswer(response.status_code, response.reason,
                                  list(response.headers.raw_items()), body[:MAX_ANSWER_BODY])


# -- the splice -----------------------------------------------------------------------------------


async def splice(client: trio.abc.Stream, client_early: bytes, runtime: trio.abc.Stream,
                 runtime_early: bytes, *, drain: float = CLOSE_TIMEOUT,
                 idle: IdleTimer | None = None) -> tuple[int, int]:
    """Copy bytes both ways, ``*_early`` first, until the session ends; then close both.

    It ends when the runtime stops sending (after the exit status) or either connection breaks.
    A client that only ends its sending side has that passed on when the runtime's connection
    can half-close (plain TCP, as containerd's), and still gets what the runtime sends for up to
    ``drain`` seconds. ``idle`` ends a session in which nothing moved for its timeout.
    Returns the bytes copied (client to runtime, runtime to client).
    """
    copied = [0, 0]
    idle = idle if idle is not None else IdleTimer(0)

    async def pump(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream, early: bytes,
                   index: int) -> bool:
        """Copy until ``source`` ends: True on its clean end, False if either side broke."""
        try:
            if early:
                await sink.send_all(early)
                copied[index] += len(early)
            while chunk := await source.receive_some(READ_SIZE):
                idle.touch()
                await sink.send_all(chunk)
                copied[index] += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    async def client_to_runtime(session: trio.CancelScope) -> None:
        if await pump(client, runtime, client_early, 0) \
                and isinstance(runtime, trio.abc.HalfCloseableStream):
            try:
                await runtime.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                session.cancel()
            session.deadline = min(session.deadline, trio.current_time() + drain)
        else:
            session.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client_to_runtime, nursery.cancel_scope)
            nursery.start_soon(idle.watch, nursery.cancel_scope)
            await pump(runtime, client, runtime_early, 1)
            nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(runtime)
        with trio.move_on_after(CLOSE_TIMEOUT):
            await client.aclose()
    return copied[0], copied[1]
