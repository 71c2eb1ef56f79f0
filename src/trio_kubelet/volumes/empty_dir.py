"""emptyDir volumes: a world-writable directory on the node's disk, or a tmpfs (medium Memory).

The tmpfs is sized as the Go kubelet sizes it: node allocatable memory, lowered to the
pod's memory limit when every container declares one, lowered again to the volume's
``sizeLimit``. A disk emptyDir's ``sizeLimit`` is left to eviction, as in Go. The
volume directories of configMap, secret, downwardAPI and projected volumes are made
the same way (Go wraps them in an emptyDir).
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path

from trio_kubelet.model.pod import Pod, is_sidecar
from trio_kubelet.model.quantity import QuantityError, parse_quantity
from trio_kubelet.volumes import mounter
from trio_kubelet.volumes.errors import FAILED_MOUNT, VolumeError
from trio_kubelet.volumes.ownership import set_volume_ownership

EMPTY_DIR_MODE = 0o777
MEDIUMS = ("", "Memory")


def memory_size(
    pod: Pod, size_limit: str | int | float | None, node_allocatable: Mapping[str, Fraction]
) -> int | None:
    """Bytes for a memory-backed emptyDir; None leaves the kernel default (half of RAM)."""
    size = node_allocatable.get("memory")
    for bound in (_pod_memory_limit(pod), _size_limit(size_limit)):
        if bound is not None and bound > 0 and (size is None or bound <= size):
            size = bound
    return math.ceil(size) if size else None


def _size_limit(size_limit: str | int | float | None) -> Fraction | None:
    if size_limit is None:
        return None
    try:
        return parse_quantity(size_limit)
    except QuantityError as err:
        raise VolumeError(FAILED_MOUNT, f"sizeLimit: {err}") from None


def _pod_memory_limit(pod: Pod) -> Fraction | None:
    """The pod cgroup's memory limit (Go's PodLimits), None unless every container has one.

    Regular containers and sidecars run together; each other init container runs
    beside the sidecars started before it. The pod needs the larger of the two.
    """
    limits: dict[str, Fraction] = {}
    for container in (*pod.spec.init_containers, *pod.spec.containers):
        value = container.resources.limits.get("memory")
        limit = parse_quantity(value) if value is not None else Fraction(0)
        if not limit:
            return None
        limits[container.name] = limit
    sidecars = Fraction(0)
    init_peak = Fraction(0)
    for container in pod.spec.init_containers:
        if is_sidecar(container):
            sidecars += limits[container.name]
        else:
            init_peak = max(init_peak, limits[container.name] + sidecars)
    regular = sidecars + sum((limits[c.name] for c in pod.spec.containers), Fraction(0))
    return max(regular, init_peak)


def set_up_empty_dir(path: Path, *, medium: str, size: int | None, fs_group: int | None) -> None:
    """Make the volume directory (idempotent); ``fs_group`` owns it from its creation on."""
    if medium.startswith("HugePages"):
        raise VolumeError(FAILED_MOUNT, f'storage medium "{medium}" is not supported')
    if medium not in MEDIUMS:
        raise VolumeError(FAILED_MOUNT, f'unknown storage medium "{medium}"')
    created = not path.exists()
    path.mkdir(mode=EMPTY_DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != EMPTY_DIR_MODE:
        os.chmod(path, EMPTY_DIR_MODE)  # the umask took bits away
    if medium == "Memory" and mounter.fs_type(path) != "tmpfs":
        mounter.mount_tmpfs(path, size)  # its root is 1777, as in Go
        created = True
    if created and fs_group is not None:
        set_volume_ownership(path, fs_group, read_only=False)
