"""routes_logs: /containerLogs over a pod log directory and a stub CRI client, and /logs/."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from quart_trio import QuartTrio

from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.model.pod import Pod, PodStatus
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRINotFound, StatusCode
from trio_kubelet.server.routes_logs import logs_blueprint
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore

UID = "uid-1"


def chunk(text: str, stream: str = "stdout", tag: str = "F", ago: float = 3600.0) -> bytes:
    moment = datetime.now(UTC) - timedelta(seconds=ago)
    return f"{moment.isoformat().replace('+00:00', 'Z')} {stream} {tag} {text}\n".encode()


@dataclass
class StubRuntime:
    """The two CRI calls the log endpoints make: ContainerStatus (log path, state)."""

    containers: dict[str, tuple[str, v1.ContainerState]] = field(default_factory=dict)
    calls: int = 0

    async def container_status(self, container_id: str, **_: Any) -> v1.ContainerStatusResponse:
        self.calls += 1
        if container_id not in self.containers:
            raise CRINotFound("ContainerStatus", StatusCode.NOT_FOUND, "not found")
        path, state = self.containers[container_id]
        return v1.ContainerStatusResponse(
            status=v1.ContainerStatus(id=container_id, state=state, log_path=path))


def make_pod(status: dict[str, Any]) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"containers": [{"name": "main", "image": "busybox"},
                                {"name": "side", "image": "busybox"}]},
        "status": status,
    })


RUNNING_WITH_PREVIOUS = {
    "phase": "Running",
    "containerStatuses": [
        {"name": "main", "restartCount": 1, "containerID": "containerd://c1",
         "state": {"running": {}},
         "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://c0"}}},
        {"name": "side", "state": {"waiting": {"reason": "ImagePullBackOff"}}},
    ],
}


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.pod_logs = tmp_path / "pods"
        self.node_logs = tmp_path / "node"
        self.node_logs.mkdir()
        self.store = PodStatusStore()
        self.runtime = StubRuntime()
        self.log_dir = self.pod_logs / f"default_web_{UID}" / "main"
        self.log_dir.mkdir(parents=True)
        view = NodeView(
            options=AgentOptions(config=KubeletConfiguration(), node_name="node"),
            store=self.store, client=cast(CRIClient, self.runtime),
            last_relist=lambda: None, last_sync_loop=lambda: None,
            pod_logs_dir=self.pod_logs, node_logs_dir=self.node_logs)
        app = QuartTrio(__name__)
        app.register_blueprint(logs_blueprint(view))
        self.client = app.test_client()

    def set_pod(self, status: dict[str, Any]) -> None:
        pod = make_pod(status)
        self.store.set(pod, PodStatus.model_validate(status))

    def log(self, container_id: str, restart: int, data: bytes,
            state: v1.ContainerState = v1.ContainerState.CONTAINER_RUNNING) -> Path:
        path = self.log_dir / f"{restart}.log"
        path.write_bytes(data)
        self.runtime.containers[container_id] = (str(path), state)
        return path

    async def get(self, path: str) -> tuple[int, bytes]:
        response = await self.client.get(path)
        return response.status_code, await response.get_data()


@pytest.fixture
def env(tmp_path: Path) -> Env:
    environment = Env(tmp_path)
    environment.set_pod(RUNNING_WITH_PREVIOUS)
    environment.log("c0", 0, chunk("previous instance") + chunk("its end"),
                    v1.ContainerState.CONTAINER_EXITED)
    environment.log("c1", 1, chunk("hel", tag="P") + chunk("lo") + chunk("oops", "stderr")
                    + chunk("world", ago=5))
    return environment


LOGS = "/containerLogs/default/web/main"


async def test_returns_the_current_instance_log_with_partials_joined(env: Env) -> None:
    assert await env.get(LOGS) == (200, b"hello\noops\nworld\n")


async def test_tail_limit_timestamps_since_and_stream(env: Env) -> None:
    assert await env.get(f"{LOGS}?tailLines=2") == (200, b"oops\nworld\n")
    assert await env.get(f"{LOGS}?limitBytes=8") == (200, b"hello\noo")
    assert await env.get(f"{LOGS}?sinceSeconds=60") == (200, b"world\n")
    assert await env.get(f"{LOGS}?stream=Stderr") == (200, b"oops\n")
    status, body = await env.get(f"{LOGS}?timestamps=true&tailLines=1")
    stamp, _, text = body.partition(b" ")
    assert status == 200 and text == b"world\n"
    assert len(stamp) == 30 and stamp.endswith(b"Z")  # RFC3339Nano with nine digits


async def test_previous_reads_the_terminated_instance(env: Env) -> None:
    assert await env.get(f"{LOGS}?previous=true") == (200, b"previous instance\nits end\n")


async def test_previous_falls_back_to_the_log_file_when_the_runtime_forgot_it(env: Env) -> None:
    del env.runtime.containers["c0"]
    assert await env.get(f"{LOGS}?previous=true") == (200, b"previous instance\nits end\n")
    (env.log_dir / "0.log").unlink()
    status, body = await env.get(f"{LOGS}?previous=true")
    assert status == 400 and b"is gone and so is its log file 0.log" in body


async def test_unknown_pod_and_container_are_404(env: Env) -> None:
    assert await env.get("/containerLogs/default/nope/main") == (
        404, b'pod "nope" in namespace "default" not found')
    assert await env.get("/containerLogs/other/web/main") == (
        404, b'pod "web" in namespace "other" not found')
    assert await env.get("/containerLogs/default/web/nope") == (
        404, b'container "nope" not found in pod "web"')


async def test_containers_without_logs_are_400_in_go_words(env: Env) -> None:
    assert await env.get("/containerLogs/default/web/side") == (
        400, b'container "side" in pod "web" is waiting to start: trying and failing to pull image')
    assert await env.get("/containerLogs/default/web/side?previous=1") == (
        400, b'previous terminated container "side" in pod "web" not found')
    env.set_pod({"containerStatuses": [{"name": "main", "state": {"running": {}},
                                        "containerID": "containerd://c1"}]})
    assert await env.get("/containerLogs/default/web/side") == (
        400, b'container "side" in pod "web" is not available')


async def test_terminated_container_shows_its_own_log(env: Env) -> None:
    env.set_pod({"containerStatuses": [
        {"name": "main", "restartCount": 0,
         "state": {"terminated": {"exitCode": 0, "containerID": "containerd://c0"}}}]})
    assert await env.get(LOGS) == (200, b"previous instance\nits end\n")


@pytest.mark.parametrize(("query", "message"), [
    ("tailLines=-1", b"tailLines: Invalid value: -1: must be greater than or equal to 0"),
    ("tailLines=x", b'tailLines: Invalid value: "x": must be an integer'),
    ("sinceTime=noon", b'sinceTime: Invalid value: "noon": must be an RFC 3339 timestamp'),
    ("sinceSeconds=5&sinceTime=2024-01-01T00:00:00Z", b"at most one of `sinceTime`"),
    ("limitBytes=-3", b"limitBytes: Invalid value: -3: must be greater than 0"),
])
async def test_bad_query_values_are_400(env: Env, query: str, message: bytes) -> None:
    status, body = await env.get(f"{LOGS}?{query}")
    assert status == 400 and message in body


async def test_only_get(env: Env) -> None:
    response = await env.client.post(LOGS)
    assert response.status_code == 405


async def test_follow_streams_until_the_container_stops(env: Env) -> None:
    path = env.log_dir / "1.log"
    result: list[tuple[int, bytes]] = []

    async def request() -> None:
        result.append(await env.get(f"{LOGS}?follow=true&tailLines=1"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request)
        await trio.sleep(0.5)
        with path.open("ab") as log:
            log.write(chunk("appended", ago=0))
        await trio.sleep(0.5)
        assert not result, "a followed log must not end while the container runs"
        env.runtime.containers["c1"] = (str(path), v1.ContainerState.CONTAINER_EXITED)
        with trio.fail_after(5):
            while not result:
                await trio.sleep(0.05)
    assert result == [(200, b"world\nappended\n")]


# -- /logs/ -------------------------------------------------------------------------------------


@pytest.fixture
def node_logs(env: Env, tmp_path: Path) -> Env:
    (env.node_logs / "syslog").write_bytes(b"boot\n" * 1000)
    (env.node_logs / "apt").mkdir()
    (env.node_logs / "apt" / "history.log").write_text("installed\n")
    (env.node_logs / "<b>&.txt").write_text("escaped\n")
    secret = tmp_path / "secret"
    secret.write_text("top secret\n")
    (env.node_logs / "escape").symlink_to(secret)
    (env.node_logs / "escape-dir").symlink_to(tmp_path)
    return env


async def test_listing_like_http_file_server(node_logs: Env) -> None:
    response = await node_logs.client.get("/logs/")
    body = (await response.get_data()).decode()
    assert response.status_code == 200 and response.content_type.startswith("text/html")
    assert '<a href="apt/">apt/</a>' in body and '<a href="syslog">syslog</a>' in body
    assert '<a href="%3Cb%3E%26.txt">&lt;b&gt;&amp;.txt</a>' in body


async def test_files_and_subdirectories(node_logs: Env) -> None:
    assert await node_logs.get("/logs/syslog") == (200, b"boot\n" * 1000)
    assert await node_logs.get("/logs/apt/history.log") == (200, b"installed\n")
    response = await node_logs.client.get("/logs/apt")
    assert response.status_code == 301 and response.headers["Location"].endswith("apt/")
    status, body = await node_logs.get("/logs/apt/")
    assert status == 200 and b"history.log" in body


@pytest.mark.parametrize("path", [
    "/logs/escape", "/logs/escape-dir/secret", "/logs/nope", "/logs/syslog/x",
])
async def test_nothing_outside_the_directory(node_logs: Env, path: str) -> None:
    status, body = await node_logs.get(path)
    assert status == 404 and b"secret" not in body


@pytest.mark.parametrize("path", ["/logs/../secret", "/logs/apt/../../secret"])
async def test_dot_dot_is_400(node_logs: Env, path: str) -> None:
    response = await node_logs.client.get(path)
    assert response.status_code == 400 and b"secret" not in await response.get_data()



async def test_head_answers_without_reading_the_log(env: Env) -> None:
    response = await env.client.head(f"{LOGS}?follow=true")
    assert response.status_code == 200 and await response.get_data() == b""
