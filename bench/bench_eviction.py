"""The eviction monitor's cost: 100 pods, one round every 10 s, in CPU per round and % of a core.

Target (issue 7): the eviction monitor at a 10 s interval costs at most 1 % of a core, i.e. at
most 100 ms of CPU per round.

A round is `EvictionManager.synchronize`: the sampler's latest sample turned into signal
observations, the thresholds (the Go defaults plus allocatableMemory.available) assessed against
the round's state, and — when a threshold is met — the node event, the ranking of every active
pod and the eviction message for the one chosen. Samples are synthetic (``--pods`` pods of two
containers and a sandbox each, filesystems and pids filled in, a new timestamp every round so no
round is skipped as stale); the pods are real `Pod` models; the sync loop is a stand-in whose
``evict`` accepts and keeps the pod active, so every pressure round ranks the full set. The
sampler's own tick is not counted (``bench_sampler.py`` measures it).

Three figures, CPU from ``time.process_time()``:

* ``quiet``: no threshold met — what every round costs on a healthy node;
* ``pressure``: memory.available under its hard threshold every round — ranking and eviction;
* ``quiet_storage_limits``: ``quiet`` with every pod limiting its local storage (an emptyDir
  sizeLimit and ephemeral-storage limits, none exceeded), so each round runs the local storage
  check over all of them (pods without such limits are not checked);
* ``loop`` (``--window`` seconds, 0 to skip): the manager's real ``run`` task under trio at its
  real 10 s interval over a quiet node, whole-process CPU over the window (trio's idle included).

Prints one JSON object. Usage:
``python bench/bench_eviction.py [--pods 100] [--rounds 300] [--window 60]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import trio
from bench_steady_state import tree_version

from trio_kubelet.core.eviction import MONITORING_INTERVAL
from trio_kubelet.core.stats import (
    CgroupFigures,
    ContainerRef,
    ContainerSample,
    FsFigures,
    FsUsage,
    MachineInfo,
    NodeReading,
    NodeSample,
    PodSample,
    Sample,
    VolumeUsage,
)
from trio_kubelet.events import Event, EvictPod
from trio_kubelet.kube_events import EventRecorder
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import Pod
from trio_kubelet.resources.eviction import EvictionConfig, EvictionManager

GiB = 1 << 30
MiB = 1 << 20
CAPACITY = 16 * GiB
T0 = 1_700_000_000.0


def make_pods(count: int, *, storage_limits: bool = False) -> list[Pod]:
    pods = []
    limits = {"ephemeral-storage": "2Gi"} if storage_limits else {}
    scratch = {"sizeLimit": "1Gi"} if storage_limits else {}
    for index in range(count):
        requests = {"memory": f"{64 + index % 4 * 64}Mi"} if index % 3 else {}
        pods.append(Pod.model_validate({
            "metadata": {"name": f"pod-{index}", "namespace": "bench", "uid": f"uid-{index:04}",
                         "annotations": {"kubernetes.io/config.source": "api"}},
            "spec": {
                "priority": index % 5,
                "volumes": [{"name": "scratch", "emptyDir": scratch}],
                "containers": [
                    {"name": name, "image": "busybox:1.36",
                     "resources": {"requests": requests, "limits": limits}}
                    for name in ("app", "sidecar")
                ],
            },
        }))
    return pods


def make_sample(pods: list[Pod], time: float, node_working_set: int) -> Sample:
    pod_samples = []
    for index, pod in enumerate(pods):
        uid = pod.metadata.uid
        members = []
        for name in ("", "app", "sidecar"):
            ref = ContainerRef(id=f"{uid}-{name or 'sandbox'}", name=name, pod_uid=uid,
                               pod_name=pod.metadata.name, pod_namespace="bench",
                               image="busybox", created_at=T0, cgroup="", sandbox=not name)
            memory = (index * 7 % 50 + 1) * MiB if name else MiB
            members.append(ContainerSample(
                ref=ref,
                figures=CgroupFigures(memory_working_set_bytes=memory, threads=3),
                rootfs=FsUsage(index * 4096, 10) if name else None,
                logs=FsUsage(index * 1024, 2) if name else None,
            ))
        pod_samples.append(PodSample(
            uid=uid, name=pod.metadata.name, namespace="bench", start_time=T0,
            figures=CgroupFigures(
                memory_working_set_bytes=sum(m.figures.memory_working_set_bytes or 0
                                             for m in members),
                threads=9,
            ),
            cpu_nano_cores=None, containers=tuple(members[1:]), sandbox=members[0],
        ))
    fs = FsFigures(capacity_bytes=100 * GiB, available_bytes=60 * GiB, used_bytes=40 * GiB,
                   inodes=6_000_000, inodes_free=5_000_000)
    image_fs = FsFigures(capacity_bytes=200 * GiB, available_bytes=150 * GiB,
                         used_bytes=50 * GiB, inodes=12_000_000, inodes_free=11_000_000)
    reading = NodeReading(figures=CgroupFigures(memory_working_set_bytes=node_working_set),
                          root_fs=fs, image_fs=image_fs, max_pid=4_194_304, processes=900)
    volumes = {p.uid: (VolumeUsage("scratch", FsUsage(index * MiB, 100), fs, ephemeral=True),)
               for index, p in enumerate(pod_samples)}
    return Sample(timestamp=time, monotonic=time - T0,
                  machine=MachineInfo(num_cores=2, memory_capacity_bytes=CAPACITY),
                  node=NodeSample(reading), pods=tuple(pod_samples), volumes=volumes)


class StandIn:
    """The sync loop's side: every pod stays active; evictions are counted, not carried out."""

    def __init__(self, pods: list[Pod]) -> None:
        self.pods = pods
        self.evictions = 0

    def active_pods(self) -> list[Pod]:
        return list(self.pods)

    async def send(self, event: Event) -> None:
        """The sync loop's channel: evictions are counted."""
        self.evictions += isinstance(event, EvictPod)


def build(pods: list[Pod], latest: Callable[[], Sample | None],
          now: Callable[[], float]) -> tuple[EvictionManager, StandIn]:
    from trio_kubelet.config import KubeletConfiguration

    config = EvictionConfig.from_config(KubeletConfiguration(), pods_memory_limit=CAPACITY)
    stand_in = StandIn(pods)
    manager = EvictionManager(
        config, stand_in, latest, stand_in.send, wall_clock=now, stopped=lambda uid: True,
        events=EventRecorder("bench"), metrics=AgentMetrics("bench"),
    )
    return manager, stand_in


async def rounds(pods: list[Pod], count: int, node_working_set: int) -> dict[str, Any]:
    """``count`` back-to-back rounds, each on a fresh sample; CPU per round."""
    samples = [make_sample(pods, T0 + 10 * (i + 1), node_working_set) for i in range(count)]
    current: list[Sample] = []
    manager, stand_in = build(pods, lambda: current[-1] if current else None,
                              lambda: current[-1].timestamp if current else T0)
    per_round = []
    for sample in samples:
        current.append(sample)
        start = time.process_time()
        await manager.synchronize()
        per_round.append((time.process_time() - start) * 1000)
    mean = statistics.fmean(per_round)
    return {
        "rounds": count,
        "evictions": stand_in.evictions,
        "conditions": list(manager.node_conditions()),
        "cpu_ms_per_round_mean": round(mean, 3),
        "cpu_ms_per_round_p50": round(statistics.median(per_round), 3),
        "cpu_ms_per_round_max": round(max(per_round), 3),
        "cpu_percent_of_core_at_10s": round(mean / (MONITORING_INTERVAL * 1000) * 100, 4),
    }


async def loop_window(pods: list[Pod], window: float) -> dict[str, Any]:
    """The real run task at its real interval over a quiet node: whole-process CPU."""
    samples: list[Sample] = []

    def latest() -> Sample:
        # A new sample every time it is asked for, as if the sampler had ticked.
        samples.append(make_sample(pods, time.time(), 4 * GiB))
        return samples[-1]

    manager, _ = build(pods, latest, time.time)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        start = time.process_time()
        await trio.sleep(window)
        used = time.process_time() - start
        nursery.cancel_scope.cancel()
    return {
        "window_s": window,
        "rounds": manager.rounds,
        "cpu_percent_of_core": round(used / window * 100, 4),
        "note": "includes building one synthetic sample per round (the sampler's part)",
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    pods = make_pods(args.pods)
    quiet = await rounds(pods, args.rounds, node_working_set=4 * GiB)
    pressure = await rounds(pods, args.rounds, node_working_set=CAPACITY - 50 * MiB)
    limited = await rounds(make_pods(args.pods, storage_limits=True), args.rounds,
                           node_working_set=4 * GiB)
    result: dict[str, Any] = {
        "bench": "eviction",
        "pods": args.pods,
        "interval_s": MONITORING_INTERVAL,
        "target": "<= 1 % of a core (<= 100 ms CPU per 10 s round)",
        "quiet": quiet,
        "pressure": pressure,
        "quiet_storage_limits": limited,
    }
    if args.window > 0:
        result["loop"] = await loop_window(pods, args.window)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--window", type=float, default=60.0)
    arguments = parser.parse_args()
    load_at_start = round(os.getloadavg()[0], 2)
    report = trio.run(main, arguments)
    report["tree"] = tree_version()
    report["python"] = platform.python_version()
    report["loadavg_1m_at_start"] = load_at_start
    report["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, indent=2))
