"""The QoS cgroup hierarchy (cgroupfs driver): kubepods, its tiers and pod cgroups, v1 or v2.

What goes where and with which limits is decided in `core.pod_cgroups`; this
shell makes the directories and writes the settings, in a worker thread so the
event loop never waits on cgroupfs. The hierarchy is the one the node mounts
(`resources.cgroupfs.detect_mode`). On cgroup v1 a cgroup is a directory in each
controller's hierarchy; the cpu, memory and cpuset settings go through cgroupspy
nodes addressed directly (never a `Tree()` walk), hugetlb, which cgroupspy lacks,
and the scans are plain file operations. On cgroup v2 a cgroup is one directory,
its ancestors enable the controllers for it (``cgroup.subtree_control``), and
`resources.cgroupfs` writes cpu.weight, cpu.max, memory.max, pids.max and the
hugetlb limits.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import trio
from cgroupspy.nodes import Node

from trio_kubelet.core.pod_cgroups import (
    KUBEPODS,
    POD_PREFIX,
    QOS_CGROUPS,
    CgroupConfig,
    cgroup_parent_for,
    cpu_weight,
    pod_cgroup_name,
    pod_resource_config,
    pod_uid_of,
    qos_reserved_config,
)
from trio_kubelet.core.qos import QOSClass
from trio_kubelet.model.pod import Pod
from trio_kubelet.resources import cgroupfs
from trio_kubelet.resources.cgroupfs import CGROUP_ROOT, CgroupMode

__all__ = ["CREATED_IN", "REQUIRED", "REQUIRED_V2", "CgroupError", "QOSCgroups"]

log = logging.getLogger("trio_kubelet.cgroups")

# The v1 hierarchies a cgroup is made in: those runc's fs manager knows, as the Go kubelet's
# Create does, except devices (it passes SkipDevices; runc makes devices cgroups per container).
CREATED_IN = (
    "cpuset", "cpu", "cpuacct", "memory", "pids", "blkio", "hugetlb", "net_cls", "net_prio",
    "perf_event", "freezer", "rdma", "misc", "systemd",
)
# Without these the hierarchy cannot limit anything the pods' specs ask for (v1 mounts,
# v2 controllers: cpuacct's figures are cpu's there, and an empty cpuset takes its parent's).
REQUIRED = ("cpu", "cpuacct", "cpuset", "memory")
REQUIRED_V2 = ("cpu", "memory")

_QOS_UPDATE_INTERVAL = 60.0  # Go's periodicQOSCgroupUpdateInterval
# rmdir answers EBUSY while killed tasks are still exiting; runc's RemovePaths waits likewise.
_RMDIR_DELAYS = (0.01, 0.02, 0.04, 0.08, 0.16)
_HUGETLB_LIMIT = re.compile(r"^hugetlb\.(\d+[KMGTP]B)\.limit_in_bytes$")


class CgroupError(Exception):
    """A cgroup could not be created, configured or removed; the message names the path."""


@contextmanager
def _acting_on(path: Path, action: str) -> Iterator[None]:
    try:
        yield
    except OSError as err:
        raise CgroupError(f"cannot {action} {path}: {err.strerror or err}") from err


class QOSCgroups:
    """The cgroups a kubelet with cgroupsPerQOS=true manages, under ``root`` (/sys/fs/cgroup).

    ``cgroup_root`` is the KubeletConfiguration field: the hierarchy lives in
    ``<cgroup_root>/kubepods``. ``kubepods`` is the setting for kubepods itself
    (`core.pod_cgroups.kubepods_config` of the node's capacity, or of its
    allocatable once allocatable is enforced); None leaves it as it is.
    ``pod_pids_limit`` is podPidsLimit, each new pod cgroup's ``pids.max``.
    """

    def __init__(
        self,
        root: Path = CGROUP_ROOT,
        cgroup_root: str = "/",
        *,
        kubepods: CgroupConfig | None = None,
        pod_pids_limit: int = -1,
    ) -> None:
        self._root = root
        self.mode = cgroupfs.detect_mode(root)
        self._pod_pids_limit = pod_pids_limit
        self._cgroup_root = cgroup_root
        self._root_parts = tuple(p for p in cgroup_root.split("/") if p)
        self._kubepods = kubepods
        self._tiers_lock = trio.Lock()
        self._tiers: dict[QOSClass, CgroupConfig] | None = None  # as last written

    def cgroup_parent(self, pod: Pod) -> str:
        """What RunPodSandbox gets as ``cgroup_parent`` for this pod."""
        return cgroup_parent_for(pod, self._cgroup_root)

    async def start(self, pods: Iterable[Pod] = ()) -> None:
        """Make kubepods and its Burstable and BestEffort tiers, set for the active ``pods``.

        Raises `CgroupError` when the cgroup root is missing (Go refuses to start
        then too) or a required controller is not mounted (v1) or available (v2).
        """
        tiers = qos_reserved_config(pods)
        async with self._tiers_lock:
            await trio.to_thread.run_sync(self._start, tiers)
            self._tiers = tiers

    async def repair(
        self, active_pods: Callable[[], Iterable[Pod]], *, interval: float = _QOS_UPDATE_INTERVAL
    ) -> None:
        """Re-apply the tiers' settings for ``active_pods()`` every ``interval`` seconds, for ever.

        The periodic pass repairs drift (a pod that left without an update, a
        setting changed behind our back), as the Go kubelet's does every minute.
        """
        while True:
            await trio.sleep(interval)
            try:
                await self.update_qos(active_pods(), rewrite=True)
            except CgroupError as err:
                log.warning("Updating the QoS cgroups failed: %s", err)

    async def ensure_pod(self, pod: Pod) -> None:
        """Create the pod's cgroup with its limits, unless it exists; before RunPodSandbox."""
        name = pod_cgroup_name(pod)
        config = pod_resource_config(pod, pids_limit=self._pod_pids_limit)
        await trio.to_thread.run_sync(self._ensure_pod, name, config)

    async def update_qos(self, pods: Iterable[Pod], *, rewrite: bool = False) -> None:
        """Set the Burstable and BestEffort tiers' cpu shares for the node's active ``pods``.

        Call it before `ensure_pod` of a new pod (as Go's syncPod does) and after a pod leaves.
        Settings equal to those last written are not written again (a BestEffort pod
        changes nothing: 110 of them starting at once wrote the same shares 110 times,
        one after the other) unless ``rewrite`` (the periodic pass, which repairs drift).
        """
        tiers = qos_reserved_config(pods)
        async with self._tiers_lock:
            if tiers == self._tiers and not rewrite:
                return
            self._tiers = None  # unknown until written: a failed write is not skipped next time
            await trio.to_thread.run_sync(self._apply_tiers, tiers)
            self._tiers = tiers

    async def remove_pod(self, uid: str) -> None:
        """Remove the pod's cgroups in every hierarchy, once the runtime has stopped its sandbox.

        As Go's pod container manager does, processes still charged to the pod
        (a container the runtime lost track of) are killed first, since a cgroup
        with tasks cannot be removed. A pod without cgroups is not an error.
        """
        await trio.to_thread.run_sync(self._remove_pod, uid)

    async def orphans(self, known_uids: Iterable[str]) -> list[str]:
        """Uids of pod cgroups (in any hierarchy) that none of ``known_uids`` owns, sorted."""
        found = await trio.to_thread.run_sync(self._pod_uids)
        return sorted(found - set(known_uids))

    # -- the worker-thread side ------------------------------------------------------------

    def _parts(self, name: Sequence[str]) -> tuple[str, ...]:
        """A cgroup name (relative to the cgroup root) as a path below a controller's mount."""
        return (*self._root_parts, *name)

    def _path(self, controller: str, parts: Sequence[str]) -> Path:
        """A cgroup's directory in one v1 hierarchy."""
        return self._root.joinpath(controller, *parts)

    def _node(self, controller: str, parts: Sequence[str]) -> Node:
        """The cgroupspy node of a known cgroup, built along its path, not by walking the tree."""
        node = Node(os.fsencode(self._root))
        for part in (controller, *parts):
            node = Node(part.encode(), parent=node)
        return node

    def _created_in(self) -> list[str]:
        return [c for c in CREATED_IN if (self._root / c).is_dir()]

    def _exists(self, parts: Sequence[str]) -> bool:
        if self.mode is CgroupMode.V2:
            return self._root.joinpath(*parts).is_dir()
        return all(self._path(c, parts).is_dir() for c in self._created_in())

    def _hierarchies(self) -> list[Path]:
        """Every mounted hierarchy, each once (``cpu`` and ``cpuacct`` are often one mount)."""
        if self.mode is CgroupMode.V2:
            return [self._root]
        seen: dict[str, Path] = {}
        with _acting_on(self._root, "list"):
            entries = sorted(self._root.iterdir())
        for entry in entries:
            if entry.is_dir():
                seen.setdefault(os.path.realpath(entry), entry)
        return list(seen.values())

    def _start(self, tiers: dict[QOSClass, CgroupConfig]) -> None:
        if self.mode is CgroupMode.V2:
            self._check_v2()
        else:
            self._check_v1()
        self._create((KUBEPODS,), self._kubepods or CgroupConfig())
        for qos, config in tiers.items():
            self._create(QOS_CGROUPS[qos], config)

    def _check_v1(self) -> None:
        for controller in REQUIRED:
            if not (self._root / controller).is_dir():
                raise CgroupError(f"cgroup v1 controller {controller!r} is not mounted at "
                                  f"{self._root / controller}")
            if not self._path(controller, self._root_parts).is_dir():
                raise CgroupError(f"cgroup root {self._cgroup_root!r} does not exist in "
                                  f"{self._root / controller}")

    def _check_v2(self) -> None:
        with _acting_on(self._root, "read the controllers of"):
            available = cgroupfs.available_controllers(self._root)
        for controller in REQUIRED_V2:
            if controller not in available:
                raise CgroupError(f"cgroup v2 controller {controller!r} is not available in "
                                  f"{self._root / 'cgroup.controllers'}")
        if not self._root.joinpath(*self._root_parts).is_dir():
            raise CgroupError(f"cgroup root {self._cgroup_root!r} does not exist in {self._root}")

    def _apply_tiers(self, tiers: dict[QOSClass, CgroupConfig]) -> None:
        for qos, config in tiers.items():
            self._apply(QOS_CGROUPS[qos], config)

    def _ensure_pod(self, name: tuple[str, ...], config: CgroupConfig) -> None:
        if self._exists(self._parts(name)):
            return  # as Go's EnsureExists: an existing pod cgroup keeps its settings
        self._create(name, config)

    def _create(self, name: tuple[str, ...], config: CgroupConfig) -> None:
        parts = self._parts(name)
        if self.mode is CgroupMode.V2:
            with _acting_on(self._root.joinpath(*parts), "create"):
                cgroupfs.make_cgroup(self._root, parts, REQUIRED_V2)
            self._apply(name, config)
            return
        for controller in self._created_in():
            path = self._path(controller, parts)
            with _acting_on(path, "create"):
                path.mkdir(parents=True, exist_ok=True)
            if controller == "cpuset":
                self._inherit_cpuset(parts)
        self._apply(name, config)

    def _inherit_cpuset(self, parts: tuple[str, ...]) -> None:
        """Give a cpuset cgroup (and any empty ancestor) its parent's cpus and mems, as runc does.

        On v1 a new cpuset is empty, and no task can join an empty cpuset.
        """
        if not parts:
            return
        cpuset = self._node("cpuset", parts).controller
        # get_content reads a missing or unreadable file as None: "not set yet".
        if cpuset.get_content("cpus") and cpuset.get_content("mems"):
            return
        self._inherit_cpuset(parts[:-1])
        parent = self._node("cpuset", parts[:-1]).controller
        with _acting_on(self._path("cpuset", parts), "set the cpuset of"):
            cpuset.cpus = parent.cpus
            cpuset.mems = parent.mems

    def _apply(self, name: tuple[str, ...], config: CgroupConfig) -> None:
        if self.mode is CgroupMode.V2:
            self._apply_v2(self._root.joinpath(*self._parts(name)), config)
            return
        parts = self._parts(name)
        cpu = self._node("cpu", parts).controller
        with _acting_on(self._path("cpu", parts), "set cpu limits of"):
            if config.cpu_shares is not None:
                cpu.shares = config.cpu_shares
            # The period first: the quota is checked against it.
            if config.cpu_period is not None:
                cpu.cfs_period_us = config.cpu_period
            if config.cpu_quota is not None:
                cpu.cfs_quota_us = config.cpu_quota
        if config.memory_limit is not None:
            memory = self._node("memory", parts).controller
            with _acting_on(self._path("memory", parts), "set the memory limit of"):
                memory.limit_in_bytes = config.memory_limit
        if config.pids_limit is not None and (self._root / "pids").is_dir():
            with _acting_on(self._path("pids", parts), "set the process limit of"):
                (self._path("pids", parts) / "pids.max").write_text(str(config.pids_limit))
        if config.hugepage_limits is not None and (self._root / "hugetlb").is_dir():
            self._apply_hugetlb(self._path("hugetlb", parts), config)

    def _apply_v2(self, path: Path, config: CgroupConfig) -> None:
        """cpu.weight (the shares converted as Go does), cpu.max, memory.max, pids.max, and
        the hugetlb limits where those controllers are available."""
        weight = None if config.cpu_shares is None else cpu_weight(config.cpu_shares)
        with _acting_on(path, "set cpu limits of"):
            cgroupfs.set_cpu(path, weight, config.cpu_quota, config.cpu_period)
        if config.memory_limit is not None:
            with _acting_on(path, "set the memory limit of"):
                cgroupfs.write_control(path / "memory.max", str(config.memory_limit))
        wants_pids = config.pids_limit is not None
        if wants_pids or config.hugepage_limits is not None:
            with _acting_on(self._root, "read the controllers of"):
                available = cgroupfs.available_controllers(self._root)
            if wants_pids and "pids" in available:
                with _acting_on(path, "set the process limit of"):
                    cgroupfs.write_control(path / "pids.max", str(config.pids_limit))
            if config.hugepage_limits is not None and "hugetlb" in available:
                with _acting_on(path, "set hugetlb limits of"):
                    cgroupfs.set_hugetlb(path, config.hugepage_limits, config.hugepage_default)

    def _apply_hugetlb(self, path: Path, config: CgroupConfig) -> None:
        """Every page size the machine has (one limit file each) gets a limit."""
        limits = config.hugepage_limits or {}
        with _acting_on(path, "set hugetlb limits of"):
            for entry in os.listdir(self._root / "hugetlb"):
                match = _HUGETLB_LIMIT.match(entry)
                if match is not None:
                    value = limits.get(cgroupfs.page_size(match[1]), config.hugepage_default)
                    (path / entry).write_text(str(value))

    def _qos_dirs(self, hierarchy: Path) -> Iterator[Path]:
        for name in QOS_CGROUPS.values():
            yield hierarchy.joinpath(*self._parts(name))

    def _pod_uids(self) -> set[str]:
        uids: set[str] = set()
        for hierarchy in self._hierarchies():
            for qos_dir in self._qos_dirs(hierarchy):
                try:
                    entries = list(os.scandir(qos_dir))
                except FileNotFoundError:
                    continue
                except OSError as err:
                    raise CgroupError(f"cannot list {qos_dir}: {err.strerror or err}") from err
                for entry in entries:
                    uid = pod_uid_of(entry.name)
                    if uid is not None and entry.is_dir(follow_symlinks=False):
                        uids.add(uid)
        return uids

    def _remove_pod(self, uid: str) -> None:
        pod_dirs = [
            qos_dir / (POD_PREFIX + uid)
            for hierarchy in self._hierarchies()
            for qos_dir in self._qos_dirs(hierarchy)
            if (qos_dir / (POD_PREFIX + uid)).is_dir()
        ]
        _kill_tasks(pod_dirs)
        for pod_dir in pod_dirs:
            _remove_tree(pod_dir)


def _kill_tasks(cgroups: Iterable[Path]) -> None:
    """SIGKILL every process charged to these cgroups or their children (Go kills them too)."""
    pids: set[int] = set()
    for cgroup in cgroups:
        for directory, _, _ in os.walk(cgroup):
            try:
                text = Path(directory, "cgroup.procs").read_text()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise CgroupError(f"cannot read tasks of {directory}: {err.strerror}") from err
            pids.update(int(line) for line in text.split())
    for pid in sorted(pids):
        log.info("Killing process %d left in a removed pod's cgroup", pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except OSError as err:
            raise CgroupError(f"cannot kill process {pid}: {err.strerror}") from err


def _remove_tree(cgroup: Path) -> None:
    """rmdir a cgroup and its children, deepest first (cgroupfs removes the control files)."""
    for directory, _, _ in os.walk(cgroup, topdown=False):
        _rmdir(Path(directory))


def _rmdir(path: Path) -> None:
    for delay in (*_RMDIR_DELAYS, None):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno != errno.EBUSY or delay is None:
                raise CgroupError(f"cannot remove {path}: {err.strerror}") from err
            time.sleep(delay)  # a worker thread: the event loop does not wait
