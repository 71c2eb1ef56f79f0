"""probes/prober.py: each probe kind against real local servers (and the fake runtime for exec)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.net import free_port
from trio_kubelet.core.observed import ProbeResult
from trio_kubelet.model.pod import Container, HTTPGetAction, Probe, TCPSocketAction
from trio_kubelet.probes.prober import USER_AGENT, ProbeError, Prober, resolve_port
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import ContainerScript, ExecResult, serve_fake_runtime

APP = Container.model_validate(
    {"name": "app", "image": "busybox", "ports": [{"name": "http", "containerPort": 8080}]}
)

# One canned HTTP answer per request path; each handler sees the raw request text.
Routes = dict[str, Callable[[str], bytes]]


def answer(status: str, body: bytes = b"", headers: str = "") -> Callable[[str], bytes]:
    def respond(_request: str) -> bytes:
        return (f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{headers}"
                "Connection: close\r\n\r\n").encode() + body
    return respond


@asynccontextmanager
async def http_server(routes: Routes, seen: list[str]) -> AsyncIterator[int]:
    async def handle(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            data += chunk
        request = data.decode()
        seen.append(request)
        path = request.split(" ", 2)[1]
        if path == "/slow":
            await trio.sleep(5)
        await stream.send_all(routes.get(path, answer("404 Not Found"))(request))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def prober(tmp_path: Path) -> AsyncIterator[tuple[Prober, object]]:
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock) as fake, open_cri_client(f"unix://{sock}") as client:
        p = Prober(client)
        try:
            yield p, fake
        finally:
            await p.aclose()


def test_ports_resolve_by_number_or_declared_name():
    assert resolve_port(80, APP) == 80
    assert resolve_port("8080", APP) == 8080
    assert resolve_port("http", APP) == 8080
    with pytest.raises(ProbeError, match="port named 'metrics' not found in container 'app'"):
        resolve_port("metrics", APP)
    with pytest.raises(ProbeError, match="invalid port number: 70000"):
        resolve_port(70000, APP)


async def test_http_probe_outcomes(tmp_path):
    seen: list[str] = []
    routes: Routes = {
        "/ok": answer("200 OK", b"fine"),
        "/err": answer("503 Service Unavailable"),
        "/moved": answer("302 Found", headers="Location: /ok\r\n"),
        "/away": answer("302 Found", b"bye", headers="Location: http://example.invalid/\r\n"),
        "/loop": answer("302 Found", headers="Location: /loop\r\n"),
        "/choices": answer("300 Multiple Choices", b"pick"),
    }
    async with http_server(routes, seen) as port, prober(tmp_path) as (p, _):

        async def get(path: str, **extra: object) -> tuple[ProbeResult, str]:
            action = HTTPGetAction.model_validate({"path": path, "port": port, **extra})
            outcome = await p.http_get(action, APP, "127.0.0.1", 1.0)
            warned.append(outcome.warning)
            return outcome.result, outcome.output

        warned: list[bool] = []
        assert await get("/ok") == (ProbeResult.SUCCESS, "fine")
        assert f"User-Agent: {USER_AGENT}" in seen[-1] and "Accept: */*" in seen[-1]
        assert await get("/err") == (ProbeResult.FAILURE,
                                     "HTTP probe failed with statuscode: 503")
        assert await get("/moved") == (ProbeResult.SUCCESS, "fine")  # same host: followed
        assert warned == [False, False, False]
        # Another host: not followed, a success with a warning (Go's probe.Warning).
        assert await get("/away") == (
            ProbeResult.SUCCESS, "Probe terminated redirects, Response body: bye")
        assert warned[-1]
        # Any 3xx that ends the GET is one: Go's client follows none without a Location.
        assert await get("/choices") == (
            ProbeResult.SUCCESS, "Probe terminated redirects, Response body: pick")
        assert warned[-1]
        assert await get("/loop") == (ProbeResult.FAILURE, "stopped after 10 redirects")
        result, output = await get("/slow")
        assert result is ProbeResult.FAILURE and "timeout" in output
        await get("/ok", httpHeaders=[{"name": "User-Agent", "value": "mine"},
                                      {"name": "X-Probe", "value": "1"}])
        assert "User-Agent: mine" in seen[-1] and "X-Probe: 1" in seen[-1]
        assert USER_AGENT not in seen[-1]


async def test_http_probe_to_a_closed_port_fails(tmp_path):
    async with prober(tmp_path) as (p, _):
        action = HTTPGetAction(port=free_port())
        outcome = await p.http_get(action, APP, "127.0.0.1", 1.0)
        assert outcome.result is ProbeResult.FAILURE and outcome.output.startswith("Get ")


async def test_tcp_probe(tmp_path):
    async with http_server({}, []) as port, prober(tmp_path) as (p, _):
        ok = await p.tcp_socket(TCPSocketAction(port=port), APP, "127.0.0.1", 1.0)
        assert ok.result is ProbeResult.SUCCESS
        closed = await p.tcp_socket(TCPSocketAction(port=free_port()), APP, "127.0.0.1", 1.0)
        assert closed.result is ProbeResult.FAILURE and "dial tcp 127.0.0.1:" in closed.output


async def test_grpc_probe_to_nothing_fails(tmp_path):
    async with prober(tmp_path) as (p, _):
        probe = Probe.model_validate({"grpc": {"port": free_port()}, "timeoutSeconds": 1})
        outcome = await p.probe(probe, APP, "", "127.0.0.1")
        assert outcome.result is ProbeResult.FAILURE


async def test_exec_probe_through_the_runtime(tmp_path):
    async with prober(tmp_path) as (p, fake):
        fake.add_image("busybox")
        fake.script("p", "app", ContainerScript(exec_results={
            ("ok",): ExecResult(stdout=b"fine"),
            ("bad",): ExecResult(stderr=b"broken", exit_code=3),
            ("slow",): ExecResult(delay=3.0),
        }))
        container_id = await _running_container(p, fake)
        ok = await p.exec(container_id, ["ok"], 1.0)
        assert (ok.result, ok.output) == (ProbeResult.SUCCESS, "fine")
        bad = await p.exec(container_id, ["bad"], 1.0)
        assert (bad.result, bad.output) == (ProbeResult.FAILURE, "broken")
        slow = await p.exec(container_id, ["slow"], 1.0)
        assert slow.result is ProbeResult.FAILURE and "timed out" in slow.output
        with pytest.raises(ProbeError):
            await p.exec("no-such-container", ["ok"], 1.0)


async def _running_container(p: Prober, fake: object) -> str:
    client = p._cri
    config = v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="p", uid="u", namespace="d"))
    sandbox = await client.run_pod_sandbox(config)
    container = await client.create_container(sandbox, v1.ContainerConfig(
        metadata=v1.ContainerMetadata(name="app"), image=v1.ImageSpec(image="busybox")), config)
    await client.start_container(container)
    return container
