"""Benchmark the resource sampler's tick: 110 pods x 2 containers (+ sandboxes), in CPU per tick.

Target: sampling 110 pods costs at most 2 % of a core at the 10 s housekeeping interval, i.e. at
most 200 ms of CPU per tick. One tick = the CRI list calls (answered in-process from serialised
replies, so the decoding the real client does is included: upb for the two lists, betterproto2
for ListContainerStats and ImageFsInfo), the cgroup reads in a worker thread, /proc, statvfs,
log directories, and `build_sample` (rates, pod sums).

Three trees are read:

* ``real_cgroups`` (root only): 330 real cgroups of the hierarchy the machine boots, made
  under ``/sys/fs/cgroup/{cpuacct,memory,pids}/tk-bench-<pid>/`` (v1) or
  ``/sys/fs/cgroup/tk-bench-<pid>/`` (v2), removed at the end, so the kernel generates every
  file as it would for containers;
* ``fake_tree`` and ``fake_tree_v2``: the v1 and the v2 layout as plain files in a temporary
  directory (a memory.stat as Linux 6.18 writes it on v1, as 6.1 writes it on v2).

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
from trio_kubelet.resources.cgroupfs import CGROUP_ROOT, CgroupMode, detect_mode, make_cgroup
from trio_kubelet.runtime import labels as L
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.cri_upb.runtime.v1 import api_pb2 as upb
from trio_kubelet.sources.sampler import Sampler

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_S = 10.0
TARGET_CORE_PERCENT = 2.0
CONTROLLERS = ("cpuacct", "memory", "pids")
_V1_STAT = """cache rss rss_huge shmem mapped_file dirty writeback workingset_refault_anon
    workingset_refault_file swap swapcached pgpgin pgpgout pgfault pgmajfault inactive_anon
    active_anon inactive_file active_file unevictable"""
_V2_STAT = """anon file kernel kernel_stack pagetables sec_pagetables percpu sock vmalloc shmem
    zswap
    zswapped file_mapped file_dirty file_writeback swapcached anon_thp file_thp shmem_thp
    inactive_anon active_anon inactive_file active_file unevictable slab_reclaimable
    slab_unreclaimable slab workingset_refault_anon workingset_refault_file
    workingset_activate_anon workingset_activate_file workingset_restore_anon
    workingset_restore_file workingset_nodereclaim pgscan pgsteal pgscan_kswapd pgscan_direct
    pgsteal_kswapd pgsteal_direct pgfault pgmajfault pgrefill pgactivate pgdeactivate pglazyfree
    pglazyfreed zswpin zswpout thp_fault_alloc thp_collapse_alloc"""


def _memory_stat(keys: list[str]) -> str:
    """A memory.stat with these keys, in the kernel's order, and made-up figures."""
    return "".join(f"{key} {1000 + n * 4096}\n" for n, key in enumerate(keys))


# v1 adds the hierarchical limits and a total_ twin of each figure (42 lines).
V1_MEMORY_STAT = _memory_stat([*_V1_STAT.split(), "hierarchical_memory_limit",
                               "hierarchical_memsw_limit",
                               *(f"total_{key}" for key in _V1_STAT.split())])
V2_MEMORY_STAT = _memory_stat(_V2_STAT.split())


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


def _fake_files(directory: Path, usage: int, mode: CgroupMode) -> None:
    files = {
        "pids.current": "3",
        # ~45 (v1) or ~50 (v2) lines, the figures the sampler wants among them.
        "memory.stat": V1_MEMORY_STAT if mode is CgroupMode.V1 else V2_MEMORY_STAT,
    }
    if mode is CgroupMode.V1:
        files.update({"cpuacct.usage": str(usage * 7), "memory.usage_in_bytes": str(usage),
                      "memory.limit_in_bytes": "9223372036854771712", "memory.failcnt": "0"})
    else:
        files.update({"cpu.stat": f"usage_usec {usage}\nuser_usec {usage}\nsystem_usec 0\n"
                                  "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
                      "memory.current": str(usage), "memory.max": "max"})
    for name, text in files.items():
        (directory / name).write_text(text + ("" if text.endswith("\n") else "\n"))


@contextlib.contextmanager
def fake_tree(ids: Sequence[str], parent: str, mode: CgroupMode) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="tk-bench-cg-"))
    try:
        if mode is CgroupMode.V2:
            (base / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
        else:
            for controller in CONTROLLERS:
                (base / controller).mkdir()
        for id in ids:
            directory = base / ("memory" if mode is CgroupMode.V1 else "") / parent / id
            directory.mkdir(parents=True)
            _fake_files(directory, 10 << 20, mode)
            for controller in ("cpuacct", "pids") if mode is CgroupMode.V1 else ():
                (base / controller / parent).mkdir(exist_ok=True)
                os.symlink(directory, base / controller / parent / id)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def real_cgroups(ids: Sequence[str], parent: str) -> Iterator[Path]:
    """Real, empty cgroups (the kernel makes their files): under each v1 controller's root,
    or in the unified hierarchy with the controllers enabled down to them."""
    made: list[Path] = []
    tops = ([CGROUP_ROOT / c for c in CONTROLLERS] if detect_mode() is CgroupMode.V1
            else [CGROUP_ROOT])
    try:
        for top in tops:
            made.append(top / parent)
            (top / parent).mkdir()
            for id in ids:
                if top == CGROUP_ROOT:
                    make_cgroup(CGROUP_ROOT, (parent, id), required=("cpu", "memory"))
                else:
                    (top / parent / id).mkdir()
                made.append(top / parent / id)
        yield CGROUP_ROOT
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
        with fake_tree(runtime.ids, parent, CgroupMode.V1) as root:
            result["fake_tree"] = measure(root, parent, runtime, args.ticks, Path(logs))
        with fake_tree(runtime.ids, parent, CgroupMode.V2) as root:
            result["fake_tree_v2"] = measure(root, parent, runtime, args.ticks, Path(logs))
        result["cgroup_mode"] = detect_mode().value
        writable = os.geteuid() == 0 and os.access(CGROUP_ROOT, os.W_OK)
        if writable:
            with real_cgroups(runtime.ids, parent) as root:
                result["real_cgroups"] = measure(root, parent, runtime, args.ticks, Path(logs))
                result["real_cgroups_without_cri_stats"] = measure(
                    root, parent, runtime, args.ticks, Path(logs), cri_stats=False)
                sampler = Sampler(cgroup_root=root, cgroup_parent=f"/{parent}",
                                  image_fs=Path("/var/lib"), pod_logs_dir=Path(logs))
                sample = trio.run(sampler.sample_once, runtime)
        else:
            result["real_cgroups"] = {"skipped": "needs root and a writable cgroup hierarchy"}
            with fake_tree(runtime.ids, parent, CgroupMode.V1) as root:
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
