"""The node's cgroup filesystem: which hierarchy it mounts, and the cgroup files read and written.

The mode is chosen once, from what is mounted at the cgroup root (``/sys/fs/cgroup``):

* **v2** (the unified hierarchy): ``cgroup2`` is mounted there, so its top holds
  ``cgroup.controllers``. One tree; a cgroup's files for every controller are in its
  one directory; controllers reach a child only once its parent lists them in
  ``cgroup.subtree_control``.
* **v1**: one mount per controller (``cpu``, ``memory``, …) below the root. The hybrid
  layout (v1 controllers plus an empty ``cgroup2`` at ``unified/``, as systemd sets up)
  counts as v1: the controllers the kubelet uses are all on v1 mounts, which is what
  runc's ``IsCgroup2UnifiedMode`` and so the Go kubelet decide too.

cgroupspy handles v1 control (`resources.cgroups`); it knows nothing of v2, so the v2
readers and writers are here, as plain file operations, together with the figure
readers of both modes the sampler and the OOM watcher share (the hot path: ``os.open``
and ``os.read``, no text layer).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trio_kubelet.core.pod_cgroups import CPU_PERIOD_US
from trio_kubelet.core.stats import CgroupFigures, memory_limit, working_set

__all__ = [
    "CGROUP_ROOT",
    "CgroupMode",
    "CgroupRoots",
    "available_controllers",
    "detect_mode",
    "make_cgroup",
    "page_size",
    "parse_keyed",
    "read_bytes",
    "read_cgroup",
    "read_int",
    "read_oom_kills",
    "set_cpu",
    "set_hugetlb",
    "write_control",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")


class CgroupMode(enum.Enum):
    V1 = "v1"
    V2 = "v2"


def detect_mode(root: Path = CGROUP_ROOT) -> CgroupMode:
    """`CgroupMode.V2` when the unified hierarchy is mounted at ``root``, else `V1`.

    Every cgroup of a cgroup2 mount has ``cgroup.controllers``; v1's ``root`` is a
    tmpfs of mount points, which has none, and the hybrid layout's cgroup2 is below
    it (``unified/``), so both read as v1.
    """
    return CgroupMode.V2 if (root / "cgroup.controllers").is_file() else CgroupMode.V1


# -- reading ---------------------------------------------------------------------------------------


def read_bytes(path: bytes, size: int = 64) -> bytes | None:
    """A cgroup or /proc file's contents; None when it is gone (or the cgroup is going)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_int(path: bytes) -> int | None:
    data = read_bytes(path)
    if not data:
        return None
    try:
        return int(data)
    except ValueError:
        return None


def parse_keyed(data: bytes, keys: Collection[bytes]) -> dict[bytes, int]:
    """The ``keys`` of a flat keyed file ("<key> <value>" lines: memory.stat, cpu.stat,
    memory.events, v1's memory.oom_control)."""
    figures: dict[bytes, int] = {}
    for line in data.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key in keys:
            figures[key] = int(value)
    return figures


@dataclass(frozen=True, slots=True)
class CgroupRoots:
    """Where the files of the controllers the sampler reads are: one mount each on v1,
    all in one directory on v2 (then the three roots are the same)."""

    mode: CgroupMode
    cpuacct: bytes
    memory: bytes
    pids: bytes

    @classmethod
    def under(cls, root: Path) -> CgroupRoots:
        mode = detect_mode(root)
        if mode is CgroupMode.V2:
            top = os.fsencode(root)
            return cls(mode, top, top, top)
        return cls(mode, *(os.fsencode(root / name) for name in ("cpuacct", "memory", "pids")))


def read_cgroup(roots: CgroupRoots, cgroup: bytes) -> CgroupFigures | None:
    """One cgroup's figures (``cgroup`` b"" is the root), or None when it does not exist."""
    if roots.mode is CgroupMode.V2:
        return _read_v2(roots.memory + cgroup, is_root=not cgroup)
    return _read_v1(roots, cgroup)


_V1_MEMORY_STAT = frozenset(
    {b"total_rss", b"total_cache", b"total_inactive_file", b"total_pgfault", b"total_pgmajfault"}
)


def _read_v1(roots: CgroupRoots, cgroup: bytes) -> CgroupFigures | None:
    memory = roots.memory + cgroup
    usage = read_int(memory + b"/memory.usage_in_bytes")
    cpu = read_int(roots.cpuacct + cgroup + b"/cpuacct.usage")
    if usage is None and cpu is None:
        return None
    stat: dict[bytes, int] = {}
    if usage is not None:
        data = read_bytes(memory + b"/memory.stat", 8192)
        stat = parse_keyed(data, _V1_MEMORY_STAT) if data else {}
    return CgroupFigures(
        cpu_usage_ns=cpu,
        memory_usage_bytes=usage,
        memory_working_set_bytes=(
            None if usage is None else working_set(usage, stat.get(b"total_inactive_file"))
        ),
        memory_rss_bytes=stat.get(b"total_rss"),
        memory_cache_bytes=stat.get(b"total_cache"),
        memory_limit_bytes=memory_limit(read_int(memory + b"/memory.limit_in_bytes")),
        memory_failcnt=read_int(memory + b"/memory.failcnt"),
        page_faults=stat.get(b"total_pgfault"),
        major_page_faults=stat.get(b"total_pgmajfault"),
        threads=read_int(roots.pids + cgroup + b"/pids.current"),
    )


_V2_CPU_STAT = frozenset({b"usage_usec"})
_V2_MEMORY_STAT = frozenset({b"anon", b"file", b"inactive_file", b"pgfault", b"pgmajfault"})


def _read_v2(directory: bytes, *, is_root: bool) -> CgroupFigures | None:
    """What cAdvisor (through runc's fs2 stats) makes of a v2 cgroup: usage from
    memory.current, the working set less ``inactive_file``, rss and cache from ``anon`` and
    ``file``. The root has no memory.current: its usage is ``anon`` + ``file``, as runc
    emulates it. There is no failcnt on v2 (cAdvisor writes 0; left unknown here)."""
    cpu_stat = read_bytes(directory + b"/cpu.stat", 1024)
    if cpu_stat is None:  # a core file of every cgroup: missing means gone
        return None
    data = read_bytes(directory + b"/memory.stat", 8192)
    stat = parse_keyed(data, _V2_MEMORY_STAT) if data else {}
    usage = read_int(directory + b"/memory.current")
    if usage is None and is_root and b"anon" in stat and b"file" in stat:
        usage = stat[b"anon"] + stat[b"file"]
    usage_usec = parse_keyed(cpu_stat, _V2_CPU_STAT).get(b"usage_usec")
    return CgroupFigures(
        cpu_usage_ns=None if usage_usec is None else usage_usec * 1000,
        memory_usage_bytes=usage,
        memory_working_set_bytes=(
            None if usage is None else working_set(usage, stat.get(b"inactive_file"))
        ),
        memory_rss_bytes=stat.get(b"anon"),
        memory_cache_bytes=stat.get(b"file"),
        memory_limit_bytes=memory_limit(read_int(directory + b"/memory.max")),  # "max": None
        page_faults=stat.get(b"pgfault"),
        major_page_faults=stat.get(b"pgmajfault"),
        threads=read_int(directory + b"/pids.current"),
    )


def read_oom_kills(cgroup_dir: bytes) -> int | None:
    """The ``oom_kill`` counter of a v2 cgroup's memory.events, or None when it is gone."""
    data = read_bytes(cgroup_dir + b"/memory.events", 1024)
    if data is None:
        return None
    return parse_keyed(data, (b"oom_kill",)).get(b"oom_kill", 0)


# -- writing (v2) --------------------------------------------------------------------------------

_HUGETLB_MAX = re.compile(r"^hugetlb\.(\d+[KMGTP]B)\.(?:rsvd\.)?max$")
_UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "PB": 1 << 50}


def write_control(path: Path, value: str) -> None:
    """Write a control file; never created (cgroupfs has no such thing as a new file)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def available_controllers(cgroup: Path) -> frozenset[str]:
    """The controllers a v2 cgroup can enable for its children (``cgroup.controllers``)."""
    return frozenset((cgroup / "cgroup.controllers").read_text().split())


def make_cgroup(root: Path, parts: Iterable[str], required: Collection[str]) -> Path:
    """Make ``root/parts`` with every controller of the root enabled on the way down.

    As runc's CreateCgroupPath: each ancestor's ``cgroup.subtree_control`` gets all the
    root's controllers (in one write, or one by one if that fails: a controller the
    parent lacks is skipped), then the child is made. A ``required`` controller that
    cannot be enabled raises OSError naming it. Existing cgroups are kept.
    """
    wanted = sorted(available_controllers(root))
    current = root
    for part in parts:
        _enable(current, wanted, required)
        current = current / part
        current.mkdir(exist_ok=True)
    return current


def _enable(cgroup: Path, controllers: list[str], required: Collection[str]) -> None:
    control = cgroup / "cgroup.subtree_control"
    try:
        write_control(control, " ".join("+" + c for c in controllers))
        return
    except OSError:
        pass
    for controller in controllers:
        try:
            write_control(control, "+" + controller)
        except OSError as err:
            if controller in required:
                raise OSError(err.errno, f"cannot enable the {controller} controller: "
                              f"{err.strerror}", os.fspath(control)) from err


def set_cpu(path: Path, weight: int | None, quota: int | None, period: int | None) -> None:
    """cpu.weight, then cpu.max ("<quota> <period>", "max <period>" without a quota)."""
    if weight is not None:
        write_control(path / "cpu.weight", str(weight))
    if quota is not None or period is not None:
        limit = str(quota) if quota is not None and quota > 0 else "max"
        write_control(path / "cpu.max", f"{limit} {period or CPU_PERIOD_US}")


def set_hugetlb(path: Path, limits: Mapping[int, int], default: int) -> None:
    """Every page size the cgroup offers gets a limit (and the same reservation limit,
    ``.rsvd.max``, where the kernel has one, as runc writes both)."""
    for entry in sorted(os.listdir(path)):
        match = _HUGETLB_MAX.match(entry)
        if match is not None:
            write_control(path / entry, str(limits.get(page_size(match[1]), default)))


def page_size(name: str) -> int:
    """Bytes of a hugetlb page size as the kernel names it in file names ("2MB", "1GB")."""
    return int(name[:-2]) * _UNITS[name[-2:]]
