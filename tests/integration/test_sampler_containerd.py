"""The sampler and the OOM watcher on real containerd containers and real cgroup files.

Whichever hierarchy the machine boots: the figures and events asserted here are the
same on cgroup v1 and v2 (the OOM watcher's per-container signal is an eventfd on v1,
memory.events on v2; the container's cgroup path is the same in both).
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import NODE, RunningAgent, container, running, running_agent
from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.core.stats import (
    ContainerSample,
    Sample,
    build_cadvisor_metrics,
    build_resource_metrics,
    build_summary,
)
from trio_kubelet.events import Event, OOMEvent
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.server.app import create_app
from trio_kubelet.server.routes_stats import stats_blueprint
from trio_kubelet.server.view import NodeView
from trio_kubelet.sources.oom import OOMWatcher
from trio_kubelet.sources.pleg import run_pleg
from trio_kubelet.sources.sampler import Sampler

pytestmark = pytest.mark.integration

MiB = 1 << 20
INTERVAL = 0.5


@dataclass
class Stats:
    agent: RunningAgent
    sampler: Sampler
    watcher: OOMWatcher
    ooms: trio.MemoryReceiveChannel[OOMEvent]

    async def sample_where(
        self, predicate: Callable[[Sample], bool], timeout: float = 30.0
    ) -> Sample:
        """The first sample (taken every INTERVAL) that satisfies ``predicate``."""
        with trio.move_on_after(timeout):
            while True:
                sample = self.sampler.latest
                if sample is not None and predicate(sample):
                    return sample
                await trio.sleep(INTERVAL / 2)
        raise AssertionError(f"no sample satisfied the condition in {timeout}s: "
                             f"{self.sampler.latest}")

    async def next_oom(self, timeout: float = 30.0) -> OOMEvent:
        with trio.fail_after(timeout):
            return await self.ooms.receive()


def find(sample: Sample, pod: str, name: str) -> ContainerSample | None:
    for candidate in sample.pods:
        if candidate.name.startswith(f"{pod}-"):
            for c in candidate.containers:
                if c.ref.name == name:
                    return c
    return None


@asynccontextmanager
async def sampling(containerd: Any, tmp_path: Path) -> AsyncIterator[Stats]:
    async with running_agent(containerd.endpoint, tmp_path) as agent, open_cri_client(
        containerd.endpoint, timeout=30.0
    ) as client, trio.open_nursery() as nursery:
        sampler = Sampler(pod_logs_dir=agent.logs, root_fs=tmp_path)  # image fs: from CRI
        watcher = OOMWatcher(on_counts=sampler.set_oom_counts)
        send, receive = trio.open_memory_channel[OOMEvent](100)
        # The watcher learns the containers from a PLEG's relists, as in the agent; this
        # PLEG's own events are not needed.
        pleg_events, _ = trio.open_memory_channel[Event](math.inf)
        nursery.start_soon(functools.partial(
            run_pleg, pleg_events, client, period=0.5, on_relist=watcher.update))
        await nursery.start(lambda task_status: watcher.run(send, task_status=task_status))
        await nursery.start(lambda task_status: sampler.run(
            client, interval=INTERVAL, task_status=task_status))
        yield Stats(agent, sampler, watcher, receive)
        nursery.cancel_scope.cancel()


async def test_cpu_and_memory_figures_move_with_the_containers(
    containerd: Any, tmp_path: Path
) -> None:
    async with sampling(containerd, tmp_path) as stats:
        stats.agent.write("busy.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: busy}
            spec:
              containers:
              - name: burn
                image: busybox:1.36
                command: ["sh", "-c", "while :; do :; done"]
              - name: grow
                image: busybox:1.36
                command: ["sh", "-c",
                          "sleep 2; dd if=/dev/zero of=/dev/shm/fill bs=1M count=48; sleep 3600"]
                resources: {limits: {memory: 256Mi}}
            """)
        await stats.agent.wait_for("busy", lambda p: running(p, "burn") and running(p, "grow"))

        first = await stats.sample_where(lambda s: find(s, "busy", "burn") is not None)
        burn = find(first, "busy", "burn")
        # cgroupsPerQOS (the default): the container sits in its pod's cgroup, in its QoS tier.
        pod_uid = burn.ref.pod_uid if burn is not None else ""
        assert burn is not None
        assert burn.ref.cgroup == f"/kubepods/burstable/pod{pod_uid}/{burn.ref.id}"
        assert burn.ref.pod_namespace == "default"
        assert "busybox" in burn.ref.image, "the image's name, not its id"
        later = await stats.sample_where(
            lambda s: s.monotonic > first.monotonic + 1 and find(s, "busy", "burn") is not None)
        burn_later = find(later, "busy", "burn")
        assert burn_later is not None
        assert burn.figures.cpu_usage_ns is not None and burn_later.figures.cpu_usage_ns
        # The busy loop is Burstable with no CPU request: on a loaded 2-core box it can be
        # squeezed well below a core, so these prove its CPU is counted, not how much it gets.
        assert burn_later.figures.cpu_usage_ns > burn.figures.cpu_usage_ns + 0.05e9
        assert burn_later.cpu_nano_cores is not None and burn_later.cpu_nano_cores > 50_000_000
        assert later.node.cpu_nano_cores is not None and later.node.cpu_nano_cores > 300_000_000

        grown = await stats.sample_where(lambda s: (
            (c := find(s, "busy", "grow")) is not None
            and (c.figures.memory_working_set_bytes or 0) > 48 * MiB))
        grow = find(grown, "busy", "grow")
        assert grow is not None and grow.figures.memory_limit_bytes == 256 * MiB
        assert grow.figures.threads is not None and grow.figures.threads >= 1

        pod = next(p for p in grown.pods if p.name.startswith("busy-"))
        assert pod.sandbox is not None, "the pause container is part of the pod"
        summary = build_summary(grown, NODE, stats.agent.store.pods())
        (pod_json,) = [p for p in summary["pods"] if p["podRef"]["name"] == pod.name]
        assert pod_json["memory"]["workingSetBytes"] > 48 * MiB
        assert pod_json["cpu"]["usageNanoCores"] > 50_000_000
        assert {c["name"] for c in pod_json["containers"]} == {"burn", "grow"}
        assert "ephemeral-storage" in pod_json
        # containerd refreshes ImageFsInfo and snapshot usage in the background (every 10 s).
        image_fs = summary["node"]["runtime"]["imageFs"]
        assert image_fs["usedBytes"] >= 0 and image_fs["capacityBytes"] > 0

        resource = {f.name: f for f in text_string_to_metric_families(
            build_resource_metrics(grown))}
        cpu = {s.labels["container"]: s.value
               for s in resource["container_cpu_usage_seconds"].samples}
        assert cpu["burn"] > 0.05
        # The same sample through the stats blueprint, as a scraper sees it.
        view = NodeView(options=AgentOptions(config=KubeletConfiguration(), node_name=NODE),
                        store=stats.agent.store, client=None,  # type: ignore[arg-type]
                        last_relist=lambda: None, last_sync_loop=lambda: None,
                        latest_sample=lambda: grown)
        http = create_app(view, [stats_blueprint(view)]).test_client()
        response = await http.get("/metrics/cadvisor")
        assert response.status_code == 200
        cadvisor = {f.name: f for f in text_string_to_metric_families(
            await response.get_data(as_text=True))}
        ws = {s.labels["container"]: s.value
              for s in cadvisor["container_memory_working_set_bytes"].samples
              if s.labels["pod"] == pod.name}
        assert ws["grow"] > 48 * MiB
        summary = await (await http.get("/stats/summary")).get_json()
        assert summary["node"]["nodeName"] == NODE


async def test_an_oom_kill_is_counted_and_reported(containerd: Any, tmp_path: Path) -> None:
    async with sampling(containerd, tmp_path) as stats:
        # dd is killed, the shell (and so the container) lives on with the count.
        stats.agent.write("survivor.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: survivor}
            spec:
              containers:
              - name: hog
                image: busybox:1.36
                command: ["sh", "-c",
                          "sleep 2; dd if=/dev/zero of=/dev/null bs=64M count=1; sleep 3600"]
                resources: {limits: {memory: 16Mi}}
            """)
        await stats.agent.wait_for("survivor", lambda p: running(p, "hog"))
        event = await stats.next_oom()
        assert (event.pod_name, event.container_name, event.count) == (
            "survivor-itest-node", "hog", 1)
        assert event.process in ("dd", ""), event
        sample = await stats.sample_where(lambda s: s.oom_events.get(event.container_id) == 1)
        assert event.container_id in stats.watcher.watched(), "registered before the kill"
        cadvisor = {f.name: f for f in text_string_to_metric_families(
            build_cadvisor_metrics(sample))}
        (oom,) = [s for s in cadvisor["container_oom_events"].samples
                  if s.labels["container"] == "hog"]
        assert oom.value == 1 and oom.labels["pod"] == "survivor-itest-node"
        (limit,) = [s for s in cadvisor["container_spec_memory_limit_bytes"].samples
                    if s.labels["container"] == "hog"]
        assert limit.value == 16 * MiB

        # The main process killed at once: the cgroup goes with it, the kernel log tells.
        stats.agent.write("oom.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: oom}
            spec:
              restartPolicy: Never
              containers:
              - name: hog
                image: busybox:1.36
                command: ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]
                resources: {limits: {memory: 16Mi}}
            """)
        event = await stats.next_oom()
        assert (event.pod_name, event.container_name, event.count) == ("oom-itest-node", "hog", 1)
        # Named by /dev/kmsg ("dd") unless the cgroup's eventfd was registered in time ("").
        assert event.process in ("dd", ""), event
        pod = await stats.agent.wait_for("oom", lambda p: p.status.phase == "Failed")
        terminated = container(pod, "hog").state.terminated
        # containerd 1.6 itself sometimes loses this race and reports reason "Error"; the
        # watcher's event is what lets the agent say OOMKilled regardless.
        assert terminated is not None and terminated.exit_code == 137
        assert (terminated.container_id or "").endswith(event.container_id)
