"""volumes.empty_dir: disk and tmpfs emptyDirs, the tmpfs size, fsGroup on creation."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from trio_kubelet.model.pod import Pod
from trio_kubelet.volumes import mounter
from trio_kubelet.volumes.empty_dir import memory_size, set_up_empty_dir
from trio_kubelet.volumes.errors import VolumeError

GI = 2**30
ALLOCATABLE = {"memory": Fraction(8 * GI)}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "volumes" / "kubernetes.io~empty-dir" / "cache"
    for point in mounter.mount_points_under(tmp_path):
        mounter.unmount(point)


def pod(*memory: str | None, init: tuple[tuple[str, str | None], ...] = ()) -> Pod:
    def container(name: str, limit: str | None, **extra: Any) -> dict[str, Any]:
        limits = {"memory": limit} if limit is not None else {}
        return {"name": name, "image": "x:1", "resources": {"limits": limits}, **extra}

    return Pod.model_validate({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "initContainers": [
                container(name, limit, **({"restartPolicy": "Always"} if name.startswith("side")
                                          else {}))
                for name, limit in init
            ],
            "containers": [container(f"c{i}", limit) for i, limit in enumerate(memory)],
        },
    })


def test_memory_size_is_the_smallest_bound() -> None:
    assert memory_size(pod(None), None, ALLOCATABLE) == 8 * GI
    assert memory_size(pod("1Gi", "512Mi"), None, ALLOCATABLE) == GI + GI // 2
    assert memory_size(pod("1Gi", None), None, ALLOCATABLE) == 8 * GI  # not every limit declared
    assert memory_size(pod("1Gi"), "64Mi", ALLOCATABLE) == 64 * 2**20
    assert memory_size(pod("1Gi"), "2Gi", ALLOCATABLE) == GI  # sizeLimit above the pod's limit
    assert memory_size(pod("16Gi"), None, ALLOCATABLE) == 8 * GI
    assert memory_size(pod(None), None, {}) is None


def test_memory_size_counts_init_containers_and_sidecars() -> None:
    # Sidecar 1Gi runs beside both; the 3Gi init container needs 4Gi, the app 1Gi + 1Gi.
    sized = pod("1Gi", init=(("side", "1Gi"), ("setup", "3Gi")))
    assert memory_size(sized, None, ALLOCATABLE) == 4 * GI
    assert memory_size(pod("1Gi", init=(("setup", None),)), None, ALLOCATABLE) == 8 * GI


def test_disk_empty_dir_is_world_writable_whatever_the_umask(volume: Path) -> None:
    old = os.umask(0o077)
    try:
        set_up_empty_dir(volume, medium="", size=None, fs_group=None)
    finally:
        os.umask(old)
    assert stat.S_IMODE(volume.stat().st_mode) == 0o777
    assert mounter.fs_type(volume) is None


def test_fs_group_is_applied_when_created_only(volume: Path) -> None:
    set_up_empty_dir(volume, medium="", size=None, fs_group=3000)
    info = volume.stat()
    assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (3000, 0o2777)
    data = volume / "data"
    data.write_text("x")
    data.chmod(0o600)
    set_up_empty_dir(volume, medium="", size=None, fs_group=3000)
    assert stat.S_IMODE(data.stat().st_mode) == 0o600


@needs_root
def test_memory_medium_mounts_a_sized_tmpfs_once(volume: Path) -> None:
    set_up_empty_dir(volume, medium="Memory", size=4 * 2**20, fs_group=None)
    set_up_empty_dir(volume, medium="Memory", size=4 * 2**20, fs_group=None)
    assert mounter.mount_points_under(volume) == [volume]
    assert mounter.fs_type(volume) == "tmpfs"
    assert stat.S_IMODE(volume.stat().st_mode) & 0o777 == 0o777  # the tmpfs root's own mode
    fs = os.statvfs(volume)
    assert fs.f_blocks * fs.f_frsize == 4 * 2**20


def test_unknown_mediums_fail(volume: Path) -> None:
    for medium, message in (
        ("Disk", 'unknown storage medium "Disk"'),
        ("HugePages-2Mi", 'storage medium "HugePages-2Mi" is not supported'),
    ):
        with pytest.raises(VolumeError) as caught:
            set_up_empty_dir(volume, medium=medium, size=None, fs_group=None)
        assert (caught.value.reason, caught.value.message) == ("FailedMount", message)
