"""reconcile.workers: one pod's syncs against the fake runtime, driven through a SyncLoop.

Time is trio's MockClock with autojump, and the fake runtime reads the same clock
(through TrioWallClock), so crash-loop and retry delays pass instantly and exactly.
Pods are woken by the events a PLEG would send, fed by hand.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from tests.unit.test_kube_events_workers import Reported
from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import Connection
from trio_kubelet.apiserver.object_cache import ObjectCache, PodObjects
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.core.hashing import container_hash
from trio_kubelet.events import Event, PodLifecycleEvent, PodSetUpdate, RelistDone, ResyncTick
from trio_kubelet.images.manager import ImageManager
from trio_kubelet.model.pod import ContainerStatus, Pod
from trio_kubelet.reconcile.loop import SyncLoop
from trio_kubelet.reconcile.start_order import PER_CPU, SLOW, StartOrder
from trio_kubelet.reconcile.workers import SYNC_ERROR_RETRY, WorkerContext
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import ContainerScript, FakeRuntime, open_fake_runtime
from trio_kubelet.status.store import PodStatusStore
from trio_kubelet.volumes import VolumeManager

T0 = 1_700_000_000.0
UID = "3b7e9a10-4444-4000-8000-000000000001"
UID_B = "3b7e9a10-4444-4000-8000-000000000002"
IMAGE = "busybox:1.36"
NODE_IP = "192.168.1.10"


@dataclass
class Node:
    """The fake runtime, one SyncLoop on it, and the channel the sources would write to."""

    fake: FakeRuntime
    store: PodStatusStore
    loop: SyncLoop
    send: trio.MemorySendChannel[Event]
    logs: Path

    async def run_pods(self, *pods: Pod) -> None:
        await self.send.send(PodSetUpdate(source="file", pods=list(pods)))

    async def report(self, uid: str) -> None:
        """What a PLEG relist sends when the pod's newest container exited."""
        newest = containers(self.fake, uid)[-1]
        await self.send.send(PodLifecycleEvent(pod_uid=uid, type="ContainerDied",
                                               container_id=newest.id))

    async def wait_for(self, uid: str, predicate: Callable[[Pod], bool],
                       timeout: float = 60.0) -> Pod:
        with trio.move_on_after(timeout):  # virtual seconds
            while True:
                pod = self.store.get(uid)
                if pod is not None and predicate(pod):
                    return pod
                await self.store.wait_changed()
        pod = self.store.get(uid)
        raise AssertionError(
            "pod did not reach the expected state; last status: "
            + (pod.status.model_dump_json(by_alias=True, exclude_none=True) if pod else "absent"))


@asynccontextmanager
async def fake_node(tmp_path: Path, **shared: Any) -> AsyncIterator[Node]:
    """``shared``: more of the workers' context (the object caches, the volume manager)."""
    wall = TrioWallClock(epoch=T0)
    async with open_fake_runtime(clock=wall.now, timeout=5.0) as (fake, client):
        fake.add_image(IMAGE)
        store = PodStatusStore()
        ctx = WorkerContext(client=client, images=ImageManager(client), store=store,
                            clock=wall, pod_logs_dir=tmp_path / "logs", node_ip=NODE_IP,
                            **shared)
        loop = SyncLoop(ctx, ["file"])
        send, receive = trio.open_memory_channel[Event](math.inf)
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run, receive)
            yield Node(fake, store, loop, send, tmp_path / "logs")
            nursery.cancel_scope.cancel()


def make_pod(*, policy: str = "Always", containers: list[dict[str, Any]] | None = None,
             init: list[dict[str, Any]] | None = None, name: str = "web", uid: str = UID,
             volumes: list[dict[str, Any]] | None = None) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": name, "namespace": "default", "uid": uid,
                     "labels": {"app": name}, "annotations": {"team": "a"}},
        "spec": {
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 5,
            "initContainers": init or [],
            "containers": containers or [{"name": "main", "image": IMAGE}],
            "volumes": volumes or [],
        },
    })


def containers(fake: FakeRuntime, uid: str) -> list[v1.Container]:
    """The pod's containers on the fake, oldest first (read directly, not through the API)."""
    listed = fake.list_containers(v1.ListContainersRequest()).containers
    return sorted((c for c in listed if c.labels.get(labels.POD_UID) == uid),
                  key=lambda c: c.created_at)


def name_of(container: v1.Container) -> str:
    return container.labels[labels.CONTAINER_NAME]


def sandboxes(fake: FakeRuntime, uid: str) -> list[v1.PodSandbox]:
    listed = fake.list_pod_sandbox(v1.ListPodSandboxRequest()).items
    return [s for s in listed if s.labels.get(labels.POD_UID) == uid]


def status(pod: Pod, name: str = "main") -> ContainerStatus:
    return next(s for s in (*pod.status.init_container_statuses, *pod.status.container_statuses)
                if s.name == name)


def running(pod: Pod, name: str = "main", restarts: int = 0) -> bool:
    s = status(pod, name)
    return s.state.running is not None and s.restart_count == restarts


def waiting_reason(pod: Pod, name: str = "main") -> str | None:
    waiting = status(pod, name).state.waiting
    return waiting.reason if waiting is not None else None


def reported(pod: Pod) -> bool:
    """A waiting reason from a sync's outcome (not the first ContainerCreating)."""
    return waiting_reason(pod) not in (None, "ContainerCreating")


def waiting_message(pod: Pod, name: str = "main") -> str:
    waiting = status(pod, name).state.waiting
    assert waiting is not None and waiting.message is not None, status(pod, name)
    return str(waiting.message)


# -- creating a pod ----------------------------------------------------------------------------


async def test_new_pod_gets_one_sandbox_and_its_containers(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    pod = make_pod(containers=[{"name": "main", "image": IMAGE},
                               {"name": "helper", "image": IMAGE, "command": ["sleep", "1d"]}])
    async with fake_node(tmp_path) as node:
        await node.run_pods(pod)
        seen = await node.wait_for(UID, lambda p: running(p, "main") and running(p, "helper"))

        [sandbox] = sandboxes(node.fake, UID)
        assert sandbox.state == v1.PodSandboxState.SANDBOX_READY
        assert sandbox.labels == {"app": "web", labels.POD_UID: UID, labels.POD_NAME: "web",
                                  labels.POD_NAMESPACE: "default",
                                  labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
        assert sandbox.annotations == {"team": "a"}
        created = containers(node.fake, UID)
        assert sorted(name_of(c) for c in created) == ["helper", "main"]
        for c in created:
            spec = next(s for s in pod.spec.containers if s.name == name_of(c))
            assert c.state == v1.ContainerState.CONTAINER_RUNNING
            assert c.pod_sandbox_id == sandbox.id
            assert c.labels[labels.CONTAINER_NAME] == spec.name
            assert c.annotations[labels.CONTAINER_HASH] == container_hash(spec)
            assert c.annotations[labels.RESTART_COUNT] == "0"
            assert c.annotations[labels.CONTAINER_TYPE] == "regular"
            assert c.annotations[labels.TERMINATION_GRACE] == "5"
            assert (node.logs / f"default_web_{UID}" / spec.name).is_dir()
        assert node.fake.calls["RunPodSandbox"] == 1
        assert node.fake.calls["CreateContainer"] == node.fake.calls["StartContainer"] == 2

        assert seen.status.phase == "Running"
        assert (seen.status.pod_ip, seen.status.host_ip) == ("10.88.0.2", NODE_IP)
        assert all(s.ready for s in seen.status.container_statuses)
        ids = {name_of(c): f"containerd://{c.id}" for c in created}
        assert {s.name: s.container_id for s in seen.status.container_statuses} == ids


async def test_a_pod_the_runtime_cannot_hold_starts_without_listing_the_runtime(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Once the runtime was listed (a relist's RelistDone) and never showed the UID, the
    first sync starts the pod without a look, and the look after its start asks only about
    what it made: the sandbox once (for its IPs), each new container once."""
    pod = make_pod(containers=[{"name": "main", "image": IMAGE},
                               {"name": "helper", "image": IMAGE, "command": ["sleep", "1d"]}])
    async with fake_node(tmp_path) as node:
        await node.send.send(RelistDone(ok=True))
        await node.run_pods(pod)
        seen = await node.wait_for(UID, lambda p: running(p, "main") and running(p, "helper"))

        calls = node.fake.calls
        assert calls["ListPodSandbox"] == calls["ListContainers"] == 0
        assert calls["PodSandboxStatus"] == 1
        assert calls["ContainerStatus"] == 2
        ids = {name_of(c): f"containerd://{c.id}" for c in containers(node.fake, UID)}
        assert {s.name: s.container_id for s in seen.status.container_statuses} == ids
        assert seen.status.pod_ip == "10.88.0.2"
        assert all(s.state.running is not None and s.state.running.started_at
                   for s in seen.status.container_statuses)


@pytest.mark.parametrize("told", ["before the relist", "no relist"])
async def test_a_pod_the_runtime_may_hold_is_inspected_first(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, told: str
) -> None:
    """A UID the runtime showed while no worker had it (a restarted agent's pod, reported
    before its source), or any UID before the runtime was listed, gets the full look."""
    async with fake_node(tmp_path) as node:
        if told == "before the relist":
            await node.send.send(PodLifecycleEvent(pod_uid=UID, type="ContainerStarted",
                                                   container_id="old"))
            await node.send.send(RelistDone(ok=True))
        await node.run_pods(make_pod())
        await node.wait_for(UID, running)
        assert node.fake.calls["ListPodSandbox"] == node.fake.calls["ListContainers"] == 1


async def test_init_container_completes_before_the_regular_containers_start(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    pod = make_pod(init=[{"name": "setup", "image": IMAGE}])
    async with fake_node(tmp_path) as node:
        node.fake.script("web", "setup", ContainerScript(exit_after=0.5))
        await node.run_pods(pod)
        initializing = await node.wait_for(UID, lambda p: running(p, "setup"))
        assert initializing.status.phase == "Pending"
        assert waiting_reason(initializing) == "PodInitializing"
        [setup] = containers(node.fake, UID)
        assert setup.annotations[labels.CONTAINER_TYPE] == "init"

        await trio.sleep(1)
        await node.report(UID)
        started = await node.wait_for(UID, running)
        setup_done = status(started, "setup").state.terminated
        assert setup_done is not None and setup_done.reason == "Completed"
        assert [name_of(c) for c in containers(node.fake, UID)] == ["setup", "main"]


# -- restarts and crash loops ------------------------------------------------------------------


async def test_always_restarts_an_exited_container_with_the_next_restart_count(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script("web", "main", ContainerScript(exit_after=1, exit_code=0))
        await node.run_pods(make_pod())
        await node.wait_for(UID, running)
        await trio.sleep(2)
        await node.report(UID)
        lists = node.fake.calls["ListContainers"]
        restarted = await node.wait_for(UID, lambda p: running(p, restarts=1))
        # The restart looked at the pod once, before it; after it, only at the new container.
        assert node.fake.calls["ListContainers"] == lists + 1

        first, second = containers(node.fake, UID)
        assert first.state == v1.ContainerState.CONTAINER_EXITED
        assert second.annotations[labels.RESTART_COUNT] == "1"
        assert second.metadata is not None and second.metadata.attempt == 1
        assert len(sandboxes(node.fake, UID)) == 1, "a container restart keeps the sandbox"
        last = status(restarted).last_state.terminated
        assert last is not None and (last.exit_code, last.reason) == (0, "Completed")


async def test_second_exit_is_crash_loop_back_off_then_restarts_after_the_delay(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script("web", "main", ContainerScript(exit_after=1, exit_code=1))
        start = trio.current_time()
        await node.run_pods(make_pod())
        await node.wait_for(UID, running)
        await trio.sleep(2)  # exited at 1 s
        await node.report(UID)
        await node.wait_for(UID, lambda p: running(p, restarts=1))  # first restart: immediate

        await trio.sleep(2)  # the restarted instance exited at 3 s
        await node.report(UID)
        backing_off = await node.wait_for(UID, reported)
        main = status(backing_off)
        assert main.state.waiting is not None
        assert main.state.waiting.reason == "CrashLoopBackOff"
        assert main.state.waiting.message == (
            f"back-off 10s restarting failed container=main pod=web_default({UID})")
        assert main.restart_count == 1
        assert main.last_state.terminated is not None
        assert (main.last_state.terminated.exit_code, main.last_state.terminated.reason) == (
            1, "Error")
        assert len(containers(node.fake, UID)) == 2

        # No further event: the worker requeues itself for the end of the 10 s back-off.
        await node.wait_for(UID, lambda p: running(p, restarts=2))
        assert trio.current_time() - start == pytest.approx(13.0, abs=0.01)

        await trio.sleep(2)  # exited again: the delay doubles
        await node.report(UID)
        again = await node.wait_for(UID, lambda p: waiting_reason(p) == "CrashLoopBackOff")
        assert waiting_message(again).startswith("back-off 20s ")


@pytest.mark.parametrize(("exit_code", "phase"), [(0, "Succeeded"), (1, "Failed")])
async def test_never_pod_finishes_and_its_sandbox_is_stopped(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, exit_code: int, phase: str
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script("web", "main", ContainerScript(exit_after=1, exit_code=exit_code))
        await node.run_pods(make_pod(policy="Never"))
        await node.wait_for(UID, running)
        await trio.sleep(2)
        await node.report(UID)
        done = await node.wait_for(UID, lambda p: p.status.phase == phase)
        terminated = status(done).state.terminated
        assert terminated is not None and terminated.exit_code == exit_code

        # The status is published before the sync acts (as in Go); the stop follows.
        with trio.fail_after(5):
            while sandboxes(node.fake, UID)[0].state != v1.PodSandboxState.SANDBOX_NOTREADY:
                await trio.sleep(0.1)
        assert len(sandboxes(node.fake, UID)) == 1
        # Later wake-ups start nothing again: no new sandbox, no new container.
        await node.send.send(ResyncTick())
        await node.report(UID)
        await trio.sleep(30)
        assert node.fake.calls["RunPodSandbox"] == 1
        assert len(containers(node.fake, UID)) == 1
        final = node.store.get(UID)
        assert final is not None and final.status.phase == phase


# -- start failures ----------------------------------------------------------------------------


async def test_missing_image_with_never_is_err_image_never_pull_until_it_appears(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    image = "registry.local/app:v2"
    pod = make_pod(containers=[{"name": "main", "image": image, "imagePullPolicy": "Never"}])
    async with fake_node(tmp_path) as node:
        start = trio.current_time()
        await node.run_pods(pod)
        failed = await node.wait_for(UID, reported)
        assert waiting_reason(failed) == "ErrImageNeverPull"
        assert waiting_message(failed) == (
            f'Container image "{image}" is not present with pull policy of Never')
        assert failed.status.phase == "Pending"
        assert node.fake.calls["PullImage"] == 0
        assert len(sandboxes(node.fake, UID)) == 1 and containers(node.fake, UID) == []

        node.fake.add_image(image)  # e.g. loaded by an operator; the retry picks it up
        await node.wait_for(UID, running)
        assert trio.current_time() - start == pytest.approx(SYNC_ERROR_RETRY, abs=0.01)
        assert node.fake.calls["PullImage"] == 0


async def test_pull_failure_is_err_image_pull_then_image_pull_back_off(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    image = "registry.local/app:v2"
    pod = make_pod(containers=[{"name": "main", "image": image}])
    async with fake_node(tmp_path) as node:
        node.fake.set_pullable(image, False)
        await node.run_pods(pod)
        failed = await node.wait_for(UID, reported)
        assert waiting_reason(failed) == "ErrImagePull"
        assert waiting_message(failed).startswith(f'Failed to pull image "{image}": ')

        await trio.sleep(1)
        node.loop.workers[UID].wake()  # a sync inside the backoff window
        backing_off = await node.wait_for(UID, lambda p: waiting_reason(p) == "ImagePullBackOff")
        assert waiting_message(backing_off) == f'Back-off pulling image "{image}"'
        assert node.fake.calls["PullImage"] == 1

        node.fake.set_pullable(image, True)
        await node.wait_for(UID, running)  # the worker's own retry, after the window
        assert node.fake.calls["PullImage"] == 2


async def test_create_failure_is_create_container_error(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script("web", "main", ContainerScript(fail_create="mount /data: no such file"))
        await node.run_pods(make_pod())
        failed = await node.wait_for(UID, reported)
        assert waiting_reason(failed) == "CreateContainerError"
        assert waiting_message(failed) == "mount /data: no such file"
        assert containers(node.fake, UID) == []

        creates = node.fake.calls["CreateContainer"]
        node.fake.script("web", "main", ContainerScript())
        await node.wait_for(UID, running)  # retried without any event
        assert node.fake.calls["CreateContainer"] == creates + 1


async def test_start_failure_is_run_container_error(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script("web", "main",
                         ContainerScript(fail_start='exec: "serve": executable file not found'))
        await node.run_pods(make_pod())
        failed = await node.wait_for(UID, reported)
        main = status(failed)
        assert waiting_reason(failed) == "RunContainerError"
        assert 'exec: "serve": executable file not found' in waiting_message(failed)
        assert main.last_state.terminated is not None
        assert (main.last_state.terminated.exit_code, main.last_state.terminated.reason) == (
            128, "StartError")
        [instance] = containers(node.fake, UID)
        assert instance.state == v1.ContainerState.CONTAINER_EXITED


async def _hold_starts(order: StartOrder, count: int, release: trio.Event,
                       task_status: trio.TaskStatus[None]) -> None:
    """``count`` pod starts in flight on ``order`` until ``release``."""
    async def hold(task_status: trio.TaskStatus[None]) -> None:
        async with order.pod_start():
            task_status.started()
            await release.wait()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            await nursery.start(hold)
        task_status.started()


async def test_a_pod_start_waits_for_its_turn_and_a_teardown_does_not(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    order, release = StartOrder(cpus=1), trio.Event()
    async with fake_node(tmp_path, start_order=order) as node, trio.open_nursery() as nursery:
        await node.run_pods(make_pod(name="early", uid=UID_B))
        await node.wait_for(UID_B, running)
        await nursery.start(_hold_starts, order, PER_CPU, release)
        await node.run_pods(make_pod(name="early", uid=UID_B), make_pod())
        await trio.sleep(1.0)  # the runtime gets nothing of the new pod while the order is full
        assert not sandboxes(node.fake, UID)
        await node.run_pods(make_pod())  # the running pod goes: its kill does not queue
        with trio.fail_after(SLOW / 2):
            while sandboxes(node.fake, UID_B):
                await trio.sleep(0.1)
        release.set()
        with trio.fail_after(1.0):
            await node.wait_for(UID, running)


async def test_sandbox_failure_is_reported_on_every_container(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.fail_sandbox("web", "failed to setup network for sandbox: cni not ready")
        await node.run_pods(make_pod())
        failed = await node.wait_for(UID, reported)
        assert waiting_reason(failed) == "CreatePodSandboxError"
        assert "cni not ready" in waiting_message(failed)

        node.fake.fail_sandbox("web", None)
        await node.wait_for(UID, running)
        assert len(sandboxes(node.fake, UID)) == 1


async def test_pull_backoff_of_one_pod_does_not_hold_back_another(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    image = "registry.local/app:v2"
    first = make_pod(containers=[{"name": "main", "image": image}])
    other_uid = "3b7e9a10-4444-4000-8000-000000000002"
    second = make_pod(containers=[{"name": "main", "image": image}], name="api", uid=other_uid)
    async with fake_node(tmp_path) as node:
        node.fake.set_pullable(image, False)
        await node.run_pods(first)
        await node.wait_for(UID, lambda p: waiting_reason(p) == "ErrImagePull")
        await trio.sleep(1)
        await node.run_pods(first, second)
        failed = await node.wait_for(other_uid, reported)
        assert waiting_reason(failed) == "ErrImagePull"
        assert node.fake.calls["PullImage"] == 2


def test_restart_count_from_logs_resumes_after_the_highest_log(tmp_path: Path) -> None:
    from trio_kubelet.reconcile.workers import restart_count_from_logs

    assert restart_count_from_logs(tmp_path / "missing") == 0
    for name in ("0.log", "1.log", "4.log", "notes.txt", "x.log"):
        (tmp_path / name).write_text("")
    assert restart_count_from_logs(tmp_path) == 5


# -- what the pod refers to ------------------------------------------------------------------


class SlowConfigMaps:
    """An API server whose single-object ConfigMap lists answer after ``delay`` (virtual)
    seconds: "cfg" exists, nothing else does. Watches stay open and silent."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if "watch" in request.url.params:
            return httpx.Response(200, content=self._silence())
        await trio.sleep(self.delay)
        name = request.url.params["fieldSelector"].removeprefix("metadata.name=")
        meta = {"name": name, "namespace": "default", "resourceVersion": "5"}
        items = [{"metadata": meta, "data": {"k": "v"}}] if name == "cfg" else []
        return httpx.Response(200, json={"metadata": {"resourceVersion": "5"}, "items": items})

    async def _silence(self) -> AsyncIterator[bytes]:
        await trio.sleep_forever()
        yield b""  # never reached: makes this an async generator


async def test_a_pod_waits_for_the_objects_it_refers_to_and_starts_when_they_are_listed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Not a FailedMount and a 10 s retry: the worker waits for the cache's first answer
    (3 s here) and is woken by it; an object that does not exist is then Go's error.

    (How soon is the bench's to say, bench_volume_start.py.)"""
    # The volume manager writes in a thread, which trio cannot see: without a threshold the
    # clock would jump over every deadline (the retries, this test's own) while it writes.
    autojump_clock.autojump_threshold = 0.2
    http = APIClient(Connection(server="http://api.test", ssl_context=None, token=None),
                     transport=httpx.MockTransport(SlowConfigMaps(delay=3.0).handle))
    config_maps, secrets = ObjectCache(http, "configmaps"), ObjectCache(http, "secrets")
    mounted = [{"name": "main", "image": IMAGE,
                "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]
    pod = make_pod(containers=mounted, volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}])
    lost = make_pod(name="lost", uid=UID_B, containers=mounted,
                    volumes=[{"name": "cfg", "configMap": {"name": "absent"}}])
    events = Reported()
    volumes = VolumeManager(tmp_path / "pods", events)
    async with trio.open_nursery() as caches:
        await caches.start(config_maps.run)
        await caches.start(secrets.run)
        async with fake_node(tmp_path, objects=PodObjects(config_maps, secrets),
                             volumes=volumes) as node:
            for cache in (config_maps, secrets):  # as the API pod source does
                cache.register_pod(pod)
                cache.register_pod(lost)
            start = trio.current_time()
            await node.run_pods(pod, lost)
            await node.wait_for(UID, running)
            assert trio.current_time() - start >= 3  # not before the answer
            await trio.sleep(1)
            assert node.fake.calls["RunPodSandbox"] == 1  # the lost pod has none
            # The lost pod's set-up is retried (10 s), always with this; never "not listed".
            assert {seen[1:] for seen in events.seen} == {
                ("Warning", "FailedMount",
                 'MountVolume.SetUp failed for volume "cfg" : configmap "absent" not found')}
            assert (tmp_path / "pods" / UID / "volumes" / "kubernetes.io~configmap" / "cfg"
                    / "k").read_text() == "v"
        caches.cancel_scope.cancel()


# -- activeDeadlineSeconds ---------------------------------------------------------------------


def with_deadline(pod: Pod, seconds: int | None) -> Pod:
    pod = pod.model_copy(deep=True)
    pod.spec.active_deadline_seconds = seconds
    return pod


async def test_a_pod_past_its_active_deadline_is_killed_and_fails_deadline_exceeded(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        await node.run_pods(with_deadline(make_pod(), 30))
        started = await node.wait_for(UID, running)
        assert started.status.phase == "Running"
        begun = trio.current_time()
        # No event wakes the worker: it wakes itself at the deadline.
        done = await node.wait_for(UID, lambda p: p.status.phase == "Failed", timeout=120)
        assert 29 <= trio.current_time() - begun <= 31
        assert (done.status.reason, done.status.message) == (
            "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
        )
        assert not any(c.type == "DisruptionTarget" for c in done.status.conditions)
        with trio.fail_after(30):
            while any(c.state == v1.ContainerState.CONTAINER_RUNNING
                      for c in containers(node.fake, UID)):
                await trio.sleep(0.1)
        await trio.sleep(60)  # and it is never started again
        assert len(containers(node.fake, UID)) == 1
        final = node.store.get(UID)
        assert final is not None and final.status.reason == "DeadlineExceeded"


async def test_an_active_deadline_set_on_a_running_pod_applies_from_its_start(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        await node.run_pods(make_pod())
        await node.wait_for(UID, running)
        await trio.sleep(60)
        # As the spec "Pods should allow activeDeadlineSeconds to be updated": the update
        # arrives long after the start, so the pod is past it at once.
        await node.run_pods(with_deadline(make_pod(), 5))
        with trio.fail_after(10):
            done = await node.wait_for(UID, lambda p: p.status.phase == "Failed")
        assert done.status.reason == "DeadlineExceeded"
