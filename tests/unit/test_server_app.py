"""server.app: Go-shaped errors, body limit, contained handler failures, the auth hook."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import trio
import trio_websocket
from quart import Blueprint, abort, g, request, websocket

from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.server.app import create_app, metric_labels
from trio_kubelet.server.auth import (
    Attributes,
    AuthenticationError,
    AuthorizationError,
    Credentials,
    RequestAuthenticator,
    UserInfo,
)
from trio_kubelet.server.serve import serve_app
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore


def make_view() -> NodeView:
    options = AgentOptions(config=KubeletConfiguration(), node_name="node-a",
                           root_dir=Path("/nonexistent"))
    return NodeView(options=options, store=PodStatusStore(), client=cast(CRIClient, object()),
                    last_relist=lambda: None, last_sync_loop=lambda: None)


def routes() -> Blueprint:
    blueprint = Blueprint("test_routes", __name__)

    @blueprint.route("/pods")
    async def pods() -> str:
        return "pods"

    @blueprint.route("/configz")
    async def configz() -> str:
        return "configz"

    @blueprint.route("/exec/<path:rest>", methods=["GET", "POST"])
    async def exec_(rest: str) -> str:
        return rest

    @blueprint.route("/whoami")
    async def whoami() -> str:
        return str(g.user.name)

    @blueprint.route("/boom")
    async def boom() -> str:
        raise ValueError("secret detail")

    @blueprint.route("/stream")
    async def stream() -> Any:
        async def body() -> AsyncIterator[bytes]:
            yield b"first"
            raise RuntimeError("the log file vanished")

        return body()

    @blueprint.route("/upload", methods=["POST"])
    async def upload() -> str:
        return str(len(await request.get_data()))

    @blueprint.route("/gone")
    async def gone() -> str:
        abort(404, 'pod "web" does not exist')

    @blueprint.websocket("/ws")
    async def ws() -> None:
        await websocket.accept()
        await websocket.send("hello")

    return blueprint


@asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(make_view(), [routes()], **kwargs)
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_app, app, "127.0.0.1", 0))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield client
        nursery.cancel_scope.cancel()


def test_metric_labels_bucket_like_the_go_kubelet() -> None:
    assert metric_labels("GET", "/pods", "readwrite") == ("GET", "pods", "readwrite", "false")
    assert metric_labels("GET", "/metrics/cadvisor", "readonly")[1] == "metrics/cadvisor"
    assert metric_labels("GET", "/metrics", "readonly")[1] == "metrics"
    assert metric_labels("GET", "/stats/summary", "readwrite")[1] == "stats"
    assert metric_labels("POST", "/exec/ns/pod/c", "readwrite") == (
        "POST", "exec", "readwrite", "true")
    assert metric_labels("PATCH", "/../../etc/passwd", "readwrite")[:2] == ("other", "other")


async def test_unknown_path_and_wrong_method_in_the_go_shape() -> None:
    async with serving() as client:
        missing = await client.get("/nope")
        assert (missing.status_code, missing.text) == (404, "404 page not found\n")
        assert missing.headers["content-type"] == "text/plain; charset=utf-8"
        wrong = await client.delete("/pods")
        assert (wrong.status_code, wrong.text) == (405, "Method Not Allowed\n")
        assert wrong.headers["allow"] == "GET, HEAD"
        assert (await client.options("/pods")).status_code == 405
        custom = await client.get("/gone")
        assert (custom.status_code, custom.text) == (404, 'pod "web" does not exist\n')


async def test_bodies_over_the_limit_are_refused() -> None:
    async with serving(max_body_bytes=1024) as client:
        assert (await client.post("/upload", content=b"x" * 1024)).text == "1024"
        declared = await client.post("/upload", content=b"x" * 1025)
        assert (declared.status_code, declared.text) == (413, "Request Entity Too Large\n")
        assert (await client.post("/pods", content=b"x" * 4096)).status_code == 413

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(8):
                yield b"x" * 512

        chunked = await client.post("/upload", content=chunks())
        assert chunked.status_code == 413
        assert (await client.get("/pods")).text == "pods"


async def test_a_failing_handler_is_a_500_and_one_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trio_kubelet.server")
    async with serving() as client:
        response = await client.get("/boom")
        assert (response.status_code, response.text) == (500, "Internal Server Error\n")
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [r.getMessage() for r in errors] == [
            "GET /boom: handler failed: ValueError: secret detail"]
        assert errors[0].exc_info is None
        assert (await client.get("/pods")).status_code == 200


async def test_a_response_failing_midway_is_contained(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trio_kubelet.server")
    async with serving() as client:
        try:
            response = await client.get("/stream")
            assert response.content == b"first"
        except httpx.RemoteProtocolError:
            pass  # the connection was closed mid-body, which is what a client should see
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == ["GET /stream: failed while responding: RuntimeError: "
                          "the log file vanished"]
        assert (await client.get("/pods")).text == "pods"


# --- the auth hook ---------------------------------------------------------------------------


class Tokens:
    async def authenticate(self, credentials: Credentials) -> UserInfo | None:
        if credentials.bearer_token == "broken":
            raise AuthenticationError("token webhook unreachable")
        if credentials.bearer_token == "alice-token":
            return UserInfo("alice")
        return None


class PodsOnly:
    async def authorize(self, attributes: Attributes) -> bool:
        if attributes.path.startswith("/exec"):
            raise AuthorizationError("SubjectAccessReview webhook: HTTP 503")
        return attributes.user.name == "alice" and attributes.subresource in ("pods", "proxy") \
            and attributes.path != "/configz"


def alice() -> dict[str, str]:
    return {"Authorization": "Bearer alice-token"}


async def test_auth_401_403_500_and_allowed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trio_kubelet.server")
    authenticator = RequestAuthenticator([Tokens()], anonymous=False)
    async with serving(authenticator=authenticator, authorizer=PodsOnly()) as client:
        anonymous = await client.get("/pods")
        assert (anonymous.status_code, anonymous.text) == (401, "Unauthorized")
        unknown_path = await client.get("/nope")
        assert unknown_path.status_code == 401, "nothing is revealed before authentication"
        broken = await client.get("/pods", headers={"Authorization": "Bearer broken"})
        assert broken.status_code == 401
        assert any("token webhook unreachable" in r.getMessage() for r in caplog.records)

        assert (await client.get("/pods", headers=alice())).text == "pods"
        assert (await client.get("/whoami", headers=alice())).text == "alice"
        denied = await client.get("/configz", headers=alice())
        assert (denied.status_code, denied.text) == (403, (
            "Forbidden (user=alice, verb=get, resource=nodes, "
            "subresource(s)=[configz proxy])\n"))
        failed = await client.post("/exec/default/web/main", headers=alice())
        assert (failed.status_code, failed.text) == (500, (
            "Authorization error (user=alice, verb=create, resource=nodes, subresource=proxy)"))


async def test_anonymous_requests_are_authorised_as_system_anonymous() -> None:
    authenticator = RequestAuthenticator([Tokens()], anonymous=True)
    async with serving(authenticator=authenticator, authorizer=PodsOnly()) as client:
        response = await client.get("/pods")
        assert (response.status_code, response.text) == (403, (
            "Forbidden (user=system:anonymous, verb=get, resource=nodes, "
            "subresource(s)=[pods proxy])\n"))


async def test_websockets_are_authenticated_too() -> None:
    authenticator = RequestAuthenticator([Tokens()], anonymous=False)
    app = create_app(make_view(), [routes()], authenticator=authenticator, authorizer=PodsOnly())
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_app, app, "127.0.0.1", 0))
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}/ws"):
                pass
        assert rejected.value.status_code == 401
        async with trio_websocket.open_websocket_url(
                f"ws://127.0.0.1:{port}/ws", extra_headers=[(b"authorization",
                                                             b"Bearer alice-token")]) as ws:
            assert await ws.get_message() == "hello"
        nursery.cancel_scope.cancel()


def test_an_authorizer_needs_an_authenticator() -> None:
    with pytest.raises(ValueError, match="authenticator"):
        create_app(make_view(), [], authorizer=PodsOnly())


async def test_request_metrics_are_labelled_with_the_server_type() -> None:
    metrics = AgentMetrics()
    async with serving(metrics=metrics, server_type="readonly") as client:
        await client.get("/pods")
        await client.get("/boom")
    text = metrics.render().decode()
    assert ('kubelet_http_requests_total{method="GET",path="pods",server_type="readonly",'
            'long_running="false"} 1.0') in text
    assert ('kubelet_http_requests_duration_seconds_count{method="GET",path="other",'
            'server_type="readonly",long_running="false"} 1.0') in text
