"""Running the kubelet's HTTP servers in the caller's nursery: 10250 HTTPS, 10255, 10248.

The healthz port has its own small server (``healthz_server.py``, see there why). The
other two are Hypercorn's trio connection handler (``hypercorn.trio.tcp_server``)
behind our own accept loop. Owning the loop gives three things ``hypercorn.trio.serve``
does not: the TLS handshake happens here first, so the client certificate it
verified is handed to the app (as the ASGI ``tls`` scope extension, through a
per-connection context variable that the request tasks inherit); the number of
connections is bounded; and the bound addresses (port 0 → an ephemeral port) are
reported to the caller; and SPDY/3.1 upgrades of the streaming paths, which Hypercorn cannot
hand to an app, are recognised in a connection's first request and served by ``spdy_proxy``
instead (every other request goes to Hypercorn with the bytes read put back). Header size and
the time a client may take to send its headers are bounded by Hypercorn
(``h11_max_incomplete_size``, ``keep_alive_timeout``) and, for that first look, here with the
same limits; the head size exactly by ``connections.limit_request_head`` in front of the
app; a body by the app (1 MiB, see ``app.py``).
"""

from __future__ import annotations

import contextvars
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ConnectionState, Scope
from hypercorn.utils import parse_socket_addr
from OpenSSL import SSL
from quart import Blueprint
from quart_trio import QuartTrio

from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.server.app import create_app
from trio_kubelet.server.auth import Authorizer, RequestAuthenticator, ReviewClient, build_auth
from trio_kubelet.server.connections import HTTPLimits, limit_connections, limit_request_head
from trio_kubelet.server.health import NodeHealth
from trio_kubelet.server.healthz_server import serve_healthz
from trio_kubelet.server.openssl_stream import OpenSSLStream
from trio_kubelet.server.spdy_proxy import UpgradeRequest, read_first_request, serve_upgrade
from trio_kubelet.server.tls import (
    ServingContext,
    TLSConfigError,
    ensure_serving_certificate,
    server_tls_context,
)
from trio_kubelet.server.view import NodeView

log = logging.getLogger(__name__)

__all__ = [
    "HTTPLimits",
    "ServerAddresses",
    "ServerStartError",
    "run_servers",
    "serve_app",
    "serve_listeners",
]

Address = tuple[str, int]

_TLS_VERSIONS = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}
# The verified TLS facts of the connection a request arrived on (None: plain HTTP).
_PEER_TLS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "trio_kubelet_peer_tls", default=None)


class ServerStartError(Exception):
    """A server could not start (port in use, bad certificate); ``str()`` says which."""


@dataclass(frozen=True)
class ServerAddresses:
    """Where the servers listen (host, port), None for a server that is off."""

    https: Address
    read_only: Address | None = None
    healthz: Address | None = None


def _hypercorn_config(limits: HTTPLimits) -> HypercornConfig:
    config = HypercornConfig()
    config.h11_max_incomplete_size = limits.max_header_bytes
    config.h2_max_header_list_size = limits.max_header_bytes
    config.h2_max_concurrent_streams = limits.max_concurrent_streams
    config.keep_alive_timeout = limits.idle_timeout
    config.ssl_handshake_timeout = limits.tls_handshake_timeout
    # No read timeout: a followed log or an exec session may be quiet for hours.
    config.read_timeout = None
    config.shutdown_timeout = limits.shutdown_timeout
    config.graceful_timeout = limits.shutdown_timeout
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = logging.getLogger("trio_kubelet.server.hypercorn")
    return config


def _peer_tls(stream: OpenSSLStream) -> dict[str, Any]:
    """The ASGI TLS extension of a connection whose handshake has completed; a client
    certificate that did not verify comes with ``client_cert_error``."""
    der = stream.getpeercert(binary_form=True)
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": None,
        "client_cert_error": stream.verify_error(),
        "tls_version": _TLS_VERSIONS.get(stream.version() or ""),
        "cipher_suite": None,
    }


class _PeerTLSScope:
    """Puts the connection's TLS facts into each request's scope."""

    def __init__(self, app: QuartTrio) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable,
                       send: ASGISendCallable) -> None:
        tls = _PEER_TLS.get()
        if tls is not None and scope["type"] in ("http", "websocket"):
            extensions = {**(scope.get("extensions") or {}), "tls": tls}
            scope = cast(Scope, {**scope, "extensions": extensions})
        await self.app(scope, receive, send)


class _PeerStream:
    """A connection's stream that tells when the peer has stopped sending, and first gives
    back the bytes read before Hypercorn took the connection (``unread``).

    Hypercorn's trio connection task otherwise outlives a client that hung up by up
    to ``keep_alive_timeout``, holding its socket; here the end of the peer's data
    ends the keep-alive wait at once (through the connection's own worker context).
    """

    def __init__(self, stream: Any, context: WorkerContext, unread: bytes) -> None:
        self._stream = stream
        self._context = context
        self._unread = unread

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._unread:
            size = len(self._unread) if max_bytes is None else max_bytes
            unread, self._unread = self._unread[:size], self._unread[size:]
            return unread
        data: bytes = await self._stream.receive_some(max_bytes)
        if not data:
            await self._context.terminated.set()
        return data

    # Hypercorn closes a connection that must not be kept ("Connection: close", HTTP/1.0)
    # from the request's task, which Quart-Trio has cancelled by then: unshielded, the close
    # never happened and the connection stayed open until the client gave up.
    async def send_eof(self) -> None:
        with trio.CancelScope(shield=True):
            await self._stream.send_eof()  # an OpenSSLStream has none: AttributeError, as before

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._stream.aclose()


async def _handshake(stream: OpenSSLStream, timeout: float) -> bool:
    try:
        with trio.fail_after(timeout):
            await stream.do_handshake()
    except (trio.BrokenResourceError, trio.TooSlowError) as exc:
        # Scanners, plain HTTP on the TLS port, slow handshakes: nothing to report.
        cause = exc.__cause__ or exc
        log.debug("TLS handshake failed: %s", cause)
        await trio.aclose_forcefully(stream)
        return False
    return True


async def _first_request(stream: trio.abc.Stream, config: HypercornConfig
                         ) -> bytes | UpgradeRequest | None:
    """The connection's first request as ``read_first_request`` sees it; None: close the
    connection (nothing came within the keep-alive timeout, or the client left)."""
    if isinstance(stream, OpenSSLStream) and stream.selected_alpn_protocol() == "h2":
        return b""  # HTTP/2 has no upgrades: the connection is Hypercorn's from its first byte
    with trio.move_on_after(config.keep_alive_timeout):
        try:
            return await read_first_request(stream, config.h11_max_incomplete_size) or None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    return None


async def _serve_connection(app: ASGIWrapper, config: HypercornConfig, state: dict[str, Any],
                            tls: ServingContext | None, tcp: trio.SocketStream) -> None:
    try:
        stream: Any = tcp
        if tls is not None:
            # The context of this moment: a rotated certificate is used from the next connection.
            tls_context = tls.context
            if tls_context is None:
                log.debug("TLS connection refused: no serving certificate available yet")
                await trio.aclose_forcefully(tcp)
                return
            stream = OpenSSLStream(tcp, tls_context)
            if not await _handshake(stream, config.ssl_handshake_timeout):
                return
            # Set in this connection's task: the request tasks Hypercorn spawns from it
            # inherit a copy, so each request sees its own connection's certificate.
            _PEER_TLS.set(_peer_tls(stream))
        first = await _first_request(stream, config)
        if isinstance(first, UpgradeRequest):
            await serve_upgrade(
                app.app, stream, first, scheme="https" if tls is not None else "http",
                client=parse_socket_addr(tcp.socket.family, tcp.socket.getpeername()),
                server=parse_socket_addr(tcp.socket.family, tcp.socket.getsockname()),
                state=state.copy())
            return
        if first is None:
            await trio.aclose_forcefully(stream)
            return
        context = WorkerContext(None)
        server = TCPServer(app, config, context, ConnectionState(state.copy()),
                           cast(Any, _PeerStream(stream, context, first)))
        await server.run()
    except Exception as exc:  # one broken connection must never take the server down
        log.error("HTTP connection failed: %s: %s", type(exc).__name__, exc)
        await trio.aclose_forcefully(tcp)


async def _stop_lifespan(lifespan: Lifespan, timeout: float) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(timeout):
        try:
            await lifespan.wait_for_shutdown()
        except Exception as exc:
            log.debug("app shutdown: %s", exc)


async def _listen(host: str, port: int, name: str) -> list[trio.SocketListener]:
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ServerStartError(f"{name} server: cannot listen on {host}:{port}: "
                               f"{exc.strerror or exc}") from None


async def _close(listeners: Sequence[trio.SocketListener]) -> None:
    with trio.CancelScope(shield=True):
        for listener in listeners:
            await trio.aclose_forcefully(listener)


async def serve_listeners(app: QuartTrio, listeners: Sequence[trio.SocketListener], *,
                          tls_context: SSL.Context | ServingContext | None = None,
                          limits: HTTPLimits = HTTPLimits(), name: str = "HTTP",
                          task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
                          ) -> None:
    """Serve ``app`` on bound ``listeners`` until cancelled, then close them; reports the
    first listener's ``(host, port)`` once serving. A ServingContext's current context is
    taken for each new connection."""
    tls = (tls_context if isinstance(tls_context, ServingContext) or tls_context is None
           else ServingContext(tls_context))
    config = _hypercorn_config(limits)
    asgi = ASGIWrapper(limit_request_head(_PeerTLSScope(app), limits.max_header_bytes))
    host, port = listeners[0].socket.getsockname()[:2]
    state: dict[str, Any] = {}
    lifespan = Lifespan(asgi, config, state)
    handler = limit_connections(partial(_serve_connection, asgi, config, state, tls),
                                limits.max_connections)
    try:
        async with trio.open_nursery() as lifespan_nursery:
            await lifespan_nursery.start(lifespan.handle_lifespan)
            await lifespan.wait_for_startup()
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(trio.serve_listeners, handler, list(listeners))
                    scheme = "https" if tls is not None else "http"
                    log.info("%s server listening on %s://%s:%d", name, scheme, host, port)
                    task_status.started((host, port))
            finally:
                await _stop_lifespan(lifespan, limits.shutdown_timeout)
                lifespan_nursery.cancel_scope.cancel()
    finally:
        await _close(listeners)


async def serve_app(app: QuartTrio, host: str, port: int, *,
                    tls_context: SSL.Context | ServingContext | None = None,
                    limits: HTTPLimits = HTTPLimits(), name: str = "HTTP",
                    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` (0: any free port) until cancelled; reports the bound
    ``(host, port)``. Raises ServerStartError when the port cannot be bound."""
    listeners = await _listen(host, port, name)
    await serve_listeners(app, listeners, tls_context=tls_context, limits=limits, name=name,
                          task_status=task_status)


@dataclass(frozen=True)
class _Server:
    """One server to run: ``serve(listeners, task_status=)`` on ``host:port``."""

    name: str
    host: str
    port: int
    serve: Callable[..., Awaitable[None]]


def _servers(view: NodeView, blueprints_full: Sequence[Blueprint],
             blueprints_read_only: Sequence[Blueprint], tls_context: SSL.Context | ServingContext,
             authenticator: RequestAuthenticator, authorizer: Authorizer | None,
             metrics: AgentMetrics | None, limits: HTTPLimits) -> list[_Server]:
    config = view.options.config
    kubelet = create_app(
        view, blueprints_full, authenticator=authenticator, authorizer=authorizer,
        metrics=metrics, server_type="readwrite", max_body_bytes=limits.max_body_bytes)
    servers = [_Server("kubelet", config.address, config.port, partial(
        serve_listeners, kubelet, tls_context=tls_context, limits=limits, name="kubelet"))]
    if config.read_only_port > 0:
        read_only = create_app(view, blueprints_read_only, metrics=metrics,
                               server_type="readonly", max_body_bytes=limits.max_body_bytes)
        servers.append(_Server("read-only", config.address, config.read_only_port, partial(
            serve_listeners, read_only, limits=limits, name="read-only")))
    if config.healthz_port > 0:
        servers.append(_Server("healthz", config.healthz_bind_address, config.healthz_port,
                               partial(serve_healthz, NodeHealth(view), limits=limits)))
    return servers


async def run_servers(view: NodeView, blueprints_full: Sequence[Blueprint],
                      blueprints_read_only: Sequence[Blueprint], *,
                      metrics: AgentMetrics | None = None,
                      authenticator: RequestAuthenticator | None = None,
                      authorizer: Authorizer | None = None,
                      review: ReviewClient | None = None,
                      serving: ServingContext | None = None,
                      limits: HTTPLimits = HTTPLimits(),
                      task_status: trio.TaskStatus[ServerAddresses] = trio.TASK_STATUS_IGNORED
                      ) -> None:
    """Run the kubelet's servers until cancelled; ``task_status.started`` once all listen.

    - ``address:port`` HTTPS with ``blueprints_full``, authenticated and authorised
      (``authenticator``/``authorizer``, or built from the configuration, asking
      ``review``'s API server for TokenReviews and SubjectAccessReviews);
    - ``address:readOnlyPort`` plain HTTP with ``blueprints_read_only``, no auth, if > 0;
    - ``healthzBindAddress:healthzPort`` plain HTTP, /healthz only, if > 0 (its own small
      server, ``healthz_server.py``).

    Every port is bound before any is served, so a port in use or an unusable
    certificate raises ServerStartError here, with nothing left listening. ``serving`` (the
    serving certificate manager's, with serverTLSBootstrap) replaces the configured or
    self-signed certificate.
    """
    options = view.options
    if authenticator is None:
        if authorizer is not None:
            raise ValueError("an authorizer needs an authenticator")
        authenticator, authorizer = build_auth(options, review)
    client_ca = options.config.authentication.x509.client_ca_file or None
    tls_context: SSL.Context | ServingContext | None = serving
    if tls_context is None:
        try:
            cert = await trio.to_thread.run_sync(ensure_serving_certificate, options)
            tls_context = server_tls_context(cert, client_ca)
        except TLSConfigError as exc:
            raise ServerStartError(f"kubelet server: {exc}") from None
    servers = _servers(view, blueprints_full, blueprints_read_only, tls_context, authenticator,
                       authorizer, metrics, limits)
    bound: list[list[trio.SocketListener]] = []
    try:
        for server in servers:
            bound.append(await _listen(server.host, server.port, server.name))
        addresses: dict[str, Address] = {}
        async with trio.open_nursery() as nursery:
            for server, listeners in zip(servers, bound, strict=True):
                addresses[server.name] = await nursery.start(server.serve, listeners)
            task_status.started(ServerAddresses(addresses["kubelet"], addresses.get("read-only"),
                                                addresses.get("healthz")))
    finally:
        for listeners in bound:
            await _close(listeners)
