"""The API client's transport, replaceable while requests run: how a rotated client certificate
reaches new connections without cutting the ones in use.

Each request goes out on the newest transport. A replaced transport keeps serving the responses
already on it (a watch can stream for half an hour) and is closed when the last of them ends, so a
certificate rotation never drops a watch. Go's kubelet instead closes every connection on a
rotation and lets its reflectors reconnect; here nothing reconnects, and no request after the
rotation goes out with the old certificate (a pooled keep-alive connection would otherwise carry
it until the API server refuses it as expired).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx


class _Tracked:
    """One transport and the responses still open on it."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self.transport = transport
        self.open = 0
        self.retired = False
        self.closed = False

    async def release(self) -> None:
        self.open -= 1
        if self.retired and self.open == 0:
            await self.close()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.transport.aclose()


class _ReleasingStream(httpx.AsyncByteStream):
    """A response body that tells its transport when it is closed."""

    def __init__(self, stream: httpx.AsyncByteStream, owner: _Tracked) -> None:
        self._stream = stream
        self._owner: _Tracked | None = owner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            owner, self._owner = self._owner, None
            if owner is not None:
                await owner.release()


class ReplaceableTransport(httpx.AsyncBaseTransport):
    """Sends on the current transport; ``replace`` switches new requests to another."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._current = _Tracked(transport)
        self._retired: list[_Tracked] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        owner = self._current
        owner.open += 1
        try:
            response = await owner.transport.handle_async_request(request)
        except BaseException:
            await owner.release()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_ReleasingStream(response.stream, owner),
            extensions=response.extensions,
        )

    async def replace(self, transport: httpx.AsyncBaseTransport) -> None:
        """New requests use ``transport``; the old one closes once its open responses have."""
        old, self._current = self._current, _Tracked(transport)
        old.retired = True
        if old.open == 0:
            await old.close()
        self._retired = [tracked for tracked in (*self._retired, old) if not tracked.closed]

    @property
    def draining(self) -> int:
        """How many replaced transports still carry open responses (watches)."""
        return sum(1 for tracked in self._retired if not tracked.closed)

    async def aclose(self) -> None:
        for tracked in (*self._retired, self._current):
            await tracked.close()
