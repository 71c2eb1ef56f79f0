"""Running the kubelet's HTTP servers in the caller's nursery: 10250 HTTPS, 10255, 10248.

All three are our own, on trio and h11. 10250 and 10255 serve Quart-Trio apps through
``asgi_server`` (HTTP/1.1, websockets, SPDY upgrades); the healthz port has its own smaller
server (``healthz_server.py``, see there why). Here: the accept loop with its connection cap,
the TLS handshake on 10250 (``tls.server_stream``: the standard ``ssl``, or pyOpenSSL when
client certificates are asked for), whose facts (the client certificate, and why it did not
verify) go into each request's scope as the ASGI ``tls`` extension, the serving certificate
of the moment for each new connection (``ServingContext``), the app's lifespan, and the bound
addresses (port 0 → an ephemeral port) reported to the caller. Why not Hypercorn:
docs/http-api.md, "Why our own server".
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from quart import Blueprint

from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.server.app import create_app
from trio_kubelet.server.asgi import ASGIApp, Scope
from trio_kubelet.server.asgi_server import LifespanError, run_lifespan, serve_connection
from trio_kubelet.server.auth import Authorizer, RequestAuthenticator, ReviewClient, build_auth
from trio_kubelet.server.connections import HTTPLimits, limit_connections, limit_request_head
from trio_kubelet.server.health import NodeHealth
from trio_kubelet.server.healthz_server import serve_healthz
from trio_kubelet.server.listeners import (
    HEALTHZ,
    KUBELET,
    READ_ONLY,
    Listeners,
    ServerStartError,
    close_listeners,
    listen,
    server_ports,
)
from trio_kubelet.server.tls import (
    ServerContext,
    ServerStream,
    ServingContext,
    TLSConfigError,
    TLSSettings,
    ensure_serving_certificate,
    server_stream,
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


@dataclass(frozen=True)
class ServerAddresses:
    """Where the servers listen (host, port), None for a server that is off."""

    https: Address
    read_only: Address | None = None
    healthz: Address | None = None


def _peer_tls(stream: ServerStream) -> dict[str, Any]:
    """The ASGI TLS extension of a connection whose handshake has completed; a client
    certificate that did not verify comes with ``client_cert_error``. Over ``ssl`` no
    client certificate was asked for."""
    asked = not isinstance(stream, trio.SSLStream)
    der = stream.getpeercert(binary_form=True) if asked else None
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": None,
        "client_cert_error": stream.verify_error() if asked else None,
        "tls_version": _TLS_VERSIONS.get(stream.version() or ""),
        "cipher_suite": None,
    }


async def _handshake(stream: ServerStream, timeout: float) -> bool:
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


def _address(socket: trio.socket.SocketType, peer: bool) -> Address | None:
    """``(host, port)`` of a connection's end, as ASGI's ``client``/``server``; None when it
    is not an IP socket or has already been disconnected."""
    try:
        name = socket.getpeername() if peer else socket.getsockname()
    except OSError:
        return None
    return (str(name[0]), int(name[1])) if isinstance(name, tuple) else None


async def _serve_connection(app: ASGIApp, limits: HTTPLimits, state: dict[str, Any],
                            tls: ServingContext | None, tcp: trio.SocketStream) -> None:
    try:
        stream: trio.abc.Stream = tcp
        scope: Scope = {"scheme": "http", "client": _address(tcp.socket, True),
                        "server": _address(tcp.socket, False), "state": state}
        if tls is not None:
            # The context of this moment: a rotated certificate is used from the next connection.
            tls_context = tls.context
            if tls_context is None:
                log.debug("TLS connection refused: no serving certificate available yet")
                await trio.aclose_forcefully(tcp)
                return
            tls_stream = server_stream(tcp, tls_context)
            if not await _handshake(tls_stream, limits.tls_handshake_timeout):
                return
            scope.update(scheme="https", extensions={"tls": _peer_tls(tls_stream)})
            stream = tls_stream
        await serve_connection(app, stream, limits=limits, scope=scope)
    except Exception as exc:  # one broken connection must never take the server down
        log.error("HTTP connection failed: %s: %s", type(exc).__name__, exc)
        await trio.aclose_forcefully(tcp)


async def serve_listeners(app: ASGIApp, listeners: Sequence[trio.SocketListener], *,
                          tls_context: ServerContext | ServingContext | None = None,
                          limits: HTTPLimits = HTTPLimits(), name: str = "HTTP",
                          task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
                          ) -> None:
    """Serve ``app`` on bound ``listeners`` until cancelled, then close them; reports the
    first listener's ``(host, port)`` once serving. A ServingContext's current context is
    taken for each new connection."""
    tls = (tls_context if isinstance(tls_context, ServingContext) or tls_context is None
           else ServingContext(tls_context))
    asgi = limit_request_head(app, limits.max_header_bytes)
    host, port = listeners[0].socket.getsockname()[:2]
    state: dict[str, Any] = {}
    handler = limit_connections(partial(_serve_connection, asgi, limits, state, tls),
                                limits.max_connections)
    failure: LifespanError | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(run_lifespan, asgi, state, limits.shutdown_timeout)
            except LifespanError as exc:
                failure = exc
            else:
                await nursery.start(trio.serve_listeners, handler, list(listeners))
                scheme = "https" if tls is not None else "http"
                log.info("%s server listening on %s://%s:%d", name, scheme, host, port)
                task_status.started((host, port))
    finally:
        await close_listeners([list(listeners)])
    if failure is not None:
        raise ServerStartError(f"{name} server: the app did not start: {failure}")


async def serve_app(app: ASGIApp, host: str, port: int, *,
                    tls_context: ServerContext | ServingContext | None = None,
                    limits: HTTPLimits = HTTPLimits(), name: str = "HTTP",
                    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` (0: any free port) until cancelled; reports the bound
    ``(host, port)``. Raises ServerStartError when the port cannot be bound."""
    listeners = await listen(host, port, name)
    await serve_listeners(app, listeners, tls_context=tls_context, limits=limits, name=name,
                          task_status=task_status)


def _servers(view: NodeView, blueprints_full: Sequence[Blueprint],
             blueprints_read_only: Sequence[Blueprint], tls_context: ServerContext | ServingContext,
             authenticator: RequestAuthenticator, authorizer: Authorizer | None,
             metrics: AgentMetrics | None, limits: HTTPLimits
             ) -> dict[str, Callable[..., Awaitable[None]]]:
    """``serve(listeners, task_status=)`` of each server the configuration turns on."""
    config = view.options.config
    kubelet = create_app(
        view, blueprints_full, authenticator=authenticator, authorizer=authorizer,
        metrics=metrics, server_type="readwrite", max_body_bytes=limits.max_body_bytes)
    servers: dict[str, Callable[..., Awaitable[None]]] = {KUBELET: partial(
        serve_listeners, kubelet, tls_context=tls_context, limits=limits, name=KUBELET)}
    if config.read_only_port > 0:
        read_only = create_app(view, blueprints_read_only, metrics=metrics,
                               server_type="readonly", max_body_bytes=limits.max_body_bytes)
        servers[READ_ONLY] = partial(serve_listeners, read_only, limits=limits, name=READ_ONLY)
    if config.healthz_port > 0:
        servers[HEALTHZ] = partial(serve_healthz, NodeHealth(view), limits=limits)
    return servers


async def run_servers(view: NodeView, blueprints_full: Sequence[Blueprint],
                      blueprints_read_only: Sequence[Blueprint], *,
                      metrics: AgentMetrics | None = None,
                      authenticator: RequestAuthenticator | None = None,
                      authorizer: Authorizer | None = None,
                      review: ReviewClient | None = None,
                      serving: ServingContext | None = None,
                      limits: HTTPLimits = HTTPLimits(),
                      listeners: Mapping[str, Listeners] | None = None,
                      task_status: trio.TaskStatus[ServerAddresses] = trio.TASK_STATUS_IGNORED
                      ) -> None:
    """Run the kubelet's servers until cancelled; ``task_status.started`` once all listen.

    - ``address:port`` HTTPS with ``blueprints_full``, authenticated and authorised
      (``authenticator``/``authorizer``, or built from the configuration, asking
      ``review``'s API server for TokenReviews and SubjectAccessReviews);
    - ``address:readOnlyPort`` plain HTTP with ``blueprints_read_only``, no auth, if > 0;
    - ``healthzBindAddress:healthzPort`` plain HTTP, /healthz only, if > 0 (its own small
      server, ``healthz_server.py``).

    ``listeners`` are the sockets the agent bound at its start (``listeners.bind_servers``),
    theirs to close from here on; a port without them is bound here, every one before any is
    served. A port in use or an unusable certificate raises ServerStartError, with nothing
    left listening. ``serving`` (the serving certificate manager's, with serverTLSBootstrap)
    replaces the configured or self-signed certificate.
    """
    bound = dict(listeners or {})
    try:
        options = view.options
        if authenticator is None:
            if authorizer is not None:
                raise ValueError("an authorizer needs an authenticator")
            authenticator, authorizer = build_auth(options, review)
        client_ca = options.config.authentication.x509.client_ca_file or None
        tls_context: ServerContext | ServingContext | None = serving
        if tls_context is None:
            try:
                cert = await trio.to_thread.run_sync(ensure_serving_certificate, options)
                tls_context = server_tls_context(cert, client_ca,
                                                 TLSSettings.of(options.config))
            except TLSConfigError as exc:
                raise ServerStartError(f"kubelet server: {exc}") from None
        servers = _servers(view, blueprints_full, blueprints_read_only, tls_context,
                           authenticator, authorizer, metrics, limits)
        for name, host, port in server_ports(options.config):
            if name not in bound:
                bound[name] = await listen(host, port, name)
        addresses: dict[str, Address] = {}
        async with trio.open_nursery() as nursery:
            for name, serve in servers.items():
                addresses[name] = await nursery.start(serve, bound[name])
            task_status.started(ServerAddresses(addresses[KUBELET], addresses.get(READ_ONLY),
                                                addresses.get(HEALTHZ)))
    finally:
        await close_listeners(bound)
