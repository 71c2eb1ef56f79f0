"""The events pod workers and the image manager report, with the Go kubelet's reasons and
wording, against the fake runtime (MockClock with autojump)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio.testing

from trio_kubelet.clock import TrioWallClock
from trio_kubelet.events import Event, PodLifecycleEvent, PodSetUpdate
from trio_kubelet.images.manager import ImageManager
from trio_kubelet.kube_events import EventRecorder, EventType, ObjectRef
from trio_kubelet.model.pod import Pod
from trio_kubelet.reconcile.loop import SyncLoop
from trio_kubelet.reconcile.workers import WorkerContext
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import ContainerScript, FakeRuntime, open_fake_runtime
from trio_kubelet.status.store import PodStatusStore

T0 = 1_700_000_000.0
UID = "8a2c4e60-3333-4000-8000-000000000001"
IMAGE = "busybox:1.36"
MAIN = "spec.containers{main}"


class Reported(EventRecorder):
    """Keeps what was reported: (fieldPath, type, reason, message)."""

    def __init__(self) -> None:
        super().__init__("node-a")
        self.seen: list[tuple[str, EventType, str, str]] = []

    def event(self, ref: ObjectRef, type: EventType, reason: str, message: str, *,
              logged: bool = False) -> None:
        self.seen.append((ref.field_path, type, reason, message))


@dataclass
class Node:
    fake: FakeRuntime
    store: PodStatusStore
    loop: SyncLoop
    send: trio.MemorySendChannel[Event]
    events: Reported = field(default_factory=Reported)

    async def wait_for(self, predicate: Callable[[list[tuple[str, EventType, str, str]]], bool]
                       ) -> None:
        with trio.fail_after(60):  # virtual seconds
            while not predicate(self.events.seen):
                await trio.sleep(0.1)

    async def wait_reason(self, reason: str) -> None:
        await self.wait_for(lambda seen: any(e[2] == reason for e in seen))

    def newest_container(self) -> v1.Container:
        listed = self.fake.list_containers(v1.ListContainersRequest()).containers
        return max(listed, key=lambda c: c.created_at)


@asynccontextmanager
async def fake_node(tmp_path: Path, logs: Path | None = None) -> AsyncIterator[Node]:
    wall = TrioWallClock(epoch=T0)
    events = Reported()
    async with open_fake_runtime(clock=wall.now, timeout=5.0) as (fake, client):
        store = PodStatusStore()
        ctx = WorkerContext(client=client, images=ImageManager(client, events), store=store,
                            clock=wall, pod_logs_dir=logs or tmp_path / "logs", events=events)
        loop = SyncLoop(ctx, ["file"])
        send, receive = trio.open_memory_channel[Event](math.inf)
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run, receive)
            yield Node(fake, store, loop, send, events)
            nursery.cancel_scope.cancel()


def make_pod(image: str = IMAGE) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "main", "image": image}]},
    })


async def test_a_started_pod_reports_pulled_created_started(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.add_image(IMAGE)
        await node.send.send(PodSetUpdate(source="file", pods=[make_pod()]))
        await node.wait_reason("Started")
        assert node.events.seen == [
            (MAIN, "Normal", "Pulled", f'Container image "{IMAGE}" already present on machine'),
            (MAIN, "Normal", "Created", "Created container: main"),
            (MAIN, "Normal", "Started", "Started container main"),
        ]

        await node.send.send(PodSetUpdate(source="file", pods=[]))
        await node.wait_reason("Killing")
        assert node.events.seen[-1] == (MAIN, "Normal", "Killing", "Stopping container main")


async def test_a_failed_pull_reports_the_failure_then_back_off_then_the_pull(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    image = "registry.local/app:v2"
    async with fake_node(tmp_path) as node:
        node.fake.set_pullable(image, False)
        await node.send.send(PodSetUpdate(source="file", pods=[make_pod(image)]))
        await node.wait_for(lambda seen: len(seen) == 3)
        pulling, failed, error = node.events.seen
        assert pulling == (MAIN, "Normal", "Pulling", f'Pulling image "{image}"')
        assert failed[:3] == (MAIN, "Warning", "Failed")
        assert failed[3].startswith(f'Failed to pull image "{image}": ')
        assert error == (MAIN, "Warning", "Failed", "Error: ErrImagePull")

        await trio.sleep(1)
        node.loop.workers[UID].wake()  # a sync inside the pull backoff
        await node.wait_reason("BackOff")
        assert node.events.seen[3:] == [
            (MAIN, "Normal", "BackOff", f'Back-off pulling image "{image}"'),
            (MAIN, "Warning", "Failed", "Error: ImagePullBackOff"),
        ]

        node.fake.set_pullable(image, True)
        await node.wait_reason("Started")
        pulled = next(e for e in node.events.seen[5:] if e[2] == "Pulled")
        assert pulled[3] == (f'Successfully pulled image "{image}" in 0s (0s including '
                             "waiting). Image size: 1000000 bytes.")


async def test_a_crash_looping_container_reports_back_off(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.add_image(IMAGE)
        node.fake.script("web", "main", ContainerScript(exit_after=1, exit_code=1))
        await node.send.send(PodSetUpdate(source="file", pods=[make_pod()]))
        for starts in (1, 2):  # the first restart is immediate, the second backs off
            await node.wait_for(lambda seen, n=starts: [e[2] for e in seen].count("Started") == n)
            await trio.sleep(2)
            died = node.newest_container().id
            await node.send.send(PodLifecycleEvent(pod_uid=UID, type="ContainerDied",
                                                   container_id=died))
        await node.wait_reason("BackOff")
        assert node.events.seen[-1] == (
            MAIN, "Warning", "BackOff",
            f"Back-off restarting failed container main in pod web_default({UID})")


async def test_create_and_start_failures_report_failed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.add_image(IMAGE)
        node.fake.script("web", "main", ContainerScript(fail_create="mount /data: no such file"))
        await node.send.send(PodSetUpdate(source="file", pods=[make_pod()]))
        await node.wait_reason("Failed")
        assert node.events.seen[-1] == (MAIN, "Warning", "Failed",
                                         "Error: mount /data: no such file")

        node.fake.script("web", "main", ContainerScript(fail_start="exec: not found"))
        await node.wait_reason("Created")
        await node.wait_for(lambda seen: seen[-1][2] == "Failed")
        created, failed = node.events.seen[-2:]
        assert created == (MAIN, "Normal", "Created", "Created container: main")
        assert failed[:3] == (MAIN, "Warning", "Failed")
        assert failed[3].startswith("Error: ") and failed[3].endswith("exec: not found")


async def test_sandbox_failures_and_changes_are_reported_on_the_pod(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.add_image(IMAGE)
        node.fake.fail_sandbox("web", "cni not ready")
        await node.send.send(PodSetUpdate(source="file", pods=[make_pod()]))
        await node.wait_reason("FailedCreatePodSandBox")
        [(path, kind, _, message)] = node.events.seen
        assert (path, kind) == ("", "Warning")
        assert message.startswith("Failed to create pod sandbox: ") and "cni not ready" in message

        node.fake.fail_sandbox("web", None)
        await node.wait_reason("Started")
        [sandbox] = [s for s in node.fake.list_pod_sandbox(v1.ListPodSandboxRequest()).items
                     if s.labels.get(labels.POD_UID) == UID]
        node.fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=sandbox.id))
        node.loop.workers[UID].wake()
        await node.wait_reason("SandboxChanged")
        assert ("", "Normal", "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.") in node.events.seen


async def test_a_pod_logs_directory_that_cannot_be_made_fails_the_sandbox(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.write_text("not a directory")  # as root, a mode would not stop the agent: a file does
    async with fake_node(tmp_path, logs) as node:
        node.fake.add_image(IMAGE)
        await node.send.send(PodSetUpdate(source="file", pods=[make_pod()]))
        await node.wait_reason("FailedCreatePodSandBox")
        message = f"Failed to create pod sandbox: mkdir {logs}/default_web_{UID}: Not a directory"
        assert node.events.seen == [("", "Warning", "FailedCreatePodSandBox", message)]
        pod = node.store.get(UID)
        assert pod is not None
        waiting = pod.status.container_statuses[0].state.waiting
        assert waiting is not None and waiting.reason == "CreatePodSandboxError"
        assert waiting.message == f"mkdir {logs}/default_web_{UID}: Not a directory"

        logs.unlink()  # fixed: the next retry runs the pod
        await node.wait_reason("Started")


async def test_a_container_log_directory_that_cannot_be_made_is_create_container_config_error(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    blocked = tmp_path / "logs" / f"default_web_{UID}" / "main"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("in the way")
    async with fake_node(tmp_path) as node:
        node.fake.add_image(IMAGE)
        await node.send.send(PodSetUpdate(source="file", pods=[make_pod()]))
        await node.wait_reason("Failed")
        message = f"create container log directory for container main failed: mkdir {blocked}: "
        assert node.events.seen[-1][:3] == (MAIN, "Warning", "Failed")
        assert node.events.seen[-1][3].startswith(f"Error: {message}")
        pod = node.store.get(UID)
        assert pod is not None
        waiting = pod.status.container_statuses[0].state.waiting
        assert waiting is not None and waiting.reason == "CreateContainerConfigError"
        assert waiting.message is not None and waiting.message.startswith(message)
