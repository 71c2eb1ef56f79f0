"""server.asgi_server over real sockets: HTTP/1.1 framing both ways, the disconnect a streaming
app waits for, request bodies the app reads or leaves, failures, websockets, the lifespan."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
import trio_websocket
from quart import websocket
from quart_trio import QuartTrio

from trio_kubelet.server import asgi_server
from trio_kubelet.server.asgi import Message, Receive, Scope, Send
from trio_kubelet.server.serve import HTTPLimits, ServerStartError, serve_app


@asynccontextmanager
async def serving(app: Any, limits: HTTPLimits | None = None) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_app, app, "127.0.0.1", 0,
                                              limits=limits or HTTPLimits()))
        yield port
        nursery.cancel_scope.cancel()


async def read_all(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def read_until(stream: trio.abc.ReceiveStream, marker: bytes) -> bytes:
    data = b""
    with trio.fail_after(5):
        while marker not in data:
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed before {marker!r}: {data!r}"
            data += chunk
    return data


class Echo:
    """Answers each request with its method, path, query and body; counts the requests."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.scopes.append(scope)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        answer = b"%s %s?%s %s" % (scope["method"].encode(), scope["path"].encode(),
                                   scope["query_string"], body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})


async def test_keep_alive_pipelining_bodies_head_and_http_1_0() -> None:
    echo = Echo()
    async with serving(echo) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(
            b"GET /a%20b?x=1 HTTP/1.1\r\nHost: k\r\n\r\n"
            b"POST /post HTTP/1.1\r\nHost: k\r\nContent-Length: 5\r\n\r\nhello"
            b"POST /chunked HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            b"HEAD /head HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n")
        answers = await read_all(stream)
        await stream.aclose()
        assert answers.count(b"HTTP/1.1 200 OK\r\n") == 4
        assert b"\r\n\r\nGET /a b?x=1 " in answers
        assert b"\r\n\r\nPOST /post? hello" in answers
        assert b"\r\n\r\nPOST /chunked? abcde" in answers
        head = answers[answers.rindex(b"HTTP/1.1 200 OK"):]
        assert b"content-length: 12\r\n" in head and head.endswith(b"\r\n\r\n"), \
            "HEAD: the length of the body it would get (b'HEAD /head? '), and no body"
        assert [scope["raw_path"] for scope in echo.scopes] == [
            b"/a%20b", b"/post", b"/chunked", b"/head"]
        assert echo.scopes[0]["client"][0] == "127.0.0.1"
        old = await trio.open_tcp_stream("127.0.0.1", port)
        await old.send_all(b"GET /old HTTP/1.0\r\n\r\n")
        answer = await read_all(old)  # closed after its answer
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"GET /old? ")
        await old.aclose()


async def test_100_continue_is_sent_when_the_app_reads_the_body() -> None:
    async with serving(Echo()) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"PUT /p HTTP/1.1\r\nHost: k\r\nContent-Length: 2\r\n"
                              b"Expect: 100-continue\r\n\r\n")
        assert (await read_until(stream, b"\r\n\r\n")).startswith(b"HTTP/1.1 100 ")
        await stream.send_all(b"ok")
        assert (await read_until(stream, b"PUT /p? ok")).startswith(b"HTTP/1.1 200 ")
        await stream.aclose()


async def test_a_streamed_answer_is_chunked_and_ends_when_the_client_leaves() -> None:
    ended = trio.Event()
    head_read = trio.Event()

    async def ticker(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await receive()  # the (empty) body
        async with trio.open_nursery() as nursery:
            async def until_disconnect() -> None:
                assert (await receive())["type"] == "http.disconnect"
                ended.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_disconnect)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await head_read.wait()  # a followed log may have nothing to send for a while
            while True:
                await send({"type": "http.response.body", "body": b"tick", "more_body": True})
                await trio.sleep(0.01)

    async with serving(ticker) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /follow HTTP/1.1\r\nHost: k\r\n\r\n")
        head = await read_until(stream, b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head.lower()
        head_read.set()
        await read_until(stream, b"4\r\ntick\r\n")
        await stream.aclose()
        with trio.fail_after(2):
            await ended.wait()


async def test_failures_are_a_500_or_a_closed_connection_never_the_servers_end(
        caplog: pytest.LogCaptureFixture) -> None:
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/late":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"10")]})
            await send({"type": "http.response.body", "body": b"half", "more_body": True})
        if scope["path"] != "/silent":
            raise RuntimeError("broken handler")

    async with serving(failing) as port:
        for path, expected in (("/early", b"HTTP/1.1 500 "), ("/silent", b"HTTP/1.1 500 ")):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: k\r\n\r\n".encode())
            answer = await read_all(stream)
            assert answer.startswith(expected) and answer.endswith(b"Internal Server Error\n")
            await stream.aclose()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /late HTTP/1.1\r\nHost: k\r\n\r\n")
        answer = await read_all(stream)  # cut off: the connection closes
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nhalf")
        await stream.aclose()
    assert "GET /early: the app failed: RuntimeError: broken handler" in caplog.text


async def test_an_unread_body_is_dropped_and_a_big_one_closes_the_connection() -> None:
    async def ignores_body(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    async with serving(ignores_body, HTTPLimits(max_body_bytes=100)) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /a HTTP/1.1\r\nHost: k\r\nContent-Length: 50\r\n\r\n"
                              + b"x" * 50 + b"GET /b HTTP/1.1\r\nHost: k\r\n\r\n"
                              b"POST /c HTTP/1.1\r\nHost: k\r\nContent-Length: 500\r\n\r\n"
                              + b"y" * 500)
        answers = await read_all(stream)  # the third body is too big to drop: closed
        assert answers.count(b"HTTP/1.1 204 ") == 3
        await stream.aclose()


# --- websockets ----------------------------------------------------------------------------------


def websocket_app(seen: list[Any]) -> QuartTrio:
    app = QuartTrio("ws")

    @app.websocket("/echo")
    async def echo() -> None:
        await websocket.accept(subprotocol=websocket.requested_subprotocols[-1])
        try:
            while True:
                message = await websocket.receive()
                seen.append(message)
                await websocket.send(message)
        finally:
            seen.append("gone")

    return app


async def test_websocket_messages_both_ways_with_subprotocols_as_sent() -> None:
    seen: list[Any] = []
    async with serving(websocket_app(seen)) as port:
        async with trio_websocket.open_websocket(
                "127.0.0.1", port, "/echo", use_ssl=False,
                subprotocols=["v4.channel.k8s.io", "base64url.bearer.authorization.k8s.io.AbC"],
                ) as ws:
            assert ws.subprotocol == "base64url.bearer.authorization.k8s.io.AbC"
            await ws.send_message("text")
            assert await ws.get_message() == "text"
            await ws.send_message(b"\x00" + b"b" * 200_000)  # sent in frames of 64 KiB
            assert await ws.get_message() == b"\x00" + b"b" * 200_000
            await ws.ping(b"are you there")
        with trio.fail_after(2):
            while "gone" not in seen:
                await trio.sleep(0.01)
    assert seen == ["text", b"\x00" + b"b" * 200_000, "gone"]


async def test_a_websocket_message_over_the_limit_closes_with_1009(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asgi_server, "MAX_MESSAGE_BYTES", 1000)
    seen: list[Any] = []
    async with serving(websocket_app(seen)) as port, trio_websocket.open_websocket(
            "127.0.0.1", port, "/echo", use_ssl=False, subprotocols=["x"]) as ws:
        await ws.send_message(b"small")
        assert await ws.get_message() == b"small"
        await ws.send_message(b"b" * 1001)
        with pytest.raises(trio_websocket.ConnectionClosed) as closed, trio.fail_after(5):
            await ws.get_message()
        assert closed.value.reason.code == 1009
    assert seen[0] == b"small"


async def test_a_bad_websocket_handshake_is_a_400() -> None:
    async with serving(websocket_app([])) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /echo HTTP/1.1\r\nHost: k\r\nConnection: Upgrade\r\n"
                              b"Upgrade: websocket\r\n\r\n")  # no key, no version
        assert (await read_all(stream)).startswith(b"HTTP/1.1 400 ")
        await stream.aclose()


# --- the lifespan --------------------------------------------------------------------------------


async def test_the_apps_startup_and_shutdown_run_around_serving() -> None:
    app = QuartTrio("lifespan")
    calls: list[str] = []
    app.before_serving(lambda: calls.append("startup"))  # type: ignore[arg-type,func-returns-value]
    app.after_serving(lambda: calls.append("shutdown"))  # type: ignore[arg-type,func-returns-value]
    async with serving(app):
        assert calls == ["startup"]
    assert calls == ["startup", "shutdown"]


async def test_an_app_that_fails_to_start_is_a_server_start_error() -> None:
    async def refuses(scope: Scope, receive: Receive, send: Send) -> None:
        message: Message = await receive()
        assert message["type"] == "lifespan.startup"
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    with pytest.raises(ServerStartError, match="HTTP server: the app did not start: no database"):
        await serve_app(refuses, "127.0.0.1", 0)


async def test_clients_that_reset_at_once_do_not_take_the_server_down() -> None:
    async with serving(Echo()) as port:
        for _ in range(200):
            sock = trio.socket.socket()
            await sock.connect(("127.0.0.1", port))
            # Linger 0: close() sends a reset, maybe before the server has accepted.
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER,
                            struct.pack("ii", 1, 0))
            sock.close()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /still HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n")
        assert (await read_all(stream)).endswith(b"GET /still? ")
        await stream.aclose()
