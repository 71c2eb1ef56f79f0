"""Pod volume figures for the Summary API, measured once a minute (Go's fsResourceAnalyzer).

Every ``VOLUME_STATS_PERIOD`` each volume under
``<root-dir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`` is walked as du walks it
(allocated blocks, one inode per entry, symlinks not followed, other mounts not entered)
and the filesystem holding it is read with statvfs. hostPath volumes are the node's own
directories and are not measured (Go's plugin reports nothing for them either). An emptyDir
without a medium and a configMap live on the node's disk: they count as the pod's local
ephemeral storage. The walk runs in a worker thread; the sampler copies `latest` into each
sample, so a scrape never walks anything.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import trio

from trio_kubelet.core.stats import FsUsage, VolumeUsage
from trio_kubelet.sources.sampler import statvfs

__all__ = ["VOLUME_STATS_PERIOD", "VolumeStats", "disk_usage", "measure_pod_volumes"]

log = logging.getLogger("trio_kubelet.volume_stats")

VOLUME_STATS_PERIOD = 60.0  # the Go kubelet's volumeStatsAggPeriod default
_NOT_MEASURED = frozenset({"kubernetes.io~host-path"})
_ON_NODE_DISK = frozenset({"kubernetes.io~empty-dir", "kubernetes.io~configmap"})


def disk_usage(path: Path) -> FsUsage | None:
    """Allocated bytes and entries below ``path`` on its filesystem, as ``du`` counts them.

    Entries that vanish during the walk are skipped; None when ``path`` itself cannot be read.
    """
    try:
        top = os.lstat(path)
    except OSError:
        return None
    used, inodes = top.st_blocks * 512, 1
    pending = [os.fspath(path)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            used += st.st_blocks * 512
            inodes += 1
            if entry.is_dir(follow_symlinks=False) and st.st_dev == top.st_dev:
                pending.append(entry.path)
    return FsUsage(used_bytes=used, inodes_used=inodes)


def measure_pod_volumes(pods_dir: Path) -> dict[str, tuple[VolumeUsage, ...]]:
    """Every pod's measured volumes (blocking: run it in a thread), by pod UID."""
    measured: dict[str, tuple[VolumeUsage, ...]] = {}
    try:
        pods = sorted(os.scandir(pods_dir), key=lambda e: e.name)
    except OSError:
        return measured
    for pod in pods:
        volumes: list[VolumeUsage] = []
        for plugin in _entries(Path(pod.path) / "volumes"):
            if plugin.name in _NOT_MEASURED:
                continue
            for volume in _entries(Path(plugin.path)):
                usage = disk_usage(Path(volume.path))
                if usage is None:
                    continue
                # A volume that is a mount of its own (tmpfs: a memory emptyDir, secrets)
                # does not use the node's disk.
                own_mount = _device(volume.path) != _device(plugin.path)
                volumes.append(VolumeUsage(
                    name=volume.name, usage=usage, fs=statvfs(Path(volume.path)),
                    ephemeral=plugin.name in _ON_NODE_DISK and not own_mount,
                ))
        if volumes:
            measured[pod.name] = tuple(sorted(volumes, key=lambda v: v.name))
    return measured


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        return sorted((e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)),
                      key=lambda e: e.name)
    except OSError:
        return []


def _device(path: str) -> int | None:
    try:
        return os.lstat(path).st_dev
    except OSError:
        return None


class VolumeStats:
    """The volume measurer of one node; `run` is its task, `latest` what it last found."""

    def __init__(self, pods_dir: Path, period: float | None = None) -> None:
        self._pods_dir = pods_dir
        self._period = period if period is not None else VOLUME_STATS_PERIOD
        self._latest: Mapping[str, tuple[VolumeUsage, ...]] = MappingProxyType({})

    def latest(self) -> Mapping[str, tuple[VolumeUsage, ...]]:
        """Pod UID -> its volumes, as of the last pass (empty before the first)."""
        return self._latest

    async def measure(self) -> None:
        """One pass now."""
        found = await trio.to_thread.run_sync(measure_pod_volumes, self._pods_dir)
        self._latest = MappingProxyType(found)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """A pass now and then every period; a failed pass is logged and the next one tried.

        A period of zero or less (Go's negative volumeStatsAggPeriod) switches the walks off:
        no pass, and no volume figures.
        """
        task_status.started()
        if self._period <= 0:
            log.info("Pod volume stats are off (volumeStatsAggPeriod %ss)", self._period)
            return
        while True:
            try:
                await self.measure()
            except Exception:  # figures are best effort: never take the agent down
                log.exception("Measuring pod volumes failed; next try in %.0fs", self._period)
            await trio.sleep(self._period)
