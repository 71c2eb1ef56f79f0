"""apiserver/transport.py: a replaced transport serves the responses open on it to their end and
is closed after them; every new request goes out on the new one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from trio_kubelet.apiserver.transport import ReplaceableTransport


class Recording(httpx.AsyncBaseTransport):
    """Answers every request with a body streamed from ``chunks`` (a watch-like response)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.paths: list[str] = []
        self.closed = False
        self.send, self.receive = trio.open_memory_channel[bytes](10)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path == "/watch":
            return httpx.Response(200, stream=Chunks(self.receive.clone()))
        return httpx.Response(200, json={"from": self.name})

    async def aclose(self) -> None:
        self.closed = True


class Chunks(httpx.AsyncByteStream):
    def __init__(self, receive: trio.MemoryReceiveChannel[bytes]) -> None:
        self.receive = receive

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.receive:
            yield chunk

    async def aclose(self) -> None:
        await self.receive.aclose()


async def test_new_requests_use_the_new_transport_while_a_watch_goes_on() -> None:
    old, new = Recording("old"), Recording("new")
    transport = ReplaceableTransport(old)
    async with httpx.AsyncClient(base_url="http://api.test", transport=transport) as client:
        async with client.stream("GET", "/watch") as watch:
            lines = watch.aiter_bytes()
            await old.send.send(b"one")
            assert await anext(lines) == b"one"
            await transport.replace(new)
            assert (await client.get("/pods")).json() == {"from": "new"}
            assert not old.closed and transport.draining == 1
            await old.send.send(b"two")  # the watch still streams on the old connection
            assert await anext(lines) == b"two"
        assert old.closed and transport.draining == 0
        assert old.paths == ["/watch"] and new.paths == ["/pods"]
    assert new.closed


async def test_an_idle_transport_closes_at_once() -> None:
    old, new = Recording("old"), Recording("new")
    transport = ReplaceableTransport(old)
    async with httpx.AsyncClient(base_url="http://api.test", transport=transport) as client:
        assert (await client.get("/pods")).json() == {"from": "old"}
        await transport.replace(new)
        assert old.closed and transport.draining == 0
        assert (await client.get("/pods")).json() == {"from": "new"}


async def test_a_failed_request_is_not_counted_as_open() -> None:
    class Failing(Recording):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("refused", request=request)

    old, new = Failing("old"), Recording("new")
    transport = ReplaceableTransport(old)
    async with httpx.AsyncClient(base_url="http://api.test", transport=transport) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/pods")
        await transport.replace(new)
        assert old.closed
