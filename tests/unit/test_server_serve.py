"""server.serve: the three servers over real sockets — TLS, x509 and webhook auth, the
read-only and healthz ports, and what a slow, greedy or huge client can (not) do."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import trio
import trustme
from quart import Blueprint, g, request
from quart_trio import QuartTrio

from tests.net import free_port, taken_port
from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.server.auth import ReviewClient
from trio_kubelet.server.listeners import bind_servers
from trio_kubelet.server.routes_node import node_blueprints
from trio_kubelet.server.serve import (
    HTTPLimits,
    ServerAddresses,
    ServerStartError,
    run_servers,
    serve_app,
)
from trio_kubelet.server.tls import ServingCertificate, ServingContext, server_tls_context
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore

MACHINE = {"num_cores": 1}


def make_view(root: Path, **wire: Any) -> NodeView:
    wire = {"address": "127.0.0.1", "healthzPort": 0, **wire}
    config = KubeletConfiguration.model_validate(wire).model_copy(update={"port": 0})
    options = AgentOptions(config=config, node_name="node-a", root_dir=root, node_ip="127.0.0.1")
    return NodeView(options=options, store=PodStatusStore(), client=cast(CRIClient, object()),
                    last_relist=lambda: None, last_sync_loop=lambda: None)


def whoami() -> Blueprint:
    blueprint = Blueprint("whoami", __name__)

    @blueprint.route("/whoami")
    async def me() -> dict[str, Any]:
        return {"name": g.user.name, "groups": list(g.user.groups)}

    return blueprint


@asynccontextmanager
async def servers(view: NodeView, *, extra: Sequence[Blueprint] = (),
                  review: ReviewClient | None = None,
                  limits: HTTPLimits | None = None,
                  serving: ServingContext | None = None) -> AsyncIterator[ServerAddresses]:
    blueprints = node_blueprints(view, AgentMetrics(), machine_info=MACHINE)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(partial(
            run_servers, view, [*blueprints.full, *extra], blueprints.read_only, review=review,
            limits=limits or HTTPLimits(), serving=serving))
        yield addresses
        nursery.cancel_scope.cancel()


def https(addresses: ServerAddresses) -> str:
    return f"https://127.0.0.1:{addresses.https[1]}"


def trust(cert_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert_file))


OPEN = {"authorization": {"mode": "AlwaysAllow"},
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}}}


# --- TLS ---------------------------------------------------------------------------------------


async def test_self_signed_certificate_is_generated_then_reused(tmp_path: Path) -> None:
    view = make_view(tmp_path, **OPEN)
    crt = tmp_path / "pki/kubelet.crt"
    # The node IP is in the certificate, so it verifies against its own CA.
    async with servers(view) as addresses, httpx.AsyncClient(verify=trust(crt)) as client:
        assert (await client.get(https(addresses) + "/healthz")).text == "ok"
    generated = crt.read_bytes()
    async with servers(view) as addresses, httpx.AsyncClient(verify=trust(crt)) as client:
        assert (await client.get(https(addresses) + "/pods")).status_code == 200
    assert crt.read_bytes() == generated


async def test_a_serving_context_is_refused_until_set_and_replaced_for_new_connections(
    tmp_path: Path,
) -> None:
    """serverTLSBootstrap: no certificate, no handshake; each new certificate applies to the
    connections that follow, while an open one keeps going."""
    view = make_view(tmp_path, **OPEN)
    serving = ServingContext()
    contexts = []
    for number in (1, 2):
        ca = trustme.CA(organization_name=f"cluster {number}")
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
            str(tmp_path / f"serving-{number}.pem"))
        ca.cert_pem.write_to_path(str(tmp_path / f"ca-{number}.crt"))
        pem = tmp_path / f"serving-{number}.pem"
        contexts.append(server_tls_context(ServingCertificate(pem, pem)))
    async with servers(view, serving=serving) as addresses:
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(verify=trust(tmp_path / "ca-1.crt")) as client:
                await client.get(https(addresses) + "/healthz")
        serving.replace(contexts[0])
        async with httpx.AsyncClient(verify=trust(tmp_path / "ca-1.crt")) as first:
            assert (await first.get(https(addresses) + "/healthz")).text == "ok"
            serving.replace(contexts[1])
            # The open keep-alive connection still speaks with the first certificate...
            assert (await first.get(https(addresses) + "/healthz")).text == "ok"
            # ...and new ones get the second.
            async with httpx.AsyncClient(verify=trust(tmp_path / "ca-2.crt")) as second:
                assert (await second.get(https(addresses) + "/healthz")).text == "ok"
            with pytest.raises(httpx.ConnectError):
                async with httpx.AsyncClient(verify=trust(tmp_path / "ca-1.crt")) as late:
                    await late.get(https(addresses) + "/healthz")


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    """A server certificate for 127.0.0.1 and a client CA, as files."""
    server_ca, client_ca = trustme.CA(), trustme.CA(organization_name="clients")
    server = server_ca.issue_cert("127.0.0.1")
    server.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.crt"))
    server_ca.cert_pem.write_to_path(str(tmp_path / "server-ca.crt"))
    return {"server_ca": tmp_path / "server-ca.crt", "client_ca": client_ca,
            "tls": {"tlsCertFile": str(tmp_path / "server.pem"),
                    "tlsPrivateKeyFile": str(tmp_path / "server.pem")},
            "client_ca_file": str(tmp_path / "client-ca.crt")}


def client_context(pki: dict[str, Any], ca: trustme.CA | None = None, common_name: str = "",
                   organization: str | None = None) -> ssl.SSLContext:
    context = trust(pki["server_ca"])
    if ca is not None:
        ca.issue_cert(common_name=common_name,
                      organization_name=organization).configure_cert(context)
    return context


async def test_x509_client_certificates(tmp_path: Path, pki: dict[str, Any]) -> None:
    view = make_view(tmp_path, **pki["tls"], authorization={"mode": "AlwaysAllow"},
                     authentication={"x509": {"clientCAFile": pki["client_ca_file"]},
                                     "webhook": {"enabled": False}})
    async with servers(view, extra=[whoami()]) as addresses:
        url = https(addresses) + "/whoami"
        good = client_context(pki, pki["client_ca"], "system:node:node-b", "system:nodes")
        async with httpx.AsyncClient(verify=good) as client:
            response = await client.get(url)
            assert response.json() == {"name": "system:node:node-b",
                                       "groups": ["system:nodes", "system:authenticated"]}
        async with httpx.AsyncClient(verify=client_context(pki)) as client:
            response = await client.get(url)
            assert (response.status_code, response.text) == (401, "Unauthorized")
        # A certificate from another CA completes the handshake and gets Go's 401.
        wrong = client_context(pki, trustme.CA(), "mallory", "system:masters")
        async with httpx.AsyncClient(verify=wrong) as client:
            response = await client.get(url)
            assert (response.status_code, response.text) == (401, "Unauthorized")
        async with httpx.AsyncClient(verify=good) as client:
            assert (await client.get(url)).status_code == 200, "the server is unharmed"


# --- webhooks ----------------------------------------------------------------------------------


def stand_in_api_server(calls: Counter[str]) -> QuartTrio:
    """Speaks TokenReview and SubjectAccessReview: alice may read pods, nothing else."""
    app = QuartTrio("stand_in_api_server")

    @app.post("/apis/authentication.k8s.io/v1/tokenreviews")
    async def token_reviews() -> tuple[dict[str, Any], int]:
        review = await request.get_json()
        calls["TokenReview"] += 1
        if review["spec"]["token"] == "alice-token":
            status = {"authenticated": True,
                      "user": {"username": "alice", "groups": ["dev"], "uid": "1"}}
        else:
            status = {"authenticated": False}
        return {**review, "status": status}, 201

    @app.post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
    async def access_reviews() -> tuple[dict[str, Any], int]:
        review = await request.get_json()
        spec = review["spec"]
        calls[f"SubjectAccessReview {spec['resourceAttributes']['subresource']}"] += 1
        allowed = (spec["user"] == "alice" and "system:authenticated" in spec["groups"]
                   and spec["resourceAttributes"]["subresource"] == "pods")
        return {**review, "status": {"allowed": allowed}}, 201

    return app


async def test_bearer_tokens_through_the_review_webhooks(tmp_path: Path,
                                                         pki: dict[str, Any]) -> None:
    calls: Counter[str] = Counter()
    view = make_view(tmp_path, **pki["tls"])  # webhook authn and authz are the defaults
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_app, stand_in_api_server(calls),
                                              "127.0.0.1", 0))
        review = ReviewClient.connect(f"http://127.0.0.1:{port}")
        async with servers(view, review=review) as addresses, \
                httpx.AsyncClient(verify=trust(pki["server_ca"]),
                                  base_url=https(addresses)) as client:
            alice = {"Authorization": "Bearer alice-token"}
            for _ in range(3):
                assert (await client.get("/pods", headers=alice)).status_code == 200
            assert calls == {"TokenReview": 1, "SubjectAccessReview pods": 1}, "cached"

            denied = await client.get("/configz", headers=alice)
            assert (denied.status_code, denied.text) == (403, (
                "Forbidden (user=alice, verb=get, resource=nodes, "
                "subresource(s)=[configz proxy])\n"))
            await client.get("/configz", headers=alice)
            assert calls["SubjectAccessReview configz"] == 1
            assert calls["SubjectAccessReview proxy"] == 1

            stranger = await client.get("/pods", headers={"Authorization": "Bearer nope"})
            assert (stranger.status_code, stranger.text) == (401, "Unauthorized")
            assert (await client.get("/pods")).status_code == 401
        nursery.cancel_scope.cancel()
        await review.aclose()


async def test_webhook_down_fails_the_request_not_the_server(tmp_path: Path,
                                                             pki: dict[str, Any]) -> None:
    view = make_view(tmp_path, **pki["tls"])
    review = ReviewClient.connect(f"http://127.0.0.1:{free_port()}", timeout=2.0)
    async with servers(view, review=review) as addresses, \
            httpx.AsyncClient(verify=trust(pki["server_ca"]), base_url=https(addresses)) as client:
        response = await client.get("/pods", headers={"Authorization": "Bearer alice-token"})
        assert response.status_code == 401
    await review.aclose()


# --- the other ports ---------------------------------------------------------------------------


async def test_read_only_port_is_off_by_default(tmp_path: Path) -> None:
    view = make_view(tmp_path, **OPEN)
    assert view.options.config.read_only_port == 0
    async with servers(view) as addresses:
        assert addresses.read_only is None and addresses.healthz is None


async def test_read_only_port_serves_the_read_only_endpoints_without_auth(
        tmp_path: Path, pki: dict[str, Any]) -> None:
    port = free_port()
    view = make_view(tmp_path, **pki["tls"], readOnlyPort=port)  # 10250: webhook, nobody gets in
    async with servers(view) as addresses:
        assert addresses.read_only == ("127.0.0.1", port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/pods")).status_code == 200
            assert (await client.get("/healthz")).text == "ok"
            assert (await client.get("/metrics")).status_code == 200
            assert (await client.get("/configz")).status_code == 404
        async with httpx.AsyncClient(verify=trust(pki["server_ca"])) as client:
            assert (await client.get(https(addresses) + "/pods")).status_code == 401


async def test_healthz_port_serves_only_healthz(tmp_path: Path) -> None:
    port = free_port()
    view = make_view(tmp_path, **OPEN, healthzPort=port, healthzBindAddress="127.0.0.1")
    async with servers(view) as addresses:
        assert addresses.healthz == ("127.0.0.1", port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).text == "ok"
            assert (await client.get("/healthz/ping")).text == "ok"
            assert (await client.get("/pods")).status_code == 404


async def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with taken_port() as port:
        view = make_view(tmp_path, **OPEN, healthzPort=port)
        with pytest.raises(ServerStartError, match=f"healthz server: cannot listen on "
                                                   f"127.0.0.1:{port}"):
            await run_servers(view, [], [])  # fails before it would serve anything
    async with servers(view) as addresses:  # once the port is free, the same config starts
        assert addresses.healthz == ("127.0.0.1", port)


async def test_a_client_of_the_bound_port_waits_for_the_servers(tmp_path: Path) -> None:
    """The agent binds at its start and builds the servers later: a client that comes in
    between is answered once they serve, not refused."""
    view = make_view(tmp_path, **OPEN, healthzPort=free_port(), healthzBindAddress="127.0.0.1")
    listeners = await bind_servers(view.options.config)
    healthz_port = listeners["healthz"][0].socket.getsockname()[1]
    early = await trio.open_tcp_stream("127.0.0.1", healthz_port)  # nothing serves yet
    await early.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    blueprints = node_blueprints(view, AgentMetrics(), machine_info=MACHINE)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(partial(
            run_servers, view, blueprints.full, blueprints.read_only, listeners=listeners))
        assert addresses.healthz == ("127.0.0.1", healthz_port)
        with trio.fail_after(10):
            answer = await read_all(early)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok"), answer
        nursery.cancel_scope.cancel()
    with pytest.raises(OSError):  # the servers closed the sockets they were handed
        await trio.open_tcp_stream("127.0.0.1", healthz_port)


async def test_binding_is_all_or_nothing(tmp_path: Path) -> None:
    with taken_port() as port:
        free = free_port()
        config = make_view(tmp_path, **OPEN, readOnlyPort=free, healthzPort=port).options.config
        with pytest.raises(ServerStartError, match=f"healthz server: cannot listen on "
                                                   f"127.0.0.1:{port}: Address already in use"):
            await bind_servers(config)
    with socket.socket() as again:  # the read-only port bound before the failure was let go
        again.bind(("127.0.0.1", free))


async def test_cancellation_closes_the_ports(tmp_path: Path) -> None:
    view = make_view(tmp_path, **OPEN)
    async with servers(view) as addresses:
        port = addresses.https[1]
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)


# --- hostile clients ---------------------------------------------------------------------------


# Both kinds of server: the healthz port's own and the apps' (asgi_server, the read-only port).
PLAIN_PORTS = pytest.mark.parametrize("port_field", ["healthzPort", "readOnlyPort"])


def plain_view(tmp_path: Path, port_field: str) -> tuple[NodeView, int]:
    port = free_port()
    return make_view(tmp_path, **OPEN, **{port_field: port}), port


async def read_all(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


@PLAIN_PORTS
async def test_a_slow_client_neither_blocks_others_nor_stays_forever(
        tmp_path: Path, port_field: str) -> None:
    view, port = plain_view(tmp_path, port_field)
    async with servers(view, limits=HTTPLimits(idle_timeout=1.0)):
        slow = await trio.open_tcp_stream("127.0.0.1", port)
        request_head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100

        async def dribble() -> None:
            try:
                for byte in request_head:
                    await slow.send_all(bytes([byte]))
                    await trio.sleep(0.005)
            except trio.BrokenResourceError:
                pass  # a very slow machine: the server already gave up on us

        async with trio.open_nursery() as nursery:
            nursery.start_soon(dribble)
            began = trio.current_time()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for _ in range(20):
                    assert (await client.get("/healthz")).text == "ok"
            assert trio.current_time() - began < 0.5
        with trio.fail_after(3):
            assert await read_all(slow) == b"", "closed after the idle timeout, unanswered"
        await slow.aclose()


@PLAIN_PORTS
async def test_oversized_headers_are_refused(tmp_path: Path, port_field: str) -> None:
    view, port = plain_view(tmp_path, port_field)
    async with servers(view, limits=HTTPLimits(max_header_bytes=4096)):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 8192)
        with trio.fail_after(3):
            answer = await read_all(stream)
        assert answer.startswith(b"HTTP/1.1 431 ")
        await stream.aclose()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/healthz")).text == "ok"


@PLAIN_PORTS
async def test_connections_beyond_the_limit_are_closed(tmp_path: Path, port_field: str) -> None:
    view, port = plain_view(tmp_path, port_field)
    async with servers(view, limits=HTTPLimits(max_connections=2)):
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        await trio.sleep(0.05)
        extra = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(3):
            assert await read_all(extra) == b""
        await extra.aclose()
        for stream in idle:
            await stream.aclose()
        await trio.sleep(0.05)
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/healthz")).text == "ok"


async def test_tls_garbage_does_not_hurt(tmp_path: Path) -> None:
    view = make_view(tmp_path, **OPEN)
    async with servers(view) as addresses:
        stream = await trio.open_tcp_stream("127.0.0.1", addresses.https[1])
        await stream.send_all(b"GET / HTTP/1.1\r\n\r\n")  # plain HTTP to the TLS port
        with trio.fail_after(3):
            await read_all(stream)
        await stream.aclose()
        async with httpx.AsyncClient(verify=False) as client:
            response = await client.get(https(addresses) + "/pods")
            assert json.loads(response.text)["kind"] == "PodList"


@PLAIN_PORTS
@pytest.mark.parametrize("request_head", [
    b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
], ids=["http-1.0", "connection-close"])
async def test_a_connection_that_asks_to_close_is_closed_after_the_answer(
        tmp_path: Path, port_field: str, request_head: bytes) -> None:
    view, port = plain_view(tmp_path, port_field)
    async with servers(view):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(request_head)
        with trio.fail_after(2):  # the idle timeout is 90 s: only a close ends this in time
            answer = await read_all(stream)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok")
        await stream.aclose()


@PLAIN_PORTS
@pytest.mark.parametrize(("size", "status"), [
    (60 * 1024, b"200"), (64 * 1024 - 100, b"200"), (64 * 1024 + 1, b"431"),
    (70_000, b"431"), (200_000, b"431")])
async def test_the_request_head_limit_is_64_kib(
        tmp_path: Path, port_field: str, size: int, status: bytes) -> None:
    view, port = plain_view(tmp_path, port_field)
    async with servers(view):  # the default limits, as documented
        start = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
        padding = size - len(start) - 4
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(start + b"y" * padding + b"\r\n\r\n")
        with trio.fail_after(3):
            answer = await read_all(stream)
        assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:60]
        await stream.aclose()


def test_the_agent_with_its_port_taken_stops_before_it_touches_the_runtime(
    tmp_path: Path,
) -> None:
    """The ports are bound first: a second kubelet on the same port exits 1 naming the port,
    without waiting for (or changing anything through) the container runtime."""
    with taken_port() as port:
        run = subprocess.run(
            [sys.executable, "-m", "trio_kubelet", "--hostname-override=n", "--address=127.0.0.1",
             f"--port={port}", "--healthz-port=0", f"--root-dir={tmp_path}",
             "--container-runtime-endpoint=unix:///nonexistent.sock"],
            capture_output=True, text=True, timeout=60,
        )
    assert run.returncode == 1, run.stderr
    assert f"kubelet server: cannot listen on 127.0.0.1:{port}: Address already in use" in (
        run.stderr)
    assert "Connected to container runtime" not in run.stderr
    assert "Traceback" not in run.stderr
