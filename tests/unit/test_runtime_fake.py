"""The CRI client against the fake runtime over a real unix socket, and runtime/inspect."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_kubelet.core.observed import ContainerState, SandboxState
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import CRIClient, open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import (
    CRIDeadlineExceeded,
    CRIError,
    CRINotFound,
    CRIUnavailable,
    CRIUnimplemented,
    CRIUnknown,
    StatusCode,
)
from trio_kubelet.runtime.fake import (
    ContainerScript,
    ExecResult,
    FakeRuntime,
    normalize_image_ref,
    open_fake_runtime,
    serve_fake_runtime,
    serve_fake_runtime_on_asyncio,
)
from trio_kubelet.runtime.inspect import inspect_pod, relist

T0 = 1_700_000_000.0


class ManualClock:
    """The fake's clock, advanced by hand so scripted exits are deterministic."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Env:
    fake: FakeRuntime
    client: CRIClient
    clock: ManualClock
    socket: Path


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock, clock=clock) as fake, \
            open_cri_client(f"unix://{sock}", timeout=5.0) as client:
        fake.add_image("busybox:latest")
        yield Env(fake, client, clock, sock)


def pod_config(name: str = "web", uid: str = "uid-web", *, attempt: int = 0,
               host_network: bool = False, hostname: str = "") -> v1.PodSandboxConfig:
    mode = v1.NamespaceMode.NODE if host_network else v1.NamespaceMode.POD
    return v1.PodSandboxConfig(
        metadata=v1.PodSandboxMetadata(name=name, uid=uid, namespace="default", attempt=attempt),
        hostname=hostname,
        log_directory=f"/var/log/pods/default_{name}_{uid}",
        labels=labels.sandbox_labels(uid, name, "default", {"app": name}),
        annotations={"note": "kept"},
        linux=v1.LinuxPodSandboxConfig(security_context=v1.LinuxSandboxSecurityContext(
            namespace_options=v1.NamespaceOption(network=mode))),
    )


def container_config(pod: v1.PodSandboxConfig, name: str = "app", *, attempt: int = 0,
                     image: str = "busybox", spec_hash: str = "h1") -> v1.ContainerConfig:
    meta = pod.metadata
    assert meta is not None
    return v1.ContainerConfig(
        metadata=v1.ContainerMetadata(name=name, attempt=attempt),
        image=v1.ImageSpec(image=image),
        command=["sleep", "3600"],
        log_path=f"{name}/{attempt}.log",
        labels=labels.container_labels(meta.uid, meta.name, meta.namespace, name),
        annotations=labels.container_annotations(spec_hash, attempt, "regular", 30),
    )


async def start_pod(client: CRIClient, pod: v1.PodSandboxConfig,
                    *names: str) -> tuple[str, list[str]]:
    sandbox_id = await client.run_pod_sandbox(pod)
    ids = []
    for name in names:
        container_id = await client.create_container(sandbox_id, container_config(pod, name), pod)
        await client.start_container(container_id)
        ids.append(container_id)
    return sandbox_id, ids


async def status_of(client: CRIClient, container_id: str) -> v1.ContainerStatus:
    response = await client.container_status(container_id)
    assert response.status is not None
    return response.status


# -- runtime basics ----------------------------------------------------------------------------


async def test_version_and_status(env: Env) -> None:
    version = await env.client.version()
    assert (version.runtime_name, version.runtime_api_version) == ("fake", "v1")
    status = await env.client.status()
    assert status.status is not None
    conditions = {c.type: c.status for c in status.status.conditions}
    assert conditions == {"RuntimeReady": True, "NetworkReady": True}
    env.fake.set_network_ready(False)
    status = await env.client.status()
    assert status.status is not None
    assert [c.reason for c in status.status.conditions if not c.status] == ["NetworkPluginNotReady"]
    assert env.fake.calls["Status"] == 2


async def test_sandbox_and_container_lifecycle(env: Env) -> None:
    client, pod = env.client, pod_config()
    sandbox_id, [container_id] = await start_pod(client, pod, "app")

    sandbox = (await client.pod_sandbox_status(sandbox_id)).status
    assert sandbox is not None and sandbox.network is not None
    assert sandbox.state == v1.PodSandboxState.SANDBOX_READY
    assert sandbox.network.ip == "10.88.0.2"
    assert sandbox.labels[labels.POD_UID] == "uid-web"
    assert sandbox.annotations == {"note": "kept"}
    assert sandbox.created_at == int(T0 * 1e9)

    [listed] = await client.list_containers()
    assert listed.id == container_id and listed.pod_sandbox_id == sandbox_id
    assert listed.state == v1.ContainerState.CONTAINER_RUNNING
    assert listed.labels[labels.CONTAINER_NAME] == "app"
    assert listed.annotations[labels.CONTAINER_HASH] == "h1"

    env.clock.advance(5)
    await client.stop_container(container_id, timeout=10)
    status = await status_of(client, container_id)
    assert status.state == v1.ContainerState.CONTAINER_EXITED
    assert (status.exit_code, status.reason) == (143, "Error")
    assert status.finished_at == int((T0 + 5) * 1e9)
    assert status.log_path == "/var/log/pods/default_web_uid-web/app/0.log"
    assert status.image_ref.startswith("docker.io/library/busybox@sha256:")

    await client.remove_container(container_id)
    assert await client.list_containers() == []
    await client.stop_pod_sandbox(sandbox_id)
    [listed_sandbox] = await client.list_pod_sandbox()
    assert listed_sandbox.state == v1.PodSandboxState.SANDBOX_NOTREADY
    await client.remove_pod_sandbox(sandbox_id)
    assert await client.list_pod_sandbox() == []
    assert env.fake.calls["RunPodSandbox"] == 1 and env.fake.calls["ListContainers"] == 2


async def test_remove_sandbox_removes_its_containers(env: Env) -> None:
    sandbox_id, _ = await start_pod(env.client, pod_config(), "app", "sidecar")
    await env.client.remove_pod_sandbox(sandbox_id)  # still READY: containerd stops it first
    assert await env.client.list_containers() == []
    await env.client.remove_pod_sandbox(sandbox_id)  # gone already: not an error


async def test_sandbox_names_are_reserved_per_attempt(env: Env) -> None:
    await env.client.run_pod_sandbox(pod_config())
    with pytest.raises(CRIUnknown, match="failed to reserve sandbox name"):
        await env.client.run_pod_sandbox(pod_config())
    await env.client.run_pod_sandbox(pod_config(attempt=1))


async def test_host_network_sandbox(env: Env) -> None:
    with pytest.raises(CRIUnknown, match="hostname without a private UTS namespace"):
        await env.client.run_pod_sandbox(pod_config(host_network=True, hostname="web"))
    sandbox_id = await env.client.run_pod_sandbox(pod_config(host_network=True))
    status = (await env.client.pod_sandbox_status(sandbox_id)).status
    assert status is not None and status.network is not None and status.linux is not None
    assert status.network.ip == ""
    assert status.linux.namespaces.options.network == v1.NamespaceMode.NODE


# -- scripted behaviour ------------------------------------------------------------------------


async def test_scripted_exit_is_visible_after_its_time(env: Env) -> None:
    env.fake.script(pod="web", container="app",
                    behaviour=ContainerScript(exit_after=0.2, exit_code=1))
    _, [container_id] = await start_pod(env.client, pod_config(), "app")
    env.clock.advance(0.1)
    assert (await status_of(env.client, container_id)).state == v1.ContainerState.CONTAINER_RUNNING
    env.clock.advance(0.15)
    status = await status_of(env.client, container_id)
    assert status.state == v1.ContainerState.CONTAINER_EXITED
    assert (status.exit_code, status.reason) == (1, "Error")
    assert status.finished_at - status.started_at == 200_000_000


async def test_scripted_exit_in_real_time(tmp_path: Path) -> None:
    sock = tmp_path / "real.sock"
    async with serve_fake_runtime(sock) as fake, open_cri_client(str(sock)) as client:
        fake.add_image("busybox")
        fake.script(pod="web", container="app",
                    behaviour=ContainerScript(exit_after=0.2, exit_code=1))
        _, [container_id] = await start_pod(client, pod_config(), "app")
        await trio.sleep(0.25)
        status = await status_of(client, container_id)
        assert (status.state, status.exit_code) == (v1.ContainerState.CONTAINER_EXITED, 1)


async def test_oom_script(env: Env) -> None:
    env.fake.script(pod="web", container="app", behaviour=ContainerScript(exit_after=1, oom=True))
    _, [container_id] = await start_pod(env.client, pod_config(), "app")
    env.clock.advance(1)
    status = await status_of(env.client, container_id)
    assert (status.exit_code, status.reason) == (137, "OOMKilled")


async def test_crash_and_oom_kill_now(env: Env) -> None:
    _, [a, b] = await start_pod(env.client, pod_config(), "a", "b")
    env.fake.crash(a, exit_code=0)
    env.fake.oom_kill(b)
    assert (await status_of(env.client, a)).reason == "Completed"
    assert (await status_of(env.client, b)).reason == "OOMKilled"


async def test_fail_start_surfaces_as_typed_error(env: Env) -> None:
    env.fake.script(pod="web", container="app",
                    behaviour=ContainerScript(fail_start="exec: \"nope\": not found"))
    pod = pod_config()
    sandbox_id = await env.client.run_pod_sandbox(pod)
    container_id = await env.client.create_container(sandbox_id, container_config(pod), pod)
    with pytest.raises(CRIError) as caught:
        await env.client.start_container(container_id)
    assert caught.value.method == "StartContainer" and caught.value.code == StatusCode.UNKNOWN
    assert "not found" in str(caught.value)
    status = await status_of(env.client, container_id)
    assert (status.state, status.exit_code, status.reason) == (
        v1.ContainerState.CONTAINER_EXITED, 128, "StartError")
    assert status.message == 'exec: "nope": not found'


async def test_fail_create(env: Env) -> None:
    env.fake.script(pod="web", container="app", behaviour=ContainerScript(fail_create="boom"))
    pod = pod_config()
    sandbox_id = await env.client.run_pod_sandbox(pod)
    with pytest.raises(CRIUnknown, match="boom"):
        await env.client.create_container(sandbox_id, container_config(pod), pod)
    assert await env.client.list_containers() == []


async def test_stop_grace_and_kill(env: Env) -> None:
    env.fake.script(pod="web", container="slow",
                    behaviour=ContainerScript(term_grace=0.05, stop_exit_code=0))
    _, [slow, quick] = await start_pod(env.client, pod_config(), "slow", "quick")
    await env.client.stop_container(slow, timeout=1)
    assert (await status_of(env.client, slow)).reason == "Completed"
    await env.client.stop_container(quick, timeout=0)  # no grace: SIGKILL
    assert (await status_of(env.client, quick)).exit_code == 137
    await env.client.stop_container(quick, timeout=0)  # stopping twice is fine


async def test_remove_running_container_fails_like_containerd(env: Env) -> None:
    _, [container_id] = await start_pod(env.client, pod_config(), "app")
    with pytest.raises(CRIUnknown, match="still running"):
        await env.client.remove_container(container_id)
    await env.client.stop_container(container_id, timeout=0)
    await env.client.remove_container(container_id)
    await env.client.remove_container(container_id)  # already gone: not an error
    with pytest.raises(CRINotFound):
        await env.client.container_status(container_id)


async def test_a_burst_of_removals_answers_for_each_container_in_order(tmp_path: Path) -> None:
    seen: list[tuple[str, Any, Any, float]] = []
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock) as fake, \
            open_cri_client(str(sock), observer=lambda *call: seen.append(call)) as client:
        fake.add_image("busybox")
        _, [one, running, two] = await start_pod(client, pod_config(), "one", "running", "two")
        for stopped in (one, two):
            await client.stop_container(stopped, timeout=0)
        seen.clear()

        errors = await client.remove_containers([one, running, "gone", two], concurrency=2)

        assert [type(e) for e in errors] == [type(None), CRIUnknown, type(None), type(None)]
        assert "still running" in str(errors[1])
        assert [c.id for c in await client.list_containers()] == [running]
        burst = seen[:4]
        assert sorted(request.container_id for _, request, _, _ in burst) == sorted(
            [one, running, "gone", two])
        assert {method for method, *_ in burst} == {"RemoveContainer"}
        assert [type(answer) for _, request, answer, _ in burst
                if request.container_id == running] == [CRIUnknown]
        assert all(took >= 0 for *_, took in burst)
        assert await client.remove_containers([], concurrency=2) == []


async def test_sandboxes_and_images_go_in_bursts_too(env: Env) -> None:
    sandbox_id, _ = await start_pod(env.client, pod_config(), "app")
    await env.client.stop_pod_sandbox(sandbox_id)
    assert await env.client.remove_pod_sandboxes([sandbox_id], concurrency=2) == [None]
    assert await env.client.list_pod_sandbox() == [] and await env.client.list_containers() == []
    env.fake.add_image("nginx:1.25")
    assert await env.client.remove_images(["nginx:1.25", "busybox:latest"],
                                          concurrency=2) == [None, None]
    assert await env.client.list_images() == []


async def test_a_burst_against_a_missing_runtime_fails_each_call(tmp_path: Path) -> None:
    async with open_cri_client(f"unix://{tmp_path}/none.sock", timeout=1) as client:
        errors = await client.remove_containers(["a", "b"], concurrency=8)
        assert [type(e) for e in errors] == [CRIUnavailable, CRIUnavailable]
        assert "none.sock" in str(errors[0])
        await client.aclose()
        (closed,) = await client.remove_images(["busybox"], concurrency=8)
        assert isinstance(closed, CRIUnavailable) and "closed" in str(closed)


async def test_cancelling_a_burst_stops_it_and_the_client_goes_on(env: Env) -> None:
    _, ids = await start_pod(env.client, pod_config(), "one", "two")
    for container_id in ids:
        await env.client.stop_container(container_id, timeout=0)
    env.fake.set_delay("RemoveContainer", 10.0)
    start = trio.current_time()
    with trio.move_on_after(0.2) as scope:
        await env.client.remove_containers(ids, concurrency=2)
    assert scope.cancelled_caught
    assert trio.current_time() - start < 2
    env.fake.set_delay("RemoveContainer", 0)
    assert await env.client.remove_containers(ids, concurrency=2) == [None, None]
    assert await env.client.list_containers() == []


async def test_list_filters(env: Env) -> None:
    web, [app, _] = await start_pod(env.client, pod_config(), "app", "sidecar")
    db, [db_main] = await start_pod(env.client, pod_config("db", "uid-db"), "main")
    await env.client.stop_container(app, timeout=0)
    exited = v1.ContainerFilter(
        state=v1.ContainerStateValue(v1.ContainerState.CONTAINER_EXITED))
    assert [c.id for c in await env.client.list_containers(exited)] == [app]
    by_sandbox = await env.client.list_containers(v1.ContainerFilter(pod_sandbox_id=db))
    assert [c.id for c in by_sandbox] == [db_main]
    by_label = v1.ContainerFilter(label_selector={labels.CONTAINER_NAME: "sidecar"})
    assert len(await env.client.list_containers(by_label)) == 1
    assert [c.id for c in await env.client.list_containers(v1.ContainerFilter(id=app))] == [app]
    await env.client.stop_pod_sandbox(web)
    ready = v1.PodSandboxFilter(
        state=v1.PodSandboxStateValue(v1.PodSandboxState.SANDBOX_READY))
    assert [s.id for s in await env.client.list_pod_sandbox(ready)] == [db]
    by_app = v1.PodSandboxFilter(label_selector={"app": "web"})
    assert [s.id for s in await env.client.list_pod_sandbox(by_app)] == [web]


async def test_exec_sync_and_streaming_urls(env: Env) -> None:
    script = ContainerScript(exec_results={("cat", "/ready"): ExecResult(stdout=b"ok\n")},
                             default_exec=ExecResult(stderr=b"no such file", exit_code=1))
    env.fake.script(pod="web", container="app", behaviour=script)
    sandbox_id, [container_id] = await start_pod(env.client, pod_config(), "app")
    ok = await env.client.exec_sync(container_id, ["cat", "/ready"], timeout=1)
    assert (ok.stdout, ok.exit_code) == (b"ok\n", 0)
    other = await env.client.exec_sync(container_id, ["ls"], timeout=0)
    assert (other.stderr, other.exit_code) == (b"no such file", 1)
    assert (await env.client.exec(v1.ExecRequest(container_id=container_id, cmd=["sh"],
                                                 stdout=True))).startswith("http://")
    assert await env.client.attach(v1.AttachRequest(container_id=container_id, stdout=True))
    assert await env.client.port_forward(v1.PortForwardRequest(pod_sandbox_id=sandbox_id))
    env.fake.crash(container_id)
    with pytest.raises(CRIUnknown, match="CONTAINER_EXITED"):
        await env.client.exec_sync(container_id, ["ls"], timeout=1)


async def test_slow_exec_times_out_in_the_runtime(env: Env) -> None:
    slow = ContainerScript(default_exec=ExecResult(delay=5.0))
    env.fake.script(pod="web", container="app", behaviour=slow)
    _, [container_id] = await start_pod(env.client, pod_config(), "app")
    env.fake.calls.clear()
    with trio.fail_after(3):  # the fake waits the request's 1 s, not the command's 5 s
        with pytest.raises(CRIDeadlineExceeded):
            await env.client.exec_sync(container_id, ["probe"], timeout=1)


async def test_stats_and_resources(env: Env) -> None:
    sandbox_id, [container_id] = await start_pod(env.client, pod_config(), "app")
    env.fake.set_usage(container_id, cpu_ns=5_000, memory_bytes=1 << 20)
    stats = await env.client.container_stats(container_id)
    assert stats is not None and stats.memory is not None and stats.memory.working_set_bytes
    assert stats.memory.working_set_bytes.value == 1 << 20
    assert len(await env.client.list_container_stats()) == 1
    (brief,) = await env.client.list_container_stats_brief()
    assert brief.attributes.id == container_id
    assert brief.memory.working_set_bytes.value == 1 << 20
    assert brief.cpu.usage_core_nano_seconds.value == 5_000
    pod_stats = await env.client.pod_sandbox_stats(sandbox_id)
    assert pod_stats is not None and pod_stats.linux is not None
    assert pod_stats.linux.cpu is not None and pod_stats.linux.cpu.usage_core_nano_seconds
    assert pod_stats.linux.cpu.usage_core_nano_seconds.value == 5_000
    assert len(await env.client.list_pod_sandbox_stats()) == 1
    await env.client.update_container_resources(
        container_id, linux=v1.LinuxContainerResources(memory_limit_in_bytes=64 << 20))
    status = await status_of(env.client, container_id)
    assert status.resources is not None and status.resources.linux is not None
    assert status.resources.linux.memory_limit_in_bytes == 64 << 20


# -- images ------------------------------------------------------------------------------------


async def test_images(env: Env) -> None:
    client = env.client
    assert await client.image_status("nginx:1.25") is None
    pod = pod_config()
    sandbox_id = await client.run_pod_sandbox(pod)
    with pytest.raises(CRINotFound, match="nginx"):
        await client.create_container(sandbox_id, container_config(pod, image="nginx:1.25"), pod)
    image_ref = await client.pull_image("nginx:1.25")
    image = await client.image_status("docker.io/library/nginx:1.25")
    assert image is not None and image.id == image_ref
    assert image.repo_tags == ["docker.io/library/nginx:1.25"]
    assert {i.id for i in await client.list_images()} == {image_ref, env.fake.add_image("busybox")}
    env.fake.set_pullable("private/app:v1", False)
    with pytest.raises(CRIUnknown, match="failed to pull"):
        await client.pull_image("private/app:v1")
    env.fake.add_image("nginx:latest")  # a second tag of a different image
    await client.remove_image(image_ref)
    assert await client.image_status("nginx:1.25") is None
    await client.remove_image("nginx:1.25")  # absent: not an error
    info = await client.image_fs_info()
    assert info.image_filesystems[0].used_bytes is not None


def test_normalize_image_ref() -> None:
    assert normalize_image_ref("busybox") == "docker.io/library/busybox:latest"
    assert normalize_image_ref("me/app:1") == "docker.io/me/app:1"
    assert normalize_image_ref("localhost:5000/app") == "localhost:5000/app:latest"
    assert normalize_image_ref("quay.io/x/y@sha256:ab") == "quay.io/x/y@sha256:ab"


# -- faults ------------------------------------------------------------------------------------


async def test_unavailable_runtime(env: Env) -> None:
    env.fake.set_unavailable(True)
    with pytest.raises(CRIUnavailable) as caught:
        await env.client.version()
    assert caught.value.temporary
    env.fake.set_unavailable(False)
    assert (await env.client.version()).runtime_name == "fake"


async def test_missing_socket_is_unavailable(tmp_path: Path) -> None:
    async with open_cri_client(f"unix://{tmp_path}/none.sock", timeout=1) as client:
        with pytest.raises(CRIUnavailable, match=r"none\.sock"):
            await client.version()


async def test_deadline_exceeded(env: Env) -> None:
    env.fake.set_delay("Version", 2.0)
    with pytest.raises(CRIDeadlineExceeded) as caught:
        await env.client.version(call_timeout=0.2)
    assert caught.value.method == "Version"
    env.fake.set_delay("Version", 0)
    assert (await env.client.version()).runtime_name == "fake"


async def test_reconnect_after_runtime_restart(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    fake = FakeRuntime()
    fake.add_image("busybox")
    async with open_cri_client(f"unix://{sock}", timeout=2) as client:
        async with serve_fake_runtime(sock, fake):
            sandbox_id = await client.run_pod_sandbox(pod_config())
        with pytest.raises(CRIUnavailable):
            await client.list_pod_sandbox()
        async with serve_fake_runtime(sock, fake):  # containerd is back, state survived
            assert [s.id for s in await client.list_pod_sandbox()] == [sandbox_id]


async def test_cancellation_aborts_an_in_flight_call(env: Env) -> None:
    env.fake.set_delay("ListContainers", 10.0)
    start = trio.current_time()
    with trio.move_on_after(0.1) as scope:
        await env.client.list_containers()
    assert scope.cancelled_caught
    assert trio.current_time() - start < 2
    env.fake.set_delay("ListContainers", 0)
    assert await env.client.list_containers() == []


async def test_observer_sees_every_call(tmp_path: Path) -> None:
    seen: list[tuple[str, Any, Any, float]] = []
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock), \
            open_cri_client(str(sock), observer=lambda *call: seen.append(call)) as client:
        await client.version()
        with pytest.raises(CRINotFound):
            await client.container_status("missing")
    [(method, request, response, took), (method2, request2, error, _)] = seen
    assert (method, type(request), type(response)) == ("Version", v1.VersionRequest,
                                                       v1.VersionResponse)
    assert took >= 0
    assert (method2, request2.container_id, type(error)) == ("ContainerStatus", "missing",
                                                             CRINotFound)


async def test_errors_leave_the_client_block_unwrapped(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    with pytest.raises(CRINotFound):
        async with serve_fake_runtime(sock), open_cri_client(str(sock)) as client:
            await client.container_status("missing")


def test_fake_works_without_a_socket() -> None:
    fake = FakeRuntime(clock=ManualClock())
    fake.add_image("busybox")
    pod = pod_config()
    sandbox_id = fake.run_pod_sandbox(v1.RunPodSandboxRequest(config=pod)).pod_sandbox_id
    created = fake.create_container(v1.CreateContainerRequest(
        pod_sandbox_id=sandbox_id, config=container_config(pod), sandbox_config=pod))
    with pytest.raises(CRINotFound):
        fake.start_container(v1.StartContainerRequest(container_id="nope"))
    fake.start_container(v1.StartContainerRequest(container_id=created.container_id))
    assert len(fake.list_containers(v1.ListContainersRequest()).containers) == 1


def test_pod_ips_are_reused_only_once_free_as_host_local_does() -> None:
    fake = FakeRuntime(clock=ManualClock(), pod_network="10.64.1.0/24")

    def run(i: int) -> tuple[str, str]:
        request = v1.RunPodSandboxRequest(config=pod_config(f"p{i}", f"uid-{i}"))
        sandbox_id = fake.run_pod_sandbox(request).pod_sandbox_id
        status = fake.pod_sandbox_status(v1.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))
        assert status.status is not None and status.status.network is not None
        return sandbox_id, status.status.network.ip

    first = [run(i) for i in range(253)]
    assert [ip for _, ip in first] == [f"10.64.1.{n}" for n in range(2, 255)]
    with pytest.raises(CRIUnknown, match="no IP addresses available"):
        run(253)
    fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=first[100][0]))
    assert run(254)[1] == "10.64.1.102"  # the one free address, not the first one again
    for sandbox_id, _ in first[:3]:
        fake.remove_pod_sandbox(v1.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id))
    assert [run(i)[1] for i in (255, 256)] == ["10.64.1.2", "10.64.1.3"]  # round the range again


# -- inspect -----------------------------------------------------------------------------------


async def test_relist_groups_by_pod_newest_first(env: Env) -> None:
    client, clock = env.client, env.clock
    web = pod_config()
    web_sandbox, [first] = await start_pod(client, web, "app")
    env.fake.crash(first, exit_code=2)
    clock.advance(1)
    second = await client.create_container(
        web_sandbox, container_config(web, "app", attempt=1, spec_hash="h2"), web)
    clock.advance(1)
    db_sandbox, [db_main] = await start_pod(client, pod_config("db", "uid-db"), "main")
    stranger = v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="x", uid="x"))
    await client.run_pod_sandbox(stranger)  # no kubelet labels: ignored

    pods = await relist(client)
    assert set(pods) == {"uid-web", "uid-db"}
    web_status = pods["uid-web"]
    assert (web_status.name, web_status.namespace) == ("web", "default")
    assert [c.id for c in web_status.containers] == [second, first]
    newest = web_status.find("app")
    assert newest is not None
    assert (newest.state, newest.attempt, newest.spec_hash, newest.restart_count) == (
        ContainerState.CREATED, 1, "h2", 1)
    assert web_status.containers[1].state == ContainerState.EXITED
    assert web_status.containers[1].sandbox_id == web_sandbox
    assert web_status.sandboxes[0].state == SandboxState.READY
    assert web_status.sandboxes[0].created_at == T0
    db_status = pods["uid-db"]
    assert [s.id for s in db_status.sandboxes] == [db_sandbox]
    assert [c.id for c in db_status.containers] == [db_main]
    assert env.fake.calls["ListPodSandbox"] == 1 and env.fake.calls["ListContainers"] == 1
    assert env.fake.calls["ContainerStatus"] == 0


async def test_inspect_pod_adds_exit_details_and_network(env: Env) -> None:
    env.fake.script(pod="web", container="app",
                    behaviour=ContainerScript(exit_after=0.5, exit_code=3))
    sandbox_id, [app, _] = await start_pod(env.client, pod_config(), "app", "sidecar")
    env.clock.advance(1)
    status = await inspect_pod(env.client, "uid-web")
    app_status = status.find("app")
    assert app_status is not None and app_status.id == app
    assert (app_status.state, app_status.exit_code, app_status.reason) == (
        ContainerState.EXITED, 3, "Error")
    assert app_status.started_at == T0 and app_status.finished_at == T0 + 0.5
    assert app_status.image_ref.startswith("docker.io/library/busybox@sha256:")
    assert status.ip == "10.88.0.2" and status.sandboxes[0].id == sandbox_id
    assert not status.sandboxes[0].host_network

    host_pod = pod_config("node-agent", "uid-host", host_network=True)
    await start_pod(env.client, host_pod, "agent")
    host = await inspect_pod(env.client, "uid-host")
    assert host.sandboxes[0].host_network and host.ip == ""
    assert (await inspect_pod(env.client, "uid-unknown")).containers == ()


@asynccontextmanager
async def served_from_another_thread(fake: FakeRuntime, sock: Path) -> AsyncIterator[None]:
    """The benchmarks' way of serving the fake: a plain asyncio loop (in a child process
    there; a thread here)."""
    started, stop = threading.Event(), threading.Event()
    server = threading.Thread(target=serve_fake_runtime_on_asyncio, args=(fake, sock),
                              kwargs={"started": started.set, "done": stop.is_set})
    server.start()
    try:
        assert await trio.to_thread.run_sync(started.wait, 10)
        yield
    finally:
        stop.set()
        await trio.to_thread.run_sync(server.join, 10)
    assert not server.is_alive() and not sock.exists()


async def test_served_from_a_plain_asyncio_loop_in_another_thread(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    fake = FakeRuntime()
    fake.add_image("busybox:1.36")
    async with served_from_another_thread(fake, sock), \
            open_cri_client(f"unix://{sock}", timeout=5.0) as client:
        assert [i.repo_tags for i in await client.list_images()] == [
            ["docker.io/library/busybox:1.36"]]


# -- the container event stream (GetContainerEvents) ---------------------------------------------


def described(event: Any) -> tuple[str, str, str, list[str]]:
    """(type, object id, the carried sandbox's pod UID, the carried container ids)."""
    sandbox = event.pod_sandbox_status
    uid = sandbox.labels.get(labels.POD_UID, "") if event.HasField("pod_sandbox_status") else "-"
    kind = v1.ContainerEventType(event.container_event_type).name
    return (kind, event.container_id, uid, sorted(c.id for c in event.containers_statuses))


async def test_container_events_stream_like_containerd_2(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    fake = FakeRuntime(event_stream=True)
    fake.add_image("busybox")
    with trio.fail_after(10):
        async with serve_fake_runtime(sock, fake), \
                open_cri_client(str(sock), timeout=5) as client, \
                client.container_events() as events:
            await wait_for_streams(fake, 1)
            sandbox_id, [app] = await start_pod(client, pod_config(), "app")
            fake.crash(app)
            await client.remove_pod_sandbox(sandbox_id)
            seen = [described(await events.__anext__()) for _ in range(8)]
    # What containerd 2.4.2 sends for the same calls (tests/integration/test_pleg_containerd.py).
    uid = "uid-web"
    assert seen == [
        ("CONTAINER_CREATED_EVENT", sandbox_id, uid, []),
        ("CONTAINER_STARTED_EVENT", sandbox_id, uid, []),
        ("CONTAINER_CREATED_EVENT", app, uid, [app]),
        ("CONTAINER_STARTED_EVENT", app, uid, [app]),
        ("CONTAINER_STOPPED_EVENT", app, uid, [app]),
        ("CONTAINER_STOPPED_EVENT", sandbox_id, uid, [app]),
        ("CONTAINER_DELETED_EVENT", app, uid, []),
        ("CONTAINER_DELETED_EVENT", sandbox_id, uid, []),
    ]


async def test_in_process_messages_answer_as_the_wire_does() -> None:
    """Hollow nodes hand CRI messages over in-process (``wire=False``): the same calls get the
    same answers and events as through their encoding, without it (the runtime keeps the
    request's own config, the caller gets the runtime's reply)."""
    answers: dict[bool, list[Any]] = {}
    for wire in (True, False):
        clock = ManualClock()
        fake = FakeRuntime(clock, event_stream=True)
        fake.add_image("busybox")
        async with open_fake_runtime(fake, wire=wire) as (_, client), \
                client.container_events() as events:
            pod = pod_config()
            sandbox_id, [app] = await start_pod(client, pod, "app")
            clock.advance(1)
            fake.crash(app)
            kept = fake._sandboxes[sandbox_id].config
            assert (kept is pod) == (not wire)
            answers[wire] = [
                await client.pod_sandbox_status(sandbox_id),
                await status_of(client, app),
                [s.SerializeToString() for s in await client.list_pod_sandbox_brief()],
                [s.SerializeToString() for s in await client.list_containers_brief()],
                [described(await events.__anext__()) for _ in range(5)],
            ]
    assert answers[False] == answers[True]
    assert answers[True][1].exit_code == 1 and len(answers[True][4]) == 5


async def wait_for_streams(fake: FakeRuntime, count: int) -> None:
    """The server side of a stream is set up a moment after the client opened it."""
    with trio.fail_after(5):
        while fake.open_event_streams != count:
            await trio.sleep(0.01)


async def test_a_scripted_exit_is_sent_when_it_is_due(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    fake = FakeRuntime(event_stream=True)
    fake.add_image("busybox")
    fake.script("web", "app", ContainerScript(exit_after=0.3, exit_code=7))
    async with serve_fake_runtime(sock, fake), open_cri_client(str(sock), timeout=5) as client, \
            client.container_events() as events:
        await wait_for_streams(fake, 1)
        _, [app] = await start_pod(client, pod_config(), "app")
        started = trio.current_time()
        for _ in range(4):
            await events.__anext__()
        stopped = await events.__anext__()
        took = trio.current_time() - started
    assert described(stopped)[:2] == ("CONTAINER_STOPPED_EVENT", app)
    assert [c.exit_code for c in stopped.containers_statuses] == [7]
    assert 0.25 < took < 2.0


async def test_a_runtime_without_the_stream_answers_unimplemented(tmp_path: Path) -> None:
    seen: list[tuple[str, Any, Any, float]] = []
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock), \
            open_cri_client(str(sock), observer=lambda *call: seen.append(call)) as client:
        with pytest.raises(CRIUnimplemented):
            async with client.container_events() as events:
                await events.__anext__()
        assert (await client.version()).runtime_name == "fake"
    assert [(method, type(error)) for method, _, error, _ in seen] == [
        ("GetContainerEvents", CRIUnimplemented), ("Version", v1.VersionResponse)]


async def test_the_stream_breaks_when_the_runtime_goes_and_reopens_when_it_is_back(
    tmp_path: Path,
) -> None:
    sock = tmp_path / "cri.sock"
    fake = FakeRuntime(event_stream=True)
    fake.add_image("busybox")
    async with open_cri_client(str(sock), timeout=5) as client:
        with pytest.raises(CRIUnavailable):
            async with serve_fake_runtime(sock, fake), client.container_events() as events:
                await wait_for_streams(fake, 1)
                fake.drop_event_streams()
                await events.__anext__()
        with pytest.raises(CRIUnavailable):
            async with client.container_events() as events:
                await events.__anext__()  # nothing serves the socket
        async with serve_fake_runtime(sock, fake), client.container_events() as events:
            await wait_for_streams(fake, 1)
            sandbox_id = await client.run_pod_sandbox(pod_config())
            assert described(await events.__anext__())[:2] == ("CONTAINER_CREATED_EVENT",
                                                               sandbox_id)


async def test_leaving_the_block_ends_the_stream_on_both_sides(env: Env) -> None:
    env.fake.event_stream = True
    async with env.client.container_events():
        await wait_for_streams(env.fake, 1)
    await wait_for_streams(env.fake, 0)
    with trio.move_on_after(0.2) as scope:
        async with env.client.container_events() as events:
            await events.__anext__()  # no event comes: cancelled while waiting
    assert scope.cancelled_caught
    await wait_for_streams(env.fake, 0)
    assert (await env.client.version()).runtime_name == "fake"


async def test_events_from_a_plain_asyncio_loop_in_another_thread(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    fake = FakeRuntime(event_stream=True)
    fake.add_image("busybox")
    with trio.fail_after(10):
        async with served_from_another_thread(fake, sock), \
                open_cri_client(f"unix://{sock}", timeout=5.0) as client, \
                client.container_events() as events:
            await wait_for_streams(fake, 1)  # (a read of the other thread's list length)
            sandbox_id = await client.run_pod_sandbox(pod_config())
            assert described(await events.__anext__())[:2] == ("CONTAINER_CREATED_EVENT",
                                                               sandbox_id)
