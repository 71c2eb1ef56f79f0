"""postStart and preStop hooks in the pod workers, and the grace arithmetic around them.

The workers run against the fake runtime under trio's MockClock (autojump), so hook
durations and grace periods are exact; ``FakeRuntime.container_calls`` shows the
order in which hooks (ExecSync) and kills (StopContainer) reached the runtime.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

from trio_kubelet.clock import TrioWallClock
from trio_kubelet.core.actions import REASON_LIVENESS_PROBE
from trio_kubelet.core.grace import (
    MINIMUM_GRACE_PERIOD_SECONDS,
    at_least_minimum,
    kill_grace_period,
    remaining_grace,
    termination_grace_period,
    termination_prerequisites,
)
from trio_kubelet.events import Event, PodSetUpdate, ResyncTick
from trio_kubelet.images.manager import ImageManager
from trio_kubelet.kube_events import EventRecorder, EventType, ObjectRef
from trio_kubelet.model.pod import ContainerStatus, Pod
from trio_kubelet.reconcile.loop import SyncLoop
from trio_kubelet.reconcile.workers import WorkerContext
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import ContainerScript, ExecResult, FakeRuntime, open_fake_runtime
from trio_kubelet.status.store import PodStatusStore

T0 = 1_700_000_000.0
UID = "5d1f0c22-7777-4000-8000-000000000001"
IMAGE = "busybox:1.36"
PRE_STOP = ["sh", "-c", "drain"]
POST_START = ["sh", "-c", "warm-up"]


# -- the grace arithmetic (pure) -------------------------------------------------------------


def make_pod(
    *,
    tgps: int = 10,
    policy: str = "Always",
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    deletion_grace: int | None = None,
) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": "web",
                "namespace": "default",
                "uid": UID,
                "deletionGracePeriodSeconds": deletion_grace,
            },
            "spec": {
                "restartPolicy": policy,
                "terminationGracePeriodSeconds": tgps,
                "initContainers": init or [],
                "containers": containers or [{"name": "main", "image": IMAGE}],
            },
        }
    )


def test_the_grace_a_kill_starts_from_has_no_floor() -> None:
    pod = make_pod(tgps=0)
    # 0 s means no preStop hook at all; only the final StopContainer gets the 2 s floor.
    assert termination_grace_period(pod, pod.spec.containers[0], "") == 0
    assert kill_grace_period(pod, pod.spec.containers[0], "") == MINIMUM_GRACE_PERIOD_SECONDS
    assert termination_grace_period(make_pod(deletion_grace=0), None, "") == 0
    assert termination_grace_period(pod, None, "", override=7) == 7


def test_probe_grace_still_applies_to_probe_kills() -> None:
    probe = {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 3}
    pod = make_pod(tgps=40, containers=[{"name": "main", "image": IMAGE, "livenessProbe": probe}])
    assert termination_grace_period(pod, pod.spec.containers[0], REASON_LIVENESS_PROBE) == 3


def test_waiting_spends_whole_seconds_of_the_grace_and_the_floor_comes_last() -> None:
    assert remaining_grace(30, 4.9) == 26  # Go truncates the seconds a hook took
    assert remaining_grace(30, 0.2) == 30
    assert remaining_grace(5, 5.0) == 0
    assert at_least_minimum(remaining_grace(5, 5.0)) == 2
    assert at_least_minimum(remaining_grace(10, 3.0)) == 7


def test_sidecars_outlive_the_regular_containers_and_later_sidecars() -> None:
    sidecar = {"image": IMAGE, "restartPolicy": "Always"}
    pod = make_pod(
        init=[
            {"name": "setup", "image": IMAGE},
            {"name": "log", **sidecar},
            {"name": "proxy", **sidecar},
        ],
        containers=[{"name": "app", "image": IMAGE}, {"name": "worker", "image": IMAGE}],
    )
    order = termination_prerequisites(pod, {"app", "worker", "log", "proxy"})
    assert order == {"proxy": {"app", "worker"}, "log": {"app", "worker", "proxy"}}
    # Only running containers are waited for.
    assert termination_prerequisites(pod, {"app", "log"}) == {"log": {"app"}}
    assert termination_prerequisites(pod, {"worker", "log", "proxy"}) == {
        "proxy": {"worker"},
        "log": {"worker", "proxy"},
    }


def test_a_pod_without_sidecars_stops_all_at_once() -> None:
    pod = make_pod(containers=[{"name": "a", "image": IMAGE}, {"name": "b", "image": IMAGE}])
    assert termination_prerequisites(pod, {"a", "b"}) == {}


# -- hooks in the workers --------------------------------------------------------------------


class Reported(EventRecorder):
    """Keeps what was reported: (fieldPath, type, reason, message)."""

    def __init__(self) -> None:
        super().__init__("node-a")
        self.seen: list[tuple[str, EventType, str, str]] = []

    def event(
        self, ref: ObjectRef, type: EventType, reason: str, message: str, *, logged: bool = False
    ) -> None:
        self.seen.append((ref.field_path, type, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.seen]


@dataclass
class Node:
    fake: FakeRuntime
    store: PodStatusStore
    send: trio.MemorySendChannel[Event]
    events: Reported
    known: dict[str, str] = field(default_factory=dict)  # container ID -> name, ever seen

    async def run_pods(self, *pods: Pod) -> None:
        await self.send.send(PodSetUpdate(source="file", pods=list(pods)))

    async def wait_for(self, predicate: Callable[[Pod], bool], timeout: float = 120.0) -> Pod:
        with trio.move_on_after(timeout):  # virtual seconds
            while True:
                self.remember_names()
                pod = self.store.get(UID)
                if pod is not None and predicate(pod):
                    return pod
                await self.store.wait_changed()
        pod = self.store.get(UID)
        raise AssertionError(
            "pod did not reach the expected state; last status: "
            + (pod.status.model_dump_json(exclude_none=True) if pod else "absent")
        )

    async def wait_gone(self, timeout: float = 120.0) -> None:
        with trio.fail_after(timeout):
            while self.store.get(UID) is not None:
                await self.store.wait_changed()

    def remember_names(self) -> None:
        listed = self.fake.list_containers(v1.ListContainersRequest()).containers
        self.known.update((c.id, c.labels[labels.CONTAINER_NAME]) for c in listed)

    def calls(self) -> list[tuple[str, str, tuple[str, ...] | int]]:
        """The runtime's ExecSync/StopContainer calls, with container names for IDs."""
        self.remember_names()
        return [
            (method, self.known.get(cid, cid), detail)
            for method, cid, detail in self.fake.container_calls
        ]


@asynccontextmanager
async def fake_node(tmp_path: Path) -> AsyncIterator[Node]:
    wall = TrioWallClock(epoch=T0)
    events = Reported()
    async with (
        open_fake_runtime(clock=wall.now, timeout=5.0) as (fake, client),
    ):
        fake.add_image(IMAGE)
        store = PodStatusStore()
        ctx = WorkerContext(
            client=client,
            images=ImageManager(client, events),
            store=store,
            clock=wall,
            pod_logs_dir=tmp_path / "logs",
            events=events,
        )
        loop = SyncLoop(ctx, ["file"])
        send, receive = trio.open_memory_channel[Event](math.inf)
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run, receive)
            yield Node(fake, store, send, events)
            nursery.cancel_scope.cancel()


def status(pod: Pod, name: str = "main") -> ContainerStatus:
    return next(
        s
        for s in (*pod.status.init_container_statuses, *pod.status.container_statuses)
        if s.name == name
    )


def running(pod: Pod, name: str = "main", restarts: int = 0) -> bool:
    s = status(pod, name)
    return s.state.running is not None and s.restart_count == restarts


def with_hooks(
    *,
    post_start: list[str] | None = None,
    pre_stop: dict[str, Any] | None = None,
    name: str = "main",
    **extra: Any,
) -> dict[str, Any]:
    lifecycle: dict[str, Any] = {}
    if post_start is not None:
        lifecycle["postStart"] = {"exec": {"command": post_start}}
    if pre_stop is not None:
        lifecycle["preStop"] = pre_stop
    return {"name": name, "image": IMAGE, "lifecycle": lifecycle, **extra}


async def test_post_start_runs_right_after_the_start(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script(
            "web", "main", ContainerScript(exec_results={tuple(POST_START): ExecResult(delay=3.0)})
        )
        begun = trio.current_time()
        await node.run_pods(make_pod(containers=[with_hooks(post_start=POST_START)]))
        await node.wait_for(running)
        assert node.calls() == [("ExecSync", "main", tuple(POST_START))]
        # The sync that started it ends (and reports it) only once the hook is done.
        assert trio.current_time() - begun >= 3
        assert "FailedPostStartHook" not in node.events.reasons()


async def test_failed_post_start_kills_the_container_and_the_restart_policy_decides(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script(
            "web",
            "main",
            ContainerScript(exec_results={("false",): ExecResult(stderr=b"nope\n", exit_code=1)}),
        )
        pod = make_pod(policy="Never", containers=[with_hooks(post_start=["false"])])
        await node.run_pods(pod)
        done = await node.wait_for(lambda p: p.status.phase == "Failed")
        terminated = status(done).state.terminated
        assert terminated is not None and terminated.exit_code == 143  # SIGTERM, not a crash
        assert node.calls() == [("ExecSync", "main", ("false",)), ("StopContainer", "main", 10)]
        field = "spec.containers{main}"
        assert (field, "Warning", "FailedPostStartHook", "PostStartHook failed") in node.events.seen
        assert (field, "Normal", "Killing", "FailedPostStartHook") in node.events.seen


async def test_failed_post_start_under_always_restarts_with_a_rising_count(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script(
            "web", "main", ContainerScript(exec_results={("false",): ExecResult(exit_code=1)})
        )
        await node.run_pods(make_pod(containers=[with_hooks(post_start=["false"])]))
        failed = await node.wait_for(
            lambda p: (
                status(p).state.waiting is not None
                and status(p).state.waiting.reason == "PostStartHookError"
            )
        )
        waiting = status(failed).state.waiting
        assert waiting is not None and waiting.message is not None
        assert "command 'false' exited with 1" in waiting.message
        await node.wait_for(lambda p: status(p).restart_count >= 2, timeout=600)
        assert node.events.reasons().count("FailedPostStartHook") >= 2


async def test_pre_stop_runs_before_the_stop_and_its_time_comes_off_the_grace(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        # The process ignores SIGTERM: StopContainer lasts exactly the grace it is given.
        node.fake.script(
            "web",
            "main",
            ContainerScript(term_grace=1000, exec_results={tuple(PRE_STOP): ExecResult(delay=4.0)}),
        )
        pre_stop = {"exec": {"command": PRE_STOP}}
        await node.run_pods(make_pod(tgps=10, containers=[with_hooks(pre_stop=pre_stop)]))
        await node.wait_for(running)
        begun = trio.current_time()
        await node.run_pods()  # the pod is gone from its source: tear it down
        await node.wait_gone()
        assert node.calls() == [("ExecSync", "main", tuple(PRE_STOP)), ("StopContainer", "main", 6)]
        assert trio.current_time() - begun < 10.5  # 4 s hook + 6 s stop: the pod's 10 s


async def test_pre_stop_that_outlasts_the_grace_is_cut_off_and_the_floor_applies(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script(
            "web", "main", ContainerScript(exec_results={tuple(PRE_STOP): ExecResult(delay=300.0)})
        )
        pre_stop = {"exec": {"command": PRE_STOP}}
        await node.run_pods(make_pod(tgps=5, containers=[with_hooks(pre_stop=pre_stop)]))
        await node.wait_for(running)
        begun = trio.current_time()
        await node.run_pods()
        await node.wait_gone()
        assert node.calls()[-1] == ("StopContainer", "main", MINIMUM_GRACE_PERIOD_SECONDS)
        assert trio.current_time() - begun < 10


async def test_failed_pre_stop_is_reported_and_the_kill_goes_on(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script(
            "web", "main", ContainerScript(exec_results={tuple(PRE_STOP): ExecResult(exit_code=2)})
        )
        pre_stop = {"exec": {"command": PRE_STOP}}
        await node.run_pods(make_pod(tgps=10, containers=[with_hooks(pre_stop=pre_stop)]))
        await node.wait_for(running)
        await node.run_pods()
        await node.wait_gone()
        assert node.calls() == [
            ("ExecSync", "main", tuple(PRE_STOP)),
            ("StopContainer", "main", 10),
        ]
        field = "spec.containers{main}"
        assert (field, "Warning", "FailedPreStopHook", "PreStopHook failed") in node.events.seen


async def test_no_pre_stop_with_a_zero_grace_period(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        pre_stop = {"exec": {"command": PRE_STOP}}
        await node.run_pods(make_pod(tgps=0, containers=[with_hooks(pre_stop=pre_stop)]))
        await node.wait_for(running)
        await node.run_pods()
        await node.wait_gone()
        assert node.calls() == [("StopContainer", "main", MINIMUM_GRACE_PERIOD_SECONDS)]


async def test_sleep_pre_stop_on_a_container_killed_for_a_spec_change(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        pre_stop = {"sleep": {"seconds": 3}}
        await node.run_pods(make_pod(tgps=10, containers=[with_hooks(pre_stop=pre_stop)]))
        await node.wait_for(running)
        begun = trio.current_time()
        changed = with_hooks(pre_stop=pre_stop, command=["sleep", "100"])
        await node.run_pods(make_pod(tgps=10, containers=[changed]))
        await node.wait_for(lambda p: running(p, restarts=1))
        assert node.calls() == [("StopContainer", "main", 7)]
        assert trio.current_time() - begun >= 3


async def test_sidecars_stop_after_the_regular_containers_in_what_is_left_of_their_grace(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fake_node(tmp_path) as node:
        node.fake.script("web", "main", ContainerScript(term_grace=3.0, stop_exit_code=0))
        pre_stop = {"exec": {"command": PRE_STOP}}
        sidecar = with_hooks(name="proxy", pre_stop=pre_stop, restartPolicy="Always")
        await node.run_pods(
            make_pod(tgps=10, init=[sidecar], containers=[with_hooks(pre_stop=pre_stop)])
        )
        await node.wait_for(lambda p: running(p, "proxy"))
        await node.send.send(ResyncTick())  # the PLEG would report the sidecar started
        await node.wait_for(running)
        await node.run_pods()
        await node.wait_gone()
        calls = node.calls()
        # Both hooks run at once, first; the sidecar's stop waits 3 s for main's.
        assert sorted(calls[:2]) == [
            ("ExecSync", "main", tuple(PRE_STOP)),
            ("ExecSync", "proxy", tuple(PRE_STOP)),
        ]
        assert calls[2:] == [("StopContainer", "main", 10), ("StopContainer", "proxy", 7)]
