"""reconcile.container_gc: passes over the fake runtime under trio's MockClock.

Objects are made through CRI as the agent makes them (labels, log paths); the last
test runs the real sync loop and pod workers with the GC beside them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

from tests.unit import test_resources_cgroups
from tests.unit.test_resources_cgroups import FakeCgroupfs
from tests.unit.test_resources_cgroups import make_pod as cgroup_pod
from tests.unit.test_sync_loop import (
    ListRecorder,
    agent,
    containers,
    fake_runtime,
    make_pod,
    pod_set,
    replay_through_file,
    sandboxes,
    wait_until,
)
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.core.container_gc import GCPolicy
from trio_kubelet.model.pod import Pod
from trio_kubelet.reconcile.container_gc import UNKNOWN_STOP_GRACE, ContainerGC
from trio_kubelet.resources.cgroups import QOSCgroups
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError, StatusCode
from trio_kubelet.runtime.fake import ContainerScript, FakeRuntime

fs = test_resources_cgroups.fs  # the fake cgroup v1 tree fixture
IMAGE = "busybox:1.36"
WEB = "6a2d4f00-6666-4000-8000-000000000001"
GONE = "6a2d4f00-6666-4000-8000-000000000002"
DEFAULT = GCPolicy()
Sandbox = tuple[str, v1.PodSandboxConfig]


@dataclass
class Node:
    """The fake runtime, a client, and which pods exist as far as the GC is told."""

    fake: FakeRuntime
    client: CRIClient
    wall: TrioWallClock
    logs: Path
    existing: set[str] = field(default_factory=set)
    ready: bool = True

    def gc(self, policy: GCPolicy = DEFAULT, *, period: float = 60.0,
           client: Any = None, qos: QOSCgroups | None = None) -> ContainerGC:
        return ContainerGC(client or self.client, policy, existing_pods=lambda: self.existing,
                           sources_ready=lambda: self.ready, pod_logs_dir=self.logs,
                           clock=self.wall.now, period=period, qos=qos)

    def log_dir(self, uid: str, name: str) -> Path:
        return self.logs / f"default_{name}_{uid}"

    async def sandbox(self, uid: str, name: str, attempt: int = 0) -> Sandbox:
        config = v1.PodSandboxConfig(
            metadata=v1.PodSandboxMetadata(name=name, uid=uid, namespace="default",
                                           attempt=attempt),
            labels=labels.sandbox_labels(uid, name, "default", {}),
            log_directory=str(self.log_dir(uid, name)))
        self.log_dir(uid, name).mkdir(parents=True, exist_ok=True)
        return await self.client.run_pod_sandbox(config), config

    async def instances(self, uid: str, name: str, sandbox: Sandbox,
                        count: int, *, first: int = 0, last_running: bool = False) -> list[str]:
        """``count`` instances of container "main" from restart ``first`` on, one a second;
        all exited but the last if ``last_running``."""
        ids = []
        for restart in range(first, first + count):
            config = v1.ContainerConfig(
                metadata=v1.ContainerMetadata(name="main", attempt=restart),
                image=v1.ImageSpec(image=IMAGE),
                labels=labels.container_labels(uid, name, "default", "main"),
                annotations=labels.container_annotations("hash", restart, "regular", 30),
                log_path=f"main/{restart}.log")
            (self.log_dir(uid, name) / "main").mkdir(exist_ok=True)
            cid = await self.client.create_container(sandbox[0], config, sandbox[1])
            await self.client.start_container(cid)
            if not (last_running and restart == first + count - 1):
                self.fake.crash(cid)
            ids.append(cid)
            await trio.sleep(1)
        return ids

    def ids(self, uid: str) -> list[str]:
        return [c.id for c in containers(self.fake, uid)]


@asynccontextmanager
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with fake_runtime(tmp_path) as runtime:
        yield Node(runtime.fake, runtime.client, runtime.wall, runtime.logs)


def log_files(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / "main").glob("*.log"))


async def test_a_pass_keeps_the_newest_dead_instance_and_the_running_one(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with node(tmp_path) as n:
        n.existing = {WEB}
        ids = await n.instances(WEB, "web", await n.sandbox(WEB, "web"), 5, last_running=True)
        assert log_files(n.log_dir(WEB, "web")) == [f"{i}.log" for i in range(5)]
        main = n.log_dir(WEB, "web") / "main"
        for rotated in ("0.log.20261128-100000.gz", "0.log.20261128-100100", "3.log.20261128-1"):
            (main / rotated).write_text("rotated\n")

        result = await n.gc().collect()

        assert n.ids(WEB) == ids[3:], "the previous instance (for --previous) and the current"
        assert (result.dead, result.containers, result.sandboxes) == (4, 3, 0)
        assert log_files(n.log_dir(WEB, "web")) == ["3.log", "4.log"], "removed with them"
        assert sorted(p.name for p in main.glob("*.log.*")) == ["3.log.20261128-1"], (
            "a removed instance's rotated logs go with it")
        assert (await n.gc().collect()).containers == 0


async def test_a_container_in_an_unknown_state_is_stopped_before_it_is_removed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with node(tmp_path) as n:
        n.existing = {WEB}
        ids = await n.instances(WEB, "web", await n.sandbox(WEB, "web"), 4, last_running=True)
        n.fake.lose_track(ids[0])  # the runtime refuses to remove it unless stopped

        result = await n.gc().collect()

        assert (result.containers, result.failed) == (2, 0)
        assert n.ids(WEB) == ids[2:]
        assert ("StopContainer", ids[0], UNKNOWN_STOP_GRACE) in n.fake.container_calls
        assert ("StopContainer", ids[1], UNKNOWN_STOP_GRACE) not in n.fake.container_calls


async def test_a_gone_pod_loses_its_containers_sandboxes_and_log_directory(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with node(tmp_path) as n:
        n.existing = {WEB}
        old = await n.sandbox(GONE, "gone", attempt=0)
        await n.instances(GONE, "gone", old, 2)
        await n.client.stop_pod_sandbox(old[0])
        new = await n.sandbox(GONE, "gone", attempt=1)
        await n.instances(GONE, "gone", new, 1, first=2)
        await n.client.stop_pod_sandbox(new[0])
        web = await n.sandbox(WEB, "web")
        await n.instances(WEB, "web", web, 1, last_running=True)
        stray = n.log_dir("6a2d4f00-6666-4000-8000-00000000beef", "stray")
        (stray / "main").mkdir(parents=True)
        (stray / "main" / "0.log").write_text("left behind\n")
        (n.logs / "unrelated").mkdir()

        result = await n.gc().collect()

        assert n.ids(GONE) == [] and sandboxes(n.fake, GONE) == []
        assert (result.containers, result.sandboxes, result.log_dirs) == (3, 2, 2)
        assert sorted(p.name for p in n.logs.iterdir()) == [f"default_web_{WEB}", "unrelated"]
        assert len(n.ids(WEB)) == 1 and len(sandboxes(n.fake, WEB)) == 1


async def test_nothing_of_a_pod_no_source_reported_goes_before_the_sources_are_ready(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with node(tmp_path) as n:
        sandbox = await n.sandbox(GONE, "gone")
        ids = await n.instances(GONE, "gone", sandbox, 2)
        await n.client.stop_pod_sandbox(sandbox[0])
        n.ready = False
        gc = n.gc(period=60.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(gc.run)
            await trio.sleep(300)
            assert gc.passes == 0 and n.ids(GONE) == ids
            n.ready = True
            ready_at = trio.current_time()
            await wait_until(lambda: gc.passes == 1, timeout=1.5)
            assert n.ids(GONE) == [] and not n.log_dir(GONE, "gone").exists()
            await wait_until(lambda: gc.passes == 3, timeout=150)
            assert trio.current_time() - ready_at >= 120, "then one pass a period"
            nursery.cancel_scope.cancel()


async def test_the_ttl_keeps_young_dead_containers(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with node(tmp_path) as n:
        n.existing = {WEB}
        ids = await n.instances(WEB, "web", await n.sandbox(WEB, "web"), 4)
        policy = GCPolicy(min_age=60, max_per_pod_container=0)
        assert (await n.gc(policy).collect()).containers == 0
        await trio.sleep(60)
        assert (await n.gc(policy).collect()).containers == 3
        assert n.ids(WEB) == ids[3:]


class FailingRemoval:
    """The CRI client, except that removing the objects in ``failing`` fails."""

    def __init__(self, client: CRIClient, *failing: str) -> None:
        self._client = client
        self.failing = set(failing)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def _burst(self, method: str, remove: Any, ids: list[str],
                     concurrency: int) -> list[CRIError | None]:
        answers = iter(await remove([id for id in ids if id not in self.failing],
                                    concurrency=concurrency))
        return [CRIError(method, StatusCode.UNKNOWN, "device or resource busy")
                if id in self.failing else next(answers) for id in ids]

    async def remove_containers(self, ids: list[str], *,
                                concurrency: int) -> list[CRIError | None]:
        return await self._burst("RemoveContainer", self._client.remove_containers, ids,
                                 concurrency)

    async def remove_pod_sandboxes(self, ids: list[str], *,
                                   concurrency: int) -> list[CRIError | None]:
        return await self._burst("RemovePodSandbox", self._client.remove_pod_sandboxes, ids,
                                 concurrency)


async def test_a_failed_container_removal_is_logged_and_the_pass_goes_on(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, caplog: Any
) -> None:
    async with node(tmp_path) as n:
        n.existing = {WEB}
        ids = await n.instances(WEB, "web", await n.sandbox(WEB, "web"), 4, last_running=True)

        result = await n.gc(client=FailingRemoval(n.client, ids[0])).collect()

        assert (result.containers, result.failed) == (1, 1)
        assert n.ids(WEB) == [ids[0], *ids[2:]]
        assert log_files(n.log_dir(WEB, "web")) == ["0.log", "2.log", "3.log"]
        assert "device or resource busy" in caplog.text
        assert (await n.gc().collect()).containers == 1 and n.ids(WEB) == ids[2:]


async def test_a_sandbox_that_cannot_be_removed_keeps_its_containers_and_the_pod_logs(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with node(tmp_path) as n:
        first = await n.sandbox(GONE, "gone", attempt=0)
        stuck = await n.instances(GONE, "gone", first, 2)
        second = await n.sandbox(GONE, "gone", attempt=1)
        await n.instances(GONE, "gone", second, 2, first=2)
        for sandbox in (first, second):
            await n.client.stop_pod_sandbox(sandbox[0])

        result = await n.gc(client=FailingRemoval(n.client, first[0])).collect()

        assert (result.containers, result.sandboxes, result.failed) == (2, 1, 1)
        assert n.ids(GONE) == stuck
        assert [s.id for s in sandboxes(n.fake, GONE)] == [first[0]]
        assert log_files(n.log_dir(GONE, "gone")) == ["0.log", "1.log"]
        result = await n.gc().collect()
        assert (result.containers, result.sandboxes, result.log_dirs) == (2, 1, 1)
        assert n.ids(GONE) == [] and not n.log_dir(GONE, "gone").exists()


async def test_a_pass_survives_the_runtime_being_down(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with node(tmp_path) as n:
        n.fake.set_unavailable(True)
        result = await n.gc().collect()
        assert (result.dead, result.containers) == (0, 0)


async def test_reclaim_runs_a_pass_for_disk_signals_only(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with node(tmp_path) as n:
        n.existing = {WEB}
        gc = n.gc()
        await n.instances(WEB, "web", await n.sandbox(WEB, "web"), 3)
        await gc.reclaim("memory.available")
        assert gc.passes == 0 and len(n.ids(WEB)) == 3
        await gc.reclaim("nodefs.available")
        assert gc.passes == 1 and len(n.ids(WEB)) == 1


async def test_pod_cgroups_no_pod_owns_go_but_not_one_the_runtime_still_holds(
    fs: FakeCgroupfs, tmp_path: Path
) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    orphan = "6a2d4f00-6666-4000-8000-00000000beef"
    for uid in (WEB, GONE, orphan):
        await cgroups.ensure_pod(cgroup_pod(uid=uid))
    (tmp_path / "runtime").mkdir()
    async with node(tmp_path / "runtime") as n:
        n.existing = {WEB}
        # GONE still runs: its teardown stops it with grace, the sweep must not kill it.
        await n.instances(GONE, "gone", await n.sandbox(GONE, "gone"), 1, last_running=True)
        n.ready = False
        assert (await n.gc(qos=cgroups).collect()).cgroups == 0
        n.ready = True
        assert (await n.gc(qos=cgroups).collect()).cgroups == 1
        assert await cgroups.orphans([WEB]) == [GONE]


# -- beside the sync loop and its pod workers --------------------------------------------------


def restarts(pod: Pod) -> int:
    return pod.status.container_statuses[0].restart_count if pod.status.container_statuses else 0


async def test_gc_beside_a_crash_looping_pod_does_not_disturb_its_worker(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_runtime(tmp_path) as runtime, agent(runtime, pleg=True) as node:
        runtime.fake.script("crash", "main", ContainerScript(exit_after=1.0, exit_code=1))
        gc = ContainerGC(runtime.client, GCPolicy(), existing_pods=node.loop.existing_pods,
                         sources_ready=lambda: node.loop.config.sources_ready,
                         pod_logs_dir=runtime.logs, clock=runtime.wall.now, period=5.0)
        crash = make_pod("crash", WEB)
        async with trio.open_nursery() as nursery:
            await nursery.start(gc.run)
            await node.send.send(pod_set("file", crash))
            pod = await node.wait_for(WEB, lambda p: restarts(p) >= 4, timeout=600)
            # Every instance but the newest dead one (and a current one) is gone ...
            assert 1 <= len(containers(runtime.fake, WEB)) <= 2
            # ... and the worker still counts restarts and reports the last exit.
            pod = await node.wait_for(WEB, lambda p: restarts(p) >= 5, timeout=600)
            status = pod.status.container_statuses[0]
            terminated = status.last_state.terminated or status.state.terminated
            assert terminated is not None and terminated.exit_code == 1
            assert gc.passes > 10

            await node.send.send(pod_set("file"))
            await wait_until(lambda: WEB not in node.loop.workers)
            await trio.sleep(10)
            assert containers(runtime.fake, WEB) == [] and sandboxes(runtime.fake, WEB) == []
            assert list(runtime.logs.iterdir()) == []
            nursery.cancel_scope.cancel()


async def test_a_pass_that_removes_something_is_recorded_and_replays(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The record goes through a recording file; replay re-plans the same removals."""
    from trio_kubelet.recording.records import ContainerGCRecord

    recorder = ListRecorder()
    async with node(tmp_path) as n:
        n.existing = {WEB}
        ids = await n.instances(WEB, "web", await n.sandbox(WEB, "web"), 4)
        gone = await n.sandbox(GONE, "gone")
        (gone_container,) = await n.instances(GONE, "gone", gone, 1)
        await n.client.stop_pod_sandbox(gone[0])
        gc = ContainerGC(n.client, DEFAULT, existing_pods=lambda: n.existing,
                         sources_ready=lambda: n.ready, pod_logs_dir=n.logs,
                         clock=n.wall.now, recorder=recorder)
        await gc.collect()
        await gc.collect()  # nothing left to remove: nothing recorded

    (record,) = recorder.records
    assert isinstance(record, ContainerGCRecord)
    assert sorted(record.removed_containers) == sorted([*ids[:3], gone_container])
    assert record.removed_sandboxes == [gone[0]]
    assert record.existing_pods == [WEB] and record.removed_log_dirs == [
        f"default_gone_{GONE}"]
    result = replay_through_file([record], tmp_path)
    assert result.ok and result.gc_passes == 1
    assert result.trace[-1].summary == (
        "container GC: remove 4 containers, 1 sandboxes, 1 pod log directories")

    kept_more = record.model_copy(update={"policy": (0.0, 2, -1)})  # keep two per container
    diverged = replay_through_file([kept_more], tmp_path)
    assert diverged.divergence is not None
    assert diverged.divergence.reason == (
        "the replayed container GC plan differs from the recorded one")
    assert sorted(diverged.divergence.actual["containers"]) == sorted([*ids[:2], gone_container])
