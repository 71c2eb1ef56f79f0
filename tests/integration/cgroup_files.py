"""The machine's real cgroup hierarchy, as the integration tests look at it in either mode.

``MODE`` is what `resources.cgroupfs.detect_mode` finds at /sys/fs/cgroup: on cgroup
v1 a cgroup's files are below each controller's mount, on v2 in its one directory
(the ``controller`` argument is then ignored). The tests assert each mode's own file
names and values: cpu.shares and cpu.weight, cfs_quota_us and cpu.max, and so on.
"""

from __future__ import annotations

import os
from pathlib import Path

from trio_kubelet.resources.cgroupfs import (
    CGROUP_ROOT,
    CgroupMode,
    available_controllers,
    detect_mode,
)

CGROUPS = CGROUP_ROOT
MODE = detect_mode(CGROUPS)
V2 = MODE is CgroupMode.V2


def has_controllers(*names: str) -> bool:
    """Whether the hierarchy offers these controllers (v1: mounted; v2: in the root's list)."""
    if V2:
        return set(names) <= available_controllers(CGROUPS)
    return all((CGROUPS / name).is_dir() for name in names)


def directory(controller: str, *parts: str) -> Path:
    """A cgroup's directory for ``controller`` (v1) or its one directory (v2)."""
    return CGROUPS.joinpath(*parts) if V2 else CGROUPS.joinpath(controller, *parts)


def read(controller: str, *parts: str) -> str:
    """A cgroup file: ``parts`` are the cgroup's path components, then the file name."""
    return directory(controller, *parts).read_text().strip()


def hierarchies() -> list[Path]:
    """Every hierarchy a cgroup may be in: each mounted v1 one once (cpu and cpuacct are
    often one mount), or the unified one."""
    if V2:
        return [CGROUPS]
    seen: dict[str, Path] = {}
    for entry in sorted(CGROUPS.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            seen.setdefault(os.path.realpath(entry), entry)
    return list(seen.values())


def go_cpu_weight(shares: int) -> int:
    """The weight the Go kubelet writes for cpu.shares on v2 (its getCPUWeight), restated
    here so the tests do not check the agent's conversion against itself."""
    return 10000 if shares >= 262144 else 1 + (shares - 2) * 9999 // 262142
