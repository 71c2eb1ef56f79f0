"""server.healthz_server: the healthz port's own HTTP/1.1 server, over a real socket."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import cast

import httpx
import pytest
import trio

from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.server.connections import HTTPLimits
from trio_kubelet.server.health import NodeHealth
from trio_kubelet.server.healthz_server import serve_healthz
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore


class Times:
    """The health timestamps the agent would publish; ``broken`` makes reading them fail."""

    def __init__(self) -> None:
        self.relist: float | None = None
        self.broken = False

    def last_relist(self) -> float | None:
        if self.broken:
            raise RuntimeError("status store gone")
        return self.relist


@asynccontextmanager
async def healthz_server(times: Times, *, max_body_bytes: int = 1024,
                         idle_timeout: float = 5.0) -> AsyncIterator[int]:
    options = AgentOptions(config=KubeletConfiguration(), node_name="node-a",
                           root_dir=Path("/nonexistent"))
    view = NodeView(options=options, store=PodStatusStore(), client=cast(CRIClient, object()),
                    last_relist=times.last_relist, last_sync_loop=lambda: None)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(
            serve_healthz, NodeHealth(view), listeners, limits=HTTPLimits(
                max_header_bytes=4096, idle_timeout=idle_timeout, max_body_bytes=max_body_bytes,
                max_connections=8)))
        yield port
        nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()


async def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on a new connection and read until the server closes it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(raw)
    received = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some(65536):
            received += chunk
    await stream.aclose()
    return received


async def test_health_answers_with_gos_headers_and_bodies() -> None:
    times = Times()
    async with healthz_server(times) as port, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        times.relist = trio.current_time()
        ok = await client.get("/healthz")
        assert (ok.status_code, ok.reason_phrase, ok.text) == (200, "OK", "ok")
        assert ok.headers["content-type"] == "text/plain; charset=utf-8"
        assert ok.headers["x-content-type-options"] == "nosniff"
        assert ok.headers["date"].endswith(" GMT")
        verbose = await client.get("/healthz?verbose")
        assert verbose.text == "[+]ping ok\n[+]syncloop ok\n[+]pleg ok\nhealthz check passed\n"
        assert (await client.get("/healthz/ping")).text == "ok"

        times.relist = trio.current_time() - 200
        failed = await client.get("/healthz")
        assert failed.status_code == 500
        assert failed.text.endswith("[-]pleg failed: reason withheld\nhealthz check failed\n")
        pleg = await client.get("/healthz/pleg")
        assert (pleg.status_code, pleg.text) == (500, (
            "internal server error: pleg was last seen active 3m20s ago; threshold is 3m0s\n"))
        excluded = await client.get("/healthz", params=[("exclude", "pleg"), ("verbose", "")])
        assert excluded.status_code == 200 and "[+]pleg excluded: ok\n" in excluded.text

        head = await client.head("/healthz/ping")
        assert (head.status_code, head.headers["content-length"], head.content) == (
            200, "2", b"")
        for path in ("/", "/healthz/nope", "/pods", "/healthz/ping/more"):
            missing = await client.get(path)
            assert (missing.status_code, missing.text) == (404, "404 page not found\n"), path
        post = await client.post("/healthz", content=b"x")
        assert (post.status_code, post.text, post.headers["allow"]) == (
            405, "Method Not Allowed\n", "GET, HEAD")


async def test_keep_alive_pipelining_and_http_1_0() -> None:
    async with healthz_server(Times()) as port:
        pipelined = (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /healthz/nope HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /healthz/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answers = await exchange(port, pipelined)
        assert answers.count(b"HTTP/1.1 ") == 3
        assert answers.index(b"200 OK") < answers.index(b"404 Not Found")
        assert answers.endswith(b"\r\n\r\nok")
        absolute = await exchange(port, b"GET http://x/healthz/ping HTTP/1.1\r\nHost: x\r\n"
                                  b"Connection: close\r\n\r\n")
        assert absolute.startswith(b"HTTP/1.1 200 OK\r\n") and absolute.endswith(b"\r\n\r\nok")
        old = await exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")
        assert old.startswith(b"HTTP/1.1 200 OK\r\n") and old.endswith(b"\r\n\r\nok")


async def test_bad_requests_get_an_error_and_leave_the_server_serving() -> None:
    async with healthz_server(Times(), max_body_bytes=16) as port:
        garbage = await exchange(port, b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert garbage.endswith(b"400 Bad Request")
        big_body = await exchange(port, b"POST /healthz HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: 100\r\n\r\n" + b"y" * 100)
        assert big_body.startswith(b"HTTP/1.1 413 ")
        # A small body is read and dropped; the connection stays usable.
        small = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                               b"\r\nabcGET /healthz/ping HTTP/1.1\r\nHost: x\r\n"
                               b"Connection: close\r\n\r\n")
        assert small.count(b"HTTP/1.1 200 OK") == 2
        # A client that leaves in the middle of its request head.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHo")
        await stream.aclose()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/healthz")).text == "ok"


async def test_a_client_idle_past_the_timeout_is_closed() -> None:
    async with healthz_server(Times(), idle_timeout=0.2) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(3):
            first = await stream.receive_some(65536)
            assert first.startswith(b"HTTP/1.1 200 OK")
            assert await stream.receive_some(65536) == b""  # closed once idle
        await stream.aclose()


async def test_a_failing_check_is_a_500_for_that_request_only(
        caplog: pytest.LogCaptureFixture) -> None:
    times = Times()
    async with healthz_server(times) as port, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        times.broken = True
        failed = await client.get("/healthz/pleg")
        assert (failed.status_code, failed.text) == (500, "Internal Server Error\n")
        times.broken = False
        assert (await client.get("/healthz/pleg")).text == "ok"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "GET /healthz/pleg: handler failed: RuntimeError: status store gone"]


async def test_a_client_that_does_not_read_its_answers_is_closed() -> None:
    exclude = "x" * 3000  # each answer names it back: ~3 KB
    request = f"GET /healthz?exclude={exclude} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    async with healthz_server(Times(), idle_timeout=0.3) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        # Far more answers than the socket buffers hold, none of them read while sending.
        with trio.move_on_after(2), suppress(trio.BrokenResourceError):
            await stream.send_all(request * 5000)
        received = 0
        with trio.fail_after(5), suppress(trio.BrokenResourceError):
            while chunk := await stream.receive_some(1 << 16):
                received += len(chunk)
        assert received < 5000 * 3000, "the server gave up on the client mid-way"
        await stream.aclose()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/healthz")).text == "ok"
