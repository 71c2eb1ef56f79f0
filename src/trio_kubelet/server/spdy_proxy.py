"""SPDY/3.1 upgrades of ``/exec``, ``/attach`` and ``/portForward``, served below Hypercorn.

The API server speaks SPDY/3.1 to the kubelet for exec, attach and port-forward (it translates a
client's websocket to SPDY), and the runtime's streaming server speaks SPDY itself: like the Go
kubelet, we relay the upgrade request to the runtime's one-time URL, relay its ``101`` and then
copy bytes both ways, without understanding a single SPDY frame. Hypercorn cannot take part: it
hands an ASGI app websockets and h2c, never the socket of any other ``Upgrade``.

So the accept loop (``serve.py``) reads each connection's first request head itself
(``read_first_request``). Anything but an SPDY upgrade on a streaming path goes to Hypercorn with
the bytes read put back. An SPDY upgrade is given to the same ASGI app by ``serve_upgrade``, a
one-request HTTP/1.1 server: the app authenticates, authorises, routes, counts and answers errors
exactly as for any request, and finds the connection in the scope (extension ``RAW_UPGRADE``,
a ``RawUpgrade``). The streaming view dials the runtime (``dial_upgrade``) and, on ``101``, hands
the connection over (``RawUpgrade.splice``). Only a connection's first request can be such an
upgrade; clients open a new connection for each upgrade anyway.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import h11
import trio
from hypercorn.typing import ASGIFramework, ASGIReceiveEvent, ASGISendEvent, Scope

from trio_kubelet.server.idle import IdleTimer

__all__ = [
    "RAW_UPGRADE",
    "RawUpgrade",
    "UpgradeRequest",
    "UpstreamAnswer",
    "UpstreamError",
    "dial_upgrade",
    "read_first_request",
    "serve_upgrade",
    "splice",
]

# The ASGI scope extension under which ``serve_upgrade`` offers the request's connection.
RAW_UPGRADE = "trio_kubelet.raw_upgrade"
MAX_RECV = 2**16  # Hypercorn's read size
CLOSE_TIMEOUT = 5.0  # for a TLS close_notify to a client that does not read
MAX_ANSWER_BODY = 64 * 1024  # of a runtime's refusal, passed on to the client
# Request lines that may start an upgrade we serve; any other first request goes to Hypercorn.
_STREAMING_REQUEST_LINES = tuple(f"{method} /{path}/".encode() for method in ("GET", "POST")
                                 for path in ("exec", "attach", "portForward"))
# What of the client's request the runtime gets besides Host: what the upgrade needs, no
# credentials (the Go proxy sends every header on).
_FORWARDED_HEADERS = frozenset({b"upgrade", b"connection", b"x-stream-protocol-version"})

Headers = list[tuple[bytes, bytes]]


# -- the first request of a connection ----------------------------------------------------------


@dataclass(frozen=True)
class UpgradeRequest:
    """A connection's first request, an SPDY upgrade on a streaming path; not yet answered."""

    connection: h11.Connection  # server side, waiting for our answer to the proposed switch
    request: h11.Request
    path: str  # percent-decoded, as ASGI's scope["path"]
    early: bytes  # what the client sent after the request head


def _may_be_streaming(data: bytes) -> bool:
    return any(data.startswith(line) or line.startswith(data)
               for line in _STREAMING_REQUEST_LINES)


async def read_first_request(stream: trio.abc.ReceiveStream,
                             max_head_bytes: int) -> bytes | UpgradeRequest:
    """The first request of a connection: an ``UpgradeRequest``, or the bytes read so far.

    An ordinary request is decided on its first bytes (usually one read holds the whole head)
    and returned unparsed, to be handed to Hypercorn; ``b""`` means the client closed without a
    word. Only a request line on a streaming path is read to the end of its head. Callers bound
    the time this takes.
    """
    data = b""
    while True:
        chunk = await stream.receive_some(MAX_RECV)
        data += chunk
        if not chunk or not _may_be_streaming(data):
            return data
        if b"\r\n\r\n" in data or len(data) > max_head_bytes:
            return _spdy_upgrade(data, max_head_bytes) or data


def _spdy_upgrade(data: bytes, max_head_bytes: int) -> UpgradeRequest | None:
    """``data`` parsed, if it is a complete SPDY upgrade request without a body.

    An upgrade request is one whose Connection header mentions ``upgrade``, as Go's
    ``httpstream.IsUpgradeRequest`` has it; websockets, malformed requests and requests with a
    body are left to Hypercorn.
    """
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head_bytes)
    connection.receive_data(data)
    try:
        request = connection.next_event()
        end = connection.next_event()
        if not isinstance(request, h11.Request) or not isinstance(end, h11.EndOfMessage) \
                or b"upgrade" not in _header(request, b"connection") \
                or b"spdy/" not in _header(request, b"upgrade"):
            return None
        path = unquote(request.target.partition(b"?")[0].decode("ascii"))
    except (h11.RemoteProtocolError, UnicodeDecodeError):
        return None
    return UpgradeRequest(connection, request, path, connection.trailing_data[0])


def _header(request: h11.Request, name: bytes) -> bytes:
    """All values of header ``name``, lower case, comma-joined."""
    return b",".join(value for key, value in request.headers if key == name).lower()


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

    async def respond(self, message: ASGISendEvent) -> None:
        """Write an ASGI ``http.response.*`` message; the connection closes after the answer."""
        if self.switched:
            return
        connection = self._upgrade.connection
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            data = connection.send(h11.Response(status_code=status, headers=headers,
                                                reason=_reason(status)))
        elif message["type"] == "http.response.body":
            data = connection.send(h11.Data(data=message.get("body", b"")))
            if not message.get("more_body", False):
                data += connection.send(h11.EndOfMessage())
        else:
            return
        await self._stream.send_all(data)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


async def serve_upgrade(app: ASGIFramework, stream: trio.abc.Stream, upgrade: UpgradeRequest, *,
                        scheme: str, client: tuple[str, int] | None,
                        server: tuple[str, int] | None, state: dict[str, Any]) -> None:
    """Run ``app`` for this one request, then close the connection.

    The scope is what Hypercorn would build, plus the ``RAW_UPGRADE`` extension. The request has
    no body; ``receive`` then waits forever, since the end of the session is not an ASGI event
    here (the view sees the connection end itself).
    """
    raw = RawUpgrade(stream, upgrade)
    request = upgrade.request
    path, _, query = request.target.partition(b"?")
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request.http_version.decode(), "method": request.method.decode(),
        "scheme": scheme, "path": upgrade.path, "raw_path": path, "query_string": query,
        "root_path": "", "headers": list(request.headers), "client": client, "server": server,
        "state": state, "extensions": {RAW_UPGRADE: raw},
    }
    requested = False

    async def receive() -> ASGIReceiveEvent:
        nonlocal requested
        if requested:
            await trio.sleep_forever()
        requested = True
        return {"type": "http.request", "body": b"", "more_body": False}

    try:
        await app(cast(Scope, scope), receive, raw.respond)
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
            connection.receive_data(bytes(await stream.receive_some(MAX_RECV)))
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
            while chunk := await source.receive_some(MAX_RECV):
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
