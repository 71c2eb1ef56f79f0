"""reconcile/hooks.py: one lifecycle handler of each kind, against local servers and the fake
runtime; None means the hook succeeded, a string says why it did not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from tests.net import free_port
from trio_kubelet.model.pod import Container, LifecycleHandler, Pod
from trio_kubelet.reconcile.hooks import USER_AGENT, run_hook
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import ContainerScript, ExecResult, FakeRuntime, open_fake_runtime

POD = Pod.model_validate(
    {
        "metadata": {"name": "p", "namespace": "d", "uid": "u-1"},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "ports": [{"name": "http", "containerPort": 8080}],
                }
            ]
        },
    }
)
APP: Container = POD.spec.containers[0]


def handler(**spec: Any) -> LifecycleHandler:
    return LifecycleHandler.model_validate(spec)


@asynccontextmanager
async def http_server(status: str, seen: list[str]) -> AsyncIterator[int]:
    """Answers every request with ``status`` and keeps the raw requests."""

    async def handle(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            data += chunk
        seen.append(data.decode())
        await stream.send_all(
            f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def runtime(tmp_path: Path) -> AsyncIterator[tuple[CRIClient, FakeRuntime]]:
    async with open_fake_runtime() as (fake, client):
        yield client, fake


async def running_container(client: CRIClient, fake: FakeRuntime) -> str:
    fake.add_image("busybox")
    config = v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="p", uid="u-1", namespace="d"))
    sandbox = await client.run_pod_sandbox(config)
    container = await client.create_container(
        sandbox,
        v1.ContainerConfig(
            metadata=v1.ContainerMetadata(name="app"), image=v1.ImageSpec(image="busybox")
        ),
        config,
    )
    await client.start_container(container)
    return container


async def test_exec_hook_succeeds_on_exit_code_zero_and_says_how_it_failed(tmp_path: Path) -> None:
    async with runtime(tmp_path) as (client, fake):
        fake.script(
            "p",
            "app",
            ContainerScript(
                exec_results={("bad",): ExecResult(stdout=b"half", stderr=b"broken", exit_code=3)}
            ),
        )
        cid = await running_container(client, fake)
        assert await run_hook(client, handler(exec={"command": ["ok"]}), POD, APP, cid, "") is None
        failure = await run_hook(client, handler(exec={"command": ["bad"]}), POD, APP, cid, "")
        assert failure is not None
        assert failure.startswith(
            'Exec lifecycle hook [\'bad\'] for container "app" in pod "p_d(u-1)" failed'
        )
        assert "command 'bad' exited with 3" in failure and "'halfbroken'" in failure


async def test_exec_hook_in_a_container_that_is_gone_fails(tmp_path: Path) -> None:
    async with runtime(tmp_path) as (client, _):
        failure = await run_hook(client, handler(exec={"command": ["x"]}), POD, APP, "nope", "")
        assert failure is not None and failure.startswith("Exec lifecycle hook")


async def test_http_hook_is_done_with_any_answer(tmp_path: Path) -> None:
    seen: list[str] = []
    async with runtime(tmp_path) as (client, _):
        for status in ("200 OK", "500 Internal Server Error", "404 Not Found"):
            async with http_server(status, seen) as port:
                hook = handler(httpGet={"path": "/drain", "port": port})
                assert await run_hook(client, hook, POD, APP, "", "127.0.0.1") is None
        assert seen[0].startswith("GET /drain HTTP/1.1")
        assert f"User-Agent: {USER_AGENT}" in seen[0] and USER_AGENT.startswith("kube-lifecycle/")


async def test_http_hook_fails_without_an_answer(tmp_path: Path) -> None:
    async with runtime(tmp_path) as (client, _):
        closed = handler(httpGet={"path": "/x", "port": free_port()})
        failure = await run_hook(client, closed, POD, APP, "", "127.0.0.1")
        assert failure is not None and failure.startswith("HTTP lifecycle hook (/x)")
        assert 'Get "http://127.0.0.1:' in failure
        no_ip = await run_hook(client, handler(httpGet={"port": 80}), POD, APP, "", "")
        assert no_ip is not None and "no IP" in no_ip
        unknown_port = handler(httpGet={"port": "metrics"})
        failure = await run_hook(client, unknown_port, POD, APP, "", "127.0.0.1")
        assert failure is not None and "port named 'metrics' not found" in failure


async def test_http_hook_resolves_a_named_port(tmp_path: Path) -> None:
    seen: list[str] = []
    app = APP.model_copy(deep=True)
    async with runtime(tmp_path) as (client, _), http_server("200 OK", seen) as port:
        app.ports[0].container_port = port
        assert (
            await run_hook(client, handler(httpGet={"port": "http"}), POD, app, "", "127.0.0.1")
            is None
        )
        assert len(seen) == 1


async def test_sleep_hook_sleeps(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    async with runtime(tmp_path) as (client, _):
        begun = trio.current_time()
        assert await run_hook(client, handler(sleep={"seconds": 7}), POD, APP, "", "") is None
        assert trio.current_time() - begun == 7


async def test_tcp_socket_hook_is_accepted_but_fails_at_run_time(tmp_path: Path) -> None:
    async with runtime(tmp_path) as (client, _):
        failure = await run_hook(client, handler(tcpSocket={"port": 80}), POD, APP, "", "1.2.3.4")
        assert failure is not None and "tcpSocket is not a supported handler" in failure
