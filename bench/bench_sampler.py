"""Benchmark the resource sampler's tick: 110 pods x 2 containers (+ sandboxes), in CPU per tick.

Target: sampling 110 pods costs at most 2 % of a core at the 10 s housekeeping interval, i.e. at
most 200 ms of CPU per tick. One tick = the CRI list calls (answered in-process from serialised
replies, so the decoding the real client does is included: upb for the two lists, betterproto2
for ListContainerStats and ImageFsInfo), the cgroup reads in a worker thread, /proc, statvfs,
log directories, and `build_sample` (rates, pod sums).

Two trees are read:

* ``real_cgroups`` (root only): 330 real cgroup v1 groups made under
  ``/sys/fs/cgroup/{cpuacct,memory,pids}/tk-bench-<pid>/`` (removed at the end), so the kernel
  generates every memory.stat as it would for containers;
* ``fake_tree``: the same layout as plain files in a temporary directory.

CPU is the process's (all threads) ``time.process_time()`` over ``--ticks`` back-to-back ticks.
The renderings the servers cache per sample (/stats/summary, /metrics/cadvisor,
/metrics/resource) are timed too. Prints one JSON object.
Usage: ``python bench/bench_sampler.py [--pods 110] [--containers 2] [--ticks 30]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import trio
from bench_steady_state import tree_version

from trio_kubelet.core.stats import (
    Sample,
    build_cadvisor_metrics,
    build_resource_metrics,
    summary_json,
)
from trio_kubelet.runtime import labels as L
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.cri_upb.runtime.v1 import api_pb2 as upb
from trio_kubelet.sources.sampler import Sampler

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_S = 10.0
TARGET_CORE_PERCENT = 2.0
CONTROLLERS = ("cpuacct", "memory", "pids")


class SerialisedRuntime:
    """The sampler's CRI calls, each decoding a serialised reply as the real client would."""

    def __init__(self, pods: int, containers: int) -> None:
        sandboxes, listed, stats = [], [], []
        for p in range(pods):
            uid = f"{p:08d}-0000-4000-8000-000000000000"
            labels = {L.POD_UID: uid, L.POD_NAME: f"pod-{p}", L.POD_NAMESPACE: "bench",
                      L.MANAGED_BY: L.MANAGED_BY_VALUE}
            sandbox_id = f"{p:032d}{0:032d}"
            sandboxes.append(v1.PodSandbox(
                id=sandbox_id, state=v1.PodSandboxState.SANDBOX_READY, labels=labels,
                created_at=time.time_ns(),
                metadata=v1.PodSandboxMetadata(name=f"pod-{p}", namespace="bench", uid=uid)))
            for c in range(containers):
                id = f"{p:032d}{c + 1:032d}"
                listed.append(v1.Container(
                    id=id, pod_sandbox_id=sandbox_id, state=v1.ContainerState.CONTAINER_RUNNING,
                    labels={**labels, L.CONTAINER_NAME: f"c{c}"},
                    metadata=v1.ContainerMetadata(name=f"c{c}"),
                    image=v1.ImageSpec(image="sha256:" + "a" * 64,
                                       user_specified_image="busybox:1.36"),
                    image_ref="sha256:" + "a" * 64, created_at=time.time_ns()))
                stats.append(v1.ContainerStats(
                    attributes=v1.ContainerAttributes(id=id, labels=labels),
                    cpu=v1.CpuUsage(timestamp=1, usage_core_nano_seconds=v1.UInt64Value(5)),
                    memory=v1.MemoryUsage(timestamp=1, working_set_bytes=v1.UInt64Value(5)),
                    writable_layer=v1.FilesystemUsage(
                        timestamp=1, fs_id=v1.FilesystemIdentifier(mountpoint="/var/lib/x"),
                        used_bytes=v1.UInt64Value(4096), inodes_used=v1.UInt64Value(3))))
        self.ids = [c.id for c in listed] + [s.id for s in sandboxes]
        self._containers = bytes(v1.ListContainersResponse(containers=listed))
        self._sandboxes = bytes(v1.ListPodSandboxResponse(items=sandboxes))
        self._stats = bytes(v1.ListContainerStatsResponse(stats=stats))
        self._image_fs = bytes(v1.ImageFsInfoResponse(image_filesystems=[v1.FilesystemUsage(
            timestamp=1, used_bytes=v1.UInt64Value(1 << 30), inodes_used=v1.UInt64Value(9))]))
        self._images = bytes(v1.ListImagesResponse(images=[v1.Image(
            id="sha256:" + "a" * 64, repo_tags=["docker.io/library/busybox:1.36"])]))

    async def list_containers_brief(self, *, call_timeout: float | None = None) -> Sequence[Any]:
        containers: Sequence[Any] = upb.ListContainersResponse.FromString(
            self._containers).containers
        return containers

    async def list_pod_sandbox_brief(self, *, call_timeout: float | None = None) -> Sequence[Any]:
        items: Sequence[Any] = upb.ListPodSandboxResponse.FromString(self._sandboxes).items
        return items

    async def list_container_stats_brief(
        self, *, call_timeout: float | None = None
    ) -> Sequence[Any]:
        stats: Sequence[Any] = upb.ListContainerStatsResponse.FromString(self._stats).stats
        return stats

    async def image_fs_info(self, *, call_timeout: float | None = None) -> v1.ImageFsInfoResponse:
        return v1.ImageFsInfoResponse.parse(self._image_fs)

    async def list_images(self, *, call_timeout: float | None = None) -> list[v1.Image]:
        return v1.ListImagesResponse.parse(self._images).images


def _fake_files(directory: Path, usage: int) -> None:
    (directory / "cpuacct.usage").write_text(f"{usage * 7}\n")
    (directory / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (directory / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (directory / "memory.failcnt").write_text("0\n")
    (directory / "pids.current").write_text("3\n")
    # A real memory.stat: ~40 lines, the figures the sampler wants among them.
    with open("/sys/fs/cgroup/memory/memory.stat") as template:
        (directory / "memory.stat").write_text(template.read())


@contextlib.contextmanager
def fake_tree(ids: Sequence[str], parent: str) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="tk-bench-cg-"))
    try:
        for controller in CONTROLLERS:
            (base / controller).mkdir()
        for id in ids:
            directory = base / "memory" / parent / id
            directory.mkdir(parents=True)
            _fake_files(directory, 10 << 20)
            for controller in ("cpuacct", "pids"):
                (base / controller / parent).mkdir(exist_ok=True)
                os.symlink(directory, base / controller / parent / id)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def real_cgroups(ids: Sequence[str], parent: str) -> Iterator[Path]:
    """Real, empty cgroups (the kernel makes their files) under each controller's root."""
    made: list[Path] = []
    try:
        for controller in CONTROLLERS:
            top = Path("/sys/fs/cgroup") / controller / parent
            top.mkdir()
            made.append(top)
            for id in ids:
                (top / id).mkdir()
                made.append(top / id)
        yield Path("/sys/fs/cgroup")
    finally:
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _ticks(sampler: Sampler, runtime: SerialisedRuntime, ticks: int
                 ) -> tuple[list[float], list[float], Sample]:
    await sampler.sample_once(runtime)  # warm-up: machine info, cgroup locations, image names
    cpu_ms, wall_ms = [], []
    sample = None
    for _ in range(ticks):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        sample = await sampler.sample_once(runtime)
        cpu_ms.append((time.process_time() - cpu0) * 1000)
        wall_ms.append((time.perf_counter() - wall0) * 1000)
    assert sample is not None
    return cpu_ms, wall_ms, sample


def measure(root: Path, parent: str, runtime: SerialisedRuntime, ticks: int,
            logs: Path, cri_stats: bool = True) -> dict[str, Any]:
    sampler = Sampler(cgroup_root=root, cgroup_parent=f"/{parent}", root_fs=Path("/"),
                      image_fs=Path("/var/lib"), pod_logs_dir=logs, cri_stats=cri_stats)
    cpu_ms, wall_ms, sample = trio.run(_ticks, sampler, runtime, ticks)
    sampled = sum(1 for _ in sample.containers())
    assert sampled == len(runtime.ids), f"sampled {sampled} of {len(runtime.ids)} cgroups"
    median = statistics.median(cpu_ms)
    return {
        "cgroups_sampled": sampled,
        "tick_cpu_ms_median": round(median, 2),
        "tick_cpu_ms_p95": round(_percentile(cpu_ms, 0.95), 2),
        "tick_wall_ms_median": round(statistics.median(wall_ms), 2),
        "core_percent_at_10s": round(median / (INTERVAL_S * 1000) * 100, 3),
        "within_target": median / (INTERVAL_S * 1000) * 100 <= TARGET_CORE_PERCENT,
    }


def render_costs(sample: Sample, repeats: int = 20) -> dict[str, float]:
    def best(fn: Any) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return round(min(times) * 1000, 2)

    return {
        "summary_ms": best(lambda: summary_json(sample, "bench-node")),
        "cadvisor_ms": best(lambda: build_cadvisor_metrics(sample)),
        "resource_ms": best(lambda: build_resource_metrics(sample)),
        "cadvisor_bytes": len(build_cadvisor_metrics(sample)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--containers", type=int, default=2, help="containers per pod")
    parser.add_argument("--ticks", type=int, default=30)
    args = parser.parse_args()

    load_at_start = round(os.getloadavg()[0], 2)
    runtime = SerialisedRuntime(args.pods, args.containers)
    parent = f"tk-bench-{os.getpid()}"
    result: dict[str, Any] = {
        "pods": args.pods, "containers_per_pod": args.containers,
        "cgroups": len(runtime.ids), "interval_s": INTERVAL_S,
        "target_core_percent": TARGET_CORE_PERCENT,
    }
    with tempfile.TemporaryDirectory(prefix="tk-bench-logs-") as logs:
        with fake_tree(runtime.ids, parent) as root:
            result["fake_tree"] = measure(root, parent, runtime, args.ticks, Path(logs))
        writable = os.geteuid() == 0 and os.access("/sys/fs/cgroup/memory", os.W_OK)
        if writable:
            with real_cgroups(runtime.ids, parent) as root:
                result["real_cgroups"] = measure(root, parent, runtime, args.ticks, Path(logs))
                result["real_cgroups_without_cri_stats"] = measure(
                    root, parent, runtime, args.ticks, Path(logs), cri_stats=False)
                sampler = Sampler(cgroup_root=root, cgroup_parent=f"/{parent}",
                                  image_fs=Path("/var/lib"), pod_logs_dir=Path(logs))
                sample = trio.run(sampler.sample_once, runtime)
        else:
            result["real_cgroups"] = {"skipped": "needs root and a writable cgroup v1 memory"}
            with fake_tree(runtime.ids, parent) as root:
                sampler = Sampler(cgroup_root=root, cgroup_parent=f"/{parent}",
                                  image_fs=Path("/var/lib"), pod_logs_dir=Path(logs))
                sample = trio.run(sampler.sample_once, runtime)
        result["render_once_per_sample"] = render_costs(sample)
    result["tree"] = tree_version()
    result["loadavg_1m_at_start"] = load_at_start
    result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
