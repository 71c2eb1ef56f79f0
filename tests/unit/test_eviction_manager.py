"""resources.eviction: the manager's rounds over synthetic samples, with a fake set of pods."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.unit.test_eviction import (
    T0,
    GiB,
    MiB,
    make_pod,
    make_sample,
    pod_sample,
    storage_pod,
    storage_sample,
)
from trio_kubelet.config import ConfigError, KubeletConfiguration, load_config_file
from trio_kubelet.core.eviction import parse_thresholds
from trio_kubelet.core.stats import FsFigures, Sample
from trio_kubelet.events import Event, EvictPod, NodeConditions
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import Pod
from trio_kubelet.resources.eviction import EvictionConfig, EvictionManager

STATIC = {"kubernetes.io/config.source": "file"}
API = {"kubernetes.io/config.source": "api"}


@dataclass
class FakePods:
    """The sync loop as the manager sees it: active pods, and evictions carried out at once."""

    pods: list[Pod]
    evicted: list[tuple[str, str, int]] = field(default_factory=list)
    conditions: list[tuple[str, ...]] = field(default_factory=list)

    def active_pods(self) -> list[Pod]:
        gone = {uid for uid, _, _ in self.evicted}
        return [p for p in self.pods if p.metadata.uid not in gone]

    def spec_seq(self, uid: str) -> int:
        return -1  # no recording here: no event set the specs

    async def send(self, event: Event) -> None:
        """The sync loop's channel: evictions carried out at once, conditions kept."""
        if isinstance(event, EvictPod):
            assert event.reason == "Evicted"
            self.evicted.append((event.pod_uid, event.message, event.grace))
        elif isinstance(event, NodeConditions):
            self.conditions.append(tuple(event.conditions))

    def stopped(self, uid: str) -> bool:
        return any(evicted == uid for evicted, _, _ in self.evicted)


@dataclass
class FakeEvents:
    node_name: str = "node-a"
    node_events: list[tuple[str, str, str]] = field(default_factory=list)
    pod_events: list[tuple[str, str, str, str]] = field(default_factory=list)

    def node_event(self, node: str, type: str, reason: str, message: str) -> None:
        self.node_events.append((type, reason, message))

    def pod_event(self, pod: Pod, type: str, reason: str, message: str, *_: Any) -> None:
        self.pod_events.append((pod.metadata.name, type, reason, message))


@dataclass
class Latest:
    sample: Sample | None = None

    def __call__(self) -> Sample | None:
        return self.sample


@dataclass
class Reclaimer:
    signals: list[str] = field(default_factory=list)

    async def reclaim(self, signal: str) -> None:
        self.signals.append(signal)


def memory_sample(node_ws: int, time: float = T0) -> Sample:
    """A 4 GiB node: a hog using 900 MiB over its 100 MiB request, a pod within its own,
    and a static pod using the most of all."""
    return make_sample(time=time, capacity=4 * GiB, node_working_set=node_ws, pods=[
        pod_sample("uid-hog", memory={"main": 900 * MiB}),
        pod_sample("uid-good", memory={"main": 50 * MiB}),
        pod_sample("uid-static", memory={"main": 2 * GiB}),
    ])


def memory_pods() -> list[Pod]:
    return [
        make_pod("static", annotations=STATIC),
        make_pod("good", memory_request="1Gi", annotations=API),
        make_pod("hog", memory_request="100Mi", annotations=API),
    ]


def manager(pods: FakePods, latest: Latest, **kwargs: Any) -> tuple[EvictionManager, FakeEvents,
                                                                      AgentMetrics]:
    events, metrics = FakeEvents(), AgentMetrics("node-a")
    config = kwargs.pop("config", None) or EvictionConfig(
        thresholds=parse_thresholds({"memory.available": "500Mi", "nodefs.available": "10%"}))
    evictions = EvictionManager(
        config, pods, latest, pods.send, wall_clock=lambda: T0 + trio.current_time(),
        stopped=pods.stopped, events=events, metrics=metrics, **kwargs,  # type: ignore[arg-type]
    )
    return evictions, events, metrics


async def test_the_pod_beyond_its_request_is_evicted_and_never_a_static_one() -> None:
    pods, latest = FakePods(memory_pods()), Latest(memory_sample(3800 * MiB))
    evictions, events, metrics = manager(pods, latest)

    assert await evictions.synchronize() == ("uid-hog",)

    (_, message, grace), = pods.evicted
    assert grace == 1  # hard threshold: at once
    assert message == (
        "The node was low on resource: memory. Threshold quantity: 500Mi, available: 296Mi. "
        "Container main was using 900Mi, request is 100Mi, has larger consumption of memory. "
    )
    assert events.node_events == [("Warning", "EvictionThresholdMet",
                                   "Attempting to reclaim memory")]
    assert events.pod_events == [("hog", "Warning", "Evicted", message)]
    assert evictions.node_conditions() == ("MemoryPressure",)
    assert evictions.memory_pressure() and not evictions.disk_pressure()
    assert metrics.evictions.labels("memory.available")._value.get() == 1


def storage_case() -> tuple[FakePods, Latest]:
    """Three pods: an emptyDir past its 1Mi, a container past its 2Mi, one within limits;
    and memory starved (the round still ends with the storage evictions)."""
    pods = [storage_pod("disk", size_limit="1Mi", annotations=API),
            storage_pod("logs", limits={"main": "2Mi", "side": "8Mi"}, annotations=API),
            storage_pod("calm", size_limit="64Mi", annotations=API)]
    sample = storage_sample(
        (pod_sample("uid-disk"), 3 * MiB),
        (pod_sample("uid-logs", rootfs={"main": MiB}, logs={"main": 2 * MiB}), None),
        (pod_sample("uid-calm", memory={"main": 3 * GiB}), 3 * MiB))
    return FakePods(pods), Latest(dataclasses.replace(
        sample, node=make_sample(node_working_set=3800 * MiB).node))


async def test_pods_past_their_own_storage_limits_are_all_evicted_in_one_round() -> None:
    pods, latest = storage_case()
    evictions, events, metrics = manager(pods, latest)

    assert await evictions.synchronize() == ("uid-disk", "uid-logs")

    disk = 'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". '
    logs = 'Container main exceeded its local ephemeral storage limit "2Mi". '
    assert pods.evicted == [("uid-disk", disk, 1), ("uid-logs", logs, 1)]
    assert events.pod_events == [("disk", "Warning", "Evicted", disk),
                                 ("logs", "Warning", "Evicted", logs)]
    assert events.node_events == [], "no threshold acted on in that round"
    assert evictions.node_conditions() == ("MemoryPressure",), "but the conditions are reported"
    assert metrics.evictions.labels("emptydirfs.limit")._value.get() == 1
    assert metrics.evictions.labels("ephemeralcontainerfs.limit")._value.get() == 1


async def test_storage_limits_are_enforced_without_thresholds_unless_switched_off(
    tmp_path: Path
) -> None:
    pods, latest = storage_case()
    evictions, _, _ = manager(pods, latest, config=EvictionConfig(thresholds=()))
    assert await evictions.synchronize() == ("uid-disk", "uid-logs")

    pods, latest = storage_case()
    config = EvictionConfig(thresholds=(), local_storage_capacity_isolation=False)
    evictions, _, _ = manager(pods, latest, config=config)
    assert await evictions.synchronize() == ()
    assert pods.evicted == []
    (tmp_path / "config.yaml").write_text("apiVersion: kubelet.config.k8s.io/v1beta1\n"
                                          "kind: KubeletConfiguration\n"
                                          "localStorageCapacityIsolation: false\n")
    off = EvictionConfig.from_config(load_config_file(tmp_path / "config.yaml"))
    assert not off.local_storage_capacity_isolation
    assert EvictionConfig.from_config(KubeletConfiguration()).local_storage_capacity_isolation


async def test_nothing_is_evicted_while_the_thresholds_hold() -> None:
    pods, latest = FakePods(memory_pods()), Latest(memory_sample(2 * GiB))
    evictions, events, _ = manager(pods, latest)
    assert await evictions.synchronize() == ()
    assert pods.evicted == [] and events.node_events == []
    assert evictions.node_conditions() == ()


async def test_only_critical_pods_left_means_no_eviction() -> None:
    pods = FakePods([make_pod("static", annotations=STATIC),
                     make_pod("dns", priority=2_000_000_000, annotations=API)])
    evictions, _, _ = manager(pods, Latest(memory_sample(3900 * MiB)))
    assert await evictions.synchronize() == ()
    assert pods.evicted == []
    assert evictions.memory_pressure()


async def test_no_sample_yet_means_no_round() -> None:
    evictions, _, _ = manager(FakePods(memory_pods()), Latest(None))
    assert await evictions.synchronize() == ()
    assert evictions.rounds == 0


def disk_sample(available: int, time: float = T0) -> Sample:
    fs = FsFigures(capacity_bytes=100 * GiB, available_bytes=available, used_bytes=0,
                   inodes=1000, inodes_free=500)
    return make_sample(time=time, root_fs=fs, image_fs=fs, pods=[
        pod_sample("uid-logger", rootfs={"main": 0}, logs={"main": 5 * GiB}),
    ])


async def test_disk_pressure_tries_node_level_reclaim_first() -> None:
    pods = FakePods([make_pod("logger", annotations=API)])
    reclaimer, latest = Reclaimer(), Latest(disk_sample(1 * GiB))

    async def refresh() -> Sample:
        latest.sample = disk_sample(50 * GiB, time=T0 + 1)
        return latest.sample

    evictions, _, _ = manager(pods, latest, reclaimer=reclaimer, refresh=refresh)
    assert await evictions.synchronize() == ()
    assert reclaimer.signals == ["nodefs.available"]
    assert pods.evicted == []
    assert evictions.disk_pressure()


async def test_when_reclaim_is_not_enough_a_pod_goes() -> None:
    pods = FakePods([make_pod("logger", annotations=API)])
    reclaimer, latest = Reclaimer(), Latest(disk_sample(1 * GiB))

    async def refresh() -> Sample:
        return disk_sample(2 * GiB, time=T0 + 1)

    evictions, _, metrics = manager(pods, latest, reclaimer=reclaimer, refresh=refresh)
    assert await evictions.synchronize() == ("uid-logger",)
    (_, message, _), = pods.evicted
    assert message.startswith("The node was low on resource: ephemeral-storage. ")
    assert "Container main was using 5Gi, request is 0" in message
    assert metrics.evictions.labels("nodefs.available")._value.get() == 1


async def test_one_pod_per_round_and_never_twice_on_the_same_sample(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pods, latest = FakePods(memory_pods()), Latest(memory_sample(3800 * MiB))
    evictions, _, _ = manager(pods, latest)
    async with trio.open_nursery() as nursery:
        await nursery.start(evictions.run)
        await trio.sleep(95)  # many rounds, one sample
        assert [uid for uid, _, _ in pods.evicted] == ["uid-hog"]
        latest.sample = memory_sample(3800 * MiB, time=T0 + 100)  # still short
        await trio.sleep(15)
        assert [uid for uid, _, _ in pods.evicted] == ["uid-hog", "uid-good"]
        nursery.cancel_scope.cancel()


def test_the_configuration_is_checked_before_the_agent_starts() -> None:
    config = KubeletConfiguration(eviction_soft={"memory.available": "1Gi"})
    with pytest.raises(ConfigError, match=r"evictionSoftGracePeriod\[memory.available\]"):
        EvictionConfig.from_config(config)
    parsed = EvictionConfig.from_config(KubeletConfiguration(), pods_memory_limit=GiB)
    signals = [t.signal for t in parsed.thresholds]
    assert signals[:2] == ["memory.available", "allocatableMemory.available"]
    assert parsed.transition_period == 300 and parsed.pods_memory_limit == GiB
    off = EvictionConfig.from_config(KubeletConfiguration(enforce_node_allocatable=["none"]))
    assert "allocatableMemory.available" not in [t.signal for t in off.thresholds]


async def test_a_sample_taken_before_the_evicted_pod_stopped_does_not_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class SlowToStop(FakePods):
        def stopped(self, uid: str) -> bool:
            return trio.current_time() >= 5  # the kill takes 5 s

    pods, latest = SlowToStop(memory_pods()), Latest(memory_sample(3800 * MiB))
    evictions, _, _ = manager(pods, latest)
    async with trio.open_nursery() as nursery:
        await nursery.start(evictions.run)
        await trio.sleep(3)
        latest.sample = memory_sample(3900 * MiB, time=T0 + 3)  # the hog, still dying
        await trio.sleep(20)
        assert [uid for uid, _, _ in pods.evicted] == ["uid-hog"]
        latest.sample = memory_sample(3900 * MiB, time=T0 + 23)  # short after the hog left
        await trio.sleep(10)
        assert [uid for uid, _, _ in pods.evicted] == ["uid-hog", "uid-good"]
        nursery.cancel_scope.cancel()


async def test_rounds_that_evict_back_to_back_still_let_other_tasks_run() -> None:
    import time

    class Endless(FakePods):
        """Every eviction is accepted and the pod stays: round after round evicts (up to a cap,
        so a loop that never yields ends instead of hanging the test)."""

        def active_pods(self) -> list[Pod]:
            return self.pods

        async def send(self, event: Event) -> None:
            if len(self.evicted) < 5000:
                await super().send(event)

    pods = Endless([make_pod("p", annotations=API)])
    evictions = EvictionManager(
        EvictionConfig(thresholds=parse_thresholds({"memory.available": "500Mi"})),
        pods,
        lambda: make_sample(time=time.time(), node_working_set=4 * GiB),  # always fresh
        pods.send,
        wall_clock=time.time,
        stopped=lambda uid: True,  # nothing ever running: no wait
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(evictions.run)
        await trio.sleep(0.01)
        seen = len(pods.evicted)
        nursery.cancel_scope.cancel()
    assert 0 < seen < 5000


async def test_reclaimers_are_asked_in_turn_even_when_one_fails() -> None:
    from trio_kubelet.resources.eviction import NodeReclaimers

    class Broken:
        async def reclaim(self, signal: str) -> None:
            raise RuntimeError("runtime down")

    first, last = Reclaimer(), Reclaimer()
    await NodeReclaimers(first, Broken(), last).reclaim("imagefs.available")
    assert first.signals == last.signals == ["imagefs.available"]


async def test_the_node_status_reads_the_managers_pressure() -> None:
    from trio_kubelet.node.conditions import node_conditions
    from trio_kubelet.node.manager import RuntimeProbe

    pods, latest = FakePods(memory_pods()), Latest(memory_sample(3800 * MiB))
    evictions, _, _ = manager(pods, latest)
    health = RuntimeProbe(runtime=None).health(lambda: None, evictions)  # type: ignore[arg-type]
    assert not health.memory_pressure()
    await evictions.synchronize()
    assert health.memory_pressure() and not health.disk_pressure() and not health.pid_pressure()
    conditions = node_conditions([], now=T0, not_ready=[], memory_pressure=health.memory_pressure())
    memory = next(c for c in conditions if c["type"] == "MemoryPressure")
    assert (memory["status"], memory["reason"]) == ("True", "KubeletHasInsufficientMemory")


async def test_after_reclaim_the_next_sample_decides(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pods = FakePods([make_pod("logger", annotations=API)])
    reclaimer, latest = Reclaimer(), Latest(disk_sample(1 * GiB))
    evictions, _, _ = manager(pods, latest, reclaimer=reclaimer)  # no refresh: wait for a tick

    async def sampler_ticks() -> None:
        await trio.sleep(4)
        latest.sample = disk_sample(50 * GiB, time=T0 + 4)  # GC freed enough

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler_ticks)
        assert await evictions.synchronize() == ()
    assert reclaimer.signals == ["nodefs.available"] and pods.evicted == []
    assert trio.current_time() >= 4

    # Short again, and no sample after the reclaim within two intervals: a pod goes.
    latest.sample = disk_sample(1 * GiB, time=T0 + 4)
    assert await evictions.synchronize() == ("uid-logger",)
    assert trio.current_time() >= 4 + 2 * evictions.config.monitoring_interval
