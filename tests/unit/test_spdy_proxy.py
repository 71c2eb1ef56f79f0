"""spdy_proxy + the streaming views: SPDY/3.1 upgrades recognised in the accept loop, judged by
the app, relayed to a stand-in runtime streaming server and spliced byte for byte."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import h11
import pytest
import trio
import trio.testing
import trustme

from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import Pod, PodStatus
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRINotFound, StatusCode
from trio_kubelet.server.app import create_app
from trio_kubelet.server.auth import (
    AlwaysAllowAuthorizer,
    Attributes,
    Authorizer,
    RequestAuthenticator,
    X509Authenticator,
)
from trio_kubelet.server.routes_streaming import streaming_blueprint
from trio_kubelet.server.serve import HTTPLimits, serve_app
from trio_kubelet.server.spdy_proxy import is_spdy_upgrade, splice
from trio_kubelet.server.tls import ServingCertificate, server_tls_context
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore

UID = "uid-1"
EXEC = "/exec/default/web/main?output=1&error=1&command=sh&command=-c&command=echo+hi"
SPDY = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
        ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
        ("X-Stream-Protocol-Version", "channel.k8s.io")]
SWITCH = (b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
          b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")


# --- a stand-in runtime: the CRI calls and the streaming server ----------------------------------


@dataclass
class StreamingServer:
    """Answers an upgrade with 101 and a greeting, then echoes in upper case; after the client's
    EOF it says bye and closes. ``refuse`` makes it answer 403 instead."""

    requests: list[h11.Request] = field(default_factory=list)
    refuse: bool = False
    port: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        while not isinstance(event := connection.next_event(), h11.Request):
            connection.receive_data(await stream.receive_some())
        self.requests.append(event)
        if self.refuse:
            body = b"unsupported protocol versions\n"
            await stream.send_all(
                connection.send(h11.Response(status_code=403, reason=b"Forbidden", headers=[
                    ("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]))
                + connection.send(h11.Data(data=body)) + connection.send(h11.EndOfMessage()))
            await stream.aclose()
            return
        await stream.send_all(SWITCH + b"greeting;")
        early = connection.trailing_data[0]
        if early:
            await stream.send_all(early.upper())
        while chunk := await stream.receive_some():
            await stream.send_all(chunk.upper())
        await stream.send_all(b";bye")
        await stream.aclose()


@dataclass
class StubRuntime:
    """Exec, Attach and PortForward answer the streaming server's URL; ``missing`` → NotFound."""

    url: str
    calls: list[Any] = field(default_factory=list)
    missing: bool = False

    async def _prepare(self, request: Any) -> str:
        self.calls.append(request)
        if self.missing:
            raise CRINotFound("Exec", StatusCode.NOT_FOUND, "container c1 is gone")
        return self.url

    async def exec(self, request: v1.ExecRequest, **_: Any) -> str:
        return await self._prepare(request)

    async def attach(self, request: v1.AttachRequest, **_: Any) -> str:
        return await self._prepare(request)

    async def port_forward(self, request: v1.PortForwardRequest, **_: Any) -> str:
        return await self._prepare(request)

    async def list_pod_sandbox(self, *_: Any, **__: Any) -> list[v1.PodSandbox]:
        return [v1.PodSandbox(id="s1", created_at=1)]


def running_pod() -> tuple[Pod, PodStatus]:
    status = {"phase": "Running", "containerStatuses": [
        {"name": "main", "containerID": "containerd://c1", "state": {"running": {}}},
        {"name": "side", "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    pod = Pod.model_validate({
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"containers": [{"name": "main", "image": "busybox"},
                                {"name": "side", "image": "busybox"}]},
        "status": status})
    return pod, PodStatus.model_validate(status)


@dataclass
class Kubelet:
    port: int
    runtime: StubRuntime
    streaming: StreamingServer
    metrics: AgentMetrics

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.port)

    def requests(self, path: str) -> float | None:
        return self.metrics.registry.get_sample_value("kubelet_http_requests_total", {
            "method": "POST", "path": path, "server_type": "readwrite", "long_running": "true"})


@asynccontextmanager
async def kubelet(*, runtime_url: str | None = None, tls_context: Any = None,
                  authenticator: RequestAuthenticator | None = None,
                  authorizer: Authorizer | None = None,
                  limits: HTTPLimits | None = None) -> AsyncIterator[Kubelet]:
    """The streaming blueprint in an app served by serve_app, before a stand-in runtime."""
    streaming = StreamingServer()
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, streaming.handle, 0,
                                                 host="127.0.0.1"))
        streaming.port = listener.socket.getsockname()[1]
        runtime = StubRuntime(runtime_url or f"http://127.0.0.1:{streaming.port}/exec/t0k3n")
        store = PodStatusStore()
        store.set(*running_pod())
        view = NodeView(options=AgentOptions(config=KubeletConfiguration(), node_name="node-a"),
                        store=store, client=cast(CRIClient, runtime),
                        last_relist=lambda: None, last_sync_loop=lambda: None)
        metrics = AgentMetrics()
        app = create_app(view, [streaming_blueprint(view)], metrics=metrics,
                         authenticator=authenticator or RequestAuthenticator([], anonymous=True),
                         authorizer=authorizer or AlwaysAllowAuthorizer())
        _, port = await nursery.start(partial(serve_app, app, "127.0.0.1", 0,
                                              tls_context=tls_context,
                                              limits=limits or HTTPLimits()))
        yield Kubelet(port, runtime, streaming, metrics)
        nursery.cancel_scope.cancel()


def head(method: str, target: str, headers: Sequence[tuple[str, str]] = SPDY,
         body: bytes = b"") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: kubelet", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_head(stream: trio.abc.ReceiveStream) -> tuple[bytes, bytes]:
    """An answer's head and whatever followed it in the same reads."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        assert chunk, f"closed before the answer's head ended: {data!r}"
        data += chunk
    answer, _, rest = data.partition(b"\r\n\r\n")
    return answer + b"\r\n\r\n", rest


async def read_all(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    return data


async def answer_to(kubelet: Kubelet, request: bytes) -> tuple[int, bytes]:
    """Status and body of a refused upgrade; the server must close the connection after it."""
    stream = await kubelet.connect()
    await stream.send_all(request)
    with trio.fail_after(5):
        answer = await read_all(stream)
    await stream.aclose()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


# --- recognising an upgrade -----------------------------------------------------------------------


def parsed(request_bytes: bytes) -> h11.Request:
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(request_bytes)
    event = connection.next_event()
    assert isinstance(event, h11.Request)
    return event


@pytest.mark.parametrize(("request_bytes", "spdy"), [
    (head("POST", "/exec/default/web/main"), True),
    (head("GET", "/portForward/default/web", [("Connection", "keep-alive, Upgrade"),
                                              ("Upgrade", "spdy/3.1")]), True),
    (head("GET", "/exec/default/web/main", [("Connection", "Upgrade"), ("Upgrade", "websocket")]),
     False),
    (head("POST", "/exec/default/web/main", [("Upgrade", "SPDY/3.1")]), False),  # no Connection
    (head("POST", "/exec/default/web/main", []), False),
])
def test_an_spdy_upgrade_is_recognised_as_go_recognises_one(request_bytes: bytes,
                                                            spdy: bool) -> None:
    assert is_spdy_upgrade(parsed(request_bytes)) is spdy


# --- the session ----------------------------------------------------------------------------------


async def test_exec_is_relayed_and_spliced_both_ways(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "trio_kubelet.server.routes_streaming")
    async with kubelet() as k:
        stream = await k.connect()
        await stream.send_all(head("POST", EXEC, [*SPDY, ("Authorization", "Bearer secret")],
                                   b"early;"))
        with trio.fail_after(5):
            answer, rest = await read_head(stream)
            assert answer == SWITCH, "the runtime's 101, as it answered"
            await stream.send_all(b"stdin;")
            expected = b"greeting;EARLY;STDIN;"
            while len(rest) < len(expected):
                rest += await stream.receive_some()
            assert rest == expected
            await stream.send_eof()  # the runtime sees EOF, and its last words still come back
            assert await read_all(stream) == b";bye"
        await stream.aclose()

        [exec_request] = k.runtime.calls
        assert exec_request == v1.ExecRequest(container_id="c1", cmd=["sh", "-c", "echo hi"],
                                              stdout=True, stderr=True)
        [upstream] = k.streaming.requests
        assert (upstream.method, upstream.target) == (b"POST", b"/exec/t0k3n")
        assert list(upstream.headers) == [
            (b"host", f"127.0.0.1:{k.streaming.port}".encode()),
            (b"connection", b"Upgrade"), (b"upgrade", b"SPDY/3.1"),
            (b"x-stream-protocol-version", b"v4.channel.k8s.io"),
            (b"x-stream-protocol-version", b"channel.k8s.io")], "no credentials go on"
        assert k.requests("exec") == 1
    [line] = [r.getMessage() for r in caplog.records if "SPDY session" in r.getMessage()]
    assert line.startswith("exec default/web/main: SPDY session ended after ")
    assert line.endswith("(12 bytes in, 25 bytes out)")


async def test_attach_and_port_forward_ask_the_runtime_for_their_urls() -> None:
    async with kubelet() as k:
        for target in ("/attach/default/web/uid-1/main?input=1&tty=1", "/portForward/default/web"):
            stream = await k.connect()
            await stream.send_all(head("GET", target))
            with trio.fail_after(5):
                answer, _ = await read_head(stream)
            assert answer == SWITCH
            await stream.aclose()
        attach, port_forward = k.runtime.calls
        assert attach == v1.AttachRequest(container_id="c1", stdin=True, tty=True)
        # SPDY port-forward names its ports in stream headers, so none are asked for here.
        assert port_forward == v1.PortForwardRequest(pod_sandbox_id="s1")


async def test_the_client_hanging_up_ends_the_session() -> None:
    async with kubelet() as k:
        stream = await k.connect()
        await stream.send_all(head("POST", EXEC))
        with trio.fail_after(5):
            await read_head(stream)
        await trio.aclose_forcefully(stream)
        with trio.fail_after(5):
            while k.metrics.registry.get_sample_value("kubelet_http_inflight_requests", {
                    "method": "POST", "path": "exec", "server_type": "readwrite",
                    "long_running": "true"}) != 0:
                await trio.sleep(0.01)


@pytest.mark.parametrize(("target", "status", "body"), [
    ("/exec/default/nope/main?output=1&command=ls", 404,
     b'pod "nope" in namespace "default" not found'),
    ("/exec/default/web/wrong-uid/main?output=1&command=ls", 404,
     b'pod "web" in namespace "default" has no uid "wrong-uid"'),
    ("/exec/default/web/side?output=1&command=ls", 400,
     b'container "side" in pod "web" is not running'),
    ("/exec/default/web/main?command=ls", 400,
     b"you must specify at least 1 of stdin, stdout, stderr"),
    ("/exec/default/web/main?output=1", 400, b'query parameter "command" is required'),
    ("/exec/default/web", 404, b"404 page not found\n"),
])
async def test_bad_requests_get_the_websocket_paths_answers(target: str, status: int,
                                                            body: bytes) -> None:
    async with kubelet() as k:
        assert await answer_to(k, head("POST", target)) == (status, body)
        assert not k.streaming.requests


async def test_runtime_failures() -> None:
    async with kubelet(runtime_url="http://127.0.0.1:1/exec/t0k3n") as k:
        status, body = await answer_to(k, head("POST", EXEC))
        assert status == 500
        assert body.startswith(b"error dialing the runtime's streaming server: ")
        k.runtime.missing = True
        assert await answer_to(k, head("POST", EXEC)) == (404, b"container c1 is gone")
    async with kubelet() as k:
        k.streaming.refuse = True
        assert await answer_to(k, head("POST", EXEC)) == (403, b"unsupported protocol versions\n")


async def test_an_upgrade_may_follow_other_requests_in_pieces_but_not_carry_a_body() -> None:
    async with kubelet() as k:
        stream = await k.connect()
        # A keep-alive connection: an ordinary request, then an upgrade sent 7 bytes at a time.
        await stream.send_all(head("GET", "/exec/default/web/main?output=1&command=ls", []))
        with trio.fail_after(5):
            answer, rest = await read_head(stream)
        assert answer.startswith(b"HTTP/1.1 400 ")
        length = int(answer.lower().partition(b"content-length: ")[2].partition(b"\r\n")[0])
        while len(rest) < length:
            rest += await stream.receive_some()
        assert rest == b"Upgrade request required"
        request = head("POST", "/exec/default/w%65b/main?output=1&command=ls", SPDY)
        pieces = [request[i:i + 7] for i in range(0, len(request), 7)]
        pieces[-1] += b"early;"  # what came with the head's end is kept for the runtime
        for piece in pieces:
            await stream.send_all(piece)
            await trio.sleep(0.001)
        with trio.fail_after(5):
            answer, rest = await read_head(stream)
            assert answer == SWITCH
            while len(rest) < len(b"greeting;EARLY;"):
                rest += await stream.receive_some()
        assert rest == b"greeting;EARLY;"
        await stream.aclose()
        # An upgrade with a body is an ordinary request, refused with the reason.
        status, body = await answer_to(k, head("POST", EXEC, [
            *SPDY, ("Content-Length", "3"), ("Connection", "close")], b"abc"))
        assert status == 400
        assert body.startswith(b"SPDY/3.1 upgrades are not supported on this connection")


async def test_an_unfinished_head_on_a_streaming_path_is_dropped_after_the_idle_timeout(
) -> None:
    async with kubelet(limits=HTTPLimits(idle_timeout=0.5)) as k:
        stream = await k.connect()
        await stream.send_all(head("POST", EXEC)[:40])
        with trio.fail_after(3):
            assert await read_all(stream) == b"", "closed, unanswered"
        await stream.aclose()


# --- TLS and authorisation -----------------------------------------------------------------------


@dataclass
class Recorder:
    allow: bool
    asked: list[Attributes] = field(default_factory=list)

    async def authorize(self, attributes: Attributes) -> bool:
        self.asked.append(attributes)
        return self.allow


async def test_tls_client_certificates_and_authorisation(tmp_path: Path) -> None:
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem"))
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.crt"))
    context = server_tls_context(
        ServingCertificate(tmp_path / "server.pem", tmp_path / "server.pem"),
        str(tmp_path / "clients.crt"))
    authenticator = RequestAuthenticator([X509Authenticator()], anonymous=False)

    async def session(k: Kubelet, *, certificate: bool, ca: trustme.CA = client_ca) -> bytes:
        client = ssl.create_default_context()
        server_ca.configure_trust(client)
        if certificate:
            ca.issue_cert(common_name="kube-apiserver").configure_cert(client)
        stream = trio.SSLStream(await k.connect(), client, server_hostname="127.0.0.1")
        await stream.send_all(head("POST", EXEC))
        with trio.fail_after(5):
            answer, _ = await read_head(stream)
        await stream.aclose()
        return answer

    async with kubelet(tls_context=context, authenticator=authenticator,
                       authorizer=AlwaysAllowAuthorizer()) as k:
        assert await session(k, certificate=True) == SWITCH
        assert (await session(k, certificate=False)).startswith(b"HTTP/1.1 401 ")
        assert (await session(k, certificate=True, ca=trustme.CA())).startswith(
            b"HTTP/1.1 401 "), "a certificate from another CA: 401 after the handshake, as Go"
        assert not k.runtime.calls[1:], "only the verified session reached the runtime"
    denied = Recorder(allow=False)
    async with kubelet(tls_context=context, authenticator=authenticator,
                       authorizer=denied) as k:
        assert (await session(k, certificate=True)).startswith(b"HTTP/1.1 403 ")
        assert not k.runtime.calls
    [asked] = denied.asked
    assert (asked.user.name, asked.verb, asked.subresource, asked.path) == (
        "kube-apiserver", "create", "proxy", "/exec/default/web/main")


# --- the splice alone --------------------------------------------------------------------------


async def test_splice_closes_both_when_the_runtime_ends() -> None:
    client, client_far = trio.testing.memory_stream_pair()
    runtime, runtime_far = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        copied: list[tuple[int, int]] = []

        async def run() -> None:
            copied.append(await splice(client_far, b"c0", runtime_far, b"r0"))

        nursery.start_soon(run)
        await client.send_all(b"c1")
        received = b""
        while len(received) < 4:
            received += await runtime.receive_some()
        assert received == b"c0c1"
        await runtime.send_all(b"r1")
        await runtime.aclose()
        assert await read_all(client) == b"r0r1"
    assert copied == [(4, 4)]
    with pytest.raises(trio.ClosedResourceError):
        await client_far.send_all(b"x")
