"""reconcile.loop: merging pod sets, routing events to pod workers, coalescing, teardown, adoption.

Runs a SyncLoop (with real pod workers) on the fake runtime under trio's MockClock with
autojump; the fake reads the same clock. Events are fed as the sources would send them.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.cgroupfs_fake import cgroupfs_rmdir
from tests.unit.test_resources_cgroups import FakeCgroupfs
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.config import KubeletConfiguration
from trio_kubelet.core.actions import PodActions
from trio_kubelet.core.observed import RuntimePodStatus
from trio_kubelet.events import (
    Event,
    EvictPod,
    NodeConditions,
    PodLifecycleEvent,
    PodSetUpdate,
    RelistDone,
    ResyncTick,
)
from trio_kubelet.images.manager import ImageManager
from trio_kubelet.model.pod import Pod
from trio_kubelet.reconcile.container_setup import NodeFacts
from trio_kubelet.reconcile.loop import SyncLoop
from trio_kubelet.reconcile.workers import SYNC_ERROR_RETRY, WorkerContext
from trio_kubelet.recording import pod_decisions
from trio_kubelet.recording.recorder import Recorder
from trio_kubelet.recording.records import Header, StatusRecord
from trio_kubelet.replay.reader import read_recording
from trio_kubelet.replay.replayer import ReplayResult, replay
from trio_kubelet.resources.cgroups import QOSCgroups
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import ContainerScript, FakeRuntime, open_fake_runtime
from trio_kubelet.sources.pleg import run_pleg
from trio_kubelet.status.store import PodStatusStore

T0 = 1_700_000_000.0
IMAGE = "busybox:1.36"
WEB = "6a2d4f00-5555-4000-8000-000000000001"
API = "6a2d4f00-5555-4000-8000-000000000002"


@dataclass
class Runtime:
    """The fake runtime and a client to it; outlives the agents run on it."""

    fake: FakeRuntime
    client: CRIClient
    wall: TrioWallClock
    logs: Path


@dataclass
class Agent:
    """One SyncLoop with its own store, as one run of the agent."""

    loop: SyncLoop
    store: PodStatusStore
    send: trio.MemorySendChannel[Event]

    async def wait_for(self, uid: str, predicate: Callable[[Pod], bool],
                       timeout: float = 60.0) -> Pod:
        with trio.move_on_after(timeout):  # virtual seconds
            while True:
                pod = self.store.get(uid)
                if pod is not None and predicate(pod):
                    return pod
                await self.store.wait_changed()
        raise AssertionError(f"pod {uid} did not reach the expected state: {self.store.get(uid)}")


class ListRecorder(Recorder):
    """The agent's recorder, keeping each record, built at once, in a list instead of a file."""

    def __init__(self) -> None:  # no file
        self.records: list[Any] = []

    def add(self, make: Callable[[], Any]) -> None:
        self.records.append(make())


def replay_through_file(
    records: list[Any], tmp_path: Path, config: dict[str, Any] | None = None
) -> ReplayResult:
    """Replay ``records`` after a header with ``config``, written to and read from a file."""
    header = Header(agent_version="test", node="n", start_time=0.0,
                    config=KubeletConfiguration.model_validate(config or {}).to_wire())
    path = tmp_path / "recording.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in (header, *records)))
    return replay(read_recording(path).records)


@asynccontextmanager
async def fake_runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    wall = TrioWallClock(epoch=T0)
    async with open_fake_runtime(clock=wall.now, timeout=5.0) as (fake, client):
        fake.add_image(IMAGE)
        yield Runtime(fake, client, wall, tmp_path / "logs")


@asynccontextmanager
async def agent(runtime: Runtime, sources: tuple[str, ...] = ("file",), *,
                pleg: bool = False, node: NodeFacts | None = None,
                recorder: Any = None, qos: QOSCgroups | None = None) -> AsyncIterator[Agent]:
    store = PodStatusStore()
    ctx = WorkerContext(client=runtime.client, images=ImageManager(runtime.client),
                        store=store, clock=runtime.wall, pod_logs_dir=runtime.logs,
                        node=node or NodeFacts(), recorder=recorder, qos=qos)
    # No resync spreading here: a ResyncTick wakes every worker at once, which the
    # coalescing tests rely on (spreading has its own test below).
    loop = SyncLoop(ctx, sources, sync_frequency=0.0)
    send, receive = trio.open_memory_channel[Event](math.inf)
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, receive)
        if pleg:
            nursery.start_soon(run_pleg, send.clone(), runtime.client)
        yield Agent(loop, store, send)
        nursery.cancel_scope.cancel()


def make_pod(name: str, uid: str, *, command: str = "sleep 1d",
             containers: list[dict[str, Any]] | None = None) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": containers or [
                {"name": "main", "image": IMAGE, "command": ["sh", "-c", command]}],
        },
    })


def pod_set(source: str, *pods: Pod) -> PodSetUpdate:
    return PodSetUpdate(source=source, pods=list(pods))


def containers(fake: FakeRuntime, uid: str) -> list[v1.Container]:
    listed = fake.list_containers(v1.ListContainersRequest()).containers
    return sorted((c for c in listed if c.labels.get(labels.POD_UID) == uid),
                  key=lambda c: c.created_at)


def sandboxes(fake: FakeRuntime, uid: str) -> list[v1.PodSandbox]:
    listed = fake.list_pod_sandbox(v1.ListPodSandboxRequest()).items
    return [s for s in listed if s.labels.get(labels.POD_UID) == uid]


def is_running(pod: Pod, restarts: int = 0) -> bool:
    statuses = pod.status.container_statuses
    return bool(statuses) and all(
        s.state.running is not None and s.restart_count == restarts for s in statuses)


def all_running(fake: FakeRuntime, uid: str) -> bool:
    return bool(containers(fake, uid)) and all(
        c.state == v1.ContainerState.CONTAINER_RUNNING for c in containers(fake, uid))


async def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    with trio.fail_after(timeout):  # virtual seconds
        while not condition():
            await trio.sleep(0.1)


def syncs(fake: FakeRuntime) -> int:
    """Every sync starts with one inspect, which lists the pod's sandboxes once."""
    return int(fake.calls["ListPodSandbox"])


# -- admission ---------------------------------------------------------------------------------


async def test_a_pod_that_does_not_fit_is_failed_and_never_started(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    facts = NodeFacts(allocatable={"cpu": Fraction(1), "pods": Fraction(110)})
    requests = {"resources": {"requests": {"cpu": "600m"}}}
    web = make_pod("web", WEB, containers=[{"name": "main", "image": IMAGE, **requests}])
    api = make_pod("api", API, containers=[{"name": "main", "image": IMAGE, **requests}])
    async with fake_runtime(tmp_path) as runtime, agent(runtime, node=facts) as node:
        await node.send.send(pod_set("file", web))
        await node.wait_for(WEB, is_running)
        await node.send.send(pod_set("file", web, api))

        refused = await node.wait_for(API, lambda p: p.status.phase == "Failed")

        assert refused.status.reason == "OutOfcpu"
        assert refused.status.message == (
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 600, "
            "used: 600, capacity: 1000"
        )
        await trio.sleep(5)
        assert containers(runtime.fake, API) == [] and sandboxes(runtime.fake, API) == []
        assert is_running(node.store.get(WEB))  # type: ignore[arg-type]


async def test_a_finished_pod_no_longer_counts_against_allocatable(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    facts = NodeFacts(allocatable={"pods": Fraction(1)})
    job = make_pod("job", WEB)
    job.spec.restart_policy = "Never"
    async with fake_runtime(tmp_path) as runtime, agent(runtime, node=facts, pleg=True) as node:
        runtime.fake.script("job", "main", ContainerScript(exit_after=1.0, exit_code=0))
        await node.send.send(pod_set("file", job))
        await node.wait_for(WEB, lambda p: p.status.phase == "Succeeded")
        await node.send.send(pod_set("file", job, make_pod("api", API)))

        await node.wait_for(API, is_running)


# -- eviction ----------------------------------------------------------------------------------


async def test_an_evicted_pod_is_stopped_and_ends_failed_evicted(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    web, api = make_pod("web", WEB), make_pod("api", API)
    async with fake_runtime(tmp_path) as runtime, agent(runtime, ("api",), pleg=True) as node:
        await node.send.send(pod_set("api", web, api))
        await node.wait_for(WEB, is_running)
        await node.wait_for(API, is_running)
        assert {p.metadata.uid for p in node.loop.active_pods()} == {WEB, API}
        message = "The node was low on resource: memory. "

        await node.send.send(EvictPod(pod_uid=WEB, message=message, grace=1, reason="Evicted"))

        evicted = await node.wait_for(
            WEB, lambda p: p.status.phase == "Failed" and not all_running(runtime.fake, WEB))
        assert (evicted.status.reason, evicted.status.message) == ("Evicted", message)
        assert any(c.type == "DisruptionTarget" for c in evicted.status.conditions)
        await trio.sleep(30)  # resyncs, relists: the pod stays down
        stopped = containers(runtime.fake, WEB)
        assert stopped and all(c.state == v1.ContainerState.CONTAINER_EXITED for c in stopped)
        assert all(s.state == v1.PodSandboxState.SANDBOX_NOTREADY
                   for s in sandboxes(runtime.fake, WEB))
        assert node.store.get(WEB).status.reason == "Evicted"  # type: ignore[union-attr]
        assert node.store.is_stopped(WEB)
        assert [p.metadata.uid for p in node.loop.active_pods()] == [API]
        await node.send.send(EvictPod(pod_uid=WEB, message="again", grace=1, reason="Evicted"))
        await trio.sleep(1)  # once is enough: the second eviction changes nothing
        assert node.store.get(WEB).status.message == message  # type: ignore[union-attr]
        assert is_running(node.store.get(API))  # type: ignore[arg-type]


async def test_a_new_pod_is_refused_under_the_pressure_the_eviction_manager_reports(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime, ("api",)) as node:
        await node.send.send(NodeConditions(source="eviction", conditions=["MemoryPressure"]))
        await node.send.send(pod_set("api", make_pod("web", WEB)))

        refused = await node.wait_for(WEB, lambda p: p.status.phase == "Failed")

        assert refused.status.reason == "Evicted"
        assert refused.status.message == (
            "Pod was rejected: The node had condition: [MemoryPressure]. ")
        assert containers(runtime.fake, WEB) == []


async def test_an_admission_under_pressure_replays_from_its_record(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    from trio_kubelet.recording.records import AdmissionRecord

    recorder = ListRecorder()
    async with fake_runtime(tmp_path) as runtime, \
            agent(runtime, ("api",), recorder=recorder) as node:
        await node.send.send(NodeConditions(source="eviction", conditions=["DiskPressure"]))
        await node.send.send(pod_set("api", make_pod("web", WEB)))
        await node.wait_for(WEB, lambda p: p.status.phase == "Failed")

    header = Header(agent_version="test", node="n", start_time=T0, config={}, sources=["api"])
    (admission,) = [r for r in recorder.records if isinstance(r, AdmissionRecord)]
    assert admission.node_conditions == ["DiskPressure"] and admission.reason == "Evicted"
    assert replay([header, *recorder.records]).ok
    # Without the condition the recorded refusal cannot be re-decided: a divergence.
    tampered = admission.model_copy(update={"node_conditions": []})
    records = [tampered if r is admission else r for r in recorder.records]
    assert not replay([header, *records]).ok


async def test_a_pod_past_its_active_deadline_replays_its_status(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """DeadlineExceeded ends the pod Failed without a DisruptionTarget; replay says the same."""
    recorder = ListRecorder()
    pod = make_pod("web", WEB)
    pod.spec.active_deadline_seconds = 5
    async with fake_runtime(tmp_path) as runtime, agent(runtime, recorder=recorder) as node:
        await node.send.send(pod_set("file", pod))
        await node.wait_for(WEB, lambda p: p.status.reason == "DeadlineExceeded")

    header = Header(agent_version="test", node="n", start_time=T0, config={}, sources=["file"])
    result = replay([header, *recorder.records])
    assert result.ok, result.divergence
    assert any(isinstance(r, StatusRecord) and r.decided == "evicted" for r in recorder.records)


async def test_an_eviction_replays_from_its_record(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The manager's choice over the loop's real pods is recorded; replay re-chooses it."""
    from tests.unit.test_eviction import MiB, make_sample, pod_sample
    from trio_kubelet.recording.records import AssessRecord, EvictionRecord, StatusRecord
    from trio_kubelet.resources.eviction import EvictionConfig, EvictionManager

    config = KubeletConfiguration.model_validate({"evictionHard": {"memory.available": "500Mi"}})
    recorder = ListRecorder()
    greedy = {"name": "main", "image": IMAGE, "resources": {"requests": {"memory": "100Mi"}}}
    modest = {"name": "main", "image": IMAGE, "resources": {"requests": {"memory": "1Gi"}}}
    web = make_pod("web", WEB, containers=[modest])
    api = make_pod("api", API, containers=[greedy])
    sample = make_sample(capacity=4096 * MiB, node_working_set=3800 * MiB, pods=[
        pod_sample(WEB, memory={"main": 50 * MiB}), pod_sample(API, memory={"main": 900 * MiB}),
    ])
    async with fake_runtime(tmp_path) as runtime, \
            agent(runtime, ("api",), recorder=recorder) as node:
        await node.send.send(pod_set("api", web, api))
        await node.wait_for(API, is_running)
        evictions = EvictionManager(
            EvictionConfig.from_config(config), node.loop, lambda: sample, node.send.send,
            wall_clock=lambda: T0 + 1, stopped=node.store.is_stopped, recorder=recorder,
        )
        assert await evictions.synchronize() == (API,)
        await node.wait_for(API, lambda p: p.status.reason == "Evicted")

    header = Header(agent_version="test", node="n", start_time=T0, config=config.to_wire(),
                    sources=["api"])
    (record,) = [r for r in recorder.records if isinstance(r, EvictionRecord)]
    assert record.uid == API and record.grace == 1 and record.actionable == [
        ("memory.available", True)]
    assert record.message is not None and "Container main was using 900Mi" in record.message
    result = replay([header, *recorder.records])
    assert result.ok and result.evictions == 1
    # The evicted pod's Failed/Evicted status is recorded with its inputs and re-decided.
    evicted = [r for r in recorder.records
               if isinstance(r, StatusRecord) and r.decided == "evicted"]
    assert evicted and evicted[-1].status["reason"] == "Evicted"
    assert result.statuses >= len(evicted)
    # Other figures (the modest pod now the one beyond its request) choose another pod.
    usage = {**record.usage, WEB: {**record.usage[WEB], "memory": 2048 * MiB,
                                   "container_memory": {"main": 2048 * MiB}},
             API: {**record.usage[API], "memory": 10 * MiB, "container_memory": {"main": 1}}}
    tampered = record.model_copy(update={"usage": usage})
    records = [tampered if r is record else r for r in recorder.records]
    diverged = replay([header, *records])
    assert diverged.divergence is not None
    assert diverged.divergence.reason == "the replayed eviction differs from the recorded one"

    # The round's verdict is recorded too, with the state it began with, and re-decided.
    (verdict,) = [r for r in recorder.records if isinstance(r, AssessRecord)]
    assert verdict.conditions == ["MemoryPressure"] and verdict.first_observed == []
    assert verdict.actionable == [("memory.available", True)]
    assert [line.summary for line in result.trace if line.pod == "(node)"] == [
        "pressure: MemoryPressure; act on memory.available"]
    # Figures with room to spare cannot have met the threshold.
    plenty = {**verdict.observations, "memory.available": (
        3000 * MiB, *verdict.observations["memory.available"][1:])}
    tampered_verdict = verdict.model_copy(update={"observations": plenty})
    records = [tampered_verdict if r is verdict else r for r in recorder.records]
    diverged = replay([header, *records])
    assert diverged.divergence is not None
    assert diverged.divergence.reason == (
        "the replayed eviction verdict differs from the recorded one")
    assert replay_through_file(recorder.records, tmp_path, config.to_wire()).ok


async def test_a_local_storage_eviction_replays_from_its_record(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The storage check over the loop's real pods is recorded; replay re-checks it."""
    from tests.unit.test_eviction import MiB, pod_sample, storage_sample
    from trio_kubelet.recording.records import StorageEvictionRecord
    from trio_kubelet.resources.eviction import EvictionConfig, EvictionManager

    config = KubeletConfiguration()

    def scratch_pod(name: str, uid: str) -> Pod:
        """A pod with a 2Mi emptyDir."""
        return Pod.model_validate({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "2Mi"}}],
                     "containers": [{"name": "main", "image": IMAGE}]},
        })

    web, api = scratch_pod("web", WEB), scratch_pod("api", API)
    sample = storage_sample((pod_sample(WEB), MiB), (pod_sample(API), 3 * MiB))
    recorder = ListRecorder()
    async with fake_runtime(tmp_path) as runtime, \
            agent(runtime, ("api",), recorder=recorder) as node:
        await node.send.send(pod_set("api", web, api))
        await node.wait_for(API, is_running)
        evictions = EvictionManager(
            EvictionConfig(thresholds=()), node.loop, lambda: sample, node.send.send,
            wall_clock=lambda: T0 + 1, stopped=node.store.is_stopped, recorder=recorder,
        )
        assert await evictions.synchronize() == (API,)

    header = Header(agent_version="test", node="n", start_time=T0, config=config.to_wire(),
                    sources=["api"])
    (record,) = [r for r in recorder.records if isinstance(r, StorageEvictionRecord)]
    message = 'Usage of EmptyDir volume "scratch" exceeds the limit "2Mi". '
    assert record.overruns == [(API, "emptydirfs.limit", message)]
    assert set(record.candidates) == {WEB, API}
    for result in (replay([header, *recorder.records]),
                   replay_through_file(recorder.records, tmp_path)):
        assert result.ok and result.evictions == 1
        assert [line.summary for line in result.trace if line.uid == API][-1] == (
            f"evict (emptydirfs.limit): {message}")
    # Other figures (the web pod's volume now the full one) find another pod.
    usage = {WEB: {**record.usage[WEB], "volumes": {"scratch": 3 * MiB}},
             API: {**record.usage[API], "volumes": {"scratch": MiB}}}
    tampered = record.model_copy(update={"usage": usage})
    diverged = replay([header, *[tampered if r is record else r for r in recorder.records]])
    assert diverged.divergence is not None
    assert diverged.divergence.reason == (
        "the replayed local storage check differs from the recorded one")


# -- routing and coalescing --------------------------------------------------------------------


async def test_many_wakeups_between_syncs_coalesce_into_one(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        await node.send.send(pod_set("file", make_pod("web", WEB)))
        await node.wait_for(WEB, is_running)
        await trio.sleep(1)
        before = syncs(runtime.fake)

        for _ in range(100):
            node.loop.handle(ResyncTick())
        await trio.sleep(1)
        # The first wake-up hands over to the idle worker, the second one waits, the rest
        # are absorbed: at most one sync running and one pending, as in the Go pod workers.
        assert 1 <= syncs(runtime.fake) - before <= 2

        # Through the channel while a (slow) sync runs: one more sync, not fifty.
        runtime.fake.set_delay("ListPodSandbox", 1.0)
        before = syncs(runtime.fake)
        for _ in range(50):
            await node.send.send(PodLifecycleEvent(pod_uid=WEB, type="ContainerStarted",
                                                   container_id="x"))
        await trio.sleep(10)
        assert syncs(runtime.fake) - before == 2
        assert runtime.fake.calls["RunPodSandbox"] == runtime.fake.calls["CreateContainer"] == 1


async def test_a_wakeup_during_a_sync_is_not_lost(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        await node.send.send(pod_set("file", make_pod("web", WEB)))
        await node.wait_for(WEB, is_running)
        await trio.sleep(1)
        runtime.fake.set_delay("ListPodSandbox", 2.0)  # each sync now takes over 2 s
        before = syncs(runtime.fake)
        node.loop.handle(ResyncTick())
        await trio.sleep(1)  # mid-sync
        for _ in range(10):
            node.loop.handle(ResyncTick())
        await trio.sleep(10)
        assert syncs(runtime.fake) - before == 2


async def test_resync_tick_syncs_every_pod_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        await node.send.send(pod_set("file", make_pod("web", WEB), make_pod("api", API)))
        await node.wait_for(WEB, is_running)
        await node.wait_for(API, is_running)
        await trio.sleep(1)
        before = syncs(runtime.fake)
        await node.send.send(ResyncTick())
        await trio.sleep(1)
        assert syncs(runtime.fake) - before == 2


async def test_lifecycle_event_wakes_only_its_pod(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        await node.send.send(pod_set("file", make_pod("web", WEB), make_pod("api", API)))
        await node.wait_for(WEB, is_running)
        await node.wait_for(API, is_running)
        [api_main] = containers(runtime.fake, API)
        [web_main] = containers(runtime.fake, WEB)
        await trio.sleep(1)  # so the restarted instance is the newer one by creation time
        runtime.fake.crash(api_main.id)
        runtime.fake.crash(web_main.id)
        await node.send.send(PodLifecycleEvent(pod_uid=API, type="ContainerDied",
                                               container_id=api_main.id))
        await node.wait_for(API, lambda p: is_running(p, restarts=1))
        await trio.sleep(5)
        assert len(containers(runtime.fake, WEB)) == 1, "nothing woke the other pod"


async def run_web(runtime: Runtime, node: Agent) -> tuple[v1.PodSandbox, v1.Container]:
    """The web pod started and running: its sandbox and container."""
    await node.send.send(pod_set("file", make_pod("web", WEB)))
    await node.wait_for(WEB, is_running)
    [sandbox], [main] = sandboxes(runtime.fake, WEB), containers(runtime.fake, WEB)
    return sandbox, main


async def test_news_the_last_sync_saw_wakes_no_sync_but_a_death_does(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        sandbox, main = await run_web(runtime, node)
        before = syncs(runtime.fake)
        # What a PLEG reports after the sync that started them: nothing new for the worker.
        for container_id in (sandbox.id, main.id):
            await node.send.send(PodLifecycleEvent(pod_uid=WEB, type="ContainerStarted",
                                                   container_id=container_id))
        await trio.sleep(5)
        assert syncs(runtime.fake) == before
        runtime.fake.crash(main.id)
        await node.send.send(PodLifecycleEvent(pod_uid=WEB, type="ContainerDied",
                                               container_id=main.id))
        await node.wait_for(WEB, lambda p: is_running(p, restarts=1))
        assert syncs(runtime.fake) > before
        # A started instance it has not seen (started behind its back) is news too.
        after = syncs(runtime.fake)
        await node.send.send(PodLifecycleEvent(pod_uid=WEB, type="ContainerStarted",
                                               container_id="not-seen"))
        await wait_until(lambda: syncs(runtime.fake) > after)


async def test_relist_done_records_the_last_healthy_relist(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        assert node.loop.last_relist_ok is None
        await trio.sleep(3)
        await node.send.send(RelistDone(ok=True, duration=0.01))
        await trio.sleep(1)
        healthy_at = node.loop.last_relist_ok
        assert healthy_at == trio.current_time() - 1
        await node.send.send(RelistDone(ok=False, error="runtime down"))
        await trio.sleep(1)
        assert node.loop.last_relist_ok == healthy_at


# -- desired state from the sources ------------------------------------------------------------


async def test_removed_pod_is_stopped_removed_and_forgotten(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        web, api = make_pod("web", WEB), make_pod("api", API)
        await node.send.send(pod_set("file", web, api))
        await node.wait_for(WEB, is_running)
        await node.wait_for(API, is_running)
        log_dir = runtime.logs / f"default_web_{WEB}"
        assert log_dir.is_dir()
        [web_main] = containers(runtime.fake, WEB)

        await node.send.send(pod_set("file", api))
        await wait_until(lambda: node.store.get(WEB) is None)
        await wait_until(lambda: WEB not in node.loop.workers)
        assert containers(runtime.fake, WEB) == [] and sandboxes(runtime.fake, WEB) == []
        assert not log_dir.exists()
        assert runtime.fake.calls["StopContainer"] == 1
        assert all_running(runtime.fake, API), "the other pod is untouched"

        # A late PLEG report about the removed pod starts nothing.
        await node.send.send(PodLifecycleEvent(pod_uid=WEB, type="ContainerDied",
                                               container_id=web_main.id))
        await trio.sleep(1)
        assert set(node.loop.workers) == {API}


async def test_teardown_kills_from_what_the_last_sync_saw_then_looks_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        _, web_main = await run_web(runtime, node)
        runtime.fake.set_delay("ListPodSandbox", 4.0)  # slow to answer a look (deadline: 5 s)
        start = trio.current_time()
        await node.send.send(pod_set("file"))
        await wait_until(lambda: bool(runtime.fake.container_calls))
        assert runtime.fake.container_calls[0][:2] == ("StopContainer", web_main.id)
        assert trio.current_time() - start < 4.0, "the kill did not wait for a look"
        await wait_until(lambda: WEB not in node.loop.workers)
        assert containers(runtime.fake, WEB) == [] and sandboxes(runtime.fake, WEB) == []


async def test_a_removed_pod_can_come_back(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        web = make_pod("web", WEB)
        await node.send.send(pod_set("file", web))
        await node.wait_for(WEB, is_running)
        await node.send.send(pod_set("file"))
        await wait_until(lambda: not sandboxes(runtime.fake, WEB))
        await node.send.send(pod_set("file", web))
        await node.wait_for(WEB, is_running)
        assert len(sandboxes(runtime.fake, WEB)) == 1
        assert len(containers(runtime.fake, WEB)) == 1


async def test_spec_edit_restarts_only_the_edited_container(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    def pod(helper_command: str) -> Pod:
        return make_pod("web", WEB, containers=[
            {"name": "main", "image": IMAGE, "command": ["sleep", "1d"]},
            {"name": "helper", "image": IMAGE, "command": ["sh", "-c", helper_command]},
        ])

    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        await node.send.send(pod_set("file", pod("sleep 1d")))
        await node.wait_for(WEB, is_running)
        by_name = {c.labels[labels.CONTAINER_NAME]: c for c in containers(runtime.fake, WEB)}
        main, helper = by_name["main"], by_name["helper"]

        await node.send.send(pod_set("file", pod("sleep 2d")))
        await wait_until(lambda: len(containers(runtime.fake, WEB)) == 3)
        await wait_until(lambda: len([c for c in containers(runtime.fake, WEB)
                                      if c.state == v1.ContainerState.CONTAINER_RUNNING]) == 2)
        by_id = {c.id: c for c in containers(runtime.fake, WEB)}
        assert by_id[main.id].state == v1.ContainerState.CONTAINER_RUNNING
        assert by_id[helper.id].state == v1.ContainerState.CONTAINER_EXITED
        assert len(sandboxes(runtime.fake, WEB)) == 1


async def test_pod_wanted_by_two_sources_stays_until_neither_wants_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime, ("file", "http")) as node:
        web = make_pod("web", WEB)
        await node.send.send(pod_set("file", web))
        await node.send.send(pod_set("http", web))
        await node.wait_for(WEB, is_running)
        assert set(node.loop.config.desired()) == {WEB}

        await node.send.send(pod_set("file"))
        await trio.sleep(5)
        assert all_running(runtime.fake, WEB)
        assert runtime.fake.calls["StopContainer"] == 0

        await node.send.send(pod_set("http"))
        await wait_until(lambda: not sandboxes(runtime.fake, WEB))
        assert node.loop.config.desired() == {}


# -- pods found on the runtime -----------------------------------------------------------------


async def start_and_leave(runtime: Runtime, *pods: Pod) -> None:
    """A previous run of the agent starts the pods, then stops (its pods keep running)."""
    async with agent(runtime) as previous:
        await previous.send.send(pod_set("file", *pods))
        for pod in pods:
            await previous.wait_for(pod.metadata.uid, is_running)


async def report_running(node: Agent, fake: FakeRuntime, uid: str) -> None:
    """What the first PLEG relist of a new agent reports about a running pod."""
    for sandbox in sandboxes(fake, uid):
        await node.send.send(PodLifecycleEvent(pod_uid=uid, type="ContainerStarted",
                                               container_id=sandbox.id))
    for container in containers(fake, uid):
        await node.send.send(PodLifecycleEvent(pod_uid=uid, type="ContainerStarted",
                                               container_id=container.id))


async def test_orphan_is_torn_down_only_after_every_source_reported(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime:
        await start_and_leave(runtime, make_pod("web", WEB))
        runtime.fake.calls.clear()

        async with agent(runtime, ("file", "api")) as node:
            await report_running(node, runtime.fake, WEB)
            await node.send.send(pod_set("file", make_pod("api", API)))
            await node.wait_for(API, is_running)
            await trio.sleep(10)
            assert not node.loop.config.sources_ready
            assert all_running(runtime.fake, WEB), "an unclaimed pod waits for every source"
            assert WEB not in node.loop.workers
            assert runtime.fake.calls["StopContainer"] == 0

            await node.send.send(pod_set("api"))
            await wait_until(lambda: not sandboxes(runtime.fake, WEB))
            assert node.loop.config.sources_ready
            assert containers(runtime.fake, WEB) == []
            assert all_running(runtime.fake, API)
            assert node.store.get(WEB) is None


async def test_orphan_reported_after_the_sources_are_ready_is_torn_down(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime:
        await start_and_leave(runtime, make_pod("web", WEB))
        async with agent(runtime) as node:
            await node.send.send(pod_set("file"))
            await trio.sleep(1)
            assert node.loop.config.sources_ready
            await report_running(node, runtime.fake, WEB)
            await wait_until(lambda: not sandboxes(runtime.fake, WEB))
            assert containers(runtime.fake, WEB) == []


async def test_pod_in_the_source_set_is_adopted_without_new_containers(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    web = make_pod("web", WEB)
    async with fake_runtime(tmp_path) as runtime:
        await start_and_leave(runtime, web)
        [sandbox] = sandboxes(runtime.fake, WEB)
        [main] = containers(runtime.fake, WEB)
        runtime.fake.calls.clear()

        async with agent(runtime, pleg=True) as node:
            await trio.sleep(3)  # PLEG relists report the running pod before the source does
            await node.send.send(pod_set("file", web))
            adopted = await node.wait_for(WEB, is_running)
            await trio.sleep(3)

            assert adopted.status.phase == "Running"
            assert adopted.status.container_statuses[0].container_id == f"containerd://{main.id}"
            assert [s.id for s in sandboxes(runtime.fake, WEB)] == [sandbox.id]
            assert [c.id for c in containers(runtime.fake, WEB)] == [main.id]
            for call in ("RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer",
                         "StopPodSandbox", "RemoveContainer"):
                assert runtime.fake.calls[call] == 0, call


# -- faults ------------------------------------------------------------------------------------


async def test_runtime_outage_during_a_sync_is_retried_and_other_pods_keep_working(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        await node.send.send(pod_set("file", make_pod("web", WEB), make_pod("api", API)))
        await node.wait_for(WEB, is_running)
        await node.wait_for(API, is_running)
        [web_main] = containers(runtime.fake, WEB)
        [api_main] = containers(runtime.fake, API)

        runtime.fake.set_unavailable(True)
        outage = trio.current_time()
        await node.send.send(ResyncTick())  # both syncs fail
        await trio.sleep(1)
        assert set(node.loop.workers) == {WEB, API}
        assert all(is_running(pod) for pod in node.store.pods()), "status kept, not cleared"

        runtime.fake.set_unavailable(False)
        runtime.fake.crash(web_main.id)  # nobody reports this one: only the retry finds it
        runtime.fake.crash(api_main.id)
        await node.send.send(PodLifecycleEvent(pod_uid=API, type="ContainerDied",
                                               container_id=api_main.id))
        await node.wait_for(API, lambda p: is_running(p, restarts=1))
        assert trio.current_time() - outage < 2, "the other pod's worker answers at once"

        await node.wait_for(WEB, lambda p: is_running(p, restarts=1))
        assert trio.current_time() - outage == pytest.approx(SYNC_ERROR_RETRY, abs=0.01)


async def test_an_unexpected_error_in_one_pod_leaves_the_others_running(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = pod_decisions.compute_pod_actions
    broken = {WEB}

    def compute(pod: Pod, runtime: RuntimePodStatus, **kwargs: Any) -> PodActions:
        if pod.metadata.uid in broken:
            raise RuntimeError("bug in one pod's decision")
        return real(pod, runtime, **kwargs)

    monkeypatch.setattr(pod_decisions, "compute_pod_actions", compute)
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        start = trio.current_time()
        await node.send.send(pod_set("file", make_pod("web", WEB), make_pod("api", API)))
        await node.wait_for(API, is_running)
        assert sandboxes(runtime.fake, WEB) == []
        assert set(node.loop.workers) == {WEB, API}

        broken.clear()
        await node.wait_for(WEB, is_running)  # retried on its own
        assert trio.current_time() - start == pytest.approx(SYNC_ERROR_RETRY, abs=0.01)


async def test_teardown_removes_the_log_directory_even_without_a_sandbox(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        runtime.fake.fail_sandbox("web", "failed to setup network for sandbox: cni not ready")
        await node.send.send(pod_set("file", make_pod("web", WEB)))
        await node.wait_for(WEB, lambda p: p.status.container_statuses[0].state.waiting
                            is not None and p.status.container_statuses[0].state.waiting.reason
                            == "CreatePodSandboxError")
        log_dir = runtime.logs / f"default_web_{WEB}"
        assert log_dir.is_dir()
        await node.send.send(pod_set("file"))
        await wait_until(lambda: node.store.get(WEB) is None)
        assert not log_dir.exists()


async def test_teardown_kills_with_the_grace_of_the_spec_the_pod_last_ran_by(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A removed pod has no desired spec: its worker kills it by the one it last published
    (5 s grace: the process's 4 s SIGTERM exit fits, where an orphan's 2 s would not)."""
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        runtime.fake.script("web", "main", ContainerScript(term_grace=4.0))
        await node.send.send(pod_set("file", make_pod("web", WEB)))
        await node.wait_for(WEB, is_running)
        removed = trio.current_time()
        await node.send.send(pod_set("file"))
        await wait_until(lambda: node.store.get(WEB) is None)
        assert trio.current_time() - removed == pytest.approx(4.0, abs=0.1)
        assert node.loop.node_pods() == []


async def test_the_qos_tiers_count_the_pods_on_the_node_and_not_a_removed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new pod's cgroup is set up with the Burstable tier counting it and every pod the
    loop's workers run; a torn-down pod leaves the tier. (On trio's real clock: the cgroup
    writes run in threads, which an autojumping clock would not wait for.)"""
    monkeypatch.setattr(os, "rmdir", functools.partial(cgroupfs_rmdir, os.rmdir))
    (tmp_path / "cgroup").mkdir()
    cgroups = FakeCgroupfs(tmp_path / "cgroup")
    qos = QOSCgroups(cgroups.root)
    await qos.start()

    def burstable(name: str, uid: str, cpu: str) -> Pod:
        return make_pod(name, uid, containers=[
            {"name": "main", "image": IMAGE, "resources": {"requests": {"cpu": cpu}}}])

    def shares() -> str:
        return cgroups.read("cpu", "kubepods/burstable", "cpu.shares")

    async with fake_runtime(tmp_path) as runtime, agent(runtime, qos=qos) as node:
        await node.send.send(pod_set("file", burstable("web", WEB, "250m")))
        await node.wait_for(WEB, is_running)
        assert shares() == "256"
        await node.send.send(pod_set("file", burstable("web", WEB, "250m"),
                                     burstable("api", API, "1")))
        await node.wait_for(API, is_running)
        assert shares() == "1280"
        await node.send.send(pod_set("file", burstable("api", API, "1")))
        await wait_until(lambda: node.store.get(WEB) is None)
        assert shares() == "1024"
        assert not cgroups.exists("cpu", f"kubepods/burstable/pod{WEB}")


async def test_resync_is_spread_over_the_period_deterministically(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime) as node:
        await node.send.send(pod_set("file", make_pod("web", WEB), make_pod("api", API)))
        await node.wait_for(WEB, is_running)
        await node.wait_for(API, is_running)
        node.loop._sync_frequency = 60.0
        woken: dict[str, float] = {}
        for uid, worker in node.loop.workers.items():
            original = worker.wake_at
            def spy(when: float, uid: str = uid, original=original) -> None:
                woken[uid] = when - trio.current_time()
                original(when)
            worker.wake_at = spy  # type: ignore[method-assign]
        node.loop.handle(ResyncTick())
        assert set(woken) == {WEB, API}
        assert all(0 <= delay < 60 for delay in woken.values())
        assert woken[WEB] != woken[API]
        first = dict(woken)
        node.loop.handle(ResyncTick())
        assert woken == first  # by UID: the same spread every time (and in a replay)
