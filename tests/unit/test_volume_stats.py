"""sources.volume_stats: du-style walks of pod volumes, which of them are ephemeral storage."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from trio_kubelet.sources.volume_stats import VolumeStats, disk_usage, measure_pod_volumes

UID = "4f0c7a1e-2b3c-4d5e-8f90-0a1b2c3d4e5f"


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))  # real blocks: du counts what is allocated


def test_disk_usage_counts_allocated_blocks_and_entries_without_following_links(
    tmp_path: Path,
) -> None:
    write(tmp_path / "v" / "a", 64 * 1024)
    write(tmp_path / "v" / "sub" / "b", 32 * 1024)
    (tmp_path / "v" / "link").symlink_to(tmp_path)  # not followed: the walk stays inside
    usage = disk_usage(tmp_path / "v")
    assert usage is not None
    assert usage.inodes_used == 5  # v, a, sub, b, link
    assert 96 * 1024 <= (usage.used_bytes or 0) < 96 * 1024 + 64 * 1024
    assert disk_usage(tmp_path / "missing") is None


def test_every_pod_volume_but_host_paths_is_measured(tmp_path: Path) -> None:
    volumes = tmp_path / UID / "volumes"
    write(volumes / "kubernetes.io~empty-dir" / "scratch" / "data", 128 * 1024)
    write(volumes / "kubernetes.io~configmap" / "config" / "app.conf", 100)
    write(volumes / "kubernetes.io~secret" / "creds" / "token", 100)
    write(volumes / "kubernetes.io~host-path" / "host" / "big", 256 * 1024)
    (tmp_path / "other-pod").mkdir()  # no volumes: not listed
    found = measure_pod_volumes(tmp_path)
    assert list(found) == [UID]
    by_name = {v.name: v for v in found[UID]}
    assert sorted(by_name) == ["config", "creds", "scratch"]
    assert (by_name["scratch"].usage.used_bytes or 0) >= 128 * 1024
    assert by_name["scratch"].fs is not None and by_name["scratch"].fs.capacity_bytes > 0
    # On the node's disk: an emptyDir and a configMap; a secret is not ephemeral storage.
    assert [by_name[n].ephemeral for n in ("scratch", "config", "creds")] == [True, True, False]
    assert measure_pod_volumes(tmp_path / "missing") == {}


async def test_the_task_measures_at_start_and_every_period(tmp_path: Path) -> None:
    stats = VolumeStats(tmp_path, period=0.05)
    assert stats.latest() == {}
    async with trio.open_nursery() as nursery:
        await nursery.start(stats.run)
        with trio.fail_after(5):
            write(tmp_path / UID / "volumes" / "kubernetes.io~empty-dir" / "x" / "f", 4096)
            while UID not in stats.latest():
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    (volume,) = stats.latest()[UID]
    assert volume.name == "x" and volume.ephemeral


async def test_a_negative_period_switches_the_walks_off(tmp_path: Path) -> None:
    write(tmp_path / UID / "volumes" / "kubernetes.io~empty-dir" / "x" / "f", 4096)
    stats = VolumeStats(tmp_path, period=-1)
    with trio.fail_after(5):
        await stats.run()  # returns at once instead of looping
    assert stats.latest() == {}
