"""The healthz port (``healthzBindAddress:healthzPort``, 127.0.0.1:10248): a small HTTP/1.1
server with the health answers and nothing else, as the Go kubelet's own there.

Why not an ASGI app on the server of 10250 and 10255 (``asgi_server``): liveness probes and
monitoring poll this port, and it must answer fast while the agent is busy. Measured on this
machine (2 vCPUs, 50 keep-alive clients at 100 requests/s, bench/README.md), when those ports
ran Hypercorn: a no-op ASGI app answered with a p99 of 5.4-6.0 ms and at most ~820 requests/s
flat out, a bare Quart-Trio app 7-8 ms; this server, h11 framing on a trio stream and the
answer written directly, 1.9 ms and ~4,800 requests/s. Quart's own cost per request remains
whatever the server under it.

It speaks HTTP/1.1 only (keep-alive, pipelining, HTTP/1.0 clients), GET and HEAD. Limits as
on the other ports: request head size (431), number of connections, and one timeout for each
exchange (waiting for a request, reading it, and sending the answer to a client that may not
be reading); a request body is read and dropped, up to ``max_body_bytes`` (413).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from http import HTTPStatus
from urllib.parse import unquote, urlsplit

import h11
import trio

from trio_kubelet.server.connections import HTTPLimits, limit_connections
from trio_kubelet.server.health import NodeHealth
from trio_kubelet.server.http1 import CLOSE, error_answer, http_date, next_event

log = logging.getLogger(__name__)

__all__ = ["serve_healthz"]

_METHODS = (b"GET", b"HEAD")
Answer = tuple[int, str, Sequence[tuple[bytes, bytes]]]


def _answer(health: NodeHealth, request: h11.Request) -> Answer:
    """``(status, body, extra headers)`` of one request, with Go's plain-text error bodies."""
    if request.method not in _METHODS:
        return 405, "Method Not Allowed\n", ((b"allow", b"GET, HEAD"),)
    path, _, query = request.target.decode("latin-1").partition("?")
    if not path.startswith("/"):  # absolute form, "http://host/healthz"
        path = urlsplit(path).path or "/"
    try:
        answer = health.answer(unquote(path), query)
    except Exception as exc:  # a broken check is this request's 500, never the server's end
        log.error("%s %s: handler failed: %s: %s", request.method.decode(), path,
                  type(exc).__name__, exc)
        return 500, "Internal Server Error\n", ()
    if answer is None:
        return 404, "404 page not found\n", ()
    return answer[0], answer[1], ()


def _response(conn: h11.Connection, answer: Answer, head_only: bool = False) -> bytes:
    status, body, extra = answer
    data = body.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"x-content-type-options", b"nosniff"), (b"date", http_date()),
               (b"content-length", str(len(data)).encode()), *extra]
    out = conn.send(h11.Response(status_code=status, headers=headers,
                                 reason=HTTPStatus(status).phrase.encode())) or b""
    if not head_only:
        out += conn.send(h11.Data(data=data)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


async def _read_request(conn: h11.Connection, stream: trio.SocketStream,
                        max_head_bytes: int, max_body_bytes: int
                        ) -> tuple[h11.Request, bool] | None:
    """The next request and whether it was read to its end (False: its body is bigger than
    ``max_body_bytes``, and the rest is left unread); None: the client closed the connection."""
    request = await next_event(conn, stream, max_head_bytes)
    if not isinstance(request, h11.Request):
        return None
    received = 0
    while (event := await next_event(conn, stream)) is not None:
        if isinstance(event, h11.EndOfMessage):
            return request, True
        if isinstance(event, h11.Data):
            received += len(event.data)
            if received > max_body_bytes:
                return request, False
    return None


async def _exchange(health: NodeHealth, conn: h11.Connection, stream: trio.SocketStream,
                    limits: HTTPLimits) -> bool:
    """Read one request and send its answer; whether the connection may carry another."""
    read = await _read_request(conn, stream, limits.max_header_bytes, limits.max_body_bytes)
    if read is None:
        return False
    request, complete = read
    answer = (_answer(health, request) if complete
              else (413, "Request Entity Too Large\n", CLOSE))
    await stream.send_all(_response(conn, answer, head_only=request.method == b"HEAD"))
    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
        return False  # the request asked to close, or its body was left unread
    conn.start_next_cycle()
    return True


async def _serve_connection(health: NodeHealth, limits: HTTPLimits,
                            stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
    try:
        going = True
        while going:
            going = False  # unless the exchange completes within the idle timeout
            with trio.move_on_after(limits.idle_timeout):
                going = await _exchange(health, conn, stream, limits)
    except h11.RemoteProtocolError as exc:
        log.debug("Bad request on the healthz port: %s", exc)
        await error_answer(conn, stream, exc.error_status_hint, limits.idle_timeout)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client left
    except Exception as exc:  # one broken connection must never take the server down
        log.error("healthz connection failed: %s: %s", type(exc).__name__, exc)
    finally:
        await trio.aclose_forcefully(stream)


async def serve_healthz(health: NodeHealth, listeners: Sequence[trio.SocketListener], *,
                        limits: HTTPLimits, name: str = "healthz",
                        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
                        ) -> None:
    """Answer health requests on bound ``listeners`` until cancelled (the caller closes them);
    reports the first listener's ``(host, port)`` once serving."""
    host, port = listeners[0].socket.getsockname()[:2]
    handler = limit_connections(partial(_serve_connection, health, limits),
                                limits.max_connections)
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, list(listeners))
        log.info("%s server listening on http://%s:%d", name, host, port)
        task_status.started((host, port))
