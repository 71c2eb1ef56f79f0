"""HTTP/1.1 framing on trio streams (h11), shared by the kubelet's own servers: reading within the
head size limit, the ``Date`` header, and the error answer that closes a connection."""

from __future__ import annotations

import time
from contextlib import suppress
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

import h11
import trio

__all__ = ["CLOSE", "READ_SIZE", "error_answer", "header", "http_date", "next_event", "reason"]

READ_SIZE = 65536  # one read from the transport
CLOSE = ((b"connection", b"close"),)
# After an error answer, how long the rest of the request is read and dropped before the
# connection is closed (Go's rstAvoidanceDelay): closing with unread data makes the kernel
# reset the connection, and the client may lose the answer it was sent.
_RST_AVOIDANCE_DELAY = 0.5


class _HTTPDate:
    """The ``Date`` header, formatted once a second rather than per response."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode()
        return self._value


http_date = _HTTPDate().now


def header(request: h11.Request, name: bytes, *, lower: bool = True) -> bytes:
    """All values of header ``name`` (lower case) of ``request``, comma-joined; lower case
    unless ``lower`` is false."""
    value = b",".join(value for key, value in request.headers if key == name)
    return value.lower() if lower else value


def reason(status: int) -> bytes:
    """The reason phrase of ``status`` (empty for a code without one)."""
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


async def next_event(conn: h11.Connection, stream: trio.abc.ReceiveStream,
                     head_bytes: int | None = None) -> h11.Event | None:
    """The connection's next event, reading as needed; None when the client has gone (or the
    connection waits for a protocol switch: h11's PAUSED).

    With ``head_bytes`` (reading a request head), a head bigger than that is refused
    (431), whatever the sizes of the reads it arrives in: h11's own limit only applies
    to what is still incomplete after a read, so a head a little past it was accepted.
    """
    left = head_bytes
    while True:
        event = conn.next_event()
        if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
            return None
        if event is not h11.NEED_DATA:
            return cast(h11.Event, event)
        if left is not None and left <= 0:
            raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        data = await stream.receive_some(READ_SIZE if left is None else min(READ_SIZE, left))
        if left is not None:
            left -= len(data)
        conn.receive_data(bytes(data))


async def error_answer(conn: h11.Connection, stream: trio.abc.Stream, status: int,
                       timeout: float) -> None:
    """Answer ``status`` (a malformed or oversized request) if nothing was answered yet, then
    stop sending and drop what the client still sends for a moment (Go's
    ``closeWriteAndWait``); the caller closes the connection."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = f"{status} {HTTPStatus(status).phrase}".encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"x-content-type-options", b"nosniff"), (b"date", http_date()),
               (b"content-length", str(len(body)).encode()), *CLOSE]
    data = b"".join(conn.send(event) or b"" for event in (
        h11.Response(status_code=status, headers=headers, reason=reason(status)),
        h11.Data(data=body), h11.EndOfMessage()))
    # The client may have left already; it gets its answer if it has not.
    with trio.move_on_after(timeout), suppress(trio.BrokenResourceError,
                                               trio.ClosedResourceError):
        await stream.send_all(data)
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        with trio.move_on_after(_RST_AVOIDANCE_DELAY):
            while await stream.receive_some(READ_SIZE):
                pass
