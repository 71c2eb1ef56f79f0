"""A network backend for the API client whose connections send a request's head and body together.

httpcore writes an HTTP/1.1 request as it builds it: the head, then each piece of the body, a
socket send (and over TLS a record) each. A node's writes are small JSON bodies (Events,
status patches, Lease renewals), so that is two sends per request where one would do; on a
loopback or LAN connection each send costs more CPU than building the request, on both ends.
Here writes wait in a buffer until the connection next reads (the response) or the buffer
holds `FLUSH_AT` bytes, then go out as one: Go's HTTP client sends a request from a buffered
writer the same way.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpcore

FLUSH_AT = 64 * 1024  # bytes held before a write goes out without waiting for a read


class CoalescingStream(httpcore.AsyncNetworkStream):
    """A connection whose writes are sent together at its next read."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._pending: list[bytes] = []
        self._size = 0

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self._pending.append(buffer)
            self._size += len(buffer)
        if self._size >= FLUSH_AT:
            await self._flush(timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._flush(timeout)
        return await self._stream.read(max_bytes, timeout)

    async def _flush(self, timeout: float | None) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._size = 0
            await self._stream.write(data, timeout)

    async def aclose(self) -> None:
        self._pending.clear()
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await self._flush(timeout)
        return CoalescingStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class CoalescingBackend(httpcore.AsyncNetworkBackend):
    """Opens connections through ``backend`` (trio's), each a `CoalescingStream`."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._backend = backend if backend is not None else httpcore.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return CoalescingStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        return CoalescingStream(
            await self._backend.connect_unix_socket(path, timeout, socket_options)
        )

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)
