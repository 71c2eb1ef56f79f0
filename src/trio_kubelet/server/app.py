"""The Quart-Trio application of one kubelet server: blueprints, auth, limits, errors, metrics.

The servers on 10250 and 10255 are apps made here from route blueprints.
Around them it adds what the Go kubelet's server adds around its handlers:
authentication then authorisation (10250 only), plain-text error bodies in the Go
shapes (``404 page not found``, ``Unauthorized``, ``Forbidden (user=…)``), a
request body limit, and the ``kubelet_http_requests_*`` metrics. A handler that
fails gives its client a 500 and the log one line; it never reaches the server.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, cast

import trio
from prometheus_client import Counter, Gauge, Histogram
from quart import Blueprint, Response, current_app, g, has_request_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from trio_kubelet.metrics import LONG_RUNNING_PATHS, AgentMetrics
from trio_kubelet.server.asgi import ASGIApp, Message, Receive, Scope, Send
from trio_kubelet.server.auth import (
    AuthenticationError,
    AuthorizationError,
    Authorizer,
    RequestAuthenticator,
    authorization_error_message,
    authorize_any,
    credentials_from_request,
    forbidden_message,
    request_attributes,
)
from trio_kubelet.server.view import NodeView

log = logging.getLogger(__name__)

__all__ = ["MAX_BODY_BYTES", "RESPONSE_TIMEOUT", "create_app", "metric_labels", "plain_response"]

MAX_BODY_BYTES = 1 << 20
# Longest a response (e.g. a followed log) may take to send, as the Go server's WriteTimeout.
RESPONSE_TIMEOUT = 4 * 3600.0
# How long a handler may wait for the rest of a request body.
BODY_TIMEOUT = 60.0

# Path buckets of the request metrics (server.go addMetricsBucketMatcher); others are "other".
_PATH_BUCKETS = frozenset({
    "healthz", "pods", "stats", "metrics", "metrics/cadvisor", "metrics/probes",
    "metrics/resource", "spec", "configz", "run", "exec", "attach", "portForward",
    "containerLogs", "runningpods", "logs", "debug", "checkpoint", "statusz", "flagz",
})
_METHOD_BUCKETS = frozenset({"OPTIONS", "GET", "HEAD", "POST", "PUT", "DELETE", "TRACE",
                             "CONNECT"})


def metric_labels(method: str, path: str, server_type: str) -> tuple[str, str, str, str]:
    """``(method, path, server_type, long_running)`` labels of a request, bucketed as in Go:
    ``/metrics/x…`` → ``metrics/x``, ``/pods/…`` → ``pods``, unknown → ``other``."""
    parts = path.lstrip("/").split("/", 2)
    root = f"{parts[0]}/{parts[1]}" if parts[0] == "metrics" and len(parts) > 1 else parts[0]
    bucket = root if root in _PATH_BUCKETS else "other"
    method = method if method in _METHOD_BUCKETS else "other"
    return method, bucket, server_type, str(bucket in LONG_RUNNING_PATHS).lower()


def plain_response(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    """A plain-text answer as Go's ``http.Error`` writes it."""
    response: Response = current_app.response_class(
        text, status=status, content_type="text/plain; charset=utf-8")
    response.headers["X-Content-Type-Options"] = "nosniff"
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


# --- hooks -----------------------------------------------------------------------------------


async def _limit_body() -> Response | None:
    length = request.content_length
    if length is not None and length > current_app.config["MAX_CONTENT_LENGTH"]:
        return plain_response(413, "Request Entity Too Large\n")
    return None


class _AuthHook:
    """Authenticate (→ 401), then authorise (→ 403, or 500 if the authorizer failed)."""

    def __init__(self, authenticator: RequestAuthenticator, authorizer: Authorizer | None,
                 node_name: str) -> None:
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.node_name = node_name

    async def check_request(self) -> Response | None:
        return await self._check(request.method, request.path, request.headers, request.scope)

    async def check_websocket(self) -> Response | None:
        return await self._check("GET", websocket.path, websocket.headers, websocket.scope)

    async def _check(self, method: str, path: str, headers: Any, scope: Any) -> Response | None:
        tls = (scope.get("extensions") or {}).get("tls")
        credentials = credentials_from_request(headers, tls)
        try:
            user = await self.authenticator.authenticate(credentials)
        except AuthenticationError as exc:
            log.info("Unable to authenticate %s %s: %s", method, path, exc)
            return plain_response(401, "Unauthorized")
        if user is None:
            return plain_response(401, "Unauthorized")
        g.user = user
        if self.authorizer is None:
            return None
        attributes = request_attributes(user, method, path, self.node_name)
        try:
            allowed = await authorize_any(self.authorizer, attributes)
        except AuthorizationError as exc:
            attribute = exc.attributes or attributes[0]
            log.error("Authorization error for %s %s (user=%s): %s", method, path,
                      attribute.user.name, exc)
            return plain_response(500, authorization_error_message(attribute))
        if not allowed:
            log.debug("Forbidden %s %s for %s", method, path, user.name)
            return plain_response(403, forbidden_message(attributes))
        return None


async def _http_error(error: HTTPException) -> Response:
    code = error.code or 500
    custom = error.description != type(error).description
    if custom:
        text = f"{error.description}\n"
    elif isinstance(error, NotFound):
        text = "404 page not found\n"
    else:
        text = f"{error.name}\n"
    headers = {}
    if isinstance(error, MethodNotAllowed) and error.valid_methods:
        headers["Allow"] = ", ".join(sorted(error.valid_methods))
    return plain_response(code, text, headers)


def _current_target() -> str:
    connection = request if has_request_context() else websocket
    return f"{connection.method} {connection.path}"


async def _internal_error(error: Exception) -> Response:
    log.error("%s: handler failed: %s: %s", _current_target(), type(error).__name__, error)
    log.debug("handler traceback", exc_info=error)
    return plain_response(500, "Internal Server Error\n")


# --- ASGI wrapper ----------------------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an error, or of each error inside a group."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def _split_failure(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """``(errors to contain, the rest to re-raise)``: cancellation always propagates."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(Exception)
    if isinstance(exc, Exception):
        return exc, None
    return None, exc


class _ServerMiddleware:
    """Counts and times every request, and contains what escapes Quart's own handling
    (e.g. a streamed body that fails after the headers went out)."""

    def __init__(self, app: ASGIApp, metrics: AgentMetrics | None,
                 server_type: str) -> None:
        self.app = app
        self.metrics = metrics
        self.server_type = server_type
        self._series: dict[tuple[str, str, str, str], tuple[Counter, Gauge, Histogram]] = {}

    def series(self, labels: tuple[str, str, str, str],
               metrics: AgentMetrics) -> tuple[Counter, Gauge, Histogram]:
        """The counter, in-flight gauge and duration histogram of ``labels``: looked up once
        per label set (bucketed, so a few dozen at most) instead of four times a request."""
        try:
            return self._series[labels]
        except KeyError:
            found = self._series[labels] = (metrics.http_requests.labels(*labels),
                                            metrics.http_inflight_requests.labels(*labels),
                                            metrics.http_requests_duration.labels(*labels))
            return found

    async def __call__(self, scope: Scope, receive: Receive,
                       send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] in ("http.response.start", "websocket.accept",
                                   "websocket.http.response.start", "websocket.close"):
                started = True
            await send(message)

        method = cast(str, scope.get("method", "GET"))
        labels = metric_labels(method, scope["path"], self.server_type)
        series = None if self.metrics is None else self.series(labels, self.metrics)
        if series is not None:
            series[0].inc()
            series[1].inc()
        begin = trio.current_time()
        try:
            await self.app(scope, receive, tracking_send)
        except BaseException as exc:
            failure, rest = _split_failure(exc)
            if failure is not None:
                log.error("%s %s: failed while responding: %s", method, scope["path"],
                          _describe(failure))
                log.debug("traceback", exc_info=failure)
                if not started and scope["type"] == "http":
                    await _send_plain_500(send)
            if rest is exc:
                raise
            if rest is not None:
                raise rest from None
        finally:
            if series is not None:
                series[1].dec()
                series[2].observe(trio.current_time() - begin)


async def _send_plain_500(send: Send) -> None:
    body = b"Internal Server Error\n"
    try:
        await send({"type": "http.response.start", "status": 500,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    except Exception as exc:  # the connection is gone; nothing more to tell anyone
        log.debug("could not send the 500: %s", exc)


# --- the app ---------------------------------------------------------------------------------


def create_app(view: NodeView, blueprints: Iterable[Blueprint], *,
               authenticator: RequestAuthenticator | None = None,
               authorizer: Authorizer | None = None,
               metrics: AgentMetrics | None = None,
               server_type: str = "readwrite",
               max_body_bytes: int = MAX_BODY_BYTES) -> QuartTrio:
    """An app serving ``blueprints``; with an ``authenticator`` every request (and
    websocket) is authenticated first, and then authorised when an ``authorizer`` is
    given. ``metrics`` receives ``kubelet_http_requests_*`` labelled ``server_type``
    (the Go values: ``readwrite`` on 10250, ``readonly`` on 10255)."""
    if authorizer is not None and authenticator is None:
        raise ValueError("an authorizer needs an authenticator to tell it who is asking")
    app = QuartTrio("trio_kubelet.server")
    app.config.update(
        MAX_CONTENT_LENGTH=max_body_bytes,
        BODY_TIMEOUT=BODY_TIMEOUT,
        RESPONSE_TIMEOUT=RESPONSE_TIMEOUT,
        # Go answers OPTIONS on its GET-only endpoints with 405, not an automatic 200.
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    app.before_request(_limit_body)
    if authenticator is not None:
        hook = _AuthHook(authenticator, authorizer, view.options.node_name)
        app.before_request(hook.check_request)
        app.before_websocket(hook.check_websocket)
    for blueprint in blueprints:
        app.register_blueprint(blueprint)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _internal_error)
    app.asgi_app = _ServerMiddleware(  # type: ignore[method-assign,assignment]
        app.asgi_app, metrics, server_type)
    return app
