"""An API-server client on httpx: JSON in and out, QPS/burst limits, typed errors, watches.

Objects stay plain JSON dicts here; the callers validate what they read into models.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal

import httpcore
import httpx
import trio

from trio_kubelet import __version__
from trio_kubelet.apiserver.coalescing import CoalescingBackend
from trio_kubelet.apiserver.errors import (
    APIError,
    Conflict,
    Gone,
    NotFound,
    Unreachable,
    error_from_status,
)
from trio_kubelet.apiserver.kubeconfig import Connection
from trio_kubelet.apiserver.transport import ReplaceableTransport
from trio_kubelet.core.token_bucket import TokenBucket

log = logging.getLogger("trio_kubelet.apiserver")

PatchType = Literal["merge", "strategic", "json"]
PATCH_CONTENT_TYPES: dict[PatchType, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}
REQUEST_TIMEOUT = 30.0
IDLE_CONNECTION_TIMEOUT = 90.0  # Go's http.DefaultTransport IdleConnTimeout
JSON = dict[str, Any]
# Told of every request: host, method, HTTP status (None when there was no answer).
RequestObserver = Callable[[str, str, int | None], None]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: JSON


class APIClient:
    """One connection pool to the API server, shared by every caller in the agent."""

    def __init__(
        self,
        connection: Connection,
        *,
        qps: float = 50,
        burst: int = 100,
        timeout: float = REQUEST_TIMEOUT,
        clock: Callable[[], float] = trio.current_time,
        transport: httpx.AsyncBaseTransport | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        headers = {
            "User-Agent": f"trio-kubelet/{__version__}",
            "Accept": "application/json",
        }
        if connection.token:
            headers["Authorization"] = f"Bearer {connection.token}"
        self.server = connection.server
        self.connection = connection
        # Tests hand in their own transport; otherwise a replaceable one, so that a new client
        # certificate (use_client_certificate) applies to new connections only.
        self._transport: ReplaceableTransport | None = None
        if transport is None:
            transport = self._transport = ReplaceableTransport(_https_transport(connection))
        self._sender = transport
        self._http = httpx.AsyncClient(
            base_url=connection.server,
            verify=connection.ssl_context or True,  # what proxies from the environment get
            headers=headers,
            timeout=httpx.Timeout(timeout),
            transport=self._sender,
        )
        self._bucket = TokenBucket(qps, burst)
        self._clock = clock
        self._observer = observer
        self._host = httpx.URL(connection.server).netloc.decode()

    @property
    def http(self) -> httpx.AsyncClient:
        """The underlying pool, for callers with their own error handling (webhooks)."""
        return self._http

    async def aclose(self) -> None:
        await self._http.aclose()

    async def use_client_certificate(self, certificate: bytes, key: bytes) -> None:
        """Authenticate new requests with this certificate (a bootstrapped or rotated one);
        requests already running (watches) finish on their connections with the old one."""
        if self._transport is None:
            raise RuntimeError("the client's transport is the caller's: it cannot be replaced")
        self.connection = self.connection.with_client_certificate(certificate, key)
        self._http.headers.pop("Authorization", None)
        await self._transport.replace(_https_transport(self.connection))

    async def _throttle(self) -> None:
        delay = self._bucket.reserve(self._clock())
        if delay > 0:
            await trio.sleep(delay)

    def _observe(self, method: str, code: int | None) -> None:
        if self._observer is not None:
            self._observer(self._host, method, code)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JSON:
        """Send one request and return the JSON object answered; raise a typed APIError."""
        await self._throttle()
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": content_type} if content is not None else None
        request = self._http.build_request(
            method, path, params=params, content=content, headers=headers
        )
        try:
            response = await self._send(request)
        except httpx.HTTPError as err:
            self._observe(method, None)
            raise Unreachable(f"{method} {path}: {type(err).__name__}: {err}") from None
        self._observe(method, response.status_code)
        return _answer(method, path, response)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """The answer to ``request``, read whole, straight from the transport: the client's
        own send adds an auth flow, redirects, cookies and hooks that no API request here uses,
        a fifth of what a request cost the agent."""
        response = await self._sender.handle_async_request(request)
        response.request = request
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    async def get(self, path: str, params: Mapping[str, str | int] | None = None) -> JSON:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: JSON) -> JSON:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: JSON) -> JSON:
        return await self.request("PUT", path, body=body)

    async def patch(self, path: str, body: Any, kind: PatchType = "strategic") -> JSON:
        return await self.request("PATCH", path, body=body, content_type=PATCH_CONTENT_TYPES[kind])

    async def delete(self, path: str, options: JSON | None = None) -> JSON:
        return await self.request("DELETE", path, body=options)

    async def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod object with grace 0, only if it is still the one with ``uid``.

        Already gone (NotFound) or replaced by a pod of the same name (Conflict on the
        UID precondition) both mean there is nothing left to delete.
        """
        options = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        with suppress(NotFound, Conflict):
            await self.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", options)

    @asynccontextmanager
    async def watch(
        self, path: str, params: Mapping[str, str | int]
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """Open a watch; iterate the events until the server ends the stream.

        An ERROR event raises its typed error (``Gone`` for an expired resourceVersion).
        """
        await self._throttle()
        query = {**params, "watch": "true"}
        timeout = httpx.Timeout(REQUEST_TIMEOUT, read=None)
        answered = False
        try:
            async with self._http.stream("GET", path, params=query, timeout=timeout) as response:
                answered = True
                self._observe("WATCH", response.status_code)
                if response.status_code >= 300:
                    await response.aread()
                    raise _answer_error(response)
                yield _events(response)
        except httpx.HTTPError as err:
            if not answered:
                self._observe("WATCH", None)
            raise Unreachable(f"watch {path}: {type(err).__name__}: {err}") from None


def _https_transport(connection: Connection) -> httpx.AsyncHTTPTransport:
    # Kept alive as long as client-go keeps an idle connection (not httpx's 5 s, shorter than
    # the 10 s between a node's status and Lease rounds: a TLS handshake for nearly every one).
    limits = httpx.Limits(keepalive_expiry=IDLE_CONNECTION_TIMEOUT)
    ssl_context = connection.ssl_context or httpx.create_ssl_context()
    transport = httpx.AsyncHTTPTransport(verify=ssl_context, limits=limits)
    # httpx takes no network backend: its pool is replaced by one with the same settings whose
    # connections send each request's head and body in one write (coalescing.py).
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=CoalescingBackend(),
    )
    return transport


async def _events(response: httpx.Response) -> AsyncIterator[WatchEvent]:
    async for line in response.aiter_lines():
        if not line.strip():
            continue
        try:
            frame = json.loads(line)
            kind, obj = frame["type"], frame["object"]
        except (ValueError, KeyError, TypeError):
            raise APIError(0, "BadWatchEvent", f"not a watch event: {line[:200]!r}") from None
        if kind == "ERROR":
            code = int(obj.get("code", 500)) if isinstance(obj, dict) else 500
            raise error_from_status(code, obj if isinstance(obj, dict) else None)
        yield WatchEvent(kind, obj)


def _answer(method: str, path: str, response: httpx.Response) -> JSON:
    if response.status_code >= 300:
        raise _answer_error(response)
    try:
        body = response.json()
    except ValueError:
        raise APIError(
            response.status_code, "BadResponse", f"{method} {path}: the answer is not JSON"
        ) from None
    if not isinstance(body, dict):
        raise APIError(response.status_code, "BadResponse", f"{method} {path}: not an object")
    return body


def _answer_error(response: httpx.Response) -> APIError:
    try:
        body = response.json()
    except ValueError:
        body = {"message": response.text[:300]}
    return error_from_status(
        response.status_code,
        body if isinstance(body, dict) else None,
        response.headers.get("Retry-After"),
    )


__all__ = ["APIClient", "APIError", "Gone", "PatchType", "WatchEvent"]
