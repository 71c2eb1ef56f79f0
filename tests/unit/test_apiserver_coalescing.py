"""apiserver/coalescing.py: a request's head and body leave in one write, and the API client
uses it on its own connections."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpcore
import trio

from trio_kubelet.apiserver import coalescing
from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.coalescing import CoalescingBackend
from trio_kubelet.apiserver.kubeconfig import Connection

ANSWER = b'HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}'


class RecordingStream(httpcore.AsyncNetworkStream):
    """A connection that records each write and answers every request with ANSWER."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self._answers = 0

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.writes.append(buffer)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._answers < len(self.writes):
            self._answers = len(self.writes)
            return ANSWER
        return b""

    async def aclose(self) -> None:
        pass

    def get_extra_info(self, info: str) -> Any:
        return None


class RecordingBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self.streams: list[RecordingStream] = []

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        self.streams.append(RecordingStream())
        return self.streams[-1]


async def test_a_request_head_and_body_go_out_in_one_write() -> None:
    inner = RecordingBackend()
    body = json.dumps({"kind": "Event", "message": "x" * 500}).encode()
    async with httpcore.AsyncConnectionPool(network_backend=CoalescingBackend(inner)) as pool:
        for _ in range(2):  # and again on the kept-alive connection
            response = await pool.request("POST", "http://api.test/api/v1/events", content=body,
                                          headers={"Content-Type": "application/json"})
            assert response.status == 201
    [stream] = inner.streams
    assert len(stream.writes) == 2
    for write in stream.writes:
        assert write.startswith(b"POST /api/v1/events HTTP/1.1\r\n") and write.endswith(body)


async def test_a_large_body_goes_out_before_the_response_is_read(monkeypatch: Any) -> None:
    monkeypatch.setattr(coalescing, "FLUSH_AT", 1000)
    inner = RecordingBackend()
    body = b"y" * 5000

    async def pieces() -> AsyncIterator[bytes]:
        yield body[:2500]
        yield body[2500:]

    async with httpcore.AsyncConnectionPool(network_backend=CoalescingBackend(inner)) as pool:
        await pool.request("PUT", "http://api.test/x", content=pieces(),
                           headers={"Content-Length": str(len(body))})
    [stream] = inner.streams
    assert len(stream.writes) >= 2  # flushed as the buffer filled, not held whole
    assert b"".join(stream.writes).endswith(body)


async def test_the_api_client_talks_over_it_to_a_real_server() -> None:
    """One connection, two requests with bodies: each arrives whole in one read (on loopback
    one write is one segment), and the answers come back."""
    reads: list[bytes] = []

    async def serve(stream: trio.SocketStream) -> None:
        while data := await stream.receive_some(65536):
            reads.append(data)
            await stream.send_all(ANSWER)

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        client = APIClient(Connection(server=f"http://127.0.0.1:{port}", ssl_context=None))
        for name in ("a", "b"):
            assert await client.create("/api/v1/namespaces/default/events",
                                       {"metadata": {"name": name}}) == {}
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert len(reads) == 2
    for data, name in zip(reads, "ab", strict=True):
        assert data.startswith(b"POST /api/v1/namespaces/default/events HTTP/1.1\r\n")
        assert json.loads(data.partition(b"\r\n\r\n")[2]) == {"metadata": {"name": name}}
